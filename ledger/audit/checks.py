"""``audit``: one run of every check on a bundle and its receipts, in order, into one report. The checks
themselves live in ``signatures``, ``proofs``, ``anchors`` and ``state``; this module only puts them together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ledger.audit.anchors import _AnchorChecks
from ledger.audit.proofs import _ProofChecks
from ledger.audit.report import AuditReport
from ledger.audit.signatures import _SignatureChecks
from ledger.audit.state import _StateChecks

if TYPE_CHECKING:
    from web3 import Web3


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


class _Audit(_SignatureChecks, _ProofChecks, _AnchorChecks, _StateChecks):
    """Every family of checks, run in order: a later one reads what an earlier one established."""

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
