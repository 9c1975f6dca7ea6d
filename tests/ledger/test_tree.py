"""The stored subtree hashes give the same roots and proofs as the leaves do, reading a few hundred hashes."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger import merkle
from ledger.checkpoints import checkpoint_create, consistency_proof, inclusion_proofs
from ledger.models import LedgerEntry, SubtreeHash
from ledger.services import ledger_append
from ledger.tree import ProofUnavailable, StoredTree, subtree_hashes_extend

pytestmark = pytest.mark.django_db

# Past 256 x 256 leaves, so blocks of the second stored level (65,536 leaves) are used too.
BIG = 65_536 + 3 * 256 + 45


def _leaf(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(8, "big")).digest()


@pytest.fixture
def leaves() -> list[bytes]:
    """BIG entries written straight to the table: these tests need only their sequences and leaf hashes."""
    if connection.vendor == "postgresql":
        # One statement, the hashes computed by the server (int8send is the big-endian 8 bytes of ``_leaf``):
        # the ORM's bulk insert of these rows took about ten seconds per test on a busy CI machine.
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {LedgerEntry._meta.db_table} "  # noqa: S608 - our table
                "(sequence, kind, subject, payload, payload_hash, prev_hash, entry_hash, leaf_hash, created_at) "
                "SELECT i + 1, 't', 's', '{}', '', '', lpad(to_hex(i), 64, '0'), encode(sha256(int8send(i)), 'hex'), "
                "now() FROM generate_series(0::bigint, %s) AS i",
                [BIG - 1],
            )
    else:
        now = timezone.now()
        LedgerEntry.objects.bulk_create(
            (
                LedgerEntry(
                    sequence=i + 1,
                    kind="t",
                    subject="s",
                    payload="{}",
                    payload_hash="",
                    prev_hash="",
                    entry_hash=f"{i:064x}",
                    leaf_hash=_leaf(i).hex(),
                    created_at=now,
                )
                for i in range(BIG)
            ),
            batch_size=5_000,
        )
    return [_leaf(i) for i in range(BIG)]


SIZES = [1, 2, 255, 256, 257, 1_000, 65_535, 65_536, 65_537, BIG]


def test_roots_and_proofs_match_the_leaves_before_and_after_the_hashes_are_stored(leaves):
    def check() -> None:
        tree = StoredTree()
        for size in SIZES:
            assert tree.root(size) == merkle.root_from_hashes(leaves[:size]), size
        for index, size in [(0, BIG), (255, BIG), (256, 65_537), (65_535, BIG), (65_536, BIG), (BIG - 1, BIG)]:
            assert merkle.inclusion_path(index, size, tree) == merkle.inclusion_proof_from_hashes(index, leaves[:size])
        for old, new in [(1, BIG), (256, BIG), (300, 65_536), (65_536, BIG), (65_537, BIG), (BIG, BIG)]:
            assert merkle.consistency_path(old, new, tree) == merkle.consistency_proof_from_hashes(old, leaves[:new])

    check()  # nothing stored: every block is computed from below
    assert subtree_hashes_extend(BIG) == BIG // 256 + 1  # 259 tiles of 256 leaves, one of 65,536
    assert SubtreeHash.objects.filter(level=16).count() == 1
    check()
    assert subtree_hashes_extend(BIG) == 0  # already there
    SubtreeHash.objects.filter(level=8, index=100).delete()  # a missing hash is computed again, not trusted
    check()


def test_a_proof_reads_a_few_hundred_hashes_not_every_leaf(leaves):
    subtree_hashes_extend(BIG)
    with CaptureQueriesContext(connection) as queries:
        path = merkle.inclusion_path(66_000, BIG, StoredTree())
    assert path == merkle.inclusion_proof_from_hashes(66_000, leaves)
    assert len(queries) < 40
    read = sum(1 for q in queries.captured_queries if "ledger_subtreehash" in q["sql"])
    assert read >= 1  # the stored hashes were used


def test_the_store_grows_with_the_ledger_and_each_extension_reads_only_new_leaves(leaves):
    subtree_hashes_extend(1_000)
    assert SubtreeHash.objects.filter(level=8).count() == 3
    with CaptureQueriesContext(connection) as queries:
        subtree_hashes_extend(2_000)
    assert SubtreeHash.objects.filter(level=8).count() == 7
    (leaf_read,) = [q["sql"] for q in queries.captured_queries if "ledger_ledgerentry" in q["sql"]]
    assert '"sequence" > 768' in leaf_read and '"sequence" <= 1792' in leaf_read
    assert StoredTree().root(2_000) == merkle.root_from_hashes(leaves[:2_000])


def test_a_missing_leaf_a_proof_needs_is_named():
    for i in range(3):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=f"thing:{i}", payload={"i": i})
    from tests.ledger.tamper import triggers_bypassed

    with triggers_bypassed() as cursor:
        cursor.execute("DELETE FROM ledger_ledgerentry WHERE sequence = 2")
    with pytest.raises(ProofUnavailable, match="a gap"):
        StoredTree().root(3)


def test_checkpoints_store_the_hashes_and_their_proofs_verify():
    for i in range(300):
        with transaction.atomic():
            ledger_append(kind="test.event", subject=f"thing:{i}", payload={"i": i})
    first = checkpoint_create()
    assert SubtreeHash.objects.filter(level=8).count() == 1
    with transaction.atomic():
        ledger_append(kind="test.event", subject="thing:300", payload={"i": 300})
    second = checkpoint_create()
    (proof,) = inclusion_proofs([257], second)
    root = bytes.fromhex(second.root_hash)
    assert merkle.verify_inclusion(
        bytes.fromhex(proof.leaf_hash), 256, second.size, [bytes.fromhex(p) for p in proof.path], root
    )
    consistency = [bytes.fromhex(p) for p in consistency_proof(first.size, second.size)]
    assert merkle.verify_consistency(first.size, second.size, bytes.fromhex(first.root_hash), root, consistency)
