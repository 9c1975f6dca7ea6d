"""The auditor follows a rotation of the checkpoint key (issue 17, item 8): the broker publishes every key it
signed with, each with its range of checkpoints and the handover its predecessor cosigned, and the auditor
(and the client's receipt verifier) checks each checkpoint with the key that signed it, trusting one key."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from brokerclient.verify import verify_receipt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from ledger import merkle, note
from ledger.audit import OK, AuditReport, audit
from ledger.checkpoints import checkpoint_create
from ledger.keys import signing_key
from ledger.models import Checkpoint, LedgerEntry
from ledger.receipts import audit_bundle, receipt
from ledger.services import ledger_append, ledger_sequence, ledger_verify

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "gpu-broker/ledger"
SUBJECT = "order:rotated"


def _append(n: int, start: int) -> None:
    for i in range(start, start + n):
        with transaction.atomic():
            ledger_append(kind="order.event", subject=SUBJECT if i % 2 else f"order:o-{i}", payload={"i": i})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


def _seed(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.private_bytes_raw()).decode()


def _vkey(key: Ed25519PrivateKey) -> str:
    return note.verifier_key(ORIGIN, key.public_key())


def _kid(key: Ed25519PrivateKey) -> str:
    return note.key_id(ORIGIN, key.public_key()).hex()


def _use_key(settings: Any, key: Ed25519PrivateKey, previous: Ed25519PrivateKey | None) -> None:
    """Configure the checkpoint key as an operator does: the new key, and the retiring one to cosign with."""
    settings.LEDGER_SIGNING_KEY = _seed(key)
    settings.LEDGER_PREVIOUS_SIGNING_KEY = _seed(previous) if previous else ""
    signing_key.cache_clear()


@dataclass
class Rotated:
    keys: list[Ed25519PrivateKey]  # k0 signed 5 and 8; k1 12 (its handover) and 14; k2 17 (its handover)
    bundle: dict[str, Any]
    receipt: dict[str, Any]

    def vkey(self, index: int) -> str:
        return _vkey(self.keys[index])


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.fixture
def rotated(settings: Any) -> Iterator[Rotated]:
    """Two rotations, each cosigned by the retiring key, the last one's retiring key then removed from the
    configuration (it has done its work)."""
    keys = [Ed25519PrivateKey.generate() for _ in range(3)]
    settings.LEDGER_PREVIOUS_VERIFIER_KEYS = []
    try:
        _use_key(settings, keys[0], None)
        for n, start in ((5, 0), (3, 5)):
            _append(n, start)
            checkpoint_create()
        _use_key(settings, keys[1], keys[0])
        for n, start in ((4, 8), (2, 12)):
            _append(n, start)
            checkpoint_create()
        _use_key(settings, keys[2], keys[1])
        _append(3, 14)
        checkpoint_create()
        _use_key(settings, keys[2], None)
        yield Rotated(keys, _json(audit_bundle(with_entries=True)), _json(receipt(SUBJECT)))
    finally:
        signing_key.cache_clear()


def _failed(report: AuditReport, family: str, text: str) -> bool:
    return any(c.family == family and text in c.message for c in report.failures)


# --- An honest rotation ------------------------------------------------------------------------------------------


def test_a_full_audit_across_two_rotations_passes_with_the_first_key_pinned(rotated):
    report = audit(rotated.bundle, receipts=[rotated.receipt], trusted_key=rotated.vkey(0))

    assert report.ok, report.text()
    signed = {c.message.split(":")[0]: c.message for c in report.family("signature")}
    k0, k1, k2 = (_kid(k) for k in rotated.keys)
    assert [c.status for c in report.family("signature")] == [OK] * 5
    assert f"signed by key {k0}" in signed["checkpoint 8"] and f"signed by key {k1}" in signed["checkpoint 12"]
    assert f"signed by key {k2}" in signed["checkpoint 17"]
    (key_check,) = report.family("key")
    assert f"{k0} (5..8) -> {k1} (12..14) -> {k2} (17..17)" in key_check.message
    assert report.state is not None and report.state["verifier_key"] == rotated.vkey(2)


def test_the_published_history_names_each_key_its_range_and_its_handover(rotated):
    history = rotated.bundle["key_history"]

    assert [(p["verifier_key"], p["first_size"], p["last_size"]) for p in history] == [
        (rotated.vkey(0), 5, 8),
        (rotated.vkey(1), 12, 14),
        (rotated.vkey(2), 17, 17),
    ]
    assert history[0]["handover"] is None
    handover = note.open_note(history[1]["handover"], rotated.vkey(0))  # cosigned by the retiring key
    assert handover.rotation() == (rotated.vkey(0), rotated.vkey(1)) and handover.size == 12
    assert note.open_note(history[2]["handover"], rotated.vkey(2)).rotation() == (rotated.vkey(1), rotated.vkey(2))
    assert rotated.receipt["key_history"] == history
    # The broker's own check learns the retired keys from the handovers: none is configured any more.
    assert ledger_verify().ok


def test_the_newest_key_pinned_follows_the_history_back_and_the_state_carries_on(rotated):
    first = audit(rotated.bundle, trusted_key=rotated.vkey(2))
    assert first.ok, first.text()

    again = audit(rotated.bundle, state=first.state)
    assert again.ok, again.text()
    assert "remembered in the state" in again.family("key")[0].message


def test_the_auditors_command_follows_the_rotation(rotated, tmp_path):
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(rotated.bundle))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    run = subprocess.run(
        [sys.executable, "-m", "ledger.audit", str(bundle), "--key", rotated.vkey(0), "--state", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "audit PASSED" in run.stdout
    assert json.loads((tmp_path / "s").read_text())["verifier_key"] == rotated.vkey(2)


def test_the_client_follows_the_rotation_from_a_key_pinned_before_it(rotated):
    result = verify_receipt(rotated.receipt, trusted_key=rotated.vkey(0))

    assert result.ok, result.text()
    assert "follows from it by handovers" in result.checks[0].message
    # A history whose handover was stripped does not lead there, and says so.
    stripped = copy.deepcopy(rotated.receipt)
    stripped["key_history"][2]["handover"] = None
    failed = verify_receipt(stripped, trusted_key=rotated.vkey(0))
    assert [c.name for c in failed.failures] == ["signature"]
    assert "has no handover" in failed.failures[0].message


def test_a_rotation_the_old_key_did_not_cosign_needs_both_keys_out_of_band(settings):
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    settings.LEDGER_PREVIOUS_VERIFIER_KEYS = [_vkey(old)]
    try:
        _use_key(settings, old, None)
        _append(3, 0)
        checkpoint_create()
        _use_key(settings, new, None)  # the old key was lost: nothing cosigns the new key's first checkpoint
        _append(2, 3)
        checkpoint_create()
        bundle = _json(audit_bundle())
    finally:
        signing_key.cache_clear()

    refused = audit(bundle, trusted_key=_vkey(old))
    assert _failed(refused, "key", f"key {_kid(new)} (checkpoints 5..5) is not established: the rotation from key")
    assert _failed(refused, "key", "has no handover: the old key did not cosign the new key's first checkpoint")
    assert _failed(refused, "signature", f"checkpoint 5: the key history gives it to key {_kid(new)}, which is not")

    both = audit(bundle, trusted_key=[_vkey(old), _vkey(new)])
    assert both.ok, both.text()


# --- Forged histories (in the table, {k0}, {k1}, {k2} stand for the fixture's key ids) ----------------------


def _checkpoint(bundle: dict[str, Any], size: int) -> dict[str, Any]:
    return next(cp for cp in bundle["checkpoints"] if cp["size"] == size)


def _resign(bundle: dict[str, Any], size: int, key: Ed25519PrivateKey, *extensions: str) -> str:
    cp = _checkpoint(bundle, size)
    body = note.CheckpointBody(ORIGIN, size, bytes.fromhex(cp["root"]), extensions)
    cp["note"], cp["key_id"] = note.sign(body, ORIGIN, key), _kid(key)
    return str(cp["note"])


def _stranger_signs_14(r: Rotated) -> None:
    _resign(r.bundle, 14, Ed25519PrivateKey.generate())


def _retired_key_signs_14(r: Rotated) -> None:
    _resign(r.bundle, 14, r.keys[0])


def _retired_key_signs_again(r: Rotated) -> None:
    """The leaked k0 signs a checkpoint after k2's, and the history lists k0 again for it."""
    _append(2, 17)
    leaves = [bytes.fromhex(h) for h in LedgerEntry.objects.order_by("sequence").values_list("leaf_hash", flat=True)]
    body = note.CheckpointBody(ORIGIN, 19, merkle.root_from_hashes(leaves[:19]))
    r.bundle["checkpoints"].append(
        {**_checkpoint(r.bundle, 17), "size": 19, "root": body.root.hex(), "anchor": None}
        | {"note": note.sign(body, ORIGIN, r.keys[0]), "key_id": _kid(r.keys[0])}
    )
    r.bundle["key_history"].append({**r.bundle["key_history"][0], "first_size": 19, "last_size": 19})


