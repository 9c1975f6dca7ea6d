"""The auditor's tool (ledger.audit) on what the broker really publishes: a real ledger, real checkpoints anchored
on the in-process chain, the bundle and receipts as JSON, then edited the way a dishonest publisher would."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import transaction

from ledger import audit as audit_module
from ledger import merkle, note
from ledger.anchoring import chain
from ledger.audit import FAILED, NOT_CHECKED, OK, AuditReport, audit
from ledger.canonical import canonical_bytes, entry_envelope, sha256_hex
from ledger.checkpoints import checkpoint_create, ledger_checkpoint_and_anchor
from ledger.keys import signing_key, verifier_key
from ledger.receipts import BUNDLE_FORMAT, RECEIPT_FORMAT, audit_bundle, receipt
from ledger.services import ledger_append, ledger_sequence

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
SUBJECT = "order:alpha"


# --- Building a ledger and what it publishes ---------------------------------------------------------------------


def _append(n: int, start: int) -> None:
    for i in range(start, start + n):
        with transaction.atomic():
            subject = SUBJECT if i % 3 == 0 else f"order:other-{i}"
            ledger_append(kind="order.event", subject=subject, payload={"i": i, "amount_usd": f"{i}.50"})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


def _json(value: Any) -> Any:
    """What an auditor holds: the published JSON, parsed back."""
    return json.loads(json.dumps(value))


def _bundle(**kwargs: Any) -> dict[str, Any]:
    return _json(
        audit_bundle(with_leaves=kwargs.pop("with_leaves", True), with_entries=kwargs.pop("with_entries", True))
    )


def _receipt() -> dict[str, Any]:
    return _json(receipt(SUBJECT))


@pytest.fixture
def published() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """12 entries, an anchored checkpoint, 8 more, a second anchored checkpoint, 2 pending entries: the full
    bundle and the receipt of SUBJECT (7 covered entries, 1 pending)."""
    _append(12, start=0)
    ledger_checkpoint_and_anchor()
    _append(8, start=12)
    ledger_checkpoint_and_anchor()
    _append(2, start=20)
    yield _bundle(), _receipt()


def _audit(bundle: dict[str, Any], receipts: list[dict[str, Any]] | None = None, **kwargs: Any) -> AuditReport:
    kwargs.setdefault("w3", chain())
    kwargs.setdefault("trusted_key", verifier_key())
    return audit(bundle, receipts=receipts or [], **kwargs)


def _failed(report: AuditReport, family: str, text: str) -> bool:
    return any(c.family == family and text in c.message for c in report.failures)


def _flip(hex_text: str, at: int = 0) -> str:
    """The hex string with one byte changed."""
    data = bytearray(bytes.fromhex(hex_text.removeprefix("0x")))
    data[at] ^= 0x01
    return ("0x" if hex_text.startswith("0x") else "") + data.hex()


# --- An honest ledger ------------------------------------------------------------------------------------------


def test_an_honest_ledger_passes_every_check(published):
    bundle, rcpt = published

    report = _audit(bundle, [rcpt])

    assert report.ok, report.text()
    for family in ("input", "key", "signature", "consistency", "entries", "roots", "receipt", "anchor"):
        assert any(c.status == OK for c in report.family(family)), family
    assert not any(c.status == NOT_CHECKED for c in report.family("anchor"))
    assert any("checkpoint 12" in c.message and "anchor tx 0x" in c.message for c in report.family("anchor"))
    assert any("7 entries" in c.message and "checkpoint 20" in c.message for c in report.family("receipt"))
    assert any("1 pending" in c.message and c.status == NOT_CHECKED for c in report.family("receipt"))
    latest = bundle["checkpoints"][-1]
    assert report.state is not None
    assert (report.state["size"], report.state["root"]) == (20, latest["root"])
    assert report.state["verifier_key"] == verifier_key()
    assert report.state["anchor_sender"] == latest["anchor"]["sender"]
    assert report.text().endswith(report.summary()) and "audit PASSED" in report.summary()


def test_without_a_key_the_bundles_own_is_trusted_on_first_use_and_anchors_are_not_checked(published):
    bundle, rcpt = published

    report = audit(bundle, receipts=[rcpt])

    assert report.ok, report.text()
    (key,) = report.family("key")
    assert "trust on first use" in key.message and "TAKEN FROM THE BUNDLE" in key.message
    (anchors,) = report.family("anchor")
    assert anchors.status == NOT_CHECKED and "not checked" in anchors.message and "12, 20" in anchors.message
    # The next audit holds the broker to the key it saw first.
    assert report.state is not None and report.state["verifier_key"] == bundle["verifier_key"]
    again = audit(bundle, state=report.state)
    assert "remembered in the state" in again.family("key")[0].message


def test_a_bundle_with_leaf_hashes_only_recomputes_the_roots_from_them(published):
    bundle = _bundle(with_entries=False)
    report = _audit(bundle)
    assert report.ok, report.text()
    assert report.family("entries")[0].status == NOT_CHECKED
    roots = report.family("roots")
    assert [c.status for c in roots] == [OK, OK] and "leaf hashes" in roots[0].message
    # Entries alone give the leaves too.
    full, _ = published
    del full["leaf_hashes"]
    report = _audit(full)
    assert report.ok and "from the entries" in report.family("roots")[0].message


def test_the_formats_are_the_ones_the_broker_publishes():
    assert (audit_module.BUNDLE_FORMAT, audit_module.RECEIPT_FORMAT) == (BUNDLE_FORMAT, RECEIPT_FORMAT)


# --- Each family of checks catches an edit -------------------------------------------------------------------

Edit = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def _set(path: str, value: Callable[[Any], Any]) -> Edit:
    """An edit of the bundle (``b.``) or the receipt (``r.``) at a dotted path with list indexes."""

    def edit(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
        target: Any = bundle if path.startswith("b.") else rcpt
        *parents, last = path[2:].split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key: Any = int(last) if isinstance(target, list) else last
        target[key] = value(target[key])
        return {}

    return edit


def _drop_entry(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    del bundle["entries"][6]
    return {}


def _swap_checkpoints(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    bundle["checkpoints"].reverse()
    return {}


def _no_consistency(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    bundle["consistency"] = []
    return {}


def _stranger_key(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    return {"trusted_key": note.verifier_key(settings.LEDGER_ORIGIN, Ed25519PrivateKey.generate().public_key())}


def _anchor_of_the_other_checkpoint(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    bundle["checkpoints"][0]["anchor"] = copy.deepcopy(bundle["checkpoints"][1]["anchor"])
    return {}


def _forged_note(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    cp = bundle["checkpoints"][1]
    cp["note"] = cp["note"].replace("\n20\n", "\n21\n", 1)
    return {}


def _wrong_sender(bundle: dict[str, Any], rcpt: dict[str, Any]) -> dict[str, Any]:
    return {"anchor_sender": "0x" + "11" * 20}


# (edit, [(family, text a failed check of that family must contain)])
EDITS: dict[str, tuple[Edit, list[tuple[str, str]]]] = {
    "checkpoint root byte": (
        _set("b.checkpoints.0.root", _flip),
        [("signature", "checkpoint 12: signature verifies but its note states root"), ("roots", "checkpoint 12:")],
    ),
    "consistency proof element": (
        _set("b.consistency.0.proof.1", _flip),
        [("consistency", "checkpoints 12 -> 20: the consistency proof does not verify")],
    ),
    "consistency proof missing": (_no_consistency, [("consistency", "12 -> 20: the bundle has no consistency proof")]),
    "checkpoints out of order": (_swap_checkpoints, [("consistency", "sizes do not strictly increase")]),
    "payload": (
        _set("b.entries.4.payload", lambda p: p.replace('"i":4', '"i":5')),
        [("entries", "entry #5: its payload does not hash to its payload_hash")],
    ),
    "entry dropped": (_drop_entry, [("entries", "entry #8: expected #7 at this position, found #8 (a sequence gap)")]),
    "created_at": (
        _set("b.entries.2.created_at", lambda t: t.replace(":00Z", ":01Z") if t.endswith(":00Z") else t[:-3] + "00Z"),
        [("entries", "entry #3: its entry_hash differs")],
    ),
    "prev_hash": (
        _set("b.entries.9.prev_hash", _flip),
        [("entries", "entry #10: its prev_hash does not link to the entry_hash of the entry before (#9)")],
    ),
    "leaf hash": (
        _set("b.leaf_hashes.3", _flip),
        [("roots", "checkpoint 12: the root recomputed"), ("entries", "entry #4: its recomputed leaf hash differs")],
    ),
    "wrong key": (
        _stranger_key,
        [("key", "is not the trusted key"), ("signature", "checkpoint 12: its note does not verify: note carries no")],
    ),
    "forged note": (_forged_note, [("signature", "checkpoint 20: its note does not verify: signature by")]),
    "origin": (_set("b.origin", lambda _: "someone-else/ledger"), [("signature", "its note's origin is")]),
    "anchor of another checkpoint": (
        _anchor_of_the_other_checkpoint,
        [("anchor", "checkpoint 12: anchor tx 0x"), ("anchor", "the chain holds size 20")],
    ),
    "anchor tx unknown": (
        _set("b.checkpoints.1.anchor.tx_hash", lambda _: "0x" + "ab" * 32),
        [("anchor", "checkpoint 20: anchor tx 0x" + "ab" * 32)],
    ),
    "anchor block": (
        _set("b.checkpoints.0.anchor.block_number", lambda n: n + 1),
        [("anchor", "checkpoint 12: anchor tx 0x"), ("anchor", "recorded as")],
    ),
    "anchor sender": (_wrong_sender, [("anchor", "is not the broker's anchor address 0x1111")]),
    "receipt proof element": (
        _set("r.entries.1.inclusion_proof.0", _flip),
        [("receipt", "receipt order:alpha: entry #4: its inclusion proof does not verify against checkpoint 20")],
    ),
    "receipt payload": (
        _set("r.entries.2.payload", lambda p: p.replace('"i":6', '"i":7')),
        [("receipt", "entry #7: its payload does not hash")],
    ),
    "receipt checkpoint root": (
        _set("r.checkpoint.root", _flip),
        [("receipt", "its checkpoint 20 has root"), ("receipt", "two different logs")],
    ),
    "receipt subject": (
        _set("r.entries.0.subject", lambda _: "order:beta"),
        [("receipt", "entry #1: its subject 'order:beta' is not the receipt's")],
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_an_edited_bundle_or_receipt_fails_the_check_that_names_the_culprit(published, name):
    bundle, rcpt = published
    edit, expected = EDITS[name]
    extra = edit(bundle, rcpt)

    report = _audit(bundle, [rcpt], **extra)

    assert not report.ok
    assert report.state is None  # nothing to save from a failed audit
    for family, text in expected:
        assert _failed(report, family, text), f"no failed {family} check with {text!r}:\n{report.text()}"


def test_a_receipt_newer_than_the_bundle_is_vouched_for_by_its_signed_note():
    _append(6, start=0)
    checkpoint_create()
    bundle = _bundle()
    _append(3, start=6)
    checkpoint_create()
    rcpt = _receipt()

    report = audit(bundle, receipts=[rcpt], trusted_key=verifier_key())

    assert report.ok, report.text()
    assert "not in the bundle; its signed note verifies" in report.family("receipt")[0].message
    rcpt["checkpoint"]["note"] = rcpt["checkpoint"]["note"].replace("\n9\n", "\n8\n", 1)
    assert _failed(audit(bundle, receipts=[rcpt]), "receipt", "its checkpoint 9 is not in the bundle and its note")


# --- The auditor's memory: the state -------------------------------------------------------------------------


def _rewritten(bundle: dict[str, Any], *, from_sequence: int, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The bundle of a log rewritten from ``from_sequence`` on and re-signed with ``key``: every hash, link,
    root, note and proof consistent, only the anchors left as they were (the chain cannot be rewritten)."""
    forged = copy.deepcopy(bundle)
    origin = forged["origin"]
    prev, leaves = "0" * 64, []
    for entry in forged["entries"]:
        if entry["sequence"] == from_sequence:
            entry["payload"] = canonical_bytes({"i": 999, "amount_usd": "0.00"}).decode()
        if entry["sequence"] >= from_sequence:
            entry["payload_hash"] = sha256_hex(entry["payload"].encode())
            entry["prev_hash"] = prev
            envelope = entry_envelope(
                sequence=entry["sequence"],
                kind=entry["kind"],
                subject=entry["subject"],
                created_at=entry["created_at"],
                payload_hash=entry["payload_hash"],
                prev_hash=prev,
            )
            entry["entry_hash"] = sha256_hex(envelope)
            entry["leaf_hash"] = merkle.leaf_hash(envelope).hex()
        prev = entry["entry_hash"]
        leaves.append(bytes.fromhex(entry["leaf_hash"]))
    forged["leaf_hashes"] = [leaf.hex() for leaf in leaves]
    for cp in forged["checkpoints"]:
        root = merkle.root_from_hashes(leaves[: cp["size"]])
        cp["root"] = root.hex()
        cp["note"] = note.sign(note.CheckpointBody(origin, cp["size"], root), origin, key)
        cp["key_id"] = note.key_id(origin, key.public_key()).hex()
    for proof in forged["consistency"]:
        path = merkle.consistency_proof_from_hashes(proof["old_size"], leaves[: proof["new_size"]])
        proof["proof"] = [p.hex() for p in path]
    forged["verifier_key"] = note.verifier_key(origin, key.public_key())
    # The forger publishes a key history of their own key alone.
    (period,) = forged["key_history"][:1]
    sizes = [cp["size"] for cp in forged["checkpoints"]]
    period.update(verifier_key=forged["verifier_key"], key_id=note.key_id(origin, key.public_key()).hex())
    period.update(first_size=min(sizes), last_size=max(sizes), handover=None)
    forged["key_history"] = [period]
    return forged


