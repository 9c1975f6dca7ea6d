"""Money that goes back (issue 35, point 6): a refund to a buyer after the provider was paid claws its share back
from the provider's next payouts (the payable goes below zero, and the Payouts page says so), and a payout that
fails after Stripe reported it paid is reversed in the book and paid out again.

From Stripe's documentation: "a payout can show as paid and then fail" when the bank returns it, and the money
goes back to the account's balance (https://docs.stripe.com/payouts#payout-failures); a failed payout's event is
``payout.failed`` with ``failure_code`` (https://docs.stripe.com/api/payouts/object).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.billing.book import book_account_balance
from marketplace.billing.credit import order_settle
from marketplace.billing.payments import order_refund
from marketplace.billing.payout_contents import payout_contents
from marketplace.billing.payouts import payable_minor, payout_event_handle, payout_run
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.models import (
    BookAccountKind,
    GpuModel,
    InvoiceLine,
    Offer,
    Order,
    OrderState,
    PayoutState,
)
from tests.factories import ProviderAccountFactory
from tests.portal.conftest import client_for
from tests.portal.test_connect_payouts import EARNED, _cash, _details, _earn, _events, _verified

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _minimum(settings):
    settings.PAYOUT_MINIMUM_MINOR = 1000


def _order_on(provider_org, buyer_org, buyer, *, usd: str) -> Order:
    """An order of ``buyer_org`` on the provider's capacity that ended and was charged ``usd`` (no tax)."""
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    now = timezone.now()
    account = ProviderAccountFactory(provider=provider_org.provider)
    offer = Offer.objects.create(
        account=account, region="eu-west-1", zone="eu-west-1a", instance_type="g5.xlarge", pricing_model="on_demand",
        gpu_model=GpuModel.objects.get(key="A10G"), gpu_count=1, gpu_memory_gb=24, vcpus=4, memory_gib=16,
        price=Decimal("1.0"), currency="USD", price_usd=Decimal("1.0"), price_per_gpu_usd=1.0,
        usd_per_tflop_hour=0.01, first_seen_at=now, last_seen_at=now,
    )  # fmt: skip
    order = Order.objects.create(
        organization=buyer_org, created_by=buyer, offer=offer, gpu_model=offer.gpu_model, gpu_count=1,
        pricing_model="on_demand", max_price_per_hour=offer.price_usd, price_per_hour=offer.price_usd,
        state=OrderState.TERMINATED, state_changed_at=now,
    )  # fmt: skip
    line = InvoiceLine.objects.create(
        organization=buyer_org, order=order, description="1x A10G", seconds=3600, price_per_hour=offer.price_usd,
        amount_usd=Decimal(usd), ended_at=now,
    )  # fmt: skip
    order_settle(order, line, now=now)
    return order


def _paid_out(petra_org, stripe_sandbox) -> None:
    payout = payout_run(organization=petra_org)
    assert payout is not None and payout.state == PayoutState.IN_TRANSIT
    stripe_sandbox.settle_payout(payout.stripe_payout, "paid")
    for event in _events(stripe_sandbox, "payout.paid"):
        payout_event_handle(event)


def test_a_refund_after_the_payout_is_clawed_back_from_the_next_one(petra, petra_org, acme, alice, stripe_sandbox):
    _details(petra_org)
    _verified(petra_org, stripe_sandbox)
    first = _order_on(petra_org, acme, alice, usd="100.00")
    assert payable_minor(petra_org) == 8800  # 100.00 less the 12 % commission
    _paid_out(petra_org, stripe_sandbox)
    commission = book_account_balance(kind=BookAccountKind.COMMISSION, currency="USD")

    # The buyer is refunded in two parts after the provider was paid: the provider's 88 % comes back from it.
    order_refund(order=first, amount_minor=3333, key="a", reason="slow disk")
    order_refund(order=first, amount_minor=6667, key="b", reason="the rest")

    assert payable_minor(petra_org) == -8800  # exactly its share of the whole charge, in two roundings
    assert book_account_balance(kind=BookAccountKind.COMMISSION, currency="USD") == commission + 1200
    assert not book_account_balance(kind=BookAccountKind.REFUNDS, currency="USD")  # the parts added up exactly
    page = client_for(petra).get("/provider/payouts").content.decode()
    assert '<strong id="payable" class="err">&minus;88.00 USD</strong>' in page
    assert "comes off your next payouts" in page
    assert "98.00 USD more to go" in page  # to the 10.00 minimum
    assert payout_run(organization=petra_org) is None  # nothing is paid out below zero

    _order_on(petra_org, acme, alice, usd="200.00")  # earns 176.00: 88.00 of it pays the claw-back

    again = payout_run(organization=petra_org)
    assert (again.state, again.amount_minor) == (PayoutState.IN_TRANSIT, 8800)
    assert payable_minor(petra_org) == 0
    # Each payout lists what it pays: the first, the first order; the second, the claw-back and the second order.
    second = Order.objects.exclude(pk=first.pk).get()
    contents = payout_contents(petra_org)
    [paid_first] = [p for p in petra_org.payouts.all() if p.pk != again.pk]
    assert [(i.order, i.amount_minor) for i in contents[paid_first.public_id]] == [(str(first.public_id), 8800)]
    assert [(i.order, i.amount_minor) for i in contents[again.public_id]] == [
        (str(first.public_id), -8800),
        (str(second.public_id), 17600),
    ]
    page = client_for(petra).get("/provider/payouts").content.decode()
    assert "refund of 1x A10G after it was paid out" in page and "-88.00" in page and "176.00" in page


def test_a_payout_that_fails_after_it_was_paid_is_reversed_and_paid_out_again(petra_org, stripe_sandbox):
    account = _verified(petra_org, stripe_sandbox)
    _earn(petra_org)
    payout = payout_run(organization=petra_org)
    stripe_sandbox.settle_payout(payout.stripe_payout, "paid")
    [paid] = _events(stripe_sandbox, "payout.paid")
    payout_event_handle(paid)
    assert (_cash(), payable_minor(petra_org)) == (-EARNED, 0)

    # Days later the bank returns it: Stripe reports the same payout failed and puts the money back.
    stripe_sandbox.settle_payout(payout.stripe_payout, "failed", "account_closed")
    [failed] = _events(stripe_sandbox, "payout.failed")
    outcome = payout_event_handle(failed)

    payout.refresh_from_db()
    assert outcome == f"payout {payout.public_id} failed after it was paid (account_closed): payable again"
    assert (payout.state, payout.failure_code) == (PayoutState.FAILED, "account_closed")
    assert (_cash(), payable_minor(petra_org)) == (0, EARNED)  # the paid entry is reversed
    assert payout_event_handle(failed) == f"payout {payout.public_id} already failed: unchanged"
    assert stripe_sandbox.balance(account) == {"usd": EARNED}

    retry = payout_run(organization=petra_org)

    assert (retry.state, retry.amount_minor, retry.stripe_transfer) == (
        PayoutState.IN_TRANSIT,
        EARNED,
        payout.stripe_transfer,
    )
    assert len(stripe_sandbox.calls("transfers.create")) == 1  # paid again from the returned balance
    contents = payout_contents(petra_org)
    assert [i.amount_minor for i in contents[payout.public_id]] == [EARNED]
    assert [i.amount_minor for i in contents[retry.public_id]] == [EARNED]  # the same earnings, paid again
    assert payable_minor(petra_org) == 0 and stripe_sandbox.balance(account) == {"usd": 0}
