"""Rate limits per API token: each token (or signed-in user, or anonymous address) has its own buckets, one for
reads and one for writes, so one runaway script cannot starve its organisation's other tokens or the site;
the POSTs that cost seconds of ranking and solving (quotes, procurements) count in a third, tighter one too.
Anonymous callers count by ``broker.security.client_address`` (the client behind trusted proxies only).

A bucket is a counter per fixed window in the cache (Redis when ``REDIS_URL`` is set, so every process shares
it): one atomic increment per request, whatever the rate. A fixed window lets a client spend up to twice its
rate across a window's edge; that is the price of O(1). A refused request gets 429 ``throttled`` with
``Retry-After`` (the seconds to the next window).
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from marketplace.api.rates import rate_parse
from marketplace.clients import client_address
from marketplace.models import ApiToken

_SAFE = ("GET", "HEAD", "OPTIONS")


class TokenRateThrottle(BaseThrottle):
    """``API_RATES["read"]`` for GET/HEAD/OPTIONS, ``API_RATES["write"]`` for the rest; none set: no limit."""

    def __init__(self) -> None:
        self.retry_after: float | None = None

    def scope(self, request: Request) -> str | None:
        return "read" if request.method in _SAFE else "write"

    def allow_request(self, request: Request, view: Any) -> bool:
        scope = self.scope(request)
        if scope is None:
            return True
        rate = (settings.API_RATES or {}).get(scope)
        if not rate:
            return True
        limit, period = rate_parse(rate)
        now = time.time()
        window = int(now // period)
        key = f"throttle:{scope}:{self._who(request)}:{window}"
        try:
            count = cache.incr(key)  # one round trip on every request but a window's first
        except ValueError:  # no counter yet for this window
            count = 1 if cache.add(key, 1, timeout=period + 1) else cache.incr(key)
        self.retry_after = (window + 1) * period - now
        return count <= limit

    def _who(self, request: Request) -> str:
        if isinstance(request.auth, ApiToken):
            return f"token:{request.auth.pk}"
        if request.user and request.user.is_authenticated:
            return f"user:{request.user.pk}"
        # Not DRF's get_ident: without NUM_PROXIES it keys on X-Forwarded-For as sent, a fresh bucket per
        # made-up header. The broker's one notion of the client's address trusts only the configured proxies.
        return f"addr:{client_address(request)}"

    def wait(self) -> float | None:
        return self.retry_after


class ExpensiveRateThrottle(TokenRateThrottle):
    """``API_RATES["expensive"]`` on the POSTs that rank or solve (a quote, a procurement: up to seconds of
    server time each), counted on top of the write bucket, so a token cannot spend its whole write rate on
    them."""

    def scope(self, request: Request) -> str | None:
        return None if request.method in _SAFE else "expensive"
