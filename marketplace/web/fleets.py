"""The storefront's fleet pages: the organisation's fleets, and one fleet with its replicas over time, what they
cost, every scaling decision with its reason, and the button that ends it. Fleets are defined through the API or
``broker fleet create`` (docs/BUYERS.md); these pages watch and end them."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.billing.credit import CURRENCY
from marketplace.fleets.selectors import fleet_cost, fleet_decisions, fleet_replica_series, fleet_replicas
from marketplace.fleets.services import fleet_end
from marketplace.models import Fleet, FleetState, Order, OrderState, Organization
from marketplace.money import minor_units
from marketplace.orders.selectors import BuyerPermission, order_usage
from marketplace.web.charts import replicas_chart
from marketplace.web.orgs import buyer_access

DECISIONS_SHOWN = 200
REPLICAS_SHOWN = 200


def _fleet_or_404(organization: Organization, fleet_id: str) -> Fleet:
    try:
        uuid.UUID(fleet_id)
    except ValueError:
        raise Http404("no such fleet") from None
    fleet = Fleet.objects.filter(organization=organization, public_id=fleet_id).first()
    if fleet is None:
        raise Http404("no such fleet")  # another organisation's fleet is not there at all
    return fleet


@login_required
@require_http_methods(["GET"])
def fleet_list(request: HttpRequest) -> HttpResponse:
    organization = buyer_access(request, BuyerPermission.READ).organization
    now = timezone.now()
    rows = []
    for fleet in Fleet.objects.filter(organization=organization).order_by("-created_at", "-id")[:100]:
        cost = fleet_cost(fleet=fleet, now=now)
        live = fleet_replicas(fleet=fleet, live=True).count()
        rows.append({"fleet": fleet, "live": live, "spent": minor_units(cost.spent_usd, CURRENCY)})
    return render(request, "storefront/fleets.html", {"rows": rows, "organization": organization})


@login_required
@require_http_methods(["GET"])
def fleet_detail(request: HttpRequest, fleet_id: str) -> HttpResponse:
    """The fleet: its rule and limits, replicas over time, cost so far against its budget, its replicas, and
    its decisions newest first, each with its reason and the orders it placed or ended."""
    fleet = _fleet_or_404(buyer_access(request, BuyerPermission.READ).organization, fleet_id)
    now = timezone.now()
    replicas: list[dict[str, object]] = []
    for order in fleet_replicas(fleet=fleet).prefetch_related("instances", "stopped_periods")[:REPLICAS_SHOWN]:
        replicas.append({"order": order, "cost": minor_units(order_usage(order, now=now).amount_usd, CURRENCY)})
    points = [(p.at, p.replicas, p.desired) for p in fleet_replica_series(fleet=fleet, now=now)]
    cost = fleet_cost(fleet=fleet, now=now)
    return render(
        request,
        "storefront/fleet_detail.html",
        {
            "fleet": fleet,
            "replicas": replicas,
            "chart": replicas_chart(points, until=now, maximum=fleet.max_replicas, minimum=fleet.min_replicas),
            "running": Order.objects.filter(fleet=fleet, state=OrderState.RUNNING).count(),
            "spent": minor_units(cost.spent_usd, CURRENCY),
            "price_per_hour": cost.price_per_hour,
            "decisions": list(fleet_decisions(fleet=fleet)[:DECISIONS_SHOWN]),
            "active": fleet.state == FleetState.ACTIVE,
            "now": now,
        },
    )


@login_required
@require_POST
def fleet_end_view(request: HttpRequest, fleet_id: str) -> HttpResponse:
    fleet = _fleet_or_404(buyer_access(request, BuyerPermission.ORDER).organization, fleet_id)
    fleet_end(fleet=fleet, reason="ended by the buyer from the storefront", now=timezone.now())
    messages.success(request, f"Fleet {fleet.name} is ending: every replica stops and none is placed again.")
    return redirect("storefront:fleet-detail", fleet_id=fleet.public_id)
