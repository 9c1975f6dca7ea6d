"""The Azure sandbox on the wire: TLS, Entra ID's token endpoint, ARM's answers and the Retail Prices API."""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from sandboxes.azure.app import AzureSandbox
from tests.sshkeys import ed25519_public

SUB = "00000000-0000-0000-0000-0000000005b0"
VMS = f"/subscriptions/{SUB}/resourceGroups/broker/providers/Microsoft.Compute/virtualMachines"
API = {"api-version": "2024-07-01"}
IMAGE = {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}
KEYS_PATH = "/home/azureuser/.ssh/authorized_keys"


@pytest.fixture
def sandbox(azure_server) -> AzureSandbox:
    azure_server.reset()
    yield azure_server
    azure_server.reset()


@pytest.fixture
def http(sandbox):
    with requests.Session() as session:
        session.verify = str(sandbox.cert_path)
        session.trust_env = False  # else REQUESTS_CA_BUNDLE from the environment overrides the session's CA
        yield session


def _token(http, sandbox, client_id, secret):
    return http.post(
        f"{sandbox.url}/tenant-1/oauth2/v2.0/token",
        data={
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": secret,
            "scope": "https://management.azure.com/.default",
        },
        timeout=5,
    )


@pytest.fixture
def arm(http, sandbox):
    token = _token(http, sandbox, "alice-app", "s").json()["access_token"]
    http.headers["Authorization"] = f"Bearer {token}"
    return http


def _vm_body(**overrides):
    body = {
        "location": "eastus",
        "zones": ["1"],
        "tags": {"broker:order": "ord-1"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
            "storageProfile": {"imageReference": IMAGE},
            "osProfile": {
                "computerName": "vm1",
                "adminUsername": "azureuser",
                "linuxConfiguration": {"ssh": {"publicKeys": [{"path": KEYS_PATH, "keyData": ed25519_public()}]}},
            },
            "networkProfile": {
                "networkApiVersion": "2024-05-01",
                "networkInterfaceConfigurations": [
                    {
                        "name": "nic",
                        "properties": {"ipConfigurations": [{"name": "ip", "properties": {"subnet": {"id": "/s"}}}]},
                    }
                ],
            },
        },
    }
    body.update(overrides)
    return body


def test_the_server_certificate_verifies_against_the_sandbox_ca(sandbox):
    context = ssl.create_default_context(cafile=str(sandbox.cert_path))

    assert sandbox.url.startswith("https://127.0.0.1:")
    with requests.get(f"{sandbox.url}/_sandbox/health", verify=str(sandbox.cert_path), timeout=5) as response:
        assert response.json() == {"sandbox": "azure", "status": "ok"}
    assert context.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{sandbox.url}/_sandbox/health", verify=True, timeout=5)


def test_the_ca_is_served_for_processes_that_did_not_start_the_sandbox(http, sandbox):
    assert http.get(f"{sandbox.url}/_sandbox/ca.pem", timeout=5).content == sandbox.cert_path.read_bytes()


def test_token_endpoint_issues_bearer_tokens(http, sandbox):
    body = _token(http, sandbox, "alice-app", "s").json()

    assert (body["token_type"], body["expires_in"]) == ("Bearer", 3600)
    assert body["access_token"].startswith("sbx1.")


@pytest.mark.parametrize(
    ("client_id", "secret", "status", "error", "code"),
    [
        ("bad-app", "s", 400, "unauthorized_client", 700016),
        ("alice-app", "", 401, "invalid_client", 7000215),
    ],
)
def test_token_endpoint_refusals_have_entra_ids_shape(http, sandbox, client_id, secret, status, error, code):
    response = _token(http, sandbox, client_id, secret)

    body = response.json()
    assert response.status_code == status
    assert (body["error"], body["error_codes"]) == (error, [code])
    assert body["error_description"].startswith(f"AADSTS{code}: ")


