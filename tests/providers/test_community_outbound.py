"""Hosts behind NAT: an outbound-only host agent (no public URL) polls the broker's command queue for the same
signed launch, describe and terminate requests, answers each, and refuses forged, replayed and expired ones;
the adapter keeps its synchronous contract over the queue, and a machine with a public URL still gets HTTP."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import urllib.error
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from providers.community import protocol
from providers.community.agent import Agent
from providers.community.agent import main as agent_main
from providers.community.commands import command_enqueue
from providers.community.host_gpus import parse_simulated
from providers.community.services import machine_list
from providers.errors import CapacityUnavailable
from providers.models import AgentCommand, AgentCommandState, Machine, MachineState
from providers.services import adapter_for_account
from providers.types import InstanceState, LaunchSpec, PricingModel
from tests.hosts import LISTING, start_hosts, stop_hosts
from tests.leases import ClientTransport


def _spec(zone: str, token: str) -> LaunchSpec:
    return LaunchSpec(region="eu-de", zone=zone, instance_type="community-8xH100-SXM5",
                      pricing_model=PricingModel.ON_DEMAND, client_token=token, order_ref="ord-n")  # fmt: skip


_STARTED: list[Agent] = []


@pytest.fixture(autouse=True)
def _stop_agents():
    yield
    while _STARTED:
        _STARTED.pop().stop()  # removes each simulated host's directory


def _outbound_agent(fleet, name: str = "nat-h100-1", **options) -> tuple[Agent, Machine]:
    """A listed machine whose simulated agent has no public URL, registered (with an empty URL) through the
    broker's real endpoint and verified."""
    listed = machine_list(account=fleet, name=name, listing=dict(LISTING))
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                  simulated=parse_simulated("H100:80x8"), launch_seconds=0, lease_threads=False,
                  broker_transport=ClientTransport(Client()), **options)  # fmt: skip
    _STARTED.append(agent)
    answer = agent.register()
    assert answer["machine"] == name
    Machine.objects.filter(pk=listed.machine.pk).update(state=MachineState.VERIFIED)
    return agent, Machine.objects.get(pk=listed.machine.pk)


def _poll_in_thread(agent: Agent) -> threading.Thread:
    """The agent's poll loop in a thread of its own, with its own database connection (closed at the end)."""

    def run() -> None:
        try:
            agent._poll_loop()
        finally:
            connection.close()

    poller = threading.Thread(target=run, name="test-agent-poll", daemon=True)
    poller.start()
    return poller


def _enqueue(machine: Machine, secret: str, method: str, target: str, payload: dict | None = None,
             expires_in: float = 30.0) -> uuid.UUID:  # fmt: skip
    body = b"" if payload is None else json.dumps(payload).encode()
    command_id = command_enqueue(key_id=machine.key_id, secret=secret, method=method, target=target, body=body,
                                 expires_at=timezone.now() + dt.timedelta(seconds=expires_in))  # fmt: skip
    assert command_id is not None
    return command_id


LAUNCH_BODY = {"client_token": "ord-n-a1", "order_ref": "ord-n", "gpus": 8, "tags": {}}


# --- End to end through the adapter ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_outbound_agent_is_sold_launched_described_and_terminated_through_its_queue(fleet, settings):
    # Given a machine whose agent has no public URL, polling the broker in its own thread
    settings.AGENT_POLLS_PER_MINUTE = 100_000
    # (behind NAT, its router forwards SSH and the lease ports from a public name the provider gives)
    agent, machine = _outbound_agent(fleet, poll_s=0.02, ssh_address="nat-h100-1.example.net")
    assert machine.agent_url == "" and machine.registered_at is not None
    poller = _poll_in_thread(agent)
    try:
        adapter = adapter_for_account(fleet)
        # When the broker sells, launches, finds, describes and terminates through the adapter
        offers = adapter.list_offers()
        handle = adapter.launch(_spec("nat-h100-1", "ord-n-a1"))
        again = adapter.launch(_spec("nat-h100-1", "ord-n-a1"))
        found = adapter.find_by_order("ord-n")
        described = adapter.describe("eu-de", handle.instance_id)
        terminated = adapter.terminate("eu-de", handle.instance_id)
    finally:
        agent.stop()
        poller.join(timeout=10)
    # Then each call got the agent's answer, synchronously, over the queue alone
    assert {(o.zone, o.gpu_count) for o in offers} == {("nat-h100-1", 8)}
    assert handle.instance_id == again.instance_id and handle.instance_id.startswith("nat-h100-1/i-")
    assert [h.instance_id for h in found] == [handle.instance_id]
    assert (described.state, terminated.state) == (InstanceState.RUNNING, InstanceState.TERMINATED)
    assert (described.public_ip, described.extra["ssh"]) == ("nat-h100-1.example.net", "nat-h100-1.example.net:22")
    assert [i.state for i in agent.instances.values()] == ["terminated"]
    assert list(AgentCommand.objects.order_by("created_at").values_list("kind", "state", "answer_status")) == [
        ("status", "answered", 200),
        ("launch", "answered", 201),
        ("launch", "answered", 200),
        ("find", "answered", 200),
        ("describe", "answered", 200),
        ("terminate", "answered", 200),
    ]
    assert agent.rejected == []


