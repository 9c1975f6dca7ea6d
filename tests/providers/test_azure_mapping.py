"""Azure's shapes and codes -> the broker's: pure functions, no network."""

from __future__ import annotations

from decimal import Decimal

import pytest

from providers import gpu_names
from providers.azure import catalog, errors, launching, mapping
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.types import InstanceState, LaunchSpec, PricingModel


@pytest.mark.parametrize(
    ("size", "reported", "expected"),
    [
        ("Standard_NC4as_T4_v3", 1, (gpu_names.T4, 1, 16, "pcie")),
        ("Standard_NC64as_T4_v3", 4, (gpu_names.T4, 4, 16, "pcie")),
        ("Standard_NC32ads_A10_v4", 1, (gpu_names.A10, 1, 24, "pcie")),
        ("Standard_NC6s_v3", 1, (gpu_names.V100_16_PCIE, 1, 16, "pcie")),
        ("Standard_NC24rs_v3", 4, (gpu_names.V100_16_PCIE, 4, 16, "pcie")),
        ("Standard_ND40rs_v2", 8, (gpu_names.V100_32_SXM2, 8, 32, "nvlink")),
        ("Standard_NC24ads_A100_v4", 1, (gpu_names.A100_80_PCIE, 1, 80, "pcie")),
        ("Standard_ND96asr_v4", 8, (gpu_names.A100_40_SXM, 8, 40, "nvlink")),
        ("Standard_ND96amsr_A100_v4", 8, (gpu_names.A100_80_SXM, 8, 80, "nvlink")),
        ("Standard_NC40ads_H100_v5", 1, (gpu_names.H100_NVL, 1, 94, "pcie")),
        ("Standard_NC80adis_H100_v5", 2, (gpu_names.H100_NVL, 2, 94, "nvlink")),
        ("Standard_ND96isr_H100_v5", 8, (gpu_names.H100_SXM, 8, 80, "nvlink")),
    ],
)
def test_the_size_name_decides_the_gpu_model(size, reported, expected):
    spec = catalog.gpu_spec(size, reported)

    assert spec is not None
    assert (spec.model, spec.count, spec.memory_gb, spec.interconnect) == expected


def test_a_full_node_size_keeps_its_documented_gpu_count_over_a_wrong_report():
    spec = catalog.gpu_spec("Standard_ND96isr_H100_v5", 12)

    assert spec is not None
    assert (spec.count, spec.reported_count) == (8, 12)


def test_a10_slices_are_not_whole_cards():
    spec = catalog.gpu_spec("Standard_NC8ads_A10_v4", 1)

    assert spec is not None
    assert (spec.model, spec.count, spec.memory_gb) == ("A10 (1/3 partition)", 1, 8)
    assert spec.model not in gpu_names.ALL


def test_an_unknown_gpu_size_keeps_its_name_and_a_size_without_gpus_is_skipped():
    unknown = catalog.gpu_spec("Standard_NV36ads_A10_v5", 1)

    assert unknown is not None and unknown.model == "Standard_NV36ads_A10_v5"
    assert catalog.gpu_spec("Standard_D4s_v5", None) is None
    assert catalog.gpu_spec("Standard_D4s_v5", 0) is None


def _sku(**overrides):
    item = {
        "resourceType": "virtualMachines",
        "name": "Standard_ND96isr_H100_v5",
        "family": "standardNDISRH100v5Family",
        "locations": ["eastus"],
        "locationInfo": [{"location": "eastus", "zones": ["3", "1", "2"]}],
        "capabilities": [
            {"name": "vCPUs", "value": "96"},
            {"name": "MemoryGB", "value": "1900"},
            {"name": "GPUs", "value": "8"},
            {"name": "LowPriorityCapable", "value": "True"},
            {"name": "RdmaEnabled", "value": "True"},
        ],
        "restrictions": [],
    }
    item.update(overrides)
    return item


def test_sku_spec_reads_capabilities_and_names_zones_region_dash_number():
    spec = catalog.sku_spec(_sku(), "eastus")

    assert spec is not None
    assert (spec.name, spec.vcpus, spec.memory_gib, spec.spot_capable) == (
        "Standard_ND96isr_H100_v5",
        96,
        Decimal(1900),
        True,
    )
    assert spec.zones == ["eastus-1", "eastus-2", "eastus-3"]
    assert spec.extra["rdma"] is True


