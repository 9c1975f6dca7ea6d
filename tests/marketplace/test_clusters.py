"""Jobs that span machines (issue 20, point 4): a cluster of N instances of one offer is placed, launched and
ended as one unit, all or nothing, and fails over as a whole group.

The AWS sandbox is moto's EC2 behind the real boto3 adapter; a capacity fault answers RunInstances with
``InsufficientInstanceCapacity``, the code AWS documents for a zone out of an instance type (EC2 API
reference, "Error codes": https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
"""

from __future__ import annotations

from decimal import Decimal

import boto3
import pytest
from django.db import connection

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Cluster, ClusterState, Instance, Offer, Order, OrderState
from marketplace.orders.clusters import ClusterRequest, cluster_advance, cluster_place, cluster_terminate
from marketplace.orders.errors import OfferNotOrderable
from marketplace.orders.launching import order_provision
from marketplace.orders.running import order_check_running
from providers.services import adapter_for_account
from tests.conftest import AWS_TEST_CREDENTIALS
from tests.leases import LAUNCH, boot_if_launched
from tests.races import race_same

pytestmark = pytest.mark.django_db

INSTANCE_TYPE = "g5.12xlarge"  # 4x A10G


def _offers(account) -> list[Offer]:
    offers = account.offers.filter(instance_type=INSTANCE_TYPE, pricing_model="on_demand", region="us-east-1")
    return list(offers.order_by("price_usd", "zone"))


def _place(acme, alice, offer, nodes=2, **kw):
    request = ClusterRequest(offer_id=offer.pk, nodes=nodes, launch=LAUNCH, **kw)
    return cluster_place(organization=acme, user=alice, request=request).cluster


def _members(cluster, round_no=None) -> list[Order]:
    orders = Order.objects.filter(cluster=cluster).order_by("cluster_round", "cluster_node")
    return list(orders if round_no is None else orders.filter(cluster_round=round_no))


def _boot_all(cluster, sandbox, capture) -> None:
    for order in _members(cluster, Cluster.objects.get(pk=cluster.pk).round):
        with capture(execute=True):
            boot_if_launched(order, sandbox)


def _running_at_aws(account, order: Order) -> list[str]:
    return [
        h.instance_id for h in adapter_for_account(account).find_by_order(order.ref) if h.state.value != "terminated"
    ]


def test_a_cluster_runs_once_every_node_is_usable_and_all_nodes_share_one_zone(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    assert offer.gpu_count == 4

    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=3, max_price_per_node_hour=offer.price_usd * 2)

    # Launched, not yet usable: the group is still provisioning while its agents have not reported
    cluster.refresh_from_db()
    assert cluster.state == ClusterState.PROVISIONING
    nodes = _members(cluster)
    assert [o.cluster_node for o in nodes] == [1, 2, 3]
    assert all(not o.allow_failover and o.offer_id == offer.pk for o in nodes)

    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)

    cluster.refresh_from_db()
    assert cluster.state == ClusterState.RUNNING, cluster.state_reason
    live = Instance.objects.filter(order__cluster=cluster, active=True)
    assert live.count() == 3
    assert {i.zone for i in live} == {offer.zone}
    assert {i.instance_type for i in live} == {INSTANCE_TYPE}
    kinds = list(
        LedgerEntry.objects.filter(subject=f"cluster:{cluster.public_id}").order_by("id").values_list("kind", flat=True)
    )
    assert kinds == ["cluster.placed", "cluster.round_started", "cluster.running"]
    assert ledger_verify().ok


def test_a_node_that_cannot_launch_takes_the_group_to_another_zone_and_leaves_nothing_running(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    first, *others = _offers(aws_account)
    assert others, "the sandbox sells the instance type in more than one zone"
    with django_capture_on_commit_callbacks(execute=False):  # provisioning is driven step by step below
        cluster = _place(acme, alice, first, nodes=2, max_price_per_node_hour=first.price_usd * 2)
    node1, node2 = _members(cluster)

    # Node 1 launches; then the zone runs out of the type and node 2's launch is refused
    with django_capture_on_commit_callbacks(execute=False):
        order_provision(order_id=node1.pk)
    launched = _running_at_aws(aws_account, node1)
    assert len(launched) == 1
    aws_sandbox.faults.inject("capacity", instance_type=INSTANCE_TYPE, zone=first.zone)
    with django_capture_on_commit_callbacks(execute=True):
        order_provision(order_id=node2.pk)

    # Then the half-launched round is stopped and the whole group goes to another zone
    cluster.refresh_from_db()
    assert cluster.round == 2 and cluster.offer.zone != first.zone
    node1.refresh_from_db()
    node2.refresh_from_db()
    assert node2.state == OrderState.FAILED
    assert node1.state == OrderState.TERMINATED, node1.state_reason
    assert _running_at_aws(aws_account, node1) == []  # the machine of node 1 is gone at the provider
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)
    cluster.refresh_from_db()
    assert cluster.state == ClusterState.RUNNING, cluster.state_reason
    live = Instance.objects.filter(order__cluster=cluster, active=True)
    assert sorted(i.order.cluster_round for i in live) == [2, 2]
    assert {i.zone for i in live} == {cluster.offer.zone}
    assert ledger_verify().ok


