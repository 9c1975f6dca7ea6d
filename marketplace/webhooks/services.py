"""Webhook writes: endpoints, events queued with the change they report, and sending with retries.

An event becomes one ``WebhookDelivery`` per subscribed endpoint, written in the caller's transaction and
handed to a task only after it commits. ``webhook_deliver`` sends one due delivery; failures are retried on
``RETRY_DELAYS_S`` (with jitter) until ``MAX_ATTEMPTS``, then the delivery is dead. The sweep task sends
whatever is due, so a lost task or a crashed worker delays a delivery but never loses it.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Exists, F, Model, OuterRef, QuerySet
from django.utils import timezone

from marketplace.launch.selectors import order_connection
from marketplace.models import (
    DeliveryState,
    Instance,
    Order,
    Organization,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
)
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.destinations import WebhookUrlRefused, destination_check
from marketplace.webhooks.sending import SendResult, http_post
from marketplace.webhooks.signing import HEADER as SIGNATURE_HEADER
from marketplace.webhooks.signing import signature_header
from providers.secrets import SecretUnreadable, decrypt_secret, encrypt_secret
from providers.text import name_problem

MAX_ATTEMPTS = 8
# Waits after the 1st, 2nd, ... failed attempt; 8 attempts span about a day and a half.
RETRY_DELAYS_S = (30, 120, 600, 3600, 6 * 3600, 12 * 3600, 18 * 3600)
JITTER = 0.2  # each wait is stretched by up to this share, so a recovering receiver is not hit all at once
# While a worker sends, the delivery is due again only after this: longer than any send takes.
LEASE = dt.timedelta(minutes=5)
DISABLE_AFTER_DEAD = 5
MAX_ENDPOINTS = 20
MAX_DESCRIPTION = 200
ROTATION_OVERLAP = dt.timedelta(hours=24)  # both secrets sign while the receiver switches to the new one
SECRET_PREFIX = "whsec_"  # noqa: S105 - a label that makes a leaked secret recognisable, not a secret
SUBSCRIBABLE = tuple(t for t in WebhookEventType.values if t != WebhookEventType.PING)
_random = secrets.SystemRandom()


class WebhookError(Exception):
    """A refusal the user should see; ``code`` is machine-readable."""

    code = "webhook_error"


class WebhookInvalid(WebhookError):
    """A field of a new endpoint is not acceptable; ``field`` names it."""

    code = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class WebhookLimitReached(WebhookError):
    code = "webhook_limit"


class WebhookDisabled(WebhookError):
    code = "webhook_disabled"


class DeliveryPending(WebhookError):
    code = "delivery_pending"


@dataclass(frozen=True)
class CreatedEndpoint:
    endpoint: WebhookEndpoint
    secret: str  # shown once


# --- Endpoints -------------------------------------------------------------------------------------------------


def webhook_endpoint_create(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    url: str,
    description: str = "",
    events: Iterable[str] = (),
) -> CreatedEndpoint:
    """Register ``url`` for the organisation's ``events`` (empty: all) and make its signing secret.

    Raises ``WebhookInvalid`` naming the field (a URL refused by ``destination_check``, an unknown event
    type, a long description) and ``WebhookLimitReached`` past ``MAX_ENDPOINTS`` active endpoints.
    """
    url, description, chosen = _checked_url(url), _checked_description(description), _checked_events(events)
    secret = _new_secret()
    with transaction.atomic():
        _hold_active_limit(organization)
        endpoint = WebhookEndpoint.objects.create(
            organization=organization,
            created_by=user,
            url=url,
            description=description,
            events=chosen,
            secret_encrypted=encrypt_secret({"secret": secret}),
        )
    return CreatedEndpoint(endpoint, secret)


def webhook_endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    description: str | None = None,
    events: Iterable[str] | None = None,
    active: bool | None = None,
) -> WebhookEndpoint:
    """Change the fields given (None leaves one as it is), checked as ``webhook_endpoint_create`` checks them.

    ``active=True`` on a disabled endpoint switches it on again with its failure count cleared; the
    deliveries given up when it was disabled stay dead (redeliver them one by one). ``active=False`` pauses
    it: nothing new is queued for it and what was pending is given up. Raises ``WebhookInvalid`` naming the
    field and ``WebhookLimitReached`` when switching on would pass ``MAX_ENDPOINTS`` active endpoints.
    """
    fields: dict[str, Any] = {}
    if url is not None:
        fields["url"] = _checked_url(url)
    if description is not None:
        fields["description"] = _checked_description(description)
    if events is not None:
        fields["events"] = _checked_events(events)
    with transaction.atomic():
        if active and not endpoint.active:
            _hold_active_limit(endpoint.organization)
            fields.update(active=True, consecutive_failures=0, disabled_reason="", disabled_at=None)
        elif active is False and endpoint.active:
            fields.update(active=False, disabled_reason="paused by the organisation", disabled_at=timezone.now())
            WebhookDelivery.objects.filter(endpoint=endpoint, state=DeliveryState.PENDING).update(
                state=DeliveryState.DEAD
            )
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
    endpoint.refresh_from_db()
    return endpoint


@dataclass(frozen=True)
class RotatedSecret:
    secret: str  # shown once
    previous_valid_until: dt.datetime


def webhook_secret_rotate(
    *, endpoint: WebhookEndpoint, overlap: dt.timedelta = ROTATION_OVERLAP, now: dt.datetime | None = None
) -> RotatedSecret:
    """Give the endpoint a new signing secret. For ``overlap`` every delivery is signed with both the new and
    the old secret (two ``v1=`` values), so the receiver can switch to the new one without missing an event;
    after it, with the new one alone. Rotating again ends the older secret's overlap at once."""
    now = now or timezone.now()
    secret = _new_secret()
    valid_until = now + overlap
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        stored = {"secret": secret, "previous": webhook_secret(locked), "previous_until": valid_until.isoformat()}
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret_encrypted=encrypt_secret(stored))
    endpoint.refresh_from_db()
    return RotatedSecret(secret, valid_until)