def test_a_size_without_zones_is_offered_once_under_the_region_name():
    spec = catalog.sku_spec(_sku(locations=["westus"], locationInfo=[{"location": "westus", "zones": []}]), "westus")

    assert spec is not None and spec.zones == ["westus"]


def test_zone_restrictions_hide_zones_and_location_restrictions_hide_the_size():
    zone_restricted = _sku(
        restrictions=[
            {
                "type": "Zone",
                "values": ["eastus"],
                "restrictionInfo": {"locations": ["eastus"], "zones": ["3"]},
                "reasonCode": "NotAvailableForSubscription",
            }
        ]
    )
    location_restricted = _sku(
        restrictions=[{"type": "Location", "values": ["eastus"], "reasonCode": "QuotaId", "restrictionInfo": {}}]
    )
    all_zones = _sku(
        restrictions=[
            {"type": "Zone", "values": ["eastus"], "restrictionInfo": {"zones": ["1", "2", "3"]}, "reasonCode": "X"}
        ]
    )
    elsewhere = _sku(restrictions=[{"type": "Location", "values": ["westus"], "reasonCode": "QuotaId"}])

    spec = catalog.sku_spec(zone_restricted, "eastus")

    assert spec is not None
    assert spec.zones == ["eastus-1", "eastus-2"]
    assert spec.extra["restricted_zones"] == ["3"]
    assert catalog.sku_spec(location_restricted, "eastus") is None
    assert catalog.sku_spec(all_zones, "eastus") is None
    assert catalog.sku_spec(elsewhere, "eastus") is not None


def test_non_vm_and_non_gpu_skus_are_skipped():
    assert catalog.sku_spec(_sku(resourceType="disks"), "eastus") is None
    assert (
        catalog.sku_spec(_sku(name="Standard_D4s_v5", capabilities=[{"name": "vCPUs", "value": "4"}]), "eastus") is None
    )
    assert catalog.sku_spec(_sku(), "westus") is None  # listed for another location


def test_unreadable_capabilities_are_malformed():
    with pytest.raises(MalformedProviderResponse):
        catalog.sku_spec(
            _sku(capabilities=[{"name": "GPUs", "value": "8"}, {"name": "vCPUs", "value": "many"}]), "eastus"
        )


def _price(sku_name, price, product="Virtual Machines NCasT4_v3 Series", **overrides):
    item = {
        "armSkuName": "Standard_NC4as_T4_v3",
        "armRegionName": "eastus",
        "skuName": sku_name,
        "productName": product,
        "retailPrice": price,
        "unitOfMeasure": "1 Hour",
        "currencyCode": "USD",
        "type": "Consumption",
        "effectiveStartDate": "2025-01-01T00:00:00Z",
        "meterId": f"m-{sku_name}-{price}",
    }
    item.update(overrides)
    return item


def test_sku_prices_take_linux_pay_as_you_go_rows_only():
    items = [
        _price("NC4as T4 v3", 0.526),
        _price("NC4as T4 v3 Spot", 0.062699),
        _price("NC4as T4 v3 Low Priority", 0.01),
        _price("NC4as T4 v3", 0.9, product="Virtual Machines NCasT4_v3 Series Windows"),
        _price("NC4as T4 v3 Spot", 0.3, product="Virtual Machines NCasT4_v3 Series Windows"),
        _price("NC4as T4 v3", 0.4, type="DevTestConsumption"),
        _price("NC4as T4 v3", 2900.0, type="Reservation", reservationTerm="1 Year"),
        _price("NC4as T4 v3", 0.5, currencyCode="EUR"),
        _price("NC4as T4 v3", 0.1, armRegionName="westus"),
    ]

    prices = catalog.sku_prices(items, "eastus", "Standard_NC4as_T4_v3")

    assert (prices.on_demand, prices.spot, prices.currency) == (Decimal("0.526"), Decimal("0.062699"), "USD")
    assert prices.on_demand_meter == "m-NC4as T4 v3-0.526"


def test_the_newest_price_wins():
    items = [
        _price("NC4as T4 v3", 0.6, effectiveStartDate="2023-01-01T00:00:00Z"),
        _price("NC4as T4 v3", 0.526, effectiveStartDate="2025-01-01T00:00:00Z"),
    ]

    assert catalog.sku_prices(items, "eastus", "Standard_NC4as_T4_v3").on_demand == Decimal("0.526")


