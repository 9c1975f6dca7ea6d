"""Claims on a lease under real concurrency (PostgreSQL): a boot token spent by two copies of the agent at once
gives one key, and a ready report racing the poll moves the order to running once, with one ledger entry."""

from __future__ import annotations

import pytest

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.launch.leases import LeaseRefused, boot_token, lease_boot_failed, lease_claim
from marketplace.models import Lease, LeaseState, Order, OrderState
from marketplace.orders.readiness import order_running_if_ready
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, ClientTransport, held_agent
from tests.races import race, race_same, require_postgresql


@pytest.mark.django_db(transaction=True)
def test_a_boot_token_claimed_by_two_agents_at_once_gives_one_key(acme, alice, aws_account, aws_sandbox):
    require_postgresql()
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    lease = Lease.objects.get(order=order)
    token = boot_token(lease.attempt.client_token)

    claimed, errors = race_same(6, lambda: lease_claim(token=token)[0].key_id)

    assert len(claimed) == 1, (claimed, errors)
    assert all(isinstance(e, LeaseRefused) and e.code == "spent" for e in errors) and len(errors) == 5
    assert Lease.objects.get(pk=lease.pk).key_id == claimed[0]


@pytest.mark.django_db(transaction=True)
def test_a_ready_report_racing_the_poll_runs_the_order_once(acme, alice, aws_account, aws_sandbox, client):
    require_postgresql()
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    agent = held_agent(order, aws_sandbox)
    agent.transport = ClientTransport(client)
    agent.claim()
    agent._post("/agent/v1/lease/secrets", {})
    # Ready is recorded, and four pollers look at once (a redelivered task, the sweep, the deadline check...).
    Lease.objects.filter(order=order).update(state=LeaseState.READY)

    ran, errors = race_same(4, lambda: order_running_if_ready(order_id=order.pk))

    assert errors == [] and sorted(ran) == [True, True, True, True]
    assert Order.objects.get(pk=order.pk).state == OrderState.RUNNING
    assert LedgerEntry.objects.filter(subject=f"order:{order.public_id}", kind="order.running").count() == 1
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_a_boot_failure_report_racing_a_claim_spends_the_token_once(acme, alice, aws_account, aws_sandbox):
    require_postgresql()
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    lease = Lease.objects.get(order=order)
    token = boot_token(lease.attempt.client_token)

    done, errors = race([
        lambda: lease_claim(token=token)[0].state,
        lambda: lease_boot_failed(token=token, reason="no_python", version="").state,
    ] * 3)  # fmt: skip

    assert len(done) == 1, (done, errors)
    assert all(isinstance(e, LeaseRefused) and e.code == "spent" for e in errors) and len(errors) == 5
    assert Lease.objects.get(pk=lease.pk).state == done[0]
