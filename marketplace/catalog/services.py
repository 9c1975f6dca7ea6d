"""Offer ingestion: validate, normalise to USD, bulk upsert by natural key, quarantine what cannot be sold."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from marketplace.catalog.price_falls import account_falling_moments
from marketplace.models import FxRate, GpuModel, Offer, OfferStatus, PricePoint, QuarantinedOffer
from marketplace.models.catalog import unit_prices
from marketplace.orders.reservations import cluster_nodes_refresh, machine_offers_recount
from marketplace.sla.published import OfferSla, offer_sla
from providers.community.mig import MIG_PROFILE, mig_profile
from providers.community.pricing import quotes_fallen
from providers.errors import ProviderError
from providers.models import ProviderAccount, ProviderKind, SyncStatus
from providers.services import adapter_for_account
from providers.types import GPU_FRACTION, GPU_TIME_SLICED, OfferQuote, PricingModel

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
    price_changes: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class _SpecRow(NamedTuple):
    key: str
    pk: int
    memory_gb: int
    fp16_dense_tflops: float


def _gpu_fraction(quote: OfferQuote) -> float:
    """The share of a card each of the quote's GPUs is (1 for whole cards); ValueError when unreadable."""
    fraction = float(quote.extra.get(GPU_FRACTION, 1))
    if not 0 < fraction <= 1:
        raise ValueError(f"impossible GPU fraction {fraction}")
    return fraction


def _memory_problem(quote: OfferQuote, spec: _SpecRow, fraction: float) -> str:
    # A slice holds its share of the card's memory: that share is what the row must match. A time-sliced
    # share's fraction is of the card's time: it sees all the memory.
    expected = spec.memory_gb * (1 if quote.extra.get(GPU_TIME_SLICED) is True else fraction)
    if quote.gpu_memory_gb == round(expected):
        return ""
    if abs(quote.gpu_memory_gb - expected * 1024) <= expected * 64:
        return f"GPU memory {quote.gpu_memory_gb} looks like MiB, spec is {expected:g} GB"
    # Providers round differently (22 GiB usable on a 24 GB card); only a gross mismatch is a wrong row.
    if not expected * 0.8 <= quote.gpu_memory_gb <= expected * 1.1:
        return f"GPU memory {quote.gpu_memory_gb} GB does not match {spec.key}'s {expected:g} GB"
    return ""


def _mig_problem(quote: OfferQuote, name: str, fraction: float) -> str:
    """Why a MIG slice's row cannot be sold, or ''. A slice's memory is not its compute share of the card (a
    3g.40gb is 3/7 of an H100's compute and half its memory), so the row must match the profile itself."""
    profile = mig_profile(quote.gpu_model, name)
    if profile is None:
        return f"MIG profile {name[:32]!r} is not one a {quote.gpu_model} offers"
    if quote.gpu_count != 1:
        return f"MIG slice of {quote.gpu_count} GPUs: a {name} is one slice of one GPU"
    if abs(fraction - float(profile.share)) > 1e-9:
        return f"MIG {name} is {profile.share} of a GPU, not a fraction of {fraction:g}"
    if quote.gpu_memory_gb != profile.memory_gb:
        return f"MIG {name} has {profile.memory_gb} GB, not {quote.gpu_memory_gb}"
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
    try:
        fraction = _gpu_fraction(quote)
    except (TypeError, ValueError) as exc:
        return str(exc)
    profile = quote.extra.get(MIG_PROFILE)
    problem = _memory_problem(quote, spec, fraction) if profile is None else _mig_problem(quote, str(profile), fraction)
    if problem:
        return problem
    rate = fx.get(quote.currency)
    if rate is None:
        return f"no FX rate for currency {quote.currency!r}"
    # Per whole card: a slice's price measured against a card's would hide a unit mix-up.
    if (quote.price * rate) / Decimal(quote.gpu_count * fraction) > MAX_USD_PER_GPU_HOUR:
        return f"implausible price {quote.price} {quote.currency} for {quote.gpu_count} GPU(s)"
    if quote.pricing_model == PricingModel.SPOT:
        reference = on_demand.get((quote.region, quote.zone, quote.instance_type))
        if reference is not None and quote.price >= reference:
            return f"spot price {quote.price} is not below on-demand {reference}"
    return ""


_FX_PLACES = Decimal("0.00000001")