def _checked_url(url: str) -> str:
    url = url.strip()
    try:
        destination_check(url)
    except WebhookUrlRefused as exc:
        raise WebhookInvalid("url", str(exc)) from None
    return url


def _checked_events(events: Iterable[str]) -> list[str]:
    chosen = sorted(set(events))
    unknown = [e for e in chosen if e not in SUBSCRIBABLE]
    if unknown:
        raise WebhookInvalid("events", f"unknown event types {unknown}: choose from {', '.join(SUBSCRIBABLE)}")
    return chosen


def _checked_description(description: str) -> str:
    if len(description) > MAX_DESCRIPTION:
        raise WebhookInvalid("description", f"at most {MAX_DESCRIPTION} characters")
    if problem := name_problem(description):
        raise WebhookInvalid("description", problem)
    return description.strip()


def _hold_active_limit(organization: Organization) -> None:
    """Within a transaction: lock the organisation's row, which serialises concurrent creations and
    re-enablings, and refuse one more active endpoint past the limit."""
    Organization.objects.select_for_update().get(pk=organization.pk)
    if WebhookEndpoint.objects.filter(organization=organization, active=True).count() >= MAX_ENDPOINTS:
        raise WebhookLimitReached(f"an organisation has at most {MAX_ENDPOINTS} active webhooks")


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint) -> None:
    """Delete the endpoint with its delivery log; a send in flight finds it gone and records nothing."""
    WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()


def webhook_secret(endpoint: WebhookEndpoint) -> str:
    """The endpoint's current signing secret."""
    return decrypt_secret(endpoint.secret_encrypted)["secret"]


def webhook_signing_secrets(endpoint: WebhookEndpoint, now: dt.datetime | None = None) -> list[str]:
    """The secrets a delivery is signed with now: the current one, then the one it replaced while the
    rotation's overlap lasts."""
    stored = decrypt_secret(endpoint.secret_encrypted)
    until = stored.get("previous_until")
    if until and (now or timezone.now()) < dt.datetime.fromisoformat(until):
        return [stored["secret"], stored["previous"]]
    return [stored["secret"]]


# --- Events ----------------------------------------------------------------------------------------------------


def webhook_event_emit(
    *, organization_id: int, event_type: str, data: dict[str, Any], now: dt.datetime | None = None
) -> list[WebhookDelivery]:
    """Queue ``event_type`` with ``data`` for every active endpoint of the organisation subscribed to it.

    Call it inside the transaction of the change it reports: the deliveries commit or roll back with it, and
    their send tasks are enqueued only after the commit.
    """
    active = WebhookEndpoint.objects.filter(organization_id=organization_id, active=True)
    endpoints = [e for e in active if e.subscribes(event_type)]
    if not endpoints:
        return []
    return _deliveries_create(endpoints, event_type, data, now or timezone.now())


