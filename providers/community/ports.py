"""The host ports a host agent gives its leases (``PortPool``), and free loopback ports for simulated hosts and
machines (``free_ports``): the host pool, the sandbox's machines, the drill and the tests all take them here.
"""

from __future__ import annotations

import socket

PORTS_FIRST = 40000  # each lease gets PORTS_PER_LEASE ports from here on a real host
PORTS_PER_LEASE = 16


class PortPool:
    """The host ports leases get, ``per_lease`` each, never two leases the same. A real host hands out blocks
    from ``first``; a simulated one (many in one process, in tests) asks the OS for free ports instead."""

    def __init__(self, first: int | None, per_lease: int = PORTS_PER_LEASE, last: int = 65000):
        self.first = first
        self.per_lease = per_lease
        self.last = last
        self.held: dict[str, tuple[int, ...]] = {}

    def take(self, lease_id: str) -> tuple[int, ...]:
        if self.first is None:
            ports = free_ports(self.per_lease)
        else:
            taken = {port for block in self.held.values() for port in block}
            start = self.first
            while any(port in taken for port in range(start, start + self.per_lease)):
                start += self.per_lease
            if start + self.per_lease > self.last:
                raise RuntimeError("no free ports")
            ports = tuple(range(start, start + self.per_lease))
        self.held[lease_id] = ports
        return ports

    def release(self, lease_id: str) -> tuple[int, ...]:
        return self.held.pop(lease_id, ())


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` ports free on loopback now (the OS's choice): for simulated hosts and machines, many to a
    process."""
    ports = []
    for _ in range(count):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
    return tuple(ports)
