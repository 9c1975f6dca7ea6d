"""promtool's rule tests (``promtool test rules``) run in Python, for the subset of PromQL that
deploy/prometheus/alerts.yml keeps to, so the rules are tested where promtool is not installed.

The subset: a metric selector with ``=`` / ``!=`` label matchers; ``sum``, ``max``, ``min`` or ``count``, with an
optional ``by (...)`` written before the argument; ``increase(selector[range])``; and at most one comparison
(``> >= < <= == !=``, no ``bool``) between any of those and a number or another of those, matched one-to-one on
all labels but the name. Anything else raises ``OutsideSubset``, so a rule that leaves the subset fails the
Python path loudly instead of being judged wrongly.

Semantics follow Prometheus 2.42 (the version Debian ships, which CI installs), as its documentation and source
state them:
- an instant selector takes each series' latest sample at most 5 minutes old (the default lookback delta);
- a range selector takes samples from ``t - range`` to ``t``, both ends included;
- ``increase`` corrects counter resets and extrapolates as ``extrapolatedRate`` in promql/functions.go does;
- an alert is active from the first evaluation that returns its series and fires once active for ``for:``; the
  test evaluates every ``evaluation_interval`` from 0 to each ``eval_time``
  ("Unit Testing for Rules", https://prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/);
- series values use the expanding notation: ``a+bxn`` is a, a+b, ..., a+n*b; ``axn`` is a repeated n+1 times;
  ``_`` is a missing sample and ``_xn`` n of them.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOOKBACK_S = 300.0
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_TOKEN = re.compile(
    r"\s*(?:(?P<number>-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w])|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'|(?P<string>"(?:[^"\\]|\\.)*")|(?P<duration>\[[0-9dhms]+\])|(?P<op>>=|<=|==|!=|=~|!~|[<>=(){},]))'
)
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
_AGGREGATE: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min, "count": len}
_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]


class OutsideSubset(ValueError):
    """The expression, series or template uses something this evaluator does not implement."""


def duration_s(text: str) -> float:
    """``1h30m`` -> 5400.0."""
    found = _DURATION.match(str(text).strip())
    if not found or not any(found.groups()):
        raise OutsideSubset(f"not a duration: {text!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    text = text.strip()
    while at < len(text):
        found = _TOKEN.match(text, at)
        if not found or found.end() == at:
            raise OutsideSubset(f"cannot read {text[at:]!r}")
        kind = found.lastgroup
        assert kind is not None
        tokens.append((kind, found.group(kind)))
        at = found.end()
        while at < len(text) and text[at].isspace():
            at += 1
    return tokens


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]
    range_s: float | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        if labels.get("__name__") != self.name:
            return False
        for label, op, value in self.matchers:
            if (labels.get(label, "") == value) != (op == "="):
                return False
        return True


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Increase:
    selector: Selector


@dataclass(frozen=True)
class Aggregate:
    op: str
    by: tuple[str, ...]
    expr: Any


@dataclass(frozen=True)
class Compare:
    op: str
    left: Any
    right: Any


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        token = self.peek()
        if token is None or (value is not None and token[1] != value) or (kind is not None and token[0] != kind):
            raise OutsideSubset(f"expected {value or kind} at {self.tokens[self.at :]!r} in {self.text!r}")
        self.at += 1
        return token[1]

    def parse(self) -> Any:
        left = self.operand()
        token = self.peek()
        if token is not None and token[1] in _COMPARE:
            self.take()
            if self.peek() == ("name", "bool"):
                raise OutsideSubset("comparisons with bool are outside the subset")
            left = Compare(token[1], left, self.operand())
        if self.peek() is not None:
            raise OutsideSubset(f"unexpected {self.tokens[self.at :]!r} in {self.text!r}")
        return left

    def operand(self) -> Any:
        kind, value = self.peek() or ("", "")
        if kind == "number":
            self.take()
            return Number(float(value))
        if kind != "name":
            raise OutsideSubset(f"expected a number, a selector or a function in {self.text!r}")
        if value in _AGGREGATE:
            self.take()
            by: tuple[str, ...] = ()
            if self.peek() == ("name", "by"):
                self.take()
                self.take("(")
                names = [self.take(kind="name")]
                while self.peek() == ("op", ","):
                    self.take()
                    names.append(self.take(kind="name"))
                self.take(")")
                by = tuple(names)
            self.take("(")
            inner = self.operand()
            self.take(")")
            return Aggregate(value, by, inner)
        if value == "increase":
            self.take()
            self.take("(")
            selector = self.selector()
            self.take(")")
            if selector.range_s is None:
                raise OutsideSubset("increase() needs a range selector")
            return Increase(selector)
        if self.at + 1 < len(self.tokens) and self.tokens[self.at + 1][1] == "(":
            raise OutsideSubset(f"function {value}() is outside the subset")
        selector = self.selector()
        if selector.range_s is not None:
            raise OutsideSubset("a range selector only inside increase()")
        return selector

    def selector(self) -> Selector:
        name = self.take(kind="name")
        matchers = []
        if self.peek() == ("op", "{"):
            self.take()
            while self.peek() != ("op", "}"):
                label = self.take(kind="name")
                op = self.take()
                if op not in ("=", "!="):
                    raise OutsideSubset(f"matcher {op} is outside the subset")
                matchers.append((label, op, _unquote(self.take(kind="string"))))
                if self.peek() == ("op", ","):
                    self.take()
            self.take("}")
        range_s = None
        token = self.peek()
        if token is not None and token[0] == "duration":
            self.take()
            range_s = duration_s(token[1][1:-1])
        return Selector(name, tuple(matchers), range_s)


def _unquote(text: str) -> str:
    return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def parse_expr(text: str) -> Any:
    """The expression's tree, or ``OutsideSubset``."""
    return _Parser(text).parse()