def _deliveries_create(
    endpoints: list[WebhookEndpoint],
    event_type: str,
    data: dict[str, Any],
    now: dt.datetime,
    *,
    event_id: uuid.UUID | None = None,
    redelivery_of: WebhookDelivery | None = None,
) -> list[WebhookDelivery]:
    event_id = event_id or uuid.uuid4()
    payload = json.loads(json.dumps(data, default=str))  # what the JSON column will give back
    with transaction.atomic():
        deliveries = [
            WebhookDelivery.objects.create(
                endpoint=endpoint,
                event_id=event_id,
                event_type=event_type,
                payload=payload,
                next_attempt_at=now,
                created_at=now,
                redelivery_of=redelivery_of,
            )
            for endpoint in endpoints
        ]
        for delivery in deliveries:
            enqueue_on_commit("marketplace.webhook_deliver", delivery.pk)
    return deliveries


def _instance_json(instance: Instance | None) -> dict[str, Any] | None:
    if instance is None:
        return None
    return {
        "provider_instance_id": instance.provider_instance_id,
        "region": instance.region,
        "zone": instance.zone,
        "instance_type": instance.instance_type,
        "state": instance.state,
        "public_ip": instance.public_ip,
        "launched_at": instance.launched_at,
        "running_at": instance.running_at,
        "ready_at": instance.ready_at,
        "terminated_at": instance.terminated_at,
    }


# Whether a row's organisation has an active endpoint, read as a subquery of a read its step makes anyway
# (``with_endpoints``): an event that step emits for the row within ENDPOINTS_TRUSTED_S then asks no query of
# its own. An endpoint receives the events of rows read after it was created; a step that outlasts the window
# (a slow cloud's calls) asks again. A row read any other way makes its events ask.
ENDPOINTS_ACTIVE = "webhook_endpoints_active"
_ENDPOINTS_READ_AT = "_webhook_endpoints_read_at"
ENDPOINTS_TRUSTED_S = 2.0

_Row = TypeVar("_Row", bound=Model)
_endpoints_exist: dict[str, Exists] = {}


def with_endpoints(rows: QuerySet[_Row], organization_field: str = "organization_id") -> _Row | None:
    """The one row of ``rows``, a unique look-up (None if there is none), read with whether the organisation
    its ``organization_field`` names has an active endpoint, for ``endpoints_known``."""
    exists = _endpoints_exist.get(organization_field)
    if exists is None:
        # Built once per field: the expression is never changed by a query using it (annotate resolves a copy).
        exists = _endpoints_exist[organization_field] = Exists(
            WebhookEndpoint.objects.filter(organization_id=OuterRef(organization_field), active=True)
        )
    try:
        # get(), not first(): no ORDER BY for the one row a unique look-up finds.
        row = rows.annotate(**{ENDPOINTS_ACTIVE: exists}).get()
    except rows.model.DoesNotExist:
        return None
    setattr(row, _ENDPOINTS_READ_AT, time.monotonic())
    return row


def endpoints_known(row: Model) -> bool | None:
    """What ``with_endpoints`` read of ``row``'s organisation's endpoints, while it may be trusted; else None
    (the event asks)."""
    read_at = getattr(row, _ENDPOINTS_READ_AT, None)
    if read_at is None or time.monotonic() - read_at > ENDPOINTS_TRUSTED_S:
        return None
    return bool(getattr(row, ENDPOINTS_ACTIVE))


def _no_endpoints(organization_id: int, known: bool | None) -> bool:
    if known is not None:
        return not known
    return not WebhookEndpoint.objects.filter(organization_id=organization_id, active=True).exists()


