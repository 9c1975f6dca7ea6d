"""The billing API: prepaid credit and its holds, card top-ups, billing details, and Stripe's webhook."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api import idempotency, pagination
from marketplace.api.errors import error_response
from marketplace.api.outputs import BillingOutput, TopUpOutput, TopUpPageOutput
from marketplace.api.schema import ERROR
from marketplace.api.tokens import request_organization
from marketplace.billing.book import book_account_balance, credit_available
from marketplace.billing.credit import CURRENCY
from marketplace.billing.payments import (
    MAX_TOPUP_MINOR,
    MIN_TOPUP_MINOR,
    CheckoutRequest,
    TopUpRefused,
    TopUpRequest,
    billing_profile,
    billing_profile_read,
    email_verified,
    topup_action_deadline,
    topup_cancel,
    topup_checkout_start,
    topup_refresh,
    topup_start,
)
from marketplace.billing.stripe_events import stripe_event_receive
from marketplace.billing.stripe_gateway import PaymentError, PaymentUnavailable, WebhookRejected
from marketplace.billing.vat_ids import VatIdInvalid, tax_id_for_profile
from marketplace.models import BookAccountKind, Organization
from marketplace.models.billing import BillingProfile, TopUp, TopUpState
from marketplace.money import minor_text
from marketplace.numbers import DecimalSerializerField
from marketplace.orders.selectors import BuyerPermission
from marketplace.portal.countries import COUNTRIES
from providers.text import name_problem

_SCOPES_READ = ("billing:manage",)
_MIN, _MAX = Decimal(MIN_TOPUP_MINOR) / 100, Decimal(MAX_TOPUP_MINOR) / 100
# Stripe's events are a few KB; anything much larger is not one.
WEBHOOK_MAX_BYTES = 256 * 1024


def money(amount_minor: int) -> str:
    """Cents as decimal text ("25.00"); the body's ``currency`` names the currency once."""
    return minor_text(amount_minor, CURRENCY)


def billing_body(organization: Organization, user: Any) -> dict[str, Any]:
    profile = billing_profile_read(organization)
    held = -book_account_balance(kind=BookAccountKind.ORDER_HOLD, currency=CURRENCY, organization=organization)
    return {
        "currency": CURRENCY,
        "payment_terms": organization.payment_terms,
        "credit_available": money(credit_available(organization, CURRENCY)),
        "held_for_running_orders": money(held),
        "country": profile.country or None,
        "tax_id": profile.tax_id or None,
        "payment_method": profile.payment_method or None,
        "auto_topup": None
        if profile.auto_topup_below_minor is None
        else {"below": money(profile.auto_topup_below_minor), "amount": money(profile.auto_topup_amount_minor or 0)},
        "email_verified": email_verified(user) if getattr(user, "is_authenticated", False) else None,
        "top_up": {"min": money(MIN_TOPUP_MINOR), "max": money(MAX_TOPUP_MINOR)},
    }


def topup_body(topup: TopUp) -> dict[str, Any]:
    return {
        "id": str(topup.public_id),
        "amount": money(topup.amount_minor),
        "currency": topup.currency,
        "state": topup.state,
        "automatic": topup.automatic,
        "next_action_url": topup.next_action_url or None,
        # Stripe's hosted page where a person types the card, while it waits for them.
        "checkout_url": topup.next_action_url
        if topup.checkout_session and topup.state == TopUpState.REQUIRES_ACTION and topup.next_action_url
        else None,
        "failure": topup.failure or None,
        # While it waits for 3-D Secure: when it is cancelled as abandoned unless completed (POST .../cancel ends
        # it sooner).
        "action_deadline": topup_action_deadline(topup).isoformat()
        if topup.state == TopUpState.REQUIRES_ACTION and not topup.checkout_session
        else None,
        "refunded": money(topup.refunded_minor),
        "created_at": topup.created_at.isoformat(),
    }


class _Money(DecimalSerializerField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_digits=10, decimal_places=2, **kwargs)


class TopUpInput(serializers.Serializer):
    amount = _Money(min_value=_MIN, max_value=_MAX)
    payment_method = serializers.RegexField(r"^pm_[A-Za-z0-9_]{1,60}$", required=False)
    save_payment_method = serializers.BooleanField(required=False, default=False)
    return_url = serializers.URLField(required=False, max_length=400)
    # True: no card is charged now; the answer's checkout_url is Stripe's page where a person types one.
    checkout = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("checkout") and attrs.get("payment_method"):
            raise serializers.ValidationError("give either payment_method or checkout, not both")
        return attrs


