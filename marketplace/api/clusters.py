"""/api/v1/clusters: jobs that span machines, N nodes of one offer placed, launched and ended as one
(marketplace/orders/clusters.py). Each node is an order the buyer can also read at /api/v1/orders."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.selectors import latest_hashes
from marketplace.api import idempotency, pagination
from marketplace.api.launch import client_address
from marketplace.api.launch_schema import LaunchConfigurationField
from marketplace.api.tokens import request_organization
from marketplace.api.views import ERROR, launch_choice
from marketplace.matching.types import MAX_NODES
from marketplace.models import Cluster, Organization
from marketplace.numbers import MAX_ID, MAX_PRICE_PER_HOUR, DecimalSerializerField, IntegerSerializerField
from marketplace.orders.clusters import ClusterRequest, cluster_place, cluster_terminate
from marketplace.orders.selectors import BuyerPermission


class ClusterPlaceInput(serializers.Serializer):
    """Exactly one of ``offer`` (``nodes`` instances of it at its current price) or ``quote`` (a quote whose
    demand asked for several nodes, at the price it locked)."""

    offer = IntegerSerializerField(min_value=1, max_value=MAX_ID, required=False)
    quote = serializers.UUIDField(required=False)
    nodes = IntegerSerializerField(
        required=False, min_value=2, max_value=MAX_NODES, help_text="machines of the offer; a quote's demand says"
    )
    max_price_per_node_hour = DecimalSerializerField(
        required=False, max_digits=14, decimal_places=6, min_value=Decimal("0.000001"), max_value=MAX_PRICE_PER_HOUR
    )
    allow_failover = serializers.BooleanField(
        required=False, default=True, help_text="when a node fails, stop the others and try the whole group elsewhere"
    )
    regions = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=50
    )
    needs_rdma = serializers.BooleanField(
        required=False, default=False, help_text="InfiniBand/EFA/RDMA between the nodes, here and on failover"
    )
    placement_group = serializers.BooleanField(
        required=False,
        default=False,
        help_text="each round's nodes in one cluster placement group, packed close together (AWS offers only)",
    )
    duration_hours = DecimalSerializerField(
        required=False, max_digits=8, decimal_places=2, min_value=Decimal("0.01"), max_value=Decimal("8760")
    )
    launch = LaunchConfigurationField(required=False, help_text="every node's launch configuration (docs/BUYERS.md)")
    launch_template = serializers.CharField(required=False, max_length=80)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("offer" in attrs) == ("quote" in attrs):
            raise serializers.ValidationError({"offer": ["give exactly one of offer or quote"]})
        if "offer" in attrs and "nodes" not in attrs:
            raise serializers.ValidationError({"nodes": ["how many machines of the offer: from 2 to 64"]})
        return attrs


class ClusterNodeOutput(serializers.Serializer):
    order = serializers.UUIDField()
    round = serializers.IntegerField(allow_null=True)
    node = serializers.IntegerField(allow_null=True)
    state = serializers.CharField()
    state_reason = serializers.CharField()
    zone = serializers.CharField(allow_null=True)
    public_ip = serializers.CharField(allow_null=True)


class ClusterOutput(serializers.Serializer):
    """What ``cluster_output`` writes."""

    id = serializers.UUIDField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
    nodes = serializers.IntegerField()
    round = serializers.IntegerField()
    offer = serializers.IntegerField()
    instance_type = serializers.CharField()
    zone = serializers.CharField()
    quote = serializers.UUIDField(allow_null=True)
    gpu_model = serializers.CharField()
    gpus_per_node = serializers.IntegerField()
    pricing_model = serializers.CharField()
    regions = serializers.ListField(child=serializers.CharField())
    needs_rdma = serializers.BooleanField()
    placement_group = serializers.BooleanField()
    max_price_per_node_hour = serializers.CharField()
    price_per_hour = serializers.CharField()
    allow_failover = serializers.BooleanField()
    duration_hours = serializers.CharField(allow_null=True)
    current_nodes = ClusterNodeOutput(many=True)
    orders = ClusterNodeOutput(many=True)
    ledger_head = serializers.CharField()
    created_at = serializers.DateTimeField()
    state_changed_at = serializers.DateTimeField()


class ClusterPageOutput(serializers.Serializer):
    results = ClusterOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


def _clusters(organization: Organization) -> QuerySet[Cluster]:
    return (
        Cluster.objects.filter(organization=organization)
        .select_related("gpu_model", "offer", "quote")
        .prefetch_related("orders__instances", "orders__stopped_periods")
    )


def _cluster_or_404(request: Request, cluster_id: str, permission: BuyerPermission = BuyerPermission.READ) -> Cluster:
    organization = request_organization(request, permission)
    try:
        uuid.UUID(str(cluster_id))
    except ValueError:
        raise NotFound("no such cluster") from None
    cluster = _clusters(organization).filter(public_id=cluster_id).first()
    if cluster is None:
        raise NotFound("no such cluster")
    return cluster


def cluster_output(cluster: Cluster, heads: dict[str, str] | None = None) -> dict[str, object]:
    """The cluster, its current round's nodes first (where each runs and how to reach it), then every node
    order of every round."""
    orders = sorted(cluster.orders.all(), key=lambda o: (o.cluster_round or 0, o.cluster_node or 0))
    current = [o for o in orders if o.cluster_round == cluster.round]

    def node(order: Any) -> dict[str, object]:
        instance = order.instance
        return {
            "order": str(order.public_id),
            "round": order.cluster_round,
            "node": order.cluster_node,
            "state": order.state,
            "state_reason": order.state_reason,
            "zone": None if instance is None else instance.zone,
            "public_ip": None if instance is None or not instance.active else (instance.public_ip or None),
        }

    subject = f"cluster:{cluster.public_id}"
    if heads is None:
        heads = latest_hashes([subject])
    return {
        "id": str(cluster.public_id),
        "state": cluster.state,
        "state_reason": cluster.state_reason,
        "nodes": cluster.nodes,
        "round": cluster.round,
        "offer": cluster.offer_id,
        "instance_type": cluster.offer.instance_type,
        "zone": cluster.offer.zone,
        "quote": None if cluster.quote is None else str(cluster.quote.public_id),
        "gpu_model": cluster.gpu_model.key,
        "gpus_per_node": cluster.gpu_count,
        "pricing_model": cluster.pricing_model,
        "regions": cluster.regions,
        "needs_rdma": cluster.needs_rdma,
        "placement_group": cluster.placement_group,
        "max_price_per_node_hour": format(cluster.max_price_per_node_hour, "f"),
        "price_per_hour": format(sum((o.price_per_hour for o in current), Decimal(0)), "f"),
        "allow_failover": cluster.allow_failover,
        "duration_hours": None if cluster.duration_hours is None else format(cluster.duration_hours, "f"),
        "current_nodes": [node(o) for o in current],
        "orders": [node(o) for o in orders],
        "ledger_head": heads.get(subject, ""),
        "created_at": cluster.created_at.isoformat(),
        "state_changed_at": cluster.state_changed_at.isoformat(),
    }


class ClusterListCreateApi(APIView):
    """GET lists the caller's clusters; POST places one (``Idempotency-Key`` makes a retry return it again)."""

    required_scopes = {"GET": ("orders:place", "instances:manage"), "POST": ("orders:place",)}

    @extend_schema(operation_id="clusters_list", parameters=pagination.PARAMETERS, responses={200: ClusterPageOutput})
    def get(self, request: Request) -> Response:
        clusters = _clusters(request_organization(request)).order_by("-id")
        page = pagination.paginate(
            request, clusters, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("clusters")
        )
        heads = latest_hashes(f"cluster:{c.public_id}" for c in page.rows)
        return Response(page.body(request, [cluster_output(c, heads) for c in page.rows]))

    @extend_schema(
        request=ClusterPlaceInput,
        parameters=[idempotency.PARAMETER],
        responses={200: ClusterOutput, 201: ClusterOutput, 400: ERROR, 402: ERROR, 404: ERROR, 409: ERROR, 410: ERROR},
    )
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.ORDER)
        key = idempotency.idempotency_key(request)
        body = ClusterPlaceInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        placed = cluster_place(
            organization=organization,
            user=request.user,
            request=ClusterRequest(
                offer_id=data.get("offer"),
                quote_id=None if data.get("quote") is None else str(data["quote"]),
                nodes=data.get("nodes"),
                max_price_per_node_hour=data.get("max_price_per_node_hour"),
                allow_failover=data["allow_failover"],
                regions=tuple(data["regions"]),
                needs_rdma=data["needs_rdma"],
                placement_group=data["placement_group"],
                duration_hours=data.get("duration_hours"),
                launch=launch_choice(request, data),
                caller_address=client_address(request),
            ),
            idempotency_key=key,
        )
        cluster = _cluster_or_404(request, str(placed.cluster.public_id))
        response = Response(cluster_output(cluster), status=status.HTTP_201_CREATED if placed.created else 200)
        if not placed.created:
            response["Idempotent-Replayed"] = "true"
        return response


class ClusterDetailApi(APIView):
    required_scopes = {"GET": ("orders:place", "instances:manage")}

    @extend_schema(responses={200: ClusterOutput, 404: ERROR})
    def get(self, request: Request, cluster_id: str) -> Response:
        return Response(cluster_output(_cluster_or_404(request, cluster_id)))


class ClusterTerminateApi(APIView):
    """POST /api/v1/clusters/<id>/terminate: every node of every round; idempotent, 202 while they stop."""

    required_scopes = {"POST": ("instances:manage",)}

    @extend_schema(request=None, responses={202: ClusterOutput, 404: ERROR})
    def post(self, request: Request, cluster_id: str) -> Response:
        cluster = _cluster_or_404(request, cluster_id, BuyerPermission.ORDER)
        cluster_terminate(cluster=cluster)
        return Response(cluster_output(_cluster_or_404(request, cluster_id)), status=status.HTTP_202_ACCEPTED)
