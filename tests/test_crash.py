"""Crash safety for real: a Celery worker on RabbitMQ killed with SIGKILL at random points, then restarted.

Every order must end running (or in a final state) with exactly one live machine at the provider, no
second instance for one order, and a gapless ledger. RabbitMQ redelivers an unacknowledged task as soon
as the dead worker's connection drops; tasks are ``acks_late`` with ``reject_on_worker_lost``, and every
step claims its row before acting, so a redelivered step resumes instead of repeating.

Each kill waits for a state, not a clock: a milestone of the order's provisioning chosen at random (the task
claimed, the attempt opened, the machine launched at the provider but perhaps not yet recorded, the launch
recorded, the provider reporting it running), observed in the database or at the sandbox, then SIGKILL. A
kill after a wall-clock delay mostly landed before a busy machine's worker had taken the task.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

from broker.celery import app as celery_app
from ledger.services import ledger_verify
from marketplace.models import Attempt, Instance, Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from providers.services import adapter_for_account
from providers.types import InstanceState
from tests.leases import LAUNCH
from tests.test_worker import ROOT, _database_url

# Ten kills in CI, each milestone about twice (each kill costs a worker's start, about 7 s there);
# bench/crash.py runs the same drill at length.
RUNS = int(os.environ.get("BROKER_CRASH_RUNS", "10"))
SEED = int(os.environ.get("BROKER_CRASH_SEED", str(random.SystemRandom().randrange(1_000_000))))


def _start_worker(public_url: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DATABASE_URL=_database_url(), CELERY_BROKER_URL=settings.CELERY_BROKER_URL)
    env["BROKER_PUBLIC_URL"] = public_url  # the launched machines' agents phone home to the live server
    env["BROKER_PROVISION_POLL_INTERVAL_S"] = "0.2"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "broker", "worker", "--pool", "solo", "--loglevel", "ERROR"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )


def _wait_until_ready(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the worker exited"
        if celery_app.control.ping(timeout=0.3):
            return
    raise AssertionError("the worker did not come up")


# Milestones an order passes through while a worker provisions it, in order.
MILESTONES = ("claimed", "attempt opened", "launched at the provider", "launch recorded", "running at the provider")
MILESTONE_WAIT_S = 90.0  # the new worker may first finish orders the last kill left unacknowledged


def _reached(order: Order, milestone: str, adapter) -> bool:
    state = Order.objects.values_list("state", flat=True).get(pk=order.pk)
    if state != OrderState.PLACED and state != OrderState.PROVISIONING:
        return True  # already past every milestone: kill now, the order is simply not mid-flight
    if milestone == "claimed":
        return state == OrderState.PROVISIONING
    if milestone == "attempt opened":
        return Attempt.objects.filter(order=order).exists()
    if milestone == "launched at the provider":
        return bool(adapter.find_by_order(order.ref))
    if milestone == "launch recorded":
        return Instance.objects.filter(order=order).exists()
    return Instance.objects.filter(order=order, running_at__isnull=False).exists()


def _wait_for(order: Order, milestone: str, adapter, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + MILESTONE_WAIT_S
    while not _reached(order, milestone, adapter):
        assert proc.poll() is None, "the worker exited before it was killed"
        assert time.monotonic() < deadline, f"{order} did not reach {milestone!r} in {MILESTONE_WAIT_S} s"
        time.sleep(0.005)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not settings.CELERY_BROKER_URL.startswith("amqp"),
    reason="redelivery on a dropped connection is RabbitMQ's behaviour; CI runs it on RabbitMQ",
)
def test_orders_survive_a_worker_killed_at_random_points(alice, acme, aws_account, machines_phone_home):
    celery_app.conf.task_always_eager = False
    celery_app.control.purge()
    rng = random.Random(SEED)
    offers = list(aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand"))
    adapter = adapter_for_account(aws_account)
    orders: list[Order] = []
    kills = []
    for _ in range(RUNS):
        worker = _start_worker(machines_phone_home)
        _wait_until_ready(worker)
        offer = rng.choice(offers)
        milestone = rng.choice(MILESTONES)
        orders.append(
            order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
        )
        # The machine's agent reports ready to the live server whether the worker lives or not.
        _wait_for(orders[-1], milestone, adapter, worker)
        _kill(worker)
        orders[-1].refresh_from_db()
        kills.append((milestone, orders[-1].state, orders[-1].attempts.count()))

    survivor = _start_worker(machines_phone_home)
    try:
        deadline = time.monotonic() + 180
        pending = {o.pk for o in orders}
        while pending and time.monotonic() < deadline:
            settled = Order.objects.filter(pk__in=pending, state__in=[OrderState.RUNNING, *Order.FINAL_STATES])
            pending -= set(settled.values_list("pk", flat=True))
            time.sleep(0.5)
    finally:
        _kill(survivor)

    context = f"seed {SEED}, kills (milestone, state then, attempts then): {kills}"
    print(context)
    # The kills must land mid-flight, not only before the task was taken or after the machine ran.
    assert sum(1 for _, state, _ in kills if state == OrderState.PROVISIONING) >= max(3, RUNS // 2), context
    for order in Order.objects.filter(pk__in=[o.pk for o in orders]):
        assert order.state == OrderState.RUNNING, f"{order} {order.state_reason} ({context})"
        live = [h for h in adapter.find_by_order(order.ref) if h.state != InstanceState.TERMINATED]
        assert len(live) == 1, f"{order}: {[h.instance_id for h in live]} ({context})"
        active = Instance.objects.get(order=order, active=True)
        assert active.provider_instance_id == live[0].instance_id, context
    report = ledger_verify()
    assert report.ok, f"{report} ({context})"
