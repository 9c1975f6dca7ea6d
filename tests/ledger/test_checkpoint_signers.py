"""Who signs checkpoints, and when: the periodic task, and a prompt signing when a buyer asks for a receipt with
entries no checkpoint covers. Signers take turns, so checkpoints come in size order, one per size, whoever
signs; a receipt asked for inside a transaction queues its signing only once that transaction commits."""

from __future__ import annotations

import threading

import pytest
from celery.signals import task_prerun
from django.db import connection, transaction

from ledger.checkpoints import checkpoint_create, checkpoint_sign_release
from ledger.models import Checkpoint
from ledger.receipts import receipt_for_buyer
from ledger.services import ledger_append, ledger_sequence
from ledger.tasks import ledger_checkpoint_sign_task


@pytest.fixture(autouse=True)
def _no_prompt_signing_claimed():
    """The claim lives in the cache, which outlives a test's database."""
    checkpoint_sign_release()
    yield
    checkpoint_sign_release()


def _append(n: int, subject: str = "thing:1") -> None:
    for i in range(n):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=subject, payload={"i": i})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_signer_waits_its_turn_so_checkpoints_come_in_size_order():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent signers need PostgreSQL; SQLite serialises every write")
    _append(3)
    later: list[Checkpoint | None] = []
    errors: list[BaseException] = []

    def append_and_sign() -> None:
        try:
            _append(2, subject="thing:2")
            later.append(checkpoint_create())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    signer = threading.Thread(target=append_and_sign)
    with transaction.atomic():
        first = checkpoint_create()  # signed, not yet committed: this signer's turn lasts until the block ends
        signer.start()
        while signer.is_alive() and not _waiting_on_a_lock():
            signer.join(timeout=0.01)
        signed_out_of_turn = list(later)
    signer.join(timeout=30)

    # Had the second signer committed checkpoint 5 while 3 was uncommitted, a reader following the checkpoints by
    # size (GET /api/v1/ledger/checkpoints?after=5) would never see 3 appear behind it.
    assert signed_out_of_turn == [] and errors == []
    assert first is not None and first.size == 3
    assert [c.size for c in later if c is not None] == [5]
    assert list(Checkpoint.objects.order_by("pk").values_list("size", flat=True)) == [3, 5]


@pytest.mark.django_db
def test_a_second_signer_of_the_same_size_signs_nothing():
    _append(4)

    assert checkpoint_create().size == 4
    assert checkpoint_create() is None
    assert ledger_checkpoint_sign_task.delay().get() is None
    assert list(Checkpoint.objects.values_list("size", flat=True)) == [4]


@pytest.fixture
def signings() -> list[str]:
    """The prompt signings run, in order (tasks run eagerly in tests, in the process that queued them)."""
    ran: list[str] = []

    def count(sender=None, **_kwargs) -> None:
        if sender is not None and sender.name == "ledger.checkpoint_sign":
            ran.append(sender.name)

    task_prerun.connect(count, weak=False)
    yield ran
    task_prerun.disconnect(count)


@pytest.mark.django_db(transaction=True)
def test_asking_for_a_pending_receipt_signs_once_the_asking_transaction_commits(signings):
    _append(2)
    checkpoint_create()
    _append(1)

    with transaction.atomic():
        body = receipt_for_buyer("thing:1")
        assert (body["status"], body["first_pending"], body["signed_size"]) == ("pending", 3, 2)
        transaction.set_rollback(True)
    # Rolled back: nothing queued, nothing claimed.
    assert signings == [] and list(Checkpoint.objects.values_list("size", flat=True)) == [2]

    body = receipt_for_buyer("thing:1")

    assert (body["status"], body["first_pending"]) == ("pending", 3)  # the answer is what the ledger held
    assert signings == ["ledger.checkpoint_sign"]
    assert list(Checkpoint.objects.values_list("size", flat=True)) == [2, 3]
    covered = receipt_for_buyer("thing:1")
    assert (covered["status"], covered["first_pending"], covered["signed_size"]) == ("complete", None, 3)


@pytest.mark.django_db(transaction=True)
def test_prompt_signings_are_spaced_however_often_buyers_ask(signings):
    _append(1)
    receipt_for_buyer("thing:1")
    assert signings == ["ledger.checkpoint_sign"]

    # Within PROMPT_SIGNING_SPACING_S of that signing, asking again queues none: checkpoints (and their anchors
    # on the chain) do not multiply with buyers polling a busy ledger. The periodic signing still comes.
    _append(1)
    for _ in range(3):
        assert receipt_for_buyer("thing:1")["first_pending"] == 2
    assert signings == ["ledger.checkpoint_sign"] and list(Checkpoint.objects.values_list("size", flat=True)) == [1]

    checkpoint_sign_release()  # as when the spacing has passed
    receipt_for_buyer("thing:1")
    assert signings == ["ledger.checkpoint_sign"] * 2
    assert list(Checkpoint.objects.values_list("size", flat=True)) == [1, 2]
