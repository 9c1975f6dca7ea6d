"""A cluster seller's prices: the account option ``gpu_prices``, one rule per line.

    <broker GPU model key> <USD per GPU-hour> [<label>=<value>]

e.g. ``A100-80GB-SXM4 1.90`` or ``T4 0.30 broker.example/pool=spot-t4``. Blank lines and lines starting with
``#`` are skipped. For a node carrying the label, a rule naming it wins over the model's rule without one; among
several label rules a node matches, the first written wins. A model with no rule is not offered.

Label keys and values follow Kubernetes' syntax (an optional DNS-subdomain prefix and ``/``, then a name of at
most 63 characters of ``[A-Za-z0-9._-]`` starting and ending alphanumeric; a value of the same form or empty:
https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from providers import gpu_names

MAX_TEXT_CHARS = 64 * 1024
MAX_RULES = 500
MAX_PRICE = Decimal("1000")  # USD per GPU-hour: far above any list price, so a slip of the decimal point is caught
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PRICE = re.compile(r"\d{1,4}(\.\d{1,6})?")


@dataclass(frozen=True, slots=True)
class PriceRule:
    """One line of ``gpu_prices``: the model's price per GPU-hour in USD, for nodes carrying ``label`` if set."""

    model: str
    price: Decimal
    label: tuple[str, str] | None = None

    def matches(self, model: str, labels: Mapping[str, str]) -> bool:
        if self.model != model:
            return False
        return self.label is None or labels.get(self.label[0]) == self.label[1]


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return f"the label prefix {prefix!r} is not a DNS subdomain"
    if not _NAME.fullmatch(name):
        return f"the label name {name!r} is not 1-63 characters of letters, digits, '-', '_' or '.'"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value, or None (empty is a value)."""
    if value and not _NAME.fullmatch(value):
        return f"the label value {value!r} is not at most 63 characters of letters, digits, '-', '_' or '.'"
    return None


def parse_gpu_prices(text: str) -> list[PriceRule]:
    """The rules of ``text`` in order. Raises ``ValueError`` naming the line (``line 3: ...``) for a model the
    broker does not know, a price that is not a positive decimal of at most ``MAX_PRICE``, a malformed label, a
    rule written twice, or more than ``MAX_RULES`` rules."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"gpu_prices is {len(text)} characters; at most {MAX_TEXT_CHARS}")
    rules: list[PriceRule] = []
    seen: set[tuple[str, tuple[str, str] | None]] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rule = _rule(line, number)
        if (rule.model, rule.label) in seen:
            raise ValueError(f"line {number}: {line!r} repeats an earlier rule for the same model and label")
        seen.add((rule.model, rule.label))
        rules.append(rule)
        if len(rules) > MAX_RULES:
            raise ValueError(f"line {number}: at most {MAX_RULES} rules")
    return rules


def _rule(line: str, number: int) -> PriceRule:
    parts = line.split()
    if len(parts) not in (2, 3):
        raise ValueError(f"line {number}: {line!r} is not '<GPU model> <USD per GPU-hour> [<label>=<value>]'")
    model, price_text = parts[0], parts[1]
    if model not in gpu_names.ALL:
        raise ValueError(
            f"line {number}: {model!r} is not a GPU model the broker knows ({', '.join(gpu_names.SORTED)})"
        )
    if not _PRICE.fullmatch(price_text):
        raise ValueError(f"line {number}: the price {price_text!r} is not a decimal number of USD per GPU-hour")
    price = Decimal(price_text)
    if not Decimal(0) < price <= MAX_PRICE:
        raise ValueError(f"line {number}: the price {price_text} is not above 0 and at most {MAX_PRICE} USD")
    label: tuple[str, str] | None = None
    if len(parts) == 3:
        key, equals, value = parts[2].partition("=")
        if not equals:
            raise ValueError(f"line {number}: {parts[2]!r} is not <label>=<value>")
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise ValueError(f"line {number}: {problem}")
        label = (key, value)
    return PriceRule(model=model, price=price, label=label)


def price_for(rules: Sequence[PriceRule], model: str, labels: Mapping[str, str]) -> Decimal | None:
    """The price per GPU-hour of a ``model`` GPU on a node with ``labels``: the first label rule it matches,
    else the model's rule without a label, else None (not offered)."""
    plain: Decimal | None = None
    for rule in rules:
        if not rule.matches(model, labels):
            continue
        if rule.label is not None:
            return rule.price
        plain = rule.price if plain is None else plain
    return plain
