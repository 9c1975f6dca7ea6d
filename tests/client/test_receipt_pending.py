"""A receipt asked for right after a change: its newest entries are not in a signed checkpoint yet. That is
pending, not tampered: the API says so (``status``, ``first_pending``, ``signed_size``, ``Retry-After``), the
CLI exits 4 with its own message (3 stays "did not verify"), ``--wait`` asks again until the entries verify, and
asking makes the broker sign promptly, once per burst of requests (and at most once per
``PROMPT_SIGNING_SPACING_S``).

Tasks run eagerly in tests (tests/conftest.py), so the prompt signing runs inside the request that queued it,
after its answer was built: the next look finds the entries covered. The state is what drives each test."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

import pytest
from brokerclient import BrokerClient
from brokerclient.verify import verify_receipt
from celery.signals import task_prerun
from django.db import connection, transaction

from ledger.checkpoints import (
    checkpoint_create,
    checkpoint_sign_claim,
    checkpoint_sign_release,
    ledger_checkpoint_and_anchor,
)
from ledger.keys import verifier_key
from ledger.models import Checkpoint, LedgerEntry
from ledger.services import SEQUENCER_LOCK_KEY, ledger_append, ledger_sequence
from tests.client.conftest import CLIENT_DIR
from tests.races import advisory_lock_held, require_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_prompt_signing_claimed():
    """The claim lives in the cache, which outlives a test's database."""
    checkpoint_sign_release()
    yield
    checkpoint_sign_release()