def test_the_state_catches_a_log_rewritten_after_an_earlier_audit(published):
    bundle, _ = published
    state = _audit(bundle).state
    assert state is not None
    forged = _rewritten(bundle, from_sequence=5, key=signing_key())  # the attacker holds the real key

    # Without the chain or a memory of the log, a consistent rewrite signed with the real key is invisible ...
    assert audit(forged, trusted_key=verifier_key()).ok
    # ... the anchors catch it ...
    assert _failed(_audit(forged), "anchor", "checkpoint 12: anchor tx 0x")
    # ... and so does the auditor's state from before, even with no chain at hand.
    report = audit(forged, trusted_key=verifier_key(), state=state)
    assert _failed(report, "state", "checkpoint 20 (root")
    assert _failed(report, "state", "the log was rewritten")
    assert report.state is None


def test_the_state_remembers_the_key_a_first_audit_trusted(published):
    bundle, _ = published
    state = audit(bundle).state  # trust on first use
    forged = _rewritten(bundle, from_sequence=1, key=Ed25519PrivateKey.generate())

    assert audit(forged).ok  # a newcomer without a key or state cannot tell
    report = audit(forged, state=state)
    assert _failed(report, "key", "is not the trusted key")
    assert _failed(report, "signature", "checkpoint 12: its note does not verify")