def _attacker_claims_to_succeed_k0(r: Rotated) -> None:
    """An attacker's key takes k1's place, with a handover naming k0 but signed by the attacker alone."""
    attacker = Ed25519PrivateKey.generate()
    line = note.rotation_line(r.vkey(0), _vkey(attacker))
    handover = _resign(r.bundle, 12, attacker, line)
    _resign(r.bundle, 14, attacker)
    r.bundle["key_history"][1].update(verifier_key=_vkey(attacker), key_id=_kid(attacker), handover=handover)


def _handover_names_another_key(r: Rotated) -> None:
    """Both keys signed, but the line names a different successor: the old key never endorsed k1."""
    line = note.rotation_line(r.vkey(0), _vkey(Ed25519PrivateKey.generate()))
    cp = _checkpoint(r.bundle, 12)
    body = note.CheckpointBody(ORIGIN, 12, bytes.fromhex(cp["root"]), (line,))
    cp["note"] = r.bundle["key_history"][1]["handover"] = note.sign(body, ORIGIN, r.keys[1], r.keys[0])


def _handover_stripped(r: Rotated) -> None:
    r.bundle["key_history"][1]["handover"] = None


def _ranges_overlap(r: Rotated) -> None:
    r.bundle["key_history"][1]["first_size"] = 8


