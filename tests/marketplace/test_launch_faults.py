"""What goes wrong between an order and a usable machine, on the AWS sandbox through the real adapter: a
configuration over the cloud's limit, an image missing in a region, a machine that never reports, the wrong
GPUs, a container that will not start, resources that outlive their order, and secrets that must never
show. Each proves what happened and what did not (no launch, no second machine, no gap in the ledger)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import (
    Attempt,
    IdempotentResponse,
    LaunchConfiguration,
    Lease,
    LeaseState,
    Offer,
    OfferStatus,
    Order,
    OrderState,
    WebhookDelivery,
)
from marketplace.orders.launching import Step
from marketplace.orders.readiness import order_boot_check
from marketplace.orders.reconcile import account_resources_reconcile
from marketplace.orders.running import order_check_running
from marketplace.orders.services import orders_end_scheduled
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.leases import ClientTransport, boot, held_agent

pytestmark = pytest.mark.django_db

SECRET = "hf_TopSecret-0123456789"
REGISTRY_PASSWORD = "registry-pass-9876543210"


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _t4(account, region: str = "us-east-1") -> Offer:
    return (
        account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand", region=region,
                              status=OfferStatus.AVAILABLE)
        .order_by("price_usd", "zone")
        .first()
    )  # fmt: skip


def _order(api, capture, body):
    with capture(execute=True):
        response = api.post("/api/v1/orders", body, format="json")
    assert response.status_code in (200, 201), response.json()
    return Order.objects.get(public_id=response.json()["id"])


def test_a_configuration_over_the_clouds_user_data_limit_is_refused_before_anything_launches(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    script = "#!/bin/bash\n" + "echo 'a line of the buyer script that goes on'\n" * 500  # ~22 KB, over EC2's 16 KB
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/v1/orders",
            {"offer": _t4(aws_account).pk, "launch": {"workload": {"kind": "script", "script": script}}},
            format="json",
        )

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_launch"
    message = error["fields"]["launch.workload"][0]
    assert "16384" in message and "UserData" in message
    assert not Order.objects.exists() and not LaunchConfiguration.objects.exists()
    assert aws_sandbox.calls("RunInstances") == [] and LedgerEntry.objects.count() == 0


def test_an_image_missing_in_a_region_fails_that_attempt_with_the_reason_and_fails_over(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    aws_sandbox.faults.inject("image_missing", region="us-east-1")
    first = _t4(aws_account)
    cap = str(max(first.price_usd, _t4(aws_account, "eu-west-1").price_usd) + Decimal("0.01"))

    order = _order(api, django_capture_on_commit_callbacks, {"offer": first.pk, "max_price_per_hour": cap})

    refused = order.attempts.order_by("number").first()
    assert refused.offer.region == "us-east-1" and refused.error_class == "image"
    assert "us-east-1" in refused.provider_message
    # Its lease ended with it: no machine of the refused attempt may ever claim the order.
    assert Lease.objects.get(attempt=refused).state == LeaseState.ENDED
    assert boot(order, aws_sandbox) == "running"
    assert order.instance.region == "eu-west-1"
    # No machine ever started where the image was missing.
    assert {i.region for i in aws_sandbox.instances() if i.tags.get("broker:order") == order.ref} == {"eu-west-1"}
    assert ledger_verify().ok


def _order_groups(account, order) -> list[str]:
    resources = adapter_for_account(account).list_order_resources()
    return [r.resource_id for r in resources if r.order_ref == order.ref and r.kind == "security_group"]


def test_a_first_launch_whose_preparation_was_refused_makes_its_resources_itself_and_goes_on(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    # The first attempt's security group is made on a thread while the attempt is recorded
    # (launching._first_launch_prepare). Refused there, it is made by the launch itself, on the same offer.
    aws_sandbox.faults.inject("credentials", action="CreateSecurityGroup", times=1)

    order = _order(api, django_capture_on_commit_callbacks, {"offer": _t4(aws_account).pk, "max_price_per_hour": "5"})

    attempt = order.attempts.get()
    assert attempt.outcome == "launched" and attempt.offer_id == _t4(aws_account).pk
    assert len(aws_sandbox.calls("CreateSecurityGroup")) == 2
    assert len(aws_sandbox.calls("RunInstances")) == 1
    assert len(_order_groups(aws_account, order)) == 1  # made once: the refused call made nothing
    assert boot(order, aws_sandbox) == "running"
    assert ledger_verify().ok


def test_a_machine_that_never_reports_is_terminated_and_the_order_fails_over(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    aws_sandbox.faults.inject("boot_silent", times=1)
    order = _order(api, django_capture_on_commit_callbacks, {"offer": _t4(aws_account).pk, "max_price_per_hour": "5"})
    silent = order.instances.get(active=True)
    lease = Lease.objects.get(attempt=silent.attempt)
    assert order_boot_check(order_id=order.pk) == Step.WAIT

    with django_capture_on_commit_callbacks(execute=True):
        assert order_boot_check(order_id=order.pk, now=lease.boot_deadline + dt.timedelta(seconds=1)) == Step.PROVISION
        from marketplace.tasks import order_provision_task

        order_provision_task.delay(order.pk)

    attempt = Attempt.objects.get(pk=silent.attempt_id)
    assert (attempt.error_class, attempt.provider_code) == ("boot_timeout", "boot_timeout")
    adapter = adapter_for_account(aws_account)
    assert adapter.describe(silent.region, silent.provider_instance_id).state == InstanceState.TERMINATED
    assert boot(order, aws_sandbox) == "running"
    live = [h for h in adapter.find_by_order(order.ref) if h.state != InstanceState.TERMINATED]
    assert [h.instance_id for h in live] == [order.instance.provider_instance_id]
    assert ledger_verify().ok


def test_a_machine_with_the_wrong_gpus_is_a_failed_attempt_not_a_running_order(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    aws_sandbox.faults.inject("gpu_mismatch", instance_type="g5.12xlarge", times=1)
    offer = aws_account.offers.filter(instance_type="g5.12xlarge", pricing_model="on_demand").order_by("zone")[0]
    cap = str(offer.price_usd * 2)
    order = _order(api, django_capture_on_commit_callbacks, {"offer": offer.pk, "max_price_per_hour": cap})
    first = order.instances.get(active=True)

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, aws_sandbox) == "refused"

    attempt = Attempt.objects.get(pk=first.attempt_id)
    assert attempt.error_class == "gpu_mismatch"
    assert attempt.provider_message == "the order is for 4x A10G; the machine has 2x NVIDIA A10G 24 GB"
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING and order.instances.get(active=True).pk != first.pk
    assert boot(order, aws_sandbox) == "running"


def test_a_container_that_does_not_start_fails_the_order_and_the_reason_reaches_the_buyer(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    reason = "docker: Error response from daemon: manifest for acme/trainer:v9 not found"
    aws_sandbox.faults.inject("workload_fail", message=reason)
    launch = {"workload": {"kind": "container", "image": "acme/trainer:v9"}}
    order = _order(api, django_capture_on_commit_callbacks, {"offer": _t4(aws_account).pk, "launch": launch})

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, aws_sandbox) == "failed"

    order.refresh_from_db()
    assert order.state == OrderState.FAILED
    assert order.state_reason == f"the workload did not start: {reason}"
    body = api.get(f"/api/v1/orders/{order.public_id}").json()
    assert body["boot"]["failure"] == {"stage": "workload", "reason": reason}
    assert body["connection"] is None
    # Not failed over: another machine would pull the same missing image.
    assert order.attempts.count() == 1
    assert all(h.state == InstanceState.TERMINATED for h in adapter_for_account(aws_account).find_by_order(order.ref))


def test_key_pairs_and_security_groups_left_behind_are_found_and_released_by_the_reconciler(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    # Every zone sold out: the launch created the order's key pair and security group, then EC2 refused.
    aws_sandbox.faults.inject("capacity", instance_type="g4dn.xlarge")
    offer = _t4(aws_account)
    order = _order(
        api, django_capture_on_commit_callbacks,
        {"offer": offer.pk, "allow_failover": False, "max_price_per_hour": str(offer.price_usd)},
    )  # fmt: skip
    assert order.state == OrderState.FAILED
    adapter = adapter_for_account(aws_account)
    # A leak the broker never recorded: resources for an order it does not know (a lost database row, say).
    stray_ref = "ord-" + "f" * 32
    from dataclasses import replace

    from tests.providers.contract import contract_boot

    stray = replace(contract_boot(), boot_token="bt_stray")
    from providers.types import LaunchSpec, PricingModel

    aws_sandbox.faults.clear()
    handle = adapter.launch(LaunchSpec(region=offer.region, zone=offer.zone, instance_type=offer.instance_type,
                                       pricing_model=PricingModel.ON_DEMAND, client_token=f"{stray_ref}-a1",
                                       order_ref=stray_ref, boot=stray))  # fmt: skip
    adapter.terminate(offer.region, handle.instance_id)
    leaked = {r.order_ref for r in adapter.list_order_resources()}
    assert {order.ref, stray_ref} <= leaked

    # Right after the order ended its resources are left alone (a grace period); the stray ones go at once.
    strays = sorted(f"{r.kind}:{r.resource_id}" for r in adapter.list_order_resources() if r.order_ref == stray_ref)
    assert sorted(account_resources_reconcile(account_id=aws_account.pk, now=timezone.now()).terminated) == strays
    assert {r.order_ref for r in adapter.list_order_resources()} == {order.ref}
    report = account_resources_reconcile(account_id=aws_account.pk, now=timezone.now() + dt.timedelta(minutes=5))

    assert report.errors == []
    assert {r.order_ref for r in adapter.list_order_resources()} == set()
    entry = LedgerEntry.objects.get(kind="order.resources_released", subject=f"order:{order.public_id}")
    assert "security_group" in entry.payload and "key_pair" in entry.payload
    assert ledger_verify().ok


def test_a_machine_the_provider_no_longer_knows_is_a_lost_machine(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    order = _order(api, django_capture_on_commit_callbacks, {"offer": _t4(aws_account).pk, "allow_failover": False})
    boot(order, aws_sandbox)
    # As ECS does on release and Azure on a spot eviction: the instance is simply gone.
    from marketplace.models import Instance

    Instance.objects.filter(order=order).update(provider_instance_id="i-00000000000000000")

    assert order_check_running(order_id=order.pk) == Step.DONE

    order.refresh_from_db()
    assert order.state == OrderState.FAILED and "by the provider" in order.state_reason


def test_the_spend_cap_ends_the_order_with_its_reason(
    api, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _t4(aws_account)
    cap = (offer.price_usd / 4).quantize(Decimal("0.01"))  # about fifteen minutes
    order = _order(api, django_capture_on_commit_callbacks, {"offer": offer.pk, "launch": {"spend_cap_usd": str(cap)}})
    boot(order, aws_sandbox)
    ready_at = order.instances.get().ready_at
    assert order.run_until == ready_at + dt.timedelta(hours=float(cap / order.price_per_hour))

    with django_capture_on_commit_callbacks(execute=True):
        assert orders_end_scheduled(now=order.run_until + dt.timedelta(seconds=1)) == 1

    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert order.state_reason == f"spend cap reached: the order has cost its cap of {cap} USD"


def test_secrets_never_reach_the_ledger_webhooks_logs_or_any_answer(
    api, acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, caplog, client
):
    from marketplace.webhooks.services import webhook_endpoint_create
    from tests.marketplace.test_webhooks import Receiver

    receiver = Receiver()
    webhook_endpoint_create(organization=acme, user=alice, url=receiver.url(), events=[])
    caplog.set_level(logging.DEBUG)
    launch = {
        "workload": {
            "kind": "container", "image": "ghcr.io/acme/serve:1",
            "env": [{"name": "HF_TOKEN", "value": SECRET, "secret": True}, {"name": "MODE", "value": "serve"}],
            "registry": {"server": "ghcr.io", "username": "acme", "password": REGISTRY_PASSWORD},
        },
    }  # fmt: skip
    placed = api.post("/api/v1/orders", {"offer": _t4(aws_account).pk, "launch": launch}, format="json",
                      HTTP_IDEMPOTENCY_KEY="secret-order-1")  # fmt: skip
    assert placed.status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        from marketplace.tasks import order_provision_task

        order_provision_task.delay(Order.objects.get().pk)
    order = Order.objects.get()
    agent = held_agent(order, aws_sandbox)
    user_data = repr(agent.lease)
    agent.transport = ClientTransport(client)
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.boot() == "running"
    assert agent.heartbeat() == "running"
    replay = api.post("/api/v1/orders", {"offer": _t4(aws_account).pk, "launch": launch}, format="json",
                      HTTP_IDEMPOTENCY_KEY="secret-order-1")  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/api/v1/orders/{order.public_id}/terminate")
    receiver.stop()

    places = {
        "the answer that placed it": placed.content.decode(),
        "the replayed answer": replay.content.decode(),
        "the order answer": api.get(f"/api/v1/orders/{order.public_id}").content.decode(),
        "the order list": api.get("/api/v1/orders").content.decode(),
        "the receipt": api.get(f"/api/v1/orders/{order.public_id}/receipt").content.decode(),
        "the ledger": json.dumps(list(LedgerEntry.objects.values_list("payload", flat=True))),
        "the webhooks sent": json.dumps([r["body"].decode() for r in receiver.requests]),
        "the webhook store": json.dumps(list(WebhookDelivery.objects.values_list("payload", flat=True)), default=str),
        "the logs": caplog.text,
        "the user data": user_data,
        "the stored configuration": json.dumps(list(LaunchConfiguration.objects.values_list("spec", flat=True))),
        "the idempotency store": json.dumps(list(IdempotentResponse.objects.values_list("body", flat=True)),
                                            default=str),
        "the lease rows": json.dumps(list(Lease.objects.values()), default=str),
    }  # fmt: skip
    assert len(receiver.requests) >= 6
    for where, text in places.items():
        assert SECRET not in text, where
        assert REGISTRY_PASSWORD not in text, where
    # ... while the machine got them, over the signed channel.
    assert Lease.objects.get(order=order).state == LeaseState.ENDED
    assert '"secret":true' in places["the order answer"].replace(" ", "")