def test_no_price_rows_mean_no_prices():
    prices = catalog.sku_prices([], "eastus", "Standard_NC4as_T4_v3")

    assert (prices.on_demand, prices.spot) == (None, None)


def test_prices_filter_names_region_and_size_and_refuses_quotes():
    assert catalog.prices_filter("eastus", "Standard_NC4as_T4_v3") == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
        "and armSkuName eq 'Standard_NC4as_T4_v3' and priceType eq 'Consumption'"
    )
    with pytest.raises(ProviderRequestRejected):
        catalog.prices_filter("eastus", "x' or 'a' eq 'a")


@pytest.mark.parametrize(
    ("code", "message", "status", "expected"),
    [
        ("AllocationFailed", "", 200, CapacityUnavailable),
        ("ZonalAllocationFailed", "", 200, CapacityUnavailable),
        ("OverconstrainedAllocationRequest", "", 200, CapacityUnavailable),
        ("OverconstrainedZonalAllocationRequest", "", 200, CapacityUnavailable),
        ("SkuNotAvailable", "", 409, CapacityUnavailable),
        ("OperationNotAllowed", "... exceeding approved standardNCASv3Family Cores quota ...", 409, QuotaExceeded),
        (
            "OperationNotAllowed",
            "the provided max price '0.01 USD' is lower than the current spot price",
            409,
            CapacityUnavailable,
        ),
        (
            "OperationNotAllowed",
            "Operation 'start' is not allowed since the VM is deallocating",
            409,
            ProviderRequestRejected,
        ),
        ("QuotaExceeded", "", 409, QuotaExceeded),
        # Compute's throttling, per Microsoft's "Troubleshooting API throttling errors": retryable, not final.
        (
            "OperationNotAllowed",
            "The server rejected the request because too many requests have been received for this subscription.",
            429,
            TransientProviderError,
        ),
        ("TooManyRequests", "", 429, TransientProviderError),
        ("SomethingNew", "", 429, TransientProviderError),
        ("SomethingNew", "", 503, TransientProviderError),
        ("AuthorizationFailed", "", 403, CredentialsRejected),
        ("InvalidAuthenticationToken", "", 401, CredentialsRejected),
        ("SubscriptionNotFound", "", 404, CredentialsRejected),
        ("SomethingNew", "", 401, CredentialsRejected),
        ("InvalidParameter", "", 400, ProviderRequestRejected),
    ],
)
def test_error_codes_are_classified(code, message, status, expected):
    error = errors.error_from_code(code, message, status)

    assert type(error) is expected
    assert (error.code, error.http_status, error.provider) == (code, status, "azure")


def test_vm_names_are_deterministic_and_valid():
    readable = launching.vm_name("ord-0123abcd-a1")
    hashed = launching.vm_name("Order_42/attempt 1".replace(" ", "-"))
    long_token = launching.vm_name("x" * 64 + "-a1")

    assert readable == "ord-0123abcd-a1"
    assert hashed == launching.vm_name("Order_42/attempt-1")
    assert hashed.startswith("vm-") and len(hashed) == 43
    assert len(long_token) <= launching.VM_NAME_MAX_LENGTH
    # A token that looks like a hashed name is hashed too, so the two can never meet.
    assert launching.vm_name(hashed) != hashed
    with pytest.raises(ProviderRequestRejected):
        launching.vm_name("")


def test_zone_names_round_trip():
    assert catalog.azure_zones("eastus", "eastus-2") == ["2"]
    assert catalog.azure_zones("westus", "westus") == []
    assert catalog.azure_zones("westus", "") == []
    with pytest.raises(ProviderRequestRejected):
        catalog.azure_zones("eastus", "us-east-1a")


def test_image_references():
    assert launching.image_reference("Canonical:ubuntu-24_04-lts:server:latest") == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    image_id = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/gpu"
    assert launching.image_reference(image_id) == {"id": image_id}
    with pytest.raises(ProviderRequestRejected):
        launching.image_reference("ubuntu")


def _spec(**overrides):
    values = {
        "region": "eastus",
        "zone": "eastus-1",
        "instance_type": "Standard_NC4as_T4_v3",
        "pricing_model": PricingModel.SPOT,
        "client_token": "ord-1-a1",
        "order_ref": "ord-1",
        "max_price": Decimal("0.07"),
        "tags": {"broker:order": "spoofed", "team": "ml"},
    }
    values.update(overrides)
    return LaunchSpec(**values)


