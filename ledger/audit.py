"""The auditor's tool: check what the broker publishes about its ledger, without Django and without its database.

What an auditor needs
---------------------
1. The broker's URL, or an audit bundle (format ``broker-ledger-audit/1``). With ``--url`` the tool reads the
   broker's public ledger endpoints (``/api/v1/ledger/key``, every page of ``ledger/checkpoints`` with their
   anchors, ``ledger/consistency`` between successive checkpoints and from the one the state remembers,
   ``ledger/leaves`` up to the newest checkpoint) and assembles the same bundle the operator would export
   (``bundle_from_api``); nothing from the operator is needed. Each request has a total deadline (``--timeout``,
   30 s: a watchdog shuts the socket, so a peer trickling bytes cannot stretch it), all of them one more
   (``--deadline``, 600 s); an answer is at most 64 MiB and 16 levels deep; a redirect is followed only to the
   same scheme, host and port. A broker that cannot be read is an unreadable input (exit 2) naming the URL and
   what failed. A bundle is exported by the operator with::

       python manage.py ledger export --out bundle.json            # checkpoints, consistency proofs, leaf hashes
       python manage.py ledger export --out bundle.json --entries  # the same and every entry (trusted auditors)

2. Receipts, optionally (format ``broker-ledger-receipt/1``): a buyer saves the JSON of
   ``GET /api/v1/orders/<id>/receipt`` for each order they want to check.
3. The broker's verifier key, obtained out of band: not from the bundle, which the broker writes. The operator
   prints it with ``python manage.py ledger verify`` (the line ``verifier key: gpu-broker/ledger+1a2b3c4d+AX...``)
   and publishes it somewhere the broker cannot quietly rewrite. Without a key the tool uses the bundle's own
   and says so (trust on first use), then remembers it in the state file. One key is enough across rotations:
   the bundle's ``key_history`` lists every key with the checkpoints it signed, and each key after the first
   is linked to the one before by its *handover*, its first checkpoint, signed by both and naming both
   (``ledger.note``). The tool follows verified handovers from the trusted key in both directions. A rotation
   the old key could not cosign (a lost key) needs the new key out of band as well: ``--key OLD --key NEW``.
4. For the anchors: the JSON-RPC URL of a node of the chain the broker anchors to, and optionally the broker's
   anchor address (the sender of its anchor transactions); without it, the first audit's sender is remembered.

Running it
----------
From a checkout of the broker's source (only ``ledger/audit.py``, ``merkle.py``, ``note.py``, ``canonical.py``
and, for anchors, ``chain.py`` are used; they need Python 3.11+, ``cryptography`` and, for ``--rpc-url``,
``web3``)::

    python -m ledger.audit --url https://broker.example --key-file broker.vkey --rpc-url https://node.example:8545 \\
        --state audit-state.json
    python -m ledger.audit bundle.json --key-file broker.vkey --state audit-state.json
    python -m ledger.audit bundle.json --key 'gpu-broker/ledger+1a2b3c4d+AX...' --receipt receipt.json \\
        --rpc-url https://node.example:8545 --state audit-state.json [--anchor-sender 0xBroker...]

It prints one line per check (``ok``, ``FAILED`` or ``--`` for not checked) and a summary. Exit status: 0 when
everything that was checked passed, 1 when a check failed, 2 when an input could not be read (a missing file,
JSON that does not parse, a malformed key or state file, a broker that cannot be read). The run command's
chain node (``ledger.chainnode``) serves its anchors over JSON-RPC, so the demo is audited the same way:
``--url http://127.0.0.1:8000 --rpc-url http://127.0.0.1:8545``.

What it checks: that the key history chains (consecutive, disjoint ranges, no key twice, every handover signed by
both keys and naming both); every checkpoint's signed note against the key whose range holds it, and that it
states the row's size and root; that each checkpoint extends the one before (consistency proofs); with leaf
hashes, the Merkle root at every checkpoint; with entries, that they are gapless, chained, and that every hash
recomputes from the published fields; each receipt's entries and their inclusion proofs; with ``--rpc-url``, that
each anchor transaction on the chain states its checkpoint's size and root; and, with ``--state``, that the log
still contains what an earlier audit saw.

The state file
--------------
Keep it between audits (``--state``; it is created by the first successful one). It records the newest
checkpoint the audit verified (size and root), the verifier key and the anchor sender. The next audit requires
the new bundle to contain that checkpoint unchanged, or to prove the new log extends it: that is what catches a
log rewritten wholesale after an earlier audit, even one re-signed with a stolen key. It is rewritten only when
the audit passes.

Library use: ``audit(bundle, receipts=[...], w3=Web3(...), trusted_key=..., state=...)`` returns an
``AuditReport``; its ``state`` is what to save when it is ``ok``.

This module imports only the standard library (``http.client`` for ``--url``), ``ledger.merkle``, ``ledger.note``
and ``ledger.canonical``, and ``ledger.chain`` (hence web3) only when anchors are checked: keep it free of Django.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import io
import itertools
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger import merkle, note
from ledger.canonical import entry_envelope, sha256_hex
from untrusted.jsonbody import bounded_json  # standard library only, as this tool is

if TYPE_CHECKING:
    from web3 import Web3

__all__ = [
    "BUNDLE_FORMAT",
    "FAILED",
    "NOT_CHECKED",
    "OK",
    "RECEIPT_FORMAT",
    "STATE_FORMAT",
    "AuditReport",
    "Check",
    "FetchError",
    "audit",
    "bundle_from_api",
    "main",
]

BUNDLE_FORMAT = "broker-ledger-audit/1"
RECEIPT_FORMAT = "broker-ledger-receipt/1"
STATE_FORMAT = "broker-ledger-audit-state/1"
GENESIS_HASH = "0" * 64

OK = "ok"
FAILED = "failed"
NOT_CHECKED = "not checked"

# A rewritten chain breaks every entry after the first changed one: name the first few, count the rest.
_MAX_ENTRY_FAILURES = 10
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


# --- The report ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check: its family (``input``, ``key``, ``signature``, ``consistency``, ``roots``, ``entries``,
    ``receipt``, ``anchor``, ``state``), ``ok``/``failed``/``not checked``, and what was checked or wrong."""

    family: str
    status: str
    message: str

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        label = {OK: "ok", FAILED: "FAILED", NOT_CHECKED: "--"}.get(self.status, self.status)
        return f"{label:<7} {self.family:<12} {self.message}"


@dataclass
class AuditReport:
    """Every check made, in order. ``state`` is what to save for the next audit: set only when ``ok``."""

    checks: list[Check] = field(default_factory=list)
    state: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    def family(self, name: str) -> list[Check]:
        return [c for c in self.checks if c.family == name]

    def summary(self) -> str:
        counts = {status: sum(c.status == status for c in self.checks) for status in (OK, FAILED, NOT_CHECKED)}
        verdict = "PASSED" if self.ok else "FAILED"
        return (
            f"audit {verdict}: {counts[OK]} ok, {counts[FAILED]} failed, {counts[NOT_CHECKED]} not checked"
            f" ({len(self.checks)} checks)"
        )

    def text(self) -> str:
        return "\n".join([*(c.line() for c in self.checks), self.summary()])


# --- Reading untrusted JSON ------------------------------------------------------------------------------------


