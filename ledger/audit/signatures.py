"""The audit's checks of trust: which keys are trusted (given, remembered or first seen), that the bundle's key
history chains through handovers signed by both keys, and that every checkpoint's note is signed by the key whose
range holds it and states the checkpoint's size and root."""

from __future__ import annotations

from ledger import note
from ledger.audit.inputs import _Checkpoint, _hex, _note_key_ids, _short
from ledger.audit.run import _AuditRun


class _SignatureChecks(_AuditRun):
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
