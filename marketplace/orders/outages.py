"""Outages as the broker sees them (issue 38): the two moves every source of an outage makes, opening one for a
cause and closing it. Low in the order's life on purpose: the silence machine (``silence.py``) opens and closes
its outage in the transaction of its own health move, and the reactions table, the SSH probe and the SLA
package above call the same two functions, so there is one way to record an outage.

At most one outage per (order, cause) is open, a database constraint; opening one that is already open keeps
the first (its start is the earlier sighting), so two reporters of the same outage never count it twice."""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction

from marketplace.models import Instance, Outage

DETAIL_MAX = 500


def outage_open(
    *, order_id: int, cause: str, at: dt.datetime, instance: Instance | None = None, detail: str = ""
) -> Outage:
    """Open an outage of ``cause`` for the order from ``at``; the open one when there already is one (idempotent).
    Safe inside the caller's transaction: a concurrent opener's row wins and is returned."""
    existing = Outage.objects.filter(order_id=order_id, cause=cause, ended_at__isnull=True).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return Outage.objects.create(
                order_id=order_id, instance=instance, cause=cause, started_at=at, detail=detail[:DETAIL_MAX]
            )
    except IntegrityError:  # opened meanwhile by another reporter of the same cause
        return Outage.objects.get(order_id=order_id, cause=cause, ended_at__isnull=True)


def outage_close(*, order_id: int, at: dt.datetime, cause: str | None = None) -> int:
    """Close the order's open outage of ``cause`` (every open one when None) at ``at`` (never before its start).
    Returns how many were closed; 0 when none was open (idempotent)."""
    open_ = Outage.objects.select_for_update().filter(order_id=order_id, ended_at__isnull=True)
    if cause is not None:
        open_ = open_.filter(cause=cause)
    closed = 0
    with transaction.atomic():
        for outage in open_.order_by("pk"):
            outage.ended_at = max(at, outage.started_at)
            outage.save(update_fields=["ended_at"])
            closed += 1
    return closed
