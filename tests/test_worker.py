"""The order path through real Celery worker processes on the configured broker (RabbitMQ in CI): one worker, and
the workers ``bin/run`` starts, one per queue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from broker.celery import app as celery_app
from broker.devrun import worker_commands
from broker.queues import QUEUES
from ledger.services import ledger_verify
from marketplace.models import Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.webhooks.services import webhook_endpoint_create
from providers.services import adapter_for_account
from tests.hostile.trickle import Trickler
from tests.leases import LAUNCH

ROOT = Path(__file__).resolve().parent.parent


def _database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@pytest.fixture
def worker(machines_phone_home):
    """A real worker process on the same broker and the test database; stopped after the test. The machines it
    launches phone home to the test's live server, as real ones would to the broker."""
    env = dict(os.environ, DATABASE_URL=_database_url(), CELERY_BROKER_URL=settings.CELERY_BROKER_URL)
    env["BROKER_PUBLIC_URL"] = machines_phone_home
    env["BROKER_PROVISION_POLL_INTERVAL_S"] = "0.2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "broker", "worker", "--pool", "solo", "--loglevel", "WARNING"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def worker_env(**extra: str) -> dict[str, str]:
    """A worker process's environment: the test database, the test's broker, and ``extra``."""
    return dict(os.environ, DATABASE_URL=_database_url(), CELERY_BROKER_URL=settings.CELERY_BROKER_URL, **extra)


def worker_start(command: list[str], env: dict[str, str], **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, **popen)  # type: ignore[call-overload]


def worker_stop(*procs: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """Ask every process to shut down at once and wait for them together (one grace period, not one each);
    whatever is still running after it is killed."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def queues_purge() -> None:
    """Drop what an earlier test left on any of the broker's queues."""
    with celery_app.connection_for_write() as conn:
        for queue in QUEUES:
            try:
                conn.default_channel.queue_purge(queue)
            except Exception:  # noqa: S110 - a queue never declared on this broker has nothing to purge
                pass


def _wait_for_state(order: Order, states: set[str], timeout: float = 90.0) -> Order:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        order.refresh_from_db()
        if order.state in states:
            return order
        time.sleep(0.25)
    raise AssertionError(f"order stayed {order.state} ({order.state_reason})")


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_order_runs_and_terminates_through_a_real_worker(alice, acme, aws_account, worker):
    celery_app.conf.task_always_eager = False
    celery_app.control.purge()
    offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("zone").first()

    placed = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    running = _wait_for_state(placed, {OrderState.RUNNING, OrderState.FAILED})

    assert running.state == OrderState.RUNNING, running.state_reason
    from marketplace.orders.services import order_terminate

    order_terminate(order=running)
    done = _wait_for_state(running, {OrderState.TERMINATED})
    found = adapter_for_account(aws_account).find_by_order(done.ref)
    assert [h.instance_id for h in found] == [done.instance.provider_instance_id]
    assert [h.state.value for h in found] == ["terminated"]
    assert ledger_verify().ok


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_stuck_webhook_delivery_does_not_delay_an_orders_provisioning(alice, acme, aws_account, machines_phone_home):
    # Given the workers bin/run starts (solo pools here) and a receiver that trickles its answer until released,
    # with a deadline longer than the test, so its delivery holds the webhook worker throughout.
    celery_app.conf.task_always_eager = False
    queues_purge()
    receiver = Trickler(b"", b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000)
    webhook_endpoint_create(organization=acme, user=alice, url=receiver.url())
    env = worker_env(
        BROKER_PUBLIC_URL=machines_phone_home, BROKER_PROVISION_POLL_INTERVAL_S="0.2", BROKER_WEBHOOK_DEADLINE_S="240"
    )
    workers = [worker_start(command, env) for command in worker_commands("--pool", "solo").values()]
    try:
        offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("zone")[0]

        # When an order is placed (its order.placed event goes to the receiver at once)
        placed = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)
        ).order

        # Then it runs while the receiver is still trickling the answer to the first delivery.
        assert receiver.got_request.wait(timeout=60), "no delivery reached the receiver"
        running = _wait_for_state(placed, {OrderState.RUNNING, OrderState.FAILED})
        assert running.state == OrderState.RUNNING, running.state_reason
        assert not (receiver.finished or receiver.hung_up.is_set()), "the delivery was not held"
    finally:
        receiver.stop()  # ends the held delivery, so the webhook worker can shut down
        worker_stop(*workers)
