"""The order page's Stop, Start and Restart buttons (issue 36): each a POST that checks the buyer may order,
finds the order in the buyer's organisation (404 otherwise), calls one service and goes back to the page with
what happened."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from marketplace.orders.actions import order_restart, order_start, order_stop
from marketplace.orders.errors import OrderError
from marketplace.orders.selectors import BuyerPermission, order_get
from marketplace.web.orgs import buyer_access

_ACTIONS = {
    "stop": (order_stop, "is stopping; its disk is kept"),
    "start": (order_start, "is starting; it runs again once its agent reports"),
    "restart": (order_restart, "is restarting; it runs again once its agent reports"),
}


@login_required
@require_POST
def order_action_view(request: HttpRequest, order_id: str, action: str) -> HttpResponse:
    organization = buyer_access(request, BuyerPermission.ORDER).organization
    order = order_get(organization=organization, public_id=order_id)
    if order is None or action not in _ACTIONS:
        raise Http404("no such order")
    service, done = _ACTIONS[action]
    try:
        service(order=order)
    except OrderError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Order {order.public_id} {done}.")
    return redirect("storefront:order-detail", order_id=str(order.public_id))