def test_the_state_accepts_a_log_that_grew_and_refuses_one_cut_back():
    _append(12, start=0)
    ledger_checkpoint_and_anchor()
    older = _audit(_bundle())
    assert older.ok and older.state is not None and older.state["size"] == 12
    _append(8, start=12)
    ledger_checkpoint_and_anchor()
    bundle = _bundle()

    grown = _audit(bundle, state=older.state)
    assert grown.ok, grown.text()
    assert "checkpoint 12" in grown.family("state")[0].message and "unchanged" in grown.family("state")[0].message
    assert grown.state is not None and grown.state["size"] == 20

    # A bundle that no longer lists checkpoint 12 still proves it through its leaf hashes ...
    without_12 = copy.deepcopy(bundle)
    del without_12["checkpoints"][0]
    without_12["consistency"] = []
    report = _audit(without_12, state=older.state)
    assert report.ok and "leaf hashes" in report.family("state")[0].message
    # ... or through a consistency proof from it ...
    proof = without_12["consistency"] = copy.deepcopy(bundle["consistency"])
    del without_12["leaf_hashes"], without_12["entries"]
    assert _audit(without_12, state=older.state).ok
    # ... but without either it proves nothing.
    proof.clear()
    assert _failed(_audit(without_12, state=older.state), "state", "no proof or leaf hashes")

    # A log cut back to checkpoint 12 after the audit that saw 20:
    cut = copy.deepcopy(bundle)
    del cut["checkpoints"][1]
    cut["consistency"], cut["leaf_hashes"], cut["entries"] = [], cut["leaf_hashes"][:12], cut["entries"][:12]
    assert _failed(_audit(cut, state=grown.state), "state", "the log was cut back or rewritten")
    other = {**grown.state, "origin": "someone-else/ledger"}
    assert _failed(_audit(bundle, state=other), "state", "the saved state is of log 'someone-else/ledger'")


