"""The lease endpoints against a hostile machine: bodies nested too deep or too large, reports out of range or
of the wrong shape, forged or replayed signatures. Each is refused with a code naming the problem, and the
lease, the order and the ledger stay as they were."""

from __future__ import annotations

import json

import pytest

from ledger.models import LedgerEntry
from marketplace.launch.leases import boot_token
from marketplace.models import Lease, LeaseHeartbeat, LeaseState, OrderState
from marketplace.orders.services import PlaceRequest, order_place
from providers.community import protocol
from tests.leases import LAUNCH, claimed_lease

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(acme, alice, aws_account, aws_sandbox, client, django_capture_on_commit_callbacks):
    """A launched order whose agent has spent its token: (lease, key id, secret)."""
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    return claimed_lease(order, client)


def _signed_post(client, path: str, body: bytes, key_id: str, secret: str, **override: str):
    headers = {**protocol.sign(key_id, secret, "POST", path, body), **override}
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, data=body, content_type="application/json", **extra)


def _ready_report(**change) -> dict:
    report = {
        "gpus": [{"index": 0, "name": "Tesla T4", "memory_gb": 15}],
        "workload": {"kind": "none", "detail": "ok"},
        "ssh": {"listening": True, "port": 22, "user": "ubuntu", "host": None},
        "host_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJ0aGlzIGlzIGEgdGVzdCBob3N0IGtleSBibG9iISE="],
    }
    report.update(change)
    return report


def test_a_body_nested_a_hundred_thousand_deep_is_refused_before_parsing(client, claimed):
    deep = b'{"boot_token": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"  # within the size bound: depth must stop it

    answer = client.post("/agent/v1/lease/claim", data=deep, content_type="application/json")

    assert answer.status_code == 400 and "nests deeper" in answer.json()["message"]


def test_a_body_larger_than_an_agent_sends_is_refused(client, claimed):
    _, key_id, secret = claimed
    huge = json.dumps({"gpus": [], "pad": "x" * 100_000}).encode()

    answer = _signed_post(client, "/agent/v1/lease/heartbeat", huge, key_id, secret)

    assert answer.status_code == 413 and answer.json()["code"] == "too_large"
    claim = client.post("/agent/v1/lease/claim", data=b"[" * 70_000, content_type="application/json")
    assert claim.status_code == 413


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": "eight"}, "gpus: expected list"),
        ({"gpus": [{"index": 0, "name": "T4", "memory_gb": 10**40}]}, "gpus.memory_gb"),
        ({"gpus": [{"index": -1, "name": "T4", "memory_gb": 16}]}, "gpus.index"),
        ({"gpus": [{"index": 0, "name": "x" * 500, "memory_gb": 16}]}, "gpus: objects"),
        ({"ssh": {"listening": True, "port": 70000, "user": "ubuntu"}}, "ssh.port"),
        ({"ssh": {"listening": True, "port": 22, "user": "root; rm -rf /"}}, "ssh.user"),
        ({"ssh": {"listening": True, "port": 22, "user": "ubuntu", "host": "evil host/"}}, "ssh.host"),
        ({"ssh": {"listening": False, "port": 22, "user": "ubuntu"}}, "ssh.listening"),
        ({"host_keys": ["ssh-ed25519 not-base64!"]}, "host_keys"),
        ({"host_keys": []}, "host_keys"),
        ({"ports": [{"port": 8000, "host_port": "eighty"}]}, "ports.host_port"),
    ],
)
def test_a_malformed_ready_report_is_refused_naming_the_field_and_changes_nothing(client, claimed, change, message):
    lease, key_id, secret = claimed
    entries = LedgerEntry.objects.count()

    answer = _signed_post(client, "/agent/v1/lease/ready", json.dumps(_ready_report(**change)).encode(), key_id, secret)

    assert answer.status_code == 400 and message in answer.json()["message"]
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.CLAIMED
    assert lease.order.state == OrderState.PROVISIONING
    assert LedgerEntry.objects.count() == entries


