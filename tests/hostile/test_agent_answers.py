"""Every answer of a host agent is validated into the adapter's DTOs (issue 17, item 5): types, lengths,
ranges and states. Anything out of shape is a ``MalformedProviderResponse`` naming the field, never an
``AttributeError`` in a sweep or a value too long for a column."""

from __future__ import annotations

import json

import pytest

from marketplace.catalog.services import offers_sync
from providers.errors import MalformedProviderResponse, ProviderRequestRejected
from providers.models import Machine
from providers.services import adapter_for_account
from providers.types import InstanceState, LaunchSpec, PricingModel
from tests.hosts import HostilePeer, start_hosts, stop_hosts

pytestmark = pytest.mark.django_db

GOOD = {"id": "i-1", "state": "running", "client_token": "ord-x-a1", "order_ref": "ord-x", "gpus": 8,
        "tags": {"broker:order": "ord-x"}, "ssh": "203.0.113.9:22"}  # fmt: skip


@pytest.fixture
def host(fleet):
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents[0]
    stop_hosts(agents)


@pytest.fixture
def answering(fleet, host):
    """Point the machine at a peer that answers every request with the given body (status 200)."""
    made: list[HostilePeer] = []

    def point(body: bytes, status: int = 200) -> HostilePeer:
        made.append(HostilePeer(lambda method, target: (status, body, {})))
        Machine.objects.filter(name="fra-h100-1").update(agent_url=made[-1].url)
        return made[-1]

    yield point
    for peer in made:
        peer.close()


def _spec() -> LaunchSpec:
    return LaunchSpec(region="eu-de", zone="fra-h100-1", instance_type="community-8xH100-SXM5",
                      pricing_model=PricingModel.ON_DEMAND, client_token="ord-x-a1", order_ref="ord-x")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tags": ["broker:order", "ord-x"]}, "instance.tags"),
        ({"tags": {"broker:attempt": 1}}, "instance.tags"),
        ({"tags": {f"k{i}": "v" for i in range(65)}}, "instance.tags"),
        ({"ssh": "h" * 70 + ":22"}, "instance.ssh"),
        ({"ssh": "evil host/;rm:22"}, "instance.ssh"),
        ({"ssh": "203.0.113.9:99999"}, "instance.ssh"),
        ({"ssh": ["203.0.113.9", 22]}, "instance.ssh"),
        ({"id": "i-" + "x" * 100}, "instance.id"),
        ({"id": "../../etc"}, "instance.id"),
        ({"id": 7}, "instance.id"),
        ({"state": "exploded"}, "instance.state"),
        ({"state": None}, "instance.state"),
        ({"client_token": "t" * 65}, "instance.client_token"),
        ({"gpus": "eight"}, "instance.gpus"),
        ({"gpus": True}, "instance.gpus"),
        ({"mig_profile": "3g.40gb; rm -rf /"}, "instance.mig_profile"),
        ({"mig_profile": "9" * 80}, "instance.mig_profile"),
        ({"mig_profile": 0}, "instance.mig_profile"),
    ],
)
def test_a_malformed_instance_is_refused_naming_the_field(fleet, answering, change, field):
    answering(json.dumps({**GOOD, **change}).encode())
    adapter = adapter_for_account(fleet)

    calls = [lambda: adapter.launch(_spec()), lambda: adapter.describe("eu-de", "fra-h100-1/i-1")]
    # The order actions read the same instance answer (issue 36).
    calls += [lambda act=act: act("eu-de", "fra-h100-1/i-1") for act in (adapter.stop, adapter.start, adapter.reboot)]
    for call in calls:
        with pytest.raises(MalformedProviderResponse, match=f"malformed {field}"):
            call()


def test_an_agents_own_words_in_a_refused_stop_never_reach_the_buyer(fleet, answering):
    """Its code is kept where the protocol defines it; its text is replaced by the broker's (issue 36)."""
    lure = "<script>steal()</script> call +1-555-SCAM for a refund"
    for code, said in (("not_running", "not running on its host"), ("made_up", "refused the request (HTTP 409)")):
        answering(json.dumps({"code": code, "message": lure}).encode(), status=409)
        with pytest.raises(ProviderRequestRejected) as refused:
            adapter_for_account(fleet).stop("eu-de", "fra-h100-1/i-1")
        assert said in refused.value.message and "steal" not in str(refused.value)
        assert refused.value.code == (code if code == "not_running" else "agent_error")


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b"[1, 2, 3]",
        b'{"id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        json.dumps({**GOOD, "pad": "x" * 300_000}).encode(),
        b'{"id": "i-1", "state": "running"',
    ],
)
def test_an_answer_that_is_not_the_protocols_json_is_malformed(fleet, answering, body):
    answering(body)

    with pytest.raises(MalformedProviderResponse):
        adapter_for_account(fleet).describe("eu-de", "fra-h100-1/i-1")


def test_a_well_formed_instance_is_read_whole(fleet, answering):
    answering(json.dumps(GOOD).encode())

    handle = adapter_for_account(fleet).describe("eu-de", "fra-h100-1/i-1")

    assert (handle.instance_id, handle.state, handle.public_ip, handle.tags) == (
        "fra-h100-1/i-1", InstanceState.RUNNING, "203.0.113.9", {"broker:order": "ord-x"}
    )  # fmt: skip


@pytest.mark.parametrize(
    "answer",
    [
        {"instances": "all of them"},
        {"instances": [GOOD] * 257},
        {"instances": [{**GOOD, "tags": ["a"]}]},
    ],
)
def test_a_malformed_instance_list_is_refused(fleet, answering, answer):
    answering(json.dumps(answer).encode())

    with pytest.raises(MalformedProviderResponse):
        adapter_for_account(fleet).find_by_order("ord-x")


@pytest.mark.parametrize(
    "answer",
    [
        {"hardware": [], "gpus_free": 8},
        {"hardware": {"gpus": "eight"}, "gpus_free": 8},
        {"hardware": {"gpus": [{}] * 8}, "gpus_free": "lots"},
        {"hardware": {"gpus": [{}] * 8}, "gpus_free": 10**30},
    ],
)
def test_a_machine_with_a_malformed_status_is_left_out_of_the_offers(fleet, answering, answer):
    answering(json.dumps(answer).encode())

    assert adapter_for_account(fleet).list_offers() == []
