"""GPU telemetry of orders on Kubernetes clusters, read from the seller's DCGM exporter (issue 37, point 6).

The lease agent in the pod reports like on every provider kind; where the seller names NVIDIA's dcgm-exporter
(the account's ``dcgm_url``), the broker also reads, once a minute and once per account, what the exporter saw on
the GPUs each order's pod holds (its ``namespace``/``pod`` labels), and keeps it as a heartbeat of the order's
lease marked ``dcgm``. The order page then charts the exporter's figures: the cluster's own measurement of the
hardware, which the workload in the pod cannot write.
"""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal, InvalidOperation

from marketplace.models import Instance, Lease, LeaseHeartbeat, LeaseState, Order, OrderState
from providers.errors import ProviderError
from providers.kubernetes.adapter import KubernetesAdapter
from providers.kubernetes.dcgm import GpuSample
from providers.models import ProviderAccount, ProviderKind
from providers.services import adapter_for_account

log = logging.getLogger(__name__)

# Bounds on what one exporter sample may say, so a hostile exporter cannot write impossible figures.
_UTIL_MAX = 100
_TEMP_MAX = 150
_POWER_MAX = 2000  # W per GPU: above any board's rating


def dcgm_accounts() -> list[int]:
    """The enabled Kubernetes accounts whose seller named a DCGM exporter."""
    return list(
        ProviderAccount.objects.filter(enabled=True, kind=ProviderKind.KUBERNETES, options__has_key="dcgm_url")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _figure(value: float | None, upper: int) -> Decimal | None:
    if value is None:
        return None
    try:
        figure = Decimal(str(value)).quantize(Decimal("0.1"))
    except InvalidOperation:
        return None
    return figure if 0 <= figure <= upper else None


def _gpu(sample: GpuSample) -> dict[str, object] | None:
    """One sample as a heartbeat's GPU entry; None when its utilization is missing or out of range."""
    util = _figure(sample.utilization_pct, _UTIL_MAX)
    if util is None:
        return None
    temp = _figure(sample.temperature_c, _TEMP_MAX) or Decimal(0)
    power = _figure(sample.power_w, _POWER_MAX) or Decimal(0)
    return {
        "index": sample.gpu,
        "uuid": sample.uuid[:64],
        "name": sample.model_name[:64],
        "utilization_pct": float(util),
        "temperature_c": float(temp),
        "power_w": float(power),
    }


def cluster_gpus_read(*, account_id: int, now: dt.datetime) -> int:
    """Read the account's DCGM exporter once and record a ``dcgm`` heartbeat for each running order on it whose
    pod's GPUs it reported; returns how many were recorded. Raises ``ProviderError`` when the exporter or the
    cluster cannot be read (the caller logs it and goes on with the other accounts)."""
    account = ProviderAccount.objects.get(pk=account_id)
    adapter = adapter_for_account(account)
    if not isinstance(adapter, KubernetesAdapter):
        return 0
    by_order = adapter.gpu_telemetry()
    if not by_order:
        return 0
    public_ids = [pid for pid in (Order.public_id_of(ref) for ref in by_order) if pid is not None]
    running = [
        (instance.attempt_id, instance.order.ref)
        for instance in Instance.objects.filter(
            account_id=account_id, active=True, order__state=OrderState.RUNNING, order__public_id__in=public_ids
        ).select_related("order")
    ]
    leases = {
        lease.attempt_id: lease
        for lease in Lease.objects.filter(state=LeaseState.READY, attempt_id__in=[a for a, _ in running])
    }
    recorded = 0
    for attempt_id, ref in running:
        lease = leases.get(attempt_id)
        gpus = [g for g in (_gpu(s) for s in by_order.get(ref, [])) if g is not None]
        if lease is None or not gpus:
            continue
        LeaseHeartbeat.objects.create(
            lease=lease,
            at=now,
            source="dcgm",
            utilization_pct=(sum(Decimal(str(g["utilization_pct"])) for g in gpus) / len(gpus)).quantize(
                Decimal("0.1")
            ),
            temperature_c=max(Decimal(str(g["temperature_c"])) for g in gpus),
            power_w=sum((Decimal(str(g["power_w"])) for g in gpus), Decimal(0)),
            gpus=gpus,
        )
        recorded += 1
    return recorded


def clusters_gpus_read(*, now: dt.datetime) -> dict[str, int]:
    """Every DCGM account, one at a time: one that cannot be read never stops the others."""
    totals = {"accounts": 0, "recorded": 0, "errors": 0}
    for account_id in dcgm_accounts():
        try:
            totals["recorded"] += cluster_gpus_read(account_id=account_id, now=now)
            totals["accounts"] += 1
        except ProviderError as exc:
            log.warning("reading the DCGM exporter of account %s failed: %s", account_id, exc)
            totals["errors"] += 1
    return totals
