"""What a GCP launch carries, as the sandbox checks and keeps it: images (public Deep Learning VM, Ubuntu and
Debian families, plus any a test adds), instance metadata limits, network tags, boot disks, and VPC firewall
rules. Pure helpers in Compute Engine's wire format (camelCase JSON); ``sandboxes.gcp.app`` serves them.

Limits and shapes, each from the Compute Engine v1 reference unless noted:

- ``Metadata.items[]``: keys match ``[a-zA-Z0-9-_]+`` and are under 128 bytes; a value is at most 262144 bytes;
  all keys and values together under 512 KB (https://cloud.google.com/compute/docs/reference/rest/v1/instances).
  GCP's refusal of a long value reads "Value for field 'resource.metadata.items[2].value' is too large: maximum
  size 32768 character(s); actual size 33595." (seen when the limit was 32 KiB, kubernetes/kubernetes#37180).
- ``Tags.items[]`` and ``Firewall.name``: 1-63 characters, RFC 1035 (``[a-z]([-a-z0-9]*[a-z0-9])?``)
  (https://cloud.google.com/compute/docs/reference/rest/v1/firewalls).
- ``AttachedDiskInitializeParams.diskSizeGb``: at least 10 GB, and never below the image's size; a zonal
  persistent disk holds at most 64 TB (https://cloud.google.com/compute/docs/disks).
- a firewall rule holds "either IPv4 or IPv6 ranges, but not both" (https://cloud.google.com/firewall/docs/
  using-firewalls); exactly one of ``allowed`` and ``denied``; ports only for tcp, udp and sctp.

Where GCP's exact error wording is not documented the messages here are the sandbox's own; the HTTP status (400)
and ``errors[].reason`` (``invalid``) are what GCP answers for a bad field.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from providers import gpu_names
from sandboxes.gcp.wire import API_BASE, CREATED, ApiError, last_segment, numeric_id

METADATA_VALUE_MAX = 262144
METADATA_TOTAL_MAX = 512 * 1024
METADATA_KEY_MAX = 128
DISK_GB_MIN = 10
DISK_GB_MAX = 65536
_METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]+$")
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_PORTS = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")
PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp"})
PROTOCOLS = frozenset({"tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all"})

# What each accelerator type shows a booted machine: the broker's GPU key and the card's memory in GB.
SIMULATED_GPUS: dict[str, tuple[str, int]] = {
    "nvidia-tesla-t4": (gpu_names.T4, 16),
    "nvidia-tesla-v100": (gpu_names.V100_16_SXM2, 16),
    "nvidia-tesla-a100": (gpu_names.A100_40_SXM, 40),
    "nvidia-a100-80gb": (gpu_names.A100_80_SXM, 80),
    "nvidia-l4": (gpu_names.L4, 24),
    "nvidia-h100-80gb": (gpu_names.H100_SXM, 80),
    "nvidia-h100-mega-80gb": (gpu_names.H100_SXM, 80),
    "nvidia-h200-141gb": (gpu_names.H200_SXM, 141),
}


# ------------------------------------------------------------------------------------------------ images


@dataclass(frozen=True, slots=True)
class SeedImage:
    """One image the sandbox serves. Names are dated as GCP dates them; the sizes are the sandbox's own."""

    project: str
    name: str
    family: str
    disk_size_gb: int
    description: str


# Families named in Google's own pages: Deep Learning VM "Choose an image"
# (https://cloud.google.com/deep-learning-vm/docs/images), and the Ubuntu and Debian public images.
PUBLIC_IMAGES: tuple[SeedImage, ...] = (
    SeedImage(
        "deeplearning-platform-release",
        "common-cu129-ubuntu-2204-nvidia-580-v20260416",
        "common-cu129-ubuntu-2204-nvidia-580",
        50,
        "Google, Deep Learning VM, Base, CUDA 12.9, Ubuntu 22.04, NVIDIA driver 580",
    ),
    SeedImage(
        "deeplearning-platform-release",
        "common-cu129-ubuntu-2404-nvidia-580-v20260416",
        "common-cu129-ubuntu-2404-nvidia-580",
        50,
        "Google, Deep Learning VM, Base, CUDA 12.9, Ubuntu 24.04, NVIDIA driver 580",
    ),
    SeedImage(
        "deeplearning-platform-release",
        "pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20260416",
        "pytorch-2-9-cu129-ubuntu-2204-nvidia-580",
        50,
        "Google, Deep Learning VM, PyTorch 2.9, CUDA 12.9, Ubuntu 22.04, NVIDIA driver 580",
    ),
    SeedImage(
        "ubuntu-os-cloud",
        "ubuntu-2204-jammy-v20260401",
        "ubuntu-2204-lts",
        10,
        "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image",
    ),
    SeedImage("debian-cloud", "debian-12-bookworm-v20260401", "debian-12", 10, "Debian, Debian GNU/Linux, 12"),
)


