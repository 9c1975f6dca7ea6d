"""``AzureAdapter`` through azure-mgmt-compute against the HTTPS sandbox: catalogue, prices, launch, terminate."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from providers import gpu_names
from providers.azure.adapter import AzureAdapter
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.azure.app import AzureSandbox

REGIONS = ["eastus", "southcentralus", "westus", "westus3"]
LAUNCH = "VirtualMachines_CreateOrUpdate"


@pytest.fixture
def sandbox(azure_server) -> AzureSandbox:
    azure_server.reset()
    yield azure_server
    azure_server.reset()


@pytest.fixture
def adapter(sandbox):
    """``adapter(regions=[...], client_id=..., **options)`` -> an ``AzureAdapter`` on the sandbox."""

    def build(regions: list[str] | None = None, client_id: str = "petra-app", **options: str) -> AzureAdapter:
        values = {**sandbox.demo_credentials, "client_id": client_id}
        credentials = Credentials(kind="azure", values=values, endpoint_url=sandbox.url)
        merged = {**sandbox.account_options(), "polling_interval": "0.02", **options}
        return AzureAdapter(credentials, regions or REGIONS, merged)

    return build


@pytest.fixture(scope="module")
def offers(azure_server):
    credentials = Credentials(kind="azure", values=dict(azure_server.demo_credentials), endpoint_url=azure_server.url)
    return AzureAdapter(credentials, REGIONS, azure_server.account_options()).list_offers()


def _spec(attempt: str = "ord-alice-a1", **overrides) -> LaunchSpec:
    values = {
        "region": "eastus",
        "zone": "eastus-2",
        "instance_type": "Standard_NC4as_T4_v3",
        "pricing_model": PricingModel.ON_DEMAND,
        "client_token": attempt,
        "order_ref": attempt.rsplit("-", 1)[0],
    }
    values.update(overrides)
    return LaunchSpec(**values)


def _by_key(offers):
    return {q.natural_key: q for q in offers}


# ----------------------------------------------------------------------------------------------- offers


def test_offers_carry_gpu_models_from_size_names(offers):
    rows = _by_key(offers)

    h100 = rows[("eastus", "eastus-1", "Standard_ND96isr_H100_v5", "on_demand")]
    nvl = rows[("eastus", "eastus-1", "Standard_NC40ads_H100_v5", "on_demand")]
    v100 = rows[("westus", "westus", "Standard_NC6s_v3", "on_demand")]
    a10 = rows[("westus3", "westus3-1", "Standard_NC32ads_A10_v4", "on_demand")]
    assert (h100.gpu_model, h100.gpu_count, h100.gpu_memory_gb, h100.interconnect, h100.price) == (
        gpu_names.H100_SXM,
        8,
        80,
        "nvlink",
        Decimal("98.32"),
    )
    assert (nvl.gpu_model, nvl.gpu_memory_gb, nvl.vcpus, nvl.memory_gib) == (gpu_names.H100_NVL, 94, 40, Decimal(320))
    assert (v100.gpu_model, v100.currency, v100.price) == (gpu_names.V100_16_PCIE, "USD", Decimal("3.978"))
    assert (a10.gpu_model, a10.gpu_count) == (gpu_names.A10, 1)
    assert all(q.gpu_model in gpu_names.ALL for q in offers)


def test_offers_per_zone_and_once_per_region_without_zones(offers):
    t4_zones = {q.zone for q in offers if q.instance_type == "Standard_NC4as_T4_v3" and q.region == "eastus"}
    westus_zones = {q.zone for q in offers if q.region == "westus"}
    a10_zones = {q.zone for q in offers if q.instance_type == "Standard_NC32ads_A10_v4"}

    assert t4_zones == {"eastus-1", "eastus-2", "eastus-3"}
    assert westus_zones == {"westus"}
    assert a10_zones == {"westus3-1", "westus3-2"}


def test_restricted_zones_and_sizes_are_not_offered(offers):
    h100_zones = {q.zone for q in offers if q.instance_type == "Standard_ND96isr_H100_v5" and q.region == "eastus"}
    h100 = next(q for q in offers if q.instance_type == "Standard_ND96isr_H100_v5" and q.region == "eastus")

    assert h100_zones == {"eastus-1", "eastus-2"}
    assert h100.extra["restricted_zones"] == ["3"]
    assert not [q for q in offers if q.instance_type == "Standard_NC24rs_v3"]  # NotAvailableForSubscription
    assert not [q for q in offers if q.instance_type == "Standard_D4s_v5"]  # no GPUs


def test_prices_are_linux_pay_as_you_go_and_spot(offers, azure_server):
    rows = _by_key(offers)

    assert rows[("eastus", "eastus-3", "Standard_NC4as_T4_v3", "on_demand")].price == Decimal("0.526")
    assert rows[("eastus", "eastus-3", "Standard_NC4as_T4_v3", "spot")].price == Decimal("0.062699")
    for quote in offers:
        seeded = azure_server.on_demand_price(quote.region, quote.instance_type)
        if quote.pricing_model is PricingModel.ON_DEMAND:
            assert quote.price == seeded
        else:
            assert quote.price == azure_server.spot_price(quote.region, quote.instance_type)


def test_sizes_without_a_spot_market_get_no_spot_quote(offers):
    h100_v5 = [q for q in offers if q.instance_type.endswith("_H100_v5")]

    assert h100_v5
    assert {q.pricing_model for q in h100_v5} == {PricingModel.ON_DEMAND}


def test_every_price_page_is_read(adapter, sandbox, offers):
    sandbox.price_page_size = 2

    paged = adapter().list_offers()

    assert _by_key(paged) == _by_key(offers)
    assert len(sandbox.calls("RetailPrices_List")) > len({(q.region, q.instance_type) for q in offers})


def test_a_read_retries_a_throttled_answer(adapter, sandbox):
    sandbox.retry_after_s = 0
    sandbox.faults.inject("throttle", action="ResourceSkus_List", times=1)
    sandbox.faults.inject("throttle", action="RetailPrices_List", times=1)

    assert adapter(regions=["westus3"]).list_offers()
    assert len(sandbox.calls("ResourceSkus_List")) == 2


# ------------------------------------------------------------------------------------------ credentials


def test_check_credentials_reads_usages_once_with_one_token(adapter, sandbox):
    az = adapter()

    az.check_credentials()
    az.check_credentials()

    assert [c.action for c in sandbox.calls()] == ["OAuth2_Token", "Usage_List", "Usage_List"]


def test_an_unknown_application_is_rejected_with_its_aadsts_code(adapter, sandbox):
    sandbox.accept_client_ids(["someone-else"])

    with pytest.raises(CredentialsRejected) as caught:
        adapter().check_credentials()

    assert caught.value.code == "AADSTS700016"
    assert caught.value.http_status == 400
    assert "not found in the directory" in caught.value.message
    assert sandbox.calls("Usage_List") == []


def test_a_missing_role_is_credentials_rejected(adapter, sandbox):
    sandbox.faults.inject("credentials", action="ResourceSkus_List")

    with pytest.raises(CredentialsRejected) as caught:
        adapter().list_offers()

    assert (caught.value.code, caught.value.http_status) == ("AuthorizationFailed", 403)


def test_missing_credential_values_are_rejected_before_any_call(sandbox):
    values = {**sandbox.demo_credentials, "client_secret": ""}

    with pytest.raises(CredentialsRejected, match="client_secret"):
        AzureAdapter(Credentials(kind="azure", values=values, endpoint_url=sandbox.url), REGIONS)

    assert sandbox.calls() == []


def test_an_untrusted_certificate_fails_the_call(adapter, sandbox):
    with pytest.raises(TransientProviderError):
        adapter(ca_bundle="", max_attempts="1").check_credentials()

    assert sandbox.calls() == []


def test_bad_options_are_refused_at_construction(adapter):
    with pytest.raises(ValueError, match=r"options\.launch_wait_s"):
        adapter(launch_wait_s="soon")
    with pytest.raises(ValueError, match=r"options\.public_ip"):
        adapter(public_ip="maybe")


# ----------------------------------------------------------------------------------------------- launch


def test_launch_creates_a_named_tagged_vm_with_an_inline_nic(adapter, sandbox):
    handle = adapter().launch(_spec(tags={"team": "ml"}))

    assert (handle.instance_id, handle.zone, handle.instance_type, handle.state) == (
        "ord-alice-a1",
        "eastus-2",
        "Standard_NC4as_T4_v3",
        InstanceState.RUNNING,
    )
    [vm] = sandbox.instances()
    assert (vm.instance_id, vm.resource_group, vm.zone, vm.priority) == (
        "ord-alice-a1",
        "broker",
        "eastus-2",
        "Regular",
    )
    assert vm.tags == {"broker:order": "ord-alice", "broker:client-token": "ord-alice-a1", "team": "ml"}
    assert handle.extra["resource_id"].endswith(
        "/resourceGroups/broker/providers/Microsoft.Compute/virtualMachines/ord-alice-a1"
    )


def test_a_relaunch_returns_the_existing_vm_unchanged(adapter, sandbox):
    az = adapter()
    first = az.launch(_spec())

    again = az.launch(_spec(tags={"changed": "yes"}))

    assert again.instance_id == first.instance_id
    assert [v.tags.get("changed") for v in sandbox.instances()] == [None]
    assert len(sandbox.calls(LAUNCH)) == 2


def test_launch_returns_pending_when_azure_is_still_creating(adapter, sandbox):
    sandbox.create_seconds = 0.5

    handle = adapter(launch_wait_s="0").launch(_spec())

    assert handle.state == InstanceState.PENDING
    assert handle.extra["provisioning_state"] == "Creating"
    time.sleep(0.6)
    assert adapter().describe("eastus", handle.instance_id).state == InstanceState.RUNNING


def test_a_spot_launch_sets_priority_eviction_and_max_price(adapter, sandbox):
    handle = adapter().launch(_spec(pricing_model=PricingModel.SPOT, max_price=Decimal("0.07")))

    assert handle.extra["priority"] == "Spot"
    assert handle.extra["eviction_policy"] == "Delete"
    assert [v.priority for v in sandbox.instances()] == ["Spot"]


def test_a_spot_max_price_below_the_market_is_a_capacity_error(adapter, sandbox):
    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec(pricing_model=PricingModel.SPOT, max_price=Decimal("0.01")))

    assert (caught.value.code, caught.value.http_status) == ("OperationNotAllowed", 409)
    assert sandbox.instances() == []


def test_an_allocation_failure_within_the_wait_is_raised_and_the_failed_vm_removed(adapter, sandbox):
    sandbox.faults.inject("capacity", instance_type="Standard_NC6s_v3", zone="westus")

    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec(region="westus", zone="westus", instance_type="Standard_NC6s_v3"))

    assert (caught.value.code, caught.value.http_status) == ("AllocationFailed", 200)
    assert sandbox.instances() == []
    assert len(sandbox.calls("VirtualMachines_Delete")) == 1


def test_a_later_allocation_failure_describes_as_failed(adapter, sandbox):
    sandbox.create_seconds = 0.3
    sandbox.faults.inject("capacity", zone="eastus-2")
    az = adapter(launch_wait_s="0")

    handle = az.launch(_spec())
    time.sleep(0.4)
    failed = az.describe("eastus", handle.instance_id)

    assert handle.state == InstanceState.PENDING
    assert failed.state == InstanceState.FAILED
    assert (failed.extra["error_class"], failed.extra["error_code"]) == ("capacity", "ZonalAllocationFailed")
    assert failed.extra["error_message"].startswith("Allocation failed.")
    assert az.terminate("eastus", handle.instance_id).state == InstanceState.TERMINATED
    assert sandbox.instances() == []


def test_quota_is_refused_synchronously(adapter, sandbox):
    sandbox.faults.inject("quota", instance_type="Standard_NC4as_T4_v3")

    with pytest.raises(QuotaExceeded) as caught:
        adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status) == ("OperationNotAllowed", 409)
    assert "Cores quota" in caught.value.message
    assert sandbox.instances() == []


def test_sku_not_available_is_a_synchronous_capacity_error(adapter, sandbox):
    sandbox.faults.inject("capacity", code="SkuNotAvailable")

    with pytest.raises(CapacityUnavailable) as caught:
        adapter().launch(_spec())

    assert (caught.value.code, caught.value.http_status) == ("SkuNotAvailable", 409)
    assert sandbox.instances() == []


def test_a_restricted_zone_is_refused_as_sku_not_available(adapter, sandbox):
    with pytest.raises(CapacityUnavailable, match="not available"):
        adapter().launch(_spec(zone="eastus-3", instance_type="Standard_ND96isr_H100_v5"))

    assert sandbox.instances() == []


def test_a_throttled_launch_is_not_retried(adapter, sandbox):
    sandbox.faults.inject("throttle", times=2)

    with pytest.raises(TransientProviderError) as caught:
        adapter().launch(_spec())

    assert caught.value.http_status == 429
    assert len(sandbox.calls(LAUNCH)) == 1


def test_launch_needs_a_subnet_and_a_key_and_calls_nothing_without(adapter, sandbox):
    with pytest.raises(ProviderRequestRejected, match="subnet_id"):
        adapter(subnet_id="").launch(_spec())
    with pytest.raises(ProviderRequestRejected, match="ssh_public_key"):
        adapter(ssh_public_key="").launch(_spec())

    assert sandbox.calls() == []


def test_an_image_can_be_chosen_per_launch_or_account(adapter, sandbox):
    with pytest.raises(ProviderRequestRejected, match="image"):
        adapter(image="ubuntu").launch(_spec())

    handle = adapter().launch(_spec(image="/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/gpu"))

    assert handle.state == InstanceState.RUNNING


# ------------------------------------------------------------------------------------ describe, terminate


def test_describe_of_an_unknown_vm_is_rejected(adapter):
    with pytest.raises(ProviderRequestRejected) as caught:
        adapter().describe("eastus", "no-such-vm")

    assert caught.value.code == "ResourceNotFound"


def test_terminate_waits_for_the_delete_and_repeats_as_a_no_op(adapter, sandbox):
    az = adapter()
    handle = az.launch(_spec())

    stopped = az.terminate("eastus", handle.instance_id)
    again = az.terminate("eastus", handle.instance_id)

    assert (stopped.state, stopped.instance_type, stopped.zone) == (
        InstanceState.TERMINATED,
        "Standard_NC4as_T4_v3",
        "eastus-2",
    )
    assert again.state == InstanceState.TERMINATED
    assert sandbox.instances() == []
    assert len(sandbox.calls("VirtualMachines_Delete")) == 1


def test_terminate_reports_stopping_while_azure_deletes(adapter, sandbox):
    az = adapter(terminate_wait_s="0.1")
    handle = az.launch(_spec())
    sandbox.delete_seconds = 0.5

    stopping = az.terminate("eastus", handle.instance_id)
    deleting = az.describe("eastus", handle.instance_id)
    time.sleep(0.5)

    assert (stopping.state, deleting.state) == (InstanceState.STOPPING, InstanceState.STOPPING)
    assert az.terminate("eastus", handle.instance_id).state == InstanceState.TERMINATED


def test_find_by_order_lists_the_orders_vms_in_the_accounts_regions(adapter, sandbox):
    sandbox.create_seconds = 0
    everywhere = adapter()
    everywhere.launch(_spec("ord-bob-a1"))
    everywhere.launch(_spec("ord-bob-a2", zone="eastus-1"))
    everywhere.launch(_spec("ord-bob-a3", region="westus", zone="westus", instance_type="Standard_NC6s_v3"))
    everywhere.launch(_spec("ord-carol-a1"))

    eastus_only = adapter(regions=["eastus"]).find_by_order("ord-bob")

    assert [(h.instance_id, h.state) for h in eastus_only] == [
        ("ord-bob-a1", InstanceState.RUNNING),
        ("ord-bob-a2", InstanceState.RUNNING),
    ]
    assert [h.instance_id for h in everywhere.find_by_order("ord-bob")] == ["ord-bob-a1", "ord-bob-a2", "ord-bob-a3"]
    assert adapter().find_by_order("ord-nobody") == []


# ------------------------------------------------------------------------------------------------ quotas


def _quoted(offers, pricing_model: PricingModel = PricingModel.ON_DEMAND, attempt: str = "ord-alice-a1"):
    quote = _by_key(offers)[("eastus", "eastus-2", "Standard_NC4as_T4_v3", pricing_model.value)]
    return _spec(
        attempt, pricing_model=pricing_model, gpu_count=quote.gpu_count, vcpus=quote.vcpus, offer_extra=quote.extra
    )


def test_the_quota_precheck_reads_the_family_quota_the_launch_would_hit(adapter, sandbox, offers):
    family = _quoted(offers).offer_extra["family"]
    vcpus = _quoted(offers).vcpus
    sandbox.set_quota(family, vcpus)  # room for exactly one VM of this size
    azure = adapter()
    azure.quota_check(_quoted(offers))
    azure.launch(_quoted(offers))

    second = _quoted(offers, attempt="ord-bob-a1")
    with pytest.raises(QuotaExceeded) as precheck:
        azure.quota_check(second)
    assert precheck.value.code == "precheck"
    assert f"quota {family} in eastus: {vcpus} of {vcpus} in use, the launch needs {vcpus}" in str(precheck.value)
    with pytest.raises(QuotaExceeded, match=f"exceeding approved {family} Cores quota"):
        azure.launch(second)
    assert len(sandbox.instances()) == 1


def test_spot_vms_count_only_against_the_low_priority_quota(adapter, sandbox, offers):
    spot = _quoted(offers, PricingModel.SPOT)
    sandbox.set_quota(spot.offer_extra["family"], 0)
    azure = adapter()
    azure.quota_check(spot)  # the family quota does not apply to Spot
    sandbox.set_quota("lowPriorityCores", spot.vcpus - 1)
    with pytest.raises(QuotaExceeded, match="quota lowPriorityCores in eastus"):
        azure.quota_check(spot)
