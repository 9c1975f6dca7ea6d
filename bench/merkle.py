"""Benchmark: the ledger's Merkle tree over a million leaves, against the bare hashing it cannot avoid.

    .venv/bin/python bench/merkle.py [--leaves 1000000] [--runs 3]

A tree of n leaves needs n - 1 node hashes whatever the code around them does. The baseline runs exactly
that many SHA-256 calls over 65-byte inputs in a tight loop, in this run, so the ratio says how much our
code costs beyond hashlib itself. Timed: the root of n leaf hashes (what a checkpoint computes from the
stored ``leaf_hash`` column), the root of n raw entries (leaf hashing included), one inclusion and one
consistency proof, and verifying each. Goal (issue 6): a million leaves in well under a second per root.
Medians of ``--runs``; no database.
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

from ledger import merkle  # noqa: E402


def _median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _bare_node_hashes(count: int) -> None:
    block = b"\x01" + bytes(64)
    sha256 = hashlib.sha256
    for _ in range(count):
        sha256(block).digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leaves", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n, runs = args.leaves, args.runs
    entries = [f"entry {i}".encode() for i in range(n)]
    hashes = [merkle.leaf_hash(e) for e in entries]
    print(f"{n:,} leaves, median of {runs} runs")

    baseline = _median_s(lambda: _bare_node_hashes(n - 1), runs)
    print(f"baseline: {n - 1:,} bare SHA-256 node hashes        {baseline * 1000:8.0f} ms")

    root_s = _median_s(lambda: merkle.root_from_hashes(hashes), runs)
    print(f"root of {n:,} leaf hashes                     {root_s * 1000:8.0f} ms   {root_s / baseline:5.2f}x baseline")
    raw_s = _median_s(lambda: merkle.root(entries), runs)
    print(f"root of {n:,} raw entries (leaf hashing too)  {raw_s * 1000:8.0f} ms   {raw_s / baseline:5.2f}x baseline")

    root = merkle.root_from_hashes(hashes)
    index, old = n // 3, n // 2 + 7
    inclusion: list[bytes] = []
    consistency: list[bytes] = []

    def build_inclusion() -> None:
        inclusion[:] = merkle.inclusion_proof_from_hashes(index, hashes)

    def build_consistency() -> None:
        consistency[:] = merkle.consistency_proof_from_hashes(old, hashes)

    inc_s = _median_s(build_inclusion, runs)
    print(f"inclusion proof of leaf {index:,}               {inc_s * 1000:8.0f} ms   {inc_s / baseline:5.2f}x baseline")
    con_s = _median_s(build_consistency, runs)
    print(f"consistency proof from {old:,}              {con_s * 1000:8.0f} ms   {con_s / baseline:5.2f}x baseline")
    old_root = merkle.root_from_hashes(hashes[:old])
    assert merkle.verify_inclusion(hashes[index], index, n, inclusion, root)
    assert merkle.verify_consistency(old, n, old_root, root, consistency)
    verify_s = _median_s(lambda: merkle.verify_inclusion(hashes[index], index, n, inclusion, root), runs)
    print(f"verify the inclusion proof ({len(inclusion)} hashes)          {verify_s * 1e6:8.0f} us")
    print(f"goal: a root of a million leaves well under 1 s: {'met' if root_s < 1.0 else 'NOT met'} ({root_s:.2f} s)")


if __name__ == "__main__":
    main()
