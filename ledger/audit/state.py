"""The audit's memory between runs: the check that the log still holds, unchanged or extended, the checkpoint an
earlier audit saw, and the state to save for the next one."""

from __future__ import annotations

from typing import Any

from ledger import merkle
from ledger.audit.inputs import STATE_FORMAT, _hex
from ledger.audit.run import _AuditRun


class _StateChecks(_AuditRun):
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
