"""What a fleet's rule reads: the replicas' GPU utilization from their agents' heartbeats, and the workload's
metric, POSTed by the workload or read from a Prometheus text endpoint on each running replica.

Everything here comes from outside and is treated as hostile: a posted value is a finite number within
``METRIC_VALUE_BOUND``, a fleet takes at most ``MAX_POSTS_PER_MINUTE`` posts, and a replica's endpoint is read
over one plain HTTP/1.0 GET with a total deadline (``settings.FLEET_SCRAPE_DEADLINE_S``, for connecting,
sending and reading together, so a machine that trickles bytes cannot hold a worker) and at most
``SCRAPE_MAX_BYTES`` of answer.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count
from prometheus_client.parser import text_string_to_metric_families

from marketplace.fleets.specs import FleetInvalid
from marketplace.launch.leases import connection_host
from marketplace.models import Fleet, FleetMetricSample, LeaseHeartbeat, Order, OrderState
from marketplace.models.fleets import METRIC_VALUE_BOUND, MetricSource
from providers.addresses import is_public

log = logging.getLogger(__name__)

MAX_POSTS_PER_MINUTE = 600  # ten a second over the whole fleet: enough for 64 replicas posting every 10 s
SCRAPE_MAX_BYTES = 1024 * 1024
SAMPLES_KEPT = dt.timedelta(days=1)


class MetricRefused(Exception):
    """A post the fleet does not take now (too many this minute); ``code`` is machine-readable."""

    code = "rate_limited"


def metric_record(*, fleet: Fleet, name: Any, value: Any, replica: Any = None, now: dt.datetime) -> FleetMetricSample:
    """Store one value of the fleet's metric, posted by its workload. ``replica`` (an order's public id, optional)
    says which replica measured it: values of one replica are averaged over the window, and the fleet's load
    is the sum over replicas (a value without a replica counts as one source of its own).

    Raises ``FleetInvalid`` naming the field (a name other than the rule's metric, a value that is not a finite
    number within ±1e12, a replica that is not one of the fleet's), and ``MetricRefused`` past
    ``MAX_POSTS_PER_MINUTE``. Nothing is stored when it raises."""
    if fleet.metric_source != MetricSource.POST:
        raise FleetInvalid({"name": "this fleet's rule reads no posted metric"})
    if not isinstance(name, str) or name != fleet.metric_name:
        raise FleetInvalid({"name": f"this fleet's rule reads the metric {fleet.metric_name!r}"})
    number = _finite(value)
    if number is None:
        raise FleetInvalid({"value": f"a finite number from {-METRIC_VALUE_BOUND:g} to {METRIC_VALUE_BOUND:g}"})
    order = None
    if replica is not None:
        order = _replica(fleet, replica)
        if order is None:
            raise FleetInvalid({"replica": "not a replica of this fleet"})
    recent = FleetMetricSample.objects.filter(fleet=fleet, at__gt=now - dt.timedelta(minutes=1)).count()
    if recent >= MAX_POSTS_PER_MINUTE:
        raise MetricRefused(f"this fleet took {MAX_POSTS_PER_MINUTE} values in the last minute; post less often")
    return FleetMetricSample.objects.create(fleet=fleet, order=order, name=name, value=number, at=now)


def _finite(value: Any) -> float | None:
    # A bool is an int to Python; a huge int is refused before float() turns it into inf or loses it.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > METRIC_VALUE_BOUND:
        return None
    number = float(value)
    if not math.isfinite(number) or abs(number) > METRIC_VALUE_BOUND:
        return None
    return number


def _replica(fleet: Fleet, replica: Any) -> Order | None:
    try:
        public_id = uuid.UUID(str(replica)[:64])
    except ValueError:
        return None
    return Order.objects.filter(fleet=fleet, public_id=public_id).first()


# --- Prometheus -------------------------------------------------------------------------------------------------


class ScrapeFailed(Exception):
    """A replica's endpoint could not be read or parsed within the bounds."""


def scrape_target(order: Order, port: int) -> tuple[str, int] | None:
    """Where the replica's ``port`` is reached from outside: the machine's address and the port it maps to
    (an independent host forwards a lease's ports), or None before the machine is ready."""
    instance = order.instances.filter(active=True).first()
    lease = order.leases.filter(attempt_id=instance.attempt_id).first() if instance is not None else None
    if lease is None:
        return None
    host = connection_host(lease, instance)
    if not host:
        return None
    mapped = (lease.ports or {}).get(str(port), port)
    if isinstance(mapped, bool) or not isinstance(mapped, int) or not 1 <= mapped <= 65535:
        return None
    # The address is what the machine's agent reported, and whoever rents the machine controls it: a deployed
    # broker reads only public addresses, so a replica cannot point the worker at the broker's own network.
    try:
        address = socket.getaddrinfo(host, mapped, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return None
    if settings.FLEET_SCRAPE_PUBLIC_ONLY and not is_public(str(address)):
        log.warning("fleet replica %s reports a non-public address %s: not read", order.public_id, address)
        return None
    return str(address), mapped


def http_text(host: str, port: int, path: str, *, deadline_s: float, max_bytes: int = SCRAPE_MAX_BYTES) -> str:
    """GET ``path`` from ``host:port`` over HTTP/1.0 (so the answer is never chunked and ends with the
    connection), within ``deadline_s`` in total; the body of a 200 answer as UTF-8. Raises ``ScrapeFailed``."""
    end = time.monotonic() + deadline_s

    def remaining() -> float:
        left = end - time.monotonic()
        if left <= 0:
            raise ScrapeFailed(f"no whole answer within {deadline_s:g} s")
        return left

    data = bytearray()
    try:
        with socket.create_connection((host, port), timeout=remaining()) as sock:
            request = (
                f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n"
                "User-Agent: GPU-Broker-Fleets/1\r\n\r\n"
            )
            sock.settimeout(remaining())
            sock.sendall(request.encode("ascii"))
            while True:
                # Each read waits at most what is left of the whole deadline, so the total is bounded.
                sock.settimeout(remaining())
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > max_bytes + 16384:
                    raise ScrapeFailed(f"the answer is over {max_bytes} bytes")
    except TimeoutError:
        raise ScrapeFailed(f"no whole answer within {deadline_s:g} s") from None
    except OSError as exc:
        raise ScrapeFailed(f"{type(exc).__name__}: {exc}") from None
    head, sep, body = bytes(data).partition(b"\r\n\r\n")
    if not sep:
        raise ScrapeFailed("no complete HTTP header")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or status_line[1] != b"200":
        raise ScrapeFailed(f"answered {status_line[1:2]!r}, not 200")
    if len(body) > max_bytes:
        raise ScrapeFailed(f"the answer is over {max_bytes} bytes")
    return body.decode("utf-8", errors="replace")


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample called ``name`` (each label set) in a Prometheus text exposition; None when it
    has none. Raises ``ScrapeFailed`` for text the parser refuses or a value out of bounds."""
    total, found = 0.0, False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != name:
                    continue
                value = _finite(sample.value)
                if value is None:
                    raise ScrapeFailed(f"{name} has a value out of bounds")
                total, found = total + value, True
    except ValueError as exc:
        raise ScrapeFailed(f"not Prometheus text: {str(exc)[:200]}") from None
    if found and abs(total) > METRIC_VALUE_BOUND:
        raise ScrapeFailed(f"{name} sums out of bounds")
    return total if found else None


def prometheus_scrape(*, fleet: Fleet, now: dt.datetime) -> dict[str, int]:
    """Read the fleet's metric from each running replica and store what each said as a sample of that replica.
    One replica that cannot be read is logged and skipped; it never stops the others. Runs outside any
    transaction or lock: each read may take up to the deadline."""
    read = failed = 0
    port = fleet.metric_port
    if fleet.metric_source != MetricSource.PROMETHEUS or port is None:
        return {"read": 0, "failed": 0}
    running = Order.objects.filter(fleet=fleet, state=OrderState.RUNNING).order_by("pk")
    for order in running:
        target = scrape_target(order, port)
        if target is None:
            continue
        try:
            text = http_text(*target, fleet.metric_path, deadline_s=settings.FLEET_SCRAPE_DEADLINE_S)
            value = metric_sum(text, fleet.metric_name)
        except ScrapeFailed as exc:
            log.info("fleet %s: reading replica %s failed: %s", fleet.public_id, order.public_id, exc)
            failed += 1
            continue
        if value is not None:
            FleetMetricSample.objects.create(fleet=fleet, order=order, name=fleet.metric_name, value=value, at=now)
            read += 1
    return {"read": read, "failed": failed}


# --- The load over the window -----------------------------------------------------------------------------------


def utilization_load(*, running: Iterable[Order], since: dt.datetime, now: dt.datetime) -> float | None:
    """The sum over running replicas of their mean GPU utilization (percent) over [since, now]. A replica with
    no heartbeat in the window counts as the mean of those with one (a silent one is handled as silent, not
    as idle, so it does not drag the fleet in); None when none reported."""
    orders = list(running)
    if not orders:
        return None
    rows = (
        LeaseHeartbeat.objects.filter(lease__order__in=orders, at__gt=since, at__lte=now)
        .values("lease__order")
        .annotate(mean=Avg("utilization_pct"), n=Count("id"))
    )
    means = [float(r["mean"]) for r in rows if r["n"]]
    if not means:
        return None
    return sum(means) / len(means) * len(orders)


def metric_load(*, fleet: Fleet, since: dt.datetime, now: dt.datetime) -> float | None:
    """The fleet's metric over [since, now]: each source's (replica's, or the unnamed poster's) mean, summed.
    None when nothing was reported in the window."""
    per_source: dict[int | None, list[float]] = defaultdict(list)
    samples = FleetMetricSample.objects.filter(fleet=fleet, name=fleet.metric_name, at__gt=since, at__lte=now)
    for order_id, value in samples.values_list("order_id", "value"):
        per_source[order_id].append(value)
    if not per_source:
        return None
    return sum(sum(values) / len(values) for values in per_source.values())


def samples_prune(*, now: dt.datetime) -> int:
    """Delete metric samples older than a day, every fleet's; how many."""
    deleted, _ = FleetMetricSample.objects.filter(at__lt=now - SAMPLES_KEPT).delete()
    return deleted
