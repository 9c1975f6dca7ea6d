"""The GCP sandbox's wire format and auth, seen through raw HTTP and google-auth (not the adapter)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from google.auth import exceptions as auth_exceptions
from google.auth.transport.requests import Request as AuthRequest
from google.oauth2 import service_account

from providers.errors import CredentialsRejected
from providers.gcp.client import _translate
from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox
from sandboxes.gcp.auth import sign_jwt
from sandboxes.gcp.seed import REGION_ZONES

PROJECT = "wire-test"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[GcpSandbox]:
    sandbox = start_gcp_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(sandbox_server) -> Iterator[GcpSandbox]:
    sandbox_server.reset()
    yield sandbox_server
    sandbox_server.reset()


@pytest.fixture(scope="module")
def token(sandbox_server) -> str:
    """An access token from the sandbox's OAuth endpoint, through google-auth's JWT-bearer grant."""
    info = sandbox_server.new_service_account(f"carol@{PROJECT}.iam.gserviceaccount.com", PROJECT)
    credentials = service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])
    credentials.refresh(AuthRequest())
    assert credentials.token.startswith("ya29.sandbox-")
    return str(credentials.token)


def _get(sandbox, path, token, **params):
    return requests.get(f"{sandbox.url}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=5)


def _compute(path: str) -> str:
    return f"/compute/v1/projects/{PROJECT}/{path}"


INSTANCE = {
    "name": "gb-wire-1",
    "machineType": "zones/us-central1-a/machineTypes/n1-standard-4",
    "guestAccelerators": [
        {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
    ],
    "scheduling": {"onHostMaintenance": "TERMINATE", "provisioningModel": "STANDARD", "automaticRestart": True},
    "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": "projects/x/global/images/y"}}],
    "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
    "labels": {"broker-order": "ord-w"},
}


def _insert(sandbox, token, body=None, request_id="6f1c7a52-6a39-4f3e-9d0e-58f4a1d2c3b4"):
    return requests.post(
        f"{sandbox.url}{_compute('zones/us-central1-a/instances')}",
        params={"requestId": request_id},
        json=body or INSTANCE,
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )


def test_a_request_without_credentials_gets_googles_401(sandbox):
    response = requests.get(f"{sandbox.url}{_compute('regions/us-central1')}", timeout=5)

    error = response.json()["error"]
    assert response.status_code == 401
    assert (error["status"], error["errors"][0]["reason"]) == ("UNAUTHENTICATED", "authError")


def test_the_token_endpoint_refuses_a_bad_account_with_invalid_grant(sandbox):
    info = sandbox.new_service_account(f"bad-dave@{PROJECT}.iam.gserviceaccount.com", PROJECT)
    credentials = service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])

    with pytest.raises(auth_exceptions.RefreshError) as raised:
        credentials.refresh(AuthRequest())

    assert "invalid_grant" in str(raised.value)
    assert isinstance(_translate(raised.value), CredentialsRejected)


def test_a_tampered_jwt_for_an_issued_key_is_refused(sandbox):
    info = sandbox.new_service_account(f"erin@{PROJECT}.iam.gserviceaccount.com", PROJECT)
    now = int(time.time())
    good = sign_jwt(
        serialization.load_pem_private_key(info["private_key"].encode(), password=None),
        info["private_key_id"],
        {"iss": info["client_email"], "sub": info["client_email"], "iat": now, "exp": now + 600, "scope": SCOPE},
    )
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "iss": "mallory@x"}).encode()).rstrip(b"=").decode()

    assert _get(sandbox, _compute("regions/us-central1"), good).status_code == 200
    assert _get(sandbox, _compute("regions/us-central1"), f"{header}.{forged}.{signature}").status_code == 401


def test_aggregated_lists_page_and_name_every_zone(sandbox, token):
    first = _get(sandbox, _compute("aggregated/machineTypes"), token, maxResults=50).json()
    second = _get(sandbox, _compute("aggregated/machineTypes"), token, maxResults=50, pageToken=first["nextPageToken"])

    zones = {z for zs in REGION_ZONES.values() for z in zs}
    assert set(first["items"]) == {f"zones/{z}" for z in zones}
    assert first["kind"] == "compute#machineTypeAggregatedList"
    empty = [scoped for scoped in first["items"].values() if "warning" in scoped]
    assert empty and all(s["warning"]["code"] == "NO_RESULTS_ON_PAGE" for s in empty)
    assert sum(len(s.get("machineTypes", [])) for s in first["items"].values()) == 50
    assert second.status_code == 200
    wrong_query = _get(sandbox, _compute("aggregated/instances"), token, pageToken=first["nextPageToken"])
    assert wrong_query.status_code == 400


def test_an_unsupported_filter_is_a_400(sandbox, token):
    response = _get(sandbox, _compute("aggregated/instances"), token, filter='name = "a" OR name = "b"')

    assert response.status_code == 400
    assert response.json()["error"]["errors"][0]["reason"] == "invalid"


def test_insert_is_an_operation_that_settles_when_observed(sandbox, token):
    first = _insert(sandbox, token).json()
    again = _insert(sandbox, token).json()

    assert (first["kind"], first["status"], first["operationType"]) == ("compute#operation", "RUNNING", "insert")
    assert again["name"] == first["name"]
    instance = _compute("zones/us-central1-a/instances/gb-wire-1")
    assert _get(sandbox, instance, token).json()["status"] == "PROVISIONING"
    done = _get(sandbox, _compute(f"zones/us-central1-a/operations/{first['name']}"), token).json()
    assert done["status"] == "DONE" and "error" not in done
    assert [_get(sandbox, instance, token).json()["status"] for _ in range(3)] == ["STAGING", "RUNNING", "RUNNING"]
    assert len(sandbox.instances()) == 1


def test_operations_finish_on_their_own_after_the_settle_time(sandbox, token):
    sandbox.settle_seconds = 0.0
    try:
        _insert(sandbox, token)
        status = _get(sandbox, _compute("zones/us-central1-a/instances/gb-wire-1"), token).json()["status"]
    finally:
        sandbox.settle_seconds = 2.0

    assert status in ("STAGING", "RUNNING")


def test_a_capacity_failure_lives_on_the_operation_and_the_instance_goes(sandbox, token):
    sandbox.faults.inject("capacity", instance_type="n1-standard-4+1xT4")

    operation = _insert(sandbox, token).json()
    listed = _get(
        sandbox,
        _compute("zones/us-central1-a/operations"),
        token,
        filter=f'targetLink = "{operation["targetLink"]}"',
    ).json()["items"]

    assert [op["error"]["errors"][0]["code"] for op in listed] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert listed[0]["httpErrorStatusCode"] == 503
    assert _get(sandbox, _compute("zones/us-central1-a/instances/gb-wire-1"), token).status_code == 404


def test_a_gpu_instance_must_not_live_migrate(sandbox, token):
    body = {**INSTANCE, "scheduling": {"onHostMaintenance": "MIGRATE"}}

    response = _insert(sandbox, token, body)

    assert response.status_code == 400
    assert "live migration" in response.json()["error"]["message"]
    assert sandbox.instances() == []


def test_a_request_id_must_be_a_uuid(sandbox, token):
    assert _insert(sandbox, token, request_id="not-a-uuid").status_code == 400


def test_skus_page_with_page_size_and_carry_money(sandbox, token):
    path = "/v1/services/6F81-5844-456A/skus"
    first = _get(sandbox, path, token, pageSize=100).json()
    rest = _get(sandbox, path, token, pageSize=100, pageToken=first["nextPageToken"]).json()

    skus = first["skus"] + rest["skus"]
    assert len(skus) == 154 and rest["nextPageToken"] == ""
    t4 = next(s for s in skus if s["description"] == "Nvidia Tesla T4 GPU running in Iowa")
    assert t4["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] == {
        "currencyCode": "USD",
        "units": "0",
        "nanos": 350000000,
    }
    assert t4["category"] == {
        "serviceDisplayName": "Compute Engine",
        "resourceFamily": "Compute",
        "resourceGroup": "GPU",
        "usageType": "OnDemand",
    }
    # Spot GPU cards are "attached to Spot Preemptible VMs"; only vCPU/RAM SKUs begin with "Spot Preemptible"
    # (Cloud Billing pricing API v1beta, "REST Resource: billingAccounts.skus",
    # https://cloud.google.com/billing/docs/reference/pricing-api/rest/v1beta/billingAccounts.skus).
    spot_t4 = next(
        s for s in skus if s["description"] == "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Iowa"
    )
    assert spot_t4["category"]["usageType"] == "Preemptible"
    assert [s for s in skus if s["description"].startswith("Spot Preemptible Nvidia")] == []
    missing = _get(sandbox, "/v1/services/0000-0000-0000/skus", token)
    assert (missing.status_code, missing.json()["error"]["status"]) == (404, "NOT_FOUND")
    assert _get(sandbox, path, token, currencyCode="EUR").status_code == 400


def test_control_routes_issue_keys_and_inject_faults(sandbox, token):
    key = requests.post(f"{sandbox.url}/_sandbox/service-accounts", json={"project_id": PROJECT}, timeout=5).json()
    fault = requests.post(f"{sandbox.url}/_sandbox/faults", json={"kind": "quota"}, timeout=5)

    response = _insert(sandbox, token)

    assert key["type"] == "service_account" and key["token_uri"] == f"{sandbox.url}/token"
    assert fault.status_code == 201
    error = response.json()["error"]
    assert response.status_code == 403
    assert (error["errors"][0]["reason"], error["details"][0]["reason"]) == ("quotaExceeded", "QUOTA_EXCEEDED")


def test_reset_forgets_instances_operations_and_request_ids(sandbox, token):
    _insert(sandbox, token)

    sandbox.reset()

    assert (sandbox.instances(), sandbox.operations(), sandbox.calls()) == ([], [], [])
    assert _insert(sandbox, token).json()["status"] == "RUNNING"