def image_json(image: SeedImage) -> dict[str, Any]:
    """An ``Image`` resource as ``images.get`` answers it."""
    return {
        "kind": "compute#image",
        "id": numeric_id("image", image.project, image.name),
        "creationTimestamp": CREATED,
        "name": image.name,
        "description": image.description,
        "sourceType": "RAW",
        "status": "READY",
        "archiveSizeBytes": str(image.disk_size_gb * 1024**3 // 5),
        "diskSizeGb": str(image.disk_size_gb),
        "family": image.family,
        "selfLink": f"{API_BASE}projects/{image.project}/global/images/{image.name}",
        "labelFingerprint": "42WmSpB8rSM=",
        "guestOsFeatures": [{"type": "UEFI_COMPATIBLE"}, {"type": "VIRTIO_SCSI_MULTIQUEUE"}, {"type": "GVNIC"}],
        "storageLocations": ["us", "eu", "asia"],
        "architecture": "X86_64",
    }


_IMAGE_LINK = re.compile(
    r"(?:^|/)projects/(?P<project>[^/]+)/global/images/(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)


def image_of_source(source: str, project: str) -> tuple[str, str, str] | None:
    """(project, name, family) of a ``sourceImage`` (self link, partial URL, ``global/images/...``); None when it
    is none of those."""
    text = source if "projects/" in source else f"projects/{project}/{source.lstrip('/')}"
    match = _IMAGE_LINK.search(text)
    if match is None:
        return None
    return match["project"], match["name"] or "", match["family"] or ""


def image_path(project: str, name: str = "", family: str = "") -> str:
    return f"projects/{project}/global/images/{f'family/{family}' if family else name}"


def image_not_found(path: str) -> ApiError:
    """GCP's 404 for an image or family it does not have."""
    return ApiError(404, f"The resource '{path}' was not found", "notFound")


# --------------------------------------------------------------------------------------------- instances


def invalid(field_name: str, value: Any, reason: str) -> ApiError:
    return ApiError(400, f"Invalid value for field '{field_name}': '{value}'. {reason}", "invalid")


def check_metadata(body: dict[str, Any]) -> None:
    """GCP's checks on ``metadata.items[]``; raises the 400 it answers."""
    items = [i for i in (body.get("metadata") or {}).get("items") or [] if i]
    seen: set[str] = set()
    total = 0
    for index, item in enumerate(items):
        key, value = str(item.get("key") or ""), str(item.get("value") or "")
        if not _METADATA_KEY.match(key) or len(key.encode()) >= METADATA_KEY_MAX:
            raise invalid(f"resource.metadata.items[{index}].key", key, "Must be a match of regex '[a-zA-Z0-9-_]+'")
        if key in seen:
            raise invalid("resource.metadata", key, f"Duplicate metadata key '{key}'.")
        seen.add(key)
        size = len(value.encode())
        if size > METADATA_VALUE_MAX:
            raise ApiError(
                400,
                f"Value for field 'resource.metadata.items[{index}].value' is too large: maximum size "
                f"{METADATA_VALUE_MAX} character(s); actual size {size}.",
                "invalid",
            )
        total += len(key.encode()) + size
    if total >= METADATA_TOTAL_MAX:
        raise ApiError(
            400,
            f"Metadata for field 'resource.metadata' is too large: the total size of all keys and values must be "
            f"less than {METADATA_TOTAL_MAX} bytes; actual size {total}.",
            "invalid",
        )


def check_tags(body: dict[str, Any]) -> list[str]:
    """The instance's network tags, checked as GCP checks them."""
    tags = [str(t) for t in (body.get("tags") or {}).get("items") or []]
    for index, tag in enumerate(tags):
        if not NAME.match(tag):
            raise invalid(f"resource.tags.items[{index}]", tag, "Must be a match of regex '[a-z]([-a-z0-9]*[a-z0-9])?'")
    return sorted(set(tags))


def check_disk_size(params: dict[str, Any], image_gb: int | None) -> int | None:
    """The requested boot disk size (None: the image's), refused below 10 GB, above 64 TB or below the image."""
    raw = params.get("diskSizeGb")
    if raw in (None, ""):
        return None
    try:
        size = int(str(raw))
    except ValueError:
        raise invalid("resource.disks[0].initializeParams.diskSizeGb", raw, "Must be an integer.") from None
    if not DISK_GB_MIN <= size <= DISK_GB_MAX:
        raise invalid(
            "resource.disks[0].initializeParams.diskSizeGb",
            size,
            f"Disk size must be between {DISK_GB_MIN} GB and {DISK_GB_MAX} GB.",
        )
    if image_gb is not None and size < image_gb:
        raise ApiError(
            400,
            f"Invalid value for field 'resource.disks[0].initializeParams.diskSizeGb': '{size}'. Requested disk "
            f"size cannot be smaller than the image size ({image_gb} GB)",
            "invalid",
        )
    return size


def disk_json(project: str, zone: str, name: str, size_gb: int, source_image: str, image_id: str) -> dict[str, Any]:
    """The boot ``Disk`` resource an insert creates beside its instance (``disks.get``)."""
    zone_url = f"{API_BASE}projects/{project}/zones/{zone}"
    return {
        "kind": "compute#disk",
        "id": numeric_id("disk", project, zone, name),
        "creationTimestamp": CREATED,
        "name": name,
        "sizeGb": str(size_gb),
        "zone": zone_url,
        "status": "READY",
        "selfLink": f"{zone_url}/disks/{name}",
        "sourceImage": source_image,
        "sourceImageId": image_id,
        "type": f"{zone_url}/diskTypes/pd-standard",
        "users": [f"{zone_url}/instances/{name}"],
        "physicalBlockSizeBytes": "4096",
    }


def ssh_key_lines(value: str) -> list[tuple[str, str]]:
    """The (user, "type base64") pairs of an ``ssh-keys`` value, as the guest agent reads its lines."""
    pairs: list[tuple[str, str]] = []
    for line in value.splitlines():
        user, sep, key = line.strip().partition(":")
        parts = key.split()
        if sep and user and len(parts) >= 2:
            pairs.append((user, f"{parts[0]} {parts[1]}"))
    return pairs


# ------------------------------------------------------------------------------------------------ firewalls


def _ports_ok(port: str) -> bool:
    match = _PORTS.match(port)
    if match is None:
        return False
    low, high = int(match[1]), int(match[2] or match[1])
    return 0 <= low <= high <= 65535


def _rules(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rules = []
    for index, rule in enumerate(r for r in body.get(key) or [] if r):
        protocol = str(rule.get("IPProtocol") or "").lower()
        if protocol not in PROTOCOLS and not protocol.isdigit():
            raise invalid(f"resource.{key}[{index}].IPProtocol", protocol, "Unknown protocol.")
        ports = [str(p) for p in rule.get("ports") or []]
        if ports and protocol not in PORT_PROTOCOLS:
            raise invalid(f"resource.{key}[{index}].ports", ports, "Ports may only be given for tcp, udp and sctp.")
        for port in ports:
            if not _ports_ok(port):
                raise invalid(f"resource.{key}[{index}].ports", port, "Must be a port or a port range.")
        rules.append({"IPProtocol": protocol, **({"ports": ports} if ports else {})})
    return rules


def firewall_json(project: str, body: dict[str, Any]) -> dict[str, Any]:
    """A ``firewalls.insert`` body checked as GCP checks it and normalised to what ``firewalls.get`` answers."""
    name = str(body.get("name") or "")
    if not NAME.match(name):
        raise invalid("resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    direction = str(body.get("direction") or "INGRESS")
    if direction not in ("INGRESS", "EGRESS"):
        raise invalid("resource.direction", direction, "Must be INGRESS or EGRESS.")
    priority = int(str(body.get("priority") if body.get("priority") is not None else 1000))
    if not 0 <= priority <= 65535:
        raise invalid("resource.priority", priority, "Must be between 0 and 65535.")
    ranges = [str(r) for r in body.get("sourceRanges") or []]
    versions = set()
    for index, cidr in enumerate(ranges):
        try:
            versions.add(ipaddress.ip_network(cidr, strict=False).version)
        except ValueError:
            raise invalid(f"resource.sourceRanges[{index}]", cidr, "Must be a CIDR range.") from None
    if len(versions) > 1:
        raise invalid("resource.sourceRanges", ",".join(ranges), "A rule holds IPv4 or IPv6 ranges, not both.")
    allowed, denied = _rules(body, "allowed"), _rules(body, "denied")
    if bool(allowed) == bool(denied):
        raise invalid("resource", name, "Exactly one of 'allowed' and 'denied' must be specified.")
    targets = [str(t) for t in body.get("targetTags") or []]
    for index, tag in enumerate(targets):
        if not NAME.match(tag):
            raise invalid(f"resource.targetTags[{index}]", tag, "Must be a match of regex '[a-z]([-a-z0-9]*[a-z0-9])?'")
    network = last_segment(str(body.get("network") or "default"))
    firewall: dict[str, Any] = {
        "kind": "compute#firewall",
        "id": numeric_id("firewall", project, name),
        "creationTimestamp": CREATED,
        "name": name,
        "description": str(body.get("description") or ""),
        "network": f"{API_BASE}projects/{project}/global/networks/{network}",
        "priority": priority,
        "sourceRanges": ranges,
        "targetTags": targets,
        "direction": direction,
        "logConfig": {"enable": False},
        "disabled": bool(body.get("disabled", False)),
        "selfLink": f"{API_BASE}projects/{project}/global/firewalls/{name}",
    }
    firewall["allowed" if allowed else "denied"] = allowed or denied
    return firewall


def _ports_of(rule: dict[str, Any]) -> list[int]:
    ports: list[int] = []
    for text in rule.get("ports") or []:
        match = _PORTS.match(str(text))
        if match:
            ports.extend(range(int(match[1]), int(match[2] or match[1]) + 1))
    return ports


def _opens(rule: dict[str, Any], key: str, protocol: str, port: int) -> bool:
    return any(
        r.get("IPProtocol") in (protocol, "all") and (not r.get("ports") or port in _ports_of(r)) for r in rule[key]
    )


def _covers(rule: dict[str, Any], cidr: str) -> bool:
    inner = ipaddress.ip_network(cidr, strict=False)
    for source in rule.get("sourceRanges") or []:
        outer = ipaddress.ip_network(source, strict=False)
        if outer.version == inner.version and inner.subnet_of(outer):  # type: ignore[arg-type]  # same version
            return True
    return False


def lets_in(rules: list[dict[str, Any]], network: str, tags: list[str], protocol: str = "tcp") -> set[tuple[int, str]]:
    """Each (port, source range) the project's rules let reach an instance on ``network`` with ``tags``: opened by
    an enabled ingress allow rule and not closed by a deny rule of higher or equal precedence (a lower or equal
    priority number; GCP lets a deny win a tie) covering that port and range. Port ranges are expanded; an allow
    rule naming no ports (every port) is left out rather than listed 65536 times."""
    applicable = [
        r for r in rules if not r.get("disabled") and r.get("direction") == "INGRESS" and applies_to(r, network, tags)
    ]
    denies = [r for r in applicable if r.get("denied")]
    pairs: set[tuple[int, str]] = set()
    for rule in applicable:
        for allowed in rule.get("allowed") or []:
            if allowed.get("IPProtocol") not in (protocol, "all"):
                continue
            for port in _ports_of(allowed):
                for cidr in rule.get("sourceRanges") or []:
                    closed = any(
                        d["priority"] <= rule["priority"] and _opens(d, "denied", protocol, port) and _covers(d, cidr)
                        for d in denies
                    )
                    if not closed:
                        pairs.add((port, cidr))
    return pairs


def applies_to(firewall: dict[str, Any], network: str, tags: list[str]) -> bool:
    """Does the rule apply to an instance on ``network`` carrying ``tags``?"""
    if last_segment(str(firewall.get("network", ""))) != last_segment(network):
        return False
    targets = firewall.get("targetTags") or []
    return not targets or bool(set(targets) & set(tags))


def operation_name(target: str, counter: int, stamp: int) -> str:
    return f"operation-{stamp}-{hashlib.sha256(f'{counter}{target}'.encode()).hexdigest()[:13]}-{counter:08x}-sandbox"
