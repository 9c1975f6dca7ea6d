"""Slow peers: a webhook receiver that trickles its answer a byte at a time holds a send no longer than the
send's total deadline, whatever its per-read timeouts; the attempt is a timeout, retried on the schedule. A cloud
that stops answering is retried only while a retry still fits in the call's deadline.

The receivers here trickle until the test releases them, so "the send returned while the receiver still had
bytes to send" is the bound, not a clock reading.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings
from django.utils import timezone

from marketplace.models import DeliveryState, WebhookAttempt, WebhookDelivery
from marketplace.webhooks.sending import EXCERPT_BYTES
from marketplace.webhooks.services import RETRY_DELAYS_S, webhook_deliver, webhook_endpoint_create, webhook_ping
from providers.errors import TransientProviderError
from providers.tencent.client import ClientSettings as TencentClientSettings
from providers.tencent.client import TencentClient
from tests.conftest import TENCENT_TEST_CREDENTIALS
from tests.hostile.trickle import Trickler

pytestmark = pytest.mark.django_db

# Far longer to trickle in full than the deadline the tests set (0.5 s): 1,000 bytes at 20 a second.
TRICKLE_BYTES = 1000


@pytest.fixture
def trickler_factory():
    made: list[Trickler] = []

    def make(head: bytes, tail: bytes) -> Trickler:
        made.append(Trickler(head, tail))
        return made[-1]

    yield make
    for trickler in made:
        trickler.stop()


def _delivery(acme, alice, url: str) -> WebhookDelivery:
    endpoint = webhook_endpoint_create(organization=acme, user=alice, url=url).endpoint
    return webhook_ping(endpoint=endpoint)


@override_settings(WEBHOOK_SEND_DEADLINE_S=0.5)
def test_a_receiver_trickling_its_status_line_is_cut_off_at_the_deadline_and_retried(acme, alice, trickler_factory):
    # Each byte comes well within the per-read timeout (5 s), so only a total deadline ends the send.
    receiver = trickler_factory(b"", b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * TRICKLE_BYTES + b"\r\n\r\n")
    delivery = _delivery(acme, alice, receiver.url())
    now = timezone.now()

    state = webhook_deliver(delivery_id=delivery.pk, now=now)

    assert receiver.got_request.is_set()
    assert not receiver.finished, "the send waited for the whole trickle"
    assert state == DeliveryState.PENDING
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert (attempt.number, attempt.status_code) == (1, None)
    assert attempt.error == "timeout: no complete answer within the 0.5 s deadline"
    delivery.refresh_from_db()
    assert delivery.attempts == 1
    first_wait = dt.timedelta(seconds=RETRY_DELAYS_S[0])
    assert now + first_wait <= delivery.next_attempt_at <= now + first_wait * 1.2


@override_settings(WEBHOOK_SEND_DEADLINE_S=0.5)
def test_a_receiver_trickling_its_body_after_a_2xx_is_delivered_with_the_excerpt_it_had_sent(
    acme, alice, trickler_factory
):
    # Less than an excerpt in all, so a send without a deadline would read it to the end.
    body_bytes = EXCERPT_BYTES - 100
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nthanks" % (body_bytes + 6)
    receiver = trickler_factory(head, b"." * body_bytes)
    delivery = _delivery(acme, alice, receiver.url())

    state = webhook_deliver(delivery_id=delivery.pk)

    assert not receiver.finished, "the send waited for the whole trickle"
    assert state == DeliveryState.DELIVERED
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert (attempt.status_code, attempt.error) == (200, "")
    assert attempt.response_excerpt.startswith("thanks")
    assert len(attempt.response_excerpt) < EXCERPT_BYTES


@override_settings(WEBHOOK_SEND_DEADLINE_S=5.0)
def test_no_more_of_a_long_answer_is_read_than_the_excerpt(acme, alice, trickler_factory):
    # 64 MiB answered as fast as the socket takes it: the sender reads its excerpt and hangs up.
    size = 64 * 2**20
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
    receiver = trickler_factory(head + b"x" * size, b"")
    delivery = _delivery(acme, alice, receiver.url())

    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.DELIVERED

    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.response_excerpt == "x" * EXCERPT_BYTES
    receiver.thread.join(timeout=30)
    assert not receiver.finished, "the whole answer was read"


# --- Clouds ------------------------------------------------------------------------------------------------------


def test_a_cloud_read_is_not_retried_past_the_calls_deadline(tencent_sandbox):
    # Given a cloud that no longer answers, and a client allowed many tries but one second in all
    tencent_sandbox.faults.inject("slow", action="DescribeRegions", seconds=600)  # until the fixture's reset
    settings = TencentClientSettings(
        secret_id=TENCENT_TEST_CREDENTIALS["secret_id"],
        secret_key=TENCENT_TEST_CREDENTIALS["secret_key"],
        endpoint_url=tencent_sandbox.url,
        connect_timeout=0.3,
        read_timeout=0.3,
        max_attempts=10,
        call_deadline=1.0,
    )

    # When a read times out (after 0.3 s at least): another try (up to 0.6 s) would end past the deadline
    with pytest.raises(TransientProviderError):
        TencentClient(settings).call("ap-guangzhou", "DescribeRegions")

    # Then it was tried once, not ten times
    assert len(tencent_sandbox.calls("DescribeRegions")) == 1