def order_event_emit(
    *, order: Order, previous: str | None, now: dt.datetime | None = None, endpoints: bool | None = None
) -> None:
    """Queue ``order.<state>`` for the order as the database now has it (read inside the caller's
    transaction: price and instance may have changed since ``order`` was loaded). ``endpoints``: what the
    caller's own read said of the organisation's endpoints; without it, an ``order`` read ``with_endpoints``
    answers (``endpoints_known``), else the check costs one query."""
    if _no_endpoints(order.organization_id, endpoints if endpoints is not None else endpoints_known(order)):
        return
    order = Order.objects.select_related("gpu_model", "launch_config").get(pk=order.pk)
    instance = Instance.objects.filter(order_id=order.pk).order_by("-active", "-pk").first()
    now = now or timezone.now()
    data = {
        "order": str(order.public_id),
        "previous_state": previous,
        "state": order.state,
        "reason": order.state_reason,
        "price_per_hour": order.price_per_hour,
        "currency": "USD",
        "gpu_model": order.gpu_model.key,
        "gpu_count": order.gpu_count,
        "pricing_model": order.pricing_model,
        "instance": _instance_json(instance),
        # How to reach the machine (no secret in it: the ssh line, host keys, the exposed ports' URLs).
        "connection": order_connection(order) if order.state == "running" else None,
        "at": now,
    }
    webhook_event_emit(organization_id=order.organization_id, event_type=f"order.{order.state}", data=data, now=now)


def instance_event_emit(
    *,
    instance_id: int,
    event_type: str,
    now: dt.datetime | None = None,
    organization_id: int | None = None,
    endpoints: bool | None = None,
    **extra: Any,
) -> None:
    """Queue an ``instance.*`` event for the instance as it now is (read inside the caller's transaction).
    ``organization_id``, the instance's order's organisation, when the caller has it: the check for endpoints
    then reads their table alone. ``endpoints``: what the caller's own read said of them (``endpoints_known``),
    which spares the check."""
    if organization_id is not None:
        if _no_endpoints(organization_id, endpoints):
            return
    elif not WebhookEndpoint.objects.filter(active=True, organization__orders__instances=instance_id).exists():
        return  # the common case costs one query
    instance = Instance.objects.select_related("order").get(pk=instance_id)
    now = now or timezone.now()
    data = {
        "order": str(instance.order.public_id),
        "instance": _instance_json(instance),
        **extra,
        "at": now,
    }
    webhook_event_emit(organization_id=instance.order.organization_id, event_type=event_type, data=data, now=now)


def webhook_ping(*, endpoint: WebhookEndpoint, now: dt.datetime | None = None) -> WebhookDelivery:
    """Queue a ``ping`` to this endpoint only. Raises ``WebhookDisabled`` for a disabled endpoint."""
    if not endpoint.active:
        raise WebhookDisabled(f"webhook {endpoint.pk} is disabled: {endpoint.disabled_reason}")
    now = now or timezone.now()
    data = {"webhook": endpoint.pk, "message": "ping from the GPU broker", "at": now}
    return _deliveries_create([endpoint], WebhookEventType.PING, data, now)[0]


def webhook_redeliver(*, delivery: WebhookDelivery, now: dt.datetime | None = None) -> WebhookDelivery:
    """Send the delivery's event again as a new delivery (same event id, a fresh set of attempts).

    Raises ``DeliveryPending`` while the delivery is still being tried, ``WebhookDisabled`` for a disabled
    endpoint.
    """
    endpoint = delivery.endpoint
    if not endpoint.active:
        raise WebhookDisabled(f"webhook {endpoint.pk} is disabled: {endpoint.disabled_reason}")
    if delivery.state == DeliveryState.PENDING:
        raise DeliveryPending(f"delivery {delivery.pk} is still being tried; next at {delivery.next_attempt_at}")
    created = _deliveries_create(
        [endpoint],
        delivery.event_type,
        delivery.payload,
        now or timezone.now(),
        event_id=delivery.event_id,
        redelivery_of=delivery,
    )
    return created[0]


# --- Sending ---------------------------------------------------------------------------------------------------


def event_body(delivery: WebhookDelivery) -> bytes:
    """The JSON POSTed for a delivery; the same bytes on every attempt."""
    envelope = {
        "id": str(delivery.event_id),
        "type": delivery.event_type,
        "created_at": delivery.created_at.isoformat(),
        "data": delivery.payload,
    }
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def retry_delay(failed_attempts: int) -> dt.timedelta:
    """The wait after the ``failed_attempts``-th failure: the schedule's step, stretched by up to ``JITTER``."""
    base = RETRY_DELAYS_S[min(failed_attempts, len(RETRY_DELAYS_S)) - 1]
    return dt.timedelta(seconds=base * _random.uniform(1.0, 1.0 + JITTER))


