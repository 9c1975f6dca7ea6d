"""Where a webhook may point, checked when it is registered and again at every send.

``settings.WEBHOOK_DESTINATIONS``: ``loopback`` (the development and test default) accepts only the hosts
127.0.0.1, ::1 and localhost; ``public`` (production) accepts only hosts whose every address is public. The
send connects to the address that was checked (``Destination.address``), not to a second DNS answer, so a
name that re-resolves to a private address between the check and the connection (DNS rebinding) gets nowhere.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from providers.addresses import LOOPBACK_HOSTS, is_public

MAX_URL_LENGTH = 2000


class WebhookUrlRefused(ValueError):
    """The URL is malformed or points somewhere webhooks may not go; the message says why."""


@dataclass(frozen=True)
class Destination:
    """A checked URL: connect to ``address``, and present ``host`` (SNI, certificate, Host header)."""

    scheme: str
    host: str
    port: int
    address: str
    target: str  # path and query, as given

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def pinned_url(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{address}:{self.port}{self.target}"


def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the one DNS look-up; tests replace it, it leaves the process)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebhookUrlRefused(f"the host {host} does not resolve ({exc})") from None
    return sorted({str(info[4][0]) for info in infos})


def _parse(url: str) -> tuple[str, str, int, str]:
    if not url:
        raise WebhookUrlRefused("give the URL to send events to")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlRefused(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise WebhookUrlRefused("the URL may hold only printable ASCII (write international names in punycode)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookUrlRefused(f"the URL is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookUrlRefused("the URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlRefused("the URL must not carry a user name or password: requests are signed instead")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookUrlRefused("the URL names no host")
    if port == 0:
        raise WebhookUrlRefused("the URL's port must be between 1 and 65535")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return scheme, host, port or (443 if scheme == "https" else 80), target


def destination_check(url: str) -> Destination:
    """The destination ``url`` reaches, if webhooks may go there under ``settings.WEBHOOK_DESTINATIONS``.

    Raises ``WebhookUrlRefused`` (its message fit to show next to the URL field) for another scheme than
    http or https, credentials in the URL, a malformed URL, a host that does not resolve, and a host that is
    not allowed: anything but loopback in ``loopback`` mode; any loopback, private, link-local or otherwise
    non-public address in ``public`` mode.
    """
    scheme, host, port, target = _parse(url)
    if settings.WEBHOOK_DESTINATIONS == "loopback":
        address = LOOPBACK_HOSTS.get(host)
        if address is None:
            raise WebhookUrlRefused(
                f"the host {host} is not allowed: this broker sends webhooks only to 127.0.0.1, ::1 or localhost"
            )
        return Destination(scheme, host, port, address, target)
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        addresses = _resolve(host, port)
    refused = [a for a in addresses if not is_public(a)]
    if refused or not addresses:
        raise WebhookUrlRefused(
            f"the host {host} is not allowed: it resolves to {', '.join(refused) or 'nothing'}, "
            "a loopback, private or link-local address"
        )
    return Destination(scheme, host, port, addresses[0], target)
