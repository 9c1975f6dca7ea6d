"""ledger.merkle against the RFC: published vectors, a slow reference written from the RFC's definitions, the
transparency-dev/merkle conformance probes in ../shared, bad input, and a tree of a million leaves."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ledger.merkle import (
    EMPTY_ROOT,
    consistency_proof,
    consistency_proof_from_hashes,
    inclusion_proof,
    inclusion_proof_from_hashes,
    leaf_hash,
    node_hash,
    root,
    root_from_hashes,
    verify_consistency,
    verify_inclusion,
)

# --- A slow reference, straight from RFC 6962 section 2.1 ----------------------------------------------------
# Deliberately naive: recursion on list slices, hashlib directly, and the split found by counting up, so it
# shares no code or trick with the module under test.


def _ref_split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: Sequence[bytes]) -> bytes:
    """MTH(D[n])."""
    if len(d) == 0:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = _ref_split(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n])."""
    if len(d) == 1:
        return []
    k = _ref_split(len(d))
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def ref_subproof(m: int, d: Sequence[bytes], b: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b)."""
    if m == len(d):
        return [] if b else [ref_mth(d)]
    k = _ref_split(len(d))
    if m <= k:
        return [*ref_subproof(m, d[:k], b), ref_mth(d[k:])]
    return [*ref_subproof(m - k, d[k:], False), ref_mth(d[:k])]


def ref_proof(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n])."""
    return ref_subproof(m, d, True)


# --- RFC 6962 test vectors (the certificate-transparency and transparency-dev/merkle reference trees) -------

RFC_LEAVES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]

RFC_ROOTS = {
    0: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    3: "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    4: "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    5: "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    6: "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    7: "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    8: "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}


@pytest.mark.parametrize("size", sorted(RFC_ROOTS))
def test_rfc_vector_roots(size: int) -> None:
    assert root(RFC_LEAVES[:size]).hex() == RFC_ROOTS[size]
    assert ref_mth(RFC_LEAVES[:size]).hex() == RFC_ROOTS[size]


