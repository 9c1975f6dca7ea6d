"""Celery tasks of SLAs: the SSH probe's periodic fan-out and per-order probe, and the month's close and
per-order judgment (``marketplace.sla.probe``, ``marketplace.sla.credits``)."""

from __future__ import annotations

import datetime as dt
import logging

from celery import shared_task

from marketplace.jobs import one_at_a_time
from marketplace.sla.credits import sla_credit_settle_month, sla_month_close
from marketplace.sla.probe import order_ssh_probe, orders_to_probe
from marketplace.taskkit import TASK_OPTIONS, stops_at_soft_limit, sweep_time_check

log = logging.getLogger(__name__)


@shared_task(name="marketplace.sla_ssh_probe_all", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("sla-ssh-probe")
def sla_ssh_probe_all_task() -> int:
    """Queue one SSH probe per running order with a ready machine (every ``BROKER_SLA_SSH_PROBE_INTERVAL_S``)."""
    count = 0
    for order_id in orders_to_probe():
        sweep_time_check()
        try:
            sla_ssh_probe_task.delay(order_id)
        except Exception:  # one order's probe failing where tasks run in process must not skip the others
            log.exception("SSH probe of order %s could not run", order_id)
        count += 1
    return count


@shared_task(name="marketplace.sla_ssh_probe", **TASK_OPTIONS)
def sla_ssh_probe_task(order_id: int) -> bool | None:
    """Probe one order's SSH server and record the outcome (``probe.order_ssh_probe``); safe to run twice."""
    return order_ssh_probe(order_id=order_id)


@shared_task(name="marketplace.sla_month_close", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("sla-month-close")
def sla_month_close_task() -> dict[str, int]:
    """Queue last month's SLA judgment for every order that ran in it (on the 1st, ``CELERY_BEAT_SCHEDULE``)."""
    closed = sla_month_close(before_each=sweep_time_check)
    return {"queued": len(closed.queued), "failed": len(closed.failed)}


@shared_task(name="marketplace.sla_credit_settle", **TASK_OPTIONS)
def sla_credit_settle_task(order_id: int, period_start: str) -> None:
    """Judge one order's month and pay its credit (``credits.sla_credit_settle``); once per order and month."""
    sla_credit_settle_month(order_id=order_id, period_start=dt.datetime.fromisoformat(period_start))
