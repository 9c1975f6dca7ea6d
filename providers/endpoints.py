"""Where a provider account may send the broker: its endpoint override, Azure's authority and prices URLs, and
the ``token_uri`` in a GCP service-account key.

A seller chooses these, and the broker then connects there with the seller's credentials and shows the answer's
errors to the seller; an address inside the broker's own network (loopback, private, link-local, the cloud
metadata service at 169.254.169.254) would make the broker their way in. ``settings.PROVIDER_ENDPOINTS`` says
what is allowed:

* ``public`` (production): hosts whose every address is public; a name that does not resolve is refused;
* ``public+loopback`` (development and tests): public hosts and loopback too, where the sandboxes listen;
  a name that does not resolve passes, since it leads nowhere.

Checked when an account is saved and whenever an adapter is built for it. A host agent's URL
(``providers/community``) is held to the same rules when the agent registers, and again at every connection
the community client makes, by the address it connects to (``address_allowed``). The SDKs resolve names themselves
when they connect, so a name that changes its answer in between (DNS rebinding) is not caught here: give
addresses, or keep the broker's egress firewalled, where that matters.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from django.conf import settings

from providers.addresses import is_loopback, is_public
from providers.types import Credentials
from untrusted.jsonbody import bounded_json

# The options that name an endpoint (Azure's, for sovereign clouds; a Kubernetes cluster's DCGM exporter).
_URL_OPTIONS = ("authority_url", "prices_url", "dcgm_url")


class EndpointRefused(ValueError):
    """An endpoint the broker may not be sent to; ``field`` names where it was given."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# A service-account key file is one flat JSON object of a few KB; a pasted one is parsed within these bounds
# wherever it is read (portal form, adapter, this module).
KEY_MAX_BYTES = 64 * 1024
KEY_MAX_DEPTH = 4


def account_endpoints(credentials: Credentials, options: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every (field, URL) of an account that points the broker somewhere other than the cloud's own API."""
    found = [("endpoint_url", credentials.endpoint_url)] if credentials.endpoint_url else []
    found += [(name, options[name]) for name in _URL_OPTIONS if options.get(name)]
    key = credentials.values.get("service_account_json")
    if key:
        try:
            token_uri = bounded_json(key, max_bytes=KEY_MAX_BYTES, max_depth=KEY_MAX_DEPTH).get("token_uri")
        except (ValueError, AttributeError):
            token_uri = None  # the adapter names a malformed key itself
        if isinstance(token_uri, str) and token_uri:
            found.append(("service_account_json", token_uri))
    return found


def account_endpoints_check(credentials: Credentials, options: Mapping[str, str]) -> None:
    """Raise ``EndpointRefused`` for the first of the account's endpoints that is not allowed."""
    for field, url in account_endpoints(credentials, options):
        endpoint_check(field, url)


def address_allowed(address: str) -> bool:
    """Whether the broker may connect to the IP ``address`` under ``settings.PROVIDER_ENDPOINTS``; also
    applied to the address a connection actually goes to (the community client), so a name that resolves
    differently at connect time is judged by where it leads."""
    return is_public(address) or (settings.PROVIDER_ENDPOINTS == "public+loopback" and is_loopback(address))


def endpoint_check(field: str, url: str) -> None:
    """Raise ``EndpointRefused`` unless ``url`` may be connected to under ``settings.PROVIDER_ENDPOINTS``."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise EndpointRefused(field, f"the URL is malformed ({exc})") from None
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme not in ("http", "https") or not host:
        raise EndpointRefused(field, "give an http:// or https:// URL with a host")
    with_loopback = settings.PROVIDER_ENDPOINTS == "public+loopback"
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
        except (OSError, UnicodeError):
            if with_loopback:
                return
            raise EndpointRefused(field, f"the host {host} does not resolve") from None
    refused = [a for a in addresses if not address_allowed(a)]
    if refused:
        allowed = "public or loopback addresses" if with_loopback else "public addresses"
        raise EndpointRefused(
            field, f"the host {host} resolves to {', '.join(refused)}: this broker connects only to {allowed}"
        )
