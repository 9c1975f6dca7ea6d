"""Reads for independent providers' dashboards: machines with their state, and utilization over time."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.db.models import Avg, QuerySet
from django.db.models.functions import TruncHour, TruncMinute

from providers.models import Machine, MachineHeartbeat, Provider


def provider_machines(*, provider: Provider) -> QuerySet[Machine]:
    return Machine.objects.filter(account__provider=provider).select_related("account").order_by("name")


def machine_utilization(
    *, machine: Machine, since: dt.datetime, hourly: bool = False
) -> list[tuple[dt.datetime, Decimal]]:
    """Mean GPU utilization (percent) per minute (or hour) from the machine's heartbeats since ``since``."""
    bucket = TruncHour("at") if hourly else TruncMinute("at")
    rows = (
        MachineHeartbeat.objects.filter(machine=machine, at__gte=since)
        .annotate(bucket=bucket)
        .values("bucket")
        .annotate(mean=Avg("utilization_pct"))
        .order_by("bucket")
    )
    return [(r["bucket"], Decimal(r["mean"]).quantize(Decimal("0.1"))) for r in rows]
