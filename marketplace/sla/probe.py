"""The broker's own SSH reachability check of each running order (issue 38).

A probe opens a TCP connection to where the buyer reaches the machine (``launch.leases.connection_host`` and the
lease's SSH port) and reads the server's identification string, which an SSH server sends first (RFC 4253,
section 4.2: ``SSH-protoversion-softwareversion``, at most 255 characters with its CR LF, possibly after other
lines). Everything has one total deadline (``BROKER_SLA_SSH_TIMEOUT_S``) and the read is bounded, so a host that
trickles bytes or sends megabytes costs one probe's time and a few kilobytes.

``BROKER_SLA_SSH_FAILURES`` failed probes in a row open an ``ssh_unreachable`` outage starting at the first of
them; one answered probe closes it. The count lives in ``SshWatch``, updated under its row lock after the probe,
so two probes of the same order (a retried task beside the next tick's) never lose a count.
"""

from __future__ import annotations

import datetime as dt
import socket
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.launch.leases import connection_host
from marketplace.launch.selectors import SSH_PORT
from marketplace.models import Instance, Lease, LeaseState, Order, OrderState, OutageCause, SshWatch
from marketplace.orders.outages import outage_close, outage_open

# RFC 4253 4.2: the identification line is at most 255 characters; lines before it are allowed, so a few are
# read, but never more than this in all.
MAX_BANNER_BYTES = 4096
MAX_LINE = 255
# SSH 2 servers, and those that also speak 1.x and say so with 1.99 (RFC 4253, section 5.1).
SSH2_PREFIXES = (b"SSH-2.0-", b"SSH-1.99-")


class ProbeFailed(Exception):
    """The endpoint did not answer as an SSH 2 server within the deadline; the message says how."""


def ssh_banner(host: str, port: int, *, timeout_s: float) -> str:
    """The SSH server's identification line at ``host:port``, or ``ProbeFailed``. Connect and read share one
    total deadline of ``timeout_s``; at most ``MAX_BANNER_BYTES`` are read."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            received = b""
            while len(received) < MAX_BANNER_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProbeFailed(f"no SSH identification within {timeout_s:g} s")
                sock.settimeout(left)
                chunk = sock.recv(MAX_BANNER_BYTES - len(received))
                if not chunk:
                    raise ProbeFailed("the connection closed before an SSH identification")
                received += chunk
                *lines, _rest = received.split(b"\n")
                for line in lines:
                    line = line.rstrip(b"\r")
                    if line.startswith(b"SSH-"):
                        if len(line) > MAX_LINE or not line.startswith(SSH2_PREFIXES):
                            raise ProbeFailed(f"not an SSH 2 identification: {line[:40]!r}")
                        return line.decode("ascii", "replace")
            raise ProbeFailed(f"no SSH identification in the first {MAX_BANNER_BYTES} bytes")
    except TimeoutError:
        raise ProbeFailed(f"no SSH identification within {timeout_s:g} s") from None
    except OSError as exc:
        raise ProbeFailed(f"could not connect: {exc.strerror or exc}") from None


def ssh_target(order: Order) -> tuple[Instance, str, int] | None:
    """The running order's machine and where its SSH server is reached; None when there is nothing to probe
    (not running, no active machine, its lease not ready or without an address)."""
    if order.state != OrderState.RUNNING:
        return None
    instance = Instance.objects.filter(order=order, active=True).first()
    if instance is None:
        return None
    lease = Lease.objects.filter(attempt_id=instance.attempt_id, state=LeaseState.READY).first()
    if lease is None:
        return None
    host = connection_host(lease, instance)
    if not host:
        return None
    return instance, host, lease.ssh_port or SSH_PORT


def order_ssh_probe(*, order_id: int, now: dt.datetime | None = None) -> bool | None:
    """Probe the order's SSH server once and record the result: True answered, False failed, None nothing to
    probe. The ``BROKER_SLA_SSH_FAILURES``-th failure in a row opens an ``ssh_unreachable`` outage from the first
    failed probe; an answer closes any open one at ``now``. Safe to run twice and beside itself."""
    order = Order.objects.get(pk=order_id)
    target = ssh_target(order)
    if target is None:
        return None
    instance, host, port = target
    error = ""
    try:
        ssh_banner(host, port, timeout_s=settings.SLA_SSH_TIMEOUT_S)
    except ProbeFailed as exc:
        error = str(exc)
    now = now or timezone.now()
    with transaction.atomic():
        watch, _ = SshWatch.objects.get_or_create(order_id=order_id)
        watch = SshWatch.objects.select_for_update().get(pk=watch.pk)
        watch.last_probe_at = now
        if not error:
            watch.failures, watch.first_failed_at, watch.last_error = 0, None, ""
            outage_close(order_id=order_id, cause=OutageCause.SSH_UNREACHABLE, at=now)
        else:
            watch.failures += 1
            watch.first_failed_at = watch.first_failed_at or now
            watch.last_error = error[:200]
            if watch.failures >= settings.SLA_SSH_FAILURES:
                outage_open(
                    order_id=order_id,
                    cause=OutageCause.SSH_UNREACHABLE,
                    at=watch.first_failed_at,
                    instance=instance,
                    detail=f"{host}:{port}: {error} ({watch.failures} probes in a row)",
                )
        watch.save()
    return not error


def orders_to_probe() -> list[int]:
    """Running orders whose machine's lease is ready: the ones with an SSH server to probe."""
    return list(
        Instance.objects.filter(active=True, order__state=OrderState.RUNNING, attempt__lease__state=LeaseState.READY)
        .order_by("order_id")
        .values_list("order_id", flat=True)
        .distinct()
    )
