"""Celery tasks of fleets: the periodic sweep that enqueues one evaluation per active fleet, and that
evaluation, a thin wrapper around ``services.fleet_evaluate`` (ids in, safe to run twice, acks late)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from marketplace.fleets.services import fleet_evaluate, fleets_to_evaluate
from marketplace.fleets.telemetry import samples_prune
from marketplace.jobs import one_at_a_time
from marketplace.taskkit import TASK_OPTIONS, enqueue, stops_at_soft_limit, sweep_time_check

log = logging.getLogger(__name__)

# The app's limits (CELERY_TASK_SOFT_TIME_LIMIT) fit one evaluation: a Prometheus read per running replica, each
# within FLEET_SCRAPE_DEADLINE_S, then rankings and placements under the fleet's lock.


@shared_task(name="marketplace.fleet_evaluate", **TASK_OPTIONS)
def fleet_evaluate_task(fleet_id: int) -> str:
    """Make one fleet follow its rule now; what it decided (``hold``, ``scale_out``...), or ``ended``."""
    evaluation = fleet_evaluate(fleet_id=fleet_id, now=timezone.now())
    return "ended" if evaluation is None else evaluation.decision.action.value


@shared_task(name="marketplace.fleets_evaluate", **TASK_OPTIONS)
@stops_at_soft_limit
@one_at_a_time("fleets-evaluate")
def fleets_evaluate_task() -> dict[str, int]:
    """Every 30 s (``CELERY_BEAT_SCHEDULE``): one evaluation task per active fleet, and metric samples older
    than a day deleted. One fleet whose task cannot be queued never keeps the others from theirs."""
    queued = 0
    for fleet_id in fleets_to_evaluate():
        sweep_time_check()
        try:
            enqueue("marketplace.fleet_evaluate", fleet_id)
        except Exception:  # where tasks run eagerly a fleet's own failure surfaces here: the others still run
            log.exception("evaluating fleet %s failed", fleet_id)
            continue
        queued += 1
    return {"queued": queued, "pruned": samples_prune(now=timezone.now())}