SETTINGS = launching.LaunchSettings(subnet_id="/subscriptions/s/subnets/x", ssh_public_key="ssh-ed25519 AAAA k")


def test_vm_body_for_a_spot_launch():
    body = launching.vm_body(_spec(), "ord-1-a1", SETTINGS)

    assert body["location"] == "eastus"
    assert body["zones"] == ["1"]
    assert body["tags"] == {"broker:order": "ord-1", "broker:client-token": "ord-1-a1", "team": "ml"}
    properties = body["properties"]
    assert (properties["priority"], properties["evictionPolicy"], properties["billingProfile"]) == (
        "Spot",
        "Delete",
        {"maxPrice": 0.07},
    )
    nic = properties["networkProfile"]["networkInterfaceConfigurations"][0]
    assert properties["networkProfile"]["networkApiVersion"] == launching.NETWORK_API_VERSION
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"] == {"id": "/subscriptions/s/subnets/x"}
    assert properties["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == "ssh-ed25519 AAAA k"


def test_vm_body_on_demand_regional_without_public_ip():
    settings = launching.LaunchSettings(subnet_id="/s", ssh_public_key="k", public_ip=False)
    body = launching.vm_body(
        _spec(pricing_model=PricingModel.ON_DEMAND, region="westus", zone="westus", max_price=None), "n", settings
    )

    assert "zones" not in body
    assert "priority" not in body["properties"]
    ip_config = body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"][
        "ipConfigurations"
    ][0]["properties"]
    assert "publicIPAddressConfiguration" not in ip_config


def test_vm_body_needs_subnet_and_key_and_refuses_reserved():
    with pytest.raises(ProviderRequestRejected, match="subnet_id"):
        launching.vm_body(_spec(), "n", launching.LaunchSettings(subnet_id="", ssh_public_key="k"))
    with pytest.raises(ProviderRequestRejected, match="ssh_public_key"):
        launching.vm_body(_spec(), "n", launching.LaunchSettings(subnet_id="/s", ssh_public_key=""))
    with pytest.raises(ProviderRequestRejected, match="reserved"):
        launching.vm_body(_spec(pricing_model=PricingModel.RESERVED), "n", SETTINGS)


@pytest.mark.parametrize(
    ("provisioning", "power", "expected"),
    [
        ("Creating", "", InstanceState.PENDING),
        ("Creating", "starting", InstanceState.PENDING),
        ("Succeeded", "running", InstanceState.RUNNING),
        ("Updating", "running", InstanceState.RUNNING),
        ("Succeeded", "deallocated", InstanceState.STOPPED),
        ("Succeeded", "stopped", InstanceState.STOPPED),
        ("Deleting", "running", InstanceState.STOPPING),
        ("Failed", "", InstanceState.FAILED),
        ("Canceled", "", InstanceState.FAILED),
        ("Succeeded", "", InstanceState.UNKNOWN),
    ],
)
def test_instance_states(provisioning, power, expected):
    assert mapping.instance_state(provisioning, power) is expected


def test_a_failed_create_describes_as_failed_with_its_error():
    vm = {
        "name": "ord-1-a1",
        "location": "eastus",
        "zones": ["2"],
        "id": "/subscriptions/s/resourceGroups/broker/providers/Microsoft.Compute/virtualMachines/ord-1-a1",
        "tags": {"broker:order": "ord-1", "broker:client-token": "ord-1-a1"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
            "provisioningState": "Failed",
            "instanceView": {
                "statuses": [
                    {
                        "code": "ProvisioningState/failed/ZonalAllocationFailed",
                        "level": "Error",
                        "message": "Allocation failed.",
                    }
                ]
            },
        },
    }

    handle = mapping.instance_handle(vm, resource_group="broker")

    assert (handle.instance_id, handle.zone, handle.instance_type, handle.state) == (
        "ord-1-a1",
        "eastus-2",
        "Standard_NC4as_T4_v3",
        InstanceState.FAILED,
    )
    assert (handle.extra["error_class"], handle.extra["error_code"], handle.extra["error_message"]) == (
        "capacity",
        "ZonalAllocationFailed",
        "Allocation failed.",
    )
    assert handle.extra["client_token"] == "ord-1-a1"


def test_an_unreadable_vm_is_malformed():
    with pytest.raises(MalformedProviderResponse):
        mapping.instance_handle({"name": "x", "location": "eastus", "properties": {}}, resource_group="broker")


# ------------------------------------------------------------------------------------------------- boot


