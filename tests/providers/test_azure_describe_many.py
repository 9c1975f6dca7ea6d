"""``AzureAdapter.describe_many`` (issue 23, point 4): the account's VMs in a few requests, not one per VM.

Microsoft's Compute REST API reference, "Virtual Machines - List All"
(https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/list-all): ``GET /subscriptions/{subscriptionId}
/providers/Microsoft.Compute/virtualMachines`` "Lists all of the virtual machines in the specified subscription. Use
the nextLink property in the response to get the next page"; ``statusOnly=true`` "enables fetching run time status of
all Virtual Machines in the subscription"; ``$expand=instanceView`` "can only be specified if a valid $filter option
is specified", the filter being a scale set's id. The answer is a ``VirtualMachineListResult`` (``value``,
``nextLink``), each status-only VM's run-time status in ``properties.instanceView.statuses``
(``ProvisioningState/...``, ``PowerState/...``), where "Virtual Machines - Get" with ``$expand=instanceView`` puts it.
The reference does not say which of a VM's other fields a status-only item keeps: the sandbox answers its identity
and instance view only, and the adapter reads nothing else from it.

Everything runs through azure-mgmt-compute against the HTTPS sandbox; requests are counted where they arrive.
"""

from __future__ import annotations

import math

import pytest

from providers.azure.adapter import AzureAdapter
from providers.errors import MalformedProviderResponse, TransientProviderError
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, PricingModel
from sandboxes.azure.app import AzureSandbox

REGIONS = ["eastus", "westus"]
LIST_ALL = "VirtualMachines_ListAll"
SUB = AzureSandbox.demo_credentials["subscription_id"]
VM_PATH = "/providers/Microsoft.Compute/virtualMachines"
LIST_ALL_PATH = f"/subscriptions/{SUB}{VM_PATH}"


@pytest.fixture
def sandbox(azure_server) -> AzureSandbox:
    azure_server.reset()
    azure_server.create_seconds = 0.0  # a create is done when its PUT is answered: launches return running
    yield azure_server
    azure_server.reset()


@pytest.fixture
def adapter(sandbox):
    """``adapter(**options)`` -> an ``AzureAdapter`` of the sandbox's subscription (resource group ``broker``)."""

    def build(**options: str) -> AzureAdapter:
        credentials = Credentials(kind="azure", values=dict(sandbox.demo_credentials), endpoint_url=sandbox.url)
        return AzureAdapter(credentials, REGIONS, {**sandbox.account_options(), "polling_interval": "0.02", **options})

    return build


def _spec(token: str, region: str = "eastus") -> LaunchSpec:
    return LaunchSpec(
        region=region,
        zone="eastus-2" if region == "eastus" else region,
        instance_type="Standard_NC4as_T4_v3" if region == "eastus" else "Standard_NC6s_v3",
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token,
        order_ref=token.rsplit("-", 1)[0],
    )


def _launch(az: AzureAdapter, token: str, region: str = "eastus") -> InstanceHandle:
    handle = az.launch(_spec(token, region))
    assert handle.state is InstanceState.RUNNING, handle
    return handle


def test_many_vms_are_described_in_one_request_per_page(adapter, sandbox):
    az = adapter()
    launched = [_launch(az, f"ord-fleet{n}-a1") for n in range(5)]
    ids = [h.instance_id for h in launched]
    sandbox.vm_page_size = 2
    sandbox.clear_calls()

    answer = az.describe_many("eastus", [*ids, ids[0]])

    assert {i: (h.instance_id, h.region, h.state) for i, h in answer.items()} == {
        i: (i, "eastus", InstanceState.RUNNING) for i in ids
    }
    # The sandbox lists a VM's model unless statusOnly=true was sent, and a model has no instance view: the power
    # states above prove the SDK sent it, on every page.
    assert {h.extra["power_state"] for h in answer.values()} == {"running"}
    assert [c.action for c in sandbox.calls()] == [LIST_ALL] * math.ceil(len(ids) / 2) == [LIST_ALL] * 3


