"""The order path over the API against the AWS sandbox: launch, failover, errors, idempotency, terminate."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_sequence, ledger_verify
from marketplace.models import Attempt, Instance, Offer, OfferStatus, Order, OrderState
from providers.services import adapter_for_account
from tests.leases import boot

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _offer(account, itype="g5.xlarge", pricing="on_demand", region=None) -> Offer:
    qs = account.offers.filter(instance_type=itype, pricing_model=pricing, status=OfferStatus.AVAILABLE)
    if region:
        qs = qs.filter(region=region)
    return qs.order_by("price_usd", "zone").first()


def _post(api, body, key=None, capture=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with capture(execute=True):
        return api.post("/api/v1/orders", data=json.dumps(body), content_type="application/json", **headers)


def _ledger_kinds(order: Order) -> list[str]:
    return list(LedgerEntry.objects.filter(subject=f"order:{order.public_id}").values_list("kind", flat=True))


def test_an_order_is_launched_and_runs_with_every_step_ledgered(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)

    response = _post(api, {"offer": offer.pk}, capture=django_capture_on_commit_callbacks)

    assert response.status_code == 201, response.content
    order = Order.objects.get(public_id=response.json()["id"])
    # The provider runs the machine; the order runs once the machine's agent says it is ready.
    assert order.state == OrderState.PROVISIONING
    assert api.get(f"/api/v1/orders/{order.public_id}").json()["connection"] is None
    assert boot(order, aws_sandbox) == "running"
    assert order.state == OrderState.RUNNING
    assert order.price_per_hour == offer.price_usd
    assert [(a.number, a.outcome, a.offer_id) for a in order.attempts.all()] == [(1, "launched", offer.pk)]
    assert order.instance.zone == offer.zone
    assert _ledger_kinds(order) == [
        "order.placed",
        "order.provisioning",
        "attempt.started",
        "attempt.launched",
        "order.running",
    ]
    assert ledger_verify().ok
    ledger_sequence()  # the sequencer process's turn: the order's newest entry gets its hash
    detail = api.get(f"/api/v1/orders/{order.public_id}").json()
    assert detail["state"] == "running"
    assert detail["instance"]["provider_instance_id"] == order.instance.provider_instance_id
    assert detail["ledger_head"] == LedgerEntry.objects.last().entry_hash
    assert detail["connection"]["ssh"].startswith("ssh -p ") and detail["connection"]["ssh"].endswith(
        "ubuntu@127.0.0.1"
    )
    assert detail["boot"]["state"] == "ready"


def test_a_capacity_error_fails_over_to_the_next_zone(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    aws_sandbox.faults.inject(kind="capacity", instance_type="g5.xlarge", zone=offer.zone)

    response = _post(api, {"offer": offer.pk}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    assert boot(order, aws_sandbox) == "running"
    first, second = order.attempts.all()
    assert (first.outcome, first.error_class, first.provider_code) == (
        "failed",
        "capacity",
        "InsufficientInstanceCapacity",
    )
    assert first.offer.zone == offer.zone
    assert second.outcome == "launched"
    assert second.offer.zone != offer.zone
    assert second.offer.instance_type == "g5.xlarge"
    assert order.instance.zone == second.offer.zone
    instances = adapter_for_account(aws_account).find_by_order(order.ref)
    assert [i.instance_id for i in instances] == [order.instance.provider_instance_id]
    assert "attempt.failed" in _ledger_kinds(order)
    assert ledger_verify().ok


def test_a_quota_error_skips_the_whole_region(api, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offer = _offer(aws_account, region="us-east-1")
    aws_sandbox.faults.inject(kind="quota", instance_type="g5.xlarge", zone=offer.zone)

    response = _post(api, {"offer": offer.pk, "max_price_per_hour": "5"}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    first, second = order.attempts.all()
    assert (first.error_class, first.provider_code) == ("quota", "VcpuLimitExceeded")
    assert second.offer.region != "us-east-1"
    assert boot(order, aws_sandbox) == "running"
    assert order.instance.region == second.offer.region


def test_when_no_offer_is_left_within_the_cap_the_order_fails_with_the_reason(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    aws_sandbox.faults.inject(kind="capacity", instance_type="g5.xlarge")
    # A cap at this offer's price leaves only offers as cheap or cheaper.
    cap = str(offer.price_usd)

    response = _post(api, {"offer": offer.pk, "max_price_per_hour": cap}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    assert order.state == OrderState.FAILED
    assert order.state_reason.startswith("no offer left within the price cap after g5.xlarge in ")
    assert "capacity (InsufficientInstanceCapacity)" in order.state_reason
    assert all(a.outcome == "failed" for a in order.attempts.all())
    assert not Instance.objects.filter(order=order).exists()
    assert adapter_for_account(aws_account).find_by_order(order.ref) == []
    assert _ledger_kinds(order)[-1] == "order.failed"
    assert ledger_verify().ok


def test_a_throttled_launch_is_retried_with_the_same_token(
    api, aws_account, aws_sandbox, eager_retries, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    aws_sandbox.faults.inject(kind="throttle", instance_type="g5.xlarge", zone=offer.zone, times=1)

    response = _post(api, {"offer": offer.pk}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    assert boot(order, aws_sandbox) == "running"
    assert [(a.number, a.outcome) for a in order.attempts.all()] == [(1, "launched")]
    assert len(adapter_for_account(aws_account).find_by_order(order.ref)) == 1


def test_a_repeated_post_with_the_same_idempotency_key_returns_the_same_order(
    api, aws_account, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    body = {"offer": offer.pk, "max_price_per_hour": "2.5"}

    first = _post(api, body, key="k-123", capture=django_capture_on_commit_callbacks)
    again = _post(api, body, key="k-123", capture=django_capture_on_commit_callbacks)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    assert Order.objects.count() == 1
    assert Instance.objects.count() == 1
    assert Attempt.objects.count() == 1


def test_the_same_key_with_a_different_body_is_a_conflict(api, aws_account, django_capture_on_commit_callbacks):
    offer = _offer(aws_account)
    _post(api, {"offer": offer.pk}, key="k-9", capture=django_capture_on_commit_callbacks)
    entries = LedgerEntry.objects.count()

    response = _post(
        api, {"offer": offer.pk, "max_price_per_hour": "99"}, key="k-9", capture=django_capture_on_commit_callbacks
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    assert Order.objects.count() == 1
    assert LedgerEntry.objects.count() == entries


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "offer"),
        ({"offer": "abc"}, "offer"),
        ({"offer": 1, "max_price_per_hour": "-1"}, "max_price_per_hour"),
        ({"offer": 1, "regions": "us-east-1"}, "regions"),
    ],
)
def test_a_malformed_body_gets_400_with_field_errors_and_writes_nothing(
    api, aws_account, body, field, django_capture_on_commit_callbacks
):
    response = _post(api, body, capture=django_capture_on_commit_callbacks)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"]
    assert Order.objects.count() == 0
    assert LedgerEntry.objects.count() == 0


def test_an_unknown_or_withdrawn_offer_is_404(api, aws_account, django_capture_on_commit_callbacks):
    withdrawn = _offer(aws_account)
    Offer.objects.filter(pk=withdrawn.pk).update(status=OfferStatus.UNAVAILABLE)

    unknown = _post(api, {"offer": 999999}, capture=django_capture_on_commit_callbacks)
    gone = _post(api, {"offer": withdrawn.pk}, capture=django_capture_on_commit_callbacks)

    assert (unknown.status_code, gone.status_code) == (404, 404)
    assert unknown.json()["error"]["code"] == "offer_not_found"
    assert Order.objects.count() == 0
    assert LedgerEntry.objects.count() == 0


def test_an_offer_above_the_buyers_cap_is_refused(api, aws_account, django_capture_on_commit_callbacks):
    offer = _offer(aws_account)
    cap = str(offer.price_usd - Decimal("0.01"))

    response = _post(api, {"offer": offer.pk, "max_price_per_hour": cap}, capture=django_capture_on_commit_callbacks)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "offer_not_orderable"
    assert Order.objects.count() == 0


def test_a_stranger_sees_404_and_a_teammate_sees_the_order(
    api, aws_account, aws_sandbox, bob, charlie, django_capture_on_commit_callbacks
):
    order_id = _post(api, {"offer": _offer(aws_account).pk}, capture=django_capture_on_commit_callbacks).json()["id"]
    boot(Order.objects.get(public_id=order_id), aws_sandbox)
    stranger, teammate = APIClient(), APIClient()
    stranger.force_authenticate(charlie)
    teammate.force_authenticate(bob)

    assert stranger.get(f"/api/v1/orders/{order_id}").status_code == 404
    assert stranger.post(f"/api/v1/orders/{order_id}/terminate").status_code == 404
    assert stranger.get("/api/v1/orders").json()["results"] == []
    assert teammate.get(f"/api/v1/orders/{order_id}").json()["id"] == order_id
    assert Order.objects.get().state == OrderState.RUNNING


def test_anonymous_requests_are_refused(aws_account):
    response = APIClient().get("/api/v1/orders")

    assert response.status_code in (401, 403)
    assert "error" in response.json()


def test_terminate_stops_the_instance_and_is_idempotent(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order_id = _post(api, {"offer": _offer(aws_account).pk}, capture=django_capture_on_commit_callbacks).json()["id"]
    boot(Order.objects.get(public_id=order_id), aws_sandbox)

    with django_capture_on_commit_callbacks(execute=True):
        first = api.post(f"/api/v1/orders/{order_id}/terminate")
    with django_capture_on_commit_callbacks(execute=True):
        second = api.post(f"/api/v1/orders/{order_id}/terminate")

    assert (first.status_code, second.status_code) == (202, 202)
    order = Order.objects.get(public_id=order_id)
    assert order.state == OrderState.TERMINATED
    handle = adapter_for_account(aws_account).describe(order.instance.region, order.instance.provider_instance_id)
    assert handle.state.value == "terminated"
    assert _ledger_kinds(order)[-2:] == ["order.terminating", "order.terminated"]
    assert ledger_verify().ok


def test_the_offer_list_filters(api, aws_account):
    response = api.get("/api/v1/offers", {"gpu": "A10G", "count": 4, "pricing": "spot"})

    results = response.json()["results"]
    assert response.status_code == 200
    assert results
    assert {(r["gpu_model"], r["pricing_model"]) for r in results} == {("A10G", "spot")}
    assert all(r["gpu_count"] >= 4 for r in results)
    assert api.get("/api/v1/offers", {"count": "many"}).json()["error"]["fields"]["count"]


@pytest.fixture
def eager_retries():
    """Celery re-applies a retried eager task only when it does not propagate errors; outcomes are asserted."""
    from broker.celery import app as celery_app

    celery_app.conf.task_eager_propagates = False


def test_a_launch_that_timed_out_is_retried_with_its_token_and_never_runs_twice(
    api, aws_account, aws_sandbox, eager_retries, django_capture_on_commit_callbacks
):
    aws_account.options = {"read_timeout": "0.5"}
    aws_account.save()
    offer = _offer(aws_account)
    # The first RunInstances answers too late for the client, but the sandbox still carries it out.
    aws_sandbox.faults.inject(kind="slow", instance_type="g5.xlarge", seconds=1.5, times=1)

    response = _post(api, {"offer": offer.pk}, capture=django_capture_on_commit_callbacks)
    time.sleep(1.5)  # let the late request finish at the sandbox

    order = Order.objects.get(public_id=response.json()["id"])
    assert boot(order, aws_sandbox) == "running"
    assert [(a.number, a.outcome) for a in order.attempts.all()] == [(1, "launched")]
    tagged = [i for i in aws_sandbox.instances() if i.tags.get("broker:order") == order.ref]
    assert len(tagged) == 1
    instances = adapter_for_account(aws_account).find_by_order(order.ref)
    assert [i.instance_id for i in instances] == [order.instance.provider_instance_id]


def test_rejected_credentials_at_launch_fail_the_order_with_the_reason(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    aws_sandbox.faults.inject(kind="credentials", instance_type="g5.xlarge")

    response = _post(api, {"offer": offer.pk}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    assert order.state == OrderState.FAILED
    assert [(a.error_class, a.provider_code) for a in order.attempts.all()] == [("credentials", "AuthFailure")]
    assert "credentials (AuthFailure)" in order.state_reason
    assert not Instance.objects.exists()
    assert ledger_verify().ok


def test_an_order_without_failover_fails_on_the_first_capacity_error(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(aws_account)
    aws_sandbox.faults.inject(kind="capacity", instance_type="g5.xlarge", zone=offer.zone)

    response = _post(api, {"offer": offer.pk, "allow_failover": False}, capture=django_capture_on_commit_callbacks)

    order = Order.objects.get(public_id=response.json()["id"])
    assert order.state == OrderState.FAILED
    assert order.attempts.count() == 1
    assert not Instance.objects.exists()
