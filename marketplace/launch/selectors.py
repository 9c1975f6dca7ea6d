"""Reads about a rented machine: how to connect to it, and where its boot stands."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from marketplace.launch.leases import connection_host
from marketplace.models import Instance, LaunchTemplate, Lease, LeaseState, Order, Organization

SSH_PORT = 22


def _lease_of(order: Order, instance: Instance | None) -> Lease | None:
    if instance is None:
        return None
    # Prefetched on listings (``order_list``): pick from the cache instead of one query per order.
    for lease in order.leases.all():
        if lease.attempt_id == instance.attempt_id:
            return lease
    return None


def known_hosts_line(host: str, port: int, public_key: str) -> str:
    """The ``known_hosts`` entry OpenSSH expects for ``host:port`` (bracketed when the port is not 22)."""
    name = host if port == SSH_PORT else f"[{host}]:{port}"
    return f"{name} {public_key}"


def order_connection(order: Order) -> dict[str, Any] | None:
    """How the buyer reaches a ready machine: the ``ssh`` command, the host keys to check on first connection
    (fingerprints, and the ``known_hosts`` lines the client pins them with), a URL per exposed port. None until
    the order's machine is ready, and once it is gone."""
    instance = order.instance
    lease = _lease_of(order, instance)
    if instance is None or not instance.active or lease is None or lease.state != LeaseState.READY:
        return None
    host = connection_host(lease, instance)
    port = lease.ssh_port or SSH_PORT
    user = lease.ssh_user or "root"
    ssh = f"ssh {user}@{host}" if port == SSH_PORT else f"ssh -p {port} {user}@{host}"
    ports = [p for p in (order.launch_config.spec.get("ports") if order.launch_config else None) or [] if p != 22]
    return {
        "ssh": ssh,
        "host": host,
        "port": port,
        "user": user,
        "host_keys": [
            {"type": k["type"], "fingerprint": k["fingerprint"], "public_key": k["public_key"]} for k in lease.host_keys
        ],
        "known_hosts": [known_hosts_line(host, port, k["public_key"]) for k in lease.host_keys],
        "urls": [{"port": p, "url": f"http://{host}:{(lease.ports or {}).get(str(p), p)}"} for p in ports],
        "ready_at": instance.ready_at,
    }


def order_boot(order: Order) -> dict[str, Any] | None:
    """Where the current machine's boot stands: the lease's state, its deadline, what the agent saw and started,
    and why it failed. None for an order that never launched a machine with a lease."""
    instance = order.instance
    lease = _lease_of(order, instance)
    if lease is None:
        return None
    failure = None
    if lease.failure_reason:
        failure = {"stage": lease.failure_stage, "reason": lease.failure_reason}
    return {
        "state": lease.state,
        "deadline": lease.boot_deadline,
        "claimed_at": lease.claimed_at,
        "ready_at": lease.ready_at,
        "gpus": [f"{g.get('name')} {g.get('memory_gb')} GB" for g in lease.gpus],
        "workload": lease.workload_detail,
        "failure": failure,
    }


def launch_template_list(*, organization: Organization) -> QuerySet[LaunchTemplate]:
    """The organisation's launch templates by name, with their configurations (the storefront lists them)."""
    return (
        LaunchTemplate.objects.filter(organization=organization)
        .select_related("configuration", "created_by")
        .order_by("name")
    )
