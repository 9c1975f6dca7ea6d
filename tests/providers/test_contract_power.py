"""One stop/start/reboot contract, every cloud (issue 36): through the real SDK against each cloud's sandbox, a
stop keeps the instance (same id, same disk) and reports it ``STOPPED`` - never lost nor terminated -, a start
brings it back to ``RUNNING``, both are idempotent, a reboot keeps it running, a start the cloud has no capacity
for is ``CapacityUnavailable`` and leaves the instance stopped, and a terminated instance is refused. A booted
machine's agent stops with the instance and starts again, re-attaching to its lease, when it is started.

Each cloud's operations are cited from its API reference in its adapter and its sandbox: EC2 StopInstances /
StartInstances / RebootInstances (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html),
Azure Virtual Machines Deallocate / Start / Restart
(https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/deallocate), Compute Engine instances.stop /
start / reset (https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop), ECS StopInstances /
StartInstances / RebootInstances (https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-stopinstances),
CVM StopInstances / StartInstances / RebootInstances (https://www.tencentcloud.com/document/api/213/33235).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from providers.base import ProviderAdapter
from providers.errors import CapacityUnavailable, ProviderRequestRejected
from providers.types import InstanceHandle, InstanceState
from sandboxes.boot import BootMode
from sandboxes.faults import FaultKind
from tests.providers.contract import ContractTarget, contract_boot, launchable, settle, spec_for


def _until(adapter: ProviderAdapter, handle: InstanceHandle, state: InstanceState, polls: int = 100) -> InstanceHandle:
    """Describe until the instance reports ``state`` (the sandboxes move an instance on as it is polled)."""
    for _ in range(polls):
        if handle.state == state:
            return handle
        time.sleep(0.05)
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


def _running(target: ContractTarget, *, boot: bool = False) -> tuple[ProviderAdapter, InstanceHandle]:
    adapter = target.make_adapter(True, {})
    spec = spec_for(launchable(target))
    if boot:
        spec = replace(spec, boot=contract_boot())
    result = settle(adapter, spec)
    assert isinstance(result, InstanceHandle), result
    return adapter, _until(adapter, result, InstanceState.RUNNING)


def _stopped(target: ContractTarget, *, boot: bool = False) -> tuple[ProviderAdapter, InstanceHandle]:
    adapter, handle = _running(target, boot=boot)
    stopping = adapter.stop(handle.region, handle.instance_id)
    assert stopping.state in (InstanceState.STOPPING, InstanceState.STOPPED)
    return adapter, _until(adapter, stopping, InstanceState.STOPPED)


@pytest.fixture(autouse=True)
def _stoppable_kinds_only(target):
    """A kind without a stop that keeps the disk (a Kubernetes pod) is held to ``ProviderAdapter.stop``'s
    refusal in its own tests instead."""
    if not target.make_adapter(True, {}).stoppable:
        pytest.skip(f"{target.kind} has no stop that keeps the instance")


@pytest.fixture
def held(target):
    booter = target.sandbox.booter
    mode = booter.mode
    booter.mode = BootMode.HOLD
    yield target
    booter.reset()
    booter.mode = mode


def test_the_adapter_can_stop_and_says_what_a_stopped_instance_is_billed(target):
    adapter = target.make_adapter(True, {})

    assert adapter.stoppable is True
    assert "https://" in adapter.stopped_billing  # the cloud's own reference for it


def test_a_stop_keeps_the_instance_and_a_start_brings_the_same_one_back(target):
    adapter, stopped = _stopped(target)

    assert stopped.state == InstanceState.STOPPED
    assert adapter.describe_many(stopped.region, [stopped.instance_id])[stopped.instance_id].state == (
        InstanceState.STOPPED
    )
    assert len(target.instances()) == 1  # kept (its state is the cloud's word for stopped: GCP says TERMINATED)

    again = adapter.stop(stopped.region, stopped.instance_id)
    assert again.state == InstanceState.STOPPED

    starting = adapter.start(stopped.region, stopped.instance_id)
    assert starting.state in (InstanceState.PENDING, InstanceState.RUNNING)
    running = _until(adapter, starting, InstanceState.RUNNING)
    assert running.state == InstanceState.RUNNING
    assert running.instance_id == stopped.instance_id
    assert adapter.start(running.region, running.instance_id).state in (InstanceState.PENDING, InstanceState.RUNNING)


def test_a_reboot_keeps_the_instance_running(target):
    adapter, running = _running(target)

    rebooted = adapter.reboot(running.region, running.instance_id)

    assert rebooted.instance_id == running.instance_id
    assert _until(adapter, rebooted, InstanceState.RUNNING).state == InstanceState.RUNNING


def test_a_stopped_instance_cannot_be_rebooted(target):
    adapter, stopped = _stopped(target)

    with pytest.raises(ProviderRequestRejected):
        adapter.reboot(stopped.region, stopped.instance_id)


def test_a_start_without_capacity_is_capacity_unavailable_and_the_instance_stays_stopped(target):
    adapter, stopped = _stopped(target)
    target.sandbox.faults.inject(FaultKind.CAPACITY, action=target.extra["start_action"], times=1)

    with pytest.raises(CapacityUnavailable):
        adapter.start(stopped.region, stopped.instance_id)

    assert _until(adapter, adapter.describe(stopped.region, stopped.instance_id), InstanceState.STOPPED).state == (
        InstanceState.STOPPED
    )
    assert _until(adapter, adapter.start(stopped.region, stopped.instance_id), InstanceState.RUNNING).state == (
        InstanceState.RUNNING
    )


def test_a_terminated_instance_is_neither_stopped_nor_started(target):
    adapter, running = _running(target)
    ended = _until(adapter, adapter.terminate(running.region, running.instance_id), InstanceState.TERMINATED)
    assert ended.state == InstanceState.TERMINATED

    with pytest.raises(ProviderRequestRejected):
        adapter.stop(running.region, running.instance_id)
    with pytest.raises(ProviderRequestRejected):
        adapter.start(running.region, running.instance_id)


def test_a_stopped_machine_starts_its_agent_again_on_start(held):
    adapter, stopped = _stopped(held, boot=True)
    booter = held.sandbox.booter

    assert booter.powered_off(stopped.instance_id)
    with pytest.raises(KeyError):
        booter.machine(stopped.instance_id)

    _until(adapter, adapter.start(stopped.region, stopped.instance_id), InstanceState.RUNNING)

    machine = booter.machine(stopped.instance_id)
    assert not booter.powered_off(stopped.instance_id)
    assert machine.key_file is not None
    assert [r.outcome for r in booter.records if r.instance_id == stopped.instance_id] == [
        "booted",
        "powered_off",
        "started_again",
    ]
