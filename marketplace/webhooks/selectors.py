"""Webhook reads, always scoped to the caller's organisation: a stranger's ids find nothing."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from marketplace.models import Organization, WebhookAttempt, WebhookDelivery, WebhookEndpoint

MAX_ID = 2**63 - 1


def _id(raw: object) -> int | None:
    text = str(raw)
    # isascii: str.isdigit also accepts digits such as "²" that int() refuses.
    return int(text) if text.isascii() and text.isdigit() and int(text) <= MAX_ID else None


def webhook_list(*, organization: Organization) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(organization=organization).order_by("-id")


def webhook_get(*, organization: Organization, webhook_id: object) -> WebhookEndpoint | None:
    """The endpoint if it belongs to ``organization``; None otherwise, or for an id that is not one."""
    pk = _id(webhook_id)
    return None if pk is None else webhook_list(organization=organization).filter(pk=pk).first()


def delivery_list(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """The endpoint's deliveries, newest first, each with its attempts."""
    attempts = Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("number"))
    return WebhookDelivery.objects.filter(endpoint=endpoint).prefetch_related(attempts).order_by("-id")


def delivery_get(*, endpoint: WebhookEndpoint, delivery_id: object) -> WebhookDelivery | None:
    pk = _id(delivery_id)
    if pk is None:
        return None
    return delivery_list(endpoint=endpoint).select_related("endpoint").filter(pk=pk).first()
