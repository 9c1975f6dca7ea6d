"""One contract, every adapter: the same scenarios against each provider's sandbox through its real SDK."""

from __future__ import annotations

import time

import pytest

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.types import InstanceHandle, InstanceState, PricingModel
from tests.providers.contract import launchable, live, offers, settle, spec_for


def test_list_offers(target):
    rows = offers(target)

    assert rows, "the sandbox catalogue produced no offers"
    assert all(q.price > 0 for q in rows)
    assert all(q.gpu_count >= 1 for q in rows)
    assert {q.currency for q in rows} <= {"USD", "CNY"}
    assert {q.pricing_model for q in rows} >= {PricingModel.ON_DEMAND}
    assert sum(q.gpu_model in gpu_names.ALL for q in rows) >= len(rows) * 0.8
    assert all(q.region in target.regions or not target.regions for q in rows)


def test_launch(target):
    adapter = target.make_adapter(True, {})
    spec = spec_for(launchable(target))

    result = settle(adapter, spec)

    assert isinstance(result, InstanceHandle), result
    assert result.state in {InstanceState.PENDING, InstanceState.RUNNING}
    assert (result.instance_type, result.zone) == (spec.instance_type, spec.zone)
    assert adapter.describe(spec.region, result.instance_id).instance_id == result.instance_id
    assert [h.instance_id for h in adapter.find_by_order(spec.order_ref)] == [result.instance_id]


def test_relaunch_with_the_same_token_returns_the_same_instance(target):
    adapter = target.make_adapter(True, {})
    spec = spec_for(launchable(target))

    first = adapter.launch(spec)
    again = adapter.launch(spec)

    assert again.instance_id == first.instance_id
    assert len(live(target)) == 1


def test_capacity_error(target):
    offer = launchable(target)
    target.sandbox.faults.inject(
        "capacity", action=target.launch_action, instance_type=offer.instance_type, zone=offer.zone
    )

    result = settle(target.make_adapter(True, {}), spec_for(offer))

    assert isinstance(result, CapacityUnavailable), result
    assert result.code
    assert live(target) == []


def test_quota_error(target):
    offer = launchable(target)
    target.sandbox.faults.inject("quota", action=target.launch_action, instance_type=offer.instance_type)

    result = settle(target.make_adapter(True, {}), spec_for(offer))

    assert isinstance(result, QuotaExceeded), result
    assert result.code
    assert live(target) == []


def test_throttled_then_succeeds(target):
    offer = launchable(target)
    adapter = target.make_adapter(True, {})
    spec = spec_for(offer)
    target.sandbox.faults.inject("throttle", action=target.launch_action, times=1)

    with pytest.raises(TransientProviderError):
        adapter.launch(spec)
    handle = adapter.launch(spec)

    assert [getattr(i, "instance_id", None) for i in live(target)] == [handle.instance_id]
    # Reads retry on their own: one throttled answer does not fail a sync.
    target.sandbox.faults.inject("throttle", action=target.read_action, times=1)
    assert target.make_adapter(True, {}).list_offers()


def test_slow_response_beyond_the_client_timeout(target):
    target.sandbox.faults.inject("slow", action=target.read_action, seconds=3)

    started = time.monotonic()
    with pytest.raises(TransientProviderError):
        target.make_adapter(True, target.short_timeout).list_offers()

    assert time.monotonic() - started < 3


def test_terminate(target):
    adapter = target.make_adapter(True, {})
    spec = spec_for(launchable(target))
    handle = adapter.launch(spec)

    stopped = adapter.terminate(spec.region, handle.instance_id)
    for _ in range(50):
        if stopped.state == InstanceState.TERMINATED:
            break
        time.sleep(0.1)
        stopped = adapter.describe(spec.region, handle.instance_id)
    again = adapter.terminate(spec.region, handle.instance_id)

    assert stopped.state == InstanceState.TERMINATED
    assert again.state == InstanceState.TERMINATED
    assert live(target) == []


def test_credentials_rejected(target):
    adapter = target.make_adapter(False, {})

    with pytest.raises(CredentialsRejected):
        adapter.check_credentials()
    with pytest.raises(CredentialsRejected):
        adapter.list_offers()
    target.make_adapter(True, {}).check_credentials()
