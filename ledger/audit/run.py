"""One audit run's shared state: its inputs, what the checks have established so far (the trusted keys, the
leaves, which checkpoints are proven consistent), the report it writes, and the reading of the bundle and the
state into records. Each family of checks (``signatures``, ``proofs``, ``anchors``, ``state``) extends this class;
``checks`` puts them together in the order they run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ledger import note
from ledger.audit.inputs import (
    BUNDLE_FORMAT,
    _Checkpoint,
    _dict,
    _get,
    _hashes,
    _int,
    _KeyPeriod,
    _list,
    _Malformed,
    _parse_checkpoint,
    _parse_key_period,
    _parse_state,
    _State,
    _str,
)
from ledger.audit.report import FAILED, NOT_CHECKED, OK, AuditReport, Check

if TYPE_CHECKING:
    from web3 import Web3


class _AuditRun:
    """One audit of one bundle: the inputs, what is established as the checks go, and the report."""

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

    def _read_leaves(self) -> None:
        if not isinstance(self.bundle, dict) or self.bundle.get("leaf_hashes") is None:
            return
        try:
            self.leaves = _hashes(self.bundle["leaf_hashes"], "bundle.leaf_hashes")
        except _Malformed as exc:
            self.fail("roots", f"leaf hashes not usable: {exc}")
