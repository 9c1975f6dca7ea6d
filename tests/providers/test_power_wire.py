"""Stop, start and reboot in each cloud's own words (issue 36): what each sandbox answers on the wire, read back
through the real SDK and the adapter, beyond what the contract suite (``test_contract_power.py``) holds every
cloud to. References: EC2 StopInstances (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_StopInstances.html),
Azure Virtual Machines Deallocate / Power Off / Restart (https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/deallocate)
and "States and billing status of Azure Virtual Machines" (https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing),
Compute Engine instances.stop / start (https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop),
ECS StopInstance (https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-stopinstance) and
its economical mode (https://www.alibabacloud.com/help/en/ecs/user-guide/economical-mode), CVM StopInstances
(https://www.tencentcloud.com/document/api/213/33235) and RebootInstances (https://www.tencentcloud.com/document/api/213/33243).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import boto3
import pytest

from providers.base import ProviderAdapter
from providers.errors import CapacityUnavailable, ProviderRequestRejected, TransientProviderError
from providers.types import InstanceHandle, InstanceState, PricingModel
from sandboxes.aws.keys import CONTRACT
from sandboxes.faults import FaultKind
from tests.providers import alibaba_target, azure_target, gcp_target, tencent_target
from tests.providers.aws_target import ACCESS_KEY
from tests.providers.contract import ContractTarget, launchable, settle, spec_for


def _until(adapter: ProviderAdapter, handle: InstanceHandle, state: InstanceState) -> InstanceHandle:
    for _ in range(100):
        if handle.state == state:
            return handle
        time.sleep(0.05)
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


def _running(target: ContractTarget, **changes) -> tuple[ProviderAdapter, InstanceHandle]:
    adapter = target.make_adapter(True, {})
    result = settle(adapter, replace(spec_for(launchable(target)), **changes))
    assert isinstance(result, InstanceHandle), result
    return adapter, _until(adapter, result, InstanceState.RUNNING)


def _stopped(target: ContractTarget) -> tuple[ProviderAdapter, InstanceHandle]:
    adapter, running = _running(target)
    return adapter, _until(adapter, adapter.stop(running.region, running.instance_id), InstanceState.STOPPED)


def _fresh(sandbox, module) -> Iterator[ContractTarget]:
    sandbox.reset()
    yield module.target(sandbox)
    sandbox.reset()


@pytest.fixture
def sandbox(azure_server):
    return azure_server  # what the ``arm`` fixture signs in to


@pytest.fixture
def azure(azure_server) -> Iterator[ContractTarget]:
    yield from _fresh(azure_server, azure_target)


@pytest.fixture
def gcp(gcp_server) -> Iterator[ContractTarget]:
    yield from _fresh(gcp_server, gcp_target)


@pytest.fixture
def alibaba(alibaba_server) -> Iterator[ContractTarget]:
    yield from _fresh(alibaba_server, alibaba_target)


@pytest.fixture
def tencent(tencent_server) -> Iterator[ContractTarget]:
    yield from _fresh(tencent_server, tencent_target)


# ------------------------------------------------------------------------------------------------------ AWS


def test_ec2_refuses_to_stop_a_one_time_spot_instance(aws_sandbox, aws_adapter):
    """ "You can only stop Spot Instances associated with persistent Spot Instance requests" (UnsupportedOperation):
    the broker's spot launches are one-time requests, so a spot order cannot be stopped on AWS."""
    adapter = aws_adapter(regions=["us-east-1"])
    zone = aws_sandbox.zones("us-east-1", "g5.xlarge")[0]
    offer = next(
        o
        for o in adapter.list_offers()
        if o.instance_type == "g5.xlarge" and o.zone == zone and o.pricing_model == "spot"
    )
    handle = adapter.launch(replace(spec_for(offer), pricing_model=PricingModel.SPOT))

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.stop(handle.region, handle.instance_id)

    assert refused.value.code == "UnsupportedOperation"
    assert adapter.describe(handle.region, handle.instance_id).state == InstanceState.RUNNING


def test_ec2_answers_a_stop_with_the_stopping_state_and_describes_it_stopped(aws_sandbox, aws_adapter):
    adapter = aws_adapter(regions=["us-east-1"])
    offer = next(o for o in adapter.list_offers() if o.instance_type == "g5.xlarge" and o.pricing_model == "on_demand")
    handle = adapter.launch(spec_for(offer))

    stopping = adapter.stop(handle.region, handle.instance_id)

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_sandbox.url, aws_access_key_id=ACCESS_KEY,
                       aws_secret_access_key=CONTRACT.secret_access_key)  # fmt: skip
    described = ec2.describe_instances(InstanceIds=[handle.instance_id])["Reservations"][0]["Instances"][0]
    assert stopping.extra["state_name"] == "stopping" and stopping.state == InstanceState.STOPPING
    assert described["State"]["Name"] == "stopped"
    assert adapter.describe(handle.region, handle.instance_id).state == InstanceState.STOPPED


# ---------------------------------------------------------------------------------------------------- Azure


