"""Celery tasks of the offer catalogue: thin wrappers around its services (ids in, idempotent, acks late)."""

from __future__ import annotations

from celery import shared_task

from marketplace.catalog.fanout import offers_sync_claim, offers_sync_release
from marketplace.catalog.services import offers_sync
from marketplace.jobs import one_at_a_time
from marketplace.taskkit import SYNC_LIMITS, TASK_OPTIONS
from providers.community.services import machines_withdraw_silent


@shared_task(name="marketplace.offers_sync_account", **TASK_OPTIONS, **SYNC_LIMITS)
def offers_sync_account_task(account_id: int) -> bool:
    """Sync one provider account's offers; a failure is recorded on the account, never raised. Then hand the
    next due account to the queue (marketplace/catalog/fanout.py), so a round reaches every account with at
    most ``OFFER_SYNC_IN_FLIGHT`` syncs queued at a time."""
    try:
        return offers_sync(account_id=account_id).ok
    finally:
        offers_sync_release(account_id=account_id)
        for next_id in offers_sync_claim():
            offers_sync_account_task.delay(next_id)


def _hand_over_due() -> int:
    ids = offers_sync_claim()
    for account_id in ids:
        offers_sync_account_task.delay(account_id)
    return len(ids)


@shared_task(name="marketplace.offers_sync_all", **TASK_OPTIONS)
@one_at_a_time("offers-sync-all")
def offers_sync_all_task() -> int:
    """Start a sync round: hand the due accounts to the queue, as many as the in-flight bound allows; each sync
    that ends hands over the next. One task per account, so one slow or failing cloud blocks no other."""
    return _hand_over_due()


@shared_task(name="marketplace.offers_sync_soon", **TASK_OPTIONS)
def offers_sync_soon_task() -> int:
    """Hand the accounts wanted now (``offers_sync_soon``) and any other due ones to the queue, within the
    in-flight bound; an account still in flight is claimed again when its sync ends. Claims are serialised,
    so this may run beside a round."""
    return _hand_over_due()


@shared_task(name="marketplace.machines_withdraw_silent", **TASK_OPTIONS)
@one_at_a_time("machines-withdraw-silent")
def machines_withdraw_silent_task() -> int:
    """Take independent machines whose agents fell silent out of sale (their offers go at the next sync); how
    many. A sweep like the others, so one run at a time: the rule lives with the machines (providers), the job's
    lease with the market."""
    return machines_withdraw_silent()
