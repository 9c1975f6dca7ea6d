"""RFC 6962 / RFC 9162 Merkle trees over SHA-256: tree heads, inclusion and consistency proofs, and their checks.

Pure standard library and no Django, so a client can verify what the ledger publishes with this one file.

The tree is the one the RFCs define (RFC 9162 section 2.1.1, the same as RFC 6962 section 2.1)::

    MTH({})      = SHA-256()                                     the empty tree
    MTH({d(0)})  = SHA-256(0x00 || d(0))                         a leaf
    MTH(D[n])    = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))   k = the largest power of two < n

Two families of builders:

* ``root``, ``inclusion_proof``, ``consistency_proof`` take the raw entry bytes and apply the leaf prefix
  themselves;
* ``root_from_hashes``, ``inclusion_proof_from_hashes``, ``consistency_proof_from_hashes`` take leaf hashes
  that were computed earlier (``leaf_hash``), which is what the ledger keeps in its database;
* ``inclusion_path`` and ``consistency_path`` take a function that answers for subtree roots, so a store of
  precomputed subtree hashes can serve a proof without reading every leaf.

Builders raise ``ValueError`` for arguments that name no tree or no proof (an index past the end, an old size
larger than the tree), and ``TypeError`` for a leaf hash that is not ``bytes``. The verifiers never raise: any
input they cannot make sense of is simply a proof that does not verify, so they return ``False``.

Nothing here recurses over the leaves. Subtree roots are computed level by level, and the proofs walk down the
RFC's recursion with a loop, computing only the O(log n) subtree roots they need: a root, an inclusion proof or
a consistency proof each costs at most about n hash calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TypeGuard

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "SubtreeRoot",
    "consistency_path",
    "consistency_proof",
    "consistency_proof_from_hashes",
    "inclusion_path",
    "inclusion_proof",
    "inclusion_proof_from_hashes",
    "leaf_hash",
    "node_hash",
    "root",
    "root_from_hashes",
    "roots_at",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
"""Bytes in a SHA-256 digest: every leaf hash, node hash, root and proof element has this length."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""MTH({}): the root of the tree with no leaves."""

# RFC 9162 tree sizes and indexes are uint64. Refusing larger numbers also bounds the verifiers' loops.
_MAX_SIZE = 2**64 - 1
# More elements than any valid proof in such a tree has (at most one per level, plus the old root that
# verify_consistency puts in front); a longer one is refused before it is even copied.
_MAX_PROOF_LEN = 2 * 64

SubtreeRoot = Callable[[int, int], bytes]
"""``f(lo, hi)`` = MTH(D[lo:hi]): how the proof walks get the subtree roots they need."""

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    """The hash of one leaf: SHA-256(0x00 || data)."""
    return hashlib.sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