# --- Malformed input: a failed check naming the field, never a traceback -------------------------------------


def _malformed_bundle(path: str, value: Any) -> Edit:
    return _set(path, lambda _: value)


MALFORMED: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], Any], str]] = {
    "checkpoint root not hex": (_malformed_bundle("b.checkpoints.0.root", "zz" * 32), "bundle.checkpoints[0].root"),
    "checkpoint size a string": (_malformed_bundle("b.checkpoints.1.size", "20"), "bundle.checkpoints[1].size"),
    "proof element short": (_malformed_bundle("b.consistency.0.proof.0", "abcd"), "bundle.consistency[0].proof[0]"),
    "leaf hash a number": (_malformed_bundle("b.leaf_hashes.2", 5), "bundle.leaf_hashes[2]"),
    "entry sequence a bool": (_malformed_bundle("b.entries.3.sequence", True), "bundle.entries[3].sequence"),
    "payload a lone surrogate": (_malformed_bundle("b.entries.0.payload", "\ud800"), "bundle.entries[0].payload"),
    "anchor tx hash": (_malformed_bundle("b.checkpoints.0.anchor.tx_hash", "0x12"), "bundle.checkpoints[0].anchor"),
    "receipt proof a string": (
        _malformed_bundle("r.entries.0.inclusion_proof", "abc"),
        "receipt order:alpha.entries[0].inclusion_proof",
    ),
    "receipt format": (_malformed_bundle("r.format", "broker-ledger-audit/1"), "receipt order:alpha.format"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_input_is_a_failed_check_naming_the_field(published, name):
    bundle, rcpt = published
    edit, field = MALFORMED[name]
    edit(bundle, rcpt)

    report = _audit(bundle, [rcpt])

    assert not report.ok
    assert any(field in c.message for c in report.failures), report.text()
    assert not any("unexpected error" in c.message for c in report.checks)


@pytest.mark.parametrize(
    ("bundle", "field"),
    [
        ([], "bundle is a list, not an object"),
        ({"format": BUNDLE_FORMAT}, "bundle.origin is missing"),
        ({"format": "broker-ledger-receipt/1"}, "bundle.format is 'broker-ledger-receipt/1'"),
        (None, "bundle is null"),
    ],
)
def test_a_bundle_that_is_not_one_is_reported_as_such(bundle, field):
    report = audit(bundle, receipts=[{"format": RECEIPT_FORMAT}, 7], state={"size": "x"})
    assert not report.ok
    assert any(field in c.message for c in report.failures), report.text()
    assert _failed(report, "state", "state.size is a string")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):  # the first few of each list: the same code reads the rest
            yield from _paths(item, (*prefix, index))


def test_no_damage_to_any_field_makes_the_audit_raise(published):
    """Every field of the bundle, its receipt and the state replaced by each of a few wrong values, or removed:
    the audit reports, it never raises, and never falls back to its last-resort catch-all."""
    bundle, rcpt = published
    state = _audit(bundle).state
    documents = {"bundle": bundle, "receipt": rcpt, "state": state}
    for name, document in documents.items():
        for path in _paths(document):
            for damage in (None, "zz", -1, 2**70, [], {}, "\ud800", "delete"):
                damaged = copy.deepcopy(documents)
                if not path:
                    damaged[name] = None if damage == "delete" else damage
                else:
                    parent = damaged[name]
                    for part in path[:-1]:
                        parent = parent[part]
                    if damage == "delete":
                        del parent[path[-1]]
                    else:
                        parent[path[-1]] = damage
                report = audit(
                    damaged["bundle"], receipts=[damaged["receipt"]], trusted_key=verifier_key(), state=damaged["state"]
                )
                assert isinstance(report, AuditReport)
                crashed = [c for c in report.checks if "unexpected error" in c.message]
                assert not crashed, (name, path, damage, crashed)


# --- The Merkle shortcut agrees with ledger.merkle -------------------------------------------------------------


def test_roots_at_every_size_agree_with_merkle_root_from_hashes():
    leaves = [merkle.leaf_hash(str(i).encode()) for i in range(70)]
    sizes = range(1, 71)
    roots = merkle.roots_at(leaves, sizes)
    assert roots == {n: merkle.root_from_hashes(leaves[:n]) for n in sizes}
    assert merkle.roots_at(leaves, [0, 71, 5]) == {5: merkle.root_from_hashes(leaves[:5])}


# --- The command line ------------------------------------------------------------------------------------------


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-m", "ledger.audit", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _write(path: Path, value: Any) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_the_command_line_exit_codes_and_state_file(published, tmp_path):
    bundle, rcpt = published
    bundle_file = _write(tmp_path / "bundle.json", bundle)
    receipt_file = _write(tmp_path / "receipt.json", rcpt)
    key_file = _write(tmp_path / "broker.vkey", verifier_key() + "\n")
    state_file = tmp_path / "state" / "audit-state.json"
    state_file.parent.mkdir()

    run = _cli(bundle_file, "--receipt", receipt_file, "--key-file", key_file, "--state", state_file)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "audit PASSED" in run.stdout and "anchors of checkpoints 12, 20 not checked" in run.stdout
    saved = json.loads(state_file.read_text())
    assert (saved["size"], saved["root"], saved["verifier_key"]) == (
        20,
        bundle["checkpoints"][-1]["root"],
        verifier_key(),
    )

    # Again, held to the saved state, with the key remembered there.
    run = _cli(bundle_file, "--state", state_file)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "remembered in the state" in run.stdout and "still in the log unchanged" in run.stdout

    # A tampered bundle: exit 1, the culprit named, the state kept as it was.
    tampered = copy.deepcopy(bundle)
    tampered["entries"][4]["payload"] = tampered["entries"][4]["payload"].replace('"i":4', '"i":5')
    run = _cli(_write(tmp_path / "tampered.json", tampered), "--key", verifier_key(), "--state", state_file)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED" in run.stdout and "entry #5: its payload does not hash" in run.stdout
    assert json.loads(state_file.read_text()) == saved

    # A log rewritten and re-signed with the real key: only the state catches it without a chain.
    forged = _write(tmp_path / "forged.json", _rewritten(bundle, from_sequence=3, key=signing_key()))
    assert _cli(forged, "--key", verifier_key()).returncode == 0
    run = _cli(forged, "--key", verifier_key(), "--state", state_file)
    assert run.returncode == 1 and "the log was rewritten" in run.stdout

    # A malformed field: a failed check naming it, no traceback.
    bad = copy.deepcopy(bundle)
    bad["checkpoints"][1]["root"] = "not hex"
    run = _cli(_write(tmp_path / "bad.json", bad))
    assert run.returncode == 1 and "bundle.checkpoints[1].root is not 64 hex digits" in run.stdout
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not json", "is not JSON"),
        ("missing", "cannot read bundle"),
        ("a list", "is a list, not a JSON object"),
        ("a receipt", "is not a broker-ledger-audit/1 document"),
        ("bad key", "the verifier key is unusable"),
        ("bad state", "state.root is not 64 hex digits"),
        ("bad receipt", "receipt"),
    ],
)
def test_the_command_line_exits_2_on_unreadable_input(published, tmp_path, case, message):
    bundle, rcpt = published
    bundle_file = _write(tmp_path / "bundle.json", bundle)
    args: list[str | Path] = [bundle_file]
    if case == "not json":
        args = [_write(tmp_path / "x.json", '{"format": ')]
    elif case == "missing":
        args = [tmp_path / "nowhere.json"]
    elif case == "a list":
        args = [_write(tmp_path / "x.json", [1, 2])]
    elif case == "a receipt":
        args = [_write(tmp_path / "x.json", rcpt)]
    elif case == "bad key":
        args += ["--key", "gpu-broker/ledger+00000000+AAAA"]
    elif case == "bad state":
        args += ["--state", _write(tmp_path / "state.json", {"size": 20, "root": "xyz"})]
    elif case == "bad receipt":
        args += ["--receipt", _write(tmp_path / "r.json", "[]")]

    run = _cli(*args)

    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr


def test_the_auditors_tool_imports_no_django_and_no_web3_until_anchors_are_checked():
    code = (
        "import sys, ledger.audit\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'web3')]\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr


def test_report_lines_name_the_status():
    report = AuditReport()
    report.checks += [
        audit_module.Check("anchor", OK, "a"),
        audit_module.Check("roots", FAILED, "b"),
        audit_module.Check("state", NOT_CHECKED, "c"),
    ]
    assert [line.split()[0] for line in report.text().splitlines()[:3]] == ["ok", "FAILED", "--"]
    assert report.summary() == "audit FAILED: 1 ok, 1 failed, 1 not checked (3 checks)"
