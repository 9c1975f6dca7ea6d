"""Reads of the catalogue."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import (
    Case,
    CharField,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, Greatest, Least
from django.utils import timezone

from marketplace.catalog.regions import jurisdiction_of
from marketplace.matching import GpuSpec, OfferBook, OfferView
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    GpuHold,
    GpuModel,
    Instance,
    Offer,
    OfferStatus,
    OrderState,
)
from marketplace.sla.selectors import accounts_availability, machines_availability
from providers.community.mig import MIG_PROFILE
from providers.community.protocol import HEARTBEAT_S
from providers.errors import CapacityUnavailable, QuotaExceeded
from providers.models import ClusterNode, Machine, MachineHeartbeat, ProviderKind
from providers.registry import ADAPTERS, adapter_class
from providers.types import GPU_FRACTION, NETWORK_GBPS, PricingModel


@dataclass(frozen=True)
class OfferFilters:
    gpu_model: str = ""
    min_gpu_count: int | None = None
    region: str = ""
    pricing_model: str = ""
    max_price_per_hour: Decimal | None = None


def offer_list(*, filters: OfferFilters | None = None, now: dt.datetime | None = None) -> QuerySet[Offer]:
    """Offers a buyer can order now, cheapest per hour first."""
    qs = (
        Offer.objects.filter(status=OfferStatus.AVAILABLE, account__enabled=True)
        # Every unit is held by an order, and not by bids an order for this offer could outbid.
        .alias(on_bids=bid_gpus_expression(), takeable=free_gpus_expression() + F("on_bids"))
        .exclude(
            Q(capacity__isnull=False, reserved__gte=F("capacity"))
            & ~(Q(on_bids__gt=0, takeable__gte=F("gpu_count")) & ~Q(extra__has_key=MIG_PROFILE))
        )
        .select_related("gpu_model", "account__provider")
    )
    if now is not None:
        qs = qs.filter(last_seen_at__gte=now - dt.timedelta(seconds=settings.OFFER_MAX_AGE_S))
    return offers_filter(qs, filters or OfferFilters()).order_by("price_usd", "id")


def _offer_machine() -> QuerySet[Machine]:
    """The independent machine an offer (the outer query's row) sells: its zone names it within the account."""
    return Machine.objects.filter(account_id=OuterRef("account_id"), name=OuterRef("zone"))


def _gpus_held(holds: QuerySet[GpuHold]) -> Subquery:
    """How many GPUs of the outer offer's machine ``holds`` cover (a GPU partly sliced counts once)."""
    on_machine = holds.filter(machine__account_id=OuterRef("account_id"), machine__name=OuterRef("zone"))
    counted = on_machine.order_by().values("machine_id").annotate(n=Count("gpu_index", distinct=True)).values("n")
    return Subquery(counted, output_field=IntegerField())


def outbiddable_holds() -> QuerySet[GpuHold]:
    """Holds of whole GPUs by running interruptible orders not yet under notice: what an on-demand order, or
    a higher bid, takes when a machine has too few free GPUs (``marketplace.orders.bids.outbid_candidates``)."""
    return GpuHold.objects.filter(
        mig_profile="",
        attempt__order__state=OrderState.RUNNING,
        attempt__order__pricing_model=PricingModel.SPOT,
        attempt__order__preempt_at__isnull=True,
    )


def free_gpus_expression() -> Any:
    """An offer's free GPUs as SQL: on an independent machine, its GPUs nobody holds (whatever the lease
    sizes); on another finite listing, its unreserved units' GPUs; NULL for a cloud's offer, whose stock the
    cloud keeps and does not tell."""
    machine_gpus = Subquery(_offer_machine().values("gpu_count")[:1], output_field=IntegerField())
    return Case(
        When(Exists(_offer_machine()), then=machine_gpus - Coalesce(_gpus_held(GpuHold.objects.all()), 0)),
        When(capacity__isnull=False, then=(F("capacity") - F("reserved")) * F("gpu_count")),
        default=None,
        output_field=IntegerField(),
    )


def bid_gpus_expression() -> Any:
    """An offer's machine's GPUs held by bids it could outbid (``outbiddable_holds``) as SQL; 0 elsewhere."""
    return Coalesce(_gpus_held(outbiddable_holds()), 0)


def disk_gb_expression() -> Any:
    """An offer's disk in GB as SQL: its share of an independent machine's disk, in proportion to its GPUs
    as the machine's CPUs and memory are shared; NULL for a cloud's offer, whose disk is sized at launch."""
    share = _offer_machine().annotate(
        share=ExpressionWrapper(F("disk_gb") * OuterRef("gpu_count") / F("gpu_count"), output_field=IntegerField())
    )
    return Subquery(share.values("share")[:1], output_field=IntegerField())


def network_gbps_expression() -> Any:
    """An offer's network in Gbit/s as SQL: an independent machine's link, else the figure the provider
    published for the instance type (``extra["network_gbps"]``), else NULL (not known)."""
    machine = Subquery(_offer_machine().values("network_gbps")[:1])
    published = Cast(KeyTextTransform(NETWORK_GBPS, "extra"), FloatField())
    return Coalesce(Cast(machine, FloatField()), published)


def offers_filter(qs: QuerySet[Offer], f: OfferFilters) -> QuerySet[Offer]:
    """``qs`` narrowed by the storefront's filter fields."""
    if f.gpu_model:
        qs = qs.filter(gpu_model__key=f.gpu_model)
    if f.min_gpu_count:
        qs = qs.filter(gpu_count__gte=f.min_gpu_count)
    if f.region:
        qs = qs.filter(region=f.region)
    if f.pricing_model:
        qs = qs.filter(pricing_model=f.pricing_model)
    if f.max_price_per_hour is not None:
        qs = qs.filter(price_usd__lte=f.max_price_per_hour)
    return qs


@dataclass(frozen=True)
class OfferGroup:
    """One row of the offers page: the offers of one account's instance type in one region at one pricing model,
    one per zone, in the search's order (so ``offers[0]``, the lead, is the cheapest zone's). An independent
    machine, or a Kubernetes cluster's node, is a group of its own: its "zone" names the machine, a different host
    with its own GPUs and record, not an interchangeable placement."""

    offers: tuple[Offer, ...]

    @property
    def lead(self) -> Offer:
        return self.offers[0]

    @property
    def zones(self) -> list[str]:
        return [o.zone for o in self.offers]

    @property
    def price_max(self) -> Decimal:
        return max(o.price_usd for o in self.offers)

    @property
    def price_per_gpu_max(self) -> float:
        return max(o.price_per_gpu_usd for o in self.offers)


@dataclass(frozen=True)
class OfferGroupPage:
    """A page of ``offer_groups``: its rows, and how many rows and offers the whole search has."""

    groups: list[OfferGroup]
    group_total: int
    offer_total: int


_GROUP_FIELDS = ("account_id", "instance_type", "region", "pricing_model", "group_zone")
# Kinds whose zone is one machine (a host, a cluster's node) rather than a placement of the same hardware.
_MACHINE_KINDS = (ProviderKind.COMMUNITY, ProviderKind.KUBERNETES)


def offer_groups(queryset: QuerySet[Offer], *, offset: int, limit: int) -> OfferGroupPage:
    """``queryset`` (annotated with ``sort_key`` and ordered by it, then id, as ``query.offers_query`` returns it)
    folded into ``OfferGroup`` rows, rows ``offset`` to ``offset + limit``. Rows are ordered by their lead's sort
    key, then by their key, so the order is total and a page holds the same rows on every visit while the
    catalogue is unchanged. Grouping, counting and the slice run in the database: four queries whatever the size
    of the catalogue."""
    keyed = queryset.annotate(
        group_zone=Case(
            When(account__kind__in=_MACHINE_KINDS, then=F("zone")), default=Value(""), output_field=CharField()
        )
    )
    grouped = keyed.order_by().values(*_GROUP_FIELDS).annotate(best=Min("sort_key"))
    offer_total = queryset.count()
    group_total = grouped.count() if offer_total else 0
    keys = [
        tuple(row[f] for f in _GROUP_FIELDS)
        for row in grouped.order_by("best", *_GROUP_FIELDS)[offset : offset + limit]
    ]
    if not keys:
        return OfferGroupPage([], group_total, offer_total)
    wanted = Q(pk__in=[])
    for key in keys:
        wanted |= Q(**dict(zip(_GROUP_FIELDS, key, strict=True)))
    members: dict[tuple[object, ...], list[Offer]] = {key: [] for key in keys}
    for offer in keyed.filter(wanted).order_by("sort_key", "id"):
        members[tuple(getattr(offer, f) for f in _GROUP_FIELDS)].append(offer)
    return OfferGroupPage([OfferGroup(tuple(members[key])) for key in keys], group_total, offer_total)


@dataclass(frozen=True)
class OfferFacts:
    """What the offers page shows of an offer beyond its own row. ``free_gpus`` is None for a cloud's offer
    (the cloud keeps its stock); ``total_gpus`` is its machine's GPUs (None off a machine); ``bid_gpus`` are
    GPUs held by interruptible leases an on-demand order outranks and a higher bid outbids, shown apart from
    the free ones because they come only after the outbid lease's notice. ``disk_gb`` is None where disk is
    sized at launch, ``network_gbps`` None where not known, ``reliability`` None for a machine with no launch
    yet. ``perf_per_usd`` is the buyer's profile's throughput per USD/h (``perf_unit`` names it)."""

    seller: str
    free_gpus: int | None
    total_gpus: int | None
    bid_gpus: int
    disk_gb: int | None
    network_gbps: float | None
    reliability: float | None
    perf_per_usd: float | None


def offer_facts(offers: list[Offer], *, metric: str, now: dt.datetime) -> dict[int, OfferFacts]:
    """``OfferFacts`` per offer id of ``offers`` (loaded with their account's provider and GPU model), in a
    fixed number of queries however many offers there are. ``metric`` is a ``GpuModel`` throughput field
    (a profile's, ``marketplace.matching.PROFILES``)."""
    if not offers:
        return {}
    machines = {
        (m.account_id, m.name): m
        for m in Machine.objects.filter(
            account_id__in={o.account_id for o in offers}, name__in={o.zone for o in offers}
        ).only("id", "account_id", "name", "gpu_count", "disk_gb", "network_gbps")
    }
    ids = [m.pk for m in machines.values()]

    def held(holds: QuerySet[GpuHold]) -> dict[int, int]:
        rows = holds.filter(machine_id__in=ids).values("machine_id").annotate(n=Count("gpu_index", distinct=True))
        return {r["machine_id"]: r["n"] for r in rows}

    held_all = held(GpuHold.objects.all()) if ids else {}
    held_bids = held(outbiddable_holds()) if ids else {}
    accounts = account_reliability(now=now)
    machine_scores = machine_reliability_shown(now=now)
    facts = {}
    for offer in offers:
        machine = machines.get((offer.account_id, offer.zone))
        if machine is not None:
            free: int | None = machine.gpu_count - held_all.get(machine.pk, 0)
            disk: int | None = machine.disk_gb * offer.gpu_count // machine.gpu_count
            network = float(machine.network_gbps)
            reliability = machine_scores.get((offer.account_id, offer.zone))
        else:
            free = None if offer.capacity is None else (offer.capacity - offer.reserved) * offer.gpu_count
            disk = None
            published = (offer.extra or {}).get(NETWORK_GBPS)
            network = float(published) if isinstance(published, int | float) else None
            reliability = accounts.get(offer.account_id)
        throughput = getattr(offer.gpu_model, metric)
        perf = float(throughput) * float(offer.cards) / float(offer.price_usd) if throughput else None
        facts[offer.pk] = OfferFacts(
            seller=offer.account.provider.name,
            free_gpus=free,
            total_gpus=None if machine is None else machine.gpu_count,
            bid_gpus=0 if machine is None else held_bids.get(machine.pk, 0),
            disk_gb=disk,
            network_gbps=network,
            reliability=reliability,
            perf_per_usd=perf,
        )
    return facts


def offer_view(offer: Offer, **engine_fields: Any) -> OfferView:
    """The engine's view of ``offer``; ``engine_fields`` adds what only ranking needs (spec, jurisdiction,
    reliability, ...)."""
    return OfferView(
        offer_id=offer.pk,
        account_id=offer.account_id,
        provider_kind=offer.account.kind,
        region=offer.region,
        zone=offer.zone,
        instance_type=offer.instance_type,
        pricing_model=offer.pricing_model,
        gpu_model=offer.gpu_model.key,
        gpu_count=offer.gpu_count,
        gpu_memory_gb=offer.gpu_memory_gb,
        price_usd_per_hour=offer.price_usd,
        observed_at=offer.last_seen_at,
        capacity=None if offer.capacity is None else offer.capacity - offer.reserved,
        # A partitioned GPU's share of a card, as ingestion checked it (providers.types.GPU_FRACTION).
        gpu_fraction=float((offer.extra or {}).get(GPU_FRACTION, 1.0)),
        **engine_fields,
    )


def offer_views_for(*, gpu_model: str, min_gpu_count: int) -> list[OfferView]:
    """Candidate offers for matching: available, enabled accounts, the right GPU model and count."""
    return [offer_view(o) for o in offers_for_matching(gpu_model=gpu_model, min_gpu_count=min_gpu_count)]


def offers_for_matching(*, gpu_model: str, min_gpu_count: int) -> list[Offer]:
    """The offers behind ``offer_views_for``, with their GPU model and account: a caller that ranks their views
    has the winner's row at hand without reading it again."""
    return list(
        Offer.objects.filter(
            status=OfferStatus.AVAILABLE,
            account__enabled=True,
            gpu_model__key=gpu_model,
            gpu_count__gte=min_gpu_count,
        )
        .select_related("gpu_model", "account")
        .order_by("id")
    )


def gpu_spec(model: GpuModel) -> GpuSpec:
    """The engine's view of a spec row (floats: the engine computes, money stays Decimal elsewhere)."""

    def opt(value: Decimal | None) -> float | None:
        return None if value is None else float(value)

    return GpuSpec(
        key=model.key,
        memory_gb=model.memory_gb,
        memory_bandwidth_gbs=model.memory_bandwidth_gbs,
        fp16_dense_tflops=float(model.fp16_dense_tflops),
        fp64_tflops=float(model.fp64_tflops),
        fp32_tflops=opt(model.fp32_tflops),
        fp8_dense_tflops=opt(model.fp8_dense_tflops),
        int8_dense_tops=opt(model.int8_dense_tops),
        interconnect=model.interconnect,
        interconnect_gbs=model.interconnect_gbs,
        video_encoders=model.video_encoders,
        ecc=model.ecc,
        verified=model.verified,
    )


# A launch that failed for want of capacity or quota says nothing about the provider's reliability.
_NOT_RELIABILITY = (CapacityUnavailable.error_class, QuotaExceeded.error_class)
# Beta prior: an account with no history counts as 19 launches in 20, so one failure does not sink it.
_PRIOR_OK, _PRIOR_ALL = 19, 20


def account_reliability(*, now: dt.datetime | None = None) -> dict[int, float]:
    """Per provider account, the share of launches that succeeded, smoothed by a prior, times the availability
    the broker measured over its orders in the last 30 days (issue 38; an account with nothing measured keeps
    its launch share: no evidence is not bad evidence)."""
    rows = (
        Attempt.objects.exclude(outcome=AttemptOutcome.PENDING)
        .exclude(error_class__in=_NOT_RELIABILITY)
        .values("offer__account_id")
        .annotate(total=Count("id"), ok=Count("id", filter=Q(outcome=AttemptOutcome.LAUNCHED)))
    )
    launches = {r["offer__account_id"]: (r["ok"] + _PRIOR_OK) / (r["total"] + _PRIOR_ALL) for r in rows}
    measured = accounts_availability(now=now or timezone.now(), account_ids=launches)
    return {
        account: share * (float(measured[account].availability_pct) / 100 if account in measured else 1.0)
        for account, share in launches.items()
    }


def machine_reliability(*, now: dt.datetime) -> dict[tuple[int, str], float]:
    """Per independent machine (account, machine name = the offer's zone): its launches' success share,
    smoothed like an account's, times its uptime over the last day (heartbeats received over heartbeats
    due since it registered, at most one). A machine with no finished launch is unknown, not perfect nor
    worthless: the ranking gives it the prior (19 in 20, as for a cloud account with no history) times its
    measured uptime. Pages show ``machine_reliability_shown`` instead."""
    return {key: score for key, (score, _) in _machine_records(now=now).items()}


def machine_reliability_shown(*, now: dt.datetime) -> dict[tuple[int, str], float | None]:
    """``machine_reliability`` as pages show it: None for a machine with no finished launch yet, which pages
    show as "new, no launches yet"; its score would be the prior, a figure it has not earned."""
    return {key: score if launches else None for key, (score, launches) in _machine_records(now=now).items()}


def _machine_records(*, now: dt.datetime) -> dict[tuple[int, str], tuple[float, int]]:
    """Per machine: (score as ``machine_reliability`` computes it, launches that finished)."""
    day_ago = now - dt.timedelta(days=1)
    beats = dict(MachineHeartbeat.objects.filter(at__gte=day_ago).values_list("machine_id").annotate(n=Count("id")))
    launches = {
        (r["offer__account_id"], r["offer__zone"]): (r["ok"], r["total"])
        for r in Attempt.objects.filter(offer__account__kind=ProviderKind.COMMUNITY)
        .exclude(outcome=AttemptOutcome.PENDING)
        .exclude(error_class__in=_NOT_RELIABILITY)
        .values("offer__account_id", "offer__zone")
        .annotate(total=Count("id"), ok=Count("id", filter=Q(outcome=AttemptOutcome.LAUNCHED)))
    }
    measured = machines_availability(now=now)
    scores = {}
    for machine in Machine.objects.exclude(registered_at=None).only("id", "account_id", "name", "registered_at"):
        assert machine.registered_at is not None
        listened_s = (now - max(machine.registered_at, day_ago)).total_seconds()
        due = max(listened_s / HEARTBEAT_S, 1.0)
        uptime = min(beats.get(machine.pk, 0) / due, 1.0)
        ok, total = launches.get((machine.account_id, machine.name), (0, 0))
        # What its orders saw over 30 days (issue 38): outages the day's heartbeats alone would not show.
        seen = measured.get((machine.account_id, machine.name))
        available = float(seen.availability_pct) / 100 if seen is not None else 1.0
        score = uptime * available * (ok + _PRIOR_OK) / (total + _PRIOR_ALL)
        scores[(machine.account_id, machine.name)] = (score, total)
    return scores


def machine_free_gpus(offers: Iterable[Offer]) -> dict[tuple[int, str], int]:
    """Per independent machine (account, machine name = the offer's zone) among ``offers``: the GPUs a new
    lease can still take, from its finite offers alone (no query).

    The reservations keep each lease size's capacity minus reserved at the leases that fit in the machine's
    free GPUs (marketplace/orders/reservations.py), so that times the size is the free GPUs rounded down to
    a multiple of the size; the largest over the sizes is what any mix of leases can take together (every
    lease but the whole machine is a multiple of the smallest). Offers of machines not among ``offers``
    (stale, withdrawn) are not counted, which can only make the figure smaller, never larger. A slice of a
    GPU (a MIG profile under a whole card) is neither counted nor pooled: it keeps its own count of the
    slices that fit, which whole GPUs do not measure."""
    free: dict[tuple[int, str], int] = {}
    for offer in offers:
        if offer.capacity is None or not _pooled(offer):
            continue
        key = (offer.account_id, offer.zone)
        left = max(offer.capacity - offer.reserved, 0) * offer.gpu_count
        free[key] = max(free.get(key, 0), left)
    return free


def _pooled(offer: Offer) -> bool:
    """A finite offer of whole GPUs: one that can share its machine's pool."""
    return offer.capacity is not None and float((offer.extra or {}).get(GPU_FRACTION, 1.0)) >= 1.0


def machine_pool(account_id: int, machine: str) -> str:
    """The capacity pool an independent machine's (or a cluster node's) offers share in the engine
    (``OfferView.capacity_pool``)."""
    return f"machine:{account_id}:{machine}"


# How far back the broker's own interruptions of spot machines are counted.
INTERRUPTION_WINDOW = dt.timedelta(days=30)
# Gamma prior on a spot offer's interruption rate: the configured rate, weighted as this many running hours.
_PRIOR_SPOT_HOURS = 20.0


def spot_interruption_rates(*, now: dt.datetime) -> dict[int, float]:
    """Per spot offer the broker ran machines on within ``INTERRUPTION_WINDOW``: interruptions per running
    hour, as the posterior mean of a gamma-Poisson model whose prior is ``SPOT_INTERRUPTIONS_PER_HOUR``
    weighted as ``_PRIOR_SPOT_HOURS`` hours: (prior x k + interruptions) / (k + hours run). A few hours of
    record barely move it; many hours make it the offer's own. Offers with no machine in the window are
    absent (callers use the prior). One query.

    An interruption is a machine that ran (ready or running) and was taken from its order, which the
    settle path (``marketplace.orders.provisioning.instance_lost``: cloud spot preemption, outbid, host
    lost) records as the instance ending while its order moves on to another attempt or fails; a buyer's
    own stop ends the order instead. Hours run count from ready (else running) to the end, or ``now``,
    clipped to the window."""
    since = now - INTERRUPTION_WINDOW
    start = Greatest(Coalesce("ready_at", "running_at"), Value(since))
    end = Least(Coalesce("terminated_at", Value(now)), Value(now))
    later = Attempt.objects.filter(order_id=OuterRef("order_id"), number__gt=OuterRef("attempt__number"))
    taken = Q(active=False, terminated_at__gte=since) & (Q(moved_on=True) | Q(order__state=OrderState.FAILED))
    rows = (
        Instance.objects.filter(attempt__offer__pricing_model=PricingModel.SPOT)
        .filter(Q(ready_at__isnull=False) | Q(running_at__isnull=False))
        .filter(Q(terminated_at__isnull=True) | Q(terminated_at__gte=since))
        .annotate(moved_on=Exists(later), ran=ExpressionWrapper(end - start, output_field=DurationField()))
        .filter(ran__gt=dt.timedelta(0))
        .values("attempt__offer_id")
        .annotate(hours=Sum("ran"), lost=Count("id", filter=taken))
    )
    prior = settings.SPOT_INTERRUPTIONS_PER_HOUR
    return {
        r["attempt__offer_id"]: (prior * _PRIOR_SPOT_HOURS + r["lost"])
        / (_PRIOR_SPOT_HOURS + r["hours"].total_seconds() / 3600)
        for r in rows
    }


def offer_views(*, now: dt.datetime) -> list[OfferView]:
    """Every offer on sale now as the engine sees it: spec, jurisdiction, reliability, spot risk. An
    independent machine's reliability is its own (``machine_reliability``), a cloud account's its launches'.
    An independent machine's finite offers of whole GPUs (one per lease size and pricing model) share one
    capacity pool, its free GPUs (``machine_free_gpus``), and so do a Kubernetes node's, so a batch never plans
    more GPUs on one than it has free."""
    since = now - dt.timedelta(seconds=settings.OFFER_MAX_AGE_S)
    reliability = account_reliability(now=now)
    machines = machine_reliability(now=now)
    spot_rate = settings.SPOT_INTERRUPTIONS_PER_HOUR
    learned = spot_interruption_rates(now=now)  # the prior where the broker has no record
    specs: dict[int, GpuSpec] = {}
    views = []
    offers = list(
        Offer.objects.filter(status=OfferStatus.AVAILABLE, account__enabled=True, last_seen_at__gte=since)
        .select_related("gpu_model", "account")
        .order_by("id")
    )
    # GPU holds, and so pools, exist only where a finite offer's zone names a Machine of its account, or a
    # Kubernetes cluster's node (reservations.py's test); one query each for all of them.
    zones = {(o.account_id, o.zone) for o in offers if _pooled(o)}
    listed: set[tuple[int, str]] = set()
    if zones:
        accounts = {account for account, _ in zones}
        machine_rows = Machine.objects.filter(account_id__in=accounts)
        node_rows = ClusterNode.objects.filter(account_id__in=accounts)
        listed = zones & (
            set(machine_rows.values_list("account_id", "name")) | set(node_rows.values_list("account_id", "name"))
        )
    free = machine_free_gpus(o for o in offers if (o.account_id, o.zone) in listed)
    # What each provider kind can do is its adapter's to say; asked once per kind on sale, not per offer.
    packs = {
        kind: kind in ADAPTERS and adapter_class(kind).placement_groups for kind in {o.account.kind for o in offers}
    }
    for offer in offers:
        spec = specs.get(offer.gpu_model_id)
        if spec is None:
            spec = specs[offer.gpu_model_id] = gpu_spec(offer.gpu_model)
        views.append(
            offer_view(
                offer,
                spec=spec,
                jurisdiction=jurisdiction_of(offer.account.kind, offer.region),
                rdma=bool((offer.extra or {}).get("rdma")) or offer.interconnect in ("efa", "infiniband", "rdma"),
                placement_groups=packs[offer.account.kind],
                reliability=machines[(offer.account_id, offer.zone)]
                if (offer.account_id, offer.zone) in machines
                else reliability.get(offer.account_id, _PRIOR_OK / _PRIOR_ALL),
                interruption_rate_per_hour=learned.get(offer.pk, spot_rate) if offer.pricing_model == "spot" else 0.0,
                **_pool_fields(offer, free),
            )
        )
    return views


def _pool_fields(offer: Offer, free: dict[tuple[int, str], int]) -> dict[str, Any]:
    key = (offer.account_id, offer.zone)
    if not _pooled(offer) or key not in free:
        return {}
    return {"capacity_pool": machine_pool(*key), "pool_capacity": free[key]}


_book_lock = threading.Lock()
_book_cache: dict[str, tuple[tuple[object, ...], OfferBook]] = {}


def offer_book(*, now: dt.datetime) -> OfferBook:
    """The columnar book of offers on sale, rebuilt only when a sync or a provisioning outcome changed it.

    Building it costs a query and a pass over every offer; ranking against a built book is vectorised,
    so quotes stay fast however many offers there are.
    """
    stamp = Offer.objects.filter(status=OfferStatus.AVAILABLE).aggregate(
        n=Count("id"), seen=Max("last_seen_at"), top=Max("id")
    )
    # The max-age window moves with the clock: a rebuild each minute at most drops offers that went stale.
    key = (stamp["n"], stamp["seen"], stamp["top"], Attempt.objects.count(), int(now.timestamp()) // 60)
    with _book_lock:
        cached = _book_cache.get("book")
        if cached is not None and cached[0] == key:
            return cached[1]
    book = OfferBook.from_views(offer_views(now=now))
    with _book_lock:
        _book_cache["book"] = (key, book)
    return book
