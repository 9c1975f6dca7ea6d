"""Which addresses the broker may connect to when a user chose the URL (webhook destinations, provider
endpoints): the broker's own network (loopback, private, link-local, the cloud metadata service) is out of
bounds for a URL someone else typed, or the broker becomes their way into it (server-side request forgery)."""

from __future__ import annotations

import ipaddress

LOOPBACK_HOSTS = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "::1": "::1"}
# The well-known NAT64 prefix (RFC 6052 section 2.1): what DNS64 answers for a public IPv4 host on an
# IPv6-only network, so it is judged by the IPv4 address in its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IPv6 forms refused whatever they carry: IPv4-compatible addresses (::a.b.c.d, deprecated by RFC 4291
# section 2.5.5.1; some stacks still route them to the IPv4 host), SIIT's IPv4-translated ::ffff:0:a.b.c.d
# (RFC 2765), the local-use NAT64 prefix (RFC 8215, the operator's own translator), Teredo (RFC 4380: the
# tunnel's server and client, not the address written) and site-local fec0::/10 (deprecated by RFC 3879, still
# routed inside some networks).
_REFUSED_V6 = [
    ipaddress.ip_network("::/96"),
    ipaddress.ip_network("::ffff:0:0:0/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("2001::/32"),
    ipaddress.ip_network("fec0::/10"),
]


def is_public(address: str) -> bool:
    """Whether the IP ``address`` is on the public internet (not loopback, private, link-local, reserved,
    multicast), judging an IPv4 address carried inside IPv6 (mapped, 6to4, NAT64) by that IPv4 address and
    refusing the IPv6 forms whose real destination cannot be judged (``_REFUSED_V6``)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _REFUSED_V6):
            return False
        # IPv4 carried inside IPv6 reaches that IPv4 address: judge that one.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(str(embedded))
    return ip.is_global and not ip.is_multicast


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
