"""Benchmark: ledger proofs and checkpoint roots from the stored subtree hashes, against reading every leaf.

    .venv/bin/python bench/proofs.py [--entries 1000000] [--runs 5]
        [--database postgres://postgres@127.0.0.1:5432/broker_bench_proofs]

Fills its own database with ``--entries`` ledger rows (COPY, once; reused while the count matches), then times,
medians of ``--runs``, each against the way the broker computed it before ``ledger.tree``, in the same run:

- a checkpoint's root after 1,000 new entries: every leaf read and hashed (the baseline), against extending
  the stored hashes with the new leaves and folding the root from them, as ``checkpoint_create`` does;
- then, against that checkpoint, an inclusion proof for an entry near the end (every leaf hash read and the
  path built from them, against ``StoredTree``) and a consistency proof from the previous checkpoint.

Only the rows' sequences and leaf hashes matter here, so the rows are synthetic, not a valid hash chain.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sync import django_on  # noqa: E402


def _median_s(fn: Callable[[], object], runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _leaf(i: int) -> str:
    return hashlib.sha256(i.to_bytes(8, "big")).hexdigest()


def _fill(entries: int) -> None:
    """Exactly ``entries`` rows in the ledger table (written once, then reused) and no stored hashes."""
    from django.db import connection

    from tests.ledger.tamper import triggers_bypassed

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ledger_ledgerentry")
        (have,) = cursor.fetchone()
    with triggers_bypassed() as cursor:
        cursor.execute("DELETE FROM ledger_subtreehash")
        if have == entries:
            return
        cursor.execute("TRUNCATE ledger_ledgerentry CASCADE")
        columns = "sequence, kind, subject, payload, payload_hash, prev_hash, entry_hash, leaf_hash, created_at"
        with cursor.cursor.copy(f"COPY ledger_ledgerentry ({columns}) FROM STDIN") as copy:
            for i in range(entries):
                copy.write_row((i + 1, "bench", "s", "{}", "", "", f"{i:064x}", _leaf(i), "2026-12-01T00:00:00Z"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_ledgerentry")


def _all_leaves(size: int) -> list[bytes]:
    """The baseline's read: every leaf hash up to ``size``, as checkpoints and proofs read them before."""
    from ledger.models import LedgerEntry

    rows = LedgerEntry.objects.filter(sequence__lte=size).order_by("sequence").values_list("leaf_hash", flat=True)
    return [bytes.fromhex(h) for h in rows.iterator(chunk_size=20_000)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_proofs")
    args = parser.parse_args()
    n, runs = args.entries, args.runs

    django_on(args.database)
    from ledger import merkle
    from ledger.models import SubtreeHash
    from ledger.tree import StoredTree, subtree_hashes_extend

    started = time.perf_counter()
    _fill(n)
    print(f"{n:,} ledger entries ready in {time.perf_counter() - started:.1f} s; medians of {runs} runs")

    checkpoint, later = n - 1_000, n  # a checkpoint, then 1,000 more entries
    started = time.perf_counter()
    written = subtree_hashes_extend(checkpoint)
    print(f"storing the subtree hashes of {checkpoint:,} entries once: {written:,} rows "
          f"in {time.perf_counter() - started:.2f} s")  # fmt: skip

    def stored_root() -> bytes:
        SubtreeHash.objects.filter(index__gte=checkpoint >> 8, level=8).delete()  # as before the new entries
        SubtreeHash.objects.filter(index__gte=checkpoint >> 16, level=16).delete()
        subtree_hashes_extend(later)
        return StoredTree().root(later)

    base_s, base_root = _median_s(lambda: merkle.root_from_hashes(_all_leaves(later)), runs)
    tree_s, tree_root = _median_s(stored_root, runs)
    assert tree_root == base_root, "the stored tree gave another root"
    print(f"checkpoint root:   every leaf {base_s * 1000:8.1f} ms   stored tree {tree_s * 1000:7.2f} ms   "
          f"{base_s / tree_s:7.0f}x faster  (extending the store with the 1,000 new entries included)")  # fmt: skip

    index = later - 500
    base_s, base_path = _median_s(lambda: merkle.inclusion_proof_from_hashes(index, _all_leaves(later)), runs)
    tree_s, tree_path = _median_s(lambda: merkle.inclusion_path(index, later, StoredTree()), runs)
    assert tree_path == base_path, "the stored tree gave another inclusion proof"
    print(f"inclusion proof:   every leaf {base_s * 1000:8.1f} ms   stored tree {tree_s * 1000:7.2f} ms   "
          f"{base_s / tree_s:7.0f}x faster")  # fmt: skip

    base_s, base_proof = _median_s(lambda: merkle.consistency_proof_from_hashes(checkpoint, _all_leaves(later)), runs)
    tree_s, tree_proof = _median_s(lambda: merkle.consistency_path(checkpoint, later, StoredTree()), runs)
    assert tree_proof == base_proof, "the stored tree gave another consistency proof"
    print(f"consistency proof: every leaf {base_s * 1000:8.1f} ms   stored tree {tree_s * 1000:7.2f} ms   "
          f"{base_s / tree_s:7.0f}x faster")  # fmt: skip


if __name__ == "__main__":
    main()
