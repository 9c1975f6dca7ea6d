"""Every task has a time limit, and a sweep that reaches its soft limit stops cleanly (what it did stays done).

Slow peers (a cloud that stops answering, a webhook receiver that trickles) must not hold a worker for ever: the
outbound calls have deadlines of their own, and the tasks' limits bound whatever is left.
"""

from __future__ import annotations

import math
import subprocess
import time
from decimal import Decimal

import pytest

from broker.celery import app as celery_app
from broker.devrun import worker_commands
from broker.queues import (
    DEFAULT_QUEUE,
    LEDGER_QUEUE,
    LEDGER_TASKS,
    PROVISIONING_QUEUE,
    PROVISIONING_TASKS,
    QUEUES,
    ROUTES,
    SYNC_QUEUE,
    SYNC_TASKS,
    WEBHOOK_QUEUE,
    WEBHOOK_TASKS,
)
from marketplace.models import OrderState
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, boot_if_launched
from tests.test_settings import _start
from tests.test_worker import queues_purge, worker_env, worker_start, worker_stop

# Tasks whose names the project chose (Celery's own, "celery.*", take the app-wide limits like every other).
OUR_TASKS = {
    "ledger.checkpoint",
    "ledger.checkpoint_sign",
    "marketplace.idempotency_expire",
    "marketplace.offers_sync_account",
    "marketplace.offers_sync_all",
    "marketplace.offers_sync_soon",
    "marketplace.order_boot_deadline",
    "marketplace.order_boot_settle",
    "marketplace.order_poll",
    "marketplace.order_preempt",
    "marketplace.order_provision",
    "marketplace.order_terminate",
    "marketplace.orders_reconcile",
    "marketplace.orders_sweep",
    "marketplace.webhook_deliver",
    "marketplace.webhooks_sweep",
    "marketplace.machines_withdraw_silent",
}


def _registered() -> dict[str, object]:
    celery_app.loader.import_default_modules()  # what a worker imports: autodiscovered tasks and CELERY_IMPORTS
    return dict(celery_app.tasks)


def test_every_registered_task_has_a_finite_time_limit_above_a_soft_one():
    tasks = _registered()
    assert OUR_TASKS <= set(tasks), f"not registered: {sorted(OUR_TASKS - set(tasks))}"

    limits = {}
    for name, task in tasks.items():
        # A worker applies the task's own limits, else the app's (task_time_limit, task_soft_time_limit).
        hard = task.time_limit or celery_app.conf.task_time_limit
        soft = task.soft_time_limit or celery_app.conf.task_soft_time_limit
        limits[name] = (soft, hard)

    unlimited = sorted(n for n, (soft, hard) in limits.items() if not (hard and soft and math.isfinite(hard)))
    assert unlimited == []
    assert sorted(n for n, (soft, hard) in limits.items() if not 0 < soft < hard) == []


def test_a_delivery_is_limited_to_its_send_deadline_not_the_apps_limit(settings):
    task = _registered()["marketplace.webhook_deliver"]

    assert settings.WEBHOOK_SEND_DEADLINE_S < task.soft_time_limit < task.time_limit
    assert task.time_limit < celery_app.conf.task_soft_time_limit


def test_each_concern_has_its_queue_and_every_other_task_goes_to_the_default_one():
    queues = {
        name: celery_app.amqp.router.route({}, name, (), {})["queue"].name
        for name in _registered()
        if not name.startswith("celery.")
    }

    assert {n for n, q in queues.items() if q == WEBHOOK_QUEUE} == set(WEBHOOK_TASKS)
    assert {n for n, q in queues.items() if q == PROVISIONING_QUEUE} == set(PROVISIONING_TASKS)
    assert {n for n, q in queues.items() if q == SYNC_QUEUE} == set(SYNC_TASKS)
    assert {n for n, q in queues.items() if q == LEDGER_QUEUE} == set(LEDGER_TASKS)
    assert {n for n, q in queues.items() if n not in ROUTES} == {n for n, q in queues.items() if q == DEFAULT_QUEUE}
    # A worker started without -Q consumes every queue; bin/run starts a pool for each.
    assert {q.name for q in celery_app.conf.task_queues} == set(QUEUES)
    assert sorted(command[command.index("--queues") + 1] for command in worker_commands().values()) == sorted(QUEUES)


def _running(acme, alice, offer, sandbox):
    order = order_place(
        organization=acme,
        user=alice,
        request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("1")),
    ).order
    order = boot_if_launched(order, sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def _wait_for_line(log, text: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text()
        if text in content:
            return content
        assert proc.poll() is None, f"the worker exited:\n{content}"
        time.sleep(0.25)
    raise AssertionError(f"the worker never logged {text!r}:\n{log.read_text()}")


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_sweep_past_its_soft_limit_in_a_real_worker_stops_cleanly(acme, alice, aws_account, aws_sandbox, tmp_path):
    # Given two running orders and a cloud whose DescribeInstances no longer answers (until the test ends)
    offers = aws_account.offers.filter(pricing_model="on_demand", instance_type="g5.xlarge").order_by("zone")
    orders = [_running(acme, alice, offer, aws_sandbox) for offer in offers[:2]]
    silent = aws_sandbox.faults.inject("slow", action="DescribeInstances", seconds=600)
    # One try of 10 s per call: the sweep is not to outlast it, but it must not wait a minute for the SDK either.
    type(aws_account).objects.filter(pk=aws_account.pk).update(options={"read_timeout": "10", "max_attempts": "1"})
    celery_app.conf.task_always_eager = False
    queues_purge()
    log = tmp_path / "worker.log"
    command = worker_commands(concurrency=1)["worker"]
    with log.open("wb") as out:
        proc = worker_start(command, worker_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        # When the sweep checks the running orders in a real (prefork) worker with a 2 s soft limit (limits travel
        # with the message: the sender's settings decide them)
        celery_app.send_task("marketplace.orders_sweep", soft_time_limit=2, time_limit=120)

        # Then it stops at the limit, reached inside the first order's check (where botocore turns the limit's
        # exception into a connection error), and does not go on to the second order
        content = _wait_for_line(log, "orders_sweep_task stopped at its soft time limit", proc)
        assert silent.fired == 1
        assert "Soft time limit (2s) exceeded for marketplace.orders_sweep" in content
        assert "Hard time limit" not in content
    finally:
        aws_sandbox.faults.clear()
        worker_stop(proc)
    # And what was there stays as it was: both orders still run.
    assert [o.state for o in type(orders[0]).objects.filter(pk__in=[o.pk for o in orders])] == [OrderState.RUNNING] * 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BROKER_TASK_SOFT_TIME_LIMIT_S": "inf"}, "BROKER_TASK_SOFT_TIME_LIMIT_S='inf' is not valid"),
        (
            {"BROKER_TASK_SOFT_TIME_LIMIT_S": "120", "BROKER_TASK_TIME_LIMIT_S": "60"},
            "BROKER_TASK_TIME_LIMIT_S=60 is not valid: it must be above BROKER_TASK_SOFT_TIME_LIMIT_S=120",
        ),
        ({"BROKER_WEBHOOK_DEADLINE_S": "3600"}, "BROKER_WEBHOOK_DEADLINE_S='3600' is not valid"),
    ],
)
def test_a_limit_that_is_not_finite_or_not_in_order_stops_start_up(tmp_path, env, message):
    started = _start(tmp_path, **env)

    assert started.returncode != 0
    assert message in started.stderr
