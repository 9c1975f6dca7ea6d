"""Polling independent hosts grows with the machines, not with the leases (issue 23, point 4): the community
adapter's ``describe_many`` asks each machine's agent once for every instance it holds, however many of its
leases are asked about, and reads the asked ones out of that list. Requests are counted where they arrive: at the
simulated hosts (``sandboxes.community.hosts.SimulatedHost``), whichever way they came (HTTP or the command
queue of an outbound-only agent).

The wire format is the host agent protocol's own reference, the docstring of providers/community/protocol.py: the
bare ``GET /v1/instances`` answers ``{"instances": [...], "all": true}`` in the item shape of
``?order_ref=``. An agent that predates it answers the same request with a search for the empty order reference
(no ``all``), or with an HTTP refusal: 404 Not Found, 405 Method Not Allowed or 400 Bad Request, as MDN's HTTP
reference defines them ("404 Not Found", https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/404; "405
Method Not Allowed", https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/405; "400 Bad Request",
https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/400, all citing RFC 9110, HTTP Semantics)."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from providers.community import protocol
from providers.community.host_gpus import parse_simulated
from providers.community.services import machine_list
from providers.errors import MalformedProviderResponse, TransientProviderError
from providers.models import AgentCommand, Machine, MachineState, ProviderAccount
from providers.services import adapter_for_account
from providers.types import InstanceHandle, InstanceState, LaunchSpec, PricingModel
from sandboxes.community.hosts import (
    LISTING_ALL,
    LISTING_NO_ROUTE,
    LISTING_OLDER_AGENT,
    HostCall,
    SimulatedHost,
)
from tests.hosts import LISTING, HostilePeer, stop_hosts
from tests.leases import ClientTransport

pytestmark = pytest.mark.django_db

# Sold per GPU: a lease may take one GPU of the eight.
PER_GPU = {**LISTING, "min_gpus_per_lease": 1}
LISTED = HostCall("GET", "/v1/instances", {})


def _listed(fleet: ProviderAccount, name: str) -> tuple[Machine, str]:
    listed = machine_list(account=fleet, name=name, listing=dict(PER_GPU))
    return listed.machine, listed.secret


def _host(machine: Machine, secret: str, **options) -> SimulatedHost:
    return SimulatedHost(broker_url="http://127.0.0.1:9", key_id=machine.key_id, secret=secret,
                         simulated=parse_simulated("H100:80x8"), launch_seconds=0, lease_threads=False,
                         **options)  # fmt: skip


@pytest.fixture
def hosts(fleet):
    """Start verified machines of the fleet, each a simulated host serving HTTP: ``start(name, listing=...)``."""
    started: list[SimulatedHost] = []

    def start(name: str, listing: str = LISTING_ALL) -> SimulatedHost:
        machine, secret = _listed(fleet, name)
        host = _host(machine, secret, listing=listing)
        started.append(host)
        url = host.serve("127.0.0.1", 0, report=False)
        Machine.objects.filter(pk=machine.pk).update(
            agent_url=url, state=MachineState.VERIFIED, online=True, last_heartbeat_at=timezone.now(),
            registered_at=timezone.now(),
        )  # fmt: skip
        return host

    yield start
    stop_hosts(started)


def _spec(zone: str, token: str, gpus: int) -> LaunchSpec:
    return LaunchSpec(region="eu-de", zone=zone, instance_type=f"community-{gpus}xH100-SXM5",
                      pricing_model=PricingModel.ON_DEMAND, client_token=token, order_ref=token.rsplit("-", 1)[0],
                      gpu_count=gpus)  # fmt: skip


def _leases(fleet: ProviderAccount, zone: str, gpus: list[int]) -> list[InstanceHandle]:
    adapter = adapter_for_account(fleet)
    return [adapter.launch(_spec(zone, f"ord-{zone}-{n}-a1", size)) for n, size in enumerate(gpus)]


# --- One request per machine -------------------------------------------------------------------------------------


def test_three_leases_on_one_machine_and_one_on_another_are_described_with_one_request_per_machine(fleet, hosts):
    # Given a machine running three leases (one of them since ended) and another running one
    shared, single = hosts("fra-h100-1"), hosts("fra-h100-2")
    three = _leases(fleet, "fra-h100-1", [1, 2, 4])
    one = _leases(fleet, "fra-h100-2", [8])
    adapter = adapter_for_account(fleet)
    adapter.terminate("eu-de", three[2].instance_id)
    ids = [h.instance_id for h in [*three, *one]]
    never = "fra-h100-1/i-000000000000"
    shared.clear_calls()
    single.clear_calls()

    # When the broker describes all four, and an id the first machine never had, at once
    found = adapter.describe_many("eu-de", [*ids, never, ids[0]])

    # Then each machine was asked exactly once, for its list
    assert (shared.calls(), single.calls()) == ([LISTED], [LISTED])
    # ... the four are answered as a describe of each answers them, and the unknown one is absent
    assert sorted(found) == sorted(ids)
    assert {i: (h.state, h.instance_type) for i, h in found.items()} == {
        ids[0]: (InstanceState.RUNNING, "community-1xH100-SXM5"),
        ids[1]: (InstanceState.RUNNING, "community-2xH100-SXM5"),
        ids[2]: (InstanceState.TERMINATED, "community-4xH100-SXM5"),
        ids[3]: (InstanceState.RUNNING, "community-8xH100-SXM5"),
    }
    assert found == {i: adapter.describe("eu-de", i) for i in ids}


def test_an_id_the_machine_does_not_list_is_absent_and_no_other_request_is_made(fleet, hosts):
    host = hosts("fra-h100-1")
    (lease,) = _leases(fleet, "fra-h100-1", [2])
    host.clear_calls()

    found = adapter_for_account(fleet).describe_many("eu-de", ["fra-h100-1/i-000000000000", "fra-h100-1/i-gone"])

    assert found == {}
    assert host.calls() == [LISTED]
    assert lease.instance_id not in found


def test_a_machine_that_cannot_be_reached_fails_the_whole_call(fleet, hosts):
    # Given two machines with a lease each, one of which has dropped off the network
    up, down = hosts("fra-h100-1"), hosts("fra-h100-2")
    ids = [h.instance_id for h in [*_leases(fleet, "fra-h100-1", [1]), *_leases(fleet, "fra-h100-2", [1])]]
    down._server.shutdown()
    down._server.server_close()

    # When both are described at once, then the call fails transiently, reporting neither (the contract; the sweep
    # asks one machine per call, so the reachable machine's own call still answers)
    with pytest.raises(TransientProviderError):
        adapter_for_account(fleet).describe_many("eu-de", ids)
    assert set(adapter_for_account(fleet).describe_many("eu-de", ids[:1])) == {ids[0]}
    assert up.calls("GET", "/v1/instances") == [LISTED, LISTED]


# --- Agents in the field that predate the listing ----------------------------------------------------------------


@pytest.mark.parametrize("older", [LISTING_OLDER_AGENT, LISTING_NO_ROUTE])
def test_an_agent_without_the_listing_is_asked_per_id_and_only_it(fleet, hosts, older):
    # Given a machine whose agent predates the listing, with three leases, and a current one with one
    old, current = hosts("fra-h100-1", older), hosts("fra-h100-2")
    three = _leases(fleet, "fra-h100-1", [1, 1, 2])
    one = _leases(fleet, "fra-h100-2", [1])
    never = "fra-h100-1/i-000000000000"
    old.clear_calls()
    current.clear_calls()

    found = adapter_for_account(fleet).describe_many("eu-de", [h.instance_id for h in [*three, *one]] + [never])

    # Then the old agent's leases were each asked by id after its answer said nothing of them; the other machine
    # still answered in one request
    assert {i: h.state for i, h in found.items()} == {h.instance_id: InstanceState.RUNNING for h in [*three, *one]}
    per_id = [HostCall("GET", f"/v1/instances/{h.instance_id.split('/')[1]}", {}) for h in three]
    assert old.calls() == [LISTED, *per_id, HostCall("GET", "/v1/instances/i-000000000000", {})]
    assert current.calls() == [LISTED]


@pytest.mark.parametrize("status", [400, 404, 405])
def test_an_agent_that_refuses_the_bare_listing_is_asked_per_id(fleet, status):
    machine, _ = _listed(fleet, "fra-h100-1")
    instance = {"id": "i-1", "state": "running", "order_ref": "ord-x", "gpus": 1, "ssh": "203.0.113.9:22"}

    def answer(method: str, target: str) -> tuple[int, bytes, dict[str, str]]:
        if target == "/v1/instances":
            return status, b'{"code": "not_found", "message": "no route"}', {}
        if target == "/v1/instances/i-1":
            return 200, json.dumps(instance).encode(), {}
        return 404, b'{"code": "not_found", "message": "no instance"}', {}

    peer = HostilePeer(answer)
    try:
        Machine.objects.filter(pk=machine.pk).update(agent_url=peer.url, state=MachineState.VERIFIED, online=True)
        found = adapter_for_account(fleet).describe_many("eu-de", ["fra-h100-1/i-1", "fra-h100-1/i-2"])
    finally:
        peer.close()

    assert {i: h.state for i, h in found.items()} == {"fra-h100-1/i-1": InstanceState.RUNNING}
    assert peer.requests == [("GET", "/v1/instances"), ("GET", "/v1/instances/i-1"), ("GET", "/v1/instances/i-2")]


# --- An agent may lie ------------------------------------------------------------------------------------------

GOOD = {"id": "i-1", "state": "running", "client_token": "ord-x-a1", "order_ref": "ord-x", "gpus": 1,
        "tags": {"broker:order": "ord-x"}, "ssh": "203.0.113.9:22"}  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"instances": "all of them", "all": True}, "instances"),
        ({"instances": None, "all": True}, "instances"),
        ({"instances": [GOOD] * (protocol.MAX_LISTED + 1), "all": True}, "instances"),
        ({"instances": [{**GOOD, "id": f"i-{n}"} for n in range(protocol.MAX_LISTED + 1)], "all": True}, "instances"),
        ({"instances": [GOOD, GOOD], "all": True}, "instances"),
        ({"instances": [GOOD, {**GOOD, "id": "i-2", "state": "exploded"}], "all": True}, "instance.state"),
        ({"instances": [{**GOOD, "id": "../../etc"}], "all": True}, "instance.id"),
        ({"instances": [{**GOOD, "tags": ["broker:order"]}], "all": True}, "instance.tags"),
        ({"instances": [GOOD], "all": True, "pad": "x" * 300_000}, None),  # past the 256 KiB any answer may take
    ],
)
def test_a_malformed_or_oversized_listing_is_refused_after_one_request(fleet, answer, field):
    machine, _ = _listed(fleet, "fra-h100-1")
    peer = HostilePeer(lambda method, target: (200, json.dumps(answer).encode(), {}))
    try:
        Machine.objects.filter(pk=machine.pk).update(agent_url=peer.url, state=MachineState.VERIFIED, online=True)
        with pytest.raises(MalformedProviderResponse, match=f"malformed {field}" if field else "more than"):
            adapter_for_account(fleet).describe_many("eu-de", ["fra-h100-1/i-1"])
    finally:
        peer.close()

    assert peer.requests == [("GET", "/v1/instances")]


def test_an_agent_lists_its_live_leases_and_only_its_newest_ended_ones_within_the_bound(fleet, hosts):
    # Given an agent up for long enough to have ended more leases than a listing holds, and one lease still live
    host = hosts("fra-h100-1")
    ended = []
    for n in range(protocol.MAX_LISTED + 4):
        body = json.dumps({"client_token": f"ord-old-{n}-a1", "order_ref": f"ord-old-{n}", "gpus": 1}).encode()
        status, launched = host.dispatch("POST", "/v1/instances", {}, body)
        assert status == 201
        host.dispatch("DELETE", f"/v1/instances/{launched['id']}", {}, b"")
        ended.append(f"fra-h100-1/{launched['id']}")
    (live,) = _leases(fleet, "fra-h100-1", [1])

    # When the broker asks about the live lease, the newest ended one and the oldest
    found = adapter_for_account(fleet).describe_many("eu-de", [live.instance_id, ended[-1], ended[0]])

    # Then the live one and the newest ended are answered; the oldest ended lease is forgotten by the listing
    assert {i: h.state for i, h in found.items()} == {
        live.instance_id: InstanceState.RUNNING,
        ended[-1]: InstanceState.TERMINATED,
    }
    status, listing = host.dispatch("GET", "/v1/instances", {}, b"")
    assert (status, len(listing["instances"]), listing["all"]) == (200, protocol.MAX_LISTED, True)
    assert len(json.dumps(listing)) <= protocol.MAX_LISTING_BYTES


# --- Outbound-only agents answer it through the command queue ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_outbound_agent_answers_the_listing_through_its_command_queue(fleet, settings):
    # Given a machine behind NAT (no public URL) with two leases, its agent polling the broker's queue
    settings.AGENT_POLLS_PER_MINUTE = 100_000
    machine, secret = _listed(fleet, "nat-h100-1")
    # Commands run in the poll's own thread, whose database connection is closed when it ends.
    host = _host(machine, secret, broker_transport=ClientTransport(Client()), poll_s=0.02, command_threads=False)
    assert host.register()["machine"] == "nat-h100-1"
    Machine.objects.filter(pk=machine.pk).update(state=MachineState.VERIFIED)

    def poll() -> None:
        try:
            host._poll_loop()
        finally:
            connection.close()

    poller = threading.Thread(target=poll, name="test-agent-poll", daemon=True)
    poller.start()
    try:
        leases = _leases(fleet, "nat-h100-1", [2, 2])
        host.clear_calls()
        queued_before = AgentCommand.objects.count()
        # When the broker describes both, and one the machine never had
        found = adapter_for_account(fleet).describe_many(
            "eu-de", [h.instance_id for h in leases] + ["nat-h100-1/i-000000000000"]
        )
    finally:
        host.stop()
        poller.join(timeout=10)

    # Then one command carried the listing, recorded as a describe, and the agent answered it
    assert {i: h.state for i, h in found.items()} == {h.instance_id: InstanceState.RUNNING for h in leases}
    assert host.calls() == [LISTED]
    commands = AgentCommand.objects.order_by("created_at")[queued_before:]
    assert [(c.kind, c.method, c.target, c.state, c.answer_status) for c in commands] == [
        ("describe", "GET", "/v1/instances", "answered", 200)
    ]


def test_an_agent_forgets_ended_leases_past_its_bounds_and_never_a_live_one(fleet, hosts):
    """An agent up for months would otherwise hold every lease it ever ran: it keeps at most ``KEEP_ENDED``
    ended ones, none older than ``KEEP_ENDED_S``; a forgotten one answers not_found, as the protocol says."""
    from providers.community.instances import KEEP_ENDED, KEEP_ENDED_S

    host = hosts("fra-h100-1")
    (live,) = _leases(fleet, "fra-h100-1", [1])
    ids = []
    for n in range(KEEP_ENDED + 3):
        body = json.dumps({"client_token": f"ord-many-{n}-a1", "order_ref": f"ord-many-{n}", "gpus": 1}).encode()
        status, launched = host.dispatch("POST", "/v1/instances", {}, body)
        assert status == 201
        host.dispatch("DELETE", f"/v1/instances/{launched['id']}", {}, b"")
        ids.append(launched["id"])

    assert sum(1 for i in host.instances.values() if i.ended is not None) == KEEP_ENDED
    assert [host.dispatch("GET", f"/v1/instances/{i}", {}, b"")[0] for i in (ids[0], ids[2], ids[3], ids[-1])] == [
        404,
        404,
        200,
        200,
    ]
    # An ended lease past the age bound goes at the next end, whatever the count; the live one stays.
    host.instances[ids[-1]].ended -= KEEP_ENDED_S + 1
    body = json.dumps({"client_token": "ord-last-a1", "order_ref": "ord-last", "gpus": 1}).encode()
    _, last = host.dispatch("POST", "/v1/instances", {}, body)
    host.dispatch("DELETE", f"/v1/instances/{last['id']}", {}, b"")
    assert host.dispatch("GET", f"/v1/instances/{ids[-1]}", {}, b"")[0] == 404
    assert host.instances[live.instance_id.partition("/")[2]].holds_gpus()
