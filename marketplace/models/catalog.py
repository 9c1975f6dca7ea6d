"""The catalogue: GPU specifications, offers, their price history and what ingestion refused."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

from django.db import models
from django.utils import timezone

from providers.models import ProviderAccount
from providers.types import GPU_FRACTION, PricingModel

PRICING_CHOICES = [(p.value, p.value.replace("_", "-")) for p in PricingModel]
FOR_SALE = models.Q(status="available")
SEARCHED = ["gpu_memory_gb", "gpu_count", "gpu_model"]


def unit_prices(price_usd: Decimal, gpu_count: float, fp16_dense_tflops: float) -> dict[str, float]:
    """An offer's sort keys: USD per GPU-hour and per dense-FP16 TFLOP-hour (a model without a figure counts
    as 1 TFLOP per GPU, which sorts it last rather than first). ``gpu_count`` is in whole cards: slices of a
    partitioned GPU count as their share."""
    per_gpu = float(price_usd) / gpu_count
    return {"price_per_gpu_usd": per_gpu, "usd_per_tflop_hour": per_gpu / (fp16_dense_tflops or 1.0)}


class GpuModel(models.Model):
    """One GPU variant's datasheet figures. All compute figures are dense (no 2:4 sparsity), per GPU.

    The ranking reads throughput from here, never from a provider's name. ``verified`` is False where the
    source table marks a figure as derived or disputed.
    """

    key = models.CharField(max_length=32, unique=True)
    vendor = models.CharField(max_length=16)
    name = models.CharField(max_length=64)
    memory_gb = models.PositiveIntegerField()
    memory_bandwidth_gbs = models.PositiveIntegerField()
    fp16_dense_tflops = models.DecimalField(max_digits=8, decimal_places=1)
    bf16_supported = models.BooleanField(default=True)
    fp8_dense_tflops = models.DecimalField(max_digits=8, decimal_places=1, null=True, blank=True)
    fp32_tflops = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    fp64_tflops = models.DecimalField(max_digits=8, decimal_places=2)
    int8_dense_tops = models.DecimalField(max_digits=8, decimal_places=1, null=True, blank=True)
    interconnect = models.CharField(max_length=32)
    interconnect_gbs = models.PositiveIntegerField()
    video_encoders = models.PositiveSmallIntegerField(default=0)
    ecc = models.BooleanField(default=True)
    tdp_w = models.PositiveIntegerField(null=True, blank=True)
    verified = models.BooleanField(default=True)
    notes = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class OfferStatus(models.TextChoices):
    AVAILABLE = "available", "available"
    UNAVAILABLE = "unavailable", "no longer listed"
    STALE = "stale", "stale (last sync failed)"


class Offer(models.Model):
    """One purchasable thing: account + region + zone + instance type + pricing model.

    Upserted in bulk by that natural key on every sync. ``price`` is per hour for the whole instance in
    ``currency``; ``price_usd`` is the same converted with ``fx_rate`` (1 when the currency is USD).
    ``price_since`` is when the price took effect; the prices before it are the offer's PricePoints.
    ``capacity`` is None for a cloud's offer (its stock is the cloud's business); a finite listing counts
    its units there, and ``reserved`` counts those held by orders (marketplace/orders/reservations.py).
    """

    # No separate index: the natural-key unique index starts with account and serves every account lookup.
    account = models.ForeignKey(ProviderAccount, on_delete=models.PROTECT, related_name="offers", db_index=False)
    region = models.CharField(max_length=64)
    zone = models.CharField(max_length=64)
    instance_type = models.CharField(max_length=64)
    pricing_model = models.CharField(max_length=16, choices=PRICING_CHOICES)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="offers")
    gpu_count = models.PositiveSmallIntegerField()
    gpu_memory_gb = models.PositiveIntegerField()
    vcpus = models.PositiveIntegerField()
    memory_gib = models.DecimalField(max_digits=10, decimal_places=2)
    price = models.DecimalField(max_digits=14, decimal_places=6)
    currency = models.CharField(max_length=3)
    fx_rate = models.DecimalField(max_digits=14, decimal_places=8, default=Decimal(1))
    price_usd = models.DecimalField(max_digits=14, decimal_places=6)
    price_since = models.DateTimeField(default=timezone.now)
    # Derived from price_usd, gpu_count and the model's spec (``unit_prices``), stored so that searches sorted
    # by them walk an index instead of computing and sorting every matching row.
    price_per_gpu_usd = models.FloatField()
    usd_per_tflop_hour = models.FloatField()
    capacity = models.PositiveIntegerField(null=True, blank=True)
    reserved = models.PositiveIntegerField(default=0, db_default=0)  # raw-SQL sync inserts leave it out
    interconnect = models.CharField(max_length=32, blank=True, default="")
    status = models.CharField(max_length=16, choices=OfferStatus.choices, default=OfferStatus.AVAILABLE)
    extra = models.JSONField(default=dict, blank=True)
    # What the seller commits to (issue 38): availability in percent, NULL for no SLA (every spot offer); the
    # credit tiers as [[below_pct, credit_pct], ...]; where the figure comes from (marketplace/sla/published.py).
    # Database defaults too: the raw-SQL sync writes them, other inserts may leave them out.
    sla_availability = models.DecimalField(max_digits=6, decimal_places=3, null=True, blank=True)
    sla_credits = models.JSONField(default=list, blank=True, db_default=[])
    sla_source = models.CharField(max_length=255, blank=True, default="", db_default="")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["account", "region", "zone", "instance_type", "pricing_model"], name="offer_natural_key"
            ),
            models.CheckConstraint(
                condition=models.Q(sla_availability__isnull=True)
                | models.Q(sla_availability__gt=0, sla_availability__lte=100),
                name="offer_sla_availability_percent",
            ),
            models.CheckConstraint(condition=models.Q(price__gt=0), name="offer_price_positive"),
            models.CheckConstraint(condition=models.Q(gpu_count__gte=1), name="offer_gpu_count_positive"),
            # The last line of defence against overselling: no update can hold more than the listing has.
            models.CheckConstraint(
                condition=models.Q(capacity__isnull=True) | models.Q(reserved__lte=models.F("capacity")),
                name="offer_reserved_within_capacity",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "gpu_model", "price_usd"], name="offer_search"),
            models.Index(fields=["status", "region"], name="offer_region"),
            # Searches list offers for sale a page at a time in one of these orders (marketplace/catalog/query.py).
            # The columns after the sort key are the filters a buyer most often combines with it and that follow
            # price (memory, GPU count, model): PostgreSQL checks them in the index as it walks, without
            # fetching the rows a filter refuses, of which there can be tens of thousands before the first match.
            models.Index(fields=["price_usd", *SEARCHED, "id"], condition=FOR_SALE, name="offer_sale_price"),
            models.Index(fields=["price_per_gpu_usd", *SEARCHED, "id"], condition=FOR_SALE, name="offer_sale_gpuprice"),
            models.Index(fields=["usd_per_tflop_hour", *SEARCHED, "id"], condition=FOR_SALE, name="offer_sale_tflops"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_type} {self.pricing_model} {self.zone}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Ingestion computes these in bulk; a row saved one at a time (admin, tests) computes its own.
        prices = unit_prices(self.price_usd, float(self.cards), float(self.gpu_model.fp16_dense_tflops))
        self.price_per_gpu_usd, self.usd_per_tflop_hour = prices["price_per_gpu_usd"], prices["usd_per_tflop_hour"]
        super().save(*args, **kwargs)

    @property
    def gpu_fraction(self) -> Fraction:
        """The share of a card each of the offer's GPUs is: 1 for whole cards, 1/8 for a g6f.large's L4 slice."""
        return Fraction(str((self.extra or {}).get(GPU_FRACTION, 1))).limit_denominator(64)

    @property
    def cards(self) -> Fraction:
        """The offer's GPUs in whole cards."""
        return self.gpu_count * self.gpu_fraction

    @property
    def gpu_share(self) -> str:
        """A partition's share of a card as a person reads it ("1/8"), or "" for whole cards."""
        return "" if self.gpu_fraction >= 1 else str(self.gpu_fraction)

    @property
    def price_per_gpu_hour_usd(self) -> Decimal:
        """Per GPU as listed (a partition counts as one); ``price_per_gpu_usd`` is per whole card."""
        return self.price_usd / self.gpu_count


