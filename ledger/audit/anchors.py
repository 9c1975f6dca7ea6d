"""The audit's check of the anchors: each anchor transaction, read from a node of the chain, states its
checkpoint's size and root and comes from the broker's anchor address, and the newest checkpoint is anchored or
proven to extend an anchored one. ``ledger.chain`` (hence web3) is imported only when anchors are checked."""

from __future__ import annotations

from ledger.audit.inputs import _hex
from ledger.audit.run import _AuditRun


def _same_address(a: str, b: str) -> bool:
    return a.lower() == b.lower()


class _AnchorChecks(_AuditRun):
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
