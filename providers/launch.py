"""What a launch carries besides the machine itself, as adapters see it: the boot that makes it usable.

The broker turns a buyer's launch configuration (``marketplace/launch``) into a ``BootSpec`` per attempt.
Each adapter turns the ``BootSpec`` into its cloud's own mechanisms (key pairs or metadata keys, user data
or custom data, security groups or firewall rules, disk size, a GPU-ready image) and tags everything it
creates with the order, so ``release_order_resources`` and the reconciler can remove it.

Nothing here is a lasting secret. The boot token is one-time, order-scoped and expires; the buyer's secret
values (env marked secret, registry passwords) never enter a ``BootSpec``: the lease agent fetches them over
the signed agent protocol after it has spent the token (``providers/community/lease.py``). User data is
readable by whoever holds the seller's cloud account, so that is the only safe split.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from providers.sshkeys import SshPublicKey


class WorkloadKind(enum.StrEnum):
    NONE = "none"  # just the machine: SSH in and work
    CONTAINER = "container"  # a container image run with the GPUs
    SCRIPT = "script"  # a shell script run as the login user


@dataclass(frozen=True, slots=True)
class IngressRule:
    """One inbound port and who may reach it. ``cidrs`` is never empty: an open port is always a choice."""

    port: int
    cidrs: tuple[str, ...]
    protocol: str = "tcp"

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not between 1 and 65535")
        if self.protocol not in ("tcp", "udp"):
            raise ValueError(f"protocol {self.protocol!r} is not tcp or udp")
        if not self.cidrs:
            raise ValueError(f"port {self.port}: name who may reach it")
        for cidr in self.cidrs:
            ipaddress.ip_network(cidr, strict=False)

    @property
    def ipv4_cidrs(self) -> tuple[str, ...]:
        return tuple(c for c in self.cidrs if ipaddress.ip_network(c, strict=False).version == 4)

    @property
    def ipv6_cidrs(self) -> tuple[str, ...]:
        return tuple(c for c in self.cidrs if ipaddress.ip_network(c, strict=False).version == 6)


@dataclass(frozen=True, slots=True)
class BootSpec:
    """How one attempt's machine becomes usable.

    ``lease`` is the lease file the boot script writes for the agent: the non-secret workload (container
    image, command, args, non-secret env, exposed ports, shared memory, registry server and user; or the
    script), the keys to authorize and where to phone home. Adapters do not interpret it; they render it
    with ``providers.boot.render_boot_script`` and measure the result against their cloud's limit.
    """

    broker_url: str
    boot_token: str
    agent_sha256: str
    ssh_keys: tuple[SshPublicKey, ...]
    ingress: tuple[IngressRule, ...]
    disk_gb: int | None = None
    image: str | None = None  # the buyer's own image id; None: the cloud's GPU-ready default for the region
    workload: dict[str, Any] = field(default_factory=dict)

    @property
    def workload_kind(self) -> WorkloadKind:
        return WorkloadKind(str(self.workload.get("kind") or WorkloadKind.NONE))

    def __repr__(self) -> str:  # the token is short-lived, but a log line is not the place for it
        return f"BootSpec(broker_url={self.broker_url!r}, keys={len(self.ssh_keys)}, ingress={self.ingress!r})"


class UserDataMeasure(enum.StrEnum):
    RAW = "raw"  # the limit counts the script's bytes before base64 encoding
    BASE64 = "base64"  # the limit counts the base64-encoded form sent on the wire


@dataclass(frozen=True, slots=True)
class LaunchLimits:
    """A cloud's documented limits on what a launch may carry. ``source`` cites the provider's reference."""

    user_data_max_bytes: int
    user_data_measure: UserDataMeasure
    user_data_field: str  # the field's name in the provider's API, for error messages
    source: str
    disk_gb_min: int = 1
    disk_gb_max: int = 16384
    ingress_rules_max: int = 50  # (port, CIDR) pairs one launch may open
    # Key types the cloud's own key mechanism accepts; other keys are installed by the boot script alone.
    native_key_types: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LaunchProblem:
    """A reason the provider would refuse a launch, found before calling it. ``field`` is the buyer's field
    (``launch.workload.script``, ``launch.disk_gb``, ...), so an API answer can point at it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class OrderResource:
    """Something besides the instance that the broker created for an order at a provider, found by its tag."""

    kind: str  # "key_pair", "security_group", "firewall", "network_security_group", ...
    resource_id: str
    region: str
    order_ref: str
    extra: dict[str, Any] = field(default_factory=dict)
