"""Quotes and procurements: the engine's answers turned into priced, expiring quotes a buyer can order from."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from marketplace.catalog.selectors import offer_book
from marketplace.launch.config import LaunchChoice, LaunchConfigInvalid, launch_configuration_create
from marketplace.matching import Assignment, Demand, Ranking, assign, rank
from marketplace.matching import Quote as EngineQuote
from marketplace.matching.profiles import defaults_for
from marketplace.models import LaunchConfiguration, Organization, Quote
from marketplace.orders.blocks import provider_blocks

_HOURS = Decimal("0.01")
_MONEY = Decimal("0.000001")


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, frozenset | set | tuple | list):
        items = [_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, frozenset | set) else items
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def demand_json(demand: Demand) -> dict[str, Any]:
    """The demand as stored on a quote and shown back to the buyer."""
    return {f.name: _jsonable(getattr(demand, f.name)) for f in dataclasses.fields(demand)}


@dataclass(frozen=True)
class QuoteBatch:
    batch: uuid.UUID
    quotes: list[Quote]
    ranking: Ranking
    expires_at: dt.datetime


def _quote_row(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    batch: uuid.UUID,
    rank_no: int,
    demand: Demand,
    quote: EngineQuote,
    now: dt.datetime,
    expires_at: dt.datetime,
    launch_config: LaunchConfiguration | None = None,
) -> Quote:
    b = quote.breakdown
    return Quote(
        launch_config=launch_config,
        organization=organization,
        created_by=user,
        batch=batch,
        rank=rank_no,
        offer_id=quote.offer.offer_id,
        # The amount the profile holds fixed is shown filled in, and tells an order whether to stop at the hours.
        demand=demand_json(dataclasses.replace(demand, amount=demand.amount or defaults_for(demand).amount)),
        units=Decimal(str(quote.units)).quantize(Decimal("0.0001")),
        price_per_hour=b.price_per_hour.quantize(_MONEY),
        # The job's hours on this offer: the duration asked for, or how long the fixed work takes on it.
        duration_hours=Decimal(repr(b.job_hours)).quantize(_HOURS),
        total_price=b.price_cost.quantize(_MONEY),
        score=b.score,
        breakdown=_jsonable(dataclasses.asdict(b)),
        reason=quote.reason[:255],
        created_at=now,
        expires_at=expires_at,
    )


def quote_request(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    demand: Demand,
    limit: int = 10,
    now: dt.datetime | None = None,
    launch: LaunchChoice | None = None,
) -> QuoteBatch:
    """Rank the offers on sale for ``demand`` and store the best ``limit`` as quotes, prices locked for
    ``QUOTE_TTL_S`` seconds. An empty batch still carries the ranking's near misses and rejection counts.
    ``launch``, when given, is validated now (``LaunchConfigInvalid``) and what each quote's order launches."""
    now = now or timezone.now()
    ranking = rank(
        demand,
        offer_book(now=now),
        now=now,
        max_age=dt.timedelta(seconds=settings.OFFER_MAX_AGE_S),
        exclusion=provider_blocks(now=now),
        limit=limit,
    )
    batch = uuid.uuid4()
    expires_at = now + dt.timedelta(seconds=settings.QUOTE_TTL_S)
    with transaction.atomic():
        config = (
            None if launch is None else launch_configuration_create(organization=organization, user=user, choice=launch)
        )
        rows = [
            _quote_row(
                organization=organization,
                user=user,
                batch=batch,
                rank_no=i + 1,
                demand=demand,
                quote=q,
                now=now,
                expires_at=expires_at,
                launch_config=config,
            )
            for i, q in enumerate(ranking.quotes[:limit])
        ]
        Quote.objects.bulk_create(rows)
    stored = list(Quote.objects.filter(batch=batch).select_related("offer__gpu_model", "offer__account"))
    return QuoteBatch(batch=batch, quotes=stored, ranking=ranking, expires_at=expires_at)


@dataclass(frozen=True)
class ProcurementResult:
    batch: uuid.UUID
    assignment: Assignment
    quotes: dict[int, Quote]  # demand index -> its stored quote
    expires_at: dt.datetime


def procurement_run(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    demands: list[Demand],
    time_limit: float | None = None,
    now: dt.datetime | None = None,
    launches: dict[int, LaunchChoice] | None = None,
) -> ProcurementResult:
    """Assign a batch of demands jointly against the offers on sale (finite capacity shared between them)
    and store each placed demand's quote, price locked, so each can be ordered. ``launches`` maps a demand's
    index to its launch configuration, validated before anything is stored (``LaunchConfigInvalid``, its
    fields prefixed with ``demands[i].``)."""
    now = now or timezone.now()
    assignment = assign(
        demands,
        offer_book(now=now),
        now=now,
        time_limit=time_limit or settings.PROCUREMENT_TIME_LIMIT_S,
        max_age=dt.timedelta(seconds=settings.OFFER_MAX_AGE_S),
        exclusion=provider_blocks(now=now),
    )
    batch = uuid.uuid4()
    expires_at = now + dt.timedelta(seconds=settings.QUOTE_TTL_S)
    with transaction.atomic():
        configs: dict[int, LaunchConfiguration] = {}
        for index, choice in sorted((launches or {}).items()):
            try:
                configs[index] = launch_configuration_create(organization=organization, user=user, choice=choice)
            except LaunchConfigInvalid as exc:
                raise LaunchConfigInvalid({f"demands[{index}].{k}": v for k, v in exc.fields.items()}) from None
        rows = {
            i: _quote_row(
                organization=organization,
                user=user,
                batch=batch,
                rank_no=i + 1,
                demand=placed.demand,
                quote=placed.quote,
                now=now,
                expires_at=expires_at,
                launch_config=configs.get(i),
            )
            for i, placed in enumerate(assignment.demands)
            if placed.quote is not None
        }
        Quote.objects.bulk_create(list(rows.values()))
    stored = {
        q.rank - 1: q for q in Quote.objects.filter(batch=batch).select_related("offer__gpu_model", "offer__account")
    }
    return ProcurementResult(batch=batch, assignment=assignment, quotes=stored, expires_at=expires_at)


def quote_get(*, organization: Organization, public_id: str) -> Quote | None:
    """The quote if it belongs to ``organization``; None otherwise (a stranger learns nothing)."""
    try:
        uuid.UUID(str(public_id))
    except ValueError:
        return None
    return (
        Quote.objects.select_related("offer__gpu_model", "offer__account")
        .filter(organization=organization, public_id=public_id)
        .first()
    )
