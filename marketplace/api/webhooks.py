"""Webhook API views (scope ``webhooks:manage``): parse, check ownership, call one service, render."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api import idempotency, pagination
from marketplace.api.errors import error_response
from marketplace.api.schema import ERROR
from marketplace.api.tokens import request_organization
from marketplace.models import Organization, WebhookDelivery, WebhookEndpoint
from marketplace.orders.selectors import BuyerPermission
from marketplace.webhooks.destinations import MAX_URL_LENGTH
from marketplace.webhooks.selectors import delivery_get, delivery_list, webhook_get, webhook_list
from marketplace.webhooks.services import (
    MAX_DESCRIPTION,
    SUBSCRIBABLE,
    WebhookError,
    WebhookInvalid,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_update,
    webhook_ping,
    webhook_redeliver,
    webhook_secret,
    webhook_secret_rotate,
)

SCOPES = ("webhooks:manage",)


class WebhookCreateInput(serializers.Serializer):
    url = serializers.CharField(max_length=MAX_URL_LENGTH, trim_whitespace=True)
    description = serializers.CharField(max_length=MAX_DESCRIPTION, required=False, allow_blank=True, default="")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=list(SUBSCRIBABLE)),
        required=False,
        default=list,
        max_length=len(SUBSCRIBABLE),
        help_text="event types to receive; empty or absent means all",
    )


class WebhookUpdateInput(serializers.Serializer):
    url = serializers.CharField(max_length=MAX_URL_LENGTH, trim_whitespace=True, required=False)
    description = serializers.CharField(max_length=MAX_DESCRIPTION, required=False, allow_blank=True)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=list(SUBSCRIBABLE)), required=False, max_length=len(SUBSCRIBABLE)
    )
    active = serializers.BooleanField(
        required=False,
        help_text="true switches a disabled webhook on again with its failure count cleared; false pauses it",
    )


class WebhookSecretOutput(serializers.Serializer):
    secret = serializers.CharField(help_text="the new signing secret: shown only in this answer")
    previous_secret_valid_until = serializers.DateTimeField(
        help_text="until then each delivery is signed with the new and the previous secret (two v1= values)"
    )


class WebhookOutput(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "events",
            "active",
            "disabled_reason",
            "disabled_at",
            "consecutive_failures",
            "created_at",
        ]


class WebhookCreatedOutput(WebhookOutput):
    secret = serializers.SerializerMethodField(help_text="the signing secret: shown only in this answer")

    class Meta(WebhookOutput.Meta):
        fields = [*WebhookOutput.Meta.fields, "secret"]

    def get_secret(self, endpoint: WebhookEndpoint) -> str:
        return str(self.context["secret"])


class WebhookAttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    response_excerpt = serializers.CharField()
    duration_ms = serializers.IntegerField()


class WebhookDeliveryOutput(serializers.ModelSerializer):
    attempts = WebhookAttemptOutput(source="attempt_log", many=True)
    attempt_count = serializers.IntegerField(source="attempts")

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "event_id",
            "event_type",
            "state",
            "attempt_count",
            "next_attempt_at",
            "delivered_at",
            "created_at",
            "redelivery_of",
            "payload",
            "attempts",
        ]


class WebhookPageOutput(serializers.Serializer):
    results = WebhookOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


class WebhookDeliveryPageOutput(serializers.Serializer):
    results = WebhookDeliveryOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
    next = serializers.CharField(allow_null=True)


def _organization(request: Request) -> Organization:
    """Webhooks are a member's or owner's, reading them included: a viewer gets 403 (``request_organization``)."""
    return request_organization(request, BuyerPermission.WEBHOOKS)


def _refusal(exc: WebhookError) -> Response:
    """A service's refusal in the API's error shape: a field's problem is a 400 naming it, the rest 409."""
    if isinstance(exc, WebhookInvalid):
        raise ValidationError({exc.field: [str(exc)]})
    return error_response(exc.code, str(exc), status.HTTP_409_CONFLICT)


def _webhook_or_404(request: Request, webhook_id: str) -> WebhookEndpoint:
    endpoint = webhook_get(organization=_organization(request), webhook_id=webhook_id)
    if endpoint is None:
        raise NotFound("no such webhook")
    return endpoint


def _delivery_or_404(request: Request, webhook_id: str, delivery_id: str) -> WebhookDelivery:
    delivery = delivery_get(endpoint=_webhook_or_404(request, webhook_id), delivery_id=delivery_id)
    if delivery is None:
        raise NotFound("no such delivery")
    return delivery


def _delivery_json(delivery: WebhookDelivery) -> dict[str, Any]:
    fresh = delivery_get(endpoint=delivery.endpoint, delivery_id=delivery.pk) or delivery
    return dict(WebhookDeliveryOutput(fresh).data)


