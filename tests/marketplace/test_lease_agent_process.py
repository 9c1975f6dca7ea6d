"""The lease agent a real machine runs, as that machine runs it: the zipapp fetched from the broker, checked
against the SHA-256 in the boot script, started as its own Python process on the lease file the boot script
wrote, talking to a live broker over HTTP. Only the GPUs are simulated."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import urllib.request

import boto3
import pytest

from marketplace.models import LeaseHeartbeat, Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from sandboxes.aws import keys as aws_keys
from tests.leases import LAUNCH
from tests.waiting import wait_for


def _ec2(sandbox, region: str):
    return boto3.client("ec2", region_name=region, endpoint_url=sandbox.url,
                        aws_access_key_id=aws_keys.PETRA.access_key_id,
                        aws_secret_access_key=aws_keys.PETRA.secret_access_key)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_fetched_agent_boots_the_machine_and_stops_when_the_order_ends(
    live_server, settings, acme, alice, aws_account, aws_sandbox, tmp_path
):
    settings.PUBLIC_URL = live_server.url
    settings.LEASE_HEARTBEAT_S = 0.3
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING
    # What cloud-init would have: the user data EC2 stored for the instance.
    instance = order.instances.get(active=True)
    lease = aws_sandbox.booter.machine(instance.provider_instance_id).lease
    (tmp_path / "lease.json").write_text(json.dumps(lease))
    with urllib.request.urlopen(f"{live_server.url}/agent/v1/lease/agent.pyz", timeout=10) as answer:  # noqa: S310
        (tmp_path / "agent.pyz").write_bytes(answer.read())
    # The check the boot script makes before running it, on the user data as EC2 answers it.
    script = base64.b64decode(
        _ec2(aws_sandbox, instance.region).describe_instance_attribute(
            InstanceId=instance.provider_instance_id, Attribute="userData"
        )["UserData"]["Value"]
    )
    expected = re.search(rb'echo "([0-9a-f]{64})  \$BROKER_DIR/agent.pyz"', script).group(1).decode()
    assert hashlib.sha256((tmp_path / "agent.pyz").read_bytes()).hexdigest() == expected

    agent = subprocess.Popen(
        [sys.executable, "-I", str(tmp_path / "agent.pyz"), "lease", "--spec", str(tmp_path / "lease.json"),
         "--simulate", "Tesla T4:16x1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: Order.objects.get(pk=order.pk).state == OrderState.RUNNING, "the order to run", timeout=60)
        wait_for(lambda: LeaseHeartbeat.objects.filter(lease__order=order).exists(), "a heartbeat", timeout=60)
        order_terminate(order=Order.objects.get(pk=order.pk))
        output, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()

    assert agent.returncode == 0, output
    assert "lease ended: ended" in output
    beat = LeaseHeartbeat.objects.filter(lease__order=order).latest("at")
    assert len(beat.gpus) == 1
    assert Order.objects.get(pk=order.pk).state == OrderState.TERMINATED
