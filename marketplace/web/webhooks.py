"""The storefront's webhooks page: register a URL (its secret shown once), see each delivery and its attempts,
redeliver, ping, pause or switch on again, rotate the secret, delete."""

from __future__ import annotations

import secrets

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.api.idempotency import idempotency_claim
from marketplace.models import Organization, WebhookEndpoint
from marketplace.orders.selectors import BuyerPermission
from marketplace.web.orgs import buyer_access
from marketplace.webhooks.destinations import MAX_URL_LENGTH
from marketplace.webhooks.selectors import delivery_get, delivery_list, webhook_get, webhook_list
from marketplace.webhooks.services import (
    MAX_DESCRIPTION,
    SUBSCRIBABLE,
    RotatedSecret,
    WebhookError,
    WebhookInvalid,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_update,
    webhook_ping,
    webhook_redeliver,
    webhook_secret_rotate,
)

LOG_ROWS = 50


class WebhookForm(forms.Form):
    url = forms.CharField(label="URL", max_length=MAX_URL_LENGTH, widget=forms.URLInput(attrs={"size": 50}))
    description = forms.CharField(max_length=MAX_DESCRIPTION, required=False)
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in SUBSCRIBABLE],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="none ticked: every event",
    )


def _org(request: HttpRequest) -> Organization:
    """Webhooks, their log included, are a member's or an owner's; a viewer gets 403."""
    return buyer_access(request, BuyerPermission.WEBHOOKS).organization


def _webhook(request: HttpRequest, webhook_id: int) -> WebhookEndpoint:
    endpoint = webhook_get(organization=_org(request), webhook_id=webhook_id)
    if endpoint is None:
        raise Http404("no such webhook")
    return endpoint


@login_required
@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest) -> HttpResponse:
    """The organisation's webhooks, and the form that registers one (its secret shown once)."""
    org = _org(request)
    form = WebhookForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            with transaction.atomic():
                if not idempotency_claim(org, "web.webhooks.create", request.POST.get("nonce", "")):
                    messages.info(request, "That webhook was already created; its secret was shown then.")
                    return redirect("storefront:webhooks")
                created = webhook_endpoint_create(
                    organization=org,
                    user=request.user,
                    url=form.cleaned_data["url"],
                    description=form.cleaned_data["description"],
                    events=form.cleaned_data["events"],
                )
            form = WebhookForm()
        except WebhookInvalid as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        except WebhookError as exc:
            form.add_error(None, str(exc))
    response = render(
        request,
        "storefront/webhooks.html",
        {
            "organization": org,
            "form": form,
            "created": created,
            "endpoints": webhook_list(organization=org),
            "nonce": secrets.token_urlsafe(16),  # a resubmitted form (a reload, a double click) creates one
        },
    )
    if created is not None:
        response.headers["Cache-Control"] = "no-store"  # the secret must not linger in a cache
    return response


@login_required
def webhook_detail(request: HttpRequest, webhook_id: int) -> HttpResponse:
    """One webhook's delivery log: the newest deliveries, each with every attempt's answer."""
    return _detail_page(request, _webhook(request, webhook_id))


def _detail_page(request: HttpRequest, endpoint: WebhookEndpoint, rotated: RotatedSecret | None = None) -> HttpResponse:
    deliveries = list(delivery_list(endpoint=endpoint)[:LOG_ROWS])
    context = {"endpoint": endpoint, "deliveries": deliveries, "rotated": rotated, "nonce": secrets.token_urlsafe(16)}
    response = render(request, "storefront/webhook_detail.html", context)
    if rotated is not None:
        response.headers["Cache-Control"] = "no-store"  # the secret must not linger in a cache
    return response


@login_required
@require_POST
def webhook_active_view(request: HttpRequest, webhook_id: int) -> HttpResponse:
    """Switch a disabled or paused webhook on again (its failure count cleared), or pause it."""
    endpoint = _webhook(request, webhook_id)
    switch_on = request.POST.get("active") == "on"
    try:
        webhook_endpoint_update(endpoint=endpoint, active=switch_on)
        messages.success(request, "Webhook switched on again." if switch_on else "Webhook paused.")
    except WebhookError as exc:
        messages.error(request, str(exc))
    return redirect("storefront:webhook-detail", webhook_id=endpoint.pk)


@login_required
@require_POST
def webhook_rotate_view(request: HttpRequest, webhook_id: int) -> HttpResponse:
    """A new signing secret, shown once on the page this answers; the old one signs beside it for a day."""
    endpoint = _webhook(request, webhook_id)
    with transaction.atomic():
        if not idempotency_claim(endpoint.organization, "web.webhooks.rotate", request.POST.get("nonce", "")):
            messages.info(request, "That secret was already rotated; the new one was shown then.")
            return redirect("storefront:webhook-detail", webhook_id=endpoint.pk)
        rotated = webhook_secret_rotate(endpoint=endpoint)
    return _detail_page(request, endpoint, rotated)


@login_required
@require_POST
def webhook_delete(request: HttpRequest, webhook_id: int) -> HttpResponse:
    endpoint = _webhook(request, webhook_id)
    webhook_endpoint_delete(endpoint=endpoint)
    messages.success(request, f"Webhook {endpoint.url} deleted.")
    return redirect("storefront:webhooks")


@login_required
@require_POST
def webhook_ping_view(request: HttpRequest, webhook_id: int) -> HttpResponse:
    endpoint = _webhook(request, webhook_id)
    try:
        webhook_ping(endpoint=endpoint)
        messages.success(request, "Ping queued.")
    except WebhookError as exc:
        messages.error(request, str(exc))
    return redirect("storefront:webhook-detail", webhook_id=endpoint.pk)


@login_required
@require_POST
def delivery_redeliver(request: HttpRequest, webhook_id: int, delivery_id: int) -> HttpResponse:
    endpoint = _webhook(request, webhook_id)
    delivery = delivery_get(endpoint=endpoint, delivery_id=delivery_id)
    if delivery is None:
        raise Http404("no such delivery")
    try:
        webhook_redeliver(delivery=delivery)
        messages.success(request, f"Event {delivery.event_type} queued again.")
    except WebhookError as exc:
        messages.error(request, str(exc))
    return redirect("storefront:webhook-detail", webhook_id=endpoint.pk)
