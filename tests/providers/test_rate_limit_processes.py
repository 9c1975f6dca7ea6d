"""Many worker processes drawing on one bucket in Redis (providers/ratelimit.py) never get more than it holds.

Separate OS processes (spawned, so they share nothing but Redis), released together by a barrier, take tokens
from one bucket as fast as it lets them. Every time is Redis's own (``TIME``), the clock the buckets run on.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from typing import Any

import pytest
import redis
from django.conf import settings

from providers.ratelimit import BucketKey, Limit, RateLimiter

PROCESSES = 8
GRANTS_EACH = 12
LIMIT = Limit(5, 50)  # five at once, then one every 20 ms: 96 grants take about 1.8 s
SLACK = 0.001  # tokens: the script's microsecond rounding is worth 50 x 1e-6 of a token per grant


def _take_tokens(url: str, key: tuple[str, str, str, str], barrier: Any, results: Any) -> None:
    """One worker: wait for the others, then take GRANTS_EACH tokens, noting for each the Redis time it was
    decided (``at``), the wait it was told (µs), and the Redis time once that wait was over and the request would go."""
    limiter = RateLimiter(url)
    store = redis.Redis.from_url(url)
    bucket = BucketKey(*key)
    barrier.wait(timeout=120)
    grants = []
    for _ in range(GRANTS_EACH):
        grant = limiter.acquire([(bucket, LIMIT, 1.0)])
        seconds, micros = store.time()
        grants.append((grant.at_us, round(grant.wait_s * 1_000_000), seconds * 1_000_000 + micros, grant.shared))
    results.put((os.getpid(), grants))


def test_processes_sharing_a_bucket_get_no_more_than_capacity_plus_refill_x_elapsed() -> None:
    url = settings.PROVIDER_RATE_LIMIT_REDIS_URL
    if not url:
        pytest.skip("the shared buckets need Redis: set REDIS_URL (.ci/run does)")
    store = redis.Redis.from_url(url)
    key = BucketKey("aws", f"processes-{uuid.uuid4()}", "us-east-1", "DescribeImages")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES + 1)
    results = context.Queue()
    workers = [
        context.Process(
            target=_take_tokens, args=(url, (key.provider, key.account, key.region, key.group), barrier, results)
        )
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        seconds, micros = store.time()
        start_us = seconds * 1_000_000 + micros  # before any worker can ask: the bucket is created after this
        barrier.wait(timeout=120)
        collected = [results.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
        store.delete(key.redis_key)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES

    grants = [grant for _, taken in collected for grant in taken]
    count = PROCESSES * GRANTS_EACH
    assert len(grants) == count and all(shared for *_, shared in grants)
    assert len({pid for pid, _ in collected}) == PROCESSES
    capacity, refill = LIMIT.capacity, LIMIT.refill_per_s

    # The grants as the bucket decided them (each one's time plus its wait): in every window between two of them,
    # at most capacity + refill x the window's length. The bucket was driven to that bound (some window comes
    # within one token of it), so one grant too many would fail this.
    granted = sorted(at + wait for at, wait, _, _ in grants)
    excess = max(
        (j - i + 1) - (capacity + refill * (granted[j] - granted[i]) / 1_000_000)
        for i in range(count)
        for j in range(i, count)
    )
    assert -1 < excess <= SLACK

    # The requests as they would have gone out (Redis's clock read after each wait): from the moment before the
    # workers were released, the k-th of them no earlier than capacity + refill x elapsed allows.
    sent = sorted(after for _, _, after, _ in grants)
    for k, at in enumerate(sent, start=1):
        assert k <= capacity + refill * (at - start_us) / 1_000_000 + SLACK, (k, at - start_us)

    # They did contend: all but the first burst had to wait, and the waiting was shared among the processes.
    waited = [(pid, wait) for pid, taken in collected for _, wait, _, _ in taken if wait > 0]
    assert len(waited) >= count - capacity - 1
    assert len({pid for pid, _ in waited}) == PROCESSES
