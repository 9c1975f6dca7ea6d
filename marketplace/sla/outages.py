"""Outages from the order's own moves (issue 38): the provider took the machine away while the order should run
(preempted, lost, stopped or gone at the provider, replaced after silence: every such path leaves running for
provisioning through ``losses.instance_lost``), until the order runs again or ends. Called from the reactions
table in the transition's transaction; the agent's silence records its own (``orders/silence.py``) and the SSH
probe its own (``sla/probe.py``)."""

from __future__ import annotations

import datetime as dt

from marketplace.models import Instance, Order, OrderState, OutageCause, SshWatch
from marketplace.orders.outages import outage_close, outage_open


def outages_on_leaving_running(*, order: Order, to: str, now: dt.datetime) -> None:
    """The order leaves running for ``to``. The SSH probe's count starts again on the next machine (a stop or
    an end is no outage, and a lost machine is the provider's outage, not SSH's). Leaving for provisioning
    means the machine was lost: a ``provider_state`` outage opens from the moment it was taken."""
    outage_close(order_id=order.pk, cause=OutageCause.SSH_UNREACHABLE, at=now)
    SshWatch.objects.filter(order_id=order.pk).delete()
    if to != OrderState.PROVISIONING:
        return
    lost = (
        Instance.objects.filter(order_id=order.pk, active=False, terminated_at__isnull=False)
        .order_by("-terminated_at", "-pk")
        .first()
    )
    since = min(lost.terminated_at, now) if lost is not None and lost.terminated_at is not None else now
    # The row holds the transition's reason already; the caller's instance still has the one it moved from.
    reason = Order.objects.filter(pk=order.pk).values_list("state_reason", flat=True).first() or ""
    outage_open(order_id=order.pk, cause=OutageCause.PROVIDER_STATE, at=since, instance=lost, detail=reason)


def outages_on_running(*, order_id: int, now: dt.datetime) -> None:
    """The order runs (again): a ``provider_state`` outage ends here."""
    outage_close(order_id=order_id, cause=OutageCause.PROVIDER_STATE, at=now)


def outages_on_end(*, order_id: int, now: dt.datetime) -> None:
    """The order ended: whatever is still open ends with it."""
    outage_close(order_id=order_id, at=now)
