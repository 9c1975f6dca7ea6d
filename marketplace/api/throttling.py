"""Rate limits per API token: each token (or signed-in user, or anonymous address) has its own bucket, one for
reads and one for writes, so one runaway script cannot starve its organisation's other tokens or the site.

Counts live in the cache (Redis when ``REDIS_URL`` is set, so every process shares them). A refused request gets
429 ``throttled`` with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from marketplace.models import ApiToken

_SAFE = ("GET", "HEAD", "OPTIONS")


class TokenRateThrottle(SimpleRateThrottle):
    """``API_RATES["read"]`` for GET/HEAD/OPTIONS, ``API_RATES["write"]`` for the rest ("N/s|min|hour|day")."""

    def __init__(self) -> None:  # the rate depends on the request's method, so it is chosen in allow_request
        self.history: list[float] = []

    def allow_request(self, request: Request, view: Any) -> bool:
        rates = settings.API_RATES
        self.scope = "read" if request.method in _SAFE else "write"
        self.rate = rates.get(self.scope) if rates else None
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if isinstance(request.auth, ApiToken):
            who = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            who = f"user:{request.user.pk}"
        else:
            who = f"addr:{self.get_ident(request)}"
        return f"throttle:{self.scope}:{who}"
