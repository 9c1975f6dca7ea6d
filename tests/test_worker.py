"""The order path through a real Celery worker process on the configured broker (RabbitMQ in CI)."""

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
from ledger.services import ledger_verify
from marketplace.models import Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from providers.services import adapter_for_account
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
