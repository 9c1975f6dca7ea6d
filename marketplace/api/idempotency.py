"""``Idempotency-Key`` for the API's creating POSTs.

A client that sends a key and retries after a lost answer gets the first answer again (with
``Idempotent-Replayed: true``) instead of a second quote, procurement or webhook. The same key with a different
body is refused (409 ``idempotency_conflict``): that is a client bug, not a retry. Only successes are kept; a
refusal (4xx) or a fault (5xx) leaves nothing behind, so the retry runs afresh.

The remembered answer is inserted in the transaction that does the work, so both commit or neither does. A
concurrent request with the same key waits on the row's unique index until the first commits and then replays
it, which is how two racing retries still create one thing. Orders keep their own key on the order row
(marketplace/orders/services.py), because an order outlives ``IDEMPOTENCY_KEEP_HOURS``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from marketplace.api.tokens import request_organization
from marketplace.models import IdempotentResponse, Organization
from marketplace.orders.errors import IdempotencyConflict

MAX_KEY = 255
HEADER = "Idempotency-Key"
PARAMETER = OpenApiParameter(
    HEADER,
    {"type": "string", "maxLength": MAX_KEY},
    OpenApiParameter.HEADER,
    description="a retry with the same key and body returns the first answer",
)
# Where a retry must never repeat the act (a card charged twice), the key is required.
REQUIRED_PARAMETER = OpenApiParameter(
    HEADER,
    {"type": "string", "minLength": 1, "maxLength": MAX_KEY, "pattern": r"\S"},
    OpenApiParameter.HEADER,
    required=True,
    description="required: a retry with the same key and body returns the first answer, charging once",
)

View = Callable[..., Response]


def idempotency_key(request: Request) -> str | None:
    """The request's key, stripped; None without one. Raises ValidationError for one that is too long."""
    key = request.headers.get(HEADER, "").strip()
    if len(key) > MAX_KEY:
        raise ValidationError({HEADER: [f"at most {MAX_KEY} characters"]})
    return key or None


def request_fingerprint(request: Request, **kwargs: Any) -> str:
    """HMAC-SHA-256 of the path's arguments and the parsed body, so formatting differences are not conflicts.
    Keyed with the broker's secret: a body may carry the buyer's secret values (a launch configuration's), and
    a plain hash of a short secret can be guessed from the stored fingerprint."""
    body = json.dumps({"path": kwargs, "body": request.data}, sort_keys=True, default=str)
    return hmac.new(settings.SECRET_KEY.encode(), body.encode(), hashlib.sha256).hexdigest()


def idempotent(
    operation: str,
    *,
    withhold: tuple[str, ...] = (),
    restore: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[View], View]:
    """Decorates an APIView's ``post`` so that ``Idempotency-Key`` makes it safe to retry (module docstring).

    ``withhold`` names answer fields never stored (a secret shown once must not sit in plain text in this
    table); ``restore(body)`` puts them back into a replayed answer, which is then marked ``no-store``."""

    def decorate(method: View) -> View:
        @functools.wraps(method)
        def post(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
            key = idempotency_key(request)
            if key is None:
                return method(view, request, *args, **kwargs)
            # Keys are per organisation: a token's own, or the session's active one (the view checks the role).
            organization = request_organization(request)
            fingerprint = request_fingerprint(request, **kwargs)
            with transaction.atomic():
                replay = _claim(organization, operation, key, fingerprint)
                if replay is not None:
                    if restore is not None:
                        replay.data = restore(replay.data)
                        replay["Cache-Control"] = "no-store"
                    return replay
                response = method(view, request, *args, **kwargs)
                if response.status_code >= 300:
                    transaction.set_rollback(True)
                    return response
                answer = json.loads(JSONRenderer().render(response.data))
                IdempotentResponse.objects.filter(organization=organization, operation=operation, key=key).update(
                    status_code=response.status_code, body={k: v for k, v in answer.items() if k not in withhold}
                )
            return response

        return post

    return decorate


def _claim(organization: Organization, operation: str, key: str, fingerprint: str) -> Response | None:
    """Inserts the key's row (None: go ahead) or returns the answer already given under it."""
    try:
        with transaction.atomic():
            IdempotentResponse.objects.create(
                organization=organization, operation=operation, key=key, request_hash=fingerprint, status_code=0,
                body={},
            )  # fmt: skip
            return None
    except IntegrityError:
        pass
    first = IdempotentResponse.objects.get(organization=organization, operation=operation, key=key)
    if first.request_hash != fingerprint:
        raise IdempotencyConflict(f"the {HEADER} {key!r} was used with a different request")
    response = Response(first.body, status=first.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def idempotency_claim(organization: Organization, operation: str, key: str) -> bool:
    """Claims ``key`` for ``operation`` in the caller's transaction: True the first time, False when it was
    claimed before (or is being claimed by a request still running, which this one then waits for). For
    forms that must act once per submission; the caller's rollback releases the claim. An empty key claims
    nothing (True): a client that sends none is not refused."""
    if not key:
        return True
    try:
        with transaction.atomic():
            IdempotentResponse.objects.create(
                organization=organization, operation=operation, key=key[:MAX_KEY], request_hash="", status_code=0,
                body={},
            )  # fmt: skip
    except IntegrityError:
        return False
    return True


def idempotent_responses_expire(*, now: dt.datetime | None = None) -> int:
    """Forgets answers older than ``IDEMPOTENCY_KEEP_HOURS``; returns how many."""
    cutoff = (now or timezone.now()) - dt.timedelta(hours=settings.IDEMPOTENCY_KEEP_HOURS)
    deleted, _ = IdempotentResponse.objects.filter(created_at__lt=cutoff).delete()
    return deleted