@pytest.fixture
def broker_cli(live_server, token, machines_phone_home):
    env = {**os.environ, "BROKER_URL": live_server.url, "BROKER_TOKEN": token, "PYTHONPATH": str(CLIENT_DIR)}
    env.pop("BROKER_VERIFIER_KEY", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brokerclient", *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture
def order_id(broker, t4_offer) -> str:
    """A running order whose every entry so far is in a signed checkpoint."""
    offer, cap = t4_offer
    order = broker.order(offer=offer.pk, max_price_per_hour=cap)
    seen = list(broker.watch(order["id"], until=["running"], timeout=60, interval=0.2))
    assert seen[-1]["state"] == "running"
    ledger_checkpoint_and_anchor()
    return str(order["id"])


def _newest_signed_size() -> int:
    return Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0


def _change(order_id: str) -> tuple[int, int]:
    """Something happens to the order: one new entry, which no checkpoint covers yet. Its sequence, and the
    newest signed size."""
    with transaction.atomic():
        entry_id = ledger_append(kind="test.note", subject=f"order:{order_id}", payload={"note": "changed"})
    ledger_sequence()  # as the sequencer process does moments after the commit
    sequence = LedgerEntry.objects.get(pk=entry_id).sequence
    assert sequence is not None
    return sequence, _newest_signed_size()


def test_the_api_says_pending_with_the_entry_and_the_signed_size_and_signs_promptly(broker, order_id):
    sequence, signed = _change(order_id)

    answer = broker.request("GET", f"orders/{order_id}/receipt")

    assert answer.status == 200 and answer.headers["Retry-After"] == "2"
    body = answer.body
    assert (body["status"], body["first_pending"], body["signed_size"]) == ("pending", sequence, signed)
    assert [e["sequence"] for e in body["pending"]] == [sequence]
    assert body["entries"] and all(e["sequence"] <= signed for e in body["entries"])
    # Asking signed a checkpoint that covers the entry, without waiting for the periodic one.
    assert _newest_signed_size() == sequence
    again = broker.request("GET", f"orders/{order_id}/receipt")
    assert (again.body["status"], again.body["first_pending"]) == ("complete", None)
    assert "Retry-After" not in again.headers


def test_a_receipt_with_an_entry_not_yet_sequenced_exits_4_as_pending(broker_cli, order_id):
    require_postgresql()
    with advisory_lock_held(SEQUENCER_LOCK_KEY):  # the sequencer is busy elsewhere: the new entry stays queued
        with transaction.atomic():
            ledger_append(kind="test.note", subject=f"order:{order_id}", payload={"note": "queued"})
        result = broker_cli("receipt", order_id, "--verify", "--key", verifier_key(), "--json")

    assert result.returncode == 4, result.stdout + result.stderr
    assert "1 newer entries are queued, not yet sequenced into the chain" in result.stderr
    body = json.loads(result.stdout)
    assert [e["kind"] for e in body["receipt"]["queued"]] == ["test.note"]
    assert body["verification"]["queued_entries"] == 1 and body["verification"]["verdict"] == "pending"
    assert [c["name"] for c in body["verification"]["checks"] if not c["ok"]] == []
    # Once the sequencer is free, asking again chains it: pending now only for the next signed checkpoint (the
    # prompt signing the first ask claimed is spaced, PROMPT_SIGNING_SPACING_S).
    again = broker_cli("receipt", order_id, "--verify", "--key", verifier_key())
    sequence = LedgerEntry.objects.get(subject=f"order:{order_id}", kind="test.note").sequence
    assert again.returncode == 4 and sequence is not None
    assert f"pending: entry {sequence} is not yet in a signed checkpoint" in again.stderr
    assert "queued" not in again.stderr


def test_a_receipt_of_an_unsigned_entry_exits_4_as_pending_not_3(broker_cli, order_id):
    sequence, signed = _change(order_id)

    result = broker_cli("receipt", order_id, "--verify", "--key", verifier_key(), "--json")

    assert result.returncode == 4, result.stdout + result.stderr
    message = f"pending: entry {sequence} is not yet in a signed checkpoint (newest signed size {signed})"
    assert f"broker: {message}; ask again, or wait for it with --wait\n" == result.stderr
    verification = json.loads(result.stdout)["verification"]
    assert (verification["verdict"], verification["first_pending"], verification["signed_size"]) == (
        "pending",
        sequence,
        signed,
    )
    # What the checkpoint covers was verified in full.
    assert [c["name"] for c in verification["checks"] if not c["ok"]] == []
    assert verification["verified_entries"] == len(json.loads(result.stdout)["receipt"]["entries"]) > 0

    readable_sequence, readable_signed = _change(order_id)
    readable = broker_cli("receipt", order_id, "--verify", "--key", verifier_key())
    assert readable.returncode == 4
    proven = LedgerEntry.objects.filter(subject=f"order:{order_id}", sequence__lte=readable_signed).count()
    assert (
        f"receipt PENDING: entry {readable_sequence} is not yet in a signed checkpoint (newest signed size "
        f"{readable_signed}); the {proven} entries before it proven against a checkpoint signed by the pinned key"
        in readable.stdout
    )


def test_a_tampered_receipt_still_exits_3_while_entries_are_pending(broker_cli, broker, order_id, tmp_path):
    sequence, _signed = _change(order_id)
    receipt = broker.receipt(order_id)
    assert receipt["status"] == "pending"
    key = verifier_key()
    saved = tmp_path / "receipt.json"

    changed = json.loads(json.dumps(receipt))
    changed["entries"][0]["payload"] += " "
    saved.write_text(json.dumps(changed))
    result = broker_cli("receipt", "--file", str(saved), "--verify", "--key", key)
    assert result.returncode == 3, result.stdout
    assert f"receipt FAILED: payload (entry #{receipt['entries'][0]['sequence']})" in result.stdout

    # A covered entry passed off as pending, so that its proof is never checked.
    hidden = json.loads(json.dumps(receipt))
    moved = hidden["entries"].pop()
    hidden["pending"].insert(0, {k: v for k, v in moved.items() if k != "inclusion_proof"})
    saved.write_text(json.dumps(hidden))
    result = broker_cli("receipt", "--file", str(saved), "--verify", "--key", key)
    assert result.returncode == 3, result.stdout
    assert f"receipt FAILED: pending (entry #{moved['sequence']}): listed as pending, but the signed" in result.stdout

    saved.write_text(json.dumps(receipt))
    untouched = broker_cli("receipt", "--file", str(saved), "--verify", "--key", key)
    assert untouched.returncode == 4 and f"pending: entry {sequence} " in untouched.stderr


def test_wait_exits_0_once_the_checkpoint_it_asked_for_is_signed(broker_cli, order_id):
    sequence, _signed = _change(order_id)

    result = broker_cli("receipt", order_id, "--verify", "--key", verifier_key(), "--wait", "30", "--interval",
                        "0.1", "-v")  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    # The first look was pending; asking had the broker sign; the next look verified.
    assert f"pending: entry {sequence} is not yet in a signed checkpoint" in result.stderr
    assert "receipt VERIFIED" in result.stdout
    assert f"entry #{sequence} test.note recomputed and included" in result.stdout


def test_wait_gives_up_at_its_deadline_with_the_pending_code(broker_cli, order_id):
    sequence, signed = _change(order_id)
    # A prompt signing is already under way, as far as the broker knows, and never finishes.
    assert checkpoint_sign_claim(hold_s=300)
    before = Checkpoint.objects.count()

    result = broker_cli("receipt", order_id, "--verify", "--key", verifier_key(), "--wait", "0.5", "--interval",
                        "0.1")  # fmt: skip

    assert result.returncode == 4, result.stdout + result.stderr
    message = f"pending: entry {sequence} is not yet in a signed checkpoint (newest signed size {signed})"
    assert result.stderr == f"broker: {message} after waiting 0.5s\n"
    assert Checkpoint.objects.count() == before


def test_wait_is_for_a_fetched_receipt_that_is_verified(broker_cli, order_id, tmp_path):
    saved = tmp_path / "receipt.json"
    saved.write_text("{}")
    assert broker_cli("receipt", order_id, "--wait").returncode == 2
    assert broker_cli("receipt", "--file", str(saved), "--verify", "--wait", "5").returncode == 2
    assert broker_cli("receipt", order_id, "--verify", "--interval", "1").returncode == 2


def test_a_burst_of_receipt_requests_makes_one_signing(live_server, token, order_id):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent signers need PostgreSQL; SQLite serialises every write")
    burst = 6
    signings: list[str] = []

    def count(sender=None, **_kwargs) -> None:
        if sender is not None and sender.name == "ledger.checkpoint_sign":
            signings.append(sender.name)

    task_prerun.connect(count, weak=False)
    answers: queue.Queue[object] = queue.Queue()
    barrier = threading.Barrier(burst)

    def ask() -> None:
        try:
            with BrokerClient(live_server.url, token, timeout=60, retries=0) as client:
                barrier.wait()
                answers.put(client.request("GET", f"orders/{order_id}/receipt"))
        except BaseException as exc:  # the test reads it from the queue
            answers.put(exc)

    sequence, signed = _change(order_id)
    threads = [threading.Thread(target=ask) for _ in range(burst)]
    try:
        # The periodic signer is at work and holds the signers' turn until this block ends: the one prompt
        # signing the burst queues waits for it, and the other requests answer at once.
        with transaction.atomic():
            periodic = checkpoint_create()
            assert periodic is not None and periodic.size == sequence
            for thread in threads:
                thread.start()
            quick = [answers.get(timeout=30) for _ in range(burst - 1)]
        for thread in threads:
            thread.join(timeout=30)
        last = answers.get(timeout=30)
    finally:
        task_prerun.disconnect(count)

    for answer in [*quick, last]:
        assert not isinstance(answer, BaseException), answer
        assert (answer.body["status"], answer.body["first_pending"], answer.body["signed_size"]) == (
            "pending",
            sequence,
            signed,
        )
    assert signings == ["ledger.checkpoint_sign"]
    # The prompt signing found the periodic one's checkpoint covering the ledger: one checkpoint per size.
    assert list(Checkpoint.objects.filter(size__gt=signed).values_list("size", flat=True)) == [sequence]


def test_the_verifier_calls_a_receipt_without_any_checkpoint_pending(broker, t4_offer):
    offer, cap = t4_offer
    assert Checkpoint.objects.count() == 0
    checkpoint_sign_claim(hold_s=300)  # no prompt signing: the receipt stays as it is
    order = broker.order(offer=offer.pk, max_price_per_hour=cap)

    receipt = broker.receipt(order["id"])
    result = verify_receipt(receipt, trusted_key=verifier_key(), order_id=order["id"])

    assert receipt["checkpoint"] is None and receipt["signed_size"] == 0
    assert result.verdict == "pending" and result.failures == [] and not result.ok
    # The order is still being provisioned: an entry written after the receipt's sequencing may be listed queued.
    assert result.pending_message().startswith(
        f"entry {receipt['pending'][0]['sequence']} is not yet in a signed checkpoint (newest signed size 0)"
    )
    assert result.queued_entries == len(receipt["queued"])
