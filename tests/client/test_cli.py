"""The broker command, run as a subprocess against the live broker: JSON output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import note
from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.keys import verifier_key
from marketplace.models import Order, OrderState
from tests.client.conftest import CLIENT_DIR

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker_cli(live_server, token, machines_phone_home):
    env = {**os.environ, "BROKER_URL": live_server.url, "BROKER_TOKEN": token, "PYTHONPATH": str(CLIENT_DIR)}
    env.pop("BROKER_VERIFIER_KEY", None)

    def run(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brokerclient", *args],
            env={**env, **(env_extra or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def _json(result: subprocess.CompletedProcess[str]):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_search_quote_order_watch_terminate_and_verify_from_the_shell(broker_cli, aws_account):
    offers = _json(broker_cli("offers", "gpu=T4 pricing=on_demand", "--sort", "gpuprice", "--limit", "5", "--json"))
    assert len(offers) == 5 and all(o["gpu_model"] == "T4" for o in offers)
    table = broker_cli("offers", "gpu=T4", "--limit", "3")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["id", "provider", "gpu"]
    assert len(table.stdout.splitlines()) == 4

    quoted = _json(broker_cli("quote", "--profile", "inference", "--gpu", "T4", "--count", "1", "--pricing",
                              "on_demand", "--hours", "8", "--limit", "3", "--json"))  # fmt: skip
    assert 1 <= len(quoted["quotes"]) <= 3 and quoted["quotes"][0]["duration_hours"] == "8.00"
    quote = quoted["quotes"][0]
    placed = _json(broker_cli("order", "--quote", quote["id"], "--max-price", quote["price_per_hour"], "--json"))
    assert placed["quote"] == quote["id"] and placed["id"] == str(Order.objects.get().public_id)

    watched = broker_cli("watch", placed["id"], "--until", "running", "--interval", "0.2", "--json")
    assert watched.returncode == 0, watched.stderr
    states = [json.loads(line)["state"] for line in watched.stdout.splitlines()]
    assert states[-1] == OrderState.RUNNING
    shown = broker_cli("show", placed["id"])
    assert shown.returncode == 0 and f"order     {placed['id']}\nstate     running\n" in shown.stdout

    stopped = _json(broker_cli("terminate", placed["id"], "--json"))
    assert stopped["state"] in (OrderState.TERMINATING, OrderState.TERMINATED)
    ledger_checkpoint_and_anchor()

    verified = broker_cli("receipt", placed["id"], "--verify", "--key", verifier_key(), "--json")
    body = _json(verified)
    assert body["verification"]["ok"] and body["verification"]["key_pinned"]
    assert body["receipt"]["subject"] == f"order:{placed['id']}"
    readable = broker_cli("receipt", placed["id"], "--verify")
    assert readable.returncode == 0 and "receipt VERIFIED" in readable.stdout and "not pinned" in readable.stdout

    wrong = note.verifier_key(body["receipt"]["origin"], Ed25519PrivateKey.generate().public_key())
    refused = broker_cli("receipt", placed["id"], "--verify", "--json", env_extra={"BROKER_VERIFIER_KEY": wrong})
    assert refused.returncode == 3
    failed = json.loads(refused.stdout)["verification"]
    assert not failed["ok"] and [c["name"] for c in failed["checks"] if not c["ok"]] == ["signature"]


def _running(broker, t4_offer) -> dict:
    """An order once running: its entries up to now are all written, so a checkpoint signed next covers them
    (a receipt with entries still pending exits 4, not 0)."""
    offer, cap = t4_offer
    order = broker.order(offer=offer.pk, max_price_per_hour=cap)
    assert list(broker.watch(order["id"], until=["running"], timeout=60, interval=0.2))[-1]["state"] == "running"
    return order


def test_a_tampered_saved_receipt_exits_3(broker_cli, tmp_path, broker, t4_offer):
    order = _running(broker, t4_offer)
    ledger_checkpoint_and_anchor()
    receipt = broker.receipt(order["id"])
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(receipt))
    receipt["entries"][0]["payload"] += " "
    bad.write_text(json.dumps(receipt))
    key = verifier_key()
    assert (
        broker_cli("receipt", "--file", str(good), "--verify", "--key", key, env_extra={"BROKER_URL": ""}).returncode
        == 0
    )
    result = broker_cli("receipt", "--file", str(bad), "--verify", "--key", key)
    assert result.returncode == 3
    sequence = receipt["entries"][0]["sequence"]
    assert f"receipt FAILED: payload (entry #{sequence})" in result.stdout


def test_api_errors_exit_1_with_the_code_and_usage_errors_exit_2(broker_cli, live_server):
    missing = broker_cli("show", str(uuid.uuid4()))
    assert missing.returncode == 1 and "not_found (404): no such order" in missing.stderr and missing.stdout == ""
    invalid = broker_cli("offers", "cuont>=1", "--json")
    assert invalid.returncode == 1 and "invalid (400)" in invalid.stderr and "cuont" in invalid.stderr
    unauthorised = broker_cli("offers", env_extra={"BROKER_TOKEN": "brk_nope"})
    assert unauthorised.returncode == 1 and "token_unknown (401): no such API token" in unauthorised.stderr

    assert broker_cli("order").returncode == 2  # neither --offer nor --quote
    assert broker_cli("order", "--offer", "1", "--quote", str(uuid.uuid4())).returncode == 2
    no_url = broker_cli("offers", env_extra={"BROKER_URL": ""})
    assert no_url.returncode == 2 and "BROKER_URL" in no_url.stderr
    bad_state = broker_cli("watch", str(uuid.uuid4()), "--until", "flying")
    assert bad_state.returncode == 2 and "flying" in bad_state.stderr
    unknown_gpu = broker_cli("quote", "--gpu", "Z9000")
    assert unknown_gpu.returncode == 2 and "unknown GPU 'Z9000'" in unknown_gpu.stderr
    assert Order.objects.count() == 0


def test_a_remembered_checkpoint_must_be_extended_by_every_later_one(broker_cli, tmp_path, broker, t4_offer):
    from django.db import transaction

    from ledger.services import ledger_append

    order = _running(broker, t4_offer)
    first = ledger_checkpoint_and_anchor()
    state, key = tmp_path / "state.json", verifier_key()

    def verify() -> subprocess.CompletedProcess[str]:
        return broker_cli("receipt", order["id"], "--verify", "--key", key, "--state", str(state))

    remembered = verify()
    assert remembered.returncode == 0, remembered.stdout + remembered.stderr
    assert f"first run: checkpoint {first.size} remembered" in remembered.stdout
    assert json.loads(state.read_text()) == {"origin": first.origin, "size": first.size, "root": first.root_hash}

    with transaction.atomic():
        ledger_append(kind="test.event", subject="thing:later", payload={"n": 1})
    second = ledger_checkpoint_and_anchor()
    extended = verify()
    assert extended.returncode == 0, extended.stdout
    assert f"checkpoint {second.size} extends the remembered {first.size}" in extended.stdout
    assert json.loads(state.read_text())["size"] == second.size

    for forged_size in (second.size, first.size):  # what was seen before, as a rewritten ledger would differ
        forged = {"origin": first.origin, "size": forged_size, "root": "ab" * 32}
        state.write_text(json.dumps(forged))
        refused = verify()
        assert refused.returncode == 3, refused.stdout
        assert "are not one history" in refused.stdout
        assert json.loads(state.read_text()) == forged  # a failed check remembers nothing

    state.write_text("{not json")
    unreadable = verify()
    assert unreadable.returncode == 2 and "cannot read the state file" in unreadable.stderr


@pytest.fixture
def biddable_hosts(fleet):
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.catalog.services import offers_sync
    from marketplace.models import GpuModel
    from tests.hosts import start_hosts, stop_hosts
    from tests.marketplace.test_bids import BIDDABLE

    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)  # a transactional test before this one flushed the seeded rows
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=False, listing=BIDDABLE)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


def test_order_bids_for_a_hosts_interruptible_offer_and_a_bid_below_the_minimum_exits_1(broker_cli, biddable_hosts):
    from marketplace.models import Offer

    offer = Offer.objects.get(zone="fra-h100-1", gpu_count=4, pricing_model="spot")

    low = broker_cli("order", "--offer", str(offer.pk), "--bid", "0.5", "--no-failover")
    assert low.returncode == 1 and "bid_below_minimum" in low.stderr and "0.9000" in low.stderr
    assert not Order.objects.exists()

    placed = _json(broker_cli("order", "--offer", str(offer.pk), "--bid", "1.1", "--no-failover", "--json"))
    # The amount arrives as typed, not as a binary float's expansion, and the order pays it per GPU-hour.
    assert placed["bid_per_gpu_hour"].rstrip("0") == "1.1"
    assert Order.objects.get().bid_per_gpu_hour == Decimal("1.1")
    assert broker_cli("order", "--offer", str(offer.pk), "--bid", "1e3").returncode == 2


def test_stop_start_restart_and_logs_from_the_shell(broker_cli, broker, t4_offer):
    from providers.services import adapter_for_account

    order = _running(broker, t4_offer)
    stoppable = adapter_for_account(t4_offer[0].account).stoppable

    stopped = broker_cli("stop", order["id"], "--json")
    if stoppable:
        assert _json(stopped)["state"] in ("stopping", "stopped")
        assert list(broker.watch(order["id"], until=["stopped"], timeout=60, interval=0.2))[-1]["state"] == "stopped"
        assert _json(broker_cli("start", order["id"], "--json"))["state"] in ("starting", "running")
    else:
        # A cloud whose adapter cannot stop yet says so, by code, and nothing changed.
        assert stopped.returncode == 1 and "action_unsupported" in stopped.stderr
        assert broker.order_get(order["id"])["state"] == "running"
        restarted = broker_cli("restart", order["id"])
        assert restarted.returncode == 1 and "action_unsupported" in restarted.stderr

    logs = broker_cli("logs", order["id"], "--lines", "5")
    assert logs.returncode == 0, logs.stderr
    assert len(logs.stdout.splitlines()) <= 5
    assert broker_cli("logs", order["id"], "--lines", "0").returncode == 2
    assert broker_cli("logs", order["id"], "--lines", "1001").returncode == 2
    assert _json(broker_cli("logs", order["id"], "--json")).keys() == {"lines", "at", "source"}
    assert broker_cli("start", str(uuid.uuid4())).returncode == 1  # no such order


def test_a_workloads_control_characters_are_shown_not_obeyed():
    from brokerclient.cli import _printable

    assert _printable("ok\x1b[2J\tdone\x07") == "ok\\x1b[2J\tdone\\x07"
