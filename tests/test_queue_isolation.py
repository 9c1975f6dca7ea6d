"""A flood on one queue never delays another (issue 23, point 1): with the workers bin/run starts (solo pools
here), a backlog of offer syncs held by a cloud that does not answer leaves a buyer's launch untouched."""

from __future__ import annotations

import pytest

from broker.celery import app as celery_app
from broker.devrun import worker_commands
from marketplace.models import OrderState
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.tasks import offers_sync_account_task
from tests.leases import LAUNCH
from tests.test_worker import _wait_for_state, queues_purge, worker_env, worker_start, worker_stop
from tests.waiting import wait_for

FLOOD = 200  # sync messages queued behind the one that hangs


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_flood_of_offer_syncs_does_not_delay_a_buyers_launch(
    alice, acme, aws_account, aws_sandbox, machines_phone_home
):
    celery_app.conf.task_always_eager = False
    queues_purge()
    # The account's catalogue call hangs longer than the test (one try, a long read timeout): the sync worker is
    # held by the first sync while the others wait in its queue.
    hang = aws_account  # the same cloud the order launches on: only the catalogue call hangs
    type(hang).objects.filter(pk=hang.pk).update(options={"read_timeout": "300", "max_attempts": "1"})
    held = aws_sandbox.faults.inject("slow", action="DescribeInstanceTypes", seconds=300)
    for _ in range(FLOOD + 1):
        offers_sync_account_task.delay(hang.pk)
    env = worker_env(BROKER_PUBLIC_URL=machines_phone_home, BROKER_PROVISION_POLL_INTERVAL_S="0.2")
    workers = [worker_start(command, env) for command in worker_commands("--pool", "solo").values()]
    try:
        # The launch is placed only once the sync worker is held, so it cannot slip through before the flood.
        wait_for(lambda: held.fired == 1, "the sync worker to reach the hanging catalogue call")
        offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("zone")[0]
        placed = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk))
        running = _wait_for_state(placed.order, {OrderState.RUNNING, OrderState.FAILED})
        assert running.state == OrderState.RUNNING, running.state_reason
        assert held.fired == 1  # the first sync is still held: the rest of the flood has not moved
        with celery_app.connection_for_write() as conn:
            _, waiting, _ = conn.default_channel.queue_declare("sync", passive=True)
        assert waiting >= FLOOD - 1
    finally:
        aws_sandbox.faults.clear()
        worker_stop(*workers)
        queues_purge()
