"""A host agent's URL cannot lead the broker into its own network (issue 17, item 3), and a silent agent cannot
hold an order (item 4).

The agent URL is held to the same address rules as a cloud account's endpoint, when the agent registers and
again at every connection; redirects are not followed; a verified machine that moves to a new URL leaves
sale until verified again; whatever an agent answers, the buyer reads the broker's own words."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from ledger.models import LedgerEntry
from marketplace.catalog.services import offers_sync
from marketplace.models import Attempt, AttemptOutcome, Offer, OrderState
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.community import protocol
from providers.community.client import AgentClient, AgentTimeout
from providers.errors import ProviderRequestRejected
from providers.models import Machine, MachineState
from providers.services import adapter_for_account
from providers.types import LaunchSpec, PricingModel
from tests.hosts import HostilePeer
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


@pytest.fixture
def hosts(held_hosts):
    return held_hosts


@pytest.fixture
def peers():
    made: list[HostilePeer] = []

    def make(*args, **kwargs) -> HostilePeer:
        made.append(HostilePeer(*args, **kwargs))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def _register(client, machine: Machine, secret: str, url: str):
    body = json.dumps({"agent_url": url, "hardware": {}, "self_test": {"ok": False}}).encode()
    headers = protocol.sign(machine.key_id, secret, "POST", "/agent/v1/register", body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post("/agent/v1/register", data=body, content_type="application/json", **extra)


def _spec(zone: str = "fra-h100-1") -> LaunchSpec:
    return LaunchSpec(region="eu-de", zone=zone, instance_type="community-8xH100-SXM5",
                      pricing_model=PricingModel.ON_DEMAND, client_token="ord-x-a1", order_ref="ord-x")  # fmt: skip


def _place(acme, alice, zone: str, capture, **request):
    offer = Offer.objects.get(zone=zone, pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=Decimal("16"), **request)).order  # fmt: skip
    order.refresh_from_db()
    return order


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:7070",
        "http://localhost:7070",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.7:7070",
        "http://[::1]:7070",
        "http://[::ffff:169.254.169.254]/",
        "http://[::127.0.0.1]:7070",
        "http://0.0.0.0:7070",
    ],
)
def test_an_agent_cannot_register_an_address_inside_the_brokers_network(client, fleet, settings, url):
    from providers.community.services import machine_list
    from tests.hosts import LISTING

    settings.PROVIDER_ENDPOINTS = "public"
    listed = machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))

    answer = _register(client, listed.machine, listed.secret, url)

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid" and answer.json()["message"].startswith("agent_url: ")
    machine = Machine.objects.get(pk=listed.machine.pk)
    assert (machine.agent_url, machine.registered_at, machine.online) == ("", None, False)


def test_every_call_checks_the_address_it_connects_to(fleet, hosts, settings):
    # The machines registered while loopback was allowed (or their name resolved elsewhere then): the
    # rules are applied again when the broker connects, and nothing reaches the address.
    adapter = adapter_for_account(fleet)
    settings.PROVIDER_ENDPOINTS = "public"

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter.launch(_spec())

    assert refused.value.code == "agent_address_refused"
    assert hosts[0].instances == {} and hosts[0].rejected == []


def test_a_redirect_is_not_followed(fleet, hosts, peers):
    inside = peers()  # stands for the metadata service the redirect points at
    redirecting = peers(lambda method, target: (302, b"", {"Location": inside.url + "/latest/meta-data/"}))
    Machine.objects.filter(name="fra-h100-1").update(agent_url=redirecting.url)

    with pytest.raises(ProviderRequestRejected) as refused:
        adapter_for_account(fleet).describe("eu-de", "fra-h100-1/i-1")

    assert refused.value.code == "agent_redirect"
    assert redirecting.requests == [("GET", "/v1/instances/i-1")] and inside.requests == []


def test_what_an_agent_answers_never_reaches_the_buyer(fleet, hosts, peers, acme, alice,
                                                       django_capture_on_commit_callbacks):  # fmt: skip
    leak = b'{"code": "AKIAIOSFODNN7EXAMPLE", "message": "role/broker: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}'
    metadata = peers(lambda method, target: (403, leak, {}))
    Machine.objects.filter(name="fra-h100-1").update(agent_url=metadata.url)

    order = _place(acme, alice, "fra-h100-1", django_capture_on_commit_callbacks, allow_failover=False)

    attempt = Attempt.objects.get(order=order)
    assert attempt.outcome == AttemptOutcome.FAILED and metadata.requests == [("POST", "/v1/instances")]
    assert (attempt.error_class, attempt.provider_code) == ("final", "agent_error")
    assert attempt.provider_message == "the machine's agent refused the request (HTTP 403)"
    assert "EXAMPLE" not in order.state_reason


def test_a_verified_machine_at_a_new_url_leaves_sale_and_its_order_is_still_stopped(
    client, fleet, hosts, acme, alice, django_capture_on_commit_callbacks
):
    order = boot_if_launched(_place(acme, alice, "fra-h100-1", django_capture_on_commit_callbacks), hosts)
    assert order.state == OrderState.RUNNING, order.state_reason
    machine = Machine.objects.get(name="fra-h100-1")
    moved_to = hosts[0].public_url.replace("127.0.0.1", "localhost")  # the same agent, another URL

    answer = _register(client, machine, hosts[0].secret, moved_to)

    assert answer.status_code == 200 and answer.json()["state"] == MachineState.PENDING
    machine.refresh_from_db()
    assert (machine.state, machine.agent_url) == (MachineState.PENDING, moved_to)
    entry = LedgerEntry.objects.get(kind="machine.pending")
    assert json.loads(entry.payload)["previous"] == "verified"
    assert offers_sync(account_id=fleet.pk).ok
    assert not Offer.objects.filter(zone="fra-h100-1", status="available").exists()
    # The order placed while it was on sale keeps running, and is reached at the new URL to be stopped.
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert [i.state for i in hosts[0].instances.values()] == ["terminated"]


def test_a_machine_that_moved_takes_no_launch_before_its_offer_is_withdrawn(
    client, fleet, hosts, acme, alice, django_capture_on_commit_callbacks
):
    machine = Machine.objects.get(name="fra-h100-2")
    _register(client, machine, hosts[1].secret, hosts[1].public_url.replace("127.0.0.1", "localhost"))

    order = _place(acme, alice, "fra-h100-2", django_capture_on_commit_callbacks, allow_failover=False)

    attempt = Attempt.objects.get(order=order)
    assert (attempt.outcome, attempt.error_class, attempt.provider_code) == ("failed", "capacity", "machine_off_sale")
    assert order.state == OrderState.FAILED and hosts[1].instances == {}


def test_a_silent_agent_fails_over_within_the_deadline(
    fleet, hosts, peers, acme, alice, django_capture_on_commit_callbacks
):
    fleet.options = {"deadline": "0.5"}
    fleet.save(update_fields=["options"])
    silent = peers(silent=True)
    Machine.objects.filter(name="fra-h100-1").update(agent_url=silent.url)

    order = _place(acme, alice, "fra-h100-1", django_capture_on_commit_callbacks)

    assert silent.requests == [("POST", "/v1/instances")] and not silent.release.is_set()
    first, second = Attempt.objects.filter(order=order).order_by("number")
    assert (first.outcome, first.error_class, first.provider_code) == ("failed", "capacity", "agent_timeout")
    assert (second.outcome, second.offer.zone) == ("launched", "fra-h100-2")
    assert order.state == OrderState.PROVISIONING


def test_an_agent_trickling_its_answer_is_cut_at_the_deadline(peers):
    trickler = peers(lambda method, target: (200, b'{"hardware": {}, "gpus_free": 8, "instances": 0}', {}),
                     trickle=True)  # fmt: skip

    with pytest.raises(AgentTimeout):
        AgentClient(trickler.url, "mk_1", "s3cret", deadline=0.3).call("GET", "/v1/status")

    assert trickler.requests == [("GET", "/v1/status")] and not trickler.answered_fully.is_set()


def test_a_verified_outbound_machine_that_registers_a_url_leaves_sale_until_checked(client, fleet, hosts):
    machine = Machine.objects.get(name="fra-h100-1")
    Machine.objects.filter(pk=machine.pk).update(agent_url="")  # registered and verified while it only polled

    answer = _register(client, machine, hosts[0].secret, hosts[0].public_url)

    machine.refresh_from_db()
    assert answer.status_code == 200 and (machine.state, machine.agent_url) == (
        MachineState.PENDING,
        hosts[0].public_url,
    )
    assert json.loads(LedgerEntry.objects.get(kind="machine.pending").payload)["previous"] == "verified"
    # Back to outbound-only is no move: the broker then connects to nothing staff did not check.
    Machine.objects.filter(pk=machine.pk).update(state=MachineState.VERIFIED)
    assert _register(client, machine, hosts[0].secret, "").json()["state"] == MachineState.VERIFIED


def test_a_seeded_machine_registering_for_the_first_time_is_not_moving(client, fleet, hosts):
    # The demo seeds its machines verified before their simulated agents first register: no URL was verified.
    machine = Machine.objects.get(name="fra-h100-1")
    Machine.objects.filter(pk=machine.pk).update(agent_url="", registered_at=None)

    answer = _register(client, machine, hosts[0].secret, hosts[0].public_url)

    assert answer.json()["state"] == MachineState.VERIFIED
    assert not LedgerEntry.objects.filter(kind="machine.pending").exists()
