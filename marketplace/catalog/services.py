"""Offer ingestion: validate, normalise to USD, bulk upsert by natural key, quarantine what cannot be sold."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from marketplace.models import FxRate, GpuModel, Offer, OfferStatus, PricePoint, QuarantinedOffer
from providers.errors import ProviderError
from providers.models import ProviderAccount, SyncStatus
from providers.services import adapter_for_account
from providers.types import OfferQuote, PricingModel

log = logging.getLogger(__name__)

MAX_GPUS_PER_OFFER = 16
# Above this a per-GPU-hour price is a unit mix-up or a sentinel, not a real list price (B200 lists ~14).
MAX_USD_PER_GPU_HOUR = Decimal("60")
_MONEY = Decimal("0.000001")


@dataclass
class IngestReport:
    """What one ingestion did, for logs, the CLI and tests."""

    upserted: int = 0
    quarantined: int = 0
    vanished: int = 0
    price_points: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class _SpecRow(NamedTuple):
    key: str
    pk: int
    memory_gb: int


def _memory_problem(quote: OfferQuote, spec: _SpecRow) -> str:
    if quote.gpu_memory_gb == spec.memory_gb:
        return ""
    if abs(quote.gpu_memory_gb - spec.memory_gb * 1024) <= spec.memory_gb * 64:
        return f"GPU memory {quote.gpu_memory_gb} looks like MiB, spec is {spec.memory_gb} GB"
    # Providers round differently (22 GiB usable on a 24 GB card); only a gross mismatch is a wrong row.
    if not spec.memory_gb * 0.8 <= quote.gpu_memory_gb <= spec.memory_gb * 1.1:
        return f"GPU memory {quote.gpu_memory_gb} GB does not match {spec.key}'s {spec.memory_gb} GB"
    return ""


def _validate(
    quote: OfferQuote,
    specs: dict[str, _SpecRow],
    fx: dict[str, Decimal],
    on_demand: dict[tuple[str, str, str], Decimal],
) -> str:
    """The reason the row cannot be sold, or '' when it can."""
    if quote.price <= 0:
        return f"price {quote.price} is zero or negative"
    if not 1 <= quote.gpu_count <= MAX_GPUS_PER_OFFER:
        return f"impossible GPU count {quote.gpu_count}"
    spec = specs.get(quote.gpu_model)
    if spec is None:
        return f"unknown GPU model {quote.gpu_model!r} (no spec sheet)"
    problem = _memory_problem(quote, spec)
    if problem:
        return problem
    rate = fx.get(quote.currency)
    if rate is None:
        return f"no FX rate for currency {quote.currency!r}"
    if (quote.price * rate) / quote.gpu_count > MAX_USD_PER_GPU_HOUR:
        return f"implausible price {quote.price} {quote.currency} for {quote.gpu_count} GPU(s)"
    if quote.pricing_model == PricingModel.SPOT:
        reference = on_demand.get((quote.region, quote.zone, quote.instance_type))
        if reference is not None and quote.price >= reference:
            return f"spot price {quote.price} is not below on-demand {reference}"
    return ""


def _fx_rates() -> dict[str, Decimal]:
    rates = dict(FxRate.objects.values_list("currency", "usd_per_unit"))
    rates["USD"] = Decimal(1)
    return rates


def offers_ingest(*, account: ProviderAccount, quotes: list[OfferQuote], now: dt.datetime) -> IngestReport:
    """Replace the account's offers with ``quotes`` in one transaction.

    Valid rows are upserted in bulk on (account, region, zone, instance type, pricing model); a PricePoint is
    written for every new offer and every changed price; rows that fail validation go to QuarantinedOffer
    with the reason; the account's offers missing from ``quotes`` are marked unavailable. Safe to repeat.
    """
    # Only the three fields validation needs: full model instances cost more than the rest of a small sync.
    specs = {row.key: row for row in (_SpecRow(*v) for v in GpuModel.objects.values_list("key", "pk", "memory_gb"))}
    fx = _fx_rates()
    on_demand = {
        (q.region, q.zone, q.instance_type): q.price for q in quotes if q.pricing_model == PricingModel.ON_DEMAND
    }
    report = IngestReport()
    valid: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    refused: dict[tuple[str, str, str, str], QuarantinedOffer] = {}
    for quote in quotes:
        key = quote.natural_key
        reason = _validate(quote, specs, fx, on_demand)
        if not reason and key in valid:
            reason = "duplicate row for the same offer in one sync"
        if reason:
            report.reasons[reason.split(" ")[0]] = report.reasons.get(reason.split(" ")[0], 0) + 1
            refused[key] = QuarantinedOffer(
                account=account,
                region=quote.region,
                zone=quote.zone,
                instance_type=quote.instance_type,
                pricing_model=quote.pricing_model.value,
                reason=reason[:255],
                raw=_raw(quote),
                last_seen_at=now,
            )
            continue
        rate = fx[quote.currency]
        # Plain dicts, not model instances: building 10,000 Model objects costs more than writing them.
        valid[key] = {
            "account_id": account.pk,
            "region": quote.region,
            "zone": quote.zone,
            "instance_type": quote.instance_type,
            "pricing_model": quote.pricing_model.value,
            "gpu_model_id": specs[quote.gpu_model].pk,
            "gpu_count": quote.gpu_count,
            "gpu_memory_gb": quote.gpu_memory_gb,
            "vcpus": quote.vcpus,
            "memory_gib": quote.memory_gib,
            "price": quote.price,
            "currency": quote.currency,
            "fx_rate": rate,
            "price_usd": (quote.price * rate).quantize(_MONEY),
            "capacity": quote.capacity,
            "interconnect": quote.interconnect,
            "status": OfferStatus.AVAILABLE.value,
            "extra": json.loads(json.dumps(quote.extra, default=str)) if quote.extra else {},
            "first_seen_at": now,
            "last_seen_at": now,
        }
    for key in refused:
        valid.pop(key, None)

    with transaction.atomic():
        if connection.vendor == "postgresql":
            report.price_points, report.vanished = _upsert_postgresql(account, list(valid.values()), now)
        else:
            report.price_points, report.vanished = _upsert_orm(account, valid, now)
        if refused:
            QuarantinedOffer.objects.bulk_create(
                list(refused.values()),
                batch_size=1000,
                update_conflicts=True,
                unique_fields=list(NATURAL_KEY),
                update_fields=["reason", "raw", "last_seen_at"],
            )
        QuarantinedOffer.objects.filter(account=account, last_seen_at__lt=now).delete()
    report.upserted = len(valid)
    report.quarantined = len(refused)
    return report


NATURAL_KEY = ("account", "region", "zone", "instance_type", "pricing_model")
_COLUMNS = (
    "account_id",
    "region",
    "zone",
    "instance_type",
    "pricing_model",
    "gpu_model_id",
    "gpu_count",
    "gpu_memory_gb",
    "vcpus",
    "memory_gib",
    "price",
    "currency",
    "fx_rate",
    "price_usd",
    "capacity",
    "interconnect",
    "status",
    "extra",
    "first_seen_at",
    "last_seen_at",
)
# Refreshed on conflict: everything but the natural key and first_seen_at.
_UPDATED = [
    c for c in _COLUMNS if c not in {"account_id", "region", "zone", "instance_type", "pricing_model", "first_seen_at"}
]


def _upsert_postgresql(account: ProviderAccount, rows: list[dict[str, Any]], now: dt.datetime) -> tuple[int, int]:
    """COPY the rows into a temporary table, then one statement that upserts them, marks the account's
    offers missing from this sync unavailable and writes the price points.

    All parts of one statement share a snapshot: ``old`` sees prices from before the upsert, so a price point
    is written exactly for new offers and changed prices; the upsert and the unavailable-marking touch
    disjoint rows. Returns (price points written, offers no longer listed).
    """
    cols = ", ".join(_COLUMNS)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _UPDATED)
    key_match = " AND ".join(f"{{a}}.{c} = {{b}}.{c}" for c in ("region", "zone", "instance_type", "pricing_model"))
    with connection.cursor() as cursor:
        # One staging table per connection, emptied at every commit, so a sync pays no DDL per account; truncated
        # too, because two ingests can share one transaction (a caller's outer atomic block). Offers are a copy
        # of the provider's catalogue: a crash may lose this commit and the next sync redoes it, so the commit
        # need not wait for the WAL flush (the ledger and orders keep full durability).
        shape = f"SELECT {cols} FROM marketplace_offer WITH NO DATA"  # noqa: S608 - our own column names
        cursor.execute(
            "SET LOCAL synchronous_commit TO OFF; "
            f"CREATE TEMP TABLE IF NOT EXISTS offer_stage ON COMMIT DELETE ROWS AS {shape}; TRUNCATE offer_stage"
        )
        with cursor.cursor.copy(f"COPY offer_stage ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([json.dumps(row[c]) if c == "extra" else row[c] for c in _COLUMNS])
        cursor.execute(
            f"""
            WITH old AS (
                SELECT region, zone, instance_type, pricing_model, price
                FROM marketplace_offer WHERE account_id = %(account)s
            ), up AS (
                INSERT INTO marketplace_offer ({cols}) SELECT {cols} FROM offer_stage
                ON CONFLICT (account_id, region, zone, instance_type, pricing_model) DO UPDATE SET {updates}
                RETURNING id, region, zone, instance_type, pricing_model, price, currency, price_usd
            ), gone AS (
                UPDATE marketplace_offer o SET status = %(unavailable)s
                WHERE o.account_id = %(account)s AND o.status <> %(unavailable)s
                  AND NOT EXISTS (SELECT 1 FROM offer_stage s WHERE {key_match.format(a="s", b="o")})
                RETURNING 1
            ), points AS (
                INSERT INTO marketplace_pricepoint (offer_id, observed_at, price, currency, price_usd)
                SELECT up.id, %(now)s, up.price, up.currency, up.price_usd
                FROM up LEFT JOIN old ON {key_match.format(a="old", b="up")}
                WHERE old.price IS DISTINCT FROM up.price
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM points), (SELECT count(*) FROM gone)
            """,  # noqa: S608 - column names are ours, values are parameters
            {"account": account.pk, "now": now, "unavailable": OfferStatus.UNAVAILABLE.value},
        )
        points, gone = cursor.fetchone()
        return int(points), int(gone)


def _upsert_orm(
    account: ProviderAccount, valid: dict[tuple[str, str, str, str], dict[str, Any]], now: dt.datetime
) -> tuple[int, int]:
    """The same upsert through the ORM, for SQLite."""
    before = {
        (o.region, o.zone, o.instance_type, o.pricing_model): o.price
        for o in Offer.objects.filter(account=account).only("region", "zone", "instance_type", "pricing_model", "price")
    }
    Offer.objects.bulk_create(
        [Offer(**row) for row in valid.values()],
        batch_size=1000,
        update_conflicts=True,
        unique_fields=list(NATURAL_KEY),
        update_fields=[c.removesuffix("_id") for c in _UPDATED],
    )
    vanished = (
        Offer.objects.filter(account=account, last_seen_at__lt=now)
        .exclude(status=OfferStatus.UNAVAILABLE)
        .update(status=OfferStatus.UNAVAILABLE)
    )
    changed = [k for k, row in valid.items() if before.get(k) != row["price"]]
    if not changed:
        return 0, vanished
    ids = {
        (o.region, o.zone, o.instance_type, o.pricing_model): o.id
        for o in Offer.objects.filter(account=account, last_seen_at=now).only(
            "id", "region", "zone", "instance_type", "pricing_model"
        )
    }
    points = [
        PricePoint(
            offer_id=ids[k],
            observed_at=now,
            price=valid[k]["price"],
            currency=valid[k]["currency"],
            price_usd=valid[k]["price_usd"],
        )
        for k in changed
    ]
    PricePoint.objects.bulk_create(points, batch_size=1000)
    return len(points), vanished


def _raw(quote: OfferQuote) -> dict[str, object]:
    return {
        "gpu_model": quote.gpu_model,
        "gpu_count": quote.gpu_count,
        "gpu_memory_gb": quote.gpu_memory_gb,
        "vcpus": quote.vcpus,
        "memory_gib": str(quote.memory_gib),
        "price": str(quote.price),
        "currency": quote.currency,
    }


@dataclass
class SyncOutcome:
    account_id: int
    ok: bool
    error: str = ""
    report: IngestReport | None = None


def offers_sync(*, account_id: int, now: dt.datetime | None = None) -> SyncOutcome:
    """Fetch the account's offers through its adapter and ingest them.

    A provider failure (credentials, timeout, malformed answer) marks the account's sync failed with the
    reason and its offers stale; it never raises, so one account cannot block another.
    """
    account = ProviderAccount.objects.select_related("provider").get(pk=account_id)
    started = now or timezone.now()
    try:
        quotes = adapter_for_account(account).list_offers()
    except ProviderError as exc:
        log.warning("offer sync failed for account %s: %s", account.pk, exc)
        with transaction.atomic():
            ProviderAccount.objects.filter(pk=account.pk).update(
                sync_status=SyncStatus.FAILED, sync_error=str(exc)[:2000]
            )
            Offer.objects.filter(account=account, status=OfferStatus.AVAILABLE).update(status=OfferStatus.STALE)
        return SyncOutcome(account_id=account.pk, ok=False, error=str(exc))
    report = offers_ingest(account=account, quotes=quotes, now=started)
    ProviderAccount.objects.filter(pk=account.pk).update(
        sync_status=SyncStatus.OK, sync_error="", last_synced_at=started
    )
    log.info(
        "synced account %s: %d offers, %d quarantined, %d vanished",
        account.pk,
        report.upserted,
        report.quarantined,
        report.vanished,
    )
    return SyncOutcome(account_id=account.pk, ok=True, report=report)
