"""Compute Engine instances -> broker DTOs: the state an instance reports (or the operation that
stands for it), the names, labels and request ids the broker gives an instance, and the handle it reads back.

Pure functions: nothing here imports the SDK, so the tables are testable offline. ``client.py`` converts every
SDK message to a dict (``Message.to_dict``) before it reaches this module or its siblings (``errors``,
``catalog``, ``launching``).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from providers.errors import (
    ProviderRequestRejected,
)
from providers.gcp.catalog import ATTACHED_GPU_SERIES, InstanceTypeName, region_of_zone
from providers.gcp.errors import PROVIDER, malformed, operation_error
from providers.types import InstanceHandle, InstanceState

ORDER_LABEL = "broker-order"  # GCP label keys allow only [a-z0-9_-]: the broker's "broker:order" becomes this
IDEMPOTENCY_METADATA = "broker-client-token"
ORDER_METADATA = "broker-order-ref"  # the unencoded order ref, when the label had to encode it
COMPUTE_SERVICE = "services/6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
# Self links and target links always use this base, whatever endpoint the client talks to.
API_BASE = "https://www.googleapis.com/compute/v1/"
_REQUEST_ID_NAMESPACE = uuid.UUID("5b0f3c1e-2f6a-4c1e-9a43-6f1d2c3b4a50")  # fixed: request ids must be stable

# ------------------------------------------------------------------------------------------- instances

STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    # GCP is restarting the instance on another host after a failure: it will be back without a new launch.
    "REPAIRING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING,
    "PENDING_STOP": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.STOPPING,
    # GCP's TERMINATED means *stopped*: the instance and its disks still exist and ``instances.start`` brings it
    # back (issue 36). A deleted instance 404s; describe reports that as terminated.
    "TERMINATED": InstanceState.STOPPED,
}
# Statuses in which the outcome lives on an operation: a failed insert or a running delete.
OPERATION_STATUSES = frozenset({"PROVISIONING", "STOPPING"})
GONE_OPERATIONS = frozenset({"delete", "compute.instances.preempted"})


def instance_state(status: str) -> InstanceState:
    return STATES.get(status, InstanceState.UNKNOWN)


def instance_name(client_token: str) -> str:
    """A valid, deterministic instance name for a client token: ``gb-<slug>-<hash>``, at most 59 characters.

    The slug keeps the name readable; the hash keeps two tokens that slug alike apart.
    """
    if not client_token:
        raise ProviderRequestRejected("client_token is required for an idempotent launch", provider=PROVIDER)
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", client_token.lower())).strip("-")[:44].rstrip("-")
    digest = hashlib.sha256(client_token.encode()).hexdigest()[:10]
    return f"gb-{slug}-{digest}" if slug else f"gb-{digest}"


def request_id(action: str, key: str) -> str:
    """The ``requestId`` GCP deduplicates on: a UUID derived from the action and the broker's key."""
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{action}/{key}"))


_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def label_value(value: str) -> str:
    """A GCP label value for ``value``: itself when valid, else a lower-cased slug plus a hash (deterministic,
    so a search encodes the same way)."""
    if _LABEL_VALUE.match(value):
        return value
    slug = re.sub(r"[^a-z0-9_-]+", "-", value.lower())[:50]
    return f"{slug}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


def labels(order_ref: str, tags: Mapping[str, str]) -> dict[str, str]:
    """Labels for the instance: caller tags made label-safe, then the order label (which always wins)."""
    result: dict[str, str] = {}
    for key, value in sorted(tags.items()):
        safe = re.sub(r"[^a-z0-9_-]+", "_", key.lower())[:63]
        if not _LABEL_KEY.match(safe):
            safe = f"t_{safe}"[:63]
        result[safe] = label_value(value)
    result[ORDER_LABEL] = label_value(order_ref)
    return result


def instance_link(project: str, zone: str, name: str) -> str:
    return f"{API_BASE}projects/{project}/zones/{zone}/instances/{name}"