def test_empty_tree() -> None:
    assert root([]) == root_from_hashes([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_rfc_vector_proofs() -> None:
    # Two proofs the reference implementations publish for the tree above.
    assert [p.hex() for p in inclusion_proof(0, RFC_LEAVES)] == [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]
    assert [p.hex() for p in consistency_proof(2, RFC_LEAVES[:5])] == [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    ]


def test_hash_prefixes() -> None:
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    left, right = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(left, right) == hashlib.sha256(b"\x01" + left + right).digest()
    assert root([b"a", b"b"]) == node_hash(left, right)


# --- The fast builders agree with the reference for every size, index and old size up to 70 ------------------


def _leaves(n: int) -> list[bytes]:
    # Distinct entries of varied lengths, the first one empty.
    return [b"entry-%d;" % i * i for i in range(n)]


def _flip(h: bytes, bit: int = 0) -> bytes:
    return bytes([h[0] ^ (1 << bit), *h[1:]])


@pytest.mark.parametrize("n", range(1, 71))
def test_inclusion_proofs_match_reference(n: int) -> None:
    leaves = _leaves(n)
    hashes = [leaf_hash(d) for d in leaves]
    tree_root = root(leaves)
    assert tree_root == ref_mth(leaves) == root_from_hashes(hashes)
    for i in range(n):
        proof = inclusion_proof(i, leaves)
        assert proof == ref_path(i, leaves) == inclusion_proof_from_hashes(i, hashes)
        assert verify_inclusion(hashes[i], i, n, proof, tree_root)
        # Anything changed and the proof no longer holds. (Not the tree size alone: the RFC 9162 check cannot
        # always tell n from n + 1 for the same root, e.g. leaf 0 of 3 also verifies as leaf 0 of 4. The pair
        # (size, root) is what a signed tree head vouches for, and a real pair has only one of them.)
        assert not verify_inclusion(hashes[i], i, n, proof, _flip(tree_root))
        assert not verify_inclusion(_flip(hashes[i]), i, n, proof, tree_root)
        for j in range(n):
            if j != i:
                assert not verify_inclusion(hashes[i], j, n, proof, tree_root)
        assert not verify_inclusion(hashes[i], i, n, [*proof, proof[-1] if proof else tree_root], tree_root)
        if proof:
            assert not verify_inclusion(hashes[i], i, n, proof[:-1], tree_root)
            assert not verify_inclusion(hashes[i], i, n, proof[1:], tree_root)
        for k in range(len(proof)):
            tampered = [*proof[:k], _flip(proof[k], 7), *proof[k + 1 :]]
            assert not verify_inclusion(hashes[i], i, n, tampered, tree_root)


@pytest.mark.parametrize("n", range(1, 71))
def test_consistency_proofs_match_reference(n: int) -> None:
    leaves = _leaves(n)
    hashes = [leaf_hash(d) for d in leaves]
    new_root = root(leaves)
    old_roots = {m: ref_mth(leaves[:m]) for m in range(1, n + 1)}
    for m in range(1, n + 1):
        proof = consistency_proof(m, leaves)
        assert proof == ref_proof(m, leaves) == consistency_proof_from_hashes(m, hashes)
        old_root = old_roots[m]
        assert verify_consistency(m, n, old_root, new_root, proof)
        assert not verify_consistency(m, n, _flip(old_root), new_root, proof)
        assert not verify_consistency(m, n, old_root, _flip(new_root), proof)
        if m < n:
            assert not verify_consistency(m, n, new_root, old_root, proof)
        for other in range(1, n + 1):
            if other != m:
                assert not verify_consistency(other, n, old_root, new_root, proof)
        assert not verify_consistency(m, n, old_root, new_root, [*proof, new_root])
        if proof:
            assert not verify_consistency(m, n, old_root, new_root, proof[:-1])
            assert not verify_consistency(m, n, old_root, new_root, proof[1:])
        for k in range(len(proof)):
            tampered = [*proof[:k], _flip(proof[k], 7), *proof[k + 1 :]]
            assert not verify_consistency(m, n, old_root, new_root, tampered)


# --- The transparency-dev/merkle conformance probes in ../shared ---------------------------------------------
# Read in place, never copied: a checkout without ../shared skips them.

PROBES = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "merkle-testdata"


def _probe_params(kind: str) -> list[Any]:
    if not PROBES.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{PROBES} is not present"))]
    files = sorted((PROBES / kind).rglob("*.json"))
    return [pytest.param(f, id=str(f.relative_to(PROBES).with_suffix(""))) for f in files]


def _b64(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


def _probe(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    # The probes come from Go, where a nil proof is an empty one.
    data["proof"] = [_b64(p) for p in data["proof"] or []]
    return data


@pytest.mark.parametrize("path", _probe_params("inclusion"))
def test_inclusion_probe(path: Path) -> None:
    probe = _probe(path)
    ok = verify_inclusion(
        _b64(probe["leafHash"]), probe["leafIdx"], probe["treeSize"], probe["proof"], _b64(probe["root"])
    )
    assert ok is not probe["wantErr"], probe["desc"]


@pytest.mark.parametrize("path", _probe_params("consistency"))
def test_consistency_probe(path: Path) -> None:
    probe = _probe(path)
    ok = verify_consistency(probe["size1"], probe["size2"], _b64(probe["root1"]), _b64(probe["root2"]), probe["proof"])
    assert ok is not probe["wantErr"], probe["desc"]


# The subtree* probes are for subtree proofs (a proof about the leaves [start, end) of a tree), an API this
# module does not have. The subtree [0, end) with end > 0 is simply the tree of size end, so those probes are
# plain inclusion and consistency probes and run against our verifiers; the others (start > 0, and the empty
# subtree, which that API accepts against any tree while verify_consistency refuses an old size of 0) are
# skipped.
_SUBTREE_SKIP = "subtree proof with start > 0 or an empty subtree: no counterpart in this API"


@pytest.mark.parametrize("path", _probe_params("subtreeinclusion"))
def test_subtree_inclusion_probe_from_zero(path: Path) -> None:
    probe = _probe(path)
    if probe["start"] != 0 or probe["end"] == 0:
        pytest.skip(_SUBTREE_SKIP)
    ok = verify_inclusion(_b64(probe["leafHash"]), probe["leafIdx"], probe["end"], probe["proof"], _b64(probe["root"]))
    assert ok is not probe["wantErr"], probe["desc"]


@pytest.mark.parametrize("path", _probe_params("subtreeconsistency"))
def test_subtree_consistency_probe_from_zero(path: Path) -> None:
    probe = _probe(path)
    if probe["start"] != 0 or probe["end"] == 0:
        pytest.skip(_SUBTREE_SKIP)
    ok = verify_consistency(probe["end"], probe["size"], _b64(probe["root1"]), _b64(probe["root2"]), probe["proof"])
    assert ok is not probe["wantErr"], probe["desc"]


# --- Bad input: builders raise ValueError, verifiers return False and never raise ---------------------------

LEAVES_7 = _leaves(7)
HASHES_7 = [leaf_hash(d) for d in LEAVES_7]
ROOT_7 = root(LEAVES_7)
PROOF_7_5 = inclusion_proof(5, LEAVES_7)
ROOT_3 = root(LEAVES_7[:3])
PROOF_3_7 = consistency_proof(3, LEAVES_7)


class _BrokenSequence(Sequence[bytes]):
    """A sequence whose every access fails."""

    def __len__(self) -> int:
        raise RuntimeError("broken")

    def __getitem__(self, index: Any) -> Any:
        raise RuntimeError("broken")


def _generator() -> Iterator[bytes]:
    yield from PROOF_7_5


def test_baselines_verify() -> None:
    assert verify_inclusion(HASHES_7[5], 5, 7, PROOF_7_5, ROOT_7)
    assert verify_inclusion(HASHES_7[5], 5, 7, tuple(PROOF_7_5), ROOT_7)
    assert verify_consistency(3, 7, ROOT_3, ROOT_7, PROOF_3_7)
    assert verify_consistency(7, 7, ROOT_7, ROOT_7, [])


@pytest.mark.parametrize(
    ("leaf", "index", "size", "proof", "tree_root"),
    [
        pytest.param(HASHES_7[5], -1, 7, PROOF_7_5, ROOT_7, id="negative-index"),
        pytest.param(HASHES_7[5], 7, 7, PROOF_7_5, ROOT_7, id="index-equals-size"),
        pytest.param(HASHES_7[5], 8, 7, PROOF_7_5, ROOT_7, id="index-past-size"),
        pytest.param(HASHES_7[5], 2**64 + 5, 2**64 + 7, PROOF_7_5, ROOT_7, id="beyond-uint64"),
        pytest.param(HASHES_7[5], 5, -7, PROOF_7_5, ROOT_7, id="negative-size"),
        pytest.param(HASHES_7[5], 0, 0, [], EMPTY_ROOT, id="size-zero"),
        pytest.param(EMPTY_ROOT, 0, 0, [], EMPTY_ROOT, id="size-zero-empty-root-as-leaf"),
        pytest.param(HASHES_7[5], 5.0, 7, PROOF_7_5, ROOT_7, id="float-index"),
        pytest.param(HASHES_7[5], "5", 7, PROOF_7_5, ROOT_7, id="str-index"),
        pytest.param(HASHES_7[5], 5, None, PROOF_7_5, ROOT_7, id="none-size"),
        pytest.param(HASHES_7[1], True, 7, inclusion_proof(1, LEAVES_7), ROOT_7, id="bool-index"),
        pytest.param(HASHES_7[5][:31], 5, 7, PROOF_7_5, ROOT_7, id="short-leaf-hash"),
        pytest.param(HASHES_7[5] + b"\x00", 5, 7, PROOF_7_5, ROOT_7, id="long-leaf-hash"),
        pytest.param(HASHES_7[5].hex(), 5, 7, PROOF_7_5, ROOT_7, id="hex-leaf-hash"),
        pytest.param(bytearray(HASHES_7[5]), 5, 7, PROOF_7_5, ROOT_7, id="bytearray-leaf-hash"),
        pytest.param(None, 5, 7, PROOF_7_5, ROOT_7, id="none-leaf-hash"),
        pytest.param(HASHES_7[5], 5, 7, PROOF_7_5, ROOT_7[:16], id="short-root"),
        pytest.param(HASHES_7[5], 5, 7, PROOF_7_5, b"", id="empty-root"),
        pytest.param(HASHES_7[5], 5, 7, PROOF_7_5, None, id="none-root"),
        pytest.param(HASHES_7[5], 5, 7, None, ROOT_7, id="none-proof"),
        pytest.param(HASHES_7[5], 5, 7, b"".join(PROOF_7_5), ROOT_7, id="proof-as-one-blob"),
        pytest.param(HASHES_7[5], 5, 7, "".join(p.hex() for p in PROOF_7_5), ROOT_7, id="proof-as-str"),
        pytest.param(HASHES_7[5], 5, 7, _generator(), ROOT_7, id="proof-as-generator"),
        pytest.param(HASHES_7[5], 5, 7, _BrokenSequence(), ROOT_7, id="proof-broken-sequence"),
        pytest.param(HASHES_7[5], 5, 7, [PROOF_7_5[0][:31], *PROOF_7_5[1:]], ROOT_7, id="short-element"),
        pytest.param(HASHES_7[5], 5, 7, [*PROOF_7_5[:-1], PROOF_7_5[-1] + b"\x00"], ROOT_7, id="long-element"),
        pytest.param(HASHES_7[5], 5, 7, [p.hex() for p in PROOF_7_5], ROOT_7, id="str-elements"),
        pytest.param(HASHES_7[5], 5, 7, [None, *PROOF_7_5[1:]], ROOT_7, id="none-element"),
        pytest.param(HASHES_7[5], 5, 7, [7, *PROOF_7_5[1:]], ROOT_7, id="int-element"),
        pytest.param(HASHES_7[5], 5, 7, [*PROOF_7_5, ROOT_7], ROOT_7, id="extra-element"),
        pytest.param(HASHES_7[5], 5, 7, [*PROOF_7_5, 7], ROOT_7, id="extra-int-element"),
        pytest.param(HASHES_7[5], 5, 7, PROOF_7_5[:-1], ROOT_7, id="missing-element"),
        pytest.param(HASHES_7[5], 5, 7, [], ROOT_7, id="empty-proof"),
        pytest.param(HASHES_7[5], 5, 7, PROOF_7_5 * 1000, ROOT_7, id="huge-proof"),
    ],
)
def test_verify_inclusion_rejects_bad_input(leaf: Any, index: Any, size: Any, proof: Any, tree_root: Any) -> None:
    assert verify_inclusion(leaf, index, size, proof, tree_root) is False


@pytest.mark.parametrize(
    ("old_size", "new_size", "old_root", "new_root", "proof"),
    [
        pytest.param(7, 3, ROOT_7, ROOT_3, PROOF_3_7, id="old-size-greater"),
        pytest.param(0, 7, EMPTY_ROOT, ROOT_7, [], id="old-size-zero"),
        pytest.param(0, 7, EMPTY_ROOT, ROOT_7, PROOF_3_7, id="old-size-zero-with-proof"),
        pytest.param(0, 0, EMPTY_ROOT, EMPTY_ROOT, [], id="both-sizes-zero"),
        pytest.param(-3, 7, ROOT_3, ROOT_7, PROOF_3_7, id="negative-old-size"),
        pytest.param(3, -7, ROOT_3, ROOT_7, PROOF_3_7, id="negative-new-size"),
        pytest.param(3, 2**64 + 7, ROOT_3, ROOT_7, PROOF_3_7, id="beyond-uint64"),
        pytest.param(3.0, 7, ROOT_3, ROOT_7, PROOF_3_7, id="float-size"),
        pytest.param("3", 7, ROOT_3, ROOT_7, PROOF_3_7, id="str-size"),
        pytest.param(3, None, ROOT_3, ROOT_7, PROOF_3_7, id="none-size"),
        pytest.param(True, 7, root(LEAVES_7[:1]), ROOT_7, consistency_proof(1, LEAVES_7), id="bool-size"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [], id="empty-proof"),
        pytest.param(3, 7, ROOT_3, ROOT_7, PROOF_3_7[:-1], id="missing-element"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [*PROOF_3_7, ROOT_7], id="extra-element"),
        pytest.param(3, 7, ROOT_3, ROOT_7, PROOF_3_7 * 1000, id="huge-proof"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [PROOF_3_7[0][:31], *PROOF_3_7[1:]], id="short-first-element"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [*PROOF_3_7[:-1], PROOF_3_7[-1] + b"\x00"], id="long-last-element"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [p.hex() for p in PROOF_3_7], id="str-elements"),
        pytest.param(3, 7, ROOT_3, ROOT_7, [None, *PROOF_3_7[1:]], id="none-element"),
        pytest.param(3, 7, ROOT_3, ROOT_7, None, id="none-proof"),
        pytest.param(3, 7, ROOT_3, ROOT_7, b"".join(PROOF_3_7), id="proof-as-one-blob"),
        pytest.param(3, 7, ROOT_3, ROOT_7, (p for p in PROOF_3_7), id="proof-as-generator"),
        pytest.param(3, 7, ROOT_3, ROOT_7, _BrokenSequence(), id="proof-broken-sequence"),
        pytest.param(3, 7, ROOT_3[:31], ROOT_7, PROOF_3_7, id="short-old-root"),
        pytest.param(3, 7, ROOT_3, ROOT_7 + b"\x00", PROOF_3_7, id="long-new-root"),
        pytest.param(3, 7, None, ROOT_7, PROOF_3_7, id="none-old-root"),
        pytest.param(3, 7, ROOT_3, ROOT_7.hex(), PROOF_3_7, id="hex-new-root"),
        pytest.param(3, 7, ROOT_7, ROOT_3, PROOF_3_7, id="swapped-roots"),
        pytest.param(7, 7, ROOT_7, ROOT_3, [], id="equal-sizes-different-roots"),
        pytest.param(7, 7, ROOT_7, ROOT_7, [ROOT_7], id="equal-sizes-non-empty-proof"),
        pytest.param(7, 7, ROOT_7, ROOT_7, None, id="equal-sizes-none-proof"),
        pytest.param(7, 7, ROOT_7.hex(), ROOT_7.hex(), [], id="equal-sizes-str-roots"),
    ],
)
def test_verify_consistency_rejects_bad_input(
    old_size: Any, new_size: Any, old_root: Any, new_root: Any, proof: Any
) -> None:
    assert verify_consistency(old_size, new_size, old_root, new_root, proof) is False


@pytest.mark.parametrize("index", [-1, 7, 8, 2**70])
def test_inclusion_proof_refuses_index_out_of_range(index: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        inclusion_proof(index, LEAVES_7)
    with pytest.raises(ValueError, match="out of range"):
        inclusion_proof_from_hashes(index, HASHES_7)


def test_inclusion_proof_refuses_empty_tree() -> None:
    with pytest.raises(ValueError, match="out of range"):
        inclusion_proof(0, [])


@pytest.mark.parametrize("old_size", [-1, 0, 8, 2**70])
def test_consistency_proof_refuses_old_size_out_of_range(old_size: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        consistency_proof(old_size, LEAVES_7)
    with pytest.raises(ValueError, match="out of range"):
        consistency_proof_from_hashes(old_size, HASHES_7)


def test_consistency_proof_to_itself_is_empty() -> None:
    assert consistency_proof(7, LEAVES_7) == []
    assert consistency_proof(1, LEAVES_7[:1]) == []


def test_hash_builders_refuse_what_is_not_a_leaf_hash() -> None:
    with pytest.raises(ValueError, match="leaf hash 2 has 31 bytes"):
        root_from_hashes([*HASHES_7[:2], HASHES_7[2][:31], *HASHES_7[3:]])
    with pytest.raises(ValueError, match="leaf hash 0 has 0 bytes"):
        inclusion_proof_from_hashes(0, [b""])
    with pytest.raises(TypeError, match="leaf hash 1 is str"):
        consistency_proof_from_hashes(1, [HASHES_7[0], HASHES_7[1].hex()])  # type: ignore[list-item]


# --- Scale: a million leaves, no recursion, no timing assertion ---------------------------------------------


def test_a_million_leaves() -> None:
    n = 2**20 + 3
    # Any distinct 32-byte strings serve as leaf hashes; this is much quicker than hashing a million entries.
    hashes = [i.to_bytes(32, "big") for i in range(n)]
    tree_root = root_from_hashes(hashes)

    index = 2**19 + 12345
    proof = inclusion_proof_from_hashes(index, hashes)
    # The RFC splits at the largest power of two below n: 20 levels inside the complete left subtree of 2**20
    # leaves, then its sibling, the root of the last 3.
    assert len(proof) == 21
    assert proof[-1] == root_from_hashes(hashes[2**20 :])
    assert verify_inclusion(hashes[index], index, n, proof, tree_root)

    # A small old tree keeps its root cheap; the proof still spans the whole new tree.
    old_size = 1000
    proof = consistency_proof_from_hashes(old_size, hashes)
    assert verify_consistency(old_size, n, root_from_hashes(hashes[:old_size]), tree_root, proof)
