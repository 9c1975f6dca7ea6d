"""Where a request came from, read the one way the whole site trusts (behind ``TRUSTED_PROXY_HOPS`` proxies)."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    """The address of whoever sent ``request``: ``REMOTE_ADDR``, or with ``TRUSTED_PROXY_HOPS`` = N proxies in
    front of the broker, the Nth address from the right of ``X-Forwarded-For`` (each proxy appends the address
    it heard from, so the entries left of those are whatever the client chose to send). A header that is
    missing, too short or holds anything but IP addresses falls back to ``REMOTE_ADDR``: never an address a
    client can choose."""
    remote = str(request.META.get("REMOTE_ADDR") or "")
    hops = settings.TRUSTED_PROXY_HOPS
    if hops <= 0:
        return remote
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    entries = forwarded.rsplit(",", hops)  # only the last few are ever read, however long the header
    if not forwarded or len(entries) < hops:
        return remote
    try:
        return str(ipaddress.ip_address(entries[-hops].strip()))
    except ValueError:
        return remote