def split_instance_id(region: str, instance_id: str) -> tuple[str, str]:
    """``<zone>/<name>`` -> (zone, name), checking the zone belongs to ``region``."""
    zone, sep, name = instance_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        raise ProviderRequestRejected(
            f"GCP instance ids are '<zone>/<name>', got {instance_id!r}", code="invalid", provider=PROVIDER
        )
    if region_of_zone(zone) != region:
        raise ProviderRequestRejected(f"zone {zone} is not in region {region}", code="invalid", provider=PROVIDER)
    return zone, name


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def broker_instance_type(item: Mapping[str, Any]) -> str:
    """The broker's name for an instance's type: the machine type, plus ``+NxGPU`` for attached GPUs."""
    machine = _last_segment(str(item.get("machine_type", "")))
    attached = list(item.get("guest_accelerators") or [])
    if attached and machine.startswith(ATTACHED_GPU_SERIES):
        first = attached[0]
        count = sum(int(a.get("accelerator_count") or 0) for a in attached)
        return str(InstanceTypeName(machine, _last_segment(str(first.get("accelerator_type", ""))), count))
    return machine


def instance_handle(item: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> InstanceHandle:
    """An ``Instance`` dict -> ``InstanceHandle`` with id ``<zone>/<name>``."""
    try:
        zone = _last_segment(str(item["zone"]))
        status = str(item.get("status", ""))
        interfaces = list(item.get("network_interfaces") or [])
        private_ip = str(interfaces[0].get("network_i_p") or "") if interfaces else ""
        access = list(interfaces[0].get("access_configs") or []) if interfaces else []
        public_ip = str(access[0].get("nat_i_p") or "") if access else ""
        scheduling = item.get("scheduling") or {}
        metadata = {str(i.get("key")): str(i.get("value", "")) for i in (item.get("metadata") or {}).get("items") or []}
        return InstanceHandle(
            instance_id=f"{zone}/{item['name']}",
            region=region_of_zone(zone),
            zone=zone,
            instance_type=broker_instance_type(item),
            state=instance_state(status),
            public_ip=public_ip or None,
            private_ip=private_ip or None,
            launched_at=str(item.get("creation_timestamp") or "") or None,
            tags={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
            extra={
                "status": status,
                "gcp_id": str(item.get("id", "")),
                "machine_type": _last_segment(str(item.get("machine_type", ""))),
                "provisioning_model": str(scheduling.get("provisioning_model") or "STANDARD"),
                "client_token": metadata.get(IDEMPOTENCY_METADATA, ""),
                "order_ref": metadata.get(ORDER_METADATA, ""),
                "self_link": str(item.get("self_link", "")),
                **(extra or {}),
            },
        )
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise malformed(f"unreadable instance entry ({exc!r})") from None


def latest_operation(operations: Iterable[Mapping[str, Any]], kinds: Iterable[str] | None = None) -> dict[str, Any]:
    """The newest operation (by insert time, then list order) of the given types; {} when there is none."""
    wanted = set(kinds) if kinds is not None else None
    chosen: dict[str, Any] = {}
    for op in operations:
        if wanted is not None and str(op.get("operation_type", "")) not in wanted:
            continue
        if not chosen or str(op.get("insert_time", "")) >= str(chosen.get("insert_time", "")):
            chosen = dict(op)
    return chosen


def operation_extra(operation: Mapping[str, Any]) -> dict[str, Any]:
    """What a handle carries about the operation that decided its state (``error_*`` when it failed)."""
    extra: dict[str, Any] = {
        "operation": str(operation.get("name", "")),
        "operation_type": str(operation.get("operation_type", "")),
        "operation_status": str(operation.get("status", "")),
    }
    failure = operation_error(operation)
    if failure is not None:
        extra.update(error_class=failure.error_class, error_code=failure.code, error_message=failure.message)
    return extra


def handle_without_instance(
    zone: str, name: str, operations: Sequence[Mapping[str, Any]], instance_type: str = ""
) -> InstanceHandle | None:
    """The handle for an instance that 404s, decided by its newest operation; None if GCP never heard of it.

    A delete (or preemption) means terminated; a failed insert means failed, with the operation's error; an insert
    still running means pending (the instance is not visible yet); a finished insert with no instance means it
    was removed since.
    """
    gone = latest_operation(operations, GONE_OPERATIONS)
    insert = latest_operation(operations, {"insert"})
    if not gone and not insert:
        return None
    if gone and (not insert or str(gone.get("insert_time", "")) >= str(insert.get("insert_time", ""))):
        newest, state = gone, InstanceState.TERMINATED
    elif operation_error(insert) is not None:
        newest, state = insert, InstanceState.FAILED
    elif str(insert.get("status")) != "DONE":
        newest, state = insert, InstanceState.PENDING
    else:
        newest, state = insert, InstanceState.TERMINATED
    return InstanceHandle(
        instance_id=f"{zone}/{name}",
        region=region_of_zone(zone),
        zone=zone,
        instance_type=instance_type,
        state=state,
        extra={"status": "", **operation_extra(newest)},
    )
