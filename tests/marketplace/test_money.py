"""One money rule (issue 35, point 5): every line is rounded once to the currency's minor unit, and every total
is the sum of those rounded lines, so the book, the API, the storefront and the invoice show the same figures.

The disagreement this pins: three orders that each cost 0.045 USD. The book charges each 5 cents (0.15 USD); the
month's running invoice in the API and the storefront's spending page rounded the unrounded sum 0.135 instead
(0.14 USD), and the storefront's lines showed 0.04 each (rounded half to even), so no two of them agreed.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.billing.credit import order_settle
from marketplace.billing.invoices import invoice_issue
from marketplace.catalog.gpu_specs import gpu_models_upsert
from marketplace.models import BookAccountKind, BookLine, GpuModel, InvoiceLine, Offer, Order, OrderState, Organization
from tests.factories import ProviderAccountFactory

pytestmark = pytest.mark.django_db

OCTOBER = "2026-10"
IN_OCTOBER = dt.datetime(2026, 10, 14, 9, 30, tzinfo=dt.UTC)
AFTER_OCTOBER = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.UTC)
_seconds = itertools.count(1)


def _offer() -> Offer:
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    now = timezone.now()
    offer, _ = Offer.objects.get_or_create(
        account=ProviderAccountFactory(), region="eu-west-1", zone="eu-west-1a", instance_type="g5.xlarge",
        pricing_model="on_demand",
        defaults=dict(
            gpu_model=GpuModel.objects.get(key="A10G"), gpu_count=1, gpu_memory_gb=24, vcpus=4, memory_gib=16,
            price=Decimal("1.62"), currency="USD", price_usd=Decimal("1.62"), price_per_gpu_usd=1.62,
            usd_per_tflop_hour=0.01, first_seen_at=now, last_seen_at=now,
        ),
    )  # fmt: skip
    return offer


def ended_order(organization: Organization, user, *, price_per_hour: Decimal, seconds: int, at: dt.datetime) -> Order:
    """An order that ran ``seconds`` at ``price_per_hour`` and ended at ``at``: its invoice line as the order's end
    writes it (metered to the millionth), and its charge posted to the book by the real ``order_settle``."""
    offer = _offer()
    order = Order.objects.create(
        organization=organization, created_by=user, offer=offer, gpu_model=offer.gpu_model, gpu_count=1,
        pricing_model="on_demand", max_price_per_hour=price_per_hour, price_per_hour=price_per_hour,
        state=OrderState.TERMINATED, state_changed_at=at,
    )  # fmt: skip
    line = InvoiceLine.objects.create(
        organization=organization, order=order, description=f"1x A10G g5.xlarge eu-west-1 #{next(_seconds)}",
        seconds=seconds, price_per_hour=price_per_hour,
        amount_usd=(price_per_hour * seconds / 3600).quantize(Decimal("0.000001")), ended_at=at,
    )  # fmt: skip
    order_settle(order, line, now=at)
    return order


def book_charged_minor(organization: Organization) -> int:
    """What the book charged the organisation's credit for its orders, in minor units."""
    return sum(
        BookLine.objects.filter(
            account__kind=BookAccountKind.BUYER_CREDIT, account__organization=organization, entry__kind="order.charge"
        ).values_list("amount_minor", flat=True)
    )


def shown_minor(text: str) -> int:
    """A figure the storefront shows ("1,234.56 USD") in minor units; it must name its currency exactly once."""
    assert text.count("USD") == 1 and "$" not in text, f"the currency is not named exactly once in {text!r}"
    return int(text.replace("USD", "").replace(",", "").replace(".", "").strip())


def storefront_month(client: Client, month: str) -> tuple[list[int], int]:
    """The spending page's ended-order amounts and its month total, in minor units."""
    page = client.get("/spending", {"month": month}).content.decode()
    body = page.split('id="invoice-lines"', 1)[1].split("</table>", 1)[0]
    lines = re.findall(r'<td class="num line-amount">([^<]*)</td>', body)
    total = re.search(r'id="month-total">([^<]*)<', body)
    assert total is not None, "the spending page shows no month total"
    return [shown_minor(text) for text in lines], shown_minor(total.group(1))


def api_month(api: APIClient, month: str) -> tuple[list[int], int]:
    """The running invoice's line amounts and total from GET /api/v1/invoice, in minor units."""
    body = api.get("/api/v1/invoice", {"month": month}).json()
    assert body["currency"] == "USD"
    return [row["amount_minor"] for row in body["lines"]], body["total_minor"]


def test_three_lines_of_four_and_a_half_cents_total_fifteen_cents_everywhere(acme, alice):
    for _ in range(3):
        ended_order(acme, alice, price_per_hour=Decimal("1.62"), seconds=100, at=IN_OCTOBER)  # 0.045 USD each
    api = APIClient()
    api.force_authenticate(alice)
    browser = Client()
    browser.force_login(alice)

    assert book_charged_minor(acme) == 15
    assert api.get("/api/v1/invoice", {"month": OCTOBER}).json()["total_usd"] == "0.15"
    api_lines, api_total = api_month(api, OCTOBER)
    shown_lines, shown_total = storefront_month(browser, OCTOBER)
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER)
    issued = api.get(f"/api/v1/invoices/{invoice.number}").json()["invoice"]

    assert api_lines == shown_lines == [5, 5, 5]
    assert api_total == shown_total == invoice.total_minor == issued["total_minor"] == 15
