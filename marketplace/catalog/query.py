"""The offer search language, one for the storefront and the API::

    gpu=H100 count>=8 region=eu price<40 pricing=spot reliability>0.95

Terms are ``field op value`` separated by spaces, all of which must hold. Fields:

- ``gpu`` (``=``, ``!=``): a GPU model key or its family, case-insensitive (``H100`` is every H100 variant);
  several with commas (``gpu=H100,A100``).
- ``count``, ``mem`` (GB per GPU; also ``gpumem``), ``price`` (USD per hour), ``gpuprice`` (USD per GPU-hour),
  ``vcpu``, ``ram`` (GiB), ``reliability`` (0..1), ``perf`` (dense FP16 TFLOPS per USD/h): numbers with
  ``= != < <= > >=``.
- ``free`` (GPUs nobody holds on a finite listing, an independent machine's; a cloud's offer, whose stock the
  cloud keeps, matches no free term), ``net`` (Gbit/s, where the machine or the provider publishes it; an
  offer whose network is not known matches no net term), ``disk`` (GB, an independent machine's share; a
  cloud's disk is sized at launch, so a disk term does not narrow cloud offers): numbers, the same operators.
- ``region`` (``=``, ``!=``): a region name (``us-east-1``) or a jurisdiction (``eu``, ``us``, ``apac``,
  ``cn``, ``ch``, ...).
- ``pricing`` (``=``, ``!=``): ``on_demand`` (or ``ondemand``), ``spot``.
- ``provider`` (``=``, ``!=``): a provider kind, ``aws``, ``azure``, ``gcp``, ``alibaba``, ``tencent``, ``community``,
  ``kubernetes``.
- ``seller`` (``=``, ``!=``): the seller's name, case-insensitive, a space written as ``_``.

A mistake raises ``QueryError`` whose message names the term and its column and says what would be right.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import Case, ExpressionWrapper, F, FloatField, Q, QuerySet, Value, When
from django.db.models.functions import NullIf

from marketplace.catalog.regions import JURISDICTIONS, jurisdiction_of
from marketplace.catalog.selectors import (
    account_reliability,
    disk_gb_expression,
    free_gpus_expression,
    machine_reliability,
    network_gbps_expression,
    offer_list,
)
from marketplace.models import GpuModel, Offer
from marketplace.numbers import number_problem
from providers.models import ProviderKind

_TERM = re.compile(r"\S+")
_SPLIT = re.compile(r"^(?P<field>[A-Za-z_]+)(?P<op>!=|>=|<=|=|<|>)(?P<value>.*)$")
_NUMERIC = {
    "count": "gpu_count", "mem": "gpu_memory_gb", "price": "price_usd", "gpuprice": "price_per_gpu_usd",
    "vcpu": "vcpus", "ram": "memory_gib", "reliability": None, "free": None, "disk": None, "net": None, "perf": None,
}  # fmt: skip
_TEXT = ("gpu", "region", "pricing", "provider", "seller")
FIELDS = (*_TEXT, *_NUMERIC)
# Other names a buyer may reach for, read as the field they mean.
ALIASES = {"gpumem": "mem", "cpu": "vcpu", "vcpus": "vcpu", "memory": "ram", "network": "net", "sellers": "seller"}
# Computed per offer in the database (marketplace/catalog/selectors.py), compared as floating point or integers.
_COMPUTED = {
    "free": free_gpus_expression, "disk": disk_gb_expression, "net": network_gbps_expression,
    "perf": lambda: ExpressionWrapper(Value(1.0) / NullIf(F("usd_per_tflop_hour"), 0.0), output_field=FloatField()),
}  # fmt: skip
_FLOATS = ("gpuprice", "reliability", "net", "perf")
# A cloud's disk is sized at launch (up to its adapter's bound), so a disk term does not narrow cloud offers.
_UNKNOWN_MATCHES = ("disk",)
_PRICING = {"on_demand": "on_demand", "ondemand": "on_demand", "on-demand": "on_demand", "spot": "spot"}
PROVIDERS = _PROVIDERS = tuple(ProviderKind.values)
_LOOKUP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
# What a numeric term may compare with: beyond every offer there is (GPUs per machine, GB per GPU, USD per hour).
_RANGES = {
    "count": (0, 1024), "mem": (0, 16384), "price": (0, 1_000_000), "gpuprice": (0, 1_000_000),
    "reliability": (0, 1), "vcpu": (0, 100_000), "ram": (0, 1_000_000), "free": (0, 1024), "disk": (0, 10_000_000),
    "net": (0, 100_000), "perf": (0, 1_000_000),
}  # fmt: skip
# What each numeric field counts, for the message that refuses a wrong value.
_UNITS = {
    "count": "GPUs", "mem": "GB per GPU", "price": "USD per hour", "gpuprice": "USD per GPU-hour", "vcpu": "vCPUs",
    "ram": "GiB", "free": "free GPUs", "disk": "GB", "net": "Gbit/s", "perf": "dense FP16 TFLOPS per USD/h",
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


MAX_QUERY = 1000


def parse(text: str) -> list[Term]:
    """The terms of ``text``; raises ``QueryError`` at the first term that is not ``field op value``."""
    if len(text) > MAX_QUERY:
        raise QueryError(f"a search is at most {MAX_QUERY:,} characters", term=text[:20] + "…", column=1)
    terms = []
    for match in _TERM.finditer(text):
        raw, column = match.group(), match.start() + 1
        split = _SPLIT.match(raw)
        if split is None:
            raise QueryError("write each term as field, operator, value, e.g. count>=8", term=raw, column=column)
        field, op, value = split["field"].lower(), split["op"], split["value"]
        field = ALIASES.get(field, field)
        if field not in FIELDS:
            raise QueryError(f"unknown field {field!r}; fields are {', '.join(FIELDS)}", term=raw, column=column)
        if not value:
            raise QueryError(f"{field} needs a value after {op}", term=raw, column=column)
        terms.append(_term(field, op, value, raw, column))
    return terms


def _term(field: str, op: str, value: str, raw: str, column: int) -> Term:
    if field in _NUMERIC:
        low, high = _RANGES[field]
        # Checked as text before Decimal() reads it: a huge exponent would reach the database layer, whose
        # int() of 1e1000000 holds the process for a minute, and Decimal() reads any Unicode digit.
        if number_problem(value, low=low, high=high, whole=False):
            if field == "reliability":
                raise QueryError("reliability is a share from 0 to 1, e.g. reliability>0.95", term=raw, column=column)
            raise QueryError(
                f"{field} compares with a number from {low} to {high} ({_UNITS[field]}), written with the digits "
                f"0-9, not {value[:20]!r}",
                term=raw, column=column,
            )  # fmt: skip
        return Term(field, op, Decimal(value), raw, column)
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
    if field == "seller":
        if len(value) > 120:
            raise QueryError("a seller's name is at most 120 characters", term=raw[:40] + "…", column=column)
        return Term(field, op, value, raw, column)
    values = tuple(v for v in value.split(",") if v)
    if not values:
        raise QueryError(f"{field} needs a value after {op}", term=raw, column=column)
    return Term(field, op, values if field == "gpu" else value.lower(), raw, column)


def apply(
    queryset: QuerySet[Offer], terms: list[Term], *, reliability: Callable[[], Any] | None = None
) -> QuerySet[Offer]:
    """``queryset`` narrowed to the offers that satisfy every term, all in the database. ``reliability`` gives
    the expression of an offer's reliability (``reliability_expression``); it is needed only when a term
    names reliability."""
    for term in terms:
        condition: Q
        if term.field == "gpu":
            assert isinstance(term.value, tuple)
            condition = Q(gpu_model_id__in=_gpu_model_ids(term.value))
        elif term.field == "pricing":
            condition = Q(pricing_model=term.value)
        elif term.field == "provider":
            condition = Q(account__kind=term.value)
        elif term.field == "region":
            condition = _region_condition(str(term.value))
        elif term.field == "seller":
            # A term holds no space: a seller's name is matched with its spaces written as underscores too.
            names = {str(term.value), str(term.value).replace("_", " ")}
            condition = Q(pk__in=[])
            for name in names:
                condition |= Q(account__provider__name__iexact=name)
        else:
            queryset, column = _numeric_column(queryset, term.field, reliability)
            unknown = Q(**{f"{column}__isnull": True}) if term.field in _UNKNOWN_MATCHES else Q(pk__in=[])
            if term.op in _LOOKUP:
                queryset = queryset.filter(Q(**{f"{column}__{_LOOKUP[term.op]}": _number(term)}) | unknown)
                continue
            number = _number(term)
            if term.op == "!=":
                # Written as < or >: a figure that is not known is then neither equal nor unequal, as for < and >.
                queryset = queryset.filter(Q(**{f"{column}__lt": number}) | Q(**{f"{column}__gt": number}) | unknown)
                continue
            condition = Q(**{column: number}) | unknown
        queryset = queryset.exclude(condition) if term.op == "!=" else queryset.filter(condition)
    return queryset


def _number(term: Term) -> Decimal | float:
    assert isinstance(term.value, Decimal)
    # The computed columns are floating point; comparing them with a Decimal would make the database cast.
    return float(term.value) if term.field in _FLOATS else term.value


def _numeric_column(
    queryset: QuerySet[Offer], field: str, reliability: Callable[[], Any] | None
) -> tuple[QuerySet[Offer], str]:
    if field == "reliability":
        assert reliability is not None, "a reliability term needs the reliability expression"
        return queryset.alias(q_reliability=reliability()), "q_reliability"
    if field in _COMPUTED:
        return queryset.alias(**{f"q_{field}": _COMPUTED[field]()}), f"q_{field}"
    return queryset, str(_NUMERIC[field])


# Region names per jurisdiction change only when a sync finds a new region; reading them costs a scan.
_REGIONS_TTL_S = 30.0
_regions_cache: dict[str, Any] = {"at": -_REGIONS_TTL_S, "pairs": ()}


def _offer_regions() -> tuple[tuple[str, str], ...]:
    now = time.monotonic()
    if now - _regions_cache["at"] > _REGIONS_TTL_S:
        pairs = Offer.objects.values_list("account__kind", "region").distinct()
        _regions_cache.update(at=now, pairs=tuple(sorted(set(pairs))))
    return _regions_cache["pairs"]  # type: ignore[no-any-return]


def _region_condition(region: str) -> Q:
    """A region name, or a jurisdiction code matched against the regions offers are in. A region name that
    two clouds place in different jurisdictions is matched with its cloud; the rest by name alone, which
    the planner can estimate from the region's statistics."""
    code = region.upper()
    if code not in JURISDICTIONS:
        return Q(region__iexact=region)
    inside, outside = set(), set()
    for kind, name in _offer_regions():
        (inside if jurisdiction_of(kind, name) == code else outside).add(name)
    condition = Q(region__in=sorted(inside - outside))
    for kind, name in _offer_regions():
        if name in inside & outside and jurisdiction_of(kind, name) == code:
            condition |= Q(account__kind=kind, region=name)
    return condition


