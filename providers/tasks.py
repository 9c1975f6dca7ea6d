"""Thin Celery tasks for providers."""

from __future__ import annotations

from celery import shared_task

from providers.community.services import machines_withdraw_silent


@shared_task(name="providers.machines_withdraw_silent")
def machines_withdraw_silent_task() -> int:
    """Take machines whose agents fell silent out of sale; how many."""
    return machines_withdraw_silent()
