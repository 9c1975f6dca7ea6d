"""What a fleet reads and the evaluations that race (issue 38): the workload's metric read from a real
Prometheus text endpoint on a replica, within a total deadline and a size bound; GPU utilization from the
agents' heartbeats; a silent replica ended and replaced; two evaluations at once placing each replica once;
the periodic sweep carrying on past a fleet that fails."""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from marketplace.fleets import telemetry
from marketplace.fleets.services import fleet_create, fleet_evaluate
from marketplace.fleets.tasks import fleets_evaluate_task
from marketplace.fleets.telemetry import ScrapeFailed, http_text, metric_sum
from marketplace.models import (
    Fleet,
    FleetDecision,
    FleetMetricSample,
    Lease,
    LeaseHeartbeat,
    Order,
    OrderHealth,
    OrderState,
    SilentPeriod,
)
from tests.leases import boot_if_launched
from tests.races import race_same

pytestmark = pytest.mark.django_db

WORKLOAD = {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [9400]}


def _fleet(acme, alice, rule, **overrides) -> Fleet:
    data = {
        "name": "serving",
        "demand": {"gpu_count": 1, "gpu_models": ["T4"], "pricing_models": ["on_demand"]},
        "max_price_per_gpu_hour": "5",
        "min_replicas": 1,
        "max_replicas": 4,
        "rule": rule,
        "launch": {"allowed_cidrs": ["127.0.0.1/32"], "workload": WORKLOAD},
        **overrides,
    }
    return fleet_create(organization=acme, user=alice, data=data).fleet


def _running(fleet, now, capture, sandbox) -> list[Order]:
    with capture(execute=True):
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=now)
    for order in evaluation.placed:
        with capture(execute=True):
            boot_if_launched(order, sandbox)
    orders = list(Order.objects.filter(fleet=fleet, state=OrderState.RUNNING).order_by("pk"))
    assert len(orders) == len(evaluation.placed) > 0
    return orders


class _Exporter:
    """A real Prometheus text endpoint, as prometheus_client writes it, on a local port."""

    def __init__(self, registry: CollectorRegistry) -> None:
        body = generate_latest(registry)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter():
    registry = CollectorRegistry()
    queued = Gauge("queue_depth", "jobs waiting", ["model"], registry=registry)
    queued.labels(model="llama").set(50)
    queued.labels(model="mistral").set(25)
    Gauge("unrelated", "another metric", registry=registry).set(1000)
    served = _Exporter(registry)
    yield served
    served.close()


def test_the_metric_is_read_from_each_replicas_prometheus_endpoint_and_grows_the_fleet(
    acme, alice, aws_account, aws_sandbox, exporter, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    rule = {"kind": "metric", "target": 25, "scale_out_cooldown_s": 60,
            "metric": {"name": "queue_depth", "source": "prometheus", "port": 9400, "path": "/metrics"}}  # fmt: skip
    fleet = _fleet(acme, alice, rule)
    now = timezone.now()
    (replica,) = _running(fleet, now, capture, aws_sandbox)
    # The replica's port 9400 is reached at the exporter's address (as an agent reports a forwarded port).
    Lease.objects.filter(order=replica).update(ssh_host="127.0.0.1", ports={"9400": exporter.port})

    later = now + dt.timedelta(minutes=2)
    with capture(execute=True):
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=later)

    sample = FleetMetricSample.objects.get(fleet=fleet)
    assert (sample.order_id, sample.name, sample.value, sample.at) == (replica.pk, "queue_depth", 75.0, later)
    assert (evaluation.load, evaluation.decision.action, evaluation.decision.desired) == (75.0, "scale_out", 3)
    assert len(evaluation.placed) == 2