def _reference_tables() -> tuple[dict[str, _SpecRow], dict[str, Decimal]]:
    """The GPU specs and FX rates validation needs, in one round trip (they are read on every sync)."""
    gpu = GpuModel._meta.db_table
    fx = FxRate._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key, id, memory_gb, fp16_dense_tflops, NULL FROM {gpu} "  # noqa: S608 - table names are ours
            f"UNION ALL SELECT currency, NULL, NULL, NULL, usd_per_unit FROM {fx}"
        )
        rows = cursor.fetchall()
    specs: dict[str, _SpecRow] = {}
    rates: dict[str, Decimal] = {"USD": Decimal(1)}
    for key, pk, memory_gb, tflops, rate in rows:
        if pk is not None:
            specs[key] = _SpecRow(key, pk, memory_gb, float(tflops))
        else:
            # SQLite hands back the stored decimal as a float: round it to the column's scale, as the ORM does.
            rates[key] = Decimal(str(rate)).quantize(_FX_PLACES) if isinstance(rate, float) else rate
    return specs, rates


def offers_ingest(*, account: ProviderAccount, quotes: list[OfferQuote], now: dt.datetime) -> IngestReport:
    """Replace the account's offers with ``quotes``, atomically.

    Valid rows are upserted in bulk on (account, region, zone, instance type, pricing model); an offer whose
    price changed keeps the price it replaces as a PricePoint; rows that fail validation go to QuarantinedOffer
    with the reason; the account's offers missing from ``quotes`` are marked unavailable. Safe to repeat.
    """
    specs, fx = _reference_tables()
    on_demand = {
        (q.region, q.zone, q.instance_type): q.price for q in quotes if q.pricing_model == PricingModel.ON_DEMAND
    }
    report = IngestReport()
    slas = {p.value: _offer_sla(account, p.value) for p in PricingModel}
    valid: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    refused: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for quote in quotes:
        key = quote.natural_key
        reason = _validate(quote, specs, fx, on_demand)
        if not reason and key in valid:
            reason = "duplicate row for the same offer in one sync"
        if reason:
            report.reasons[reason.split(" ")[0]] = report.reasons.get(reason.split(" ")[0], 0) + 1
            refused[key] = {
                "region": quote.region,
                "zone": quote.zone,
                "instance_type": quote.instance_type,
                "pricing_model": quote.pricing_model.value,
                "reason": reason[:255],
                "raw": _raw(quote),
            }
            continue
        rate = fx[quote.currency]
        price_usd = (quote.price * rate).quantize(_MONEY)
        spec = specs[quote.gpu_model]
        # Plain dicts, not model instances: building 10,000 Model objects costs more than writing them.
        valid[key] = {
            "region": quote.region,
            "zone": quote.zone,
            "instance_type": quote.instance_type,
            "pricing_model": quote.pricing_model.value,
            "gpu_model_id": spec.pk,
            "gpu_count": quote.gpu_count,
            "gpu_memory_gb": quote.gpu_memory_gb,
            "vcpus": quote.vcpus,
            "memory_gib": quote.memory_gib,
            "price": quote.price,
            "currency": quote.currency,
            "fx_rate": rate,
            "price_usd": price_usd,
            # Per card-equivalent, so a slice sorts by what a whole GPU's worth of it costs.
            **unit_prices(price_usd, quote.gpu_count * _gpu_fraction(quote), spec.fp16_dense_tflops),
            "capacity": quote.capacity,
            "interconnect": quote.interconnect,
            "extra": quote.extra,
            **_sla_columns(slas[quote.pricing_model.value]),
        }
    for key in refused:
        valid.pop(key, None)

    if connection.vendor == "postgresql":
        report.price_changes, report.vanished = _write_postgresql(account, valid, refused, now)
    else:
        with transaction.atomic():
            report.price_changes, report.vanished = _write_orm(account, valid, refused, now)
    report.upserted = len(valid)
    report.quarantined = len(refused)
    return report


def _offer_sla(account: ProviderAccount, pricing_model: str) -> OfferSla | None:
    """What the account's offers of ``pricing_model`` state as their SLA (``marketplace.sla.published``)."""
    return offer_sla(
        kind=account.kind,
        pricing_model=pricing_model,
        seller_pct=account.sla_commitment_pct,
        floor_pct=Decimal(str(settings.SLA_FLOOR_PCT)),
    )


def _sla_columns(sla: OfferSla | None) -> dict[str, Any]:
    if sla is None:
        return {"sla_availability": None, "sla_credits": [], "sla_source": ""}
    return {"sla_availability": sla.availability_pct, "sla_credits": sla.credits_json(), "sla_source": sla.source}


