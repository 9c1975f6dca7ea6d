"""Issue 23, point 4: offer sync for thousands of accounts fans out with backpressure (marketplace/catalog/fanout.py).

At most ``OFFER_SYNC_IN_FLIGHT`` syncs are queued or running at once; each that ends hands over the next due
account, so a round still reaches every account; an account is never queued twice, a failed one waits for the
next round, and a claim whose worker died lapses.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from marketplace.catalog.fanout import (
    STALE_S,
    offers_sync_claim,
    offers_sync_in_flight,
    offers_sync_release,
    offers_sync_soon,
)
from marketplace.catalog.services import offers_sync
from marketplace.machines import machine_decide
from marketplace.models import Offer, OfferStatus
from providers.models import Machine, MachineState, ProviderAccount
from providers.services import provider_account_connect
from tests.factories import ProviderAccountFactory
from tests.hosts import start_hosts, stop_hosts
from tests.races import race_same, require_postgresql

pytestmark = pytest.mark.django_db


def test_a_round_queues_no_more_than_the_bound_and_each_end_hands_over_the_next(settings):
    settings.OFFER_SYNC_INTERVAL_S = 300.0
    accounts = [ProviderAccountFactory() for _ in range(12)]
    ProviderAccount.objects.filter(pk=accounts[-1].pk).update(enabled=False)
    now = timezone.now()

    first = offers_sync_claim(now=now, limit=5)
    assert first == [a.pk for a in accounts[:5]]
    assert offers_sync_claim(now=now, limit=5) == []  # the bound is reached: nothing more is queued
    assert offers_sync_in_flight(now=now) == 5

    offers_sync_release(account_id=first[0], now=now)
    assert offers_sync_claim(now=now, limit=5) == [accounts[5].pk]  # one ended, the next due one goes

    for account_id in [*first[1:], accounts[5].pk]:
        offers_sync_release(account_id=account_id, now=now)
    rest = offers_sync_claim(now=now, limit=5)
    assert rest == [a.pk for a in accounts[6:11]]  # the disabled account is never synced
    for account_id in rest:
        offers_sync_release(account_id=account_id, now=now)
    # Every account was handed over once this round, the failed ones too: none is due again until the next.
    assert offers_sync_claim(now=now + dt.timedelta(seconds=60), limit=5) == []
    again = offers_sync_claim(now=now + dt.timedelta(seconds=300), limit=5)
    assert again == [a.pk for a in accounts[:5]]  # the next round starts with the longest waiting


def test_a_claim_whose_worker_died_lapses_and_the_account_is_due_again(settings):
    settings.OFFER_SYNC_INTERVAL_S = 300.0
    account = ProviderAccountFactory()
    now = timezone.now()
    assert offers_sync_claim(now=now, limit=1) == [account.pk]  # its worker is killed: no release ever comes
    assert offers_sync_claim(now=now + dt.timedelta(seconds=STALE_S - 1), limit=1) == []

    later = now + dt.timedelta(seconds=STALE_S + 1)
    assert offers_sync_in_flight(now=later) == 0
    assert offers_sync_claim(now=later, limit=1) == [account.pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_the_bound_nor_share_an_account():
    require_postgresql()
    for _ in range(40):
        ProviderAccountFactory()

    claimed, errors = race_same(6, lambda: offers_sync_claim(limit=10))

    ids = [account_id for batch in claimed for account_id in batch]
    assert errors == []
    assert len(ids) == 10 and len(set(ids)) == 10
    assert offers_sync_in_flight() == 10


def test_the_periodic_round_syncs_every_account_through_the_bound(aws_sandbox, settings):
    """Tasks run in this process (tests/conftest.py): each sync's end queues the next, until all are synced."""
    from marketplace.tasks import offers_sync_all_task
    from tests.conftest import AWS_TEST_CREDENTIALS

    settings.OFFER_SYNC_IN_FLIGHT = 2
    accounts = [
        provider_account_connect(
            provider_name=f"Seller {n}",
            kind="aws",
            name=f"reseller-{n}",
            credentials=AWS_TEST_CREDENTIALS,
            regions=["us-east-1"],
            endpoint_url=aws_sandbox.url,
        )
        for n in range(5)
    ]

    assert offers_sync_all_task.delay().get() == 2  # the round started with two; their ends handed on the rest

    for account in accounts:
        assert Offer.objects.filter(account=account).exists(), account.name
    assert offers_sync_in_flight() == 0
    assert ProviderAccount.objects.filter(sync_claimed_at__isnull=True).count() == 0


def test_a_wanted_account_goes_first_and_one_changed_mid_sync_is_synced_again(settings):
    settings.OFFER_SYNC_INTERVAL_S = 300.0
    waiting, changed = ProviderAccountFactory(), ProviderAccountFactory()
    now = timezone.now()
    assert offers_sync_claim(now=now, limit=1) == [waiting.pk]
    offers_sync_release(account_id=waiting.pk, now=now)
    assert offers_sync_claim(now=now, limit=1) == [changed.pk]  # its sync is running when its machine changes

    offers_sync_soon(account_ids=[changed.pk], now=now + dt.timedelta(seconds=1))
    # Not a second sync beside the running one: it is still in flight.
    assert offers_sync_claim(now=now + dt.timedelta(seconds=2), limit=5) == []
    offers_sync_release(account_id=changed.pk, now=now + dt.timedelta(seconds=3))
    # Once it ends it is due again at once, though a round has just synced it, and before the others due.
    other = ProviderAccountFactory()
    assert offers_sync_claim(now=now + dt.timedelta(seconds=4), limit=1) == [changed.pk]
    offers_sync_release(account_id=changed.pk, now=now + dt.timedelta(seconds=5))
    assert offers_sync_claim(now=now + dt.timedelta(seconds=6), limit=5) == [other.pk]  # and only once


def test_a_machine_verified_is_on_sale_at_once_not_at_the_next_round(django_capture_on_commit_callbacks, admin_user):
    account = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = start_hosts(account, ["fra-h100-1"], lease_threads=False)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert offers_sync(account_id=account.pk).ok
        assert Offer.objects.filter(account=account, status=OfferStatus.AVAILABLE).exists()
        machine = Machine.objects.get(account=account)
        # Listed and self-tested, waiting for staff; the round has just run, so the account is not due.
        Machine.objects.filter(pk=machine.pk).update(state=MachineState.PENDING, self_test_ok=True)
        with django_capture_on_commit_callbacks(execute=True):
            assert offers_sync(account_id=account.pk).ok
        offers_sync_release(account_id=account.pk)
        assert not Offer.objects.filter(account=account, status=OfferStatus.AVAILABLE).exists()

        with django_capture_on_commit_callbacks(execute=True):
            machine_decide(machine=machine, state=MachineState.VERIFIED, by=admin_user, reason="self-test matched")

        assert Offer.objects.filter(account=account, zone="fra-h100-1", status=OfferStatus.AVAILABLE).exists()
        assert offers_sync_in_flight() == 0
    finally:
        stop_hosts(agents)