def test_a_replica_whose_endpoint_does_not_answer_is_skipped_and_stores_nothing(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, settings
):
    settings.FLEET_SCRAPE_DEADLINE_S = 0.5
    rule = {"kind": "metric", "target": 25, "metric": {"name": "queue_depth", "source": "prometheus", "port": 9400}}
    fleet = _fleet(acme, alice, rule)
    (replica,) = _running(fleet, timezone.now(), django_capture_on_commit_callbacks, aws_sandbox)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    Lease.objects.filter(order=replica).update(ssh_host="127.0.0.1", ports={"9400": port})

    assert telemetry.prometheus_scrape(fleet=fleet, now=timezone.now()) == {"read": 0, "failed": 1}
    assert FleetMetricSample.objects.count() == 0


@pytest.fixture
def stalling_server():
    """Answers with the first half of a header and then nothing until the test is over (a machine that holds
    the connection open)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    release = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n")
            release.wait(timeout=30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    release.set()
    thread.join(timeout=5)
    listener.close()


def test_an_endpoint_that_holds_the_connection_open_is_given_up_at_the_deadline(stalling_server):
    started = time.monotonic()

    with pytest.raises(ScrapeFailed, match=r"no whole answer within 0\.5 s"):
        http_text("127.0.0.1", stalling_server, "/metrics", deadline_s=0.5)

    assert time.monotonic() - started < 2.0


@pytest.fixture
def flooding_server():
    """Answers 200 with an endless body."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            try:
                while True:
                    conn.sendall(b"queue_depth 1\n" * 4096)
            except OSError:
                return  # the client hung up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    thread.join(timeout=5)
    listener.close()


def test_an_endpoint_that_answers_too_much_is_cut_off_at_the_size_bound(flooding_server):
    with pytest.raises(ScrapeFailed, match="over 65536 bytes"):
        http_text("127.0.0.1", flooding_server, "/metrics", deadline_s=5, max_bytes=65536)


def test_the_named_metric_is_summed_over_its_label_sets_and_hostile_text_refused():
    text = 'queue_depth{model="a"} 2\nqueue_depth{model="b"} 3.5\nqueue_depth_total 100\n'

    assert metric_sum(text, "queue_depth") == 5.5
    assert metric_sum(text, "absent") is None
    with pytest.raises(ScrapeFailed, match="out of bounds"):
        metric_sum("queue_depth 1e300\n", "queue_depth")
    with pytest.raises(ScrapeFailed, match="out of bounds"):
        metric_sum("queue_depth NaN\n", "queue_depth")
    with pytest.raises(ScrapeFailed, match="not Prometheus text"):
        metric_sum("queue_depth{{{ 1\n", "queue_depth")


def test_utilization_is_the_replicas_mean_gpu_utilization_over_the_window(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    rule = {"kind": "utilization", "target": 60, "window_s": 300, "scale_out_cooldown_s": 60}
    fleet = _fleet(acme, alice, rule)
    now = timezone.now()
    (replica,) = _running(fleet, now, capture, aws_sandbox)
    lease = Lease.objects.get(order=replica, state="ready")
    later = now + dt.timedelta(minutes=5)
    for seconds, pct in [(400, 5), (200, 90), (100, 96), (10, 99)]:  # the first is before the window
        LeaseHeartbeat.objects.create(lease=lease, at=later - dt.timedelta(seconds=seconds), utilization_pct=pct,
                                      temperature_c=60, power_w=70)  # fmt: skip

    with capture(execute=True):
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=later)

    assert evaluation.load == pytest.approx(95.0)
    assert (evaluation.decision.action, evaluation.decision.desired) == ("scale_out", 2)