def test_arm_requires_a_token_it_issued(http, sandbox):
    missing = http.get(f"{sandbox.url}{VMS}", params=API, timeout=5)
    forged = http.get(f"{sandbox.url}{VMS}", params=API, headers={"Authorization": "Bearer sbx1.e30.AAAA"}, timeout=5)

    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "AuthenticationFailed")
    assert (forged.status_code, forged.json()["error"]["code"]) == (401, "InvalidAuthenticationToken")


def test_arm_requires_an_api_version(arm, sandbox):
    response = arm.get(f"{sandbox.url}{VMS}", timeout=5)

    assert (response.status_code, response.json()["error"]["code"]) == (400, "MissingApiVersionParameter")


def test_skus_are_filtered_by_location_with_restrictions(arm, sandbox):
    skus = arm.get(
        f"{sandbox.url}/subscriptions/{SUB}/providers/Microsoft.Compute/skus",
        params={**API, "$filter": "location eq 'eastus'"},
        timeout=5,
    ).json()["value"]

    by_name = {s["name"]: s for s in skus if s["resourceType"] == "virtualMachines"}
    assert {loc for s in skus for loc in s["locations"]} == {"eastus"}
    assert {"Standard_NC4as_T4_v3", "Standard_D4s_v5"} <= set(by_name)
    assert by_name["Standard_NC24rs_v3"]["restrictions"][0]["reasonCode"] == "NotAvailableForSubscription"
    assert by_name["Standard_ND96isr_H100_v5"]["restrictions"][0]["restrictionInfo"]["zones"] == ["3"]
    assert {c["name"]: c["value"] for c in by_name["Standard_ND96isr_H100_v5"]["capabilities"]}["GPUs"] == "8"


def test_a_create_is_a_long_running_operation_polled_back_here(arm, sandbox):
    sandbox.create_seconds = 0

    created = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm_body(), timeout=5)
    operation = arm.get(created.headers["Azure-AsyncOperation"], timeout=5).json()
    vm = arm.get(f"{sandbox.url}{VMS}/vm1", params={**API, "$expand": "instanceView"}, timeout=5).json()

    assert created.status_code == 201
    assert created.json()["properties"]["provisioningState"] == "Creating"
    assert urlparse(created.headers["Azure-AsyncOperation"]).netloc == urlparse(sandbox.url).netloc
    assert operation["status"] == "Succeeded"
    assert [s["code"] for s in vm["properties"]["instanceView"]["statuses"]] == [
        "ProvisioningState/succeeded",
        "PowerState/running",
    ]


def test_if_none_match_refuses_a_second_create_and_leaves_the_vm_alone(arm, sandbox):
    arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm_body(), timeout=5)

    again = arm.put(
        f"{sandbox.url}{VMS}/vm1",
        params=API,
        json=_vm_body(tags={"other": "tags"}),
        headers={"If-None-Match": "*"},
        timeout=5,
    )

    assert (again.status_code, again.json()["error"]["code"]) == (412, "PreconditionFailed")
    assert [v.tags for v in sandbox.instances()] == [{"broker:order": "ord-1"}]