def test_a_machine_with_a_public_url_is_still_called_over_http(fleet):
    hosts = start_hosts(fleet, ["fra-h100-1"], lease_threads=False)
    try:
        handle = adapter_for_account(fleet).launch(_spec("fra-h100-1", "ord-h-a1"))
    finally:
        stop_hosts(hosts)
    assert handle.instance_id.split("/", 1)[1] in hosts[0].instances
    assert AgentCommand.objects.count() == 0


def test_a_command_not_answered_in_time_fails_over_and_is_never_run(fleet):
    # Given an outbound machine whose agent is not polling, and a deadline of a fifth of a second
    agent, _ = _outbound_agent(fleet, command_threads=False)
    fleet.options = {"deadline": "0.2"}
    fleet.save(update_fields=["options"])
    # When the broker launches on it
    with pytest.raises(CapacityUnavailable) as failed:
        adapter_for_account(fleet).launch(_spec("nat-h100-1", "ord-n-a1"))
    # Then the launch fails over as an unanswered HTTP call does, and the command is expired
    assert failed.value.code == "agent_timeout"
    command = AgentCommand.objects.get()
    assert (command.kind, command.state, command.answer) == ("launch", AgentCommandState.EXPIRED, None)
    # ... so the agent, polling late, is not given it and launches nothing
    assert agent.poll_once() == 0
    assert agent.instances == {}
    # ... and a late answer is refused and ignored
    late = _answer_as(agent, command.pk, 201, {"id": "i-late", "state": "running"})
    assert (late.status_code, late.json()["code"]) == (409, "expired")
    command.refresh_from_db()
    assert (command.state, command.answer) == (AgentCommandState.EXPIRED, None)


def _answer_as(agent: Agent, command_id: uuid.UUID, status: int, answer: dict):
    body = json.dumps({"status": status, "answer": answer}).encode()
    path = f"/agent/v1/commands/{command_id}/answer"
    headers = protocol.sign(agent.key_id, agent.secret, "POST", path, body)
    return Client().post(path, data=body, content_type="application/json",
                         **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})  # fmt: skip


def test_a_machine_gets_and_answers_only_its_own_commands(fleet):
    # Given a command queued for one outbound machine
    owner, machine = _outbound_agent(fleet, command_threads=False)
    stranger, _ = _outbound_agent(fleet, "nat-h100-2", command_threads=False)
    command_id = _enqueue(machine, owner.secret, "GET", "/v1/status")
    # When another machine's agent polls, and answers that command
    polled = stranger.poll_once()
    answered = _answer_as(stranger, command_id, 200, {"hardware": {}, "gpus_free": 8, "instances": 0})
    # Then it got nothing and its answer is refused as for a command that does not exist
    assert polled == 0
    assert (answered.status_code, answered.json()["code"]) == (404, "not_found")
    assert AgentCommand.objects.get(pk=command_id).state == AgentCommandState.PENDING


# --- What the agent refuses -----------------------------------------------------------------------------------


def test_a_forged_command_is_refused_and_not_run(fleet):
    agent, machine = _outbound_agent(fleet, command_threads=False)
    forged = _enqueue(machine, "not-the-machine-secret", "POST", "/v1/instances", LAUNCH_BODY)

    assert agent.poll_once() == 1

    assert agent.instances == {} and agent.rejected == ["bad_signature"]
    command = AgentCommand.objects.get(pk=forged)
    assert (command.state, command.answer_status, command.answer["code"]) == ("answered", 401, "bad_signature")


