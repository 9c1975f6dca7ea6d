"""API views for what a buyer does to a running order's machine (issue 36): stop it keeping its disk, start it
again, restart it, and read its workload's recent output. Thin: parse, check the order is the caller's (a
stranger gets 404), call one service or selector, render. The actions are idempotent by the order's state, so
they take no ``Idempotency-Key``: a repeat answers the order as the first request left it."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.serializers import OrderOutput
from marketplace.api.views import ERROR, _order_or_404, _order_output
from marketplace.orders.actions import order_restart, order_start, order_stop
from marketplace.orders.selectors import DEFAULT_LOG_LINES, MAX_LOG_LINES, BuyerPermission, order_workload_log

_ACTION_RESPONSES = {202: OrderOutput, 400: ERROR, 404: ERROR, 409: ERROR, 429: ERROR}


class OrderStopApi(APIView):
    """POST /api/v1/orders/<id>/stop: 202 while the provider stops the machine (its disk kept); the order is
    ``stopped`` once it has. 409 for an order that is not running, or whose provider cannot stop a machine."""

    required_scopes = {"POST": ("instances:manage",)}

    @extend_schema(operation_id="order_stop", request=None, responses=_ACTION_RESPONSES)
    def post(self, request: Request, order_id: str) -> Response:
        order = order_stop(order=_order_or_404(request, order_id, BuyerPermission.ORDER))
        return Response(_order_output(_order_or_404(request, str(order.public_id))), status=status.HTTP_202_ACCEPTED)


class OrderStartApi(APIView):
    """POST /api/v1/orders/<id>/start: 202 while the stopped machine starts; the order is ``running`` again when
    its agent reports. A start the provider refuses (no capacity) leaves it ``stopped`` with the reason."""

    required_scopes = {"POST": ("instances:manage",)}

    @extend_schema(operation_id="order_start", request=None, responses=_ACTION_RESPONSES)
    def post(self, request: Request, order_id: str) -> Response:
        order = order_start(order=_order_or_404(request, order_id, BuyerPermission.ORDER))
        return Response(_order_output(_order_or_404(request, str(order.public_id))), status=status.HTTP_202_ACCEPTED)


class OrderRestartApi(APIView):
    """POST /api/v1/orders/<id>/restart: 202 while the machine reboots in place (same disk, same address); the
    order is ``starting`` until its agent reports again."""

    required_scopes = {"POST": ("instances:manage",)}

    @extend_schema(operation_id="order_restart", request=None, responses=_ACTION_RESPONSES)
    def post(self, request: Request, order_id: str) -> Response:
        order = order_restart(order=_order_or_404(request, order_id, BuyerPermission.ORDER))
        return Response(_order_output(_order_or_404(request, str(order.public_id))), status=status.HTTP_202_ACCEPTED)


class OrderLogsInput(serializers.Serializer):
    lines = serializers.IntegerField(min_value=1, max_value=MAX_LOG_LINES, default=DEFAULT_LOG_LINES)


class OrderLogsOutput(serializers.Serializer):
    lines = serializers.ListField(child=serializers.CharField(allow_blank=True, trim_whitespace=False))
    at = serializers.DateTimeField(allow_null=True, help_text="when the agent sent them; null: nothing sent yet")
    source = serializers.CharField(allow_blank=True)


class OrderLogsApi(APIView):
    """GET /api/v1/orders/<id>/logs?lines=N: the last N (1 to 1000, default 100) lines of the workload's
    output, as the machine's lease agent last sent them with its heartbeat (at most 16 KiB kept)."""

    required_scopes = {"GET": ("orders:place", "instances:manage")}

    @extend_schema(
        operation_id="order_logs",
        parameters=[OpenApiParameter("lines", int, description=f"1 to {MAX_LOG_LINES}; default {DEFAULT_LOG_LINES}")],
        responses={200: OrderLogsOutput, 400: ERROR, 404: ERROR, 429: ERROR},
    )
    def get(self, request: Request, order_id: str) -> Response:
        order = _order_or_404(request, order_id)
        query = OrderLogsInput(data=request.query_params)
        query.is_valid(raise_exception=True)
        log = order_workload_log(order, lines=query.validated_data["lines"])
        return Response(OrderLogsOutput({"lines": log.lines, "at": log.at, "source": log.source}).data)
