"""/api/v1/clusters: placing, reading and ending a multi-node job, and quotes that price one (issue 20, point 4)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from ledger.services import ledger_sequence
from marketplace.api.clusters import ClusterNodeOutput, ClusterOutput
from marketplace.models import Cluster, ClusterState, Offer, Order, OrderState
from tests.leases import boot_if_launched
from tests.marketplace.test_clusters import INSTANCE_TYPE, _offers

pytestmark = pytest.mark.django_db


def _api(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_a_buyer_places_reads_and_ends_a_cluster_and_a_stranger_sees_none_of_it(
    acme, alice, charlie, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    offer = _offers(aws_account)[0]
    api = _api(alice)
    body = {"offer": offer.pk, "nodes": 2, "launch": {"allowed_cidrs": ["127.0.0.1/32"]}}

    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/clusters", body, format="json", HTTP_IDEMPOTENCY_KEY="c-1")
    assert placed.status_code == 201, placed.json()
    cluster = placed.json()
    assert (cluster["nodes"], cluster["gpus_per_node"], cluster["instance_type"]) == (2, 4, INSTANCE_TYPE)
    assert cluster["price_per_hour"] == format(offer.price_usd * 2, "f")
    assert [n["node"] for n in cluster["current_nodes"]] == [1, 2]
    # The answer is the shape the OpenAPI schema documents
    assert set(cluster) == set(ClusterOutput().fields)
    assert set(cluster["current_nodes"][0]) == set(ClusterNodeOutput().fields)
    ledger_sequence()  # the sequencer process's turn: the cluster's newest entry gets its hash
    assert api.get(f"/api/v1/clusters/{cluster['id']}").json()["ledger_head"]
    # A retry with the same key is the same cluster; each node is an order the buyer can read
    again = api.post("/api/v1/clusters", body, format="json", HTTP_IDEMPOTENCY_KEY="c-1")
    assert (again.status_code, again["Idempotent-Replayed"], again.json()["id"]) == (200, "true", cluster["id"])
    node = api.get(f"/api/v1/orders/{cluster['current_nodes'][0]['order']}").json()
    assert (node["cluster"], node["cluster_round"], node["cluster_node"]) == (cluster["id"], 1, 1)

    for order in Order.objects.filter(cluster__public_id=cluster["id"]):
        with django_capture_on_commit_callbacks(execute=True):
            boot_if_launched(order, aws_sandbox)
    shown = api.get(f"/api/v1/clusters/{cluster['id']}").json()
    assert shown["state"] == ClusterState.RUNNING
    assert all(n["public_ip"] and n["zone"] == offer.zone for n in shown["current_nodes"])

    stranger = _api(charlie)
    assert stranger.get(f"/api/v1/clusters/{cluster['id']}").status_code == 404
    assert stranger.post(f"/api/v1/clusters/{cluster['id']}/terminate").status_code == 404
    assert stranger.get("/api/v1/clusters").json()["results"] == []
    assert Cluster.objects.get(public_id=cluster["id"]).state == ClusterState.RUNNING

    assert [c["id"] for c in api.get("/api/v1/clusters").json()["results"]] == [cluster["id"]]
    with django_capture_on_commit_callbacks(execute=True):
        ended = api.post(f"/api/v1/clusters/{cluster['id']}/terminate")
    assert ended.status_code == 202
    assert api.get(f"/api/v1/clusters/{cluster['id']}").json()["state"] == ClusterState.TERMINATED


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"nodes": 1}, "nodes"),
        ({"nodes": 65}, "nodes"),
        ({}, "nodes"),
        ({"nodes": "2.5"}, "nodes"),
        ({"nodes": 2, "quote": "00000000-0000-0000-0000-000000000000"}, "offer"),
    ],
)
def test_bad_node_counts_are_refused_naming_the_field(acme, alice, aws_account, body, field):
    offer = _offers(aws_account)[0]

    answer = _api(alice).post("/api/v1/clusters", {"offer": offer.pk, **body}, format="json")

    assert answer.status_code == 400
    assert field in answer.json()["error"]["fields"]
    assert Cluster.objects.count() == 0 and Order.objects.count() == 0


def test_a_quote_for_two_nodes_prices_the_group_and_is_ordered_as_a_cluster_at_its_locked_price(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    api = _api(alice)
    demand = {"profile": "inference", "gpu_models": ["A10G"], "gpu_count": 4, "nodes": 2, "duration_hours": 3}

    quotes = api.post("/api/v1/quotes", demand, format="json").json()["quotes"]

    best = quotes[0]
    offer = Offer.objects.get(pk=best["offer"]["id"])
    assert offer.instance_type == INSTANCE_TYPE
    assert Decimal(best["price_per_hour"]) == offer.price_usd * 2
    # Two machines for three hours; the job's dollars add the risk that one of the two does not launch
    assert Decimal(best["total_price"]) == offer.price_usd * 6
    assert Decimal(best["job_cost"]) > Decimal(best["total_price"])
    assert best["reason"].startswith("2 nodes x 4x A10G")
    # Ordered as one machine, it is refused with where to order it
    refused = api.post("/api/v1/orders", {"quote": best["id"]}, format="json")
    assert refused.status_code == 409 and "/api/v1/clusters" in refused.json()["error"]["message"]

    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/clusters", {"quote": best["id"]}, format="json")

    assert placed.status_code == 201, placed.json()
    cluster = Cluster.objects.get(public_id=placed.json()["id"])
    assert (cluster.nodes, cluster.quote.public_id.hex) == (2, best["id"].replace("-", ""))
    nodes = list(Order.objects.filter(cluster=cluster))
    assert all(o.price_per_hour == Decimal(best["price_per_hour"]) / 2 for o in nodes)
    assert all(o.state in (OrderState.PROVISIONING, OrderState.RUNNING) for o in nodes)
    # A quote orders one cluster only
    assert api.post("/api/v1/clusters", {"quote": best["id"]}, format="json").status_code == 409


def test_a_placement_group_is_asked_for_shown_and_refused_where_the_provider_cannot_pack_nodes(
    acme, alice, aws_account, aws_sandbox, tencent_account, django_capture_on_commit_callbacks
):
    api = _api(alice)
    tencent = tencent_account.offers.filter(pricing_model="on_demand").order_by("price_usd", "id").first()

    # On a provider that makes no placement groups (Tencent Cloud here) the cluster is refused, naming the rule
    refused = api.post("/api/v1/clusters", {"offer": tencent.pk, "nodes": 2, "placement_group": True}, format="json")

    assert refused.status_code == 409, refused.json()
    assert "drop the placement-group requirement" in refused.json()["error"]["message"]
    assert Cluster.objects.count() == 0 and Order.objects.count() == 0

    # On AWS it is placed, and the cluster says it asked for one
    offer = _offers(aws_account)[0]
    body = {"offer": offer.pk, "nodes": 2, "placement_group": True, "launch": {"allowed_cidrs": ["127.0.0.1/32"]}}
    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/clusters", body, format="json")
    assert placed.status_code == 201, placed.json()
    assert placed.json()["placement_group"] is True
    assert Cluster.objects.get(public_id=placed.json()["id"]).placement_group is True
    listed = api.get("/api/v1/clusters").json()["results"][0]
    assert listed["placement_group"] is True


def test_a_quote_asking_for_a_placement_group_leaves_out_providers_that_cannot_pack_nodes(
    acme, alice, aws_account, tencent_account, django_capture_on_commit_callbacks
):
    api = _api(alice)
    demand = {"profile": "inference", "gpu_count": 1, "nodes": 2, "duration_hours": 1, "limit": 50}

    anywhere = api.post("/api/v1/quotes", demand, format="json").json()
    packed = api.post("/api/v1/quotes", {**demand, "placement_group": True}, format="json").json()

    assert {q["offer"]["provider"] for q in anywhere["quotes"]} >= {"aws", "tencent"}
    assert {q["offer"]["provider"] for q in packed["quotes"]} == {"aws"}
    assert packed["rejected"]["placement group"] > 0
    with django_capture_on_commit_callbacks(execute=False):
        placed = api.post("/api/v1/clusters", {"quote": packed["quotes"][0]["id"]}, format="json")
    assert placed.status_code == 201 and placed.json()["placement_group"] is True
