"""The client's verifier as a second, independent implementation: against the broker's own Merkle code on
every small tree, against the transparency-dev/merkle probes in ../shared, and against the broker's signed
notes and envelopes. No server needed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from brokerclient.verify import (
    canonical_json,
    checkpoint_open,
    consistency_verify,
    envelope_bytes,
    inclusion_verify,
    leaf_hash,
    verifier_key_parse,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle, note
from ledger.canonical import entry_envelope

PROBES = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "merkle-testdata"


def test_inclusion_agrees_with_the_broker_on_every_leaf_of_every_small_tree():
    leaves = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(40)]
    for size in range(1, 41):
        root = merkle.root_from_hashes(leaves[:size])
        for index in range(size):
            proof = merkle.inclusion_proof_from_hashes(index, leaves[:size])
            assert inclusion_verify(leaves[index], index, size, proof, root)
            assert not inclusion_verify(leaves[(index + 1) % size], index, size, proof, root) or size == 1
            if proof:
                assert not inclusion_verify(leaves[index], index, size, proof[:-1], root)
                assert not inclusion_verify(leaves[index], index, size, [*proof, root], root)
                flipped = bytes([proof[0][0] ^ 1]) + proof[0][1:]
                assert not inclusion_verify(leaves[index], index, size, [flipped, *proof[1:]], root)


def test_consistency_agrees_with_the_broker_for_every_pair_of_sizes_and_refuses_any_change():
    leaves = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(40)]
    roots = [b""] + [merkle.root_from_hashes(leaves[:n]) for n in range(1, 41)]
    for new in range(1, 41):
        for old in range(1, new + 1):
            proof = merkle.consistency_proof_from_hashes(old, leaves[:new])
            assert consistency_verify(old, new, roots[old], roots[new], proof), (old, new)
            assert not consistency_verify(old, new, roots[old], roots[new], [*proof, roots[new]])
            if proof:
                flipped = bytes([proof[-1][0] ^ 1]) + proof[-1][1:]
                assert not consistency_verify(old, new, roots[old], roots[new], [*proof[:-1], flipped])
                assert not consistency_verify(old, new, roots[old], roots[new], proof[1:])
            if old < new:
                assert not consistency_verify(old, new, roots[new], roots[new], proof)
                assert not consistency_verify(old, new, roots[old], roots[old], proof)


def test_bad_consistency_arguments_are_a_failed_proof_not_an_exception():
    root = merkle.leaf_hash(b"x")
    for old, new, proof in [(0, 1, []), (2, 1, []), (1, 2**64, [root]), (True, 2, [root]), (1, 2, "ab"), (1, 2, None),
                            (1, 2, [b"short"])]:  # fmt: skip
        assert consistency_verify(old, new, root, root, proof) is False  # type: ignore[arg-type]


def test_bad_arguments_are_a_failed_proof_not_an_exception():
    leaf = merkle.leaf_hash(b"x")
    for index, size, proof, root in [
        (-1, 1, [], leaf), (0, 0, [], leaf), (1, 1, [], leaf), (True, 2, [leaf], leaf), (0, 2**64, [leaf], leaf),
        (0, 1, "", leaf), (0, 2, [b"short"], leaf), (0, 1, [], b"short"), (0, 2, None, leaf),
    ]:  # fmt: skip
        assert inclusion_verify(leaf, index, size, proof, root) is False  # type: ignore[arg-type]


def _probe_files(kind: str = "inclusion") -> list[Any]:
    if not PROBES.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{PROBES} is not present"))]
    return [pytest.param(p, id=str(p.relative_to(PROBES))) for p in sorted((PROBES / kind).rglob("*.json"))]


@pytest.mark.parametrize("path", _probe_files("consistency"))
def test_consistency_probe(path: Path):
    probe = json.loads(path.read_text())
    b64 = base64.b64decode
    proof = [b64(p) for p in probe["proof"] or []]
    ok = consistency_verify(probe["size1"], probe["size2"], b64(probe["root1"]), b64(probe["root2"]), proof)
    assert ok is (not probe["wantErr"]), probe["desc"]


@pytest.mark.parametrize("path", _probe_files())
def test_inclusion_probe(path: Path):
    probe = json.loads(path.read_text())
    b64 = base64.b64decode
    proof = [b64(p) for p in probe["proof"] or []]  # Go's nil proof is an empty one
    ok = inclusion_verify(b64(probe["leafHash"]), probe["leafIdx"], probe["treeSize"], proof, b64(probe["root"]))
    assert ok is (not probe["wantErr"]), probe["desc"]


def test_envelopes_and_leaves_match_the_brokers_canonical_form():
    for kind, subject in [("order.placed", "order:1"), ("note", 'person:Zoë "Ω" \\ \u2028 \x01 😀')]:
        fields = dict(kind=kind, subject=subject, created_at="2026-12-03T11:49:00.123456Z", prev_hash="0" * 64)
        ours = envelope_bytes(sequence=12, payload_hash="ab" * 32, **fields)
        theirs = entry_envelope(sequence=12, payload_hash="ab" * 32, **fields)
        assert ours == theirs and leaf_hash(ours) == merkle.leaf_hash(theirs)
    with pytest.raises(ValueError, match="float"):
        canonical_json({"price": 1.5})


def test_signed_notes_open_only_with_the_signing_key():
    private = Ed25519PrivateKey.generate()
    vkey = note.verifier_key("gpu-broker/ledger", private.public_key())
    signed = note.sign(note.CheckpointBody("gpu-broker/ledger", 42, b"\x07" * 32), "gpu-broker/ledger", private)

    statement = checkpoint_open(signed, verifier_key_parse(vkey))
    assert (statement.origin, statement.size, statement.root) == ("gpu-broker/ledger", 42, b"\x07" * 32)

    other = verifier_key_parse(note.verifier_key("gpu-broker/ledger", Ed25519PrivateKey.generate().public_key()))
    with pytest.raises(ValueError, match="no signature by the key"):
        checkpoint_open(signed, other)
    with pytest.raises(ValueError, match="does not verify"):
        checkpoint_open(signed.replace("\n42\n", "\n43\n"), verifier_key_parse(vkey))
    cosigned = signed + signed.splitlines(keepends=True)[-1].replace("gpu-broker/ledger", "witness")
    assert checkpoint_open(cosigned, verifier_key_parse(vkey)).size == 42  # other signers are skipped
    name, key_id, encoded = vkey.split("+", 2)
    for broken in [
        f"{name}+{key_id}",
        f"{name}+00000000+{encoded}",
        f"{name}+{key_id}+AAAA",
        f"a b+{key_id}+{encoded}",
    ]:
        with pytest.raises(ValueError):
            verifier_key_parse(broken)
