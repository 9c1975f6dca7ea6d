"""What each independent machine's price falls by now (issue 39): the seller's rule (``Machine.price_fall``)
read against the broker's own record of the machine, never the agent's.

- *free GPUs*: its GPUs no hold covers (``GpuHold``; a GPU partly sliced counts as held), as the market counts
  them (``machine_free_gpus``);
- *idle hours*: 0 while a hold or an unfinished instance is on it; else the hours since its last instance ended
  (``Instance.terminated_at``), or since it was listed when none ever ran.

The offer sync prices each machine's offers with them (``marketplace.catalog.services.offers_sync``), so a
price falls, and rises back, when the account's offers are next built: within ``OFFER_SYNC_INTERVAL_S``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.db.models import Count, Max, Q

from marketplace.models import GpuHold, Instance
from providers.community.pricing import MachineMoment
from providers.models import Machine


def machine_moments(*, machines: Iterable[Machine], now: dt.datetime) -> dict[int, MachineMoment]:
    """Per machine id among ``machines``: its rule, free GPUs and idle hours at ``now``. Two queries whatever
    the number of machines."""
    listed = {m.pk: m for m in machines}
    if not listed:
        return {}
    held = dict(
        GpuHold.objects.filter(machine_id__in=listed)
        .values("machine_id")
        .annotate(n=Count("gpu_index", distinct=True))
        .values_list("machine_id", "n")
    )
    accounts = {m.account_id for m in listed.values()}
    names = {m.name for m in listed.values()}
    runs = (
        Instance.objects.filter(account_id__in=accounts, zone__in=names)
        .values("account_id", "zone")
        .annotate(open=Count("pk", filter=Q(terminated_at__isnull=True)), last_end=Max("terminated_at"))
    )
    ran = {(r["account_id"], r["zone"]): (r["open"], r["last_end"]) for r in runs}
    moments = {}
    for pk, machine in listed.items():
        in_use, last_end = ran.get((machine.account_id, machine.name), (0, None))
        free = max(0, machine.gpu_count - held.get(pk, 0))
        if in_use or free < machine.gpu_count:
            idle_hours = 0.0
        else:
            since = max(machine.created_at, last_end) if last_end is not None else machine.created_at
            idle_hours = max(0.0, (now - since).total_seconds() / 3600)
        moments[pk] = MachineMoment(
            list_price=machine.price_per_gpu_hour,
            rule=machine.price_fall,
            free_gpus=free,
            total_gpus=machine.gpu_count,
            idle_hours=idle_hours,
        )
    return moments


def account_falling_moments(*, account_id: int, now: dt.datetime) -> dict[str, MachineMoment]:
    """The account's machines whose rule lowers anything, by name (an offer's zone), with their moments."""
    falling = [m for m in Machine.objects.filter(account_id=account_id) if m.price_fall.lowers_anything]
    moments = machine_moments(machines=falling, now=now)
    return {m.name: moments[m.pk] for m in falling}
