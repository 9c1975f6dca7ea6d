"""The audit's checks of the log itself: consistency proofs between checkpoints, the Merkle roots recomputed from
the leaf hashes, the entries' hashes and links recomputed from their fields, and each receipt's inclusion proofs."""

from __future__ import annotations

from typing import Any

from ledger import merkle, note
from ledger.audit.inputs import (
    RECEIPT_FORMAT,
    _Checkpoint,
    _dict,
    _Entry,
    _get,
    _hex,
    _list,
    _Malformed,
    _parse_checkpoint,
    _parse_entry,
    _short,
    _str,
)
from ledger.audit.run import _AuditRun
from ledger.canonical import entry_envelope, sha256_hex

GENESIS_HASH = "0" * 64

# A rewritten chain breaks every entry after the first changed one: name the first few, count the rest.
_MAX_ENTRY_FAILURES = 10


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


class _ProofChecks(_AuditRun):
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