def _gpu_model_ids(names: tuple[str, ...]) -> list[int]:
    """The GPU models a ``gpu`` term names: each name exactly or as a family (``H100`` is ``H100-*``). Resolved
    before the offer query so the planner sees the ids and can use their statistics and index."""
    condition = Q(pk__in=[])
    for name in names:
        condition |= Q(key__iexact=name) | Q(key__istartswith=f"{name}-")
    return list(GpuModel.objects.filter(condition).values_list("pk", flat=True))


# Each sort but ``score`` walks a partial index; ``score`` weighs in reliability, which changes with every launch,
# so it sorts the matching offers (narrow the search first on a large catalogue).
SORTS = {"price": "price_usd", "gpuprice": "price_per_gpu_usd", "tflops": "usd_per_tflop_hour", "score": ""}


def reliability_expression(*, now: dt.datetime) -> Any:
    """An offer's reliability as an SQL expression: its machine's score for an independent machine, else its
    account's, else the ranking's prior for no history (19 launches in 20)."""
    whens = [When(account_id=a, zone=z, then=Value(s)) for (a, z), s in machine_reliability(now=now).items()]
    whens += [When(account_id=a, then=Value(s)) for a, s in account_reliability(now=now).items()]
    return Case(*whens, default=Value(0.95), output_field=FloatField())


