"""The offer search language, one for the storefront and the API::

    gpu=H100 count>=8 region=eu price<40 pricing=spot reliability>0.95

Terms are ``field op value`` separated by spaces, all of which must hold. Fields:

- ``gpu`` (``=``, ``!=``): a GPU model key or its family, case-insensitive (``H100`` is every H100 variant);
  several with commas (``gpu=H100,A100``).
- ``count``, ``mem`` (GB per GPU), ``price`` (USD per hour), ``gpuprice`` (USD per GPU-hour),
  ``reliability`` (0..1): numbers with ``= != < <= > >=``.
- ``region`` (``=``, ``!=``): a region name (``us-east-1``) or a jurisdiction (``eu``, ``us``, ``apac``,
  ``cn``, ``ch``, ...).
- ``pricing`` (``=``, ``!=``): ``on_demand`` (or ``ondemand``), ``spot``.
- ``provider`` (``=``, ``!=``): ``aws``, ``azure``, ``gcp``, ``alibaba``, ``tencent``, ``community``.

A mistake raises ``QueryError`` whose message names the term and its column and says what would be right.
"""

from __future__ import annotations

import datetime as dt
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import Q, QuerySet

from marketplace.catalog.regions import jurisdiction_of
from marketplace.models import Offer

_TERM = re.compile(r"\S+")
_SPLIT = re.compile(r"^(?P<field>[A-Za-z_]+)(?P<op>!=|>=|<=|=|<|>)(?P<value>.*)$")
_NUMERIC = {"count": "gpu_count", "mem": "gpu_memory_gb", "price": "price_usd", "gpuprice": None, "reliability": None}
_TEXT = ("gpu", "region", "pricing", "provider")
FIELDS = (*_TEXT, *_NUMERIC)
_PRICING = {"on_demand": "on_demand", "ondemand": "on_demand", "on-demand": "on_demand", "spot": "spot"}
_PROVIDERS = ("aws", "azure", "gcp", "alibaba", "tencent", "community")
_LOOKUP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip


class QueryError(ValueError):
    """A search that cannot be understood. ``column`` is 1-based; ``term`` the text at fault."""

    def __init__(self, message: str, *, term: str, column: int):
        super().__init__(f"{message} (at column {column}: {term!r})")
        self.term = term
        self.column = column
        self.reason = message


@dataclass(frozen=True)
class Term:
    field: str
    op: str
    value: str | Decimal | tuple[str, ...]
    text: str
    column: int


def parse(text: str) -> list[Term]:
    """The terms of ``text``; raises ``QueryError`` at the first term that is not ``field op value``."""
    if len(text) > 1000:
        raise QueryError("a search is at most 1,000 characters", term=text[:20] + "…", column=1)
    terms = []
    for match in _TERM.finditer(text):
        raw, column = match.group(), match.start() + 1
        split = _SPLIT.match(raw)
        if split is None:
            raise QueryError("write each term as field, operator, value, e.g. count>=8", term=raw, column=column)
        field, op, value = split["field"].lower(), split["op"], split["value"]
        if field not in FIELDS:
            raise QueryError(f"unknown field {field!r}; fields are {', '.join(FIELDS)}", term=raw, column=column)
        if not value:
            raise QueryError(f"{field} needs a value after {op}", term=raw, column=column)
        terms.append(_term(field, op, value, raw, column))
    return terms


def _term(field: str, op: str, value: str, raw: str, column: int) -> Term:
    if field in _NUMERIC:
        try:
            number = Decimal(value)
        except InvalidOperation:
            raise QueryError(f"{field} compares with a number, not {value!r}", term=raw, column=column) from None
        if not number.is_finite() or number < 0:
            raise QueryError(f"{field} compares with a number of at least 0", term=raw, column=column)
        if field == "reliability" and number > 1:
            raise QueryError("reliability is a share from 0 to 1, e.g. reliability>0.95", term=raw, column=column)
        return Term(field, op, number, raw, column)
    if op not in ("=", "!="):
        raise QueryError(f"{field} takes = or !=, not {op}", term=raw, column=column)
    if field == "pricing":
        if value.lower() not in _PRICING:
            raise QueryError("pricing is on_demand or spot", term=raw, column=column)
        return Term(field, op, _PRICING[value.lower()], raw, column)
    if field == "provider":
        if value.lower() not in _PROVIDERS:
            raise QueryError(f"provider is one of {', '.join(_PROVIDERS)}", term=raw, column=column)
        return Term(field, op, value.lower(), raw, column)
    values = tuple(v for v in value.split(",") if v)
    if not values:
        raise QueryError(f"{field} needs a value after {op}", term=raw, column=column)
    return Term(field, op, values if field == "gpu" else value.lower(), raw, column)