def parse_series(text: str) -> dict[str, str]:
    """``name{a="b"}`` -> {"__name__": "name", "a": "b"}."""
    found = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*", text)
    if not found:
        raise OutsideSubset(f"not a series: {text!r}")
    labels = {"__name__": found.group(1)}
    for label, value in re.findall(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*("(?:[^"\\]|\\.)*")\s*,?', found.group(2) or ""):
        labels[label] = _unquote(value)
    return labels


def expand_values(text: str) -> list[float | None]:
    """promtool's expanding notation -> one value (None when missing) per interval."""
    values: list[float | None] = []
    for word in str(text).split():
        if word == "_":
            values.append(None)
            continue
        blanks = re.fullmatch(r"_x(\d+)", word)
        if blanks:
            values.extend([None] * int(blanks.group(1)))
            continue
        found = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:([+-])(\d+(?:\.\d+)?))?x(\d+)", word)
        if found:
            start, sign, step, times = found.groups()
            delta = float(step or 0) * (-1 if sign == "-" else 1)
            values.extend(float(start) + i * delta for i in range(int(times) + 1))
            continue
        try:
            values.append(float(word))
        except ValueError:
            raise OutsideSubset(f"series value {word!r} is outside the subset") from None
    return values


class Store:
    """Input series as (labels, [(seconds, value)])."""

    def __init__(self, input_series: list[dict[str, str]], interval_s: float) -> None:
        self.series: list[tuple[dict[str, str], list[tuple[float, float]]]] = []
        for item in input_series:
            values = expand_values(item["values"])
            samples = [(i * interval_s, v) for i, v in enumerate(values) if v is not None]
            self.series.append((parse_series(item["series"]), samples))

    def instant(self, selector: Selector, t: float) -> Vector:
        out: Vector = {}
        for labels, samples in self.series:
            if not selector.matches(labels):
                continue
            recent = [v for ts, v in samples if t - LOOKBACK_S < ts <= t]
            if recent:
                out[frozenset(labels.items())] = recent[-1]
        return out

    def increase(self, selector: Selector, t: float) -> Vector:
        assert selector.range_s is not None
        start = t - selector.range_s
        out: Vector = {}
        for labels, samples in self.series:
            if not selector.matches(labels):
                continue
            window = [(ts, v) for ts, v in samples if start <= ts <= t]
            if len(window) < 2:
                continue
            without_name = frozenset((k, v) for k, v in labels.items() if k != "__name__")
            out[without_name] = _extrapolated_increase(window, start, t)
        return out


def _extrapolated_increase(window: list[tuple[float, float]], start: float, end: float) -> float:
    """Prometheus' extrapolatedRate for a counter, not divided by the range."""
    result = window[-1][1] - window[0][1]
    for (_, before), (_, after) in itertools.pairwise(window):
        if after < before:  # a counter reset: the counter went on from zero
            result += before
    first_t, first_v = window[0]
    last_t = window[-1][0]
    sampled = last_t - first_t
    to_start, to_end = first_t - start, end - last_t
    average = sampled / (len(window) - 1)
    if result > 0 and first_v >= 0:
        # A counter does not go below zero: extrapolate towards the start no further than where it was zero.
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled)