class _Malformed(ValueError):
    """A field missing or of the wrong type or form; ``path`` names it (``bundle.checkpoints[1].root``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path


def _get(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _Malformed(f"{path}.{key}", "is missing")
    return obj[key]


def _dict(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(path, f"is {_kind(value)}, not an object")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Malformed(path, f"is {_kind(value)}, not a list")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _Malformed(path, f"is {_kind(value)}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Malformed(path, "is not valid Unicode text (a lone surrogate)") from None
    return value


def _int(value: Any, path: str, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Malformed(path, f"is {_kind(value)}, not an integer")
    if value < minimum:
        raise _Malformed(path, f"is {value}, less than {minimum}")
    return value


def _hash(value: Any, path: str) -> bytes:
    """A 32-byte hash written as 64 hex digits."""
    text = _str(value, path)
    if len(text) != 64 or not set(text) <= _HEX_DIGITS:
        raise _Malformed(path, f"is not 64 hex digits: {_short(text)!r}")
    return bytes.fromhex(text)


def _hashes(value: Any, path: str) -> list[bytes]:
    return [_hash(item, f"{path}[{i}]") for i, item in enumerate(_list(value, path))]


def _tx_hash(value: Any, path: str) -> str:
    text = _str(value, path)
    digits = text[2:] if text[:2] in ("0x", "0X") else text
    if len(digits) != 64 or not set(digits) <= _HEX_DIGITS:
        raise _Malformed(path, f"is not a 32-byte hex hash: {_short(text)!r}")
    return "0x" + digits.lower()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}.get(
        type(value), "an object" if isinstance(value, dict) else type(value).__name__
    )


def _short(text: str, n: int = 16) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _hex(data: bytes) -> str:
    return _short(data.hex())


@dataclass(frozen=True)
class _Anchor:
    chain_id: int
    tx_hash: str
    block_number: int
    block_hash: str
    sender: str


@dataclass(frozen=True)
class _Checkpoint:
    size: int
    root: bytes
    note: str
    key_id: str
    anchor: _Anchor | None


@dataclass(frozen=True)
class _Entry:
    sequence: int
    kind: str
    subject: str
    created_at: str
    payload: str
    payload_hash: str
    prev_hash: str
    entry_hash: str
    leaf_hash: str
    inclusion_proof: list[bytes] | None


def _parse_checkpoint(value: Any, path: str) -> _Checkpoint:
    obj = _dict(value, path)
    anchor_value = _get(obj, "anchor", path)
    anchor = None
    if anchor_value is not None:
        apath = f"{path}.anchor"
        a = _dict(anchor_value, apath)
        anchor = _Anchor(
            chain_id=_int(_get(a, "chain_id", apath), f"{apath}.chain_id"),
            tx_hash=_tx_hash(_get(a, "tx_hash", apath), f"{apath}.tx_hash"),
            block_number=_int(_get(a, "block_number", apath), f"{apath}.block_number"),
            block_hash=_tx_hash(_get(a, "block_hash", apath), f"{apath}.block_hash"),
            sender=_str(_get(a, "sender", apath), f"{apath}.sender"),
        )
    return _Checkpoint(
        size=_int(_get(obj, "size", path), f"{path}.size", minimum=1),
        root=_hash(_get(obj, "root", path), f"{path}.root"),
        note=_str(_get(obj, "note", path), f"{path}.note"),
        key_id=_str(_get(obj, "key_id", path), f"{path}.key_id"),
        anchor=anchor,
    )


def _parse_entry(value: Any, path: str, *, with_proof: bool = False) -> _Entry:
    obj = _dict(value, path)
    fields = {name: _str(_get(obj, name, path), f"{path}.{name}") for name in _ENTRY_TEXT_FIELDS}
    proof = _hashes(_get(obj, "inclusion_proof", path), f"{path}.inclusion_proof") if with_proof else None
    return _Entry(
        sequence=_int(_get(obj, "sequence", path), f"{path}.sequence", minimum=1), inclusion_proof=proof, **fields
    )


_ENTRY_TEXT_FIELDS = (
    "kind",
    "subject",
    "created_at",
    "payload",
    "payload_hash",
    "prev_hash",
    "entry_hash",
    "leaf_hash",
)


@dataclass(frozen=True)
class _KeyPeriod:
    """One entry of the bundle's key history: a key and the sizes of the first and last checkpoint it signed
    (None for a current key that has signed none yet), and the handover note linking it to the key before."""

    verifier_key: str | None
    key_id: str
    first_size: int | None
    last_size: int | None
    handover: str | None

    def range(self) -> str:
        return "none yet" if self.first_size is None else f"{self.first_size}..{self.last_size}"

    def covers(self, size: int) -> bool:
        return self.first_size is not None and self.last_size is not None and self.first_size <= size <= self.last_size


def _parse_key_period(value: Any, path: str) -> _KeyPeriod:
    obj = _dict(value, path)

    def optional_str(name: str) -> str | None:
        return None if obj.get(name) is None else _str(obj[name], f"{path}.{name}")

    def optional_int(name: str) -> int | None:
        return None if obj.get(name) is None else _int(obj[name], f"{path}.{name}", minimum=1)

    key_id = _str(_get(obj, "key_id", path), f"{path}.key_id")
    if len(key_id) != 8 or not set(key_id) <= _HEX_DIGITS:
        raise _Malformed(f"{path}.key_id", f"is not 8 hex digits: {_short(key_id)!r}")
    first, last = optional_int("first_size"), optional_int("last_size")
    if (first is None) != (last is None):
        raise _Malformed(path, "has only one of first_size and last_size")
    return _KeyPeriod(optional_str("verifier_key"), key_id.lower(), first, last, optional_str("handover"))


def _note_key_ids(text: str) -> list[str]:
    """The key ids a note's signature lines name (hex), for saying who did sign a note that does not verify."""
    ids = []
    for line in text.partition("\n\n")[2].split("\n"):
        parts = line.split(" ")
        if len(parts) == 3:
            try:
                ids.append(base64.b64decode(parts[2], validate=True)[:4].hex())
            except ValueError:
                continue
    return ids


@dataclass(frozen=True)
class _State:
    size: int
    root: bytes
    origin: str | None
    verifier_key: str | None
    anchor_sender: str | None


def _parse_state(value: Any) -> _State:
    obj = _dict(value, "state")

    def optional(name: str) -> str | None:
        return None if obj.get(name) is None else _str(obj[name], f"state.{name}")

    return _State(
        size=_int(_get(obj, "size", "state"), "state.size", minimum=1),
        root=_hash(_get(obj, "root", "state"), "state.root"),
        origin=optional("origin"),
        verifier_key=optional("verifier_key"),
        anchor_sender=optional("anchor_sender"),
    )


# --- Merkle helpers ------------------------------------------------------------------------------------------


def _entry_problems(entry: _Entry) -> tuple[list[str], bytes]:
    """What is wrong with ``entry``'s own hashes, and the leaf hash recomputed from its fields.

    The envelope is rebuilt from the published fields (``created_at`` as the published text, the published
    ``payload_hash``), so a wrong payload is named as such rather than as a wrong entry hash.
    """
    problems = []
    if sha256_hex(entry.payload.encode("utf-8")) != entry.payload_hash:
        problems.append("its payload does not hash to its payload_hash")
    envelope = entry_envelope(
        sequence=entry.sequence,
        kind=entry.kind,
        subject=entry.subject,
        created_at=entry.created_at,
        payload_hash=entry.payload_hash,
        prev_hash=entry.prev_hash,
    )
    if sha256_hex(envelope) != entry.entry_hash:
        problems.append("its entry_hash differs from the hash of the envelope recomputed from its fields")
    leaf = merkle.leaf_hash(envelope)
    if leaf.hex() != entry.leaf_hash:
        problems.append("its leaf_hash differs from the leaf hash recomputed from its fields")
    return problems, leaf


def _same_address(a: str, b: str) -> bool:
    return a.lower() == b.lower()


# --- The audit ---------------------------------------------------------------------------------------------------