NATURAL_KEY = ("account", "region", "zone", "instance_type", "pricing_model")
_KEY_COLUMNS = ("region", "zone", "instance_type", "pricing_model")
# Each row's own columns and their PostgreSQL types; account, status and the timestamps are the same for
# every row of one sync and travel as parameters.
_ROW_COLUMNS = {
    "region": "text",
    "zone": "text",
    "instance_type": "text",
    "pricing_model": "text",
    "gpu_model_id": "bigint",
    "gpu_count": "smallint",
    "gpu_memory_gb": "integer",
    "vcpus": "integer",
    "memory_gib": "numeric",
    "price": "numeric",
    "currency": "text",
    "fx_rate": "numeric",
    "price_usd": "numeric",
    "price_per_gpu_usd": "double precision",
    "usd_per_tflop_hour": "double precision",
    "capacity": "integer",
    "interconnect": "text",
    "extra": "jsonb",
    "sla_availability": "numeric",
    "sla_credits": "jsonb",
    "sla_source": "text",
}
# Refreshed on conflict: everything but the natural key and first_seen_at.
_UPDATED = [c for c in _ROW_COLUMNS if c not in _KEY_COLUMNS] + ["status", "last_seen_at"]


def _key_match(a: str, b: str) -> str:
    return " AND ".join(f"{a}.{c} = {b}.{c}" for c in _KEY_COLUMNS)


def _write_postgresql(
    account: ProviderAccount,
    valid: dict[tuple[str, str, str, str], dict[str, Any]],
    refused: dict[tuple[str, str, str, str], dict[str, Any]],
    now: dt.datetime,
) -> tuple[int, int]:
    """Every write of one ingestion in a single statement: upsert the offers, keep each replaced price as a
    price point, mark the account's offers missing from this sync unavailable, and replace its quarantined rows.

    The rows travel as one JSON document expanded by ``jsonb_to_recordset``: no staging table, so no DDL,
    truncation or extra round trip per account. All parts of one statement share a snapshot: ``old`` sees
    the offers as they were before the upsert, so the price a changed offer had is kept exactly once; each
    part touches rows no other part touches. Returns (prices changed, offers no longer listed).
    """
    row_cols = ", ".join(_ROW_COLUMNS)
    row_types = ", ".join(f"{c} {t}" for c, t in _ROW_COLUMNS.items())
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _UPDATED)
    keys = ", ".join(("account_id", *_KEY_COLUMNS))
    outside_transaction = not connection.in_atomic_block
    # Offers are a copy of the provider's catalogue: a crash may lose this commit and the next sync redoes
    # it, so it need not wait for the WAL flush (the ledger and orders keep full durability). Set for this
    # statement's own transaction only; inside a caller's transaction the caller's durability stands.
    relaxed = ", set_config('synchronous_commit', 'off', true)" if outside_transaction else ""
    statement = f"""
        WITH stage AS (
            SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r({row_types})
        ), refused AS (
            SELECT * FROM jsonb_to_recordset(%(refused)s::jsonb)
                AS r(region text, zone text, instance_type text, pricing_model text, reason text, raw jsonb)
        ), old AS (
            SELECT id, price, currency, price_usd, price_since FROM marketplace_offer WHERE account_id = %(account)s
        ), up AS (
            INSERT INTO marketplace_offer
                (account_id, {row_cols}, status, first_seen_at, last_seen_at, price_since)
            SELECT %(account)s, {row_cols}, %(available)s, %(now)s, %(now)s, %(now)s FROM stage
            ON CONFLICT ({keys}) DO UPDATE SET {updates},
                reserved = LEAST(marketplace_offer.reserved, COALESCE(EXCLUDED.capacity, marketplace_offer.reserved)),
                price_since = CASE
                WHEN marketplace_offer.price = EXCLUDED.price THEN marketplace_offer.price_since
                ELSE EXCLUDED.price_since END
            RETURNING id, price
        ), gone AS (
            UPDATE marketplace_offer o SET status = %(unavailable)s
            WHERE o.account_id = %(account)s AND o.status <> %(unavailable)s
              AND NOT EXISTS (SELECT 1 FROM stage s WHERE {_key_match("s", "o")})
            RETURNING 1
        ), points AS (
            INSERT INTO marketplace_pricepoint (offer_id, observed_at, price, currency, price_usd)
            SELECT old.id, old.price_since, old.price, old.currency, old.price_usd
            FROM up JOIN old ON old.id = up.id
            WHERE old.price <> up.price
            RETURNING 1
        ), quarantined AS (
            INSERT INTO marketplace_quarantinedoffer ({keys}, reason, raw, last_seen_at)
            SELECT %(account)s, region, zone, instance_type, pricing_model, reason, raw, %(now)s FROM refused
            ON CONFLICT ({keys}) DO UPDATE
            SET reason = EXCLUDED.reason, raw = EXCLUDED.raw, last_seen_at = EXCLUDED.last_seen_at
            RETURNING 1
        ), released AS (
            DELETE FROM marketplace_quarantinedoffer q
            WHERE q.account_id = %(account)s AND NOT EXISTS (SELECT 1 FROM refused r WHERE {_key_match("r", "q")})
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM points), (SELECT count(*) FROM gone),
               (SELECT count(*) FROM quarantined), (SELECT count(*) FROM released){relaxed}
    """  # noqa: S608 - column names are ours, values are parameters
    params = {
        "rows": json.dumps(list(valid.values()), default=str),
        "refused": json.dumps(list(refused.values()), default=str),
        "account": account.pk,
        "now": now,
        "available": OfferStatus.AVAILABLE.value,
        "unavailable": OfferStatus.UNAVAILABLE.value,
    }
    connection.ensure_connection()
    # A server-side binding cursor: the JSON travels as a parameter instead of being quoted into the text of
    # the query (Django's default cursor binds on the client), which the server would then have to parse.
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(statement, params)
        points, gone = cursor.fetchone()[:2]
    return int(points), int(gone)


