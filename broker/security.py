"""Headers every response carries, and a login that slows down password guessing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

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


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
        return response


def _client(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR", ""))


class ThrottledLoginView(auth_views.LoginView):
    """The sign-in page, refusing further tries for a username or an address after ``LOGIN_FAILURE_LIMIT``
    failures within ``LOGIN_FAILURE_WINDOW_S`` (429), counted in the cache shared by every web process."""

    template_name = "registration/login.html"

    def _keys(self, request: HttpRequest) -> list[str]:
        username = str(request.POST.get("username", "")).strip().lower()[:150]
        return [f"login-failures:user:{username}", f"login-failures:ip:{_client(request)}"]

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        keys = self._keys(request)
        if any(int(cache.get(key, 0)) >= settings.LOGIN_FAILURE_LIMIT for key in keys):
            response = self.render_to_response(self.get_context_data(throttled=True))
            response.status_code = 429
            response.headers["Retry-After"] = str(settings.LOGIN_FAILURE_WINDOW_S)
            return response
        response = super().post(request, *args, **kwargs)
        if response.status_code == 200:  # the form came back: wrong credentials
            for key in keys:
                cache.add(key, 0, settings.LOGIN_FAILURE_WINDOW_S)
                try:
                    cache.incr(key)
                except ValueError:  # expired between add and incr
                    cache.set(key, 1, settings.LOGIN_FAILURE_WINDOW_S)
        else:
            cache.delete(keys[0])
        return response