def audit(
    bundle: Any,
    *,
    receipts: Sequence[Any] = (),
    w3: Web3 | None = None,
    trusted_key: str | Sequence[str] | None = None,
    state: Any = None,
    anchor_sender: str | None = None,
) -> AuditReport:
    """Check an audit bundle (``ledger.receipts.audit_bundle`` as JSON) and any receipts, and return the report.

    ``trusted_key``: the verifier key the auditor got out of band (or several: keys of a rotation the old key
    did not cosign); without it the key saved in ``state``, else the first of the bundle's key history
    (reported as trust on first use). Every other key must be linked to a trusted one by handover checkpoints.
    ``w3``: a ``Web3`` to check anchors with; without it anchors are reported as not checked. ``state``: the
    ``state`` of an earlier successful report, which the new bundle must contain or extend. ``anchor_sender``:
    the broker's anchor address, if known out of band.

    Never raises on malformed input: a missing field or a wrong type is a failed check that names the field.
    """
    run = _Audit(bundle, list(receipts), w3, trusted_key, state, anchor_sender)
    try:
        run.run()
    except Exception as exc:  # a last resort: a bug here must still give a report, never a traceback
        run.fail("input", f"the audit stopped on an unexpected error: {type(exc).__name__}: {exc}")
    if run.report.ok:
        run.report.state = run.new_state()
    return run.report