def offers_query(text: str, *, now: dt.datetime, sort: str = "price") -> QuerySet[Offer]:
    """The offers for sale matching ``text``, annotated with ``sort_key`` and ordered by it, then by id:
    ``price`` (per hour), ``gpuprice`` (per GPU-hour), ``tflops`` (per dense-FP16 TFLOP-hour) or ``score`` (per
    TFLOP-hour divided by the offer's reliability: what a TFLOP-hour costs once failed launches are counted).
    Filtering, ordering and any slice run in the database. Raises ``QueryError``."""
    if sort not in SORTS:
        raise QueryError(f"sort by one of {', '.join(SORTS)}", term=sort, column=1)
    terms = parse(text)
    queryset = apply(offer_list(now=now), terms, reliability=lambda: reliability_expression(now=now))
    if sort == "score":
        score = ExpressionWrapper(F("usd_per_tflop_hour") / reliability_expression(now=now), output_field=FloatField())
        return queryset.annotate(sort_key=score).order_by("sort_key", "id")
    return queryset.annotate(sort_key=F(SORTS[sort])).order_by(SORTS[sort], "id")


def offers_search(text: str, *, now: dt.datetime, sort: str = "price", limit: int = 500) -> list[Offer]:
    """The first ``limit`` offers of ``offers_query``."""
    return rows_in_order(offers_query(text, now=now, sort=sort), gpu_partitions(text, sort), limit)


