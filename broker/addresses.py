"""Which addresses the broker may connect to when a user chose the URL (webhook destinations, provider
endpoints): the broker's own network (loopback, private, link-local, the cloud metadata service) is out of
bounds for a URL someone else typed, or the broker becomes their way into it (server-side request forgery)."""

from __future__ import annotations

import ipaddress

LOOPBACK_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "::1": "::1"}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public(address: str) -> bool:
    """Whether the IP ``address`` is on the public internet (not loopback, private, link-local, reserved,
    multicast), judging an IPv4 address carried inside IPv6 by that IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4 carried inside IPv6 reaches that IPv4 address: judge that one.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(str(embedded))
    return ip.is_global and not ip.is_multicast


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
