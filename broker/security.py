"""Headers every response carries, where a request came from, and sign-in throttling against password
guessing."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from marketplace.clients import client_address

# Scripts only from this site (no inline code: the receipt page's data is a JSON block, not executed);
# inline style attributes are allowed, the admin's widgets use them.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
STRIPE_CHECKOUT_ORIGIN = "https://checkout.stripe.com"  # where Stripe's hosted Checkout pages live
STRIPE_CONNECT_ORIGIN = "https://connect.stripe.com"  # where a Connect account link's onboarding pages live


def stripe_page_origins() -> list[str]:
    """The origins of the Stripe pages a form's answer sends a person to: the hosted card page (a top-up) and
    Connect's onboarding (a provider's payouts); the Stripe sandbox's own host when ``STRIPE_API_BASE`` points at
    it (the sandbox serves both pages beside its API)."""
    base = str(getattr(settings, "STRIPE_API_BASE", "") or "")
    parts = urlsplit(base)
    if not base or parts.hostname in (None, "api.stripe.com") or parts.scheme not in ("http", "https"):
        return [STRIPE_CHECKOUT_ORIGIN, STRIPE_CONNECT_ORIGIN]
    return [f"{parts.scheme}://{parts.netloc}"]


def content_security_policy() -> str:
    # Chromium applies form-action to the redirect a form's answer makes too (MDN, CSP form-action), so the
    # top-up and onboarding forms' answers may lead to Stripe's pages, and nowhere else off the site.
    allowed = " ".join(["'self'", *stripe_page_origins()])
    return CONTENT_SECURITY_POLICY.replace("form-action 'self'", f"form-action {allowed}")


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", content_security_policy())
        response.headers.setdefault("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
        return response


def _address_key(address: str) -> str:
    # One IPv6 subscriber holds a whole /64 (RFC 6177): counted per address, each guess could come from a
    # fresh one.
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _digest(text: str) -> str:
    # Keys stay short and of safe characters whatever a client typed as its username.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _bump(key: str, window: int) -> int:
    """Count one more under ``key`` and return the count, atomically across every process sharing the cache:
    Redis's ``SET NX EX`` and ``INCR`` are each a single atomic command, LocMemCache's ``add`` and ``incr``
    take its lock (one process only: production needs ``REDIS_URL``)."""
    try:
        count = cache.incr(key)
    except ValueError:  # no counter yet, or it just expired
        if cache.add(key, 1, window):
            return 1
        count = cache.incr(key)
    if count == 1:
        # Redis's INCR makes a key that expired between Django's EXISTS and INCR anew, without an expiry.
        cache.touch(key, window)
    return count


def _release(key: str) -> None:
    try:
        if cache.decr(key) <= 0:  # gone and made anew by DECR: drop it rather than keep a key with no expiry
            cache.delete(key)
    except ValueError:  # expired meanwhile: nothing to give back
        pass


@dataclass(frozen=True)
class LoginAttempt:
    """The counters one sign-in attempt holds a place in, taken before its password is checked."""

    pair: str
    others: tuple[str, ...]


def login_attempt_begin(request: HttpRequest) -> LoginAttempt | None:
    """Take a place for a sign-in attempt in three counters, or None when one is full (refuse it, 429):
    per account and address (``LOGIN_FAILURE_LIMIT``: guessing one user's password from one place), per
    address (``LOGIN_FAILURE_LIMIT_ADDRESS``: one place trying many names) and per account
    (``LOGIN_FAILURE_LIMIT_ACCOUNT``, looser: many places guessing one user's password, while one attacker
    cannot lock its owner out alone). Counting before the check is what bounds concurrent guesses: of N wrong
    passwords sent at once, only the limit's worth reach the password hasher."""
    address = _address_key(client_address(request))
    account = _digest(str(request.POST.get("username", "")).strip().lower()[:150])
    window = settings.LOGIN_FAILURE_WINDOW_S
    counters = [
        (f"login:pair:{account}:{_digest(address)}", settings.LOGIN_FAILURE_LIMIT),
        (f"login:address:{_digest(address)}", settings.LOGIN_FAILURE_LIMIT_ADDRESS),
        (f"login:account:{account}", settings.LOGIN_FAILURE_LIMIT_ACCOUNT),
    ]
    taken: list[str] = []
    for key, limit in counters:
        taken.append(key)
        if _bump(key, window) > limit:
            # A refused attempt gives its places back: an attacker hammering past its own pair's limit
            # must not fill the account's counter and lock its owner out from everywhere.
            for held in taken:
                _release(held)
            return None
    return LoginAttempt(pair=counters[0][0], others=tuple(key for key, _ in counters[1:]))


def login_attempt_succeeded(attempt: LoginAttempt) -> None:
    """The password was right: this address's failures on this account are forgiven, and the attempt's place
    in the wider counters is given back (a success is not a failure)."""
    cache.delete(attempt.pair)
    for key in attempt.others:
        _release(key)


def login_throttled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a sign-in view (the site's, the admin's: every form that checks a password) so that each POST
    takes its place in the counters of ``login_attempt_begin`` before the view sees it, and is refused with
    429 and ``Retry-After`` when they are full. A failed attempt keeps its place until the window ends."""

    @functools.wraps(view)
    def throttled(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        attempt = login_attempt_begin(request)
        if attempt is None:
            response = render(
                request,
                "registration/login.html",
                {"form": AuthenticationForm(request), "throttled": True},
                status=429,
            )
            response.headers["Retry-After"] = str(settings.LOGIN_FAILURE_WINDOW_S)
            return response
        response = view(request, *args, **kwargs)
        # Both login views redirect once they signed the user in, and render the form again otherwise.
        if response.status_code == 302 and request.user.is_authenticated:
            login_attempt_succeeded(attempt)
        return response

    throttled.login_throttled = True  # type: ignore[attr-defined]
    return throttled


sign_in = login_throttled(auth_views.LoginView.as_view(template_name="registration/login.html"))
