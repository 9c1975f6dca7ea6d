"""Input and output serializers, one pair per operation."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from marketplace.api.launch_schema import LAUNCH_VIEW, LaunchConfigurationField
from marketplace.catalog.regions import JURISDICTIONS
from marketplace.catalog.selectors import gpu_spec
from marketplace.launch.config import launch_view
from marketplace.launch.selectors import order_boot, order_connection
from marketplace.matching import PROFILES, Amount, Demand, Profile, Tolerance
from marketplace.matching.types import MAX_NODES
from marketplace.models import GpuModel, LeaseState, Offer, Order, Quote, SilentPeriod
from marketplace.money import minor_text, minor_units
from marketplace.numbers import (
    MAX_BUDGET,
    MAX_ID,
    MAX_PRICE_PER_HOUR,
    MAX_PRICE_PER_JOB,
    DecimalSerializerField,
    FloatSerializerField,
    IntegerSerializerField,
)
from marketplace.orders.selectors import order_usage
from marketplace.orders.silence import order_silence
from marketplace.sla.selectors import order_sla
from providers import gpu_names


class OfferSlaOutput(serializers.Serializer):
    """What an offer's seller commits to (issue 38): availability in percent, the credit tiers
    ``[[below_pct, credit_pct], ...]`` (measured availability below the first figure earns the second percent of
    the period's compute charge), and where the figure comes from."""

    availability_pct = serializers.CharField()
    credits = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    source = serializers.CharField()


def offer_sla_output(offer: Offer) -> dict[str, Any] | None:
    """The offer's SLA as the API writes it; None for an offer without one (every spot offer)."""
    if offer.sla_availability is None:
        return None
    return {
        "availability_pct": format(offer.sla_availability, "f"),
        "credits": offer.sla_credits,
        "source": offer.sla_source,
    }


class OfferOutput(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu_model.key")
    provider = serializers.CharField(source="account.kind")
    price_per_gpu_hour_usd = serializers.DecimalField(max_digits=14, decimal_places=6)
    sla = serializers.SerializerMethodField()

    @extend_schema_field(OfferSlaOutput(allow_null=True))
    def get_sla(self, offer: Offer) -> dict[str, Any] | None:
        return offer_sla_output(offer)

    class Meta:
        model = Offer
        fields = [
            "id",
            "provider",
            "region",
            "zone",
            "instance_type",
            "pricing_model",
            "gpu_model",
            "gpu_count",
            "gpu_memory_gb",
            "vcpus",
            "memory_gib",
            "price",
            "currency",
            "price_usd",
            "price_per_gpu_hour_usd",
            "capacity",
            "interconnect",
            "status",
            "last_seen_at",
            "sla",
        ]

    def to_representation(self, offer: Offer) -> dict[str, Any]:
        """The fields above, written directly: the offer list is the API's hot path and the generic field walk
        costs more than its query. tests/api/test_offer_output.py holds it equal to the generic output. The
        account's kind and the model's key are read from columns the query annotated, when it did."""
        return {
            "id": offer.pk,
            "provider": getattr(offer, "provider_kind", None) or offer.account.kind,
            "region": offer.region,
            "zone": offer.zone,
            "instance_type": offer.instance_type,
            "pricing_model": offer.pricing_model,
            "gpu_model": getattr(offer, "gpu_model_key", None) or offer.gpu_model.key,
            "gpu_count": offer.gpu_count,
            "gpu_memory_gb": offer.gpu_memory_gb,
            "vcpus": offer.vcpus,
            "memory_gib": _fixed(offer.memory_gib, 2),
            "price": _fixed(offer.price, 6),
            "currency": offer.currency,
            "price_usd": _fixed(offer.price_usd, 6),
            "price_per_gpu_hour_usd": _fixed(offer.price_per_gpu_hour_usd, 6),
            "capacity": offer.capacity,
            "interconnect": offer.interconnect,
            "status": offer.status,
            "last_seen_at": _iso(offer.last_seen_at),
            "sla": offer_sla_output(offer),
        }


_PLACES = {places: Decimal(1).scaleb(-places) for places in (2, 6)}


def _fixed(value: Decimal, places: int) -> str:
    """A decimal as DRF's DecimalField writes it: rounded half-even to the field's places, as a string."""
    return format(Decimal(value).quantize(_PLACES[places], rounding=ROUND_HALF_EVEN), "f")


def _iso(value: dt.datetime) -> str:
    """A datetime as DRF writes it: ISO 8601 in the current time zone, UTC as Z."""
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class OfferListInput(serializers.Serializer):
    # Read from the query string, where DRF takes an empty value for an optional field as no value.
    blank_is_absent = True

    gpu = serializers.CharField(required=False, allow_blank=True, max_length=32)
    count = IntegerSerializerField(required=False, min_value=1, max_value=64)
    region = serializers.CharField(required=False, allow_blank=True, max_length=64)
    pricing = serializers.ChoiceField(required=False, allow_blank=True, choices=["on_demand", "spot", "reserved"])
    max_price = DecimalSerializerField(
        required=False, max_digits=14, decimal_places=6, min_value=Decimal("0"), max_value=MAX_PRICE_PER_HOUR
    )


class OrderPlaceInput(serializers.Serializer):
    """Exactly one of ``offer`` (at its current price) or ``quote`` (at the price the quote locked)."""

    offer = IntegerSerializerField(min_value=1, max_value=MAX_ID, required=False)
    quote = serializers.UUIDField(required=False)
    max_price_per_hour = DecimalSerializerField(
        required=False, max_digits=14, decimal_places=6, min_value=Decimal("0.000001"), max_value=MAX_PRICE_PER_HOUR
    )
    allow_failover = serializers.BooleanField(required=False, default=True)
    bid_per_gpu_hour = DecimalSerializerField(
        required=False,
        max_digits=10,
        decimal_places=4,
        min_value=Decimal("0.0001"),
        max_value=MAX_PRICE_PER_HOUR,
        help_text="an independent machine's interruptible offer only: USD per GPU-hour, at least the machine's "
        "minimum (absent: the minimum); a higher bid or an on-demand order outbids it after a notice",
    )
    regions = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=50
    )
    duration_hours = DecimalSerializerField(
        required=False, max_digits=8, decimal_places=2, min_value=Decimal("0.01"), max_value=Decimal("8760")
    )
    launch = LaunchConfigurationField(
        required=False,
        help_text="what the machine runs and who may reach it (docs/BUYERS.md: Launch configuration); absent: a "
        "quote's configuration, else just the machine with the organisation's SSH keys, SSH open to the caller's "
        "address",
    )
    launch_template = serializers.CharField(
        required=False, max_length=80, help_text="a saved launch template's id or name, instead of launch"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("offer" in attrs) == ("quote" in attrs):
            raise serializers.ValidationError({"offer": ["give exactly one of offer or quote"]})
        return attrs


_PROFILES = [p.value for p in Profile]
_PRICING = ["on_demand", "spot", "reserved"]


class DemandInput(serializers.Serializer):
    """A workload; every field but ``profile`` is optional and unset ones take the profile's defaults."""

    id = serializers.CharField(required=False, allow_blank=True, max_length=64)
    profile = serializers.ChoiceField(choices=_PROFILES)
    gpu_count = IntegerSerializerField(required=False, min_value=1, max_value=64)
    nodes = IntegerSerializerField(
        required=False,
        default=1,
        min_value=1,
        max_value=MAX_NODES,
        help_text="machines the job spans, each with gpu_count GPUs (or total_gpu_memory_gb) of one offer; "
        "quotes price the whole group and are ordered at /api/v1/clusters",
    )
    total_gpu_memory_gb = IntegerSerializerField(required=False, min_value=1, max_value=16384)
    placement_group = serializers.BooleanField(
        required=False,
        default=False,
        help_text="with nodes > 1: the nodes go into one cluster placement group, packed close in the zone's "
        "network (offers whose provider cannot do that are left out)",
    )
    min_gpu_memory_gb = IntegerSerializerField(required=False, min_value=0, max_value=1024)
    gpu_models = serializers.ListField(
        child=serializers.ChoiceField(choices=gpu_names.SORTED), required=False, default=list, max_length=30
    )
    regions = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=50
    )
    jurisdictions = serializers.ListField(
        child=serializers.ChoiceField(choices=list(JURISDICTIONS)), required=False, default=list, max_length=10
    )
    pricing_models = serializers.ListField(
        child=serializers.ChoiceField(choices=_PRICING), required=False, default=list, max_length=3
    )
    max_price_per_hour = DecimalSerializerField(
        required=False, max_digits=14, decimal_places=6, min_value=Decimal("0.000001"), max_value=MAX_PRICE_PER_HOUR
    )
    max_price_per_job = DecimalSerializerField(
        required=False, max_digits=16, decimal_places=6, min_value=Decimal("0.000001"), max_value=MAX_PRICE_PER_JOB
    )
    duration_hours = FloatSerializerField(required=False, default=1.0, min_value=0.01, max_value=8760)
    interruption_tolerance = serializers.ChoiceField(
        choices=[t.value for t in Tolerance], required=False, default=Tolerance.CHECKPOINTED.value
    )
    checkpoint_interval_hours = FloatSerializerField(required=False, default=1.0, min_value=0.0, max_value=8760)
    deadline_hours = FloatSerializerField(
        required=False,
        min_value=0.01,
        max_value=8760,
        help_text="wall-clock hours the job must finish within, interruptions included; offers not expected to "
        "finish by then are left out",
    )
    min_interconnect_gbs = IntegerSerializerField(required=False, min_value=0, max_value=100000)
    needs_rdma = serializers.BooleanField(required=False, allow_null=True, default=None)
    min_fp64_tflops = FloatSerializerField(required=False, min_value=0, max_value=1000)
    needs_ecc = serializers.BooleanField(required=False, allow_null=True, default=None)
    min_video_encoders = IntegerSerializerField(required=False, min_value=0, max_value=64)
    fractions = serializers.BooleanField(
        required=False, default=False, help_text="slices of a card (MIG, vGPU) may serve gpu_count; default whole cards"
    )
    amount = serializers.ChoiceField(
        choices=[a.value for a in Amount],
        required=False,
        allow_null=True,
        default=None,
        help_text=(
            "what is fixed: 'duration' (pay for duration_hours on any card) or 'work' (work_hours on "
            "work_reference_gpu; each offer takes that over its relative speed); default: the profile's"
        ),
    )
    work_hours = FloatSerializerField(
        required=False, min_value=0.01, max_value=1_000_000, help_text="for amount=work: hours on the reference GPU"
    )
    work_reference_gpu = serializers.ChoiceField(
        choices=gpu_names.SORTED,
        required=False,
        help_text=(
            "for amount=work: the GPU work_hours are measured on (restated as hours on the profile's "
            "reference card); default: that card"
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        amount = attrs.get("amount") or PROFILES[Profile(attrs["profile"])].amount
        for name in ("work_hours", "work_reference_gpu"):
            if name in attrs and amount != Amount.WORK:
                raise serializers.ValidationError(
                    {name: [f"applies to amount 'work'; this demand's amount is '{amount}'"]}
                )
        if "work_reference_gpu" in attrs:
            attrs = self._on_profile_reference(attrs)
        if "gpu_count" in attrs and "total_gpu_memory_gb" in attrs:
            raise serializers.ValidationError({"gpu_count": ["give gpu_count or total_gpu_memory_gb, not both"]})
        deadline, duration = attrs.get("deadline_hours"), attrs.get("duration_hours", 1.0)
        # Fixed hours take at least those hours anywhere; fixed work may finish sooner on a faster card.
        if deadline is not None and amount != Amount.WORK and deadline < duration:
            raise serializers.ValidationError(
                {"deadline_hours": [f"must be at least duration_hours ({duration:g}): no offer runs the job faster"]}
            )
        return attrs

    @staticmethod
    def _on_profile_reference(attrs: dict[str, Any]) -> dict[str, Any]:
        # The engine only knows datasheets of cards on sale; the work is restated here, from the GPU table,
        # as hours on the profile's own reference card, so a named card that nobody sells still measures it.
        defaults = PROFILES[Profile(attrs["profile"])]
        name = attrs.pop("work_reference_gpu")
        model = GpuModel.objects.filter(key=name).first()
        figure = None if model is None else getattr(gpu_spec(model), defaults.metric)
        if not figure:
            raise serializers.ValidationError(
                {"work_reference_gpu": [f"no datasheet figure for {name} in {defaults.metric_unit}"]}
            )
        hours = attrs.get("work_hours", attrs.get("duration_hours", 1.0))
        attrs["work_hours"] = hours * float(figure) / defaults.reference_throughput
        return attrs

    def to_demand(self) -> Demand:
        return demand_from(self.validated_data)


def demand_from(data: dict[str, Any]) -> Demand:
    """A validated ``DemandInput`` as the engine's Demand."""
    return Demand(
        demand_id=data.get("id", ""),
        profile=Profile(data["profile"]),
        gpu_count=data.get("gpu_count", 1),
        nodes=data.get("nodes", 1),
        placement_group=data.get("placement_group", False),
        total_gpu_memory_gb=data.get("total_gpu_memory_gb"),
        min_gpu_memory_gb=data.get("min_gpu_memory_gb", 0),
        gpu_models=frozenset(data["gpu_models"]),
        regions=frozenset(data["regions"]),
        jurisdictions=frozenset(data["jurisdictions"]),
        pricing_models=frozenset(data["pricing_models"]),
        max_price_per_hour=data.get("max_price_per_hour"),
        max_price_per_job=data.get("max_price_per_job"),
        duration_hours=data["duration_hours"],
        interruption_tolerance=Tolerance(data["interruption_tolerance"]),
        checkpoint_interval_hours=data["checkpoint_interval_hours"],
        min_interconnect_gbs=data.get("min_interconnect_gbs"),
        needs_rdma=data.get("needs_rdma"),
        min_fp64_tflops=data.get("min_fp64_tflops"),
        needs_ecc=data.get("needs_ecc"),
        min_video_encoders=data.get("min_video_encoders"),
        fractions=data.get("fractions", False),
        deadline_hours=data.get("deadline_hours"),
        amount=None if data.get("amount") is None else Amount(data["amount"]),
        work_hours=data.get("work_hours"),
    )


class LaunchFields(serializers.Serializer):
    """The launch configuration a quote's (or a procurement demand's) order will launch."""

    launch = LaunchConfigurationField(
        required=False, help_text="a launch configuration (docs/BUYERS.md: Launch configuration)"
    )
    launch_template = serializers.CharField(required=False, max_length=80, help_text="a saved template's id or name")


class QuoteCreateInput(DemandInput, LaunchFields):
    limit = IntegerSerializerField(required=False, default=10, min_value=1, max_value=50)


class ProcurementDemandInput(DemandInput, LaunchFields):
    pass


# Each demand is ranked against the whole book before the joint assignment: 2,000 took 10 s of a web worker
# (issue 17); 100 keep a batch well under a second on the demo book (about 0.1 s on 150 offers).
MAX_PROCUREMENT_DEMANDS = 100


MIN_PROCUREMENT_TIME_LIMIT_S = 0.5


def _time_limit_field() -> FloatSerializerField:
    # The solver holds a web worker for its whole time limit: a caller may ask for less than the broker's
    # setting, never more (issue 17). Read per request, so the setting is the one in force.
    cap = settings.PROCUREMENT_TIME_LIMIT_S
    span = f"must be from {MIN_PROCUREMENT_TIME_LIMIT_S:g} to {cap:g} seconds"
    return FloatSerializerField(
        required=False,
        min_value=MIN_PROCUREMENT_TIME_LIMIT_S,
        max_value=cap,
        error_messages={"min_value": span, "max_value": span},
        help_text="seconds the solver may take, at most BROKER_PROCUREMENT_TIME_LIMIT_S (the default)",
    )


class ProcurementInput(serializers.Serializer):
    demands = ProcurementDemandInput(many=True, allow_empty=False, max_length=MAX_PROCUREMENT_DEMANDS)
    time_limit = _time_limit_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["time_limit"] = _time_limit_field()


class QuoteOutput(serializers.Serializer):
    """A stored quote: the dollars and hours of the job first, then the offer and the throughput reasoning."""

    id = serializers.UUIDField(source="public_id")
    rank = serializers.IntegerField()
    job_cost = serializers.SerializerMethodField(help_text="USD for the whole job on this offer, risks included")
    job_hours = serializers.SerializerMethodField(help_text="hours the job runs (and is paid for) on this offer")
    offer = OfferOutput()
    units = serializers.DecimalField(max_digits=10, decimal_places=4)
    price_per_hour = serializers.DecimalField(max_digits=14, decimal_places=6)
    duration_hours = serializers.DecimalField(max_digits=10, decimal_places=2)
    total_price = serializers.DecimalField(max_digits=16, decimal_places=6)
    score = serializers.FloatField()
    breakdown = serializers.JSONField()
    reason = serializers.CharField()
    expires_at = serializers.DateTimeField()
    launch = serializers.SerializerMethodField()

    @extend_schema_field(LAUNCH_VIEW)
    def get_launch(self, quote: Quote) -> dict[str, Any] | None:
        return launch_view(quote.launch_config)

    # Quotes stored before the job figures existed carry the same numbers under their older names.
    def get_job_cost(self, quote: Quote) -> str:
        return str(quote.breakdown.get("job_cost") or quote.breakdown.get("effective_cost") or quote.total_price)

    def get_job_hours(self, quote: Quote) -> float:
        return float(quote.breakdown.get("job_hours") or quote.duration_hours)


class NearMissOutput(serializers.Serializer):
    offer = serializers.IntegerField()
    instance_type = serializers.CharField()
    region = serializers.CharField()
    gpu_model = serializers.CharField()
    price_per_hour = serializers.CharField()
    failed = serializers.ListField(child=serializers.CharField(), help_text="the requirements it missed")
    relax = serializers.CharField(help_text="what to relax for it to qualify")


class QuoteBatchOutput(serializers.Serializer):
    """POST /api/v1/quotes: the ranked quotes of one workload, and when few or none, why."""

    batch = serializers.UUIDField()
    expires_at = serializers.DateTimeField()
    quotes = QuoteOutput(many=True)
    defaults = serializers.DictField(help_text="the requirements the ranking applied, defaults included")
    rejected = serializers.DictField(child=serializers.IntegerField(), help_text="offers left out, by reason")
    near_misses = NearMissOutput(many=True)


class AttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    offer = serializers.IntegerField(source="offer_id")
    zone = serializers.CharField(source="offer.zone")
    instance_type = serializers.CharField(source="offer.instance_type")
    outcome = serializers.CharField()
    error_class = serializers.CharField()
    provider_code = serializers.CharField()
    provider_message = serializers.CharField()


class InstanceOutput(serializers.Serializer):
    provider_instance_id = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()
    instance_type = serializers.CharField()
    state = serializers.CharField()
    public_ip = serializers.CharField()


class UsageOutput(serializers.Serializer):
    seconds = serializers.IntegerField()
    amount_minor = serializers.IntegerField(help_text="the cost so far in cents, rounded once")
    amount_usd = serializers.CharField(help_text="the same figure as decimal text")


class OutageOutput(serializers.Serializer):
    cause = serializers.CharField(help_text="agent_silent, ssh_unreachable or provider_state")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while it lasts")
    detail = serializers.CharField()


class SlaCreditOutput(serializers.Serializer):
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    committed_pct = serializers.CharField()
    measured_pct = serializers.CharField()
    measured_seconds = serializers.IntegerField()
    down_seconds = serializers.IntegerField()
    tier_pct = serializers.CharField()
    amount_minor = serializers.IntegerField(help_text="the credit paid to the buyer's credit, in cents; 0: none owed")


class OrderSlaOutput(serializers.Serializer):
    committed_pct = serializers.CharField(allow_null=True, help_text="null: the offer states no SLA (spot)")
    source = serializers.CharField()
    credits_schedule = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    measured_pct = serializers.CharField(allow_null=True, help_text="this month so far; null before it ran")
    measured_seconds = serializers.IntegerField()
    down_seconds = serializers.IntegerField()
    outages = OutageOutput(many=True)
    credits = SlaCreditOutput(many=True)


def order_sla_output(order: Order, *, now: dt.datetime) -> dict[str, Any]:
    """The order's SLA as the API writes it: committed and measured availability, outages and credits."""
    sla = order_sla(order, now=now)
    return {
        "committed_pct": None if sla.committed_pct is None else format(sla.committed_pct, "f"),
        "source": sla.source,
        "credits_schedule": sla.tiers,
        "measured_pct": None if sla.measured_pct is None else format(sla.measured_pct, "f"),
        "measured_seconds": sla.measured_seconds,
        "down_seconds": sla.down_seconds,
        "outages": OutageOutput(sla.outages, many=True).data,
        "credits": [
            {
                "period_start": c.period_start, "period_end": c.period_end,
                "committed_pct": format(c.committed_pct, "f"), "measured_pct": format(c.measured_pct, "f"),
                "measured_seconds": c.measured_seconds, "down_seconds": c.down_seconds,
                "tier_pct": format(c.tier_pct, "f"), "amount_minor": c.amount_minor,
            }
            for c in sla.credits
        ],
    }  # fmt: skip


class SilentPeriodOutput(serializers.Serializer):
    cause = serializers.CharField(help_text="what fell silent: lease_agent, the agent on the machine")
    instance = serializers.CharField(source="instance.provider_instance_id")
    started_at = serializers.DateTimeField(help_text="the agent's last report before the silence")
    noticed_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while the silence lasts")
    ended_by = serializers.CharField(help_text="recovered, replaced or ended; empty while it lasts")
    seconds = serializers.SerializerMethodField(help_text="how long it lasted, or has lasted so far")

    def get_seconds(self, period: SilentPeriod) -> int:
        return period.seconds(self.context["now"])


class SilenceOutput(serializers.Serializer):
    minutes = serializers.FloatField(help_text="minutes without reports from the order's agents, all periods")
    periods = SilentPeriodOutput(many=True)


class HostKeyOutput(serializers.Serializer):
    type = serializers.CharField()
    fingerprint = serializers.CharField()
    public_key = serializers.CharField()


class PortUrlOutput(serializers.Serializer):
    port = serializers.IntegerField()
    url = serializers.CharField()


class ConnectionOutput(serializers.Serializer):
    """``marketplace.launch.selectors.order_connection``: how to reach a ready machine."""

    ssh = serializers.CharField(help_text="the command that logs in")
    host = serializers.CharField()
    port = serializers.IntegerField()
    user = serializers.CharField()
    host_keys = HostKeyOutput(many=True, help_text="the keys to check on first connection")
    known_hosts = serializers.ListField(child=serializers.CharField(), help_text="the same keys as known_hosts lines")
    urls = PortUrlOutput(many=True, help_text="a URL per exposed port")
    ready_at = serializers.DateTimeField(allow_null=True)


class BootFailureOutput(serializers.Serializer):
    stage = serializers.CharField(allow_blank=True)
    reason = serializers.CharField()


class BootOutput(serializers.Serializer):
    """``marketplace.launch.selectors.order_boot``: where the current machine's boot stands."""

    state = serializers.ChoiceField(choices=LeaseState.choices)
    deadline = serializers.DateTimeField(allow_null=True)
    claimed_at = serializers.DateTimeField(allow_null=True)
    ready_at = serializers.DateTimeField(allow_null=True)
    gpus = serializers.ListField(child=serializers.CharField(), help_text="the GPUs the agent saw")
    workload = serializers.CharField(allow_blank=True, help_text="what the agent started")
    failure = BootFailureOutput(allow_null=True)


class OrderOutput(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id")
    gpu_model = serializers.CharField(source="gpu_model.key")
    quote = serializers.UUIDField(source="quote.public_id", allow_null=True, default=None)
    cluster = serializers.UUIDField(
        source="cluster.public_id", allow_null=True, default=None, help_text="the multi-node job it is a node of"
    )
    attempts = AttemptOutput(many=True)
    instance = serializers.SerializerMethodField()
    ledger_head = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    launch = serializers.SerializerMethodField()
    connection = serializers.SerializerMethodField()
    boot = serializers.SerializerMethodField()
    silence = serializers.SerializerMethodField()
    sla = serializers.SerializerMethodField()

    class Meta:
        model = Order
        fields = [
            "id",
            "state",
            "state_reason",
            "health",
            "silence",
            "sla",
            "offer",
            "quote",
            "cluster",
            "cluster_round",
            "cluster_node",
            "gpu_model",
            "gpu_count",
            "pricing_model",
            "regions",
            "max_price_per_hour",
            "price_per_hour",
            "allow_failover",
            "bid_per_gpu_hour",
            "preempt_at",
            "duration_hours",
            "spend_cap_usd",
            "run_until",
            "usage",
            "launch",
            "connection",
            "boot",
            "attempts",
            "instance",
            "ledger_head",
            "created_at",
            "state_changed_at",
        ]

    @extend_schema_field(InstanceOutput(allow_null=True))
    def get_instance(self, order: Order) -> dict[str, object] | None:
        instance = order.instance
        return None if instance is None else dict(InstanceOutput(instance).data)

    @extend_schema_field(UsageOutput)
    def get_usage(self, order: Order) -> dict[str, object]:
        """The cost so far, rounded once to the cent as the storefront shows it and the book will charge it
        (``marketplace.money``): ``amount_minor`` in cents, ``amount_usd`` the same figure as text."""
        usage = order_usage(order, now=self.context.get("now") or timezone.now())
        cents = minor_units(usage.amount_usd, "USD")
        return {"seconds": usage.seconds, "amount_minor": cents, "amount_usd": minor_text(cents, "USD")}

    @extend_schema_field(LAUNCH_VIEW)
    def get_launch(self, order: Order) -> dict[str, Any] | None:
        return launch_view(order.launch_config)

    @extend_schema_field(SilenceOutput)
    def get_silence(self, order: Order) -> dict[str, Any]:
        now = self.context.get("now") or timezone.now()
        silence = order_silence(order, now=now)
        periods = SilentPeriodOutput(silence.periods, many=True, context={"now": now}).data
        return {"minutes": silence.minutes, "periods": periods}

    @extend_schema_field(OrderSlaOutput)
    def get_sla(self, order: Order) -> dict[str, Any]:
        return order_sla_output(order, now=self.context.get("now") or timezone.now())

    @extend_schema_field(ConnectionOutput(allow_null=True, help_text="null until the machine is ready"))
    def get_connection(self, order: Order) -> dict[str, Any] | None:
        return order_connection(order)

    @extend_schema_field(BootOutput(allow_null=True, help_text="null: no machine with a lease was launched"))
    def get_boot(self, order: Order) -> dict[str, Any] | None:
        return order_boot(order)

    def get_ledger_head(self, order: Order) -> str | None:
        entries = self.context.get("ledger_heads", {})
        return entries.get(order.pk)


class OrderPlacedOutput(OrderOutput):
    """An order as placing it answers: the order, and what the buyer should know (budget warnings)."""

    warnings = serializers.ListField(child=serializers.CharField())

    class Meta(OrderOutput.Meta):
        fields = [*OrderOutput.Meta.fields, "warnings"]


class OrderPageOutput(serializers.Serializer):
    results = OrderOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


class BudgetOutput(serializers.Serializer):
    """USD as decimal text; null: no limit."""

    budget_per_hour = serializers.CharField(allow_null=True)
    budget_monthly = serializers.CharField(allow_null=True)
    live_per_hour = serializers.CharField(allow_null=True, help_text="the hourly rate of the live orders")
    month_to_date = serializers.CharField(allow_null=True, help_text="this month's usage so far")


class InvoiceLineOutput(serializers.Serializer):
    order = serializers.UUIDField()
    description = serializers.CharField()
    seconds = serializers.IntegerField()
    price_per_hour = serializers.CharField()
    amount_minor = serializers.IntegerField(help_text="cents, rounded once as the book charges it")
    amount_usd = serializers.CharField()
    ended_at = serializers.DateTimeField()


class InvoiceOutput(serializers.Serializer):
    month = serializers.CharField()
    currency = serializers.CharField()
    lines = InvoiceLineOutput(many=True)
    total_minor = serializers.IntegerField(help_text="the sum of the lines' cents")
    total_usd = serializers.CharField()


class OfferPageOutput(serializers.Serializer):
    results = OfferOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


# Its "from" field is a Python keyword, so this schema-only serializer is built from a mapping.
OFFER_PRICE_OUTPUT = inline_serializer(
    "OfferPriceOutput",
    fields={
        "from": serializers.DateTimeField(help_text="when the price took effect"),
        "price_usd": serializers.CharField(),
    },
    many=True,
)


class OfferPricesOutput(serializers.Serializer):
    offer = serializers.IntegerField()
    since = serializers.DateTimeField()
    prices = OFFER_PRICE_OUTPUT


class BudgetInput(serializers.Serializer):
    """USD; null clears a limit."""

    budget_per_hour = DecimalSerializerField(
        max_digits=14, decimal_places=2, min_value=Decimal("0.01"), max_value=MAX_BUDGET, allow_null=True
    )
    budget_monthly = DecimalSerializerField(
        max_digits=14, decimal_places=2, min_value=Decimal("0.01"), max_value=MAX_BUDGET, allow_null=True
    )