def test_image_refs_keep_a_marketplace_urn_or_a_resource_id():
    urn = launching.parse_image("microsoft-dsvm:ubuntu-hpc:2204:latest")
    managed = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/gpu"
    gallery = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/y/versions/1.0.0"

    assert (urn.marketplace, str(urn), urn.reference()["sku"]) == (
        True,
        "microsoft-dsvm:ubuntu-hpc:2204:latest",
        "2204",
    )
    assert launching.parse_image(managed).reference() == {"id": managed}
    assert launching.managed_image_parts(managed) == ("s", "g", "gpu")
    assert launching.managed_image_parts(gallery) is None


def test_an_orders_security_group_is_named_per_order_and_region():
    assert launching.nsg_name("ord-1f2e", "eastus") == "nsg-ord-1f2e-eastus"
    hashed = launching.nsg_name("ord/with spaces", "westus")
    # NSG names: letters, digits, '_', '.', '-', at most 80 (Naming rules and restrictions for Azure resources).
    assert hashed.startswith("nsg-") and hashed.endswith("-westus") and len(hashed) <= 80
    assert hashed == launching.nsg_name("ord/with spaces", "westus")
    assert len(launching.nsg_name("ord-" + "x" * 100, "southcentralus")) <= 80


def test_security_rules_are_one_inbound_allow_per_port_and_range_from_priority_100():
    from providers.launch import IngressRule

    rules = launching.security_rules(
        [IngressRule(port=22, cidrs=("203.0.113.0/24", "2001:db8::/48")), IngressRule(8000, ("10.0.0.0/8",), "udp")]
    )

    assert [(r["properties"]["priority"], r["properties"]["protocol"], r["properties"]["destinationPortRange"],
             r["properties"]["sourceAddressPrefix"]) for r in rules] == [
        (100, "Tcp", "22", "2001:db8::/48"),
        (101, "Tcp", "22", "203.0.113.0/24"),
        (102, "Udp", "8000", "10.0.0.0/8"),
    ]  # fmt: skip
    assert {(r["properties"]["direction"], r["properties"]["access"]) for r in rules} == {("Inbound", "Allow")}


def test_an_existing_group_matches_when_its_rules_and_order_tag_do():
    wanted = {"tags": {"broker:order": "ord-1"}, "properties": {"securityRules": [{"properties": {"priority": 100}}]}}
    read_back = {
        "tags": {"broker:order": "ord-1"},
        "properties": {"securityRules": [{"name": "x", "properties": {"priority": 100, "provisioningState": "S"}}]},
    }

    assert launching.nsg_matches(read_back, wanted)
    assert not launching.nsg_matches({**read_back, "tags": {}}, wanted)
    assert not launching.nsg_matches({"tags": {"broker:order": "ord-1"}, "properties": {}}, wanted)


def test_order_resources_come_from_tagged_groups_only():
    nsg = {
        "id": "/x/nsg-ord-1-eastus",
        "name": "nsg-ord-1-eastus",
        "location": "eastus",
        "tags": {"broker:order": "ord-1"},
    }

    resource = launching.order_resource(nsg)

    assert resource is not None
    assert (resource.kind, resource.resource_id, resource.region, resource.order_ref) == (
        "network_security_group",
        "/x/nsg-ord-1-eastus",
        "eastus",
        "ord-1",
    )
    assert launching.order_resource({**nsg, "tags": {}}) is None


def test_vm_body_with_a_boot_carries_custom_data_keys_disk_image_and_the_group():
    boot = launching.BootParts(
        image=launching.parse_image("microsoft-dsvm:ubuntu-hpc:2204:latest"),
        custom_data="IyEvYmluL2Jhc2gK",
        admin_username="azureuser",
        public_keys=("ssh-ed25519 AAAAkey",),
        nsg_id="/subscriptions/s/resourceGroups/broker/providers/Microsoft.Network/networkSecurityGroups/n",
        disk_gb=200,
    )

    body = launching.vm_body(_spec(), "vm", launching.LaunchSettings(subnet_id="/s", ssh_public_key=""), boot)
    properties = body["properties"]

    assert properties["osProfile"]["customData"] == "IyEvYmluL2Jhc2gK"
    assert properties["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAAkey"}
    ]
    assert properties["storageProfile"]["osDisk"]["diskSizeGB"] == 200
    assert properties["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc"
    nic = properties["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["networkSecurityGroup"] == {"id": boot.nsg_id}