def test_a_running_cluster_that_loses_a_node_is_provisioned_again_whole(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, max_price_per_node_hour=offer.price_usd * 2)
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)
    node1, node2 = _members(cluster)
    assert Cluster.objects.get(pk=cluster.pk).state == ClusterState.RUNNING

    # The provider takes node 2's machine (as a spot reclaim or a host failure would)
    lost = node2.instances.get(active=True)
    ec2 = boto3.client("ec2", region_name=lost.region, endpoint_url=aws_sandbox.url, **_boto_keys())
    ec2.terminate_instances(InstanceIds=[lost.provider_instance_id])
    with django_capture_on_commit_callbacks(execute=True):
        order_check_running(order_id=node2.pk)

    # Then node 1 is stopped too and the group starts again on another offer, every node new
    cluster.refresh_from_db()
    node1.refresh_from_db()
    assert node1.state == OrderState.TERMINATED
    assert _running_at_aws(aws_account, node1) == []
    assert cluster.round == 2 and cluster.state == ClusterState.PROVISIONING
    assert len(_members(cluster, 2)) == 2
    assert ledger_verify().ok


def test_terminating_a_cluster_ends_every_node_and_then_the_cluster(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, max_price_per_node_hour=offer.price_usd * 2)
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)

    with django_capture_on_commit_callbacks(execute=True):
        cluster_terminate(cluster=cluster)

    cluster.refresh_from_db()
    assert cluster.state == ClusterState.TERMINATED
    assert all(o.state == OrderState.TERMINATED for o in _members(cluster))
    assert all(_running_at_aws(aws_account, o) == [] for o in _members(cluster))
    # Idempotent: ending it again, or advancing it, changes nothing
    assert cluster_terminate(cluster=cluster).state == ClusterState.TERMINATED
    assert cluster_advance(cluster_id=cluster.pk) == "ended"
    assert ledger_verify().ok


def test_one_node_reaching_its_scheduled_end_ends_the_whole_cluster(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, max_price_per_node_hour=offer.price_usd * 2)
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)
    node1, _ = _members(cluster)

    from marketplace.orders.services import order_terminate

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=node1, reason="scheduled end: ran the requested 1 h")

    cluster.refresh_from_db()
    assert cluster.state == ClusterState.TERMINATED
    assert "node 1 ended: scheduled end" in cluster.state_reason
    assert all(o.state == OrderState.TERMINATED for o in _members(cluster))


def test_without_failover_a_failed_node_fails_the_cluster_and_stops_the_rest(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    aws_sandbox.faults.inject("capacity", instance_type=INSTANCE_TYPE, zone=offer.zone)
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, allow_failover=False)

    cluster.refresh_from_db()
    assert cluster.state == ClusterState.FAILED
    assert "failover was not allowed" in cluster.state_reason
    assert all(o.state in Order.FINAL_STATES for o in _members(cluster))
    assert Instance.objects.filter(order__cluster=cluster, active=True).count() == 0
    assert Cluster.objects.get(pk=cluster.pk).round == 1


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("capacity", "ask for at most 1 nodes"),
        ("rdma", "drop the RDMA requirement"),
        ("one node", "at least 2 nodes"),
        ("cap", "above your cap"),
    ],
)
def test_a_cluster_its_offer_cannot_hold_is_refused_and_nothing_is_written(
    acme, alice, aws_account, aws_sandbox, setup, message
):
    offer = _offers(aws_account)[0]
    kw: dict[str, object] = {"nodes": 2}
    if setup == "capacity":
        Offer.objects.filter(pk=offer.pk).update(capacity=1)
    elif setup == "rdma":
        kw["needs_rdma"] = True  # g5.12xlarge has no EFA
    elif setup == "one node":
        kw["nodes"] = 1
    elif setup == "cap":
        kw["max_price_per_node_hour"] = offer.price_usd - Decimal("0.01")
    entries = LedgerEntry.objects.count()

    with pytest.raises(Exception, match=message) as refused:
        cluster_place(organization=acme, user=alice, request=ClusterRequest(offer_id=offer.pk, launch=LAUNCH, **kw))

    assert isinstance(refused.value, OfferNotOrderable) or setup == "one node"
    assert (Cluster.objects.count(), Order.objects.count(), LedgerEntry.objects.count()) == (0, 0, entries)


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_TEST_CREDENTIALS["access_key_id"],
        "aws_secret_access_key": AWS_TEST_CREDENTIALS["secret_access_key"],
    }