def evaluate(node: Any, store: Store, t: float) -> Vector | float:
    """The expression's value at ``t``: a vector, or a number for a bare number."""
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Selector):
        return store.instant(node, t)
    if isinstance(node, Increase):
        return store.increase(node.selector, t)
    if isinstance(node, Aggregate):
        inner = evaluate(node.expr, store, t)
        if not isinstance(inner, dict):
            raise OutsideSubset("aggregating a number")
        groups: dict[Labels, list[float]] = {}
        for labels, value in inner.items():
            key = frozenset((k, v) for k, v in labels if k in node.by)
            groups.setdefault(key, []).append(value)
        return {key: float(_AGGREGATE[node.op](values)) for key, values in groups.items()}
    if isinstance(node, Compare):
        return _compare(node.op, evaluate(node.left, store, t), evaluate(node.right, store, t))
    raise OutsideSubset(f"cannot evaluate {node!r}")


def _compare(op: str, left: Vector | float, right: Vector | float) -> Vector | float:
    holds = _COMPARE[op]
    if not isinstance(left, dict) and not isinstance(right, dict):
        raise OutsideSubset("comparing two numbers needs bool")
    if not isinstance(right, dict):
        return {labels: value for labels, value in left.items() if holds(value, right)}  # type: ignore[union-attr]
    if not isinstance(left, dict):
        return {labels: value for labels, value in right.items() if holds(left, value)}
    # One-to-one matching on every label but the name; the left side's labels and value are kept.
    by_signature: dict[Labels, float] = {}
    for labels, value in right.items():
        signature = frozenset(item for item in labels if item[0] != "__name__")
        if signature in by_signature:
            raise OutsideSubset("many-to-many matching is outside the subset")
        by_signature[signature] = value
    out: Vector = {}
    for labels, value in left.items():
        signature = frozenset(item for item in labels if item[0] != "__name__")
        if signature in by_signature and holds(value, by_signature[signature]):
            out[labels] = value
    return out


def _expand(template: str, labels: dict[str, str]) -> str:
    text = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), template)
    if "{{" in text:
        raise OutsideSubset(f"template {template!r} is outside the subset ($labels.<name> only)")
    return text


Alert = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


def firing(rule: dict[str, Any], store: Store, eval_time: float, interval: float) -> list[Alert]:
    """The rule's alerts firing at ``eval_time``, each as (sorted labels, sorted annotations), sorted."""
    expr = parse_expr(rule["expr"])
    hold = duration_s(rule.get("for", "0s")) if rule.get("for") else 0.0
    active: dict[Labels, float] = {}
    steps = math.floor(eval_time / interval + 1e-9)
    for step in range(steps + 1):
        t = step * interval
        result = evaluate(expr, store, t)
        if not isinstance(result, dict):
            raise OutsideSubset("an alerting rule's expression must be a vector")
        now = {frozenset((k, v) for k, v in labels if k != "__name__") for labels in result}
        active = {labels: active.get(labels, t) for labels in now}
    alerts: list[Alert] = []
    for labels, since in active.items():
        if eval_time - since < hold:
            continue
        series = dict(labels)
        full = {**series, **rule.get("labels", {}), "alertname": rule["alert"]}
        notes = {key: _expand(text, series) for key, text in rule.get("annotations", {}).items()}
        alerts.append((tuple(sorted(full.items())), tuple(sorted(notes.items()))))
    return sorted(alerts)


def _strings(mapping: dict[str, Any] | None) -> dict[str, str]:
    return {str(key): str(value) for key, value in (mapping or {}).items()}


def run_rule_tests(test_file: Path) -> list[str]:
    """Every case of a ``promtool test rules`` file, run here: one line per case that failed (empty: all passed)."""
    spec = yaml.safe_load(test_file.read_text())
    rules: dict[str, dict[str, Any]] = {}
    for name in spec["rule_files"]:
        for group in yaml.safe_load((test_file.parent / name).read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule
    default_interval = duration_s(spec.get("evaluation_interval", "1m"))
    failures = []
    for test in spec["tests"]:
        store = Store(test.get("input_series", []), duration_s(test.get("interval", "1m")))
        interval = duration_s(test["evaluation_interval"]) if "evaluation_interval" in test else default_interval
        for case in test.get("alert_rule_test", []):
            name = case["alertname"]
            if name not in rules:
                failures.append(f"{test.get('name')}: no rule named {name}")
                continue
            eval_time = duration_s(case["eval_time"])
            got = firing(rules[name], store, eval_time, interval)
            expected = sorted(
                (
                    tuple(sorted({**_strings(alert.get("exp_labels")), "alertname": name}.items())),
                    tuple(sorted(_strings(alert.get("exp_annotations")).items())),
                )
                for alert in case.get("exp_alerts") or []
            )
            if got != expected:
                failures.append(f"{test.get('name')}: {name} at {case['eval_time']}: expected {expected}, got {got}")
    return failures