class _Audit:
    def __init__(
        self,
        bundle: Any,
        receipts: list[Any],
        w3: Web3 | None,
        trusted_key: str | Sequence[str] | None,
        state: Any,
        anchor_sender: str | None,
    ) -> None:
        self.bundle = bundle
        self.receipts = receipts
        self.w3 = w3
        self.trusted_keys = [trusted_key] if isinstance(trusted_key, str) else list(trusted_key or [])
        self.state_value = state
        self.given_sender = anchor_sender
        self.report = AuditReport()
        self.origin: str | None = None
        self.bundle_key = ""
        self.key: str | None = None  # the newest established key: the one the state remembers
        self.key_id_hex = ""
        self.history: list[_KeyPeriod] = []  # the bundle's key history, or its one key for an older bundle
        self.established: dict[str, str] = {}  # key id (hex) -> verifier key, for keys trusted or handed over to
        self.fallback = False  # no key of the history is trusted: every note is checked with the trusted key
        self.checkpoints: list[_Checkpoint] = []
        self.proofs: dict[tuple[int, int], list[bytes]] = {}
        self.leaves: list[bytes] | None = None  # the bundle's leaf_hashes, when given and well formed
        self.entry_leaves: list[bytes] | None = None  # recomputed from entries, when given and well formed
        self.consistent_from: int | None = None  # index of the first checkpoint from which all proofs verified
        self.roots_ok = False
        self.sender: str | None = None  # the anchor sender checked against (given, remembered, or first seen)
        self.state: _State | None = None

    # -- reporting

    def add(self, family: str, status: str, message: str) -> None:
        self.report.checks.append(Check(family, status, message))

    def ok(self, family: str, message: str) -> None:
        self.add(family, OK, message)

    def fail(self, family: str, message: str) -> None:
        self.add(family, FAILED, message)

    def skip(self, family: str, message: str) -> None:
        self.add(family, NOT_CHECKED, message)

    # -- the steps

    def run(self) -> None:
        self._read_state()
        if not self._read_bundle():
            for family in ("signature", "consistency", "roots", "entries", "receipt", "anchor", "state"):
                self.skip(family, "not checked: the bundle could not be read")
            return
        self._choose_key()
        self._check_signatures()
        self._check_consistency()
        self._read_leaves()
        self._check_entries()
        self._check_roots()
        for index, value in enumerate(self.receipts):
            self._check_receipt(index, value)
        self._check_anchors()
        self._check_state()

    def _read_state(self) -> None:
        if self.state_value is None:
            return
        try:
            self.state = _parse_state(self.state_value)
        except _Malformed as exc:
            self.fail("state", f"the saved state is malformed: {exc}")

    def _read_bundle(self) -> bool:
        try:
            bundle = _dict(self.bundle, "bundle")
            fmt = _get(bundle, "format", "bundle")
            if fmt != BUNDLE_FORMAT:
                raise _Malformed("bundle.format", f"is {fmt!r}, not {BUNDLE_FORMAT!r}")
            self.origin = _str(_get(bundle, "origin", "bundle"), "bundle.origin")
            self.bundle_key = _str(_get(bundle, "verifier_key", "bundle"), "bundle.verifier_key")
            rows = _list(_get(bundle, "checkpoints", "bundle"), "bundle.checkpoints")
            self.checkpoints = [_parse_checkpoint(row, f"bundle.checkpoints[{i}]") for i, row in enumerate(rows)]
            if bundle.get("key_history") is not None:
                periods = _list(bundle["key_history"], "bundle.key_history")
                self.history = [_parse_key_period(v, f"bundle.key_history[{i}]") for i, v in enumerate(periods)]
            else:  # a bundle from before key histories: its one key signed every checkpoint
                self.history = [self._single_key_history()]
            proofs = _list(_get(bundle, "consistency", "bundle"), "bundle.consistency")
            for i, value in enumerate(proofs):
                path = f"bundle.consistency[{i}]"
                obj = _dict(value, path)
                old = _int(_get(obj, "old_size", path), f"{path}.old_size")
                new = _int(_get(obj, "new_size", path), f"{path}.new_size")
                self.proofs.setdefault((old, new), _hashes(_get(obj, "proof", path), f"{path}.proof"))
        except _Malformed as exc:
            self.fail("input", f"the bundle is malformed: {exc}")
            return False
        count = len(self.checkpoints)
        newest = f", newest of size {self.checkpoints[-1].size}" if count else ""
        self.ok("input", f"bundle of log {self.origin!r}: {count} checkpoint(s){newest}")
        return True

    def _single_key_history(self) -> _KeyPeriod:
        try:
            key_id = note.parse_verifier_key(self.bundle_key)[1].hex()
        except ValueError:
            key_id = ""
        sizes = [cp.size for cp in self.checkpoints]
        return _KeyPeriod(self.bundle_key, key_id, min(sizes, default=None), max(sizes, default=None), None)

    def _choose_key(self) -> None:
        """Which keys are trusted (given, remembered or first seen), and which keys of the bundle's history the
        handovers link to them: ``self.established``. Anything that does not chain is a failed ``key`` check."""
        state_key = self.state.verifier_key if self.state else None
        if self.trusted_keys:
            trusted, source = [k.strip() for k in self.trusted_keys], "given out of band"
            if state_key and state_key not in trusted:
                source += f" (the saved state had another key, {_short(state_key, 40)}; the given one is used)"
        elif state_key:
            trusted, source = [state_key], "remembered in the state from an earlier audit"
        else:
            first = self.history[0].verifier_key if self.history else None
            trusted = [first or self.bundle_key]
            source = (
                "TAKEN FROM THE BUNDLE (trust on first use: get the broker's key out of band and pass --key, or "
                "keep --state so later audits hold the broker to this one)"
            )
        by_id: dict[str, str] = {}
        for key in trusted:
            try:
                by_id[note.parse_verifier_key(key)[1].hex()] = key
            except ValueError as exc:
                self.fail("key", f"the verifier key ({source}) is unusable: {exc}")
                return
        history = self.history
        start = {i for i, period in enumerate(history) if period.key_id in by_id}
        if not start:
            # No key of the history is trusted: check every note with the trusted key, which names what is wrong.
            self.fallback, self.key = True, trusted[0]
            self.key_id_hex = note.parse_verifier_key(trusted[0])[1].hex()
            self.fail(
                "key",
                f"the bundle's verifier key {_short(self.bundle_key, 40)} is not the trusted key "
                f"{_short(trusted[0], 40)} ({source}), and no key of its key history is",
            )
            return
        keys = [by_id.get(p.key_id) or p.verifier_key for p in history]
        problems = self._history_problems(keys)
        links = [""] + [self._handover_problem(i, keys) for i in range(1, len(history))]
        established = set(start)
        grown = True
        while grown:  # a handover links both ways: the old key named its successor, the new key its predecessor
            before = len(established)
            established |= {i for i in range(1, len(history)) if not links[i] and i - 1 in established}
            established |= {i - 1 for i in range(1, len(history)) if not links[i] and i in established}
            grown = len(established) > before
        for problem in problems:
            self.fail("key", f"the key history does not chain: {problem}")
        for i, period in enumerate(history):
            if i in established:
                continue
            if period.first_size is None:
                self.skip(
                    "key", f"key {period.key_id} has signed no checkpoint yet: its first one will hand over to it"
                )
            else:
                why = links[i] or "the key before it is not established either"
                self.fail("key", f"key {period.key_id} (checkpoints {period.range()}) is not established: {why}")
        self.established = {history[i].key_id: str(keys[i]).strip() for i in sorted(established) if keys[i]}
        newest = max(established)
        self.key, self.key_id_hex = str(keys[newest]).strip(), history[newest].key_id
        if self.bundle_key.strip() not in {str(k).strip() for k in keys[-1:]}:
            self.fail(
                "key",
                f"the bundle's verifier key {_short(self.bundle_key, 40)} is not the newest key of its key history"
                f" ({history[-1].key_id})",
            )
        if problems:
            return
        names = [
            note.parse_verifier_key(self.established[p.key_id])[0] for p in history if p.key_id in self.established
        ]
        trusted_ids = ", ".join(history[i].key_id for i in sorted(start))
        if len(history) == 1:
            self.ok("key", f"verifier key {names[0]}+{self.key_id_hex}, {source}")
        else:
            chain = " -> ".join(f"{p.key_id} ({p.range()})" for p in history)
            self.ok(
                "key",
                f"key history {chain}: trusted {trusted_ids}, {source}; the others follow by handover checkpoints "
                "cosigned by the key before",
            )

    def _history_problems(self, keys: list[str | None]) -> list[str]:
        """What makes the history not one sequence of keys over consecutive, disjoint ranges of checkpoints. (A
        range's ends need not be in the bundle: a bundle may leave out old checkpoints.)"""
        problems: list[str] = []
        seen: set[str] = set()
        for i, period in enumerate(self.history):
            label = f"key {period.key_id}"
            if period.key_id in seen:
                problems.append(f"{label} appears twice: a retired key signs again")
            seen.add(period.key_id)
            vkey = keys[i]
            if vkey is None:
                problems.append(f"{label} is listed without its verifier key")
            else:
                try:
                    if note.parse_verifier_key(vkey)[1].hex() != period.key_id:
                        problems.append(f"{label} is listed with the verifier key of another key id")
                except ValueError as exc:
                    problems.append(f"{label}'s verifier key is unusable: {exc}")
            if period.first_size is None or period.last_size is None:
                if i != len(self.history) - 1:
                    problems.append(f"{label} signed no checkpoint, yet a later key follows it")
                continue
            if period.first_size > period.last_size:
                problems.append(f"{label}'s range {period.range()} runs backwards")
            previous = self.history[i - 1] if i else None
            if previous is not None and previous.last_size is not None and period.first_size <= previous.last_size:
                problems.append(
                    f"{label}'s range {period.range()} does not follow key {previous.key_id}'s {previous.range()}"
                )
        return problems

    def _handover_problem(self, index: int, keys: list[str | None]) -> str:
        """Why the key at ``index`` is not linked to the key before it, or "" when its handover verifies: its first
        checkpoint, signed by both keys, names the old key handing over to it."""
        period, previous = self.history[index], self.history[index - 1]
        old_key, new_key = keys[index - 1], keys[index]
        where = f"the rotation from key {previous.key_id} to key {period.key_id}"
        if period.handover is None:
            return f"{where} has no handover: the old key did not cosign the new key's first checkpoint"
        if old_key is None or new_key is None:
            return f"{where}: a key is listed without its verifier key"
        try:
            body = note.open_note(period.handover, new_key)
        except ValueError as exc:
            return f"{where}: its handover note is not signed by the new key: {exc}"
        try:
            note.open_note(period.handover, old_key)
        except ValueError as exc:
            return f"{where}: its handover note is not cosigned by the old key: {exc}"
        if body.rotation() != (old_key.strip(), new_key.strip()):
            return f"{where}: its handover note does not name the old key handing over to the new one"
        if (body.origin, body.size) != (self.origin, period.first_size):
            return (
                f"{where}: its handover note is checkpoint {body.size} of {body.origin!r}, not the new key's first,"
                f" {period.first_size}"
            )
        first = next((cp for cp in self.checkpoints if cp.size == period.first_size), None)
        if first is not None and first.note != period.handover:
            return f"{where}: its handover note is not the note of checkpoint {first.size} in the bundle"
        return ""

    def _check_signatures(self) -> None:
        if not self.checkpoints:
            self.skip("signature", "no checkpoints in the bundle")
            return
        if self.key is None:
            self.skip("signature", "checkpoint notes not checked: no usable verifier key")
            return
        owners = {p.key_id: p for p in self.history}
        for cp in self.checkpoints:
            where = f"checkpoint {cp.size}"
            key_id = cp.key_id.lower()
            problems: list[str] = []
            if self.fallback:
                key, key_hex = self.key, self.key_id_hex
            else:
                period = next((p for p in self.history if p.covers(cp.size)), None)
                owner = owners.get(key_id)
                if period is None:
                    if owner is None:
                        self.fail("signature", f"{where}: signed by key {key_id}, which is not in the key history")
                    else:
                        self.fail(
                            "signature",
                            f"{where}: signed by key {key_id} outside its published range {owner.range()}",
                        )
                    continue
                if period.key_id not in self.established:
                    self.fail(
                        "signature",
                        f"{where}: the key history gives it to key {period.key_id}, which is not established (see key)",
                    )
                    continue
                key, key_hex = self.established[period.key_id], period.key_id
                if key_id != period.key_id:
                    problems.append(
                        f"its key_id {cp.key_id!r} is not in the key history"
                        if owner is None
                        else f"its key_id {cp.key_id!r} is a key used outside its published range {owner.range()}"
                    )
            try:
                body = note.open_note(cp.note, key)
            except ValueError as exc:  # NoteError, or a number its parser cannot read
                self.fail("signature", f"{where}: its note does not verify: {exc}{self._signed_by(cp, key_hex)}")
                continue
            if body.origin != self.origin:
                problems.append(f"its note's origin is {body.origin!r}, the bundle's {self.origin!r}")
            if body.size != cp.size:
                problems.append(f"its note states size {body.size}, not {cp.size}")
            if body.root != cp.root:
                problems.append(f"its note states root {_hex(body.root)}, the checkpoint root {_hex(cp.root)}")
            if self.fallback and key_id != self.key_id_hex:
                problems.append(f"its key_id {cp.key_id!r} is not the verifier key's id {self.key_id_hex}")
            if problems:
                self.fail("signature", f"{where}: signature verifies but " + "; ".join(problems))
            else:
                self.ok("signature", f"{where}: note signed by key {key_hex}, stating size {cp.size} and its root")

    def _signed_by(self, cp: _Checkpoint, expected: str) -> str:
        """Who did sign a note that the key the history gives it to did not: a key outside its range, or one
        the history does not hold."""
        owners = {p.key_id: p for p in self.history}
        named = []
        for key_id in dict.fromkeys(i for i in _note_key_ids(cp.note) if i != expected):
            owner = owners.get(key_id)
            if owner is None:
                named.append(f"key {key_id}, which is not in the key history")
            else:
                named.append(f"key {key_id} outside its published range {owner.range()}")
        return f" (it is signed by {' and '.join(named)}; the history gives it to key {expected})" if named else ""

    def _check_consistency(self) -> None:
        if len(self.checkpoints) < 2:
            self.skip("consistency", "fewer than two checkpoints: no consistency proof to check")
            self.consistent_from = 0 if self.checkpoints else None
            return
        last_bad = -1
        for index in range(1, len(self.checkpoints)):
            old, new = self.checkpoints[index - 1], self.checkpoints[index]
            where = f"checkpoints {old.size} -> {new.size}"
            if new.size <= old.size:
                self.fail("consistency", f"{where}: sizes do not strictly increase (checkpoint #{index} of the list)")
                last_bad = index
                continue
            proof = self.proofs.get((old.size, new.size))
            if proof is None:
                self.fail("consistency", f"{where}: the bundle has no consistency proof between them")
                last_bad = index
            elif merkle.verify_consistency(old.size, new.size, old.root, new.root, proof):
                self.ok("consistency", f"{where}: checkpoint {new.size} extends checkpoint {old.size}")
            else:
                self.fail(
                    "consistency",
                    f"{where}: the consistency proof does not verify: checkpoint {new.size} (root {_hex(new.root)})"
                    f" does not extend checkpoint {old.size} (root {_hex(old.root)}), or the proof was altered",
                )
                last_bad = index
        self.consistent_from = last_bad if last_bad >= 0 else 0

    def _read_leaves(self) -> None:
        if not isinstance(self.bundle, dict) or self.bundle.get("leaf_hashes") is None:
            return
        try:
            self.leaves = _hashes(self.bundle["leaf_hashes"], "bundle.leaf_hashes")
        except _Malformed as exc:
            self.fail("roots", f"leaf hashes not usable: {exc}")

    def _check_entries(self) -> None:
        raw = self.bundle.get("entries")
        if raw is None:
            self.skip("entries", "the bundle has no entries (export with --entries to check them)")
            return
        try:
            entries = [_parse_entry(v, f"bundle.entries[{i}]") for i, v in enumerate(_list(raw, "bundle.entries"))]
        except _Malformed as exc:
            self.fail("entries", f"entries not usable: {exc}")
            return
        problems: list[str] = []
        leaves: list[bytes] = []
        expected, prev = 1, GENESIS_HASH
        for entry in entries:
            where = f"entry #{entry.sequence}"
            if entry.sequence != expected:
                found = "a sequence gap" if entry.sequence > expected else "out of order or duplicated"
                problems.append(f"{where}: expected #{expected} at this position, found #{entry.sequence} ({found})")
            if entry.prev_hash != prev:
                previous = (
                    "the genesis hash" if expected == 1 else f"the entry_hash of the entry before (#{expected - 1})"
                )
                problems.append(f"{where}: its prev_hash does not link to {previous}")
            own, leaf = _entry_problems(entry)
            problems.extend(f"{where}: {p}" for p in own)
            if self.leaves is not None and len(leaves) < len(self.leaves) and leaf != self.leaves[len(leaves)]:
                problems.append(f"{where}: its recomputed leaf hash differs from leaf_hashes[{len(leaves)}]")
            leaves.append(leaf)
            expected, prev = entry.sequence + 1, entry.entry_hash
        newest = self.checkpoints[-1].size if self.checkpoints else 0
        if len(entries) < newest:
            problems.append(f"the bundle has {len(entries)} entries but checkpoint {newest} covers {newest}")
        if self.leaves is not None and len(entries) < len(self.leaves):
            problems.append(f"the bundle has {len(self.leaves)} leaf hashes but only {len(entries)} entries")
        for problem in problems[:_MAX_ENTRY_FAILURES]:
            self.fail("entries", problem)
        if len(problems) > _MAX_ENTRY_FAILURES:
            self.fail("entries", f"... and {len(problems) - _MAX_ENTRY_FAILURES} more entry problems")
        if not problems:
            also = " and equal the bundle's leaf hashes" if self.leaves is not None else ""
            span = f"#1..#{len(entries)}" if entries else "none"
            self.ok(
                "entries",
                f"entries {span}: gapless, chained by prev_hash, payload, entry and leaf hashes recompute{also}",
            )
        if len(entries) > newest:
            self.skip("entries", f"{len(entries) - newest} entries after checkpoint {newest}: no checkpoint signs them")
        self.entry_leaves = leaves

    def _check_roots(self) -> None:
        if self.leaves is not None:
            leaves, source = self.leaves, "the bundle's leaf hashes"
        elif self.entry_leaves is not None:
            leaves, source = self.entry_leaves, "the entries"
        else:
            if not self.report.family("roots"):
                self.skip("roots", "the bundle has no leaf hashes or entries: roots not recomputed")
            return
        if not self.checkpoints:
            self.skip("roots", "no checkpoints to recompute")
            return
        roots = merkle.roots_at(leaves, (cp.size for cp in self.checkpoints))
        all_ok = True
        for cp in self.checkpoints:
            where = f"checkpoint {cp.size}"
            if cp.size not in roots:
                self.fail("roots", f"{where}: {source} give only {len(leaves)} leaves, not {cp.size}")
                all_ok = False
            elif roots[cp.size] != cp.root:
                self.fail(
                    "roots",
                    f"{where}: the root recomputed from {source} 1..{cp.size} is {_hex(roots[cp.size])}, "
                    f"the checkpoint's {_hex(cp.root)}",
                )
                all_ok = False
            else:
                self.ok("roots", f"{where}: the root recomputed from {source} matches")
        if len(leaves) > self.checkpoints[-1].size:
            self.skip("roots", f"{len(leaves) - self.checkpoints[-1].size} leaves after the newest checkpoint")
        self.roots_ok = all_ok

    def _check_receipt(self, index: int, value: Any) -> None:
        label = f"receipt[{index}]"
        try:
            obj = _dict(value, label)
            subject = _str(_get(obj, "subject", label), f"{label}.subject")
            label = f"receipt {subject}"
            fmt = _get(obj, "format", label)
            if fmt != RECEIPT_FORMAT:
                raise _Malformed(f"{label}.format", f"is {fmt!r}, not {RECEIPT_FORMAT!r}")
            origin = _str(_get(obj, "origin", label), f"{label}.origin")
            vkey = _str(_get(obj, "verifier_key", label), f"{label}.verifier_key")
            cp_value = _get(obj, "checkpoint", label)
            cp = None if cp_value is None else _parse_checkpoint(cp_value, f"{label}.checkpoint")
            entries = [
                _parse_entry(v, f"{label}.entries[{i}]", with_proof=True)
                for i, v in enumerate(_list(_get(obj, "entries", label), f"{label}.entries"))
            ]
            pending = _list(obj.get("pending", []), f"{label}.pending")
        except _Malformed as exc:
            self.fail("receipt", f"{label} is malformed: {exc}")
            return
        problems = []
        if origin != self.origin:
            problems.append(f"its origin {origin!r} is not the bundle's {self.origin!r}")
        if self.key is not None and vkey.strip() not in {self.key, *self.established.values()}:
            problems.append(f"its verifier key {_short(vkey, 40)} is not the trusted key nor one handed over to")
        if cp is None:
            if entries:
                problems.append("it lists entries with inclusion proofs but no checkpoint")
            for problem in problems:
                self.fail("receipt", f"{label}: {problem}")
            if not problems:
                self.skip("receipt", f"{label}: no checkpoint yet; {len(pending)} pending entries not checked")
            return
        where, problem = self._receipt_checkpoint(cp)
        if problem:
            problems.append(problem)
        for entry in entries:
            at = f"entry #{entry.sequence}"
            if entry.subject != subject:
                problems.append(f"{at}: its subject {entry.subject!r} is not the receipt's")
            own, leaf = _entry_problems(entry)
            problems.extend(f"{at}: {p}" for p in own)
            proof = entry.inclusion_proof or []
            if entry.sequence > cp.size:
                problems.append(f"{at}: not covered by checkpoint {cp.size}")
            elif not merkle.verify_inclusion(leaf, entry.sequence - 1, cp.size, proof, cp.root):
                problems.append(f"{at}: its inclusion proof does not verify against checkpoint {cp.size}'s root")
        for problem in problems:
            self.fail("receipt", f"{label}: {problem}")
        if not problems:
            self.ok("receipt", f"{label}: {len(entries)} entries recompute and are included in {where}")
        if pending:
            self.skip("receipt", f"{label}: {len(pending)} pending entries newer than its checkpoint not checked")

    def _receipt_checkpoint(self, cp: _Checkpoint) -> tuple[str, str]:
        """How the receipt's checkpoint is vouched for ("the bundle's checkpoint 20"), and what is wrong with it."""
        for known in self.checkpoints:
            if known.size == cp.size:
                if known.root == cp.root:
                    return f"the bundle's checkpoint {cp.size}", ""
                return "", (
                    f"its checkpoint {cp.size} has root {_hex(cp.root)}, the bundle's checkpoint {cp.size} has "
                    f"{_hex(known.root)}: two different logs"
                )
        key = self.key if self.fallback else self.established.get(cp.key_id.lower())
        if key is None:
            return "", f"its checkpoint {cp.size} is not in the bundle, and its key {cp.key_id} is not established"
        try:
            body = note.open_note(cp.note, key)
        except ValueError as exc:
            return "", f"its checkpoint {cp.size} is not in the bundle and its note does not verify: {exc}"
        if (body.origin, body.size, body.root) != (self.origin, cp.size, cp.root):
            return "", f"its checkpoint {cp.size} differs from its own signed note"
        return f"checkpoint {cp.size} (not in the bundle; its signed note verifies)", ""

    def _check_anchors(self) -> None:
        anchored = [cp for cp in self.checkpoints if cp.anchor is not None]
        if not anchored:
            self.skip("anchor", "no checkpoint in the bundle is anchored")
            return
        if self.w3 is None:
            sizes = ", ".join(str(cp.size) for cp in anchored)
            self.skip("anchor", f"anchors of checkpoints {sizes} not checked: no chain given (--rpc-url)")
            return
        from ledger.chain import read_anchor  # imports web3: only when anchors are checked

        remembered = self.state.anchor_sender if self.state else None
        if self.given_sender:
            self.sender, source = self.given_sender, "given"
        elif remembered:
            self.sender, source = remembered, "remembered from an earlier audit"
        else:
            self.sender, source = None, "the first anchor's sender (trust on first use)"
        newest_ok: int | None = None
        for index, cp in enumerate(self.checkpoints):
            anchor = cp.anchor
            if anchor is None:
                self.skip("anchor", f"checkpoint {cp.size}: not anchored")
                continue
            where = f"checkpoint {cp.size}: anchor tx {anchor.tx_hash}"
            try:
                record = read_anchor(self.w3, anchor.tx_hash)
            except Exception as exc:  # AnchorError, or the node failing to answer
                self.fail("anchor", f"{where}: {exc}")
                continue
            if self.sender is None:
                self.sender = record.sender
            problems = []
            if (record.size, record.root) != (cp.size, cp.root):
                problems.append(
                    f"the chain holds size {record.size} root {_hex(record.root)}, the checkpoint "
                    f"size {cp.size} root {_hex(cp.root)}"
                )
            if record.chain_id != anchor.chain_id:
                problems.append(f"the node is on chain {record.chain_id}, the anchor was recorded on {anchor.chain_id}")
            if record.block_number != anchor.block_number:
                problems.append(f"it is in block {record.block_number}, recorded as {anchor.block_number}")
            if record.block_hash.lower() != anchor.block_hash.lower():
                problems.append(f"its block hash is {record.block_hash}, recorded as {anchor.block_hash}")
            if not _same_address(record.sender, anchor.sender):
                problems.append(f"it was sent by {record.sender}, recorded as {anchor.sender}")
            if not _same_address(record.sender, self.sender):
                problems.append(
                    f"its sender {record.sender} is not the broker's anchor address {self.sender} ({source})"
                )
            if problems:
                self.fail("anchor", f"{where}: " + "; ".join(problems))
            else:
                self.ok("anchor", f"{where}: the chain states this size and root (block {record.block_number})")
                newest_ok = index
        if newest_ok is None:
            return
        newest = self.checkpoints[-1]
        anchored_cp = self.checkpoints[newest_ok]
        if newest_ok == len(self.checkpoints) - 1:
            self.ok("anchor", f"the newest checkpoint {newest.size} is itself anchored")
        elif self.consistent_from is not None and self.consistent_from <= newest_ok:
            self.ok(
                "anchor",
                f"the newest checkpoint {newest.size} extends the newest anchored one, {anchored_cp.size} "
                "(consistency proofs verify)",
            )
        else:
            self.fail(
                "anchor",
                f"the newest checkpoint {newest.size} is not proven to extend the newest anchored one, "
                f"{anchored_cp.size}: a consistency proof between them failed",
            )

    def _check_state(self) -> None:
        if self.state is None:
            if self.state_value is None:
                self.skip("state", "no saved state from an earlier audit: nothing to hold the log to")
            return
        st = self.state
        where = f"checkpoint {st.size} (root {_hex(st.root)}) seen by an earlier audit"
        if st.origin is not None and st.origin != self.origin:
            self.fail("state", f"the saved state is of log {st.origin!r}, the bundle of {self.origin!r}")
            return
        if not self.checkpoints:
            self.fail("state", f"the bundle has no checkpoints, but {where}")
            return
        newest = self.checkpoints[-1]
        for index, cp in enumerate(self.checkpoints):
            if cp.size != st.size:
                continue
            if cp.root != st.root:
                self.fail(
                    "state",
                    f"{where}: the bundle's checkpoint {cp.size} has root {_hex(cp.root)}: the log was rewritten",
                )
            elif self.consistent_from is None or self.consistent_from > index:
                self.fail("state", f"{where}: present, but the newest checkpoint is not proven to extend it")
            else:
                self.ok("state", f"{where}: still in the log unchanged, and the newest checkpoint extends it")
            return
        if st.size > newest.size:
            self.fail(
                "state",
                f"{where}: the bundle's newest checkpoint is {newest.size}, older: the log was cut back or rewritten",
            )
            return
        for index, cp in enumerate(self.checkpoints):
            proof = self.proofs.get((st.size, cp.size))
            if cp.size < st.size or proof is None:
                continue
            if not merkle.verify_consistency(st.size, cp.size, st.root, cp.root, proof):
                self.fail("state", f"{where}: the bundle's proof that checkpoint {cp.size} extends it does not verify")
            elif self.consistent_from is None or self.consistent_from > index:
                self.fail("state", f"{where}: extended by checkpoint {cp.size}, which the newest does not extend")
            else:
                self.ok("state", f"{where}: checkpoint {cp.size} extends it (consistency proof)")
            return
        leaves = self.leaves if self.leaves is not None else self.entry_leaves
        if leaves is not None and self.roots_ok:
            root = merkle.roots_at(leaves, [st.size]).get(st.size)
            if root == st.root:
                self.ok("state", f"{where}: the leaf hashes of the newest checkpoint give the same root at {st.size}")
            else:
                self.fail(
                    "state",
                    f"{where}: the newest checkpoint's leaves give root {_hex(root or b'')} at {st.size}: "
                    "the log was rewritten",
                )
            return
        self.fail("state", f"{where}: not in the bundle, and no proof or leaf hashes to show the log extends it")

    def new_state(self) -> dict[str, Any] | None:
        """What to save for the next audit (after a successful one); the old state if there is nothing newer."""
        if not self.checkpoints or self.key is None:
            return None if self.state_value is None else dict(self.state_value)
        newest = self.checkpoints[-1]
        sender = self.sender or (self.state.anchor_sender if self.state else None)
        return {
            "format": STATE_FORMAT,
            "origin": self.origin,
            "size": newest.size,
            "root": newest.root.hex(),
            "verifier_key": self.key,
            "anchor_sender": sender,
        }