def test_a_capacity_fault_fails_the_operation_with_status_200(arm, sandbox):
    sandbox.create_seconds = 0
    sandbox.faults.inject("capacity", instance_type="Standard_NC4as_T4_v3", zone="eastus-1")

    created = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm_body(), timeout=5)
    operation = arm.get(created.headers["Azure-AsyncOperation"], timeout=5)
    vm = arm.get(f"{sandbox.url}{VMS}/vm1", params={**API, "$expand": "instanceView"}, timeout=5).json()

    assert (operation.status_code, operation.json()["status"]) == (200, "Failed")
    assert operation.json()["error"]["code"] == "ZonalAllocationFailed"
    assert vm["properties"]["provisioningState"] == "Failed"
    assert vm["properties"]["instanceView"]["statuses"][0]["code"] == "ProvisioningState/failed/ZonalAllocationFailed"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (_vm_body(location="westus"), 400, "InvalidParameter"),  # zones in a region without zones
        (
            _vm_body(
                zones=["3"],
                properties={**_vm_body()["properties"], "hardwareProfile": {"vmSize": "Standard_ND96isr_H100_v5"}},
            ),
            409,
            "SkuNotAvailable",
        ),
        (
            _vm_body(properties={**_vm_body()["properties"], "osProfile": {"computerName": "c", "adminUsername": "u"}}),
            400,
            "InvalidParameter",
        ),
        (_vm_body(properties={**_vm_body()["properties"], "networkProfile": {}}), 400, "InvalidParameter"),
        (
            _vm_body(
                properties={
                    **_vm_body()["properties"],
                    "priority": "Spot",
                    "evictionPolicy": "Delete",
                    "billingProfile": {"maxPrice": 0.001},
                }
            ),
            409,
            "OperationNotAllowed",
        ),
    ],
)
def test_arm_validates_a_create_synchronously(arm, sandbox, body, status, code):
    response = arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=body, timeout=5)

    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert sandbox.instances() == []


def test_deleting_a_missing_vm_is_204(arm, sandbox):
    assert arm.delete(f"{sandbox.url}{VMS}/nothing", params=API, timeout=5).status_code == 204


def test_a_throttle_answers_429_with_retry_after(arm, sandbox):
    sandbox.faults.inject("throttle", action="VirtualMachines_List", times=1)

    throttled = arm.get(f"{sandbox.url}{VMS}", params=API, timeout=5)

    assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "1")
    # Microsoft, "Troubleshooting API throttling errors" (Azure Virtual Machines troubleshooting): Compute answers
    # 429 with code OperationNotAllowed, a too-many-requests message and the operation group in details.
    error = throttled.json()["error"]
    assert error["code"] == "OperationNotAllowed" and "too many requests" in error["message"]
    assert [d["code"] for d in error["details"]] == ["TooManyRequests"]
    assert arm.get(f"{sandbox.url}{VMS}", params=API, timeout=5).json() == {"value": []}


def test_retail_prices_filter_and_page_back_here(http, sandbox):
    sandbox.price_page_size = 3
    odata = "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq 'Standard_NC4as_T4_v3'"

    first = http.get(f"{sandbox.url}/api/retail/prices", params={"$filter": odata}, timeout=5).json()
    second = http.get(first["NextPageLink"], timeout=5).json()
    third = http.get(second["NextPageLink"], timeout=5).json()

    items = first["Items"] + second["Items"] + third["Items"]
    assert third["NextPageLink"] is None
    assert urlparse(first["NextPageLink"]).netloc == urlparse(sandbox.url).netloc
    assert parse_qs(urlparse(first["NextPageLink"]).query)["$filter"] == [odata]
    assert {(i["skuName"], i["type"], "Windows" in i["productName"]) for i in items} == {
        ("NC4as T4 v3", "Consumption", False),
        ("NC4as T4 v3", "DevTestConsumption", False),
        ("NC4as T4 v3", "Consumption", True),
        ("NC4as T4 v3", "Reservation", False),
        ("NC4as T4 v3 Spot", "Consumption", False),
        ("NC4as T4 v3 Low Priority", "Consumption", False),
        ("NC4as T4 v3 Spot", "Consumption", True),
    }


def test_retail_prices_refuse_an_unknown_filter(http, sandbox):
    response = http.get(f"{sandbox.url}/api/retail/prices", params={"$filter": "color eq 'red'"}, timeout=5)

    assert response.status_code == 400


def test_reset_forgets_vms_faults_and_calls(arm, sandbox):
    arm.put(f"{sandbox.url}{VMS}/vm1", params=API, json=_vm_body(), timeout=5)
    sandbox.faults.inject("quota")

    sandbox.reset()

    assert (sandbox.instances(), sandbox.faults.active(), sandbox.calls()) == ([], [], [])
