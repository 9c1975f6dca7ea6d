"""Benchmark: order to ready through the AWS sandbox, split into the provider's calls, the broker's own work
and the boot, against the same launches made with boto3 alone in the same run.

    .venv/bin/python bench/boot.py [--runs 10] [--database postgres://postgres@127.0.0.1:5432/broker_bench_boot]

The broker's path is the real one minus the task queue: ``order_place`` with a launch configuration (a
container with a secret, two ports, a key), ``order_provision`` (the key pair, the security group and its
rules, the Deep Learning AMI from SSM, ``RunInstances`` with the boot script), ``order_poll`` until the
provider runs the instance, and then the boot: the sandbox (its own process, as a cloud is) starts the lease
agent from the user data, which phones home over HTTP to the broker (gunicorn, a process of its own), claims its
token, fetches the secret, checks the GPUs, "starts" the container, finds SSH and reports ready. The
baseline makes the same provider calls with boto3 alone, the same way (the broker's tags, user data as long
as its boot script but which no agent boots from), until the instance runs.

Goal (issue 39): order to the provider's "running" within 1.5x boto3 alone making the same calls.

What it reports, medians over the runs (each broker run followed by a boto3 run, so both see the same load):

- order to the provider's "running", against boto3 alone: the broker's overhead on the provider's calls
  (recording the attempt and lease, the ledger, ranking, the limits checked before launch), and where the
  broker's time goes per order (``bench/breakdown.py``: SDK calls, database round trips, ledger, ranking,
  task hops, the rest);
- the boot: from the provider's "running" to ready: the simulated machine's start (``BOOT_DELAY_S``, where a
  real image boots for one to three minutes), then the agent's protocol (four signed round trips);
- order to ready, the whole wait.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL_RATIO = 1.5  # issue 39: order to the provider's running within 1.5x boto3 alone
# The sandbox's machines start their agent this long after their launch. A real machine boots for a minute or
# more; one whose agent phoned home at once would do so while the order being timed is still recorded, and its
# requests would take the machine's two cores from it, which never happens for real.
BOOT_DELAY_S = 0.3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_boot")
    args = parser.parse_args()

    from bench.sync import django_on, sandboxes_serving

    port = _free_port()
    django_on(
        args.database, debug=False, CELERY_BROKER_URL="memory://", BROKER_PUBLIC_URL=f"http://127.0.0.1:{port}",
        BROKER_LEASE_HEARTBEAT_S="60",
    )  # fmt: skip
    # The agents phone home to a web process of its own, as in production (gunicorn, docs/DEPLOY.md), not to a
    # server in this process: their requests would take this process's GIL from the orders being timed.
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "broker.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", "2", "--threads", "4", "--log-level", "warning"],
        cwd=ROOT,
    )  # fmt: skip
    try:
        _until_serving(web, port)
        with sandboxes_serving("bench-boot-sandbox.json", only="aws", boot_delay_s=BOOT_DELAY_S) as specs:
            return _bench(args.runs, specs[0])
    finally:
        web.terminate()
        web.wait(timeout=30)


def _until_serving(web: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        if web.poll() is not None:
            raise SystemExit(f"the broker's web process exited ({web.returncode})")
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=20).status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or still loading the app
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the broker's web process did not answer /healthz within 60 s")
        time.sleep(0.2)


def _bench(runs: int, spec: object) -> int:
    import boto3
    from botocore.config import Config
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from bench.breakdown import Breakdown, Tally
    from bench.sync import RAISED_AWS_LIMITS, tag_specifications
    from marketplace.catalog.services import offers_sync
    from marketplace.launch.config import LaunchChoice
    from marketplace.launch.keys import ssh_key_add
    from marketplace.models import (
        Instance,
        Lease,
        Membership,
        Offer,
        Order,
        OrderState,
        Organization,
        OrganizationKind,
        Role,
    )
    from marketplace.orders.launching import Step, order_provision
    from marketplace.orders.readiness import order_poll
    from marketplace.orders.services import PlaceRequest, order_place
    from providers.models import Provider, ProviderAccount
    from providers.sshkeys import ssh_key_parse

    region = "us-east-1"
    ProviderAccount.objects.update(enabled=False)  # only this run's account on sale
    provider = Provider.objects.create(name=f"bench boot {uuid.uuid4().hex[:6]}")
    account = ProviderAccount(provider=provider, kind="aws", name="aws-bench", endpoint_url=spec.endpoint_url,
                              regions=[region], options=RAISED_AWS_LIMITS)  # type: ignore[attr-defined]  # fmt: skip
    account.set_credentials(spec.credentials)  # type: ignore[attr-defined]
    account.save()
    offers_sync(account_id=account.pk)
    # Invoiced terms: the bench measures provisioning, not payment (a prepaid buyer would first need credit).
    org = Organization.objects.create(
        name=f"bench buyer {uuid.uuid4().hex[:6]}", kind=OrganizationKind.BUYER, payment_terms="invoiced"
    )
    user = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    Membership.objects.create(user=user, organization=org, role=Role.OWNER)
    public_key = _public_key()
    ssh_key_add(organization=org, user=user, public_key=public_key)
    offer = Offer.objects.filter(account=account, instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
        "price_usd", "id"
    )[0]
    launch = LaunchChoice(
        data={
            "workload": {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000],
                         "env": [{"name": "HF_TOKEN", "value": "hf_bench", "secret": True}]},
            "allowed_cidrs": ["198.51.100.0/24"],
        }
    )  # fmt: skip
    ec2 = boto3.client(
        "ec2", endpoint_url=spec.endpoint_url, region_name=region,  # type: ignore[attr-defined]
        aws_access_key_id=spec.credentials["access_key_id"],  # type: ignore[attr-defined]
        aws_secret_access_key=spec.credentials["secret_access_key"],  # type: ignore[attr-defined]
        config=Config(retries={"max_attempts": 1}),
    )  # fmt: skip
    ssm = boto3.client(
        "ssm", endpoint_url=spec.endpoint_url, region_name=region,  # type: ignore[attr-defined]
        aws_access_key_id=spec.credentials["access_key_id"],  # type: ignore[attr-defined]
        aws_secret_access_key=spec.credentials["secret_access_key"],  # type: ignore[attr-defined]
    )  # fmt: skip
    from providers.aws import launching

    breakdown = Breakdown()

    def broker_run() -> tuple[float, float, float, float, Tally]:
        started = time.perf_counter()
        with breakdown.measuring() as tally:
            request = PlaceRequest(offer_id=offer.pk, launch=launch)
            order = order_place(organization=org, user=user, request=request).order
            step = order_provision(order_id=order.pk)
            while step == Step.POLL:
                step = order_poll(order_id=order.pk)
        provider_running = time.perf_counter()
        deadline = time.monotonic() + 60
        while Order.objects.filter(pk=order.pk).values_list("state", flat=True).get() != OrderState.RUNNING:
            if time.monotonic() > deadline:
                raise AssertionError(f"order {order.public_id} never became ready")
            time.sleep(0.005)
        ready = time.perf_counter()
        lease = Lease.objects.get(order=order)
        assert lease.claimed_at is not None and lease.ready_at is not None
        protocol = (lease.ready_at - lease.claimed_at).total_seconds()
        return provider_running - started, ready - provider_running, ready - started, protocol, tally

    def same_size_script(instance_id: str) -> str:
        """A script as long as the boot script the broker launched ``instance_id`` with, but one no agent boots
        from (the sandbox's machine would phone home with a token already claimed)."""
        wire = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        size = len(base64.b64decode(wire["UserData"]["Value"]))
        script = "#!/bin/bash\n"
        return script + "#" * (size - len(script) - 1) + "\n"

    def tagged(ref: str, *kinds: str, **more: str) -> list[dict[str, Any]]:
        return tag_specifications("broker:order", ref, *kinds, **more)

    def sdk_run() -> tuple[float, Tally]:
        with breakdown.measuring() as tally:
            _sdk_launch()
        return tally.total_s, tally

    def _sdk_launch() -> None:
        ref = f"ord-{uuid.uuid4().hex}"
        image = ssm.get_parameter(Name=launching.DLAMI_PARAMETER)["Parameter"]["Value"]
        ec2.describe_images(ImageIds=[image])
        ec2.import_key_pair(KeyName=f"broker-{ref}", PublicKeyMaterial=public_key.encode(),
                            TagSpecifications=tagged(ref, "key-pair"))  # fmt: skip
        group = ec2.create_security_group(
            GroupName=f"broker-{ref}", Description="bench", TagSpecifications=tagged(ref, "security-group")
        )["GroupId"]
        ec2.authorize_security_group_ingress(
            GroupId=group,
            IpPermissions=[{"IpProtocol": "tcp", "FromPort": p, "ToPort": p,
                            "IpRanges": [{"CidrIp": "198.51.100.0/24"}]} for p in (22, 8000)],
            TagSpecifications=tagged(ref, "security-group-rule"),
        )  # fmt: skip
        reservation = ec2.run_instances(
            ImageId=image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1, KeyName=f"broker-{ref}",
            SecurityGroupIds=[group], UserData=user_data, ClientToken=ref[:64],
            Placement={"AvailabilityZone": offer.zone},
            TagSpecifications=tagged(ref, "instance", "volume", **{"broker:attempt": "1"}),
        )  # fmt: skip
        instance_id = reservation["Instances"][0]["InstanceId"]
        while True:
            found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
            if found["State"]["Name"] == "running":
                return

    assert ssh_key_parse(public_key)
    print(
        f"{runs} runs; g4dn.xlarge in {offer.zone}, a container with a secret and two ports; "
        f"{timezone.now():%Y-%m-%d}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"goal: order to the provider's running within {GOAL_RATIO}x boto3 alone making the same calls")
    broker_run()  # unmeasured: the first order builds the SDK clients both sides then reuse
    user_data = same_size_script(Instance.objects.latest("pk").provider_instance_id)
    sdk_run()
    broker_rows, sdk, sdk_summed = [], [], Tally()
    for _ in range(runs):
        broker_rows.append(broker_run())
        seconds, tally = sdk_run()
        sdk.append(seconds)
        sdk_summed.add(tally)
    launch_s = statistics.median(r[0] for r in broker_rows)
    boot_s = statistics.median(r[1] for r in broker_rows)
    total_s = statistics.median(r[2] for r in broker_rows)
    protocol_s = statistics.median(r[3] for r in broker_rows)
    summed = Tally()
    for row in broker_rows:
        summed.add(row[4])
    sdk_s = statistics.median(sdk)
    ratio = launch_s / sdk_s
    verdict = "met" if ratio <= GOAL_RATIO else "not met"
    print(f"order to the provider's running: broker {launch_s * 1000:.0f} ms, boto3 alone {sdk_s * 1000:.0f} ms, "
          f"broker/SDK = {ratio:.2f} (+{(launch_s - sdk_s) * 1000:.0f} ms): <= {GOAL_RATIO}x {verdict}")  # fmt: skip
    alone = sdk_summed.per(runs)
    print(f"    boto3 alone per order (mean): {alone.sdk_calls:.1f} calls, {alone.sdk_s * 1000:.1f} ms")
    print("    where the broker's time goes, per order (mean):")
    for line in summed.per(runs).lines():
        print(f"      {line}")
    print(
        f"the boot, provider's running to ready: {boot_s * 1000:.0f} ms, of which the simulated machine's start "
        f"{BOOT_DELAY_S * 1000:.0f} ms (the agent's claim to ready: {protocol_s * 1000:.0f} ms over HTTP)"
    )
    print(
        f"order to ready: {total_s * 1000:.0f} ms, {(total_s - BOOT_DELAY_S) * 1000:.0f} ms without the simulated start"
    )
    print(f"goal (order to the provider's running, <= {GOAL_RATIO}x boto3 alone): {verdict} ({ratio:.2f}x); "
          f"load average at the end {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


def _public_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


if __name__ == "__main__":
    raise SystemExit(main())
