"""What a GCP launch sends: the instance resource, its boot metadata (startup script, SSH keys, driver
flag) and image, and the firewall rules and network tags that let the order's ingress rules in and keep
everyone else out. Pure functions over plain dicts.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.errors import (
    ProviderRequestRejected,
)
from providers.gcp.catalog import InstanceTypeName
from providers.gcp.errors import PROVIDER
from providers.gcp.mapping import _last_segment
from providers.launch import IngressRule, OrderResource
from providers.sshkeys import KEY_TYPES, SshPublicKey

DEFAULT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
DEFAULT_NETWORK = "global/networks/default"
DEFAULT_BOOT_DISK_GB = 100


def instance_resource(
    *,
    name: str,
    zone: str,
    instance_type: InstanceTypeName,
    spot: bool,
    image: str,
    boot_disk_gb: int,
    network: str,
    subnetwork: str | None,
    labels: Mapping[str, str],
    metadata: Mapping[str, str],
    network_tags: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``Instance`` body of ``instances.insert`` (proto field names; ``type_`` as proto-plus spells it).
    ``network_tags`` become ``tags.items``, which firewall rules select instances by."""
    interface: dict[str, Any] = {
        "network": network,
        "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}],
    }
    if subnetwork:
        interface["subnetwork"] = subnetwork
    # GPU VMs cannot live-migrate: GCP rejects onHostMaintenance=MIGRATE for them.
    scheduling: dict[str, Any] = {"on_host_maintenance": "TERMINATE"}
    if spot:
        # DELETE rather than STOP: a stopped Spot VM keeps its disks billed and its name taken.
        scheduling.update(provisioning_model="SPOT", instance_termination_action="DELETE", automatic_restart=False)
    else:
        scheduling.update(provisioning_model="STANDARD", automatic_restart=True)
    resource: dict[str, Any] = {
        "name": name,
        "machine_type": f"zones/{zone}/machineTypes/{instance_type.machine_type}",
        "labels": dict(labels),
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(metadata.items())]},
        "disks": [
            {
                "boot": True,
                "auto_delete": True,
                "type_": "PERSISTENT",
                "initialize_params": {"source_image": image, "disk_size_gb": boot_disk_gb},
            }
        ],
        "network_interfaces": [interface],
        "scheduling": scheduling,
    }
    if network_tags:
        resource["tags"] = {"items": list(network_tags)}
    if instance_type.accelerator is not None:
        resource["guest_accelerators"] = [
            {
                "accelerator_type": f"zones/{zone}/acceleratorTypes/{instance_type.accelerator}",
                "accelerator_count": instance_type.count,
            }
        ]
    return resource


# ------------------------------------------------------------------------------------------------- boot

# Compute Engine API v1, Metadata.items[]: a value's "size must be less than or equal to 262144 bytes (256 KiB)"
# and "the total size of all keys and values must be less than 512 KB" (Metadata resource of
# https://cloud.google.com/compute/docs/reference/rest/v1/instances). Both count raw bytes: values are plain strings.
METADATA_VALUE_MAX_BYTES = 262144
METADATA_SOURCE = (
    "Compute Engine API v1, Metadata.items[].value, https://cloud.google.com/compute/docs/reference/rest/v1/instances"
)
STARTUP_SCRIPT_KEY = "startup-script"
SSH_KEYS_KEY = "ssh-keys"
# "--metadata is used to specify that the NVIDIA driver should be installed on your behalf. The value is
# install-nvidia-driver=True" (Create a Deep Learning VM instance from the command line,
# https://cloud.google.com/deep-learning-vm/docs/cli). Only Deep Learning VM images read it.
DRIVER_METADATA_KEY = "install-nvidia-driver"
DRIVER_METADATA_VALUE = "True"
# The GPU-ready default: a Deep Learning VM image family, resolved to its newest image at launch ("Choose an image",
# https://cloud.google.com/deep-learning-vm/docs/images: Base, CUDA 12.9, Ubuntu 22.04, NVIDIA driver 580).
DLVM_PROJECT = "deeplearning-platform-release"
DLVM_FAMILY = "common-cu129-ubuntu-2204-nvidia-580"
# AttachedDiskInitializeParams.diskSizeGb: "the size of the disk in base-2 GB. The size must be at least 10 GB"
# (https://cloud.google.com/compute/docs/reference/rest/v1/instances); a zonal persistent disk holds at most
# 64 TB ("Storage options", https://cloud.google.com/compute/docs/disks).
DISK_GB_MIN = 10
DISK_GB_MAX = 65536
# Metadata ssh-keys lines are copied into authorized_keys by the guest agent, and "VMs accept the key formats listed
# in the sshd_config file" ("Create SSH keys", https://cloud.google.com/compute/docs/connect/create-ssh-keys): every
# type OpenSSH takes, so every type the broker accepts.
NATIVE_KEY_TYPES = frozenset(KEY_TYPES)