class ProfileInput(serializers.Serializer):
    country = serializers.ChoiceField(
        choices=sorted(COUNTRIES), required=False, help_text="ISO 3166-1 alpha-2 code, upper case (GB, DE, US)"
    )
    tax_id = serializers.CharField(required=False, allow_blank=True, max_length=32)
    auto_topup_below = _Money(required=False, allow_null=True, min_value=Decimal(0), max_value=_MAX)
    auto_topup_amount = _Money(required=False, allow_null=True, min_value=_MIN, max_value=_MAX)

    def validate_tax_id(self, value: str) -> str:
        problem = name_problem(value.strip()) if value.strip() else None
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        below, amount = attrs.get("auto_topup_below"), attrs.get("auto_topup_amount")
        if ("auto_topup_below" in attrs) != ("auto_topup_amount" in attrs) or (below is None) != (amount is None):
            raise serializers.ValidationError("give auto_topup_below and auto_topup_amount together (null: off)")
        return attrs


class BillingApi(APIView):
    """GET /api/v1/billing: credit, holds and billing details; PUT sets the country, tax id and auto top-up."""

    required_scopes = {"GET": _SCOPES_READ}  # changing them needs an owner's session, never a token

    @extend_schema(responses={200: BillingOutput})
    def get(self, request: Request) -> Response:
        return Response(billing_body(request_organization(request), request.user))

    @extend_schema(request=ProfileInput, responses={200: BillingOutput, 400: ERROR, 403: ERROR})
    def put(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.PAY)
        body = ProfileInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        profile = billing_profile(organization)
        if "country" in data:
            profile.country = data["country"]
        if "tax_id" in data or "country" in data:
            try:
                profile.tax_id = tax_id_for_profile(profile.country, data.get("tax_id", profile.tax_id))
            except VatIdInvalid as exc:
                return error_response("tax_id_invalid", str(exc), 400)
        if "auto_topup_below" in data:
            below, amount = data["auto_topup_below"], data["auto_topup_amount"]
            profile.auto_topup_below_minor = None if below is None else int(below * 100)
            profile.auto_topup_amount_minor = None if amount is None else int(amount * 100)
            if below is not None and not profile.payment_method:
                return error_response(
                    "payment_method_required", "auto top-up charges a saved card: save one with a top-up first", 400
                )
        profile.save()
        return Response(billing_body(organization, request.user))


class TopUpListCreateApi(APIView):
    """GET lists the organisation's top-ups; POST charges a card into its credit (``Idempotency-Key`` needed)."""

    required_scopes = {"GET": _SCOPES_READ, "POST": _SCOPES_READ}

    @extend_schema(operation_id="topups_list", parameters=pagination.PARAMETERS, responses={200: TopUpPageOutput})
    def get(self, request: Request) -> Response:
        organization = request_organization(request)
        rows = TopUp.objects.filter(organization=organization).order_by("-id")
        page = pagination.paginate(
            request, rows, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("topups")
        )
        return Response(page.body(request, [topup_body(t) for t in page.rows]))

    @extend_schema(
        request=TopUpInput,
        parameters=[idempotency.REQUIRED_PARAMETER],
        responses={**dict.fromkeys((200, 201, 202), TopUpOutput), 400: ERROR, 402: ERROR, 403: ERROR, 503: ERROR},
    )
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.PAY)
        key = idempotency.idempotency_key(request)
        if not key:
            return error_response("idempotency_key_required", "send an Idempotency-Key header with a top-up", 400)
        body = TopUpInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if data["checkout"]:
            return _checkout_post(request, organization, key, data)
        profile = billing_profile(organization)
        method = data.get("payment_method") or profile.payment_method
        if not method:
            return error_response("payment_method_required", "give a payment_method (no card is saved)", 400)
        existed = TopUp.objects.filter(organization=organization, idempotency_key=key).exists()
        try:
            topup = topup_start(
                organization=organization,
                user=request.user,
                request=TopUpRequest(
                    amount_minor=int(data["amount"] * 100),
                    payment_method=method,
                    return_url=data.get("return_url") or request.build_absolute_uri("/billing/"),
                    idempotency_key=key,
                ),
            )
        except TopUpRefused as exc:
            declined = exc.code not in {
                "email_unverified",
                "country_required",
                "invalid_amount",
                "invalid_payment_method",
                "idempotency_conflict",
            }
            http = 402 if declined else (409 if exc.code == "idempotency_conflict" else 400)
            return error_response(exc.code, str(exc), http)
        except PaymentError as exc:
            return error_response(exc.code or "payment_error", exc.message, 502)
        if data["save_payment_method"] and topup.state == TopUpState.SUCCEEDED:
            BillingProfile.objects.filter(organization=organization).update(payment_method=method)
        if topup.state == TopUpState.FAILED:  # a replay of a declined top-up answers as the first did
            return error_response("card_declined", topup.failure or "the payment failed", 402)
        if topup.state == TopUpState.PENDING:
            response = error_response(
                "payment_unavailable", topup.failure or "the payment platform did not answer: retry with this key", 503
            )
            response["Retry-After"] = "5"
            return response
        code = status.HTTP_202_ACCEPTED if topup.state == TopUpState.REQUIRES_ACTION else status.HTTP_201_CREATED
        response = Response(topup_body(topup), status=200 if existed else code)
        if existed:
            response["Idempotent-Replayed"] = "true"
        return response


