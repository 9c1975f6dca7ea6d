"""Reads for independent providers' dashboards: machines with their state, and utilization over time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
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
    return machines_utilization(machines=[machine], since=since, hourly=hourly).get(machine.pk, [])


def machines_utilization(
    *, machines: Iterable[Machine], since: dt.datetime, hourly: bool = False
) -> dict[int, list[tuple[dt.datetime, Decimal]]]:
    """``machine_utilization`` for several machines in one query: machine id to its series (absent when the
    machine sent no heartbeat since ``since``)."""
    bucket = TruncHour("at") if hourly else TruncMinute("at")
    rows = (
        MachineHeartbeat.objects.filter(machine__in=[m.pk for m in machines], at__gte=since)
        .annotate(bucket=bucket)
        .values("machine_id", "bucket")
        .annotate(mean=Avg("utilization_pct"))
        .order_by("machine_id", "bucket")
    )
    series: dict[int, list[tuple[dt.datetime, Decimal]]] = {}
    for row in rows:
        series.setdefault(row["machine_id"], []).append((row["bucket"], Decimal(row["mean"]).quantize(Decimal("0.1"))))
    return series
