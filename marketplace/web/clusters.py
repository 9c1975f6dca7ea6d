"""The storefront's pages for multi-node jobs: one cluster, its nodes (each an order with its own page), and
ending it. Placing one goes through the order form (marketplace/web/launch.py) from a multi-node quote."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.billing.credit import CURRENCY
from marketplace.models import Cluster, ClusterState, Organization
from marketplace.money import lines_total, minor_units
from marketplace.orders.clusters import cluster_terminate
from marketplace.orders.selectors import BuyerPermission, order_usage
from marketplace.web.orgs import buyer_access


def _cluster_or_404(organization: Organization, cluster_id: str) -> Cluster:
    try:
        uuid.UUID(cluster_id)
    except ValueError:
        raise Http404("no such cluster") from None
    cluster = (
        Cluster.objects.filter(organization=organization, public_id=cluster_id)
        .select_related("gpu_model", "offer__account")
        .prefetch_related("orders__instances", "orders__gpu_model", "orders__stopped_periods")
        .first()
    )
    if cluster is None:
        raise Http404("no such cluster")  # another organisation's cluster is not there at all
    return cluster


@login_required
@require_http_methods(["GET"])
def cluster_detail(request: HttpRequest, cluster_id: str) -> HttpResponse:
    """The cluster: its state and why, the current round's nodes (where each runs, its cost so far), the
    rounds tried before, and the terminate button."""
    cluster = _cluster_or_404(buyer_access(request, BuyerPermission.READ).organization, cluster_id)
    now = timezone.now()
    orders = sorted(cluster.orders.all(), key=lambda o: (-(o.cluster_round or 0), o.cluster_node or 0))
    rows = []
    for o in orders:
        usage = order_usage(o, now=now)
        # Each node's cost rounded once (marketplace.money); the cluster's is the sum of the nodes shown.
        rows.append(
            {"order": o, "instance": o.instance, "usage": usage, "cost": minor_units(usage.amount_usd, CURRENCY)}
        )
    current = [r for r in rows if r["order"].cluster_round == cluster.round]
    earlier = [r for r in rows if r["order"].cluster_round != cluster.round]
    return render(
        request,
        "storefront/cluster_detail.html",
        {
            "cluster": cluster,
            "current": current,
            "earlier": earlier,
            "price_per_hour": sum(r["order"].price_per_hour for r in current),
            "spent": lines_total(r["cost"] for r in rows),
            "terminable": cluster.state in (ClusterState.PROVISIONING, ClusterState.RUNNING),
            # Not final yet: the page redraws itself (static storefront/cluster.js).
            "live": cluster.state not in (ClusterState.TERMINATED, ClusterState.FAILED),
            "now": timezone.now(),
        },
    )


@login_required
@require_POST
def cluster_terminate_view(request: HttpRequest, cluster_id: str) -> HttpResponse:
    cluster = _cluster_or_404(buyer_access(request, BuyerPermission.ORDER).organization, cluster_id)
    cluster_terminate(cluster=cluster)
    messages.success(request, f"Cluster {cluster.public_id} is being terminated: every node stops.")
    return redirect("storefront:cluster-detail", cluster_id=cluster.public_id)
