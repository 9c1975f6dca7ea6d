"""Celery tasks of the API."""

from __future__ import annotations

from celery import shared_task

from marketplace.api.idempotency import idempotent_responses_expire
from marketplace.jobs import one_at_a_time
from marketplace.taskkit import TASK_OPTIONS


@shared_task(name="marketplace.idempotency_expire", **TASK_OPTIONS)
@one_at_a_time("idempotency-expire")
def idempotency_expire_task() -> int:
    return idempotent_responses_expire()