def _secret_restorer(id_field: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """For ``idempotent(restore=...)``: a replayed answer gets back the secret it showed (withheld from the
    stored answer), read from the encrypted store of the webhook whose id is in ``id_field``."""

    def restore(body: dict[str, Any]) -> dict[str, Any]:
        endpoint = WebhookEndpoint.objects.filter(pk=body.get(id_field)).first()
        return {**body, "secret": None if endpoint is None else webhook_secret(endpoint)}

    return restore


class WebhookListCreateApi(APIView):
    """GET lists the organisation's webhooks; POST registers one and answers its signing secret, once."""

    required_scopes = {"GET": SCOPES, "POST": SCOPES}

    @extend_schema(operation_id="webhooks_list", parameters=pagination.PARAMETERS, responses={200: WebhookPageOutput})
    def get(self, request: Request) -> Response:
        endpoints = webhook_list(organization=_organization(request))
        page = pagination.paginate(
            request, endpoints, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("webhooks")
        )
        return Response(page.body(request, WebhookOutput(page.rows, many=True).data))

    @extend_schema(
        operation_id="webhooks_create",
        request=WebhookCreateInput,
        parameters=[idempotency.PARAMETER],
        responses={201: WebhookCreatedOutput, 400: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("webhooks.create", withhold=("secret",), restore=_secret_restorer("id"))
    def post(self, request: Request) -> Response:
        organization = _organization(request)
        body = WebhookCreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            created = webhook_endpoint_create(
                organization=organization,
                user=request.user,
                url=body.validated_data["url"],
                description=body.validated_data["description"],
                events=body.validated_data["events"],
            )
        except WebhookError as exc:
            return _refusal(exc)
        output = WebhookCreatedOutput(created.endpoint, context={"secret": created.secret}).data
        response = Response(output, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"  # the secret must not linger in a cache
        return response


class WebhookDetailApi(APIView):
    """GET one webhook (never its secret); PATCH changes its URL, description, events or whether it is on;
    DELETE removes it with its delivery log."""

    required_scopes = {"GET": SCOPES, "PATCH": SCOPES, "DELETE": SCOPES}

    @extend_schema(operation_id="webhooks_retrieve", responses={200: WebhookOutput, 404: ERROR})
    def get(self, request: Request, webhook_id: str) -> Response:
        return Response(WebhookOutput(_webhook_or_404(request, webhook_id)).data)

    @extend_schema(
        operation_id="webhooks_partial_update",
        request=WebhookUpdateInput,
        responses={200: WebhookOutput, 400: ERROR, 404: ERROR, 409: ERROR},
    )
    def patch(self, request: Request, webhook_id: str) -> Response:
        endpoint = _webhook_or_404(request, webhook_id)
        body = WebhookUpdateInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            updated = webhook_endpoint_update(endpoint=endpoint, **body.validated_data)
        except WebhookError as exc:
            return _refusal(exc)
        return Response(WebhookOutput(updated).data)

    @extend_schema(operation_id="webhooks_destroy", responses={204: None, 404: ERROR})
    def delete(self, request: Request, webhook_id: str) -> Response:
        webhook_endpoint_delete(endpoint=_webhook_or_404(request, webhook_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveryListApi(APIView):
    """GET /api/v1/webhooks/<id>/deliveries: newest first, each with every HTTP attempt."""

    required_scopes = {"GET": SCOPES}

    @extend_schema(
        operation_id="webhooks_deliveries_list",
        parameters=pagination.PARAMETERS,
        responses={200: WebhookDeliveryPageOutput, 404: ERROR},
    )
    def get(self, request: Request, webhook_id: str) -> Response:
        endpoint = _webhook_or_404(request, webhook_id)
        page = pagination.paginate(
            request,
            delivery_list(endpoint=endpoint),
            keys=[pagination.Key("id", descending=True)],
            tag=pagination.listing_tag("webhook-deliveries", endpoint.pk),
        )
        return Response(page.body(request, WebhookDeliveryOutput(page.rows, many=True).data))


class WebhookRedeliverApi(APIView):
    """POST: send a delivered or dead delivery's event again (same event id), as a new delivery; 202."""

    required_scopes = {"POST": SCOPES}

    @extend_schema(
        operation_id="webhooks_deliveries_redeliver",
        request=None,
        parameters=[idempotency.PARAMETER],
        responses={202: WebhookDeliveryOutput, 404: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("webhooks.redeliver")
    def post(self, request: Request, webhook_id: str, delivery_id: str) -> Response:
        delivery = _delivery_or_404(request, webhook_id, delivery_id)
        try:
            created = webhook_redeliver(delivery=delivery)
        except WebhookError as exc:
            return _refusal(exc)
        return Response(_delivery_json(created), status=status.HTTP_202_ACCEPTED)


class WebhookPingApi(APIView):
    """POST: queue a ``ping`` event to this webhook only; 202 with the delivery to watch."""

    required_scopes = {"POST": SCOPES}

    @extend_schema(
        operation_id="webhooks_ping",
        request=None,
        parameters=[idempotency.PARAMETER],
        responses={202: WebhookDeliveryOutput, 404: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("webhooks.ping")
    def post(self, request: Request, webhook_id: str) -> Response:
        try:
            created = webhook_ping(endpoint=_webhook_or_404(request, webhook_id))
        except WebhookError as exc:
            return _refusal(exc)
        return Response(_delivery_json(created), status=status.HTTP_202_ACCEPTED)


class WebhookSecretRotateApi(APIView):
    """POST: a new signing secret, shown once; the previous one keeps signing beside it for a day."""

    required_scopes = {"POST": SCOPES}

    @extend_schema(
        operation_id="webhooks_secret_rotate",
        request=None,
        parameters=[idempotency.PARAMETER],
        responses={200: WebhookSecretOutput, 404: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("webhooks.rotate", withhold=("secret",), restore=_secret_restorer("webhook"))
    def post(self, request: Request, webhook_id: str) -> Response:
        endpoint = _webhook_or_404(request, webhook_id)
        rotated = webhook_secret_rotate(endpoint=endpoint)
        body = WebhookSecretOutput(
            {"secret": rotated.secret, "previous_secret_valid_until": rotated.previous_valid_until}
        ).data
        response = Response({"webhook": endpoint.pk, **body})
        response["Cache-Control"] = "no-store"  # the secret must not linger in a cache
        return response