def _checkout_post(request: Request, organization: Organization, key: str, data: dict[str, Any]) -> Response:
    """POST /api/v1/billing/topups with ``"checkout": true``: 201 with the top-up and its ``checkout_url`` (a
    repeat with the same key answers 200 with the same page); Stripe's return lands on the storefront's Billing."""
    existed = TopUp.objects.filter(organization=organization, idempotency_key=key).exists()
    billing_url = request.build_absolute_uri(reverse("storefront:billing"))
    try:
        topup = topup_checkout_start(
            organization=organization,
            user=request.user,
            request=CheckoutRequest(
                amount_minor=int(data["amount"] * 100),
                success_url=request.build_absolute_uri(reverse("storefront:topup-checkout-return"))
                + "?session_id={CHECKOUT_SESSION_ID}",
                cancel_url=f"{billing_url}?checkout=cancelled",
                save_card=data["save_payment_method"],
                idempotency_key=key,
            ),
        )
    except TopUpRefused as exc:
        final = {"email_unverified", "country_required", "invalid_amount", "idempotency_conflict"}
        http = 409 if exc.code == "idempotency_conflict" else (400 if exc.code in final else 502)
        return error_response(exc.code, str(exc), http)
    if topup.state == TopUpState.PENDING:
        response = error_response(
            "payment_unavailable", topup.failure or "the payment platform did not answer: retry with this key", 503
        )
        response["Retry-After"] = "5"
        return response
    response = Response(topup_body(topup), status=200 if existed else status.HTTP_201_CREATED)
    if existed:
        response["Idempotent-Replayed"] = "true"
    return response


class TopUpDetailApi(APIView):
    """GET /api/v1/billing/topups/<id>: one top-up, read back from Stripe while it waits for the card holder."""

    required_scopes = {"GET": _SCOPES_READ}

    @extend_schema(responses={200: TopUpOutput, 404: ERROR})
    def get(self, request: Request, topup_id: str) -> Response:
        organization = request_organization(request)
        topup = TopUp.objects.filter(organization=organization, public_id=_uuid(topup_id)).first()
        if topup is None:
            raise NotFound("no such top-up")
        if topup.state in (TopUpState.REQUIRES_ACTION, TopUpState.PENDING):
            try:
                topup = topup_refresh(topup)
            except PaymentUnavailable:
                pass  # shown as it was; the webhook settles it
        return Response(topup_body(topup))


class TopUpCancelApi(APIView):
    """POST /api/v1/billing/topups/<id>/cancel: end a top-up waiting for 3-D Secure; nothing is charged."""

    required_scopes = {"POST": _SCOPES_READ}

    @extend_schema(request=None, responses={200: TopUpOutput, 404: ERROR, 409: ERROR, 502: ERROR})
    def post(self, request: Request, topup_id: str) -> Response:
        organization = request_organization(request, BuyerPermission.PAY)
        topup = TopUp.objects.filter(organization=organization, public_id=_uuid(topup_id)).first()
        if topup is None:
            raise NotFound("no such top-up")
        try:
            topup = topup_cancel(topup)
        except TopUpRefused as exc:
            return error_response(exc.code, str(exc), 409)
        except PaymentError as exc:
            return error_response(exc.code or "payment_error", exc.message, 502)
        # Failed (cancelled), or succeeded when 3-D Secure was passed just before: Stripe's word either way.
        return Response(topup_body(topup))


def _uuid(raw: str) -> str | None:
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        return None


class StripeWebhookApi(APIView):
    """POST /api/v1/stripe/webhook: Stripe's events, verified by their signature (no session, no token)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes: list[type] = []

    @extend_schema(exclude=True)
    def post(self, request: Request) -> Response:
        raw = request._request.body  # the exact bytes: the signature is over them
        if len(raw) > WEBHOOK_MAX_BYTES:
            return error_response("too_large", f"an event is at most {WEBHOOK_MAX_BYTES} bytes", 413)
        try:
            outcome = stripe_event_receive(raw, request.headers.get("Stripe-Signature", ""))
        except WebhookRejected as exc:
            return error_response("signature_invalid", str(exc), 400)
        except PaymentUnavailable as exc:
            # Stripe retries a failed delivery: nothing was recorded, so the retry applies it.
            return error_response("unavailable", f"could not read the payment back: {exc.message}", 503)
        return Response({"received": True, "outcome": outcome})