@pytest.mark.django_db(transaction=True)
def test_two_coordinators_racing_on_a_failed_round_start_the_next_round_once(acme, alice, aws_account, aws_sandbox):
    """Two workers advance the same cluster at once after a node failed (each node's change enqueues one):
    the cluster's row lock makes one of them start round 2 and the other find it started."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    cluster = _cluster_with_a_failed_node(acme, alice, aws_account)
    answers, errors = race_same(2, lambda: cluster_advance(cluster_id=cluster.pk))

    assert errors == []
    assert "failed-over" in answers and answers.count("failed-over") == 1
    cluster.refresh_from_db()
    assert cluster.round == 2
    assert Order.objects.filter(cluster=cluster, cluster_round=2).count() == 2
    assert Order.objects.get(cluster=cluster, cluster_round=1, cluster_node=2).state == OrderState.CANCELLED


def _cluster_with_a_failed_node(acme, alice, aws_account) -> Cluster:
    """A 2-node cluster in round 1 whose node 1 failed and whose coordinator has not run yet (its task lost,
    or two of them about to run): the rows as the order machinery leaves them."""
    from django.utils import timezone

    from marketplace.launch.config import launch_configuration_create

    offer = _offers(aws_account)[0]
    now = timezone.now()
    config = launch_configuration_create(organization=acme, user=alice, choice=LAUNCH)
    cluster = Cluster.objects.create(
        organization=acme, created_by=alice, offer=offer, nodes=2, gpu_model=offer.gpu_model, gpu_count=4,
        pricing_model="on_demand", max_price_per_node_hour=offer.price_usd * 2, launch_config=config,
        state_changed_at=now,
    )  # fmt: skip
    for node, state in ((1, OrderState.FAILED), (2, OrderState.PLACED)):
        Order.objects.create(
            organization=acme, created_by=alice, offer=offer, gpu_model=offer.gpu_model, gpu_count=4,
            pricing_model="on_demand", max_price_per_hour=offer.price_usd, allow_failover=False,
            price_per_hour=offer.price_usd, state=state, state_reason="launch refused", state_changed_at=now,
            launch_config=config, cluster=cluster, cluster_round=1, cluster_node=node,
        )  # fmt: skip
    return cluster


def test_the_minute_sweep_moves_on_a_cluster_whose_coordinator_task_was_lost(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    from marketplace.tasks import orders_sweep_task

    cluster = _cluster_with_a_failed_node(acme, alice, aws_account)

    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task()

    cluster.refresh_from_db()
    assert cluster.round == 2 and cluster.state == ClusterState.PROVISIONING
    assert Order.objects.get(cluster=cluster, cluster_round=1, cluster_node=2).state == OrderState.CANCELLED
    assert sorted(Order.objects.filter(cluster=cluster, cluster_round=2).values_list("cluster_node", flat=True)) == [
        1,
        2,
    ]


# --- Cluster placement groups ------------------------------------------------------------------------------
# A cluster asking for one launches each round's nodes into a cluster placement group of that round (EC2 API
# reference, RunInstances Placement.GroupName:
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Placement.html), deleted once the round's
# machines are terminated (DeletePlacementGroup, "You must terminate all instances in the placement group
# before you can delete the placement group":
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeletePlacementGroup.html).


def _placement_groups_at_aws(sandbox, region="us-east-1") -> list[str]:
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=sandbox.url, **_boto_keys())
    return sorted(g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"])


def _groups_of_instances(sandbox, cluster, round_no) -> dict[str, str]:
    """Each live node instance of the round -> the placement group AWS says it is in."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=sandbox.url, **_boto_keys())
    ids = [
        i.provider_instance_id for i in Instance.objects.filter(order__cluster=cluster, order__cluster_round=round_no)
    ]
    found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["Placement"]["GroupName"] for r in found for i in r["Instances"]}


