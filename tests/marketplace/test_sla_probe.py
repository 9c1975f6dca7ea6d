"""The broker's own SSH check (issue 38): a probe reads an SSH server's identification (RFC 4253, section 4.2)
within one total deadline; three failures in a row open an ``ssh_unreachable`` outage from the first, one answer
closes it. Against real listening sockets on 127.0.0.1: one that answers a banner, one that accepts and stays
silent, one that sends something else, and a closed port."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from marketplace.models import Lease, Order, OrderState, Outage, OutageCause, SshWatch
from marketplace.orders.services import order_terminate
from marketplace.sla.probe import ProbeFailed, order_ssh_probe, orders_to_probe, ssh_banner
from marketplace.tasks import sla_ssh_probe_all_task
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db

T1 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


class Listener:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply`` (None: says nothing, holds on)."""

    def __init__(self, reply: bytes | None):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.reply is None:
                self.held.append(conn)
                continue
            with conn:
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def banner() -> Iterator[Listener]:
    server = Listener(b"a greeting line first is allowed\r\nSSH-2.0-OpenSSH_9.6p1 Debian-3\r\n")
    yield server
    server.close()


@pytest.fixture
def silent() -> Iterator[Listener]:
    server = Listener(None)
    yield server
    server.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_that_sends_an_ssh_2_identification_answers(banner):
    assert ssh_banner("127.0.0.1", banner.port, timeout_s=2) == "SSH-2.0-OpenSSH_9.6p1 Debian-3"


def test_a_server_that_accepts_and_says_nothing_fails_within_the_deadline(silent):
    with pytest.raises(ProbeFailed, match=r"no SSH identification within 0\.5 s"):
        ssh_banner("127.0.0.1", silent.port, timeout_s=0.5)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "closed before an SSH identification"),
        (b"SSH-1.5-old\r\n", "not an SSH 2 identification"),
        (b"x" * 5000, "no SSH identification in the first 4096 bytes"),
    ],
)
def test_a_server_that_is_not_ssh_2_fails(reply, message):
    server = Listener(reply)
    try:
        with pytest.raises(ProbeFailed, match=message):
            ssh_banner("127.0.0.1", server.port, timeout_s=2)
    finally:
        server.close()


def test_a_closed_port_fails():
    with pytest.raises(ProbeFailed, match="could not connect"):
        ssh_banner("127.0.0.1", _closed_port(), timeout_s=2)


@pytest.fixture
def running(alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks) -> Order:
    api = APIClient()
    api.force_authenticate(alice)
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        api.post("/api/v1/orders", data=json.dumps({"offer": offer.pk}), content_type="application/json")
    order = Order.objects.latest("id")
    with django_capture_on_commit_callbacks(execute=True):
        boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def _point_ssh_at(order: Order, port: int) -> None:
    Lease.objects.filter(attempt__instance__order=order, attempt__instance__active=True).update(
        ssh_host="127.0.0.1", ssh_port=port
    )


def test_three_failed_probes_open_an_outage_from_the_first_and_one_answer_closes_it(running, silent, banner, settings):
    settings.SLA_SSH_TIMEOUT_S = 0.5
    _point_ssh_at(running, silent.port)

    assert order_ssh_probe(order_id=running.pk, now=T1) is False
    assert order_ssh_probe(order_id=running.pk, now=T1 + MINUTE) is False
    assert not Outage.objects.exists()  # two failures are a blip, not an outage
    assert order_ssh_probe(order_id=running.pk, now=T1 + 2 * MINUTE) is False
    outage = Outage.objects.get()
    assert (outage.cause, outage.started_at, outage.ended_at, outage.instance) == (
        OutageCause.SSH_UNREACHABLE,
        T1,
        None,
        running.instances.get(active=True),
    )
    assert "no SSH identification within 0.5 s (3 probes in a row)" in outage.detail
    # A fourth failure keeps the same outage.
    assert order_ssh_probe(order_id=running.pk, now=T1 + 3 * MINUTE) is False
    assert Outage.objects.count() == 1

    _point_ssh_at(running, banner.port)
    assert order_ssh_probe(order_id=running.pk, now=T1 + 4 * MINUTE) is True
    outage.refresh_from_db()
    assert (outage.started_at, outage.ended_at) == (T1, T1 + 4 * MINUTE)
    watch = SshWatch.objects.get(order=running)
    assert (watch.failures, watch.first_failed_at, watch.last_probe_at) == (0, None, T1 + 4 * MINUTE)


def test_failures_broken_by_an_answer_never_open_an_outage(running, banner, settings):
    settings.SLA_SSH_TIMEOUT_S = 0.5
    closed = _closed_port()
    for minute, port in enumerate([closed, closed, banner.port, closed, closed, banner.port]):
        _point_ssh_at(running, port)
        order_ssh_probe(order_id=running.pk, now=T1 + minute * MINUTE)
    assert not Outage.objects.exists()


def test_the_periodic_probe_covers_running_orders_only_and_an_ended_order_closes_its_outage(
    running, silent, settings, django_capture_on_commit_callbacks
):
    settings.SLA_SSH_TIMEOUT_S = 0.5
    settings.SLA_SSH_FAILURES = 1
    _point_ssh_at(running, silent.port)
    assert orders_to_probe() == [running.pk]

    assert sla_ssh_probe_all_task.apply().result == 1
    assert Outage.objects.filter(cause=OutageCause.SSH_UNREACHABLE, ended_at__isnull=True).count() == 1

    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=running)
    running.refresh_from_db()
    assert running.state == OrderState.TERMINATED
    assert orders_to_probe() == []
    assert not Outage.objects.filter(ended_at__isnull=True).exists()
    assert order_ssh_probe(order_id=running.pk) is None


def test_a_booted_sandbox_machine_answers_the_probe_as_a_real_one_would(running):
    # The sandbox boots the lease agent with its simulated executor, whose SSH port sends an identification.
    assert order_ssh_probe(order_id=running.pk, now=T1) is True
    assert not Outage.objects.exists()