def test_a_command_moved_to_another_id_is_refused(fleet):
    agent, machine = _outbound_agent(fleet, command_threads=False)
    signed = AgentCommand.objects.get(pk=_enqueue(machine, agent.secret, "POST", "/v1/instances", LAUNCH_BODY))
    moved = {"id": str(uuid.uuid4()), "method": signed.method, "target": signed.target, "body": signed.body,
             "headers": signed.headers}  # fmt: skip

    assert agent.run_command(moved) == (401, {"code": "bad_signature",
                                              "message": "the command's signature names another command"})  # fmt: skip
    assert agent.instances == {}


def test_a_replayed_command_is_refused(fleet):
    # Given a launch command the agent ran once
    agent, machine = _outbound_agent(fleet, command_threads=False)
    command_id = _enqueue(machine, agent.secret, "POST", "/v1/instances", LAUNCH_BODY)
    assert agent.poll_once() == 1
    assert len(agent.instances) == 1
    # When the same signed command reaches it again (the broker hands it out once; a copy is a replay)
    row = AgentCommand.objects.get(pk=command_id)
    envelope = {"id": str(row.pk), "method": row.method, "target": row.target, "body": row.body,
                "headers": row.headers}  # fmt: skip
    status, answer = agent.run_command(envelope)
    # Then it is refused and nothing more is launched
    assert (status, answer["code"]) == (401, "replayed")
    assert agent.poll_once() == 0
    assert len(agent.instances) == 1 and agent.rejected == ["replayed"]


def test_an_expired_command_is_not_run(fleet):
    # Given a command the broker signed with an expiry already past (the agent's clock is the judge)
    agent, machine = _outbound_agent(fleet, command_threads=False)
    now = time.time()
    command_id = str(uuid.uuid4())
    body = json.dumps(LAUNCH_BODY).encode()
    headers = protocol.sign_command(machine.key_id, agent.secret, command_id=command_id, method="POST",
                                    target="/v1/instances", body=body, expires=now - 1, now=now - 20)  # fmt: skip
    envelope = {"id": command_id, "method": "POST", "target": "/v1/instances", "body": body.decode(),
                "headers": headers}  # fmt: skip
    # When the agent gets it, then the same command with its expiry pushed out (no longer what was signed)
    expired = agent.run_command(envelope)
    extended = agent.run_command({**envelope, "headers": {**headers, protocol.HEADER_EXPIRES: str(int(now) + 60)}})
    # Then neither runs
    assert (expired[0], expired[1]["code"]) == (401, "expired")
    assert (extended[0], extended[1]["code"]) == (401, "bad_signature")
    assert agent.instances == {}


def test_an_agent_that_polls_too_often_is_refused(fleet, settings):
    settings.AGENT_POLLS_PER_MINUTE = 3
    agent, machine = _outbound_agent(fleet, command_threads=False)
    _enqueue(machine, agent.secret, "GET", "/v1/status")
    assert [agent.poll_once() for _ in range(3)] == [1, 0, 0]
    _enqueue(machine, agent.secret, "GET", "/v1/instances/i-1")

    with pytest.raises(urllib.error.HTTPError) as refused:
        agent.poll_once()

    assert refused.value.code == 429
    # Nothing was handed out by the refused poll.
    assert list(AgentCommand.objects.order_by("created_at").values_list("kind", "state")) == [
        ("status", "answered"),
        ("describe", "pending"),
    ]


def test_an_outbound_machine_is_listed_for_its_adapter_without_a_url(fleet):
    _, machine = _outbound_agent(fleet)
    listed = fleet.community_machines()
    assert [(m["name"], m["url"], m["for_sale"]) for m in listed] == [(machine.name, "", True)]
    assert Decimal(listed[0]["price_per_gpu_hour"]) == LISTING["price_per_gpu_hour"]


def test_a_real_outbound_agent_without_an_ssh_address_refuses_to_start(capsys):
    # Its leases' SSH would be reported at its own loopback, where no buyer can log in.
    with pytest.raises(SystemExit) as stopped:
        agent_main(["--broker", "http://127.0.0.1:9", "--key-id", "mk_x", "--secret-file", "/nonexistent"])

    assert stopped.value.code == 2 and "give --ssh-address" in capsys.readouterr().err