# --- Reading a broker's public API ------------------------------------------------------------------------------

# Bounds on what the tool reads from a broker: each answer (a page of 10,000 leaf hashes is about 700 KB), how
# deep it nests (the API's answers nest four levels), all answers together, and time: one request, and the audit.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_ANSWER_DEPTH = 16
REQUEST_TIMEOUT_S = 30.0
DEADLINE_S = 600.0
_MAX_REDIRECTS = 3
_MAX_THROTTLED = 5  # answers of 429 waited out (within the deadline) before giving up
_CHECKPOINT_PAGE = 1000
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)
_DECIMAL = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?", re.ASCII)
_LEAF_PAGE = 10_000  # the API's most per page


class FetchError(Exception):
    """The broker's API could not be read: what failed, naming the URL. ``status`` is the HTTP status of an
    answer that was not 200, else None (the broker could not be reached, or its answer broke a bound)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Api:
    """GETs to one broker's API (``<base>/api/v1/``): each with a total deadline (a watchdog shuts the socket when
    it passes, so a peer that trickles bytes cannot stretch it), an answer at most ``max_answer_bytes`` and
    ``MAX_ANSWER_DEPTH`` deep, redirects followed only within the same scheme, host and port."""

    def __init__(self, url: str, *, request_timeout_s: float, deadline_s: float, max_answer_bytes: int) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(f"the broker URL {url!r} is not an http:// or https:// URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise FetchError(f"the broker URL {url!r} has a query, fragment or credentials: give its site root")
        path = parts.path.rstrip("/")
        if not path.endswith("/api/v1"):
            path += "/api/v1"
        self.origin = (parts.scheme, parts.netloc.lower())
        self.root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/", "", ""))
        self.request_timeout_s = request_timeout_s
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.max_answer_bytes = max_answer_bytes
        self.total_bytes = 0

    def get(self, path: str, **query: int) -> dict[str, Any]:
        """The JSON object at ``path`` (relative to the API root) with ``query``. Raises ``FetchError``."""
        url = self.root + path + ("?" + urllib.parse.urlencode(query) if query else "")
        redirects = throttled = 0
        while True:
            status, headers, body = self._get_once(url)
            if status in (301, 302, 303, 307, 308):
                target = urllib.parse.urljoin(url, headers.get("location") or "")
                moved = urllib.parse.urlsplit(target)
                if (moved.scheme, moved.netloc.lower()) != self.origin:
                    raise FetchError(f"{url} redirects to {_short(target, 80)}, another host: not followed", status)
                redirects += 1
                if redirects > _MAX_REDIRECTS:
                    raise FetchError(f"{url} redirects more than {_MAX_REDIRECTS} times", status)
                url = target
                continue
            if status == 429 and throttled < _MAX_THROTTLED:
                wait = headers.get("retry-after", "")
                seconds = float(wait) if _DIGITS.fullmatch(wait) else 1.0
                if time.monotonic() + seconds < self.deadline:
                    throttled += 1
                    time.sleep(seconds)  # the broker's rate limit: it says when to come back
                    continue
            if status != 200:
                raise FetchError(f"{url} answered HTTP {status}{_error_detail(body)}", status)
            try:
                value = bounded_json(body, max_bytes=self.max_answer_bytes, max_depth=MAX_ANSWER_DEPTH)
            except ValueError as exc:
                raise FetchError(f"{url}: the answer is not JSON within the tool's bounds: {exc}") from None
            if not isinstance(value, dict):
                raise FetchError(f"{url}: the answer is {_kind(value)}, not a JSON object")
            return value

    def _get_once(self, url: str) -> tuple[int, dict[str, str], bytes]:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"{url}: not asked, the audit's deadline of {self.deadline_s:g} s has passed")
        budget = min(self.request_timeout_s, remaining)
        parts = urllib.parse.urlsplit(url)
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = connection_class(parts.hostname or "", parts.port, timeout=budget)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(budget, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            target = urllib.parse.urlunsplit(("", "", parts.path, parts.query, ""))
            connection.request("GET", target, headers={"Accept": "application/json", "User-Agent": "ledger-audit/1"})
            response = connection.getresponse()
            length = response.getheader("Content-Length") or ""
            if _DIGITS.fullmatch(length) and int(length) > self.max_answer_bytes:
                raise FetchError(
                    f"{url}: the answer is {length} bytes, over the {self.max_answer_bytes} this tool reads"
                )
            chunks, size = [], 0
            while chunk := response.read1(64 * 1024):
                size += len(chunk)
                if size > self.max_answer_bytes:
                    raise FetchError(f"{url}: the answer is over the {self.max_answer_bytes} bytes this tool reads")
                chunks.append(chunk)
            if expired.is_set():  # the watchdog's shutdown reads as the end of the answer: a cut one
                raise TimeoutError
            self.total_bytes += size
            if self.total_bytes > MAX_INPUT_BYTES:
                raise FetchError(f"{url}: the broker's answers add up to over {MAX_INPUT_BYTES} bytes")
            headers = {name.lower(): value for name, value in response.getheaders()}
            return response.status, headers, b"".join(chunks)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                if budget < self.request_timeout_s:
                    raise FetchError(
                        f"{url}: no whole answer before the audit's deadline of {self.deadline_s:g} s"
                    ) from None
                raise FetchError(f"{url}: no whole answer within {budget:g} s") from None
            raise FetchError(f"cannot read {url}: {type(exc).__name__}: {exc}") from None
        finally:
            watchdog.cancel()
            connection.close()


def _error_detail(body: bytes) -> str:
    """The API's error message (``{"error": {"code", "message"}}``), shortened, for the line naming a failure."""
    try:
        error = bounded_json(body, max_bytes=64 * 1024, max_depth=MAX_ANSWER_DEPTH).get("error", {})
        return f": {_short(str(error.get('code')), 40)}: {_short(str(error.get('message')), 200)}"
    except (ValueError, AttributeError):
        return ""


