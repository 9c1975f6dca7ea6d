"""Reads for independent providers' dashboards: machines with their state, and utilization over time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from decimal import Decimal

from django.db.models import Avg, OuterRef, QuerySet, Subquery
from django.db.models.functions import TruncHour, TruncMinute

from providers.models import Machine, MachineHeartbeat, Provider


def provider_machines(*, provider: Provider) -> QuerySet[Machine]:
    return Machine.objects.filter(account__provider=provider).select_related("account").order_by("name")


def provider_machine_get(*, provider: Provider, machine_id: int) -> Machine | None:
    """The provider's own machine, or None (another seller's machine is as unknown as a missing one)."""
    return provider_machines(provider=provider).filter(pk=machine_id).first()


def machine_utilization(
    *, machine: Machine, since: dt.datetime, hourly: bool = False, plausible_only: bool = False
) -> list[tuple[dt.datetime, Decimal]]:
    """Mean GPU utilization (percent) per minute (or hour) from the machine's heartbeats since ``since``."""
    return machines_utilization(machines=[machine], since=since, hourly=hourly, plausible_only=plausible_only).get(
        machine.pk, []
    )


def machines_utilization(
    *, machines: Iterable[Machine], since: dt.datetime, hourly: bool = False, plausible_only: bool = False
) -> dict[int, list[tuple[dt.datetime, Decimal]]]:
    """``machine_utilization`` for several machines in one query: machine id to its series (absent when the
    machine sent no heartbeat since ``since``). With ``plausible_only``, heartbeats flagged as physically
    implausible (``MachineHeartbeat.unverified_reason``) are left out: a chart shown as fact has only facts."""
    bucket = TruncHour("at") if hourly else TruncMinute("at")
    beats = MachineHeartbeat.objects.filter(machine__in=[m.pk for m in machines], at__gte=since)
    if plausible_only:
        beats = beats.filter(unverified_reason="")
    rows = (
        beats.annotate(bucket=bucket)
        .values("machine_id", "bucket")
        .annotate(mean=Avg("utilization_pct"))
        .order_by("machine_id", "bucket")
    )
    series: dict[int, list[tuple[dt.datetime, Decimal]]] = {}
    for row in rows:
        series.setdefault(row["machine_id"], []).append((row["bucket"], Decimal(row["mean"]).quantize(Decimal("0.1"))))
    return series


def machines_latest_unverified(*, machines: Iterable[Machine], since: dt.datetime) -> dict[int, tuple[str, Decimal]]:
    """Machine id to (why, mean utilization) of its latest heartbeat since ``since``, for machines whose latest
    one is flagged (``MachineHeartbeat.unverified_reason``); machines whose latest is plausible are absent.
    One query however many machines."""
    newest = MachineHeartbeat.objects.filter(machine=OuterRef("pk"), at__gte=since).order_by("-at", "-pk")
    latest = (
        Machine.objects.filter(pk__in=[m.pk for m in machines])
        .annotate(
            reason=Subquery(newest.values("unverified_reason")[:1]),
            utilization=Subquery(newest.values("utilization_pct")[:1]),
        )
        .values_list("pk", "reason", "utilization")
    )
    # A subquery's value comes back as the backend has it (SQLite: a float): one decimal, as the series shows.
    return {
        machine_id: (reason, Decimal(str(utilization)).quantize(Decimal("0.1")))
        for machine_id, reason, utilization in latest
        if reason
    }
