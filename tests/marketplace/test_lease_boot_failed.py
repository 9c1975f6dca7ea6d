"""A clear reason when a machine cannot run the agent (issue 33, point 7): the boot script finds no ``python3``,
or one older than the agent's 3.9, and tells the broker with the boot token instead of leaving the order to a
boot timeout. The token is spent, the attempt fails with the reason the order page shows, and the order fails
over as for any other boot failure.

The last tests run the real user data in a container whose image lacks Python, or whose ``python3`` says
3.8 (a stand-in), against a live broker."""

from __future__ import annotations

import base64

import boto3
import pytest

from marketplace.launch.leases import boot_token
from marketplace.models import AttemptOutcome, Lease, LeaseState, Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from sandboxes.aws import keys as aws_keys
from tests.leases import LAUNCH
from tests.machines import Machine

NEEDS = "the broker&#x27;s agent needs Python 3.9 or newer"  # as the order page escapes it


def _order(acme, alice, aws_account, capture) -> Order:
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with capture(execute=True):
        placed = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, allow_failover=True)
        )
    return Order.objects.get(pk=placed.order.pk)


def _report(client, token: str, reason: str, version: str = ""):
    body = {"boot_token": token, "reason": reason, "version": version}
    return client.post("/agent/v1/lease/boot-failed", body, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reason", "version", "says"),
    [
        ("no_python", "", "the image has no python3"),
        ("python_too_old", "3.8", "the image's python3 is 3.8"),
        ("python_too_old", "", "the image's python3 is too old (it does not say its version)"),
        ("python_incomplete", "3.11", "the image's python3 3.11 lacks standard library modules (json, ssl, "
         "urllib.request): the broker's agent needs Python 3.9 or newer (python3 on the PATH) with its standard "
         "library (on Debian and Ubuntu the python3 package, not only python3-minimal)"),
    ],
)  # fmt: skip
def test_a_machine_without_the_python_the_agent_needs_fails_its_attempt_with_the_reason_and_fails_over(
    acme, alice, aws_account, aws_sandbox, client, django_capture_on_commit_callbacks, reason, version, says
):
    order = _order(acme, alice, aws_account, django_capture_on_commit_callbacks)
    lease = Lease.objects.get(order=order)
    token = boot_token(lease.attempt.client_token)

    with django_capture_on_commit_callbacks(execute=True):
        answer = _report(client, token, reason, version)
    again = _report(client, token, reason, version)
    claim = client.post("/agent/v1/lease/claim", {"boot_token": token}, content_type="application/json")

    assert answer.status_code == 200 and answer.json() == {"state": "failed"}
    lease.refresh_from_db()
    needs = "the broker's agent needs Python 3.9 or newer (python3 on the PATH)"
    expected = says if reason == "python_incomplete" else f"{says}: {needs}"
    assert (lease.state, lease.failure_stage, lease.failure_reason) == (LeaseState.FAILED, "boot", expected)
    assert lease.key_id is None  # the token was spent without handing out a key
    first = order.attempts.get(number=1)
    assert (first.outcome, first.error_class, first.provider_code) == (AttemptOutcome.FAILED, "boot", "boot_failed")
    assert first.provider_message == expected
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING and order.attempts.count() == 2  # failed over
    assert (again.status_code, again.json()["code"]) == (401, "spent")
    assert (claim.status_code, claim.json()["code"]) == (401, "spent")


# --- the real user data on an image that cannot run the agent ----------------------------------------------


def _user_data(sandbox, order: Order) -> bytes:
    instance = order.instances.get(active=True)
    ec2 = boto3.client("ec2", region_name=instance.region, endpoint_url=sandbox.url,
                       aws_access_key_id=aws_keys.PETRA.access_key_id,
                       aws_secret_access_key=aws_keys.PETRA.secret_access_key)  # fmt: skip
    answer = ec2.describe_instance_attribute(InstanceId=instance.provider_instance_id, Attribute="userData")
    return base64.b64decode(answer["UserData"]["Value"])


# What makes each image: no python3 at all, one that says it is 3.8 (a stand-in ahead of the real one), or one
# trimmed of the standard library the agent imports (as Debian's python3-minimal is).
NO_PYTHON = "rm -f /usr/bin/python3 /usr/bin/python3.*"
PYTHON_38 = "printf '#!/bin/sh\\necho Python 3.8.18\\n' >/usr/local/bin/python3 && chmod 755 /usr/local/bin/python3"
TRIMMED = "rm -rf /usr/lib/python3.*/json"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("prepare", "says"),
    [
        (NO_PYTHON, "the image has no python3: "),
        (PYTHON_38, "the image&#x27;s python3 is 3.8: "),
        (TRIMMED, "lacks standard library modules (json, ssl, urllib.request): "),
    ],
)
def test_an_image_that_cannot_run_the_agent_shows_why_on_the_order_instead_of_timing_out(
    live_server, settings, acme, alice, aws_account, aws_sandbox, client, tmp_path, prepare, says
):
    settings.PUBLIC_URL = live_server.url
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    request = PlaceRequest(launch=LAUNCH, offer_id=offer.pk, allow_failover=True)
    order = order_place(organization=acme, user=alice, request=request).order
    user_data = _user_data(aws_sandbox, order)
    machine = Machine(tmp_path, login_user="ubuntu")
    try:
        machine.power_on(prepare=prepare)
        booted = machine.boot(user_data)
        agents = machine.agents()
    finally:
        machine.power_off()

    assert booted.returncode == 1, booted.stderr.decode(errors="replace")
    assert agents == [] and not (tmp_path / "opt" / "agent.pyz").exists()  # nothing fetched, nothing started
    first = Order.objects.get(pk=order.pk).attempts.get(number=1)
    assert (first.outcome, first.provider_code) == (AttemptOutcome.FAILED, "boot_failed")
    client.force_login(alice)
    page = client.get(f"/orders/{order.public_id}/").content.decode()
    assert f"{says}{NEEDS}" in page
