"""The reconciler against the AWS sandbox: orphans stopped, a launch lost in a crash adopted, extras removed."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.launch.leases import boot_spec, lease_open
from marketplace.models import Attempt, AttemptOutcome, Instance, Order, OrderState
from marketplace.orders.launching import Step
from marketplace.orders.readiness import order_poll
from marketplace.orders.reconcile import order_reconcile, orders_to_reconcile
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.orders.transitions import order_transition
from marketplace.tasks import orders_reconcile_task
from providers.services import adapter_for_account
from providers.types import LaunchSpec, PricingModel
from tests.leases import LAUNCH, boot, boot_if_launched

pytestmark = pytest.mark.django_db


@pytest.fixture
def t4(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]


def _place(acme, alice, offer, capture, *, run: bool = True, sandbox=None):
    with capture(execute=run):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    if sandbox is not None:
        boot_if_launched(order, sandbox)
    order.refresh_from_db()
    return order


def _launch(account, offer, order, token: str, attempt: int, region: str | None = None, boot=None):
    return adapter_for_account(account).launch(
        LaunchSpec(
            region=region or offer.region,
            zone=offer.zone if region is None else f"{region}a",
            instance_type=offer.instance_type,
            pricing_model=PricingModel.ON_DEMAND,
            client_token=token,
            order_ref=order.ref,
            tags={"broker:attempt": str(attempt)},
            boot=boot,
        )
    )


def _state(account, handle) -> str:
    return adapter_for_account(account).describe(handle.region, handle.instance_id).state.value


def test_an_instance_outliving_its_order_is_terminated(
    acme, alice, aws_account, t4, django_capture_on_commit_callbacks
):
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    # A machine for this order the broker never recorded (launched by a worker that died, say).
    orphan = _launch(aws_account, t4, order, "orphan-token-1", attempt=7)

    report = order_reconcile(order_id=order.pk)

    assert report.terminated == [orphan.instance_id] and report.adopted == []
    assert _state(aws_account, orphan) in {"terminated", "stopping"}
    entry = LedgerEntry.objects.filter(kind="order.orphan_terminated").get()
    assert orphan.instance_id in entry.payload and "order is terminated" in entry.payload
    assert ledger_verify().ok
    # Nothing left to do the second time.
    assert order_reconcile(order_id=order.pk).terminated == []


def test_a_stopped_machine_outliving_its_order_is_terminated_not_taken_for_gone(
    acme, alice, aws_account, t4, django_capture_on_commit_callbacks
):
    """A stopped EC2 instance keeps its EBS volumes, billed, until it is terminated (EC2 API reference,
    StopInstances, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html): the reconciler
    must not skip it as it skips an instance already ending (issue 36)."""
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    orphan = _launch(aws_account, t4, order, "orphan-token-stopped", attempt=7)
    adapter_for_account(aws_account).stop(orphan.region, orphan.instance_id)
    assert _state(aws_account, orphan) == "stopped"

    report = order_reconcile(order_id=order.pk)

    assert report.terminated == [orphan.instance_id]
    assert _state(aws_account, orphan) in {"terminated", "stopping"}


def test_a_running_orders_own_stopped_machine_is_kept(
    acme, alice, aws_account, aws_sandbox, t4, django_capture_on_commit_callbacks
):
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks, sandbox=aws_sandbox)
    own = order.instance
    adapter_for_account(aws_account).stop(own.region, own.provider_instance_id)

    report = order_reconcile(order_id=order.pk)

    assert report.terminated == [] and report.errors == []
    assert adapter_for_account(aws_account).describe(own.region, own.provider_instance_id).state.value == "stopped"


def test_a_launch_lost_in_a_crash_is_adopted(
    acme, alice, aws_account, aws_sandbox, t4, django_capture_on_commit_callbacks
):
    # The worker opened the attempt (and its lease) and the provider launched the machine with its boot, then
    # the worker died before recording the answer: the order is provisioning with a pending attempt and no
    # instance.
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks, run=False)
    order = order_transition(order=order, to=OrderState.PROVISIONING)
    attempt = Attempt.objects.create(
        order=order, number=1, offer=t4, client_token=f"{order.ref}-a1", started_at=timezone.now()
    )
    lease_open(attempt=attempt, now=timezone.now())
    order.refresh_from_db()
    launched = _launch(
        aws_account, t4, order, attempt.client_token, attempt=1, boot=boot_spec(order=order, attempt=attempt)
    )

    report = order_reconcile(order_id=order.pk)

    assert report.adopted == [launched.instance_id] and report.terminated == []
    attempt.refresh_from_db()
    assert attempt.outcome == AttemptOutcome.LAUNCHED
    instance = Instance.objects.get(order=order, active=True)
    assert instance.provider_instance_id == launched.instance_id
    # The adopted machine boots like any other: its agent's ready report makes the order run.
    assert order_poll(order_id=order.pk) == Step.WAIT
    assert boot(order, aws_sandbox) == "running"
    assert order.state == OrderState.RUNNING
    assert '"adopted":true' in LedgerEntry.objects.filter(kind="attempt.launched").get().payload.replace(" ", "")
    assert ledger_verify().ok


def test_a_second_machine_for_a_running_order_is_removed(
    acme, alice, aws_account, aws_sandbox, t4, django_capture_on_commit_callbacks
):
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks, sandbox=aws_sandbox)
    assert order.state == OrderState.RUNNING
    own = order.instance
    # A launch in another region of the account (a provider's token dedupes only within one region).
    extra = _launch(aws_account, t4, order, "extra-token-1", attempt=2, region="eu-west-1")

    report = order_reconcile(order_id=order.pk)

    assert report.terminated == [extra.instance_id]
    assert _state(aws_account, extra) in {"terminated", "stopping"}
    assert adapter_for_account(aws_account).describe(own.region, own.provider_instance_id).state.value == "running"
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING


def test_which_orders_are_reconciled(acme, alice, aws_account, t4, django_capture_on_commit_callbacks):
    running = _place(acme, alice, t4, django_capture_on_commit_callbacks)
    stuck = _place(acme, alice, t4, django_capture_on_commit_callbacks, run=False)
    now = timezone.now()
    # Just now: neither is quiet for long enough; the running one is alive, so never unless it ends.
    assert orders_to_reconcile(now=now) == []
    later = now + dt.timedelta(minutes=10)
    assert orders_to_reconcile(now=later) == sorted([running.pk, stuck.pk])
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=running)
    assert running.pk in orders_to_reconcile(now=timezone.now() + dt.timedelta(hours=1))
    assert running.pk not in orders_to_reconcile(now=timezone.now() + dt.timedelta(days=2))
    assert orders_reconcile_task.apply().get()["errors"] == 0


def test_a_known_instance_stopped_by_the_reconciler_is_announced_to_webhooks(
    acme, alice, aws_account, t4, django_capture_on_commit_callbacks
):
    from marketplace.models import WebhookDelivery
    from marketplace.webhooks.services import webhook_endpoint_create

    webhook_endpoint_create(organization=acme, user=alice, url="http://127.0.0.1:9/hook", description="", events=[])
    order = _place(acme, alice, t4, django_capture_on_commit_callbacks)
    # The order ended in the books while its machine kept running (a terminate call that never landed).
    order = order_transition(order=order, to=OrderState.TERMINATING)
    order_transition(order=order, to=OrderState.TERMINATED)
    assert Instance.objects.get(order=order).active

    with django_capture_on_commit_callbacks(execute=False):
        report = order_reconcile(order_id=order.pk)

    instance = Instance.objects.get(order=order)
    assert report.terminated == [instance.provider_instance_id] and not instance.active
    announced = WebhookDelivery.objects.filter(event_type="instance.terminated").get()
    assert announced.payload["instance"]["provider_instance_id"] == instance.provider_instance_id
    assert announced.payload["reason"] == "order is terminated"


def test_an_order_reference_read_back_from_a_provider_names_its_order_or_nothing():
    public_id = uuid.uuid4()
    order = Order(public_id=public_id)

    assert Order.public_id_of(order.ref) == public_id
    for foreign in ("", "ord-", f"ord-{public_id.hex}0", f"ord-{'z' * 32}", f"job-{public_id.hex}", "ord-" + "-" * 32):
        assert Order.public_id_of(foreign) is None