def _cluster_kinds(cluster) -> list[str]:
    entries = LedgerEntry.objects.filter(subject=f"cluster:{cluster.public_id}").order_by("id")
    return list(entries.values_list("kind", flat=True))


def test_a_placement_group_cluster_launches_every_node_into_its_group_and_deletes_it_once_ended(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    from marketplace.orders.clusters import clusters_to_advance

    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=3, placement_group=True, max_price_per_node_hour=offer.price_usd * 2)
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)

    # Every node runs in the round's group, which exists at AWS as a cluster group tagged as the broker's
    cluster.refresh_from_db()
    assert cluster.state == ClusterState.RUNNING, cluster.state_reason
    group = f"gb-{cluster.public_id.hex}-r1"
    placed = _groups_of_instances(aws_sandbox, cluster, 1)
    assert len(placed) == 3 and set(placed.values()) == {group}
    assert _placement_groups_at_aws(aws_sandbox) == [group]

    with django_capture_on_commit_callbacks(execute=True):
        cluster_terminate(cluster=cluster)

    # Then the group is gone with the machines, and the sweep has nothing left to do for the cluster
    cluster.refresh_from_db()
    assert (cluster.state, cluster.placement_groups_released) == (ClusterState.TERMINATED, 1)
    assert _placement_groups_at_aws(aws_sandbox) == []
    assert cluster.pk not in clusters_to_advance()
    assert _cluster_kinds(cluster)[-2:] == ["cluster.terminated", "cluster.placement_group_deleted"]
    assert len(aws_sandbox.calls("DeletePlacementGroup")) == 1
    # Advancing it again deletes nothing twice
    assert cluster_advance(cluster_id=cluster.pk) == "ended"
    assert len(aws_sandbox.calls("DeletePlacementGroup")) == 1
    assert ledger_verify().ok