def apply(
    queryset: QuerySet[Offer], terms: list[Term], *, reliability: Callable[[Offer], float] | None = None
) -> list[Offer]:
    """The offers of ``queryset`` that satisfy every term. Most terms filter in the database; ``region`` as a
    jurisdiction, ``gpuprice`` and ``reliability`` are checked on the rows (``reliability`` gives an offer's)."""
    on_rows: list[Term] = []
    for term in terms:
        condition: Q | None = None
        if term.field == "gpu":
            assert isinstance(term.value, tuple)
            condition = Q()
            for name in term.value:
                condition |= Q(gpu_model__key__iexact=name) | Q(gpu_model__key__istartswith=f"{name}-")
        elif term.field == "pricing":
            condition = Q(pricing_model=term.value)
        elif term.field == "provider":
            condition = Q(account__kind=term.value)
        elif term.field in ("count", "mem", "price"):
            column = _NUMERIC[term.field]
            if term.op in _LOOKUP:
                queryset = queryset.filter(**{f"{column}__{_LOOKUP[term.op]}": term.value})
            else:
                condition = Q(**{str(column): term.value})
        else:  # region, gpuprice, reliability
            on_rows.append(term)
        if condition is not None:
            queryset = queryset.exclude(condition) if term.op == "!=" else queryset.filter(condition)
    score = reliability or (lambda offer: 0.95)
    return [o for o in queryset if all(_holds(o, term, score) for term in on_rows)]


def _holds(offer: Offer, term: Term, reliability: Callable[[Offer], float]) -> bool:
    if term.field == "region":
        region = str(term.value)
        inside = offer.region.lower() == region or jurisdiction_of(offer.account.kind, offer.region) == region.upper()
        return inside == (term.op == "=")
    assert isinstance(term.value, Decimal)
    if term.field == "gpuprice":
        return _COMPARE[term.op](offer.price_usd / offer.gpu_count, term.value)
    return _COMPARE[term.op](Decimal(str(reliability(offer))), term.value)


SORTS = {
    "price": lambda o: (o.price_usd, o.pk),
    "gpuprice": lambda o: (o.price_usd / o.gpu_count, o.pk),
    "tflops": lambda o: (o.price_usd / (o.gpu_count * (o.gpu_model.fp16_dense_tflops or Decimal(1))), o.pk),
}


def offers_search(text: str, *, now: dt.datetime, sort: str = "price", limit: int = 500) -> list[Offer]:
    """The offers for sale matching ``text``, sorted by ``price`` (per hour), ``gpuprice`` (per GPU-hour) or
    ``tflops`` (per dense-FP16 TFLOP-hour). Raises ``QueryError``."""
    from marketplace.catalog.selectors import account_reliability, machine_reliability, offer_list

    if sort not in SORTS:
        raise QueryError(f"sort by one of {', '.join(SORTS)}", term=sort, column=1)
    terms = parse(text)
    accounts: dict[int, float] = {}
    machines: dict[tuple[int, str], float] = {}
    if any(t.field == "reliability" for t in terms):
        accounts, machines = account_reliability(), machine_reliability(now=now)

    def reliability(offer: Offer) -> float:
        # No history: the ranking's prior, 19 launches in 20.
        return machines.get((offer.account_id, offer.zone), accounts.get(offer.account_id, 0.95))

    rows = apply(offer_list(now=now).select_related("gpu_model", "account"), terms, reliability=reliability)
    return sorted(rows, key=SORTS[sort])[:limit]


__all__ = ["FIELDS", "SORTS", "QueryError", "Term", "apply", "offers_search", "parse"]