def test_each_state_reads_as_describe_reads_it(adapter, sandbox):
    az, quick = adapter(), adapter(launch_wait_s="0", terminate_wait_s="0")
    running = _launch(az, "ord-up-a1").instance_id
    sandbox.faults.inject("capacity", zone="eastus-2", times=1)
    failed = quick.launch(_spec("ord-refused-a1")).instance_id  # the create's operation failed: Azure keeps the VM
    sandbox.delete_seconds = 600.0
    deleting = _launch(az, "ord-going-a1").instance_id
    quick.terminate("eastus", deleting)
    sandbox.create_seconds = 600.0
    creating = quick.launch(_spec("ord-coming-a1")).instance_id
    ids = [running, failed, deleting, creating]
    fields = ("provisioning_state", "power_state", "error_class", "error_code", "error_message")

    answer = az.describe_many("eastus", ids)
    described = {i: az.describe("eastus", i) for i in ids}

    assert {i: (h.state, *(h.extra.get(f) for f in fields)) for i, h in answer.items()} == {
        i: (h.state, *(h.extra.get(f) for f in fields)) for i, h in described.items()
    }
    assert [answer[i].state for i in ids] == [
        InstanceState.RUNNING,
        InstanceState.FAILED,
        InstanceState.STOPPING,
        InstanceState.PENDING,
    ]
    assert (answer[failed].extra["error_class"], answer[failed].extra["error_code"]) == (
        "capacity",
        "ZonalAllocationFailed",
    )
    # A status-only item carries no model: what only a describe knows is left empty, not guessed.
    assert (answer[running].instance_type, answer[running].zone, answer[running].tags) == ("", "", {})


def test_a_deleted_vm_and_an_unknown_name_are_absent(adapter, sandbox):
    az = adapter()
    kept, deleted = (_launch(az, f"ord-{name}-a1").instance_id for name in ("kept", "gone"))
    assert az.terminate("eastus", deleted).state is InstanceState.TERMINATED
    sandbox.clear_calls()

    answer = az.describe_many("eastus", [kept, deleted, "ord-never-a1"])

    assert list(answer) == [kept]
    assert [c.action for c in sandbox.calls()] == [LIST_ALL]


def test_vms_of_another_resource_group_or_region_are_left_out(adapter, sandbox):
    az, neighbour = adapter(), adapter(resource_group="research")
    ours = _launch(az, "ord-shared-a1").instance_id
    twin = _launch(neighbour, "ord-shared-a1").instance_id  # the same name, in the other resource group
    theirs = _launch(neighbour, "ord-theirs-a1").instance_id
    west = _launch(az, "ord-west-a1", region="westus").instance_id
    asked = [ours, theirs, west]

    answer = az.describe_many("eastus", asked)
    from_neighbour = neighbour.describe_many("eastus", asked)

    assert twin == ours
    assert {i: h.extra["resource_id"].split("/")[4] for i, h in answer.items()} == {ours: "broker"}
    assert {i: h.extra["resource_id"].split("/")[4] for i, h in from_neighbour.items()} == {
        ours: "research",
        theirs: "research",
    }
    assert list(az.describe_many("westus", asked)) == [west]


def test_no_ids_ask_nothing(adapter, sandbox):
    assert adapter().describe_many("eastus", []) == {}
    assert sandbox.calls() == []


def _page(sandbox: AzureSandbox, *, next_skiptoken: int | None = None, value: list | None = None) -> dict:
    page: dict = {"value": value or []}
    if next_skiptoken is not None:
        page["nextLink"] = (
            f"{sandbox.url}{LIST_ALL_PATH}?api-version=2026-04-01&statusOnly=true&$skiptoken={next_skiptoken}"
        )
    return page


def _status_item(name: str, *, resource_group: str = "broker", **overrides) -> dict:
    item = {
        "name": name,
        "id": f"/subscriptions/{SUB}/resourceGroups/{resource_group}{VM_PATH}/{name}",
        "type": "Microsoft.Compute/virtualMachines",
        "location": "eastus",
        "properties": {"instanceView": {"statuses": [{"code": "PowerState/running"}]}},
    }
    item.update(overrides)
    return item


MALFORMED = {
    "a list instead of an object": [1, 2],
    "no value": {"nextLink": None},
    "value not a list": {"value": "vm-1"},
    "an item that is not an object": {"value": ["vm-1"]},
    "an item without a name": {"value": [_status_item("")]},
    "an id naming no resource group": {"value": [_status_item("ord-x-a1", id="ord-x-a1")]},
    "no location": {"value": [_status_item("ord-x-a1", location=None)]},
    "a model without an instance view": {
        "value": [_status_item("ord-x-a1", properties={"hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"}})]
    },
    "statuses not a list": {"value": [_status_item("ord-x-a1", properties={"instanceView": {"statuses": "up"}})]},
    "a nextLink off the ARM endpoint": {"value": [], "nextLink": "https://attacker.example/steal"},
    "a nextLink that is not a string": {"value": [], "nextLink": 7},
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_list_answer_raises_malformed(adapter, sandbox, body):
    sandbox.answer_next(LIST_ALL, body)

    with pytest.raises(MalformedProviderResponse):
        adapter().describe_many("eastus", ["ord-x-a1"])

    assert [c.action for c in sandbox.calls() if c.action != "OAuth2_Token"] == [LIST_ALL]