@pytest.mark.parametrize(
    "sample",
    [
        {"index": 0, "utilization_pct": -500, "temperature_c": 50, "power_w": 60, "memory_used_gb": 1},
        {"index": 0, "utilization_pct": 50, "temperature_c": 9999, "power_w": 60, "memory_used_gb": 1},
        {"index": 0, "utilization_pct": "lots", "temperature_c": 50, "power_w": 60, "memory_used_gb": 1},
        {"index": 0, "utilization_pct": 50, "temperature_c": 50, "power_w": 1e308, "memory_used_gb": 1},
    ],
)
def test_telemetry_no_gpu_can_show_is_refused_and_not_kept(client, claimed, sample):
    lease, key_id, secret = claimed
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.READY)

    answer = _signed_post(client, "/agent/v1/lease/heartbeat", json.dumps({"gpus": [sample]}).encode(), key_id, secret)

    assert answer.status_code == 400
    assert not LeaseHeartbeat.objects.exists()


def test_forged_stale_and_replayed_calls_are_refused(client, claimed):
    _, key_id, secret = claimed
    body = json.dumps({}).encode()
    forged = _signed_post(client, "/agent/v1/lease/secrets", body, key_id, "not-the-secret")
    stale = _signed_post(client, "/agent/v1/lease/secrets", body, key_id, secret,
                         **{protocol.HEADER_TIMESTAMP: "1000"})  # fmt: skip
    headers = protocol.sign(key_id, secret, "POST", "/agent/v1/lease/secrets", body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    first = client.post("/agent/v1/lease/secrets", data=body, content_type="application/json", **extra)
    replay = client.post("/agent/v1/lease/secrets", data=body, content_type="application/json", **extra)

    assert (forged.status_code, forged.json()["code"]) == (401, "bad_signature")
    assert (stale.status_code, stale.json()["code"]) == (401, "bad_signature")
    assert first.status_code == 200
    assert (replay.status_code, replay.json()["code"]) == (401, "replayed")


def test_a_token_that_is_not_one_is_refused_without_a_lookup(client, claimed):
    for token in (None, 12, "x" * 10_000, "bt_unknown", {"$ne": ""}):
        answer = client.post("/agent/v1/lease/claim", {"boot_token": token}, content_type="application/json")
        assert answer.status_code == 401 and answer.json()["code"] == "bad_token"


@pytest.fixture
def waiting(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    """A launched order whose agent has not phoned home: (lease, its boot token)."""
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    lease = Lease.objects.get(order=order)
    return lease, boot_token(lease.attempt.client_token)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"boot_token": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", 400, "invalid"),
        (json.dumps({"reason": "no_python", "pad": "x" * 100_000}).encode(), 413, "too_large"),
        (b"[]", 400, "invalid"),
        (json.dumps({"reason": "no_python", "version": "", "note": "free text"}).encode(), 400, "invalid"),
        (json.dumps({"reason": "<script>alert(1)</script>", "version": "3.8"}).encode(), 400, "invalid"),
        (json.dumps({"reason": "python_too_old", "version": "3.8; rm -rf /"}).encode(), 400, "invalid"),
        (json.dumps({"reason": "python_too_old", "version": ["3.8"]}).encode(), 400, "invalid"),
        (json.dumps({"reason": "no_python", "version": "", "boot_token": "bt_unknown"}).encode(), 401, "bad_token"),
        (json.dumps({"reason": "no_python", "version": "", "boot_token": {"$ne": ""}}).encode(), 401, "bad_token"),
    ],
)
def test_a_boot_failure_report_holds_a_reason_code_and_a_version_and_nothing_else(client, waiting, body, status, code):
    lease, token = waiting
    if b'"reason"' in body and b"boot_token" not in body:
        body = json.dumps({**json.loads(body), "boot_token": token}).encode()
    entries = LedgerEntry.objects.count()

    answer = client.post("/agent/v1/lease/boot-failed", data=body, content_type="application/json")

    assert (answer.status_code, answer.json()["code"]) == (status, code), answer.json()
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.WAITING  # the token is still unspent
    assert LedgerEntry.objects.count() == entries


def test_a_boot_failure_report_with_a_spent_token_is_refused(client, claimed):
    lease, _, _ = claimed
    token = boot_token(lease.attempt.client_token)
    answer = client.post("/agent/v1/lease/boot-failed", {"boot_token": token, "reason": "no_python"},
                         content_type="application/json")  # fmt: skip

    assert (answer.status_code, answer.json()["code"]) == (401, "spent")
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.CLAIMED
