"""Orders on a Kubernetes seller's cluster (issue 37), end to end through the broker and the real `kubernetes`
client against the cluster sandbox: placed through the API, a namespace with a pod that asks for exactly its
GPUs, ready once the lease agent in the pod reports, telemetry, and nothing left in the cluster when it ends;
a pod no node can take fails over like a sold-out zone; concurrent orders never oversubscribe a node."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.services import ledger_verify
from marketplace.catalog.selectors import machine_pool, offer_views
from marketplace.models import Attempt, AttemptOutcome, LeaseHeartbeat, NodeHold, Offer, Order, OrderState
from marketplace.orders.cluster_telemetry import clusters_gpus_read
from marketplace.orders.reconcile import account_resources_reconcile
from marketplace.orders.selectors import order_telemetry
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.boot import lease_file_from_script
from providers.services import adapter_for_account
from providers.types import LaunchSpec, PricingModel
from tests.leases import LAUNCH, boot_if_launched, held_agent, running_order
from tests.providers.contract import contract_boot
from tests.races import race_same
from tests.storefront import order_from_the_page

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _offer(account, node: str, instance_type: str) -> Offer:
    return Offer.objects.get(account=account, zone=node, instance_type=instance_type, pricing_model="on_demand")


def _order_through_the_api(api, capture, offer: Offer, launch: dict | None = None) -> Order:
    body = {"offer": offer.pk, "max_price_per_hour": str(offer.price_usd + Decimal("0.5"))}
    if launch is not None:
        body["launch"] = launch
    with capture(execute=True):
        response = api.post("/api/v1/orders", body, format="json")
    assert response.status_code in (200, 201), response.json()
    return Order.objects.get(public_id=response.json()["id"])


def test_an_order_runs_in_a_pod_of_its_own_and_ends_with_nothing_left_in_the_cluster(
    api, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-2")

    order = boot_if_launched(_order_through_the_api(api, django_capture_on_commit_callbacks, offer), kubernetes_sandbox)

    assert order.state == OrderState.RUNNING, order.state_reason
    namespace = order.instance.provider_instance_id.split("/")[0]
    (pod,) = kubernetes_sandbox.pods(namespace)
    # The scheduler bound it to the offer's node and the device plugin gave it exactly its two GPUs.
    assert (pod.node, pod.phase, len(pod.devices)) == ("gpu-t4-0", "Running", 2)
    # Two of the node's four T4s are held for the order: a 4-GPU lease no longer fits there, two single ones do.
    attempt = Attempt.objects.get(order=order, outcome=AttemptOutcome.LAUNCHED)
    assert NodeHold.objects.get(attempt=attempt).units == 2
    assert _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-4").reserved == 1
    assert _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1").reserved == 2

    # The lease agent in the pod reports telemetry, as on every provider kind.
    assert held_agent(order, kubernetes_sandbox).heartbeat() == "running"
    now = timezone.now()
    telemetry = order_telemetry(order, since=now - dt.timedelta(hours=1), now=now)
    assert telemetry is not None and telemetry.latest is not None
    assert len(telemetry.latest.gpus) == 2  # the agent sees the pod's two GPUs

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert namespace not in kubernetes_sandbox.namespaces() or kubernetes_sandbox.pods(namespace) == []
    assert adapter_for_account(kubernetes_account).find_by_order(order.ref) == []
    assert not NodeHold.objects.filter(attempt=attempt).exists()
    assert _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-4").reserved == 0
    assert ledger_verify().ok


def test_an_order_from_the_storefront_runs_on_a_cluster_node(
    alice, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    client = Client()
    client.force_login(alice)
    offer = _offer(kubernetes_account, "gpu-a100-mig-0", "k8s-mig-1g.5gb")  # one MIG slice of an A100
    nonce = order_from_the_page(client, offer)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/orders/place", {"nonce": nonce})

    order = boot_if_launched(Order.objects.get(), kubernetes_sandbox)
    assert response.status_code == 302
    assert order.state == OrderState.RUNNING, order.state_reason
    (pod,) = kubernetes_sandbox.pods(order.instance.provider_instance_id.split("/")[0])
    assert (pod.node, pod.devices[0].rsplit(":", 1)[0]) == ("gpu-a100-mig-0", "nvidia.com/mig-1g.5gb")
    assert NodeHold.objects.get(attempt__order=order).resource == "nvidia.com/mig-1g.5gb"
    page = client.get(f"/orders/{order.public_id}/").content.decode()
    assert "k8s-mig-1g.5gb" in page and "gpu-a100-mig-0" in page


def test_a_pod_no_node_can_take_is_a_capacity_failure_and_the_order_fails_over(
    acme, alice, kubernetes_account, kubernetes_sandbox, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    first = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
    # Someone else's pods took the node's GPUs after the sync: the scheduler leaves the broker's pod Pending.
    kubernetes_sandbox.faults.inject("capacity", action="createPod", instance_type="nvidia.com/gpu", zone="gpu-t4-0")

    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=first.pk, max_price_per_hour=Decimal("1"), allow_failover=True
            ),
        ).order
    order = boot_if_launched(order, aws_sandbox)

    failed = Attempt.objects.get(order=order, number=1)
    assert failed.outcome == AttemptOutcome.FAILED
    assert failed.provider_code == "FailedScheduling", failed.provider_message
    assert "Insufficient nvidia.com/gpu" in failed.provider_message
    assert not NodeHold.objects.filter(attempt=failed).exists()
    assert kubernetes_sandbox.pods() == []  # nothing of the failed attempt is left in the cluster
    # The next-ranked T4 within the cap, on another provider kind, took the order.
    assert order.state == OrderState.RUNNING, order.state_reason
    assert order.instance.account_id == aws_account.pk


def test_an_image_that_cannot_be_pulled_is_the_buyers_error_named(
    api, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
    image = "registry.example/team/trainer:v9"
    kubernetes_sandbox.faults.inject("image_missing", action="image", instance_type=image)

    order = _order_through_the_api(
        api,
        django_capture_on_commit_callbacks,
        offer,
        launch={"workload": {"kind": "container", "image": image, "command": ["python3", "train.py"]}},
    )
    order.refresh_from_db()

    attempt = Attempt.objects.get(order=order, number=1)
    assert attempt.outcome == AttemptOutcome.FAILED
    assert attempt.provider_code in {"ErrImagePull", "ImagePullBackOff"}, attempt.provider_message
    assert image in attempt.provider_message
    assert kubernetes_sandbox.pods() == []
    assert not NodeHold.objects.filter(attempt__order=order).exists()


def test_a_container_without_its_command_is_refused_naming_the_field(
    api, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/v1/orders",
            {"offer": offer.pk, "launch": {"workload": {"kind": "container", "image": "vllm/vllm-openai:v0.6.3"}}},
            format="json",
        )

    assert response.status_code == 400
    assert "give the command" in response.json()["error"]["fields"]["launch.workload.command"][0]
    assert kubernetes_sandbox.namespaces() == ["default", "kube-node-lease", "kube-public", "kube-system"]
    assert not Order.objects.exists()


def test_a_container_runs_its_command_in_the_pod_kubernetes_made_of_its_image(
    acme, alice, kubernetes_account, kubernetes_sandbox
):
    """The pod is the buyer's image, and its boot script hands the lease agent the container's command as the
    process to run there, with the tools the agent needs installed where the image lacks them and the pod kept
    alive as long as the agent runs."""
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
    adapter = adapter_for_account(kubernetes_account)
    boot = contract_boot()
    spec = LaunchSpec(
        region=offer.region, zone=offer.zone, instance_type=offer.instance_type, pricing_model=PricingModel.ON_DEMAND,
        client_token="ord-inplace-a1", order_ref="ord-inplace", gpu_count=1, offer_extra=offer.extra, boot=boot,
    )  # fmt: skip

    script = adapter.user_data(spec)

    lease = lease_file_from_script(script)
    assert lease["workload"]["kind"] == "script"
    assert lease["workload"]["script"].endswith("exec python3 -m vllm.entrypoints.openai.api_server --model m\n")
    text = script.decode()
    assert "apt-get install" in text and "/usr/sbin/sshd" in text
    assert "docker" not in text  # no container runtime inside the pod
    assert text.rstrip().endswith("wait")
    handle = adapter.launch(spec)
    (pod,) = kubernetes_sandbox.pods(handle.instance_id.split("/")[0])
    assert pod.image == "vllm/vllm-openai:v0.6.3"


def test_the_reconciler_deletes_namespaces_of_orders_that_ended(
    acme, alice, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
    capture = django_capture_on_commit_callbacks
    order = running_order(acme, alice, offer, capture, kubernetes_sandbox, allow_failover=False)
    namespace = order.instance.provider_instance_id.split("/")[0]
    # The order ended in the broker, but its namespace's deletion never reached the cluster.
    Order.objects.filter(pk=order.pk).update(state=OrderState.TERMINATED)

    report = account_resources_reconcile(account_id=kubernetes_account.pk, now=timezone.now(), grace_s=0)

    assert report.errors == []
    assert namespace not in kubernetes_sandbox.namespaces() or kubernetes_sandbox.pods(namespace) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_orders_never_oversubscribe_a_node(acme, alice, kubernetes_account, kubernetes_sandbox):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")  # four T4s

    def place() -> int:
        return order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH,
                offer_id=offer.pk,
                max_price_per_hour=offer.price_usd + Decimal("1"),
                allow_failover=False,
            ),
        ).order.pk

    placed, errors = race_same(8, place)

    assert errors == []
    orders = [boot_if_launched(o, kubernetes_sandbox) for o in Order.objects.filter(pk__in=placed)]
    running = [o for o in orders if o.state == OrderState.RUNNING]
    assert len(running) == 4, [(o.state, o.state_reason) for o in orders]
    assert {o.state for o in orders} == {OrderState.RUNNING, OrderState.FAILED}
    pods = [p for p in kubernetes_sandbox.pods() if p.node == "gpu-t4-0"]
    assert len(pods) == 4
    assert sum(NodeHold.objects.filter(node__name="gpu-t4-0").values_list("units", flat=True)) == 4
    for order in running:
        order_terminate(order=order)
    assert NodeHold.objects.count() == 0
    assert ledger_verify().ok


def test_the_clusters_dcgm_exporter_measures_the_gpus_the_orders_pod_holds(
    api, client, alice, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    # dcgm-exporter's DCGM_FI_DEV_GPU_UTIL per GPU, labelled with the pod holding it
    # (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv).
    order = boot_if_launched(
        _order_through_the_api(
            api, django_capture_on_commit_callbacks, _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
        ),
        kubernetes_sandbox,
    )
    assert order.state == OrderState.RUNNING, order.state_reason
    (pod,) = kubernetes_sandbox.pods(order.instance.provider_instance_id.split("/")[0])
    kubernetes_sandbox.set_gpu_utilization("gpu-t4-0", int(pod.devices[0].rsplit(":", 1)[1]), 87)
    assert held_agent(order, kubernetes_sandbox).heartbeat() == "running"

    now = timezone.now()
    assert clusters_gpus_read(now=now) == {"accounts": 1, "recorded": 1, "errors": 0}

    beat = LeaseHeartbeat.objects.get(lease__order=order, source="dcgm")
    assert (beat.utilization_pct, len(beat.gpus)) == (Decimal("87.0"), 1)
    telemetry = order_telemetry(order, since=now - dt.timedelta(hours=1), now=now + dt.timedelta(seconds=1))
    assert telemetry is not None and telemetry.source == "dcgm"
    assert telemetry.latest == beat
    client.force_login(alice)
    page = client.get(f"/orders/{order.public_id}/").content.decode()
    assert "From the cluster's DCGM exporter" in page


def test_an_exporter_that_cannot_be_read_stops_no_other_account(
    kubernetes_account, kubernetes_sandbox, settings, caplog
):
    # A 503 from the exporter, as a proxy in front of it answers while it restarts.
    kubernetes_sandbox.faults.inject("throttle", action="dcgmMetrics", code="ServiceUnavailable")

    assert clusters_gpus_read(now=timezone.now()) == {"accounts": 0, "recorded": 0, "errors": 1}
    assert not LeaseHeartbeat.objects.filter(source="dcgm").exists()


def test_a_procurement_packs_demands_onto_a_nodes_free_gpus_and_no_more(
    acme, alice, alice_bearer, kubernetes_account, kubernetes_sandbox, django_capture_on_commit_callbacks
):
    # Given one of the T4 node's four GPUs taken by a running order
    offer = _offer(kubernetes_account, "gpu-t4-0", "k8s-gpu-1")
    capture = django_capture_on_commit_callbacks
    running = running_order(acme, alice, offer, capture, kubernetes_sandbox, allow_failover=False)
    assert NodeHold.objects.get(attempt__order=running).units == 1
    # The engine sees the node's whole-GPU sizes as one pool of its three free GPUs.
    pools = {
        (v.gpu_count, v.capacity_pool, v.pool_capacity)
        for v in offer_views(now=timezone.now())
        if v.offer_id in set(Offer.objects.filter(zone="gpu-t4-0").values_list("pk", flat=True))
    }
    assert pools == {(n, machine_pool(kubernetes_account.pk, "gpu-t4-0"), 3) for n in (1, 2, 4)}

    # When a buyer procures three pairs of T4 on the cluster's region
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=alice_bearer)
    demands = [
        {"id": f"pair{i}", "profile": "inference", "gpu_count": 2, "gpu_models": ["T4"], "regions": ["eu-central"]}
        for i in range(3)
    ]
    response = client.post(
        "/api/v1/procurements", data=json.dumps({"demands": demands, "time_limit": 2}), content_type="application/json"
    )

    # Then one pair fits the node's three free GPUs; the others wait, saying why
    assert response.status_code == 201, response.content
    body = response.json()
    planned = [a for a in body["assignments"] if a["quote"] is not None]
    assert len(planned) == 1, body["assignments"]
    assert len([a for a in body["assignments"] if a["quote"] is None]) == 2
