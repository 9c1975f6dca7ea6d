"""The ledger's Merkle tree, read through stored subtree hashes instead of every leaf.

Every ``TILE_HEIGHT`` levels up the tree the root of each complete, aligned block of leaves is kept as a
``SubtreeHash``: level 8 holds one per 256 leaves, level 16 one per 65,536, and so on. Any subtree an RFC 6962
root or proof needs splits into perfect aligned blocks (``StoredTree``), and each block's root is computed from
fewer than 2**TILE_HEIGHT hashes of the highest stored level it spans, or from its leaves when it is smaller
than a tile. A root or a proof over n leaves thus reads O(2**TILE_HEIGHT x log n) hashes, not n.

The stored hashes are derived data, filled by ``subtree_hashes_extend`` when a checkpoint is signed. Where one
is missing it is computed from the level below, so a proof never depends on the store being complete; and
``ledger verify`` recomputes everything from the entries without reading it.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from ledger import merkle
from ledger.models import LedgerEntry, SubtreeHash

TILE_HEIGHT = 8
_TILE_WIDTH = 1 << TILE_HEIGHT
_MAX_LEVEL = 64


class ProofUnavailable(ValueError):
    """The proof asked for does not exist (an entry beyond the checkpoint, sizes out of order, a missing entry)."""


def leaf_hashes(start: int, count: int) -> list[bytes]:
    """The leaf hashes of entries ``start + 1`` to ``start + count`` (leaf indexes from 0, sequences from 1)."""
    rows = LedgerEntry.objects.filter(sequence__gt=start, sequence__lte=start + count).order_by("sequence")
    leaves = [bytes.fromhex(h) for h in rows.values_list("leaf_hash", flat=True).iterator(chunk_size=20_000)]
    if len(leaves) != count:
        raise ProofUnavailable(f"the ledger has {len(leaves)} entries from #{start + 1} to #{start + count}: a gap")
    return leaves


def subtree_hashes_extend(size: int) -> int:
    """Store the root of every complete block among the first ``size`` leaves that is not stored yet, level by
    level; returns how many were written. Reads only the leaves past the last stored block. Safe to run
    concurrently: two writers of one block write the same hash, and the second's row is dropped."""
    written = 0
    level = TILE_HEIGHT
    with transaction.atomic():
        while level < _MAX_LEVEL and size >> level:
            complete = size >> level
            newest = SubtreeHash.objects.filter(level=level).aggregate(newest=Max("index"))["newest"]
            start = 0 if newest is None else newest + 1
            if start < complete:
                below = _level_hashes(level - TILE_HEIGHT, start << TILE_HEIGHT, (complete - start) << TILE_HEIGHT)
                rows = [
                    SubtreeHash(level=level, index=start + i, hash=root.hex())
                    for i, root in enumerate(_tile_roots(below))
                ]
                SubtreeHash.objects.bulk_create(rows, batch_size=5_000, ignore_conflicts=True)
                written += len(rows)
            level += TILE_HEIGHT
    return written


class StoredTree:
    """``merkle.SubtreeRoot`` over the ledger's stored hashes: MTH(D[lo:hi]) for the proof walks.

    One instance serves one request: it remembers the blocks it has computed, as the inclusion proofs of
    neighbouring entries share most of their path.
    """

    def __init__(self) -> None:
        self._blocks: dict[tuple[int, int], bytes] = {}

    def __call__(self, lo: int, hi: int) -> bytes:
        # The RFC's tree over [lo, hi) is its perfect aligned blocks, largest first, folded from the right.
        blocks = []
        while lo < hi:
            width = lo & -lo if lo else 1 << ((hi - lo).bit_length() - 1)  # the largest aligned at lo...
            while lo + width > hi:
                width >>= 1  # ...that fits
            blocks.append(self._block(lo, width))
            lo += width
        root = blocks[-1]
        for left in reversed(blocks[:-1]):
            root = merkle.node_hash(left, root)
        return root

    def root(self, size: int) -> bytes:
        return self(0, size) if size else merkle.EMPTY_ROOT

    def _block(self, lo: int, width: int) -> bytes:
        if (lo, width) not in self._blocks:
            level = (width.bit_length() - 1) // TILE_HEIGHT * TILE_HEIGHT
            self._blocks[lo, width] = merkle.root_from_hashes(_level_hashes(level, lo >> level, width >> level))
        return self._blocks[lo, width]


def _level_hashes(level: int, start: int, count: int) -> list[bytes]:
    """The hashes at ``level`` of blocks ``start`` to ``start + count - 1`` (level 0: the leaf hashes)."""
    if level == 0:
        return leaf_hashes(start, count)
    stored = SubtreeHash.objects.filter(level=level, index__gte=start, index__lt=start + count)
    found = dict(stored.values_list("index", "hash"))
    if len(found) == count:
        return [bytes.fromhex(found[i]) for i in range(start, start + count)]
    return _tile_roots(_level_hashes(level - TILE_HEIGHT, start << TILE_HEIGHT, count << TILE_HEIGHT))


def _tile_roots(hashes: list[bytes]) -> list[bytes]:
    """The root of each run of 2**TILE_HEIGHT ``hashes``: the level above them."""
    return [merkle.root_from_hashes(hashes[i : i + _TILE_WIDTH]) for i in range(0, len(hashes), _TILE_WIDTH)]