def test_a_failed_round_loses_its_group_and_the_next_round_gets_its_own(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    first, *_ = _offers(aws_account)
    with django_capture_on_commit_callbacks(execute=False):
        cluster = _place(acme, alice, first, nodes=2, placement_group=True, max_price_per_node_hour=first.price_usd * 2)
    node1, node2 = _members(cluster)
    with django_capture_on_commit_callbacks(execute=False):
        order_provision(order_id=node1.pk)
    round1 = f"gb-{cluster.public_id.hex}-r1"
    assert _placement_groups_at_aws(aws_sandbox) == [round1]

    # Node 2 cannot launch: round 1 fails, node 1 is stopped and the group goes to another zone
    aws_sandbox.faults.inject("capacity", instance_type=INSTANCE_TYPE, zone=first.zone)
    with django_capture_on_commit_callbacks(execute=True):
        order_provision(order_id=node2.pk)

    cluster.refresh_from_db()
    assert cluster.round == 2 and cluster.offer.zone != first.zone
    round2 = f"gb-{cluster.public_id.hex}-r2"
    # Round 1's group went once node 1's machine was terminated; round 2's nodes are in a group of their own
    assert _placement_groups_at_aws(aws_sandbox) == [round2]
    assert cluster.placement_groups_released == 1
    assert set(_groups_of_instances(aws_sandbox, cluster, 2).values()) == {round2}
    assert {i.zone for i in Instance.objects.filter(order__cluster=cluster, order__cluster_round=2)} == {
        cluster.offer.zone
    }

    with django_capture_on_commit_callbacks(execute=True):
        cluster_terminate(cluster=cluster)
    cluster.refresh_from_db()
    assert (cluster.state, cluster.placement_groups_released) == (ClusterState.TERMINATED, 2)
    assert _placement_groups_at_aws(aws_sandbox) == []
    assert ledger_verify().ok


def test_a_group_still_in_use_when_the_cluster_ends_is_deleted_by_the_minute_sweep(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    from marketplace.orders.clusters import clusters_to_advance
    from marketplace.tasks import orders_sweep_task

    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, placement_group=True, max_price_per_node_hour=offer.price_usd * 2)
    _boot_all(cluster, aws_sandbox, django_capture_on_commit_callbacks)
    group = f"gb-{cluster.public_id.hex}-r1"
    # Something else still holds the group when the nodes stop (as a machine still shutting down would)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_sandbox.url, **_boto_keys())
    image = ec2.describe_images()["Images"][0]["ImageId"]
    straggler = ec2.run_instances(
        ImageId=image, InstanceType=INSTANCE_TYPE, MinCount=1, MaxCount=1,
        Placement={"AvailabilityZone": offer.zone, "GroupName": group},
    )["Instances"][0]["InstanceId"]  # fmt: skip

    with django_capture_on_commit_callbacks(execute=True):
        cluster_terminate(cluster=cluster)

    # The cluster ended, but AWS refused to delete the group in use: it is kept for the sweep
    cluster.refresh_from_db()
    assert (cluster.state, cluster.placement_groups_released) == (ClusterState.TERMINATED, 0)
    assert _placement_groups_at_aws(aws_sandbox) == [group]
    assert cluster.pk in clusters_to_advance()

    ec2.terminate_instances(InstanceIds=[straggler])
    with django_capture_on_commit_callbacks(execute=True):
        orders_sweep_task()

    cluster.refresh_from_db()
    assert cluster.placement_groups_released == 1
    assert _placement_groups_at_aws(aws_sandbox) == []
    assert cluster.pk not in clusters_to_advance()
    assert _cluster_kinds(cluster).count("cluster.placement_group_deleted") == 1


def test_a_cluster_without_a_placement_group_launches_outside_any(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    with django_capture_on_commit_callbacks(execute=True):
        cluster = _place(acme, alice, offer, nodes=2, max_price_per_node_hour=offer.price_usd * 2)

    assert set(_groups_of_instances(aws_sandbox, cluster, 1).values()) == {""}
    assert aws_sandbox.calls("CreatePlacementGroup") == []
    with django_capture_on_commit_callbacks(execute=True):
        cluster_terminate(cluster=cluster)
    assert aws_sandbox.calls("DeletePlacementGroup") == []


def test_a_placement_group_on_an_offer_whose_provider_cannot_pack_nodes_is_refused(acme, alice, tencent_account):
    offer = tencent_account.offers.filter(pricing_model="on_demand").order_by("price_usd", "id").first()
    entries = LedgerEntry.objects.count()

    with pytest.raises(OfferNotOrderable, match="drop the placement-group requirement"):
        cluster_place(
            organization=acme,
            user=alice,
            request=ClusterRequest(offer_id=offer.pk, nodes=2, placement_group=True, launch=LAUNCH),
        )

    assert (Cluster.objects.count(), Order.objects.count(), LedgerEntry.objects.count()) == (0, 0, entries)


def test_the_fingerprint_of_a_request_without_a_placement_group_is_what_it_was_before():
    """Clusters stored before placement groups keep matching a retry of their request (Idempotency-Key)."""
    import hashlib
    import hmac
    import json

    from django.conf import settings

    request = ClusterRequest(offer_id=7, nodes=2, regions=("us-east-1",))
    before = {
        "offer": 7, "quote": None, "nodes": 2, "cap": None, "allow_failover": True, "regions": ["us-east-1"],
        "needs_rdma": False, "duration_hours": None, "launch": None,
    }  # fmt: skip
    message = json.dumps(before, sort_keys=True, default=str).encode()

    assert request.fingerprint() == hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()
    packed = ClusterRequest(offer_id=7, nodes=2, regions=("us-east-1",), placement_group=True)
    assert packed.fingerprint() != request.fingerprint()


@pytest.mark.django_db(transaction=True)
def test_two_calls_racing_to_release_a_group_delete_it_and_record_it_once(acme, alice, aws_account, aws_sandbox):
    """The sweep and a node's last transition may both release an ended cluster's group at once: the
    conditional update on ``placement_groups_released`` lets one of them record it."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    from marketplace.orders.clusters import cluster_placement_groups_release

    cluster = _cluster_with_a_failed_node(acme, alice, aws_account)
    Cluster.objects.filter(pk=cluster.pk).update(placement_group=True, state=ClusterState.FAILED)
    Order.objects.filter(cluster=cluster).update(state=OrderState.CANCELLED)
    group = f"gb-{cluster.public_id.hex}-r1"
    ec2 = boto3.client("ec2", region_name=cluster.offer.region, endpoint_url=aws_sandbox.url, **_boto_keys())
    ec2.create_placement_group(GroupName=group, Strategy="cluster")
    released, errors = race_same(2, lambda: cluster_placement_groups_release(cluster_id=cluster.pk))

    assert errors == []
    assert sorted(released) == [[], [group]]
    assert Cluster.objects.get(pk=cluster.pk).placement_groups_released == 1
    assert _placement_groups_at_aws(aws_sandbox, cluster.offer.region) == []
    assert _cluster_kinds(cluster) == ["cluster.placement_group_deleted"]