def test_a_replica_silent_past_the_grace_is_ended_and_replaced(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks, settings
):
    capture = django_capture_on_commit_callbacks
    settings.FLEET_SILENT_GRACE_S = 300
    fleet = _fleet(acme, alice, {"kind": "utilization", "target": 60}, min_replicas=2)
    now = timezone.now()
    silent, quiet = _running(fleet, now, capture, aws_sandbox)
    # One agent silent for 6 minutes, another for 2: only the first is past the grace.
    for order, minutes in [(silent, 6), (quiet, 2)]:
        Order.objects.filter(pk=order.pk).update(health=OrderHealth.DEGRADED)
        SilentPeriod.objects.create(order=order, instance=order.instance, cause="lease_agent",
                                    started_at=now - dt.timedelta(minutes=minutes), noticed_at=now)  # fmt: skip

    with capture(execute=True):
        evaluation = fleet_evaluate(fleet_id=fleet.pk, now=now)

    assert [o.pk for o in evaluation.ended] == [silent.pk]
    assert Order.objects.get(pk=silent.pk).state in (OrderState.TERMINATING, OrderState.TERMINATED)
    assert Order.objects.get(pk=quiet.pk).state == OrderState.RUNNING
    assert (evaluation.decision.action, len(evaluation.placed)) == ("replace", 1)
    assert "its agent was silent" not in evaluation.record.reason  # the order's own reason says that
    assert "silent for over 300 s" in Order.objects.get(pk=silent.pk).state_reason


@pytest.mark.django_db(transaction=True)
def test_two_evaluations_at_once_place_each_replica_once(acme, alice, aws_account, aws_sandbox):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite serialises every write")
    # Created at a minimum of 0 (its first evaluation, run as it commits, holds at 0), then raised to 3 in the
    # database alone, so that both racers find 3 replicas to place.
    fleet = _fleet(acme, alice, {"kind": "utilization", "target": 60}, min_replicas=0)
    Fleet.objects.filter(pk=fleet.pk).update(min_replicas=3)
    now = timezone.now()

    results, errors = race_same(2, lambda: fleet_evaluate(fleet_id=fleet.pk, now=now))

    assert errors == []
    assert sorted(len(r.placed) for r in results) == [0, 3]
    replicas = Order.objects.filter(fleet=fleet)
    assert replicas.count() == 3
    assert len(set(replicas.values_list("idempotency_key", flat=True))) == 3
    assert FleetDecision.objects.filter(fleet=fleet, action="scale_out").count() == 1
    assert Fleet.objects.get(pk=fleet.pk).decision_count == 3  # the first hold, then the two racers


def test_the_sweep_evaluates_every_active_fleet_even_when_one_fails(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    good = _fleet(acme, alice, {"kind": "utilization", "target": 60}, name="good")
    bad = _fleet(acme, alice, {"kind": "utilization", "target": 60}, name="bad")
    # The bad fleet's stored demand names a profile the engine does not know (a row from an older release).
    Fleet.objects.filter(pk=bad.pk).update(demand={**bad.demand, "profile": "mining"})
    FleetMetricSample.objects.create(fleet=good, name="old", value=1, at=timezone.now() - dt.timedelta(days=2))

    with django_capture_on_commit_callbacks(execute=True):
        swept = fleets_evaluate_task.apply().get()

    assert swept == {"queued": 1, "pruned": 1}
    assert Order.objects.filter(fleet=good).count() == 1
    assert Order.objects.filter(fleet=bad).count() == 0


def test_a_deployed_broker_reads_no_replica_that_reports_a_non_public_address(
    acme, alice, aws_account, aws_sandbox, exporter, django_capture_on_commit_callbacks, settings
):
    rule = {"kind": "metric", "target": 25, "metric": {"name": "queue_depth", "source": "prometheus", "port": 9400}}
    fleet = _fleet(acme, alice, rule)
    (replica,) = _running(fleet, timezone.now(), django_capture_on_commit_callbacks, aws_sandbox)
    # The renter controls the machine's agent, and so the address it reports: here the broker's own loopback.
    Lease.objects.filter(order=replica).update(ssh_host="127.0.0.1", ports={"9400": exporter.port})
    settings.FLEET_SCRAPE_PUBLIC_ONLY = True

    assert telemetry.prometheus_scrape(fleet=fleet, now=timezone.now()) == {"read": 0, "failed": 0}
    assert FleetMetricSample.objects.count() == 0