def _size_of(row: Any) -> int | None:
    size = row.get("size") if isinstance(row, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def bundle_from_api(
    url: str,
    *,
    state: Any = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    deadline_s: float = DEADLINE_S,
    max_answer_bytes: int = MAX_ANSWER_BYTES,
) -> dict[str, Any]:
    """The audit bundle of the broker at ``url`` (its site root, or its ``/api/v1``), assembled from the public
    ledger endpoints alone: ``ledger/key`` (origin, key and key history), every page of ``ledger/checkpoints``
    (with their anchors), ``ledger/consistency`` between successive checkpoints and from the checkpoint ``state``
    remembers when the broker no longer lists it, and ``ledger/leaves`` up to the newest checkpoint. ``audit``
    checks it as it checks an exported one; nothing here is trusted.

    A proof the broker refuses (HTTP 400 or 404) is left out, for the audit to fail the check that needed it.
    Raises ``FetchError`` naming the URL when the broker cannot be read: unreachable, an answer not 200, over
    ``max_answer_bytes`` or too deep, a redirect to another host, ``request_timeout_s`` per request or
    ``deadline_s`` for all of them passed.
    """
    api = _Api(url, request_timeout_s=request_timeout_s, deadline_s=deadline_s, max_answer_bytes=max_answer_bytes)
    key = api.get("ledger/key")
    rows: list[Any] = []
    after = 0
    while True:
        page = api.get("ledger/checkpoints", after=after, limit=_CHECKPOINT_PAGE)
        if not isinstance(page.get("checkpoints"), list):
            raise FetchError(f"{api.root}ledger/checkpoints: the answer's checkpoints is not a list")
        rows.extend(page["checkpoints"])
        following = page.get("next_after")
        if following is None:
            break
        if not isinstance(following, int) or isinstance(following, bool) or following <= after:
            raise FetchError(f"{api.root}ledger/checkpoints: next_after {_short(repr(following))} does not advance")
        after = following
    sizes = [size for size in map(_size_of, rows) if size is not None]
    pairs = [(old, new) for old, new in itertools.pairwise(sizes) if old < new]
    remembered = _size_of(state)
    if remembered is not None and remembered not in sizes and sizes and remembered < sizes[-1]:
        pairs.append((remembered, min(size for size in sizes if size > remembered)))
    consistency = []
    for old, new in pairs:
        try:
            consistency.append(api.get("ledger/consistency", old=old, new=new))
        except FetchError as exc:
            if exc.status not in (400, 404):
                raise
    leaves: list[Any] = []
    newest = max(sizes, default=0)
    while len(leaves) < newest:
        start = len(leaves) + 1
        page = api.get("ledger/leaves", start=start, limit=min(_LEAF_PAGE, newest - len(leaves)))
        hashes = page.get("leaf_hashes")
        if page.get("start") != start or not isinstance(hashes, list):
            raise FetchError(f"{api.root}ledger/leaves?start={start}: not a page of leaf hashes from #{start}")
        if not hashes:
            break  # fewer leaves than the newest checkpoint covers: the roots check says so
        leaves.extend(hashes)
    return {
        "format": BUNDLE_FORMAT,
        "origin": key.get("origin"),
        "verifier_key": key.get("verifier_key"),
        "key_history": key.get("key_history"),
        "checkpoints": rows,
        "consistency": consistency,
        "leaf_hashes": leaves[:newest],
    }


# --- The command line ------------------------------------------------------------------------------------------


class _Unreadable(Exception):
    """An input the tool cannot start from: exit status 2."""


# What the tool reads: bundles, receipts and its state file, nesting a handful of levels. A file beyond these
# bounds is refused before the decoder recurses through it.
MAX_INPUT_BYTES = 512 * 1024 * 1024
MAX_INPUT_DEPTH = 64


def _load_json(path: str, what: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Unreadable(f"cannot read {what} {path}: {exc}") from None
    try:
        value = bounded_json(text, max_bytes=MAX_INPUT_BYTES, max_depth=MAX_INPUT_DEPTH)
    except ValueError as exc:
        raise _Unreadable(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Unreadable(f"{what} {path} is {_kind(value)}, not a JSON object")
    return value


def _expect_format(value: dict[str, Any], expected: str, what: str, path: str) -> None:
    if value.get("format") != expected:
        raise _Unreadable(f"{what} {path} is not a {expected} document (its format is {value.get('format')!r})")


def _write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file in one step, so a crash never leaves half of one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _seconds(text: str) -> float:
    """An argparse type: seconds written with the digits 0-9 (``float`` would take other scripts' digits and
    exponents), from 0.1 to a day."""
    if not _DECIMAL.fullmatch(text.strip()) or not 0.1 <= float(text) <= 86_400:
        raise argparse.ArgumentTypeError(f"seconds from 0.1 to 86400 in the digits 0-9, not {text[:40]!r}")
    return float(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ledger.audit",
        description="Audit the broker's ledger: from its public API (--url) or an exported audit bundle, and receipts.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("bundle", nargs="?", help="the audit bundle (manage.py ledger export --out bundle.json)")
    source.add_argument(
        "--url", metavar="URL", help="the broker's site (http://127.0.0.1:8000): read its public ledger endpoints"
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=REQUEST_TIMEOUT_S,
        metavar="S",
        help=f"with --url: seconds for each request, start to end (default {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--deadline",
        type=_seconds,
        default=DEADLINE_S,
        metavar="S",
        help=f"with --url: seconds for reading the whole ledger (default {DEADLINE_S:g})",
    )
    parser.add_argument("--receipt", action="append", default=[], metavar="R.json", help="an order's receipt")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--key",
        action="append",
        metavar="VKEY",
        help="the broker's verifier key, obtained out of band (repeat for a rotation its old key did not cosign)",
    )
    keys.add_argument("--key-file", metavar="F", help="a file holding the verifier key(s), one a line")
    parser.add_argument("--rpc-url", metavar="URL", help="a JSON-RPC node of the anchor chain: check anchors")
    parser.add_argument("--anchor-sender", metavar="ADDR", help="the broker's anchor address, if known")
    parser.add_argument(
        "--state", metavar="STATE.json", help="the state of the last audit: read, and rewritten on success"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # names from the bundle must not crash a non-UTF-8 terminal
            stream.reconfigure(errors="backslashreplace")
    try:
        if args.bundle is not None:
            bundle = _load_json(args.bundle, "bundle")
            _expect_format(bundle, BUNDLE_FORMAT, "bundle", args.bundle)
        receipts = []
        for path in args.receipt:
            receipt = _load_json(path, "receipt")
            _expect_format(receipt, RECEIPT_FORMAT, "receipt", path)
            receipts.append(receipt)
        key: list[str] | None = args.key
        if args.key_file:
            try:
                key = Path(args.key_file).read_text(encoding="utf-8").split()
            except (OSError, UnicodeDecodeError) as exc:
                raise _Unreadable(f"cannot read key file {args.key_file}: {exc}") from None
            if not key:
                raise _Unreadable(f"the key file {args.key_file} holds no verifier key")
        for one in key or []:
            try:
                note.parse_verifier_key(one)
            except ValueError as exc:
                raise _Unreadable(f"the verifier key is unusable: {exc}") from None
        state = None
        if args.state and Path(args.state).exists():
            state = _load_json(args.state, "state file")
            try:
                _parse_state(state)
            except _Malformed as exc:
                raise _Unreadable(f"state file {args.state} is malformed: {exc}") from None
        if args.url is not None:
            try:
                bundle = bundle_from_api(
                    args.url, state=state, request_timeout_s=args.timeout, deadline_s=args.deadline
                )
            except FetchError as exc:
                raise _Unreadable(f"cannot read the broker's ledger at {args.url}: {exc}") from None
    except _Unreadable as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    w3 = None
    if args.rpc_url:
        from ledger.chain import Web3  # imported there with the process's recursion limit kept

        w3 = Web3(Web3.HTTPProvider(args.rpc_url, request_kwargs={"timeout": 30}))
    report = audit(bundle, receipts=receipts, w3=w3, trusted_key=key, state=state, anchor_sender=args.anchor_sender)
    print(report.text())
    if not report.ok:
        return 1
    if args.state and report.state is not None:
        try:
            _write_state(Path(args.state), report.state)
        except OSError as exc:
            print(f"audit: passed, but the state file {args.state} could not be written: {exc}", file=sys.stderr)
            return 2
        print(f"state saved to {args.state}: checkpoint {report.state['size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