class PricePoint(models.Model):
    """A price an offer had before its current one: in force from ``observed_at`` until the next point's, or
    until the offer's ``price_since`` for the last point.

    The price in force lives on the offer alone, so a sync writes a point only when a price changes and a
    first sync writes none (the offer row already records its first price and since when).
    """

    # Covered by the (offer, observed_at) index below; a second index would only slow every sync's inserts.
    offer = models.ForeignKey(Offer, on_delete=models.CASCADE, related_name="price_points", db_index=False)
    observed_at = models.DateTimeField()
    price = models.DecimalField(max_digits=14, decimal_places=6)
    currency = models.CharField(max_length=3)
    price_usd = models.DecimalField(max_digits=14, decimal_places=6)

    class Meta:
        indexes = [models.Index(fields=["offer", "observed_at"], name="pricepoint_offer_time")]

    def __str__(self) -> str:
        return f"{self.offer_id} {self.price} {self.currency} at {self.observed_at}"


class QuarantinedOffer(models.Model):
    """A row ingestion refused to sell, with the reason, kept for the provider and staff to see."""

    account = models.ForeignKey(ProviderAccount, on_delete=models.CASCADE, related_name="quarantined_offers")
    region = models.CharField(max_length=64)
    zone = models.CharField(max_length=64)
    instance_type = models.CharField(max_length=64)
    pricing_model = models.CharField(max_length=16, choices=PRICING_CHOICES)
    reason = models.CharField(max_length=255)
    raw = models.JSONField(default=dict)
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["account", "region", "zone", "instance_type", "pricing_model"], name="quarantine_natural_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.instance_type} {self.zone}: {self.reason}"


class FxRate(models.Model):
    """USD per unit of a currency, with where the figure came from."""

    currency = models.CharField(max_length=3, unique=True)
    usd_per_unit = models.DecimalField(max_digits=14, decimal_places=8)
    source = models.CharField(max_length=255)
    as_of = models.DateField()

    def __str__(self) -> str:
        return f"1 {self.currency} = {self.usd_per_unit} USD ({self.as_of})"