# --- Builders ------------------------------------------------------------------------------------------------


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of the raw entries ``leaves``; ``EMPTY_ROOT`` for no entries."""
    return root_from_hashes(_hash_leaves(leaves))


def root_from_hashes(hashes: Sequence[bytes]) -> bytes:
    """The tree head of a tree whose leaf hashes are ``hashes``; ``EMPTY_ROOT`` for none."""
    level = _hash_list(hashes)
    if not level:
        return EMPTY_ROOT
    return _subtree_root(level, 0, len(level))


def roots_at(leaves: Sequence[bytes], sizes: Iterable[int]) -> dict[int, bytes]:
    """The RFC 6962 root of the leaf hashes ``leaves[:size]`` for each size in ``sizes`` within ``leaves``, in
    one pass.

    Keeps the perfect subtrees the leaves so far fall into (largest first, as the RFC's split puts them); the
    root of the leaves so far folds them from the right. So a bundle with many checkpoints costs one pass over
    the leaves plus O(log n) per checkpoint, not one full root per checkpoint.
    """
    wanted = sorted({s for s in sizes if 0 < s <= len(leaves)})
    roots: dict[int, bytes] = {}
    stack: list[tuple[bytes, int]] = []  # (subtree root, number of leaves in it)
    position = 0
    for count, leaf in enumerate(leaves, start=1):
        if position == len(wanted):
            break
        node, width = leaf, 1
        while stack and stack[-1][1] == width:
            left, _ = stack.pop()
            node, width = node_hash(left, node), 2 * width
        stack.append((node, width))
        if wanted[position] == count:
            acc = stack[-1][0]
            for left, _ in reversed(stack[:-1]):
                acc = node_hash(left, acc)
            roots[count] = acc
            position += 1
    return roots


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, D[n]) (RFC 6962 section 2.1.1): the audit path of entry ``index`` among the raw ``leaves``.

    The path runs from the leaf's sibling up to the root's child. Raises ``ValueError`` unless
    ``0 <= index < len(leaves)``.
    """
    _check_index(index, len(leaves))
    return inclusion_proof_from_hashes(index, _hash_leaves(leaves))


def inclusion_proof_from_hashes(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    """``inclusion_proof`` for a tree given by its leaf hashes."""
    level = _hash_list(hashes)
    _check_index(index, len(level))
    return inclusion_path(index, len(level), lambda lo, hi: _subtree_root(level, lo, hi))


def inclusion_path(index: int, size: int, subtree_root: SubtreeRoot) -> list[bytes]:
    """PATH(index, D[size]) with every subtree root asked of ``subtree_root(lo, hi)`` = MTH(D[lo:hi]).

    The walk is the same whoever computes the roots: in memory from the leaf hashes, or from a store of
    precomputed subtree hashes (the ledger's ``ledger.tree``). It asks only for ranges the RFC's recursion
    makes, whose ``lo`` is a multiple of the largest power of two below ``hi - lo``.
    """
    _check_index(index, size)
    # PATH(m, D[lo:hi]) = PATH(m, D[lo:mid]) : MTH(D[mid:hi])  when m < mid
    #                   = PATH(m, D[mid:hi]) : MTH(D[lo:mid])  otherwise
    # Walk down from the whole tree, noting each sibling subtree's root; the deepest one comes first.
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        mid = lo + _split(hi - lo)
        if index < mid:
            path.append(subtree_root(mid, hi))
            hi = mid
        else:
            path.append(subtree_root(lo, mid))
            lo = mid
    path.reverse()
    return path


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, D[n]) (RFC 6962 section 2.1.2): proves the first ``old_size`` raw ``leaves`` are a prefix.

    ``old_size == len(leaves)`` gives the empty proof, as the RFC's SUBPROOF(m, D[m], true) does.
    ``old_size == 0`` raises ``ValueError``: the RFC defines PROOF(m, D[n]) only for 0 < m, since every tree
    extends the empty one and there is nothing to prove, and ``verify_consistency`` refuses an old size of 0
    rather than accept a proof that proves nothing. Callers holding the empty tree head need no proof.
    Raises ``ValueError`` unless ``0 < old_size <= len(leaves)``.
    """
    _check_old_size(old_size, len(leaves))
    return consistency_proof_from_hashes(old_size, _hash_leaves(leaves))


def consistency_proof_from_hashes(old_size: int, hashes: Sequence[bytes]) -> list[bytes]:
    """``consistency_proof`` for a tree given by its leaf hashes."""
    level = _hash_list(hashes)
    _check_old_size(old_size, len(level))
    return consistency_path(old_size, len(level), lambda lo, hi: _subtree_root(level, lo, hi))


def consistency_path(old_size: int, size: int, subtree_root: SubtreeRoot) -> list[bytes]:
    """PROOF(old_size, D[size]) with every subtree root asked of ``subtree_root``, as ``inclusion_path`` does."""
    _check_old_size(old_size, size)
    # SUBPROOF(m, D[lo:hi], b), with m the absolute old size, lo < m <= hi:
    #   m == hi:  {} if b, else {MTH(D[lo:hi])}
    #   m <= mid: SUBPROOF(m, D[lo:mid], b)     : MTH(D[mid:hi])
    #   m > mid:  SUBPROOF(m, D[mid:hi], false) : MTH(D[lo:mid])
    # b stays true while the old tree is the whole left part of the current range: then the verifier already
    # has that subtree's root (it is the old root) and the proof leaves it out.
    proof: list[bytes] = []
    lo, hi = 0, size
    whole_old_tree = True
    while old_size != hi:
        mid = lo + _split(hi - lo)
        if old_size <= mid:
            proof.append(subtree_root(mid, hi))
            hi = mid
        else:
            proof.append(subtree_root(lo, mid))
            lo = mid
            whole_old_tree = False
    if not whole_old_tree:
        proof.append(subtree_root(lo, hi))
    proof.reverse()
    return proof


# --- Verifiers -----------------------------------------------------------------------------------------------


def verify_inclusion(leaf_hash: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether ``proof`` shows the leaf with hash ``leaf_hash`` at ``index`` in the tree ``size``, ``root``.

    The algorithm of RFC 9162 section 2.1.3.2. ``leaf_hash`` is the leaf's hash (``leaf_hash(entry)``), not
    the entry itself. Returns ``False``, never raises, for anything that is not a valid proof: an index
    outside ``[0, size)``, hashes or proof elements that are not 32-byte ``bytes``, a proof too short or too
    long, numbers that are not ints.
    """
    if not (_is_hash(leaf_hash) and _is_hash(root) and _is_size(index) and _is_size(size)):
        return False
    path = _proof_items(proof)
    if path is None or index >= size:
        return False
    fn, sn = index, size - 1
    r = leaf_hash
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            # If fn was even, it is the last node of its level with no right sibling, carried up unchanged
            # until it becomes a right child (of which p is the left sibling): skip those levels.
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """Whether ``proof`` shows the tree ``old_size``, ``old_root`` is a prefix of the tree ``new_size``, ``new_root``.

    The algorithm of RFC 9162 section 2.1.4.2, which is written for 0 < old_size < new_size, plus the two
    edges it leaves out, decided as the transparency-dev/merkle conformance probes expect:

    * ``old_size == new_size``: true exactly when the proof is empty and the two roots are the same bytes
      (their length is not checked: a tree is consistent with itself, whatever its root);
    * ``old_size == 0``: false. Every tree extends the empty tree, so such a check proves nothing, and a
      caller asking for it has most likely mixed up its tree heads.

    Returns ``False``, never raises, for anything that is not a valid proof: ``old_size > new_size``, negative
    or non-int sizes, roots or proof elements that are not 32-byte ``bytes``, a proof too short or too long.
    """
    if not (_is_size(old_size) and _is_size(new_size)):
        return False
    if not (isinstance(old_root, bytes) and isinstance(new_root, bytes)):
        return False
    path = _proof_items(proof)
    if path is None or old_size == 0 or old_size > new_size:
        return False
    if old_size == new_size:
        return not path and old_root == new_root
    if not (_is_hash(old_root) and _is_hash(new_root)) or not path:
        return False
    if old_size & (old_size - 1) == 0:
        # A power-of-two old tree is a complete subtree of the new one, so the proof leaves out its root
        # (SUBPROOF's b flag); the walk starts from it.
        path = [old_root, *path]
    fn, sn = old_size - 1, new_size - 1
    # The walk starts from the largest complete subtree that ends the old tree (the proof's first element):
    # climb from the old tree's last leaf to that subtree's level.
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


# --- Internals -----------------------------------------------------------------------------------------------


def _split(n: int) -> int:
    """The largest power of two strictly less than ``n`` (n >= 2): where MTH splits a tree of n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


def _subtree_root(hashes: list[bytes], lo: int, hi: int) -> bytes:
    """MTH of the leaf hashes ``hashes[lo:hi]`` (lo < hi), computed one level at a time.

    Pairing neighbours and carrying an odd last node up unchanged builds exactly the RFC's tree: the RFC puts
    the split at the largest power of two k < n, so the left k leaves form a complete subtree that pairs off
    evenly on every level, and the ragged right part is the only place a node is ever left without a partner,
    always at the right end of its level.
    """
    level = hashes[lo:hi]
    sha256 = hashlib.sha256  # a local name: this loop runs about once per leaf
    while len(level) > 1:
        pairs = iter(level)
        carried = [level[-1]] if len(level) & 1 else []
        # zip over one iterator twice yields (level[0], level[1]), (level[2], level[3]), ... and drops the odd end
        level = [sha256(_NODE_PREFIX + left + right).digest() for left, right in zip(pairs, pairs, strict=False)]
        level += carried
    return level[0]


def _hash_leaves(leaves: Sequence[bytes]) -> list[bytes]:
    sha256 = hashlib.sha256
    return [sha256(_LEAF_PREFIX + data).digest() for data in leaves]


def _hash_list(hashes: Sequence[bytes]) -> list[bytes]:
    """``hashes`` as a list, after checking every item is a 32-byte ``bytes`` (a wrong one would go unnoticed
    into every root computed from it)."""
    items = list(hashes)
    # Two passes in C first: the plain loop below costs a fifth of the hashing on a big tree, so it only runs
    # to name the culprit when something is wrong.
    if set(map(type, items)) <= {bytes} and set(map(len, items)) <= {HASH_SIZE}:
        return items
    for position, item in enumerate(items):
        if not isinstance(item, bytes):
            raise TypeError(f"leaf hash {position} is {type(item).__name__}, not bytes")
        if len(item) != HASH_SIZE:
            raise ValueError(f"leaf hash {position} has {len(item)} bytes, not {HASH_SIZE}")
    return items


def _check_index(index: int, size: int) -> None:
    if not _is_size(index) or not index < size:
        raise ValueError(f"leaf index {index!r} is out of range for a tree of {size} leaves")


def _check_old_size(old_size: int, size: int) -> None:
    if not _is_size(old_size) or not 0 < old_size <= size:
        raise ValueError(
            f"old size {old_size!r} is out of range for a tree of {size} leaves: a consistency proof needs "
            f"0 < old_size <= {size}"
        )


def _is_size(value: object) -> bool:
    """An int usable as a tree size or leaf index (bool is an int to Python, but never means a size)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_SIZE


def _is_hash(value: object) -> TypeGuard[bytes]:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def _proof_items(proof: object) -> list[bytes] | None:
    """The elements of ``proof`` as a list, or None unless it is a sequence of 32-byte ``bytes``.

    A str or bytes is a sequence too, of characters or ints, but never a list of hashes. A proof longer than
    any valid one is turned away before it is copied or checked.
    """
    if not isinstance(proof, Sequence) or isinstance(proof, str | bytes | bytearray | memoryview):
        return None
    try:
        if len(proof) > _MAX_PROOF_LEN:
            return None
        items = list(proof)
    except Exception:  # a broken __len__ or __iter__ makes a bad proof, not an error
        return None
    hashes = [item for item in items if _is_hash(item)]
    return hashes if len(hashes) == len(items) else None