def test_azure_stop_deallocates_and_a_vm_only_powered_off_is_deallocated_too(azure, arm):
    """Power Off keeps the hardware allocated and billed ("stopped"); the broker's stop deallocates, also a VM
    someone else only powered off."""
    adapter, running = _running(azure)
    vm = (
        f"{azure.sandbox.url}/subscriptions/{adapter.subscription_id}/resourceGroups/{adapter.resource_group}"
        f"/providers/Microsoft.Compute/virtualMachines/{running.instance_id}"
    )
    answer = arm.post(f"{vm}/powerOff", params={"api-version": "2024-07-01"}, timeout=5)
    assert answer.status_code == 202 and "Azure-AsyncOperation" in answer.headers
    powered_off = _until(adapter, adapter.describe(running.region, running.instance_id), InstanceState.STOPPED)
    assert powered_off.extra["power_state"] == "stopped"

    stopped = _until(adapter, adapter.stop(running.region, running.instance_id), InstanceState.STOPPED)
    view = arm.get(vm, params={"api-version": "2024-07-01", "$expand": "instanceView"}, timeout=5).json()

    assert stopped.extra["power_state"] == "deallocated"
    codes = [s["code"] for s in view["properties"]["instanceView"]["statuses"]]
    assert codes == ["ProvisioningState/succeeded", "PowerState/deallocated"]


def test_azure_refuses_to_restart_a_deallocated_vm(azure, arm):
    adapter, stopped = _stopped(azure)

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.reboot(stopped.region, stopped.instance_id)

    assert refused.value.code == "OperationNotAllowed" and refused.value.http_status == 409


def test_azure_start_without_capacity_fails_its_operation_with_allocation_failed(azure):
    adapter, stopped = _stopped(azure)
    azure.sandbox.faults.inject(FaultKind.CAPACITY, action="VirtualMachines_Start", times=1)

    with pytest.raises(CapacityUnavailable) as refused:
        adapter.start(stopped.region, stopped.instance_id)

    assert refused.value.code in ("AllocationFailed", "ZonalAllocationFailed")
    assert adapter.describe(stopped.region, stopped.instance_id).extra["power_state"] == "deallocated"


# ------------------------------------------------------------------------------------------------------ GCP


def test_gcp_calls_a_stopped_instance_terminated_and_refuses_a_start_while_it_stops(gcp):
    adapter, running = _running(gcp)
    zone, name = running.instance_id.split("/")
    # The stop as the SDK sends it, without following its operation: the instance is STOPPING meanwhile.
    adapter._client.instance_action(zone, name, "stop", "0b6d5c1e-5f0a-4c1e-9a43-6f1d2c3b4a51")

    with pytest.raises(TransientProviderError) as refused:  # the broker tries again once the stop is done
        adapter._client.instance_action(zone, name, "start", "0b6d5c1e-5f0a-4c1e-9a43-6f1d2c3b4a52")
    stopped = _until(adapter, adapter.describe(running.region, running.instance_id), InstanceState.STOPPED)

    assert refused.value.code == "resourceNotReady"
    assert stopped.extra["status"] == "TERMINATED"


def test_gcp_start_without_capacity_fails_its_operation_and_the_instance_stays_terminated(gcp):
    adapter, stopped = _stopped(gcp)
    gcp.sandbox.faults.inject(FaultKind.CAPACITY, action="compute.instances.start", times=1)

    with pytest.raises(CapacityUnavailable) as refused:
        adapter.start(stopped.region, stopped.instance_id)

    assert refused.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert adapter.describe(stopped.region, stopped.instance_id).extra["status"] == "TERMINATED"


# -------------------------------------------------------------------------------------------------- Alibaba


def test_ecs_stops_in_economical_mode_and_refuses_to_reboot_a_stopped_instance(alibaba):
    adapter, stopped = _stopped(alibaba)

    assert (stopped.extra["status"], stopped.extra["stopped_mode"]) == ("Stopped", "StopCharging")
    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.reboot(stopped.region, stopped.instance_id)
    assert refused.value.code == "IncorrectInstanceStatus"


def test_ecs_refuses_a_start_without_stock_only_for_an_instance_that_gave_its_compute_back(alibaba):
    adapter, running = _running(alibaba)
    # Standard mode keeps the instance type's resources: its start cannot meet a stock-out.
    adapter._client.call(
        running.region, "StopInstance", {"InstanceId": running.instance_id, "StoppedMode": "KeepCharging"}
    )
    kept = _until(adapter, adapter.describe(running.region, running.instance_id), InstanceState.STOPPED)
    assert kept.extra["stopped_mode"] == "KeepCharging"
    alibaba.sandbox.faults.inject(FaultKind.CAPACITY, action="StartInstance", times=1)

    adapter.start(kept.region, kept.instance_id)
    again = _until(adapter, adapter.describe(kept.region, kept.instance_id), InstanceState.RUNNING)
    assert again.state == InstanceState.RUNNING
    stopped = _until(adapter, adapter.stop(again.region, again.instance_id), InstanceState.STOPPED)
    with pytest.raises(CapacityUnavailable) as refused:
        adapter.start(stopped.region, stopped.instance_id)

    assert refused.value.code == "OperationDenied.NoStock"


# -------------------------------------------------------------------------------------------------- Tencent


def test_cvm_stops_without_charges_and_names_the_state_it_refuses(tencent):
    adapter, stopped = _stopped(tencent)

    assert (stopped.extra["state_name"], stopped.extra["stop_charging_mode"]) == ("STOPPED", "STOP_CHARGING")
    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.reboot(stopped.region, stopped.instance_id)
    assert refused.value.code == "UnsupportedOperation.InstanceStateStopped"
    started = _until(adapter, adapter.start(stopped.region, stopped.instance_id), InstanceState.RUNNING)
    with pytest.raises(ProviderRequestRejected) as again:
        adapter._client.call(started.region, "StartInstances", {"InstanceIds": [started.instance_id]})
    assert again.value.code == "UnsupportedOperation.InstanceStateRunning"
    assert started.extra["latest_operation"] == "StartInstances"