def _key_left_out(r: Rotated) -> None:
    del r.bundle["key_history"][1]


FORGERIES = {
    "a checkpoint signed by a key not in the history": (
        _stranger_signs_14,
        [("signature", "checkpoint 14: its note does not verify"), ("signature", "which is not in the key history")],
    ),
    "a retired key used outside its range": (
        _retired_key_signs_14,
        [("signature", "checkpoint 14: its note does not verify"), ("signature", "{k0} outside its published range")],
    ),
    "a retired key signing again": (
        _retired_key_signs_again,
        [("key", "the key history does not chain: key {k0} appears twice: a retired key signs again")],
    ),
    "an attacker's key claiming to succeed the trusted one": (
        _attacker_claims_to_succeed_k0,
        [("key", "its handover note is not cosigned by the old key"), ("signature", "checkpoint 12: the key history")],
    ),
    "a handover naming another successor": (
        _handover_names_another_key,
        [("key", "{k1} (checkpoints 12..14) is not established: the rotation from key {k0} to key {k1}: its handover")],
    ),
    "a handover stripped": (
        _handover_stripped,
        [("key", "has no handover"), ("key", "key {k2} (checkpoints 17..17) is not established: the key before")],
    ),
    "overlapping ranges": (_ranges_overlap, [("key", "the key history does not chain: key {k1}'s range 8..14 does")]),
    "a key left out of the history": (
        _key_left_out,
        [("signature", "checkpoint 12: signed by key {k1}, which is not in the key history")],
    ),
}


@pytest.mark.parametrize("forgery", list(FORGERIES), ids=list(FORGERIES))
def test_a_forged_history_fails_with_a_clear_message(rotated, forgery):
    edit, expected = FORGERIES[forgery]
    ids = {f"k{i}": _kid(key) for i, key in enumerate(rotated.keys)}

    edit(rotated)
    report = audit(rotated.bundle, trusted_key=rotated.vkey(0))

    assert not report.ok and report.state is None
    for family, text in expected:
        assert _failed(report, family, text.format(**ids)), f"{family}: {text.format(**ids)}\n{report.text()}"


def test_a_retired_key_never_signs_again(rotated, settings):
    _use_key(settings, rotated.keys[1], None)  # an operator rolls back to the key before
    _append(1, 17)
    try:
        with pytest.raises(ImproperlyConfigured, match=f"is key {_kid(rotated.keys[1])}, retired after checkpoint 14"):
            checkpoint_create()
    finally:
        signing_key.cache_clear()
    assert Checkpoint.objects.count() == 5  # nothing was signed


def test_the_brokers_own_check_refuses_a_retired_key_that_signed_again(rotated):
    _append(1, 17)
    leaves = [bytes.fromhex(h) for h in LedgerEntry.objects.order_by("sequence").values_list("leaf_hash", flat=True)]
    body = note.CheckpointBody(ORIGIN, 18, merkle.root_from_hashes(leaves))
    with transaction.atomic():  # what a leaked key and write access to the database could add
        Checkpoint.objects.create(
            size=18,
            root_hash=body.root.hex(),
            origin=ORIGIN,
            note=note.sign(body, ORIGIN, rotated.keys[0]),
            key_id=_kid(rotated.keys[0]),
            created_at=timezone.now(),
        )

    assert ledger_verify().problem == f"key {_kid(rotated.keys[0])} signed checkpoints again after it was retired"