def _write_orm(
    account: ProviderAccount,
    valid: dict[tuple[str, str, str, str], dict[str, Any]],
    refused: dict[tuple[str, str, str, str], dict[str, Any]],
    now: dt.datetime,
) -> tuple[int, int]:
    """The same writes through the ORM, for SQLite; the caller holds the transaction."""
    before = {(o.region, o.zone, o.instance_type, o.pricing_model): o for o in Offer.objects.filter(account=account)}
    changed = [before[k] for k, row in valid.items() if k in before and before[k].price != row["price"]]
    for key, row in valid.items():
        old = before.get(key)
        if old is not None and row["capacity"] is not None and old.reserved > row["capacity"]:
            # A listing that shrank (a cluster node lost GPUs): what it holds is recounted after the sync.
            Offer.objects.filter(pk=old.pk).update(reserved=row["capacity"])
    Offer.objects.bulk_create(
        [
            Offer(
                account=account,
                **{**row, "extra": _jsonable(row["extra"])},
                status=OfferStatus.AVAILABLE,
                first_seen_at=now,
                last_seen_at=now,
                price_since=before[k].price_since if k in before and before[k].price == row["price"] else now,
            )
            for k, row in valid.items()
        ],
        batch_size=1000,
        update_conflicts=True,
        unique_fields=list(NATURAL_KEY),
        update_fields=[c.removesuffix("_id") for c in _UPDATED] + ["price_since"],
    )
    vanished = (
        Offer.objects.filter(account=account, last_seen_at__lt=now)
        .exclude(status=OfferStatus.UNAVAILABLE)
        .update(status=OfferStatus.UNAVAILABLE)
    )
    if refused:
        QuarantinedOffer.objects.bulk_create(
            [QuarantinedOffer(account=account, last_seen_at=now, **row) for row in refused.values()],
            batch_size=1000,
            update_conflicts=True,
            unique_fields=list(NATURAL_KEY),
            update_fields=["reason", "raw", "last_seen_at"],
        )
    QuarantinedOffer.objects.filter(account=account, last_seen_at__lt=now).delete()
    PricePoint.objects.bulk_create(
        [
            PricePoint(offer=o, observed_at=o.price_since, price=o.price, currency=o.currency, price_usd=o.price_usd)
            for o in changed
        ],
        batch_size=1000,
    )
    return len(changed), vanished


def _jsonable(extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` with anything JSON cannot hold (Decimal, datetime) turned into strings."""
    return json.loads(json.dumps(extra, default=str)) if extra else {}


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
    if account.kind == ProviderKind.COMMUNITY:
        # Leftover fragments and idle machines sell at the fallen price their sellers accepted, as of now.
        quotes = quotes_fallen(quotes, account_falling_moments(account_id=account.pk, now=started))
    report = offers_ingest(account=account, quotes=quotes, now=started)
    if account.kind == ProviderKind.COMMUNITY:
        machine_offers_recount(account_id=account.pk)
    elif account.kind == ProviderKind.KUBERNETES:
        cluster_nodes_refresh(account_id=account.pk, quotes=quotes, now=started)
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
