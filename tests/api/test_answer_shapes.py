"""Answers the fuzzing rarely reaches hold to their typed schema too (issue 36): a top-up waiting for 3-D Secure,
billing details, a running order's connection, boot, receipt and stop, the public ledger with a signed and
anchored checkpoint, and an issued invoice. Each real answer is checked against the operation's documented
response by schemathesis, as tests/api/test_schemathesis.py checks the fuzzed ones."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
import requests
import schemathesis
from django.test import Client
from schemathesis.core.transport import Response

from ledger.checkpoints import ledger_checkpoint_and_anchor
from marketplace.api.tokens import api_token_create
from marketplace.billing.invoices import invoice_issue
from marketplace.models import OrderState, TokenScope
from marketplace.models.billing import BillingProfile
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, boot_if_launched
from tests.marketplace.test_invoices import AFTER_OCTOBER, IN_OCTOBER, OCTOBER, _charge

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        return schemathesis.openapi.from_dict(Client().get("/api/v1/schema", HTTP_ACCEPT="application/json").json())


@pytest.fixture
def call(acme, alice, schema):
    """``call(method, template, **path_params)``: the answer, after asserting it is what the schema documents."""
    token = api_token_create(organization=acme, user=alice, name="shapes", scopes=list(TokenScope.values)).raw
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_ACCEPT="application/json")

    def answer(method: str, template: str, body: dict | None = None, *, headers: dict | None = None,
               query: str = "", **params):  # fmt: skip
        path = template.format(**params) + query
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
        data = b"" if body is None else json.dumps(body).encode()
        got = client.generic(method, path, data=data, content_type="application/json", **extra)
        sent = requests.Request(method, f"http://testserver{path}", json=body).prepare()
        wire = Response(
            status_code=got.status_code, headers={k.lower(): [v] for k, v in got.headers.items()},
            content=got.content, request=sent, elapsed=0.0, verify=True,
        )  # fmt: skip
        schema[template][method].validate_response(wire)
        return got.status_code, got.json()

    return answer


def test_billing_and_a_top_up_waiting_for_3d_secure_answer_as_typed(call, ready_to_pay, stripe_sandbox):
    status, billing = call("GET", "/api/v1/billing")
    assert status == 200 and billing["country"] == "GB" and billing["auto_topup"] is None
    status, started = call(
        "POST", "/api/v1/billing/topups", {"amount": "30.00", "payment_method": "pm_card_authenticationRequired"},
        headers={"Idempotency-Key": "shape-1"},
    )  # fmt: skip
    assert status == 202 and started["action_deadline"] and started["next_action_url"]
    status, page = call("GET", "/api/v1/billing/topups")
    assert status == 200 and [t["id"] for t in page["results"]] == [started["id"]] and page["next"] is None
    status, detail = call("GET", "/api/v1/billing/topups/{topup_id}", topup_id=started["id"])
    assert status == 200 and detail["state"] == "requires_action"
    status, cancelled = call("POST", "/api/v1/billing/topups/{topup_id}/cancel", topup_id=started["id"])
    assert status == 200 and cancelled["state"] == "failed"


def test_billing_with_auto_top_up_answers_as_typed(call, ready_to_pay):
    BillingProfile.objects.filter(organization=ready_to_pay).update(
        payment_method="pm_card_visa", auto_topup_below_minor=500, auto_topup_amount_minor=2000
    )
    status, billing = call("GET", "/api/v1/billing")
    assert status == 200 and billing["auto_topup"] == {"below": "5.00", "amount": "20.00"}


@pytest.fixture
def running_order(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("0.01")
            ),
        ).order
    boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def test_a_running_orders_connection_boot_receipt_and_stop_answer_as_typed(call, running_order):
    order_id = str(running_order.public_id)
    status, order = call("GET", "/api/v1/orders/{order_id}", order_id=order_id)
    assert status == 200 and order["connection"]["ssh"] and order["boot"]["state"] == "ready"
    status, pending = call("GET", "/api/v1/orders/{order_id}/receipt", order_id=order_id)
    assert status == 200 and pending["status"] == "pending" and pending["checkpoint"] is None
    ledger_checkpoint_and_anchor()
    status, receipt = call("GET", "/api/v1/orders/{order_id}/receipt", order_id=order_id)
    assert status == 200 and receipt["checkpoint"]["anchor"] and receipt["entries"][0]["inclusion_proof"] is not None
    status, stopping = call("POST", "/api/v1/orders/{order_id}/stop", order_id=order_id)
    assert status == 202 and stopping["id"] == order_id


def test_the_public_ledger_answers_as_typed(call, running_order):
    ledger_checkpoint_and_anchor()
    status, key = call("GET", "/api/v1/ledger/key")
    assert status == 200 and key["key_history"]
    status, page = call("GET", "/api/v1/ledger/checkpoints")
    assert status == 200 and page["checkpoints"] and page["next_after"] is None
    status, latest = call("GET", "/api/v1/ledger/checkpoints/latest")
    size = latest["size"]
    assert status == 200 and latest["anchor"] is not None
    status, proof = call("GET", "/api/v1/ledger/consistency", query=f"?old=1&new={size}")
    assert status == 200 and proof["new_size"] == size
    status, leaves = call("GET", "/api/v1/ledger/leaves")
    assert status == 200 and len(leaves["leaf_hashes"]) == size


def test_an_issued_invoice_answers_as_typed(call, acme, alice):
    BillingProfile.objects.create(organization=acme, country="GB", tax_id="GB123456789")
    _charge(acme, alice, seconds=7200, at=IN_OCTOBER, country="GB")
    invoice = invoice_issue(acme, OCTOBER, now=AFTER_OCTOBER + dt.timedelta(hours=1))
    status, page = call("GET", "/api/v1/invoices")
    assert status == 200 and [i["number"] for i in page["results"]] == [invoice.number]
    status, issued = call("GET", "/api/v1/invoices/{number}", number=invoice.number)
    assert status == 200 and issued["sha256"] == invoice.sha256 and issued["invoice"]["lines"]["items"]