def test_an_answer_that_is_not_json_raises_malformed(adapter, sandbox):
    sandbox.answer_next(LIST_ALL, b"<html>gateway</html>")

    with pytest.raises(MalformedProviderResponse, match="not bounded JSON"):
        adapter().describe_many("eastus", ["ord-x-a1"])


def test_a_malformed_second_page_fails_the_whole_read(adapter, sandbox):
    sandbox.answer_next(LIST_ALL, _page(sandbox, next_skiptoken=1, value=[_status_item("ord-x-a1")]))
    sandbox.answer_next(LIST_ALL, {"value": [{"name": "ord-y-a1"}]})

    with pytest.raises(MalformedProviderResponse, match="ord-y-a1"):
        adapter().describe_many("eastus", ["ord-x-a1", "ord-y-a1"])

    assert len(sandbox.calls(LIST_ALL)) == 2


def test_a_nextlink_seen_twice_stops_the_read(adapter, sandbox):
    looping = _page(sandbox, next_skiptoken=1, value=[_status_item("ord-x-a1")])
    sandbox.answer_next(LIST_ALL, looping)
    sandbox.answer_next(LIST_ALL, looping)

    with pytest.raises(MalformedProviderResponse, match="came twice"):
        adapter().describe_many("eastus", ["ord-x-a1"])

    assert len(sandbox.calls(LIST_ALL)) == 2


def test_a_throttled_list_raises_the_transient_error_after_its_retries(adapter, sandbox):
    sandbox.retry_after_s = 0
    sandbox.faults.inject("throttle", action=LIST_ALL)

    with pytest.raises(TransientProviderError) as caught:
        adapter(max_attempts="2").describe_many("eastus", ["ord-x-a1"])

    assert caught.value.http_status == 429
    assert len(sandbox.calls(LIST_ALL)) == 2


def test_a_page_throttled_once_is_read_again(adapter, sandbox):
    az = adapter()
    ids = [_launch(az, f"ord-t{n}-a1").instance_id for n in range(3)]
    sandbox.vm_page_size = 2
    sandbox.retry_after_s = 0
    sandbox.clear_calls()
    sandbox.faults.inject("throttle", action=LIST_ALL, times=1)

    answer = az.describe_many("eastus", ids)

    assert sorted(answer) == sorted(ids)
    assert len(sandbox.calls(LIST_ALL)) == 2 + 1


def test_the_pages_end_within_the_calls_deadline(adapter, sandbox):
    az = adapter()
    ids = [_launch(az, f"ord-d{n}-a1").instance_id for n in range(2)]
    sandbox.vm_page_size = 1
    # One attempt's worst case (connect + read timeout) leaves 0.4 s of the 90 s deadline to start another in; the
    # first page takes longer than that, so the second is not asked for.
    slow = adapter(connect_timeout="0.5", read_timeout="89.1")
    slow.check_credentials()  # the token first, so only the list's own time counts
    sandbox.faults.inject("slow", action=LIST_ALL, seconds=0.6, times=1)
    sandbox.clear_calls()

    with pytest.raises(TransientProviderError) as caught:
        slow.describe_many("eastus", ids)

    assert caught.value.code == "CallDeadlineExceeded"
    assert len(sandbox.calls(LIST_ALL)) == 1


# --- The sandbox's wire -------------------------------------------------------------------------------------------


def test_the_sandbox_lists_status_only_pages_back_to_itself(adapter, sandbox, arm):
    az = adapter()
    names = sorted(_launch(az, f"ord-w{n}-a1").instance_id for n in range(3))
    sandbox.vm_page_size = 2
    url = f"{sandbox.url}{LIST_ALL_PATH}"

    first = arm.get(url, params={"api-version": "2026-04-01", "statusOnly": "true"}, timeout=5).json()
    second = arm.get(first["nextLink"], timeout=5).json()
    model = arm.get(url, params={"api-version": "2026-04-01"}, timeout=5).json()
    expand = arm.get(url, params={"api-version": "2026-04-01", "$expand": "instanceView"}, timeout=5)

    assert first["nextLink"].startswith(f"{url}?") and "statusOnly=true" in first["nextLink"]
    assert "nextLink" not in second
    items = first["value"] + second["value"]
    assert [i["name"] for i in items] == names
    assert {tuple(sorted(i)) for i in items} == {("id", "location", "name", "properties", "type")}
    assert [s["code"] for s in items[0]["properties"]["instanceView"]["statuses"]] == [
        "ProvisioningState/succeeded",
        "PowerState/running",
    ]
    assert all("instanceView" not in i["properties"] and i["properties"]["hardwareProfile"] for i in model["value"])
    assert (expand.status_code, expand.json()["error"]["target"]) == (400, "$expand")
