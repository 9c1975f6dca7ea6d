"""API views: parse, check ownership, call one service, render."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.serializers import OfferListInput, OfferOutput, OrderOutput, OrderPlaceInput
from marketplace.catalog.selectors import OfferFilters, offer_list
from marketplace.models import Order, Organization
from marketplace.orders.selectors import buyer_organization, order_get, order_ledger_heads, order_list
from marketplace.orders.services import PlaceRequest, order_place, order_terminate

MAX_IDEMPOTENCY_KEY = 255


def _organization(request: Request) -> Organization:
    org = buyer_organization(request.user)
    if org is None:
        raise PermissionDenied("your account belongs to no buyer organisation")
    return org


def _order_output(order: Order) -> dict[str, object]:
    return dict(OrderOutput(order, context={"ledger_heads": order_ledger_heads([order])}).data)


class OfferListApi(APIView):
    """GET /api/v1/offers: offers for sale now, cheapest first."""

    def get(self, request: Request) -> Response:
        params = OfferListInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        filters = OfferFilters(
            gpu_model=data.get("gpu", ""),
            min_gpu_count=data.get("count"),
            region=data.get("region", ""),
            pricing_model=data.get("pricing", ""),
            max_price_per_hour=data.get("max_price"),
        )
        offers = offer_list(filters=filters, now=timezone.now())[:500]
        return Response({"results": OfferOutput(offers, many=True).data})


class OrderListCreateApi(APIView):
    """GET lists the caller's orders; POST places one (``Idempotency-Key`` makes a retry return the same order)."""

    def get(self, request: Request) -> Response:
        orders = list(order_list(organization=_organization(request))[:200])
        heads = order_ledger_heads(orders)
        return Response({"results": OrderOutput(orders, many=True, context={"ledger_heads": heads}).data})

    def post(self, request: Request) -> Response:
        organization = _organization(request)
        key = request.headers.get("Idempotency-Key", "").strip() or None
        if key is not None and len(key) > MAX_IDEMPOTENCY_KEY:
            raise ValidationError({"Idempotency-Key": [f"at most {MAX_IDEMPOTENCY_KEY} characters"]})
        body = OrderPlaceInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = order_place(
            organization=organization,
            user=request.user,
            request=PlaceRequest(
                offer_id=data["offer"],
                max_price_per_hour=data.get("max_price_per_hour"),
                allow_failover=data["allow_failover"],
                regions=tuple(data["regions"]),
            ),
            idempotency_key=key,
        )
        response = Response(_order_output(result.order), status=status.HTTP_201_CREATED if result.created else 200)
        if not result.created:
            response["Idempotent-Replayed"] = "true"
        return response


def _order_or_404(request: Request, order_id: str) -> Order:
    order = order_get(organization=_organization(request), public_id=order_id)
    if order is None:
        raise NotFound("no such order")
    return order


class OrderDetailApi(APIView):
    def get(self, request: Request, order_id: str) -> Response:
        return Response(_order_output(_order_or_404(request, order_id)))


class OrderTerminateApi(APIView):
    """POST /api/v1/orders/<id>/terminate: idempotent; 202 while the provider stops the instance."""

    def post(self, request: Request, order_id: str) -> Response:
        order = order_terminate(order=_order_or_404(request, order_id))
        order = _order_or_404(request, str(order.public_id))
        return Response(_order_output(order), status=status.HTTP_202_ACCEPTED)