# Beyond this many models a gpu term is broad, and one walk of the sort order's index is the cheaper plan.
_MAX_PARTITIONS = 8


def gpu_partitions(text: str, sort: str = "price") -> list[Q]:
    """One condition per GPU model a search's ``gpu=`` term names (none for other searches; a parse error is
    ``offers_query``'s to raise). Prices follow the model, which the planner cannot know: asked for the cheapest
    H100s it walks the price index through every cheaper GPU. One query per model walks that model's offers
    instead, and ``rows_in_order`` merges them. Only the price order has an index per model to walk."""
    if sort != "price":
        return []
    try:
        terms = parse(text)
    except QueryError:
        return []
    models = [t for t in terms if t.field == "gpu" and t.op == "="]
    if len(models) != 1:
        return []
    assert isinstance(models[0].value, tuple)
    ids = _gpu_model_ids(models[0].value)
    return [Q(gpu_model_id=pk) for pk in ids] if 1 < len(ids) <= _MAX_PARTITIONS else []


def rows_in_order(queryset: QuerySet[Offer], partitions: list[Q], limit: int) -> list[Offer]:
    """The first ``limit`` rows of ``queryset`` (annotated with ``sort_key`` and ordered by it, then id), read
    one disjoint partition at a time when ``partitions`` are given and merged."""
    if not partitions:
        return list(queryset[:limit])
    if connection.features.supports_slicing_ordering_in_compound:  # PostgreSQL: one UNION ALL round trip
        first, *rest = (queryset.filter(condition)[:limit] for condition in partitions)
        return list(first.union(*rest, all=True).order_by("sort_key", "id")[:limit])
    branches = [list(queryset.filter(condition)[:limit]) for condition in partitions]
    return list(itertools.islice(heapq.merge(*branches, key=lambda o: (o.sort_key, o.pk)), limit))


__all__ = [
    "FIELDS", "PROVIDERS", "SORTS", "QueryError", "Term", "apply", "gpu_partitions", "offers_query", "offers_search",
    "parse", "rows_in_order",
]  # fmt: skip
