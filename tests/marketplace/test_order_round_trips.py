"""The statements an order makes from placement to the provider's running (issue 39): each one is a round trip
on the path bench/provisioning.py and bench/boot.py time, so one more (a related row loaded lazily, a check
that could ride on a read made anyway) fails here rather than only showing as a slower benchmark."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace.models import OrderState
from marketplace.orders.launching import Step, order_provision
from marketplace.orders.readiness import order_poll
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH

pytestmark = pytest.mark.django_db


def _statements(captured: CaptureQueriesContext) -> list[str]:
    """The statements, without the savepoints the test's own transaction turns each atomic block into."""
    return [q["sql"].split(" ", 3)[:3] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def _tables(captured: CaptureQueriesContext) -> list[str]:
    names = []
    for verb, second, third in _statements(captured):
        table = third if verb in ("INSERT", "UPDATE") and second == "INTO" else second if verb == "UPDATE" else ""
        names.append(f"{verb} {table.strip(chr(34))}".strip())
    return names


def test_an_order_reaches_the_providers_running_in_twenty_statements(acme, alice, aws_account, aws_sandbox):
    offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("price_usd")[0]

    with CaptureQueriesContext(connection) as place:
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    with CaptureQueriesContext(connection) as provision:
        assert order_provision(order_id=order.pk) == Step.POLL
    with CaptureQueriesContext(connection) as poll:
        assert order_poll(order_id=order.pk) == Step.WAIT

    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING and order.instance.running_at is not None
    # The offer, the buyer's organisation (locked, with whether it has webhooks), its keys; then the launch
    # configuration, the order and its ledger entry.
    assert _tables(place) == [
        "SELECT",
        "SELECT",
        "SELECT",
        "INSERT marketplace_launchconfiguration",
        "INSERT marketplace_order",
        "INSERT ledger_ledgerentry",
    ]
    # The order with its pick (one read), the shared blocks; the move to provisioning with the first attempt and
    # its lease, each ledgered; then the launch recorded: attempt, instance, order, lease and its entry.
    assert _tables(provision) == [
        "SELECT",
        "SELECT",
        "UPDATE marketplace_order",
        "INSERT ledger_ledgerentry",
        "INSERT marketplace_attempt",
        "INSERT ledger_ledgerentry",
        "INSERT marketplace_lease",
        "UPDATE marketplace_attempt",
        "INSERT marketplace_instance",
        "UPDATE marketplace_order",
        "UPDATE marketplace_lease",
        "INSERT ledger_ledgerentry",
    ]
    # The instance with its order, account and lease (one read), and its running written.
    assert _tables(poll) == ["SELECT", "UPDATE marketplace_instance"]