# Firewall rule names and network tags: "1-63 characters long, and comply with RFC1035", i.e.
# [a-z]([-a-z0-9]*[a-z0-9])? (Firewall.name, https://cloud.google.com/compute/docs/reference/rest/v1/firewalls;
# Tags.items, https://cloud.google.com/compute/docs/reference/rest/v1/instances).
FIREWALL_PREFIX = "gbfw-"
TAG_PREFIX = "gb-"
ORDER_MARK = "broker-order="  # firewall rules have no labels: the order rides in the description
ALLOW_PRIORITY = 1000
# Below the allow rules, above the default network's default-allow-ssh/-rdp/-icmp (65534): everyone else stays out.
DENY_PRIORITY = 1001
_RESOURCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ORDER_IN_DESCRIPTION = re.compile(rf"{re.escape(ORDER_MARK)}(\S+)")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image to boot: one image by ``name``, or the newest of a ``family``, in ``project``."""

    project: str
    name: str = ""
    family: str = ""

    def __str__(self) -> str:
        tail = f"family/{self.family}" if self.family else self.name
        return f"projects/{self.project}/global/images/{tail}"

    @property
    def is_deep_learning_vm(self) -> bool:
        return self.project == DLVM_PROJECT


DEFAULT_GPU_IMAGE = ImageRef(DLVM_PROJECT, family=DLVM_FAMILY)
_IMAGE_PATH = re.compile(
    r"^(?:https://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/(?P<project>[^/]+)/)?"
    r"global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)
_PROJECT_FAMILY = re.compile(r"^(?P<project>[a-z][-a-z0-9.:]{1,61}[a-z0-9])/(?P<family>[a-z][-a-z0-9]{0,62})$")


def image_ref(value: str, own_project: str) -> ImageRef:
    """A buyer's image in any form GCP documents: a self link or ``projects/P/global/images/NAME`` (one image),
    ``.../images/family/F`` or ``P/F`` (the newest image of a family), ``global/images/...`` or a bare name (the
    account's own project). Raises ``ProviderRequestRejected`` (code ``invalid``) for anything else."""
    text = value.strip()
    if match := _IMAGE_PATH.match(text):
        project = match["project"] or own_project
        ref = ImageRef(project, name=match["name"] or "", family=match["family"] or "")
    elif match := _PROJECT_FAMILY.match(text):
        ref = ImageRef(match["project"], family=match["family"])
    elif _RESOURCE_NAME.match(text):
        ref = ImageRef(own_project, name=text)
    else:
        raise ProviderRequestRejected(f"not a GCP image reference: {value!r}", code="invalid", provider=PROVIDER)
    if not _RESOURCE_NAME.match(ref.name or ref.family):
        raise ProviderRequestRejected(f"not a GCP image name: {value!r}", code="invalid", provider=PROVIDER)
    return ref


def image_usable(image: Mapping[str, Any]) -> bool:
    """An image GCP will boot: READY and not marked OBSOLETE or DELETED (a DEPRECATED one still boots)."""
    state = str((image.get("deprecated") or {}).get("state") or "")
    return str(image.get("status") or "READY") == "READY" and state not in ("OBSOLETE", "DELETED")


def ssh_keys_value(login_user: str, keys: Iterable[SshPublicKey]) -> str:
    """The ``ssh-keys`` metadata value: one ``USERNAME:KEY_VALUE`` line per key ("Add SSH keys to VMs",
    https://cloud.google.com/compute/docs/connect/add-ssh-keys). No ``google-ssh`` expiry comment: the guest agent
    drops a key whose expiry it cannot parse, and the machine's life bounds the key's anyway."""
    return "\n".join(f"{login_user}:{key.public_key}" for key in keys)


def order_slug(order_ref: str) -> str:
    """At most 40 name-safe characters for an order: the reference itself when it is safe, else a slug and a hash
    (deterministic, so a later search builds the same names)."""
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", order_ref.lower())).strip("-")
    if slug == order_ref and len(slug) <= 40:
        return slug
    digest = hashlib.sha256(order_ref.encode()).hexdigest()[:12]
    return f"{slug[:27].rstrip('-')}-{digest}" if slug else digest


def network_tag(order_ref: str) -> str:
    """The network tag an order's instances carry and its firewall rules target."""
    return f"{TAG_PREFIX}{order_slug(order_ref)}"


def firewall_prefix(order_ref: str) -> str:
    return f"{FIREWALL_PREFIX}{order_slug(order_ref)}-"


@dataclass(frozen=True, slots=True)
class FirewallGroup:
    """One VPC firewall rule's worth of the buyer's ingress: the source ranges and what they may reach."""

    source_ranges: tuple[str, ...]
    allowed: tuple[tuple[str, tuple[int, ...]], ...]  # (protocol, ports)

    @property
    def digest(self) -> str:
        text = repr((self.source_ranges, self.allowed))
        return hashlib.sha256(text.encode()).hexdigest()[:8]


def firewall_groups(ingress: Iterable[IngressRule]) -> list[FirewallGroup]:
    """The buyer's ingress as VPC firewall rules. A rule lets every one of its source ranges reach every one of its
    ports, so only rules naming the same ranges share one (merging others would widen both); and "a firewall rule can
    contain either IPv4 or IPv6 ranges, but not both" ("Use VPC firewall rules",
    https://cloud.google.com/firewall/docs/using-firewalls)."""
    by_ranges: dict[tuple[str, ...], dict[str, set[int]]] = {}
    for rule in ingress:
        for cidrs in (rule.ipv4_cidrs, rule.ipv6_cidrs):
            if not cidrs:
                continue
            ranges = tuple(sorted({str(ipaddress.ip_network(c, strict=False)) for c in cidrs}))
            by_ranges.setdefault(ranges, {}).setdefault(rule.protocol, set()).add(rule.port)
    groups = [
        FirewallGroup(ranges, tuple((proto, tuple(sorted(ports))) for proto, ports in sorted(protocols.items())))
        for ranges, protocols in by_ranges.items()
    ]
    return sorted(groups, key=lambda g: (g.source_ranges, g.allowed))


def _description(order_ref: str, what: str) -> str:
    return f"gpu-broker: {what} {ORDER_MARK}{order_ref}"


def firewall_allow_resource(order_ref: str, group: FirewallGroup, network: str) -> dict[str, Any]:
    """The ``Firewall`` body (proto field names) letting ``group`` reach the order's tagged instances."""
    return {
        "name": f"{firewall_prefix(order_ref)}{group.digest}",
        "description": _description(order_ref, "the buyer's addresses into the machines of"),
        "network": network,
        "direction": "INGRESS",
        "priority": ALLOW_PRIORITY,
        "source_ranges": list(group.source_ranges),
        "target_tags": [network_tag(order_ref)],
        "allowed": [{"I_p_protocol": proto, "ports": [str(p) for p in ports]} for proto, ports in group.allowed],
    }


def firewall_deny_resource(order_ref: str, network: str) -> dict[str, Any]:
    """The rule that keeps every other IPv4 source out of the order's instances, whatever broader allow rules (the
    default network's default-allow-ssh from 0.0.0.0/0) the project has below its priority."""
    return {
        "name": f"{firewall_prefix(order_ref)}deny",
        "description": _description(order_ref, "everyone else out of the machines of"),
        "network": network,
        "direction": "INGRESS",
        "priority": DENY_PRIORITY,
        "source_ranges": ["0.0.0.0/0"],
        "target_tags": [network_tag(order_ref)],
        "denied": [{"I_p_protocol": "all"}],
    }


def firewall_order_ref(item: Mapping[str, Any]) -> str | None:
    """The order a broker firewall rule belongs to (from its description); None for anyone else's rule."""
    if not str(item.get("name", "")).startswith(FIREWALL_PREFIX):
        return None
    match = _ORDER_IN_DESCRIPTION.search(str(item.get("description") or ""))
    if match is None or not str(item["name"]).startswith(firewall_prefix(match[1])):
        return None
    return match[1]


def firewall_order_resource(item: Mapping[str, Any]) -> OrderResource | None:
    """A broker firewall rule as an ``OrderResource`` (firewall rules are global: region ``global``); kind
    ``firewall`` for the allow rules, ``firewall_deny`` for the rule that keeps everyone else out."""
    order_ref = firewall_order_ref(item)
    if order_ref is None:
        return None
    denies = bool(item.get("denied"))
    return OrderResource(
        kind="firewall_deny" if denies else "firewall",
        resource_id=str(item["name"]),
        region="global",
        order_ref=order_ref,
        extra={
            "network": _last_segment(str(item.get("network", ""))),
            "priority": int(item.get("priority") or 0),
            "source_ranges": list(item.get("source_ranges") or []),
            "target_tags": list(item.get("target_tags") or []),
            "ports": sorted(str(port) for rule in item.get("allowed") or [] for port in rule.get("ports") or []),
        },
    )
