"""Running means ready: an order runs only once the lease agent on its machine reports the ordered GPUs, the
workload started and SSH answering; a machine that stays silent, has the wrong GPUs or cannot start the
workload is terminated and its attempt failed. Driven on independent hosts (simulated agents in process)
through the broker's real agent endpoints, in the test's own transaction."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from ledger.services import ledger_verify
from marketplace.launch.config import LaunchChoice
from marketplace.models import (
    Attempt,
    Lease,
    LeaseHeartbeat,
    LeaseState,
    Offer,
    OrderState,
)
from marketplace.orders.launching import Step
from marketplace.orders.readiness import order_boot_check, order_poll
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.community.lease import BrokerRefused
from tests.leases import LAUNCH, ClientTransport, boot, held_agent


@pytest.fixture
def hosts(held_hosts):
    return held_hosts


def _place(acme, alice, capture, launch=LAUNCH, **extra):
    offer = Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")
    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(offer_id=offer.pk, max_price_per_hour=Decimal("16"), launch=launch, **extra),
        ).order
    order.refresh_from_db()
    return order


CONTAINER = LaunchChoice(
    data={
        "allowed_cidrs": ["203.0.113.0/24"],
        "workload": {
            "kind": "container",
            "image": "vllm/vllm-openai:v0.6.3",
            "args": ["--model", "meta-llama/Llama-3.1-8B"],
            "env": [{"name": "HF_TOKEN", "value": "hf_sEcReT-token-do-not-leak", "secret": True},
                    {"name": "MODE", "value": "serve"}],
            "ports": [8000],
        },
    }
)  # fmt: skip


def test_an_order_runs_only_once_its_machine_reports_ready(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=CONTAINER)

    # The host started the machine; the broker waits for its agent.
    assert order.state == OrderState.PROVISIONING
    lease = Lease.objects.get(order=order)
    assert lease.state == LeaseState.WAITING
    transport = ClientTransport(client)
    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, transport) == "running"

    assert order.state == OrderState.RUNNING, order.state_reason
    lease.refresh_from_db()
    assert lease.state == LeaseState.READY
    assert (lease.ssh_user, lease.ssh_host) == ("lease", "127.0.0.1")
    assert lease.host_keys[0]["fingerprint"].startswith("SHA256:")
    assert [c[1] for c in transport.calls] == [
        "/agent/v1/lease/claim", "/agent/v1/lease/secrets", "/agent/v1/lease/ready",
    ]  # fmt: skip
    instance = order.instances.get()
    assert instance.ready_at is not None
    assert ledger_verify().ok


def test_a_poll_while_the_agent_boots_reads_order_instance_and_lease_at_once(
    acme, alice, hosts, django_capture_on_commit_callbacks, django_assert_num_queries
):
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=CONTAINER)

    # The machine runs and its running is recorded; its agent has not reported: the poll writes nothing and
    # reads the order, its instance and lease in one query (the other is the host adapter's machine lookup).
    with django_assert_num_queries(2):
        assert order_poll(order_id=order.pk) == Step.WAIT
    assert Lease.objects.get(order=order).state == LeaseState.WAITING


def test_the_agent_gets_the_secrets_over_the_signed_channel_and_the_user_data_has_none(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=CONTAINER)
    agent = held_agent(order, hosts)

    assert "hf_sEcReT" not in json.dumps(agent.lease)
    assert agent.lease["workload"]["env"] == [{"name": "MODE", "value": "serve"}]
    agent.transport = ClientTransport(client)
    agent.claim()
    secrets = agent._post("/agent/v1/lease/secrets", {})
    assert secrets == {"env": {"HF_TOKEN": "hf_sEcReT-token-do-not-leak"}}
    # Handed out only before ready: once the machine runs, nobody holding its key can ask again.
    with django_capture_on_commit_callbacks(execute=True):
        assert boot_after_claim(agent) == "running"
    with pytest.raises(BrokerRefused, match="before ready"):
        agent._post("/agent/v1/lease/secrets", {})


def boot_after_claim(agent):
    """The rest of a boot whose claim the test made itself."""
    agent.claim = lambda: None  # the token is spent; the agent keeps the key it got
    return agent.boot()


def test_a_boot_token_works_once(acme, alice, hosts, django_capture_on_commit_callbacks, client):
    order = _place(acme, alice, django_capture_on_commit_callbacks)
    agent = held_agent(order, hosts)
    agent.transport = ClientTransport(client)
    agent.claim()

    again = client.post(
        "/agent/v1/lease/claim", {"boot_token": agent.lease["boot_token"]}, content_type="application/json"
    )

    assert (again.status_code, again.json()["code"]) == (401, "spent")


def test_a_machine_that_never_reports_is_terminated_and_the_order_fails_over(
    acme, alice, hosts, django_capture_on_commit_callbacks
):
    order = _place(acme, alice, django_capture_on_commit_callbacks)
    lease = Lease.objects.get(order=order)
    first = order.instances.get()

    assert order_boot_check(order_id=order.pk) == Step.WAIT
    later = lease.boot_deadline + dt.timedelta(seconds=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert order_boot_check(order_id=order.pk, now=later) == Step.PROVISION
    attempt = Attempt.objects.get(pk=lease.attempt_id)
    assert (attempt.outcome, attempt.error_class, attempt.provider_code) == ("failed", "boot_timeout", "boot_timeout")
    assert "never phoned home" in attempt.provider_message
    first.refresh_from_db()
    assert (first.active, first.state) == (False, "terminated")
    assert [i.state for i in hosts[0].instances.values()] == ["terminated"]


def test_a_machine_with_the_wrong_gpus_is_refused_and_failed_over(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    from providers.community.devices import FakeDevices

    order = _place(acme, alice, django_capture_on_commit_callbacks)
    agent = held_agent(order, hosts)
    agent.executor.devices = FakeDevices([("NVIDIA A100-SXM4-80GB", 80)] * 8)  # the host's GPUs are not the listing's

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "refused"

    attempt = order.attempts.get(number=1)
    assert attempt.error_class == "gpu_mismatch"
    assert "the order is for 8x H100-SXM5; the machine has 8x NVIDIA A100-SXM4-80GB 80 GB" in attempt.provider_message
    # Failed over to the second machine, which the test now boots.
    order.refresh_from_db()
    assert order.instances.get(active=True).zone == "fra-h100-2"
    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "running"
    assert order.state == OrderState.RUNNING


def test_a_workload_that_does_not_start_fails_the_order_with_its_reason(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=CONTAINER)
    agent = held_agent(order, hosts)
    agent.executor.fail_workload = "pull access denied for vllm/vllm-openai, repository does not exist"

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "failed"
    order.refresh_from_db()

    assert order.state == OrderState.FAILED
    assert order.state_reason == (
        "the workload did not start: pull access denied for vllm/vllm-openai, repository does not exist"
    )
    assert order.instances.get().active is False
    assert [i.state for i in hosts[0].instances.values()] == ["terminated"]


def test_telemetry_flows_while_running_and_the_agent_is_told_when_the_order_ends(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=CONTAINER)
    with django_capture_on_commit_callbacks(execute=True):
        boot(order, hosts, ClientTransport(client))
    agent = held_agent(order, hosts)

    assert agent.heartbeat() == "running"
    beat = LeaseHeartbeat.objects.get(lease__order=order)
    assert len(beat.gpus) == 8 and 88 <= beat.utilization_pct <= 99
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert agent.heartbeat() == "ended"


def test_the_spend_cap_sets_when_the_order_ends(acme, alice, hosts, django_capture_on_commit_callbacks, client):
    capped = LaunchChoice(data={"allowed_cidrs": ["127.0.0.1/32"], "spend_cap_usd": "7.60"})
    order = _place(acme, alice, django_capture_on_commit_callbacks, launch=capped)
    with django_capture_on_commit_callbacks(execute=True):
        boot(order, hosts, ClientTransport(client))

    ready_at = order.instances.get().ready_at
    # 7.60 USD at 15.20 USD/h: half an hour.
    assert order.spend_cap_usd == Decimal("7.60")
    assert abs((order.run_until - ready_at) - dt.timedelta(minutes=30)) < dt.timedelta(seconds=2)


def test_an_agent_waits_out_a_broker_in_trouble_and_stops_at_a_refusal(
    acme, alice, hosts, django_capture_on_commit_callbacks, client, monkeypatch
):
    import providers.community.lease as lease_module

    order = _place(acme, alice, django_capture_on_commit_callbacks)
    agent = held_agent(order, hosts)
    through = ClientTransport(client)
    answers = [503, 502]  # a proxy in front of a restarting broker, then the broker itself

    def flaky(method, target, body, headers):
        if answers:
            return answers.pop(0), b'{"code": "unavailable"}'
        return through(method, target, body, headers)

    waits: list[float] = []
    monkeypatch.setattr(lease_module.time, "sleep", waits.append)  # the waits are asserted, not slept
    agent.transport = flaky
    with django_capture_on_commit_callbacks(execute=True):
        assert agent.boot() == "running"
    order.refresh_from_db()
    assert waits == [2.0, 4.0] and order.state == OrderState.RUNNING

    # A spent token is final: the agent gives up at once instead of retrying.
    again = held_agent(order, hosts)
    again.key_id = ""
    again.transport = ClientTransport(client)
    assert again.boot() == "claim_refused"


def test_an_agent_ready_before_the_provider_says_running_shows_the_instance_running(
    acme, alice, hosts, django_capture_on_commit_callbacks, client
):
    order = _place(acme, alice, django_capture_on_commit_callbacks)
    # The broker's poll has not yet seen the provider say "running" when the lease agent reports ready.
    order.instances.update(state="pending", running_at=None)

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "running"

    instance = order.instances.get()
    assert order.state == OrderState.RUNNING and instance.running_at is not None
    assert instance.state == "running"  # the machine demonstrably runs: not shown as pending beside "ready"
