"""Benchmark: order to the provider's "running" through the AWS sandbox with 0, 1 and 3 sold-out zones, against
the SDK alone (bench/boot.py measures the rest of the wait: the boot, to ready).

    .venv/bin/python bench/provisioning.py [--runs 10] [--database postgres://postgres@127.0.0.1:5432/broker_bench_provisioning]

The broker's path is the real one minus the task queue: ``order_place``, then ``order_provision`` and
``order_poll`` until the provider runs the instance (the Celery tasks are thin wrappers around them; the order
runs once the machine's agent reports ready, which bench/boot.py measures), with the database,
the ledger, the failover ranking and the adapter. The baseline makes the same launches with boto3 directly
against the same sandbox, in the same run: ``run_instances`` zone after zone in the order the broker tried
them, then ``describe_instances`` until running. The ratio (broker / SDK) is the broker's overhead for
recording, ledgering and choosing. Capacity failures are injected per zone; blocks shared between orders
are off (``BLOCK_CAPACITY_S`` 0) so every run fails over the same number of times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_provisioning")
    args = parser.parse_args()

    from bench.sync import RAISED_AWS_LIMITS, django_on

    # The steps are called directly; the tasks order_place enqueues go nowhere (not to the dev server's queue).
    django_on(args.database, BROKER_BLOCK_CAPACITY_S="0", CELERY_BROKER_URL="memory://")
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from marketplace.catalog.services import offers_sync
    from marketplace.launch.config import LaunchChoice
    from marketplace.models import Membership, Offer, OrderState, Organization, OrganizationKind, Role
    from marketplace.orders.launching import Step, order_provision
    from marketplace.orders.readiness import order_poll
    from marketplace.orders.services import PlaceRequest, order_place
    from providers.models import Provider, ProviderAccount
    from sandboxes.demo import SANDBOX_ACCOUNTS, start_all

    # Its own database, and only this run's account on sale: failover must not wander to another seller.
    ProviderAccount.objects.update(enabled=False)
    sandbox = start_all(["aws"])["aws"]
    spec = SANDBOX_ACCOUNTS["aws"](sandbox)
    region = "us-east-1"
    provider = Provider.objects.create(name=f"bench provisioning {uuid.uuid4().hex[:6]}")
    account = ProviderAccount(
        provider=provider,
        kind="aws",
        name="aws-bench",
        endpoint_url=spec.endpoint_url,
        regions=[region],
        options=RAISED_AWS_LIMITS,
    )
    account.set_credentials(spec.credentials)
    account.save()
    offers_sync(account_id=account.pk)
    # Invoiced terms: the bench measures provisioning, not payment (a prepaid buyer would first need credit).
    org = Organization.objects.create(
        name=f"bench buyer {uuid.uuid4().hex[:6]}", kind=OrganizationKind.BUYER, payment_terms="invoiced"
    )
    user = get_user_model().objects.create_user(username=f"bench-{uuid.uuid4().hex[:8]}")
    Membership.objects.create(user=user, organization=org, role=Role.OWNER)
    # Just the machine, with a script for a workload so no key is needed.
    bare = LaunchChoice(
        data={"workload": {"kind": "script", "script": "#!/bin/bash\n"}, "allowed_cidrs": ["10.0.0.0/8"]}
    )
    offers = list(
        Offer.objects.filter(account=account, instance_type="g4dn.xlarge", pricing_model="on_demand").order_by(
            "price_usd", "id"
        )
    )

    ec2 = boto3.client(
        "ec2",
        endpoint_url=spec.endpoint_url,
        region_name=region,
        aws_access_key_id=spec.credentials["access_key_id"],
        aws_secret_access_key=spec.credentials["secret_access_key"],
        config=Config(retries={"max_attempts": 1}),
    )
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

    def broker_run(first: Offer) -> tuple[float, list[str]]:
        started = time.perf_counter()
        request = PlaceRequest(offer_id=first.pk, max_price_per_hour=first.price_usd, launch=bare)
        order = order_place(organization=org, user=user, request=request).order
        step = order_provision(order_id=order.pk)
        while step == Step.POLL:
            step = order_poll(order_id=order.pk)
        elapsed = time.perf_counter() - started
        order.refresh_from_db()
        assert order.state == OrderState.PROVISIONING and step == Step.WAIT, order.state_reason
        return elapsed, [a.offer.zone for a in order.attempts.select_related("offer")]

    def sdk_run(zones: list[str]) -> float:
        started = time.perf_counter()
        for zone in zones:
            try:
                reservation = ec2.run_instances(
                    ImageId=image,
                    InstanceType="g4dn.xlarge",
                    MinCount=1,
                    MaxCount=1,
                    Placement={"AvailabilityZone": zone},
                    ClientToken=uuid.uuid4().hex,
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] == "InsufficientInstanceCapacity":
                    continue
                raise
            instance_id = reservation["Instances"][0]["InstanceId"]
            while True:
                found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
                if found["State"]["Name"] == "running":
                    return time.perf_counter() - started
        raise AssertionError("the SDK baseline found no capacity")

    print(f"{args.runs} runs per scenario; g4dn.xlarge in {region}, {len(offers)} zones; {timezone.now():%Y-%m-%d}")
    for failures in (0, 1, 3):
        sandbox.faults.clear()
        for offer in offers[:failures]:
            sandbox.faults.inject("capacity", instance_type=offer.instance_type, zone=offer.zone)
        broker, sdk = [], []
        zones: list[str] = []
        for _ in range(args.runs):
            seconds, zones = broker_run(offers[0])
            broker.append(seconds)
            sdk.append(sdk_run(zones))
        b, s = statistics.median(broker), statistics.median(sdk)
        print(
            f"{failures} capacity failure(s): order to the provider's running {b * 1000:.0f} ms median "
            f"(attempts: {len(zones)}); "
            f"SDK alone {s * 1000:.0f} ms; broker/SDK = {b / s:.2f} (+{(b - s) * 1000:.0f} ms)"
        )
    sandbox.faults.clear()
    sandbox.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
