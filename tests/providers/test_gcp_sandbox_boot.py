"""The GCP sandbox's images, firewall rules, boot disks and metadata checks, seen through raw HTTP in Compute
Engine's wire format (camelCase JSON, Google error bodies), not through the adapter.

References: Metadata and Tags, https://cloud.google.com/compute/docs/reference/rest/v1/instances; Firewall,
https://cloud.google.com/compute/docs/reference/rest/v1/firewalls; imageFamilyViews.get ("the latest image that is
part of an image family, is not deprecated and is rolled out in the specified zone"),
https://cloud.google.com/compute/docs/reference/rest/v1/imageFamilyViews/get.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.auth.transport.requests import Request as AuthRequest
from google.oauth2 import service_account

from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox

PROJECT = "wire-boot"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DLVM = "projects/deeplearning-platform-release"


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
    info = sandbox_server.new_service_account(f"carol@{PROJECT}.iam.gserviceaccount.com", PROJECT)
    credentials = service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])
    credentials.refresh(AuthRequest())
    return str(credentials.token)


def _call(sandbox, token, method: str, path: str, body: Any = None, **params: str) -> requests.Response:
    return requests.request(
        method,
        f"{sandbox.url}/compute/v1/{path}",
        params=params,
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )


def _error(response: requests.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["errors"][0]["reason"]


def _firewall(**changes: Any) -> dict[str, Any]:
    return {
        "name": "gbfw-ord-w1-1a2b3c4d",
        "description": "gpu-broker: the buyer's addresses into the machines of broker-order=ord-w1",
        "network": "global/networks/default",
        "direction": "INGRESS",
        "priority": 1000,
        "sourceRanges": ["198.51.100.0/24"],
        "targetTags": ["gb-ord-w1"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22", "8000-8001"]}],
        **changes,
    }


def _instance(**changes: Any) -> dict[str, Any]:
    return {
        "name": "gb-wire-boot-1",
        "machineType": "zones/us-central1-a/machineTypes/n1-standard-4",
        "guestAccelerators": [
            {"acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
        ],
        "scheduling": {"onHostMaintenance": "TERMINATE", "provisioningModel": "STANDARD", "automaticRestart": True},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {"sourceImage": f"{DLVM}/global/images/family/common-cu129-ubuntu-2204-nvidia-580"},
            }
        ],
        "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
        "tags": {"items": ["gb-ord-w1"]},
        **changes,
    }


def _insert_instance(sandbox, token, body: dict[str, Any]) -> requests.Response:
    return _call(sandbox, token, "POST", f"projects/{PROJECT}/zones/us-central1-a/instances", body)


# -------------------------------------------------------------------------------------------------- images


def test_a_family_view_answers_the_newest_image_rolled_out_in_the_zone(sandbox, token):
    sandbox.add_image("alice-images", "cuda-v1", family="cuda")
    newest = sandbox.add_image("alice-images", "cuda-v2", family="cuda", zones=["us-central1-a"])

    here = _call(sandbox, token, "GET", "projects/alice-images/zones/us-central1-a/imageFamilyViews/cuda").json()
    there = _call(sandbox, token, "GET", "projects/alice-images/zones/europe-west4-a/imageFamilyViews/cuda").json()

    assert here == {"image": newest}
    assert there["image"]["name"] == "cuda-v1"
    assert (here["image"]["status"], here["image"]["diskSizeGb"]) == ("READY", "10")


def test_missing_images_and_families_are_googles_404(sandbox, token):
    view = _call(sandbox, token, "GET", f"{DLVM}/zones/us-central1-a/imageFamilyViews/no-such-family")
    family = _call(sandbox, token, "GET", f"{DLVM}/global/images/family/no-such-family")
    image = _call(sandbox, token, "GET", f"{DLVM}/global/images/no-such-image")

    assert _error(view) == _error(family) == _error(image) == (404, "notFound")
    assert "was not found" in image.json()["error"]["message"]


def test_an_image_missing_fault_hides_the_family_in_its_region_only(sandbox, token):
    sandbox.faults.inject("image_missing", region="us-central1")
    path = "zones/{}/imageFamilyViews/common-cu129-ubuntu-2204-nvidia-580"

    missing = _call(sandbox, token, "GET", f"{DLVM}/{path.format('us-central1-b')}")
    found = _call(sandbox, token, "GET", f"{DLVM}/{path.format('europe-west4-a')}")

    assert _error(missing) == (404, "notFound")
    assert found.json()["image"]["family"] == "common-cu129-ubuntu-2204-nvidia-580"


# ------------------------------------------------------------------------------------------------ firewalls


def test_a_firewall_rule_exists_once_its_global_operation_is_done(sandbox, token):
    operation = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall()).json()
    before = _call(sandbox, token, "GET", f"projects/{PROJECT}/global/firewalls/gbfw-ord-w1-1a2b3c4d")
    done = _call(sandbox, token, "GET", f"projects/{PROJECT}/global/operations/{operation['name']}").json()
    rule = _call(sandbox, token, "GET", f"projects/{PROJECT}/global/firewalls/gbfw-ord-w1-1a2b3c4d").json()

    assert (operation["status"], operation["operationType"]) == ("RUNNING", "insert")
    assert operation["targetLink"].endswith(f"/projects/{PROJECT}/global/firewalls/gbfw-ord-w1-1a2b3c4d")
    assert before.status_code == 404
    assert done["status"] == "DONE"
    assert rule["kind"] == "compute#firewall"
    assert rule["network"] == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks/default"
    assert (rule["sourceRanges"], rule["targetTags"], rule["allowed"]) == (
        ["198.51.100.0/24"],
        ["gb-ord-w1"],
        [{"IPProtocol": "tcp", "ports": ["22", "8000-8001"]}],
    )


def test_a_second_rule_of_the_same_name_is_already_exists(sandbox, token):
    pending = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall())
    while_pending = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall())
    _call(sandbox, token, "GET", f"projects/{PROJECT}/global/operations/{pending.json()['name']}")
    once_done = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall())

    assert _error(while_pending) == _error(once_done) == (409, "alreadyExists")


def test_a_repeated_request_id_answers_the_first_operation(sandbox, token):
    request_id = "0b6d7c1e-7a0b-4c53-9b46-5a1f0e2d3c4b"
    first = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall(), requestId=request_id)
    again = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall(), requestId=request_id)

    assert first.json()["name"] == again.json()["name"]
    assert len(sandbox.calls("compute.firewalls.insert")) == 2


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "GBFW-Upper"},  # RFC 1035: lower case
        {"name": "g" * 64},  # 1-63 characters
        {"sourceRanges": ["198.51.100.0/24", "2001:db8::/48"]},  # IPv4 or IPv6 ranges, not both
        {"sourceRanges": ["not-a-range"]},
        {"denied": [{"IPProtocol": "all"}]},  # exactly one of allowed and denied
        {"allowed": [{"IPProtocol": "icmp", "ports": ["22"]}]},  # ports only for tcp, udp and sctp
        {"allowed": [{"IPProtocol": "tcp", "ports": ["70000"]}]},
        {"targetTags": ["Not_A_Tag"]},
    ],
)
def test_a_firewall_rule_gcp_would_refuse_is_a_400(sandbox, token, changes):
    response = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall(**changes))

    assert _error(response) == (400, "invalid")
    assert sandbox.firewall_rules() == []


def test_firewalls_list_by_name_pattern_and_delete(sandbox, token):
    for name in ("gbfw-ord-w1-1a2b3c4d", "default-allow-ssh"):
        operation = _call(sandbox, token, "POST", f"projects/{PROJECT}/global/firewalls", _firewall(name=name))
        _call(sandbox, token, "POST", f"projects/{PROJECT}/global/operations/{operation.json()['name']}/wait")

    listed = _call(sandbox, token, "GET", f"projects/{PROJECT}/global/firewalls", filter='name eq "gbfw-.*"').json()
    deleting = _call(sandbox, token, "DELETE", f"projects/{PROJECT}/global/firewalls/gbfw-ord-w1-1a2b3c4d").json()
    _call(sandbox, token, "GET", f"projects/{PROJECT}/global/operations/{deleting['name']}")
    gone = _call(sandbox, token, "DELETE", f"projects/{PROJECT}/global/firewalls/gbfw-ord-w1-1a2b3c4d")

    assert [rule["name"] for rule in listed["items"]] == ["gbfw-ord-w1-1a2b3c4d"]
    assert deleting["operationType"] == "delete"
    assert _error(gone) == (404, "notFound")
    assert [rule["name"] for rule in sandbox.firewall_rules()] == ["default-allow-ssh"]


# ----------------------------------------------------------------------------------------------- instances


def test_an_insert_creates_a_boot_disk_from_the_familys_newest_image(sandbox, token):
    body = _instance()
    body["disks"][0]["initializeParams"]["diskSizeGb"] = "120"

    assert _insert_instance(sandbox, token, body).status_code == 200
    disk = _call(sandbox, token, "GET", f"projects/{PROJECT}/zones/us-central1-a/disks/gb-wire-boot-1").json()
    instance = _call(sandbox, token, "GET", f"projects/{PROJECT}/zones/us-central1-a/instances/gb-wire-boot-1").json()

    assert disk["sizeGb"] == "120"
    assert disk["sourceImage"].endswith(f"{DLVM}/global/images/common-cu129-ubuntu-2204-nvidia-580-v20260416")
    assert instance["tags"]["items"] == ["gb-ord-w1"]
    assert instance["disks"][0]["diskSizeGb"] == "120"


@pytest.mark.parametrize(
    ("disk_gb", "image"),
    [
        ("9", "family/common-cu129-ubuntu-2204-nvidia-580"),  # at least 10 GB
        ("65537", "family/common-cu129-ubuntu-2204-nvidia-580"),  # a persistent disk holds at most 64 TB
        ("20", "family/common-cu129-ubuntu-2204-nvidia-580"),  # never below the image (the sandbox's 50 GB)
    ],
)
def test_a_boot_disk_gcp_would_refuse_is_a_400(sandbox, token, disk_gb, image):
    body = _instance()
    body["disks"][0]["initializeParams"] = {"sourceImage": f"{DLVM}/global/images/{image}", "diskSizeGb": disk_gb}

    assert _error(_insert_instance(sandbox, token, body)) == (400, "invalid")
    assert sandbox.instances() == []


def test_an_insert_from_a_public_image_that_does_not_exist_is_a_404(sandbox, token):
    body = _instance()
    body["disks"][0]["initializeParams"] = {"sourceImage": f"{DLVM}/global/images/family/no-such-family"}

    assert _error(_insert_instance(sandbox, token, body)) == (404, "notFound")


@pytest.mark.parametrize(
    "items",
    [
        [{"key": "startup-script", "value": "x" * 262145}],  # a value is at most 262144 bytes
        [{"key": f"k{i}", "value": "x" * 200_000} for i in range(3)],  # all keys and values under 512 KB
        [{"key": "bad key", "value": "x"}],  # keys match [a-zA-Z0-9-_]+
        [{"key": "k" * 128, "value": "x"}],  # and are under 128 bytes
    ],
)
def test_metadata_gcp_would_refuse_is_a_400(sandbox, token, items):
    response = _insert_instance(sandbox, token, _instance(metadata={"items": items}))

    assert _error(response) == (400, "invalid")
    assert sandbox.instances() == []


def test_a_network_tag_that_is_not_rfc1035_is_a_400(sandbox, token):
    response = _insert_instance(sandbox, token, _instance(tags={"items": ["Gb_Order"]}))

    assert _error(response) == (400, "invalid")