def webhook_deliveries_due(*, now: dt.datetime | None = None, limit: int = 500) -> list[int]:
    """Ids of pending deliveries due by ``now`` on active endpoints, oldest due first.

    Rows a worker is claiming right now are skipped (``skip_locked``) rather than waited for; sending one
    twice is prevented by ``webhook_deliver``'s claim, not here.
    """
    now = now or timezone.now()
    with transaction.atomic():
        rows = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state=DeliveryState.PENDING, next_attempt_at__lte=now, endpoint__active=True)
            .order_by("next_attempt_at", "pk")
            .values_list("pk", flat=True)[:limit]
        )
        return list(rows)


def webhook_deliver(*, delivery_id: int, now: dt.datetime | None = None) -> str:
    """Try one due delivery once and record the attempt; the delivery's state after it, or ``skipped``.

    Safe to call twice and from several workers: the delivery is claimed (locked, and its due time pushed
    ``LEASE`` ahead) before the POST, so only one sends it; one not due, not pending, on a disabled or
    deleted endpoint, is skipped. The URL is checked again before sending (DNS may have changed); a refused
    one counts as a failed attempt. ``now`` decides what is due and when to retry; the signature's
    timestamp is always the clock's.
    """
    now = now or timezone.now()
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("endpoint")
            .filter(pk=delivery_id, state=DeliveryState.PENDING, next_attempt_at__lte=now, endpoint__active=True)
            .first()
        )
        if delivery is None:
            return "skipped"
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=now + LEASE)
    result = _send(delivery)
    return _record(delivery, result, now)


def _send(delivery: WebhookDelivery) -> SendResult:
    endpoint = delivery.endpoint
    try:
        destination = destination_check(endpoint.url)
        signing = webhook_signing_secrets(endpoint)
    except WebhookUrlRefused as exc:
        return SendResult(status_code=None, error=f"not sent: {exc}"[:500])
    except (SecretUnreadable, KeyError):
        return SendResult(status_code=None, error="not sent: the signing secret cannot be decrypted")
    body = event_body(delivery)
    headers = {
        "Broker-Event": delivery.event_type,
        "Broker-Delivery": str(delivery.event_id),
        SIGNATURE_HEADER: signature_header(signing, body),
    }
    return http_post(destination, body, headers)


def _record(delivery: WebhookDelivery, result: SendResult, now: dt.datetime) -> str:
    number = delivery.attempts + 1
    fields: dict[str, Any]
    if result.ok:
        fields = {"state": DeliveryState.DELIVERED, "delivered_at": now}
    elif number >= MAX_ATTEMPTS:
        fields = {"state": DeliveryState.DEAD}
    else:
        fields = {"state": DeliveryState.PENDING, "next_attempt_at": now + retry_delay(number)}
    with transaction.atomic():
        # Only the claimant records: a worker that outlived its lease finds the attempt count moved on.
        claimed = WebhookDelivery.objects.filter(
            pk=delivery.pk, state=DeliveryState.PENDING, attempts=delivery.attempts
        ).update(attempts=number, **fields)
        if claimed != 1:
            return "superseded"
        WebhookAttempt.objects.create(
            delivery_id=delivery.pk,
            number=number,
            status_code=result.status_code,
            error=result.error[:500],
            response_excerpt=result.excerpt[:500],
            duration_ms=result.duration_ms,
            at=now,
        )
        if result.ok:
            WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, consecutive_failures__gt=0).update(
                consecutive_failures=0
            )
        elif fields["state"] == DeliveryState.DEAD:
            _endpoint_count_dead(delivery.endpoint_id, result, now)
    return str(fields["state"])


def _endpoint_count_dead(endpoint_id: int, result: SendResult, now: dt.datetime) -> None:
    WebhookEndpoint.objects.filter(pk=endpoint_id).update(consecutive_failures=F("consecutive_failures") + 1)
    last = f"HTTP {result.status_code}" if result.status_code is not None else result.error
    disabled = WebhookEndpoint.objects.filter(
        pk=endpoint_id, active=True, consecutive_failures__gte=DISABLE_AFTER_DEAD
    ).update(
        active=False,
        disabled_at=now,
        disabled_reason=f"disabled after {DISABLE_AFTER_DEAD} dead deliveries in a row (last: {last})"[:255],
    )
    if disabled:
        # Nothing more goes to a disabled endpoint: what was still queued is given up with it.
        WebhookDelivery.objects.filter(endpoint_id=endpoint_id, state=DeliveryState.PENDING).update(
            state=DeliveryState.DEAD
        )
