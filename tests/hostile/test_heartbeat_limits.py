"""A machine's key, free right after signup, cannot fill the broker's disk with heartbeats (issue 17, item 7):
bodies are bounded, the rate per machine is limited, a heartbeat keeps only its samples, and a machine that
is not verified keeps only a few recent heartbeats."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from django.utils import timezone

from providers.community import protocol
from providers.community.services import (
    UNVERIFIED_HEARTBEATS_KEPT,
    machine_heartbeat,
    machine_list,
    machines_withdraw_silent,
)
from providers.models import AgentNonce, Machine, MachineHeartbeat, MachineState
from tests.hosts import LISTING

pytestmark = pytest.mark.django_db

SAMPLE = {"index": 0, "utilization_pct": 50, "temperature_c": 60, "power_w": 300, "memory_used_gb": 10}


@pytest.fixture
def listed(fleet):
    return machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))


def _beat(client, listed, payload: dict):
    body = json.dumps(payload).encode()
    headers = protocol.sign(listed.machine.key_id, listed.secret, "POST", "/agent/v1/heartbeat", body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post("/agent/v1/heartbeat", data=body, content_type="application/json", **extra)


def test_a_heartbeat_larger_than_any_agent_sends_is_refused_unread(client, listed):
    answer = _beat(client, listed, {"gpus": [{**SAMPLE, "pad": "x" * 20_000}], "instances": 0})

    assert (answer.status_code, answer.json()["code"]) == (413, "too_large")
    assert not MachineHeartbeat.objects.exists()


def test_heartbeats_beyond_the_rate_are_refused_and_not_kept(client, listed, settings):
    settings.AGENT_HEARTBEATS_PER_MINUTE = 5

    answers = [_beat(client, listed, {"gpus": [SAMPLE], "instances": 0}).status_code for _ in range(7)]

    assert answers == [200] * 5 + [429] * 2
    refused = _beat(client, listed, {"gpus": [SAMPLE], "instances": 0}).json()
    assert refused["code"] == "too_many_heartbeats" and "at most 5 heartbeats a minute" in refused["message"]
    assert MachineHeartbeat.objects.count() == 5


def test_the_rate_window_moves_on(listed, settings):
    settings.AGENT_HEARTBEATS_PER_MINUTE = 2
    start = timezone.now()
    machine_heartbeat(machine=listed.machine, gpus=[SAMPLE], instances=0, now=start)
    machine_heartbeat(machine=listed.machine, gpus=[SAMPLE], instances=0, now=start + dt.timedelta(seconds=1))

    later = start + dt.timedelta(seconds=61)
    machine_heartbeat(machine=listed.machine, gpus=[SAMPLE], instances=0, now=later)

    assert MachineHeartbeat.objects.count() == 3


def test_a_heartbeat_keeps_only_a_bounded_list_of_samples(client, listed):
    too_many = _beat(client, listed, {"gpus": [SAMPLE] * 65, "instances": 0})
    extra = _beat(client, listed, {"gpus": [{**SAMPLE, "note": "x" * 1000, "nested": {"a": [1]}}], "instances": 0})

    assert too_many.status_code == 400 and "gpus: a list of at most 64" in too_many.json()["message"]
    assert extra.status_code == 200
    assert MachineHeartbeat.objects.get().gpus == [SAMPLE]


def test_a_machine_not_verified_keeps_only_its_latest_heartbeats(listed):
    start = timezone.now()
    for beat in range(UNVERIFIED_HEARTBEATS_KEPT + 10):
        machine_heartbeat(
            machine=listed.machine, gpus=[SAMPLE], instances=0, now=start + dt.timedelta(seconds=15 * beat)
        )

    kept = list(MachineHeartbeat.objects.order_by("at").values_list("at", flat=True))
    assert len(kept) == UNVERIFIED_HEARTBEATS_KEPT
    assert kept[0] == start + dt.timedelta(seconds=15 * 10)


def test_heartbeats_of_machines_not_verified_are_purged_within_the_hour(fleet, listed):
    verified = machine_list(account=fleet, name="fra-h100-2", listing=dict(LISTING)).machine
    Machine.objects.filter(pk=verified.pk).update(state=MachineState.VERIFIED)
    verified.refresh_from_db()
    now = timezone.now()
    machine_heartbeat(machine=listed.machine, gpus=[SAMPLE], instances=0, now=now)
    machine_heartbeat(machine=verified, gpus=[SAMPLE], instances=0, now=now)

    machines_withdraw_silent(now=now + dt.timedelta(minutes=30))
    assert MachineHeartbeat.objects.count() == 2
    machines_withdraw_silent(now=now + dt.timedelta(minutes=61))

    assert list(MachineHeartbeat.objects.values_list("machine__name", flat=True)) == ["fra-h100-2"]


def _forged_headers(kind: int, listed, other, body: bytes) -> dict[str, str]:
    """One of four forgeries, each with a fresh nonce: an unknown key, a wrong signature, another machine's
    secret, and a true signature on a timestamp outside the window."""
    target = "/agent/v1/heartbeat"
    if kind == 0:
        return protocol.sign("mk_" + "0" * 16, listed.secret, "POST", target, body)
    if kind == 1:
        return {**protocol.sign(listed.machine.key_id, listed.secret, "POST", target, body),
                protocol.HEADER_SIGNATURE: "0" * 64}  # fmt: skip
    if kind == 2:
        return protocol.sign(listed.machine.key_id, other.secret, "POST", target, body)
    return protocol.sign(listed.machine.key_id, listed.secret, "POST", target, body,
                         now=time.time() - 2 * protocol.MAX_SKEW_S)  # fmt: skip


def test_forged_agent_requests_store_no_nonce(client, fleet, listed):
    other = machine_list(account=fleet, name="fra-h100-2", listing=dict(LISTING))
    body = json.dumps({"gpus": [SAMPLE], "instances": 0}).encode()
    assert _beat(client, listed, {"gpus": [SAMPLE], "instances": 0}).status_code == 200
    before = list(AgentNonce.objects.values_list("key_id", "nonce"))

    codes = set()
    for number in range(100):
        headers = _forged_headers(number % 4, listed, other, body)
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
        answer = client.post("/agent/v1/heartbeat", data=body, content_type="application/json", **extra)
        assert answer.status_code == 401, answer.content
        codes.add(answer.json()["code"])

    assert codes == {"unknown_key", "bad_signature", "stale"}
    assert list(AgentNonce.objects.values_list("key_id", "nonce")) == before
    assert MachineHeartbeat.objects.count() == 1
