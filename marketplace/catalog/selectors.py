"""Reads of the catalogue."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db.models import QuerySet

from marketplace.matching import OfferView
from marketplace.models import Offer, OfferStatus


@dataclass(frozen=True)
class OfferFilters:
    gpu_model: str = ""
    min_gpu_count: int | None = None
    region: str = ""
    pricing_model: str = ""
    max_price_per_hour: Decimal | None = None


def offer_list(*, filters: OfferFilters | None = None, now: dt.datetime | None = None) -> QuerySet[Offer]:
    """Offers a buyer can order now, cheapest per GPU-hour first."""
    qs = Offer.objects.filter(status=OfferStatus.AVAILABLE).select_related("gpu_model", "account")
    if now is not None:
        qs = qs.filter(last_seen_at__gte=now - dt.timedelta(seconds=settings.OFFER_MAX_AGE_S))
    f = filters or OfferFilters()
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
    return qs.order_by("price_usd", "id")


def offer_view(offer: Offer) -> OfferView:
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
        capacity=offer.capacity,
    )


def offer_views_for(*, gpu_model: str, min_gpu_count: int) -> list[OfferView]:
    """Candidate offers for matching: available, enabled accounts, the right GPU model and count."""
    qs = (
        Offer.objects.filter(
            status=OfferStatus.AVAILABLE,
            account__enabled=True,
            gpu_model__key=gpu_model,
            gpu_count__gte=min_gpu_count,
        )
        .select_related("gpu_model", "account")
        .order_by("id")
    )
    return [offer_view(o) for o in qs]
