"""``manage.py ledger verify|sequence|checkpoint|export|erase``: check, chain, sign, publish and erase."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ledger.anchoring import chain
from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.keys import verifier_key
from ledger.receipts import audit_bundle
from ledger.services import ledger_sequence, ledger_sequence_follow, ledger_verify, personal_erase


class Command(BaseCommand):
    help = (
        "Ledger operations: verify the chain and checkpoints, sign a checkpoint, export for auditors, erase a person."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("verify", help="recompute the chain, roots, signatures and anchors; exit 1 on tampering")
        sequence = sub.add_parser("sequence", help="chain the queued entries; with --follow, keep doing so (a process)")
        sequence.add_argument("--follow", action="store_true", help="run as the sequencer process until stopped")
        sequence.add_argument(
            "--idle", type=float, default=0.02, help="seconds between looks when nothing is queued (default 0.02)"
        )
        sub.add_parser("checkpoint", help="sign a checkpoint now if the ledger grew, and anchor pending ones")
        export = sub.add_parser("export", help="write the audit bundle (checkpoints, proofs, leaf hashes) as JSON")
        export.add_argument("--out", required=True, help="file to write")
        export.add_argument("--entries", action="store_true", help="include every entry (trusted auditors only)")
        erase = sub.add_parser("erase", help="erase a person's personal data; entries and proofs stay valid")
        erase.add_argument("--person", required=True, help="whose data, e.g. user:42")
        erase.add_argument("--reason", required=True, help="why, for the record (no personal data)")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "verify":
            self._verify()
        elif action == "sequence":
            self._sequence(follow=options["follow"], idle_s=options["idle"])
        elif action == "checkpoint":
            made = ledger_checkpoint_and_anchor()
            self.stdout.write("no new entries since the last checkpoint" if made is None else f"checkpoint {made.size}")
        elif action == "export":
            bundle = audit_bundle(with_leaves=True, with_entries=options["entries"])
            Path(options["out"]).write_text(json.dumps(bundle, indent=1) + "\n")
            self.stdout.write(f"wrote {len(bundle['checkpoints'])} checkpoints to {options['out']}")
        elif action == "erase":
            erased = personal_erase(person=options["person"], reason=options["reason"])
            self.stdout.write(f"erased {erased} personal data record(s) of {options['person']}")

    def _sequence(self, *, follow: bool, idle_s: float) -> None:
        if not follow:
            self.stdout.write(f"chained {ledger_sequence()} queued entries")
            return
        if not 0.001 <= idle_s <= 60:
            raise CommandError(f"--idle must be between 0.001 and 60 seconds, not {idle_s}")
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"ledger sequencer: chaining queued entries (looking every {idle_s} s when idle)")
        self.stdout.flush()
        chained = ledger_sequence_follow(stop=stop, idle_s=idle_s)
        self.stdout.write(f"ledger sequencer stopped after chaining {chained} entries")

    def _verify(self) -> None:
        # The embedded test chain lives in the process that wrote the anchors: only a real chain can be asked.
        anchors = chain() if settings.LEDGER_CHAIN_RPC_URL else None
        result = ledger_verify(chain=anchors)
        if not result.ok:
            where = f"entry #{result.first_bad_sequence}: " if result.first_bad_sequence else ""
            raise CommandError(f"ledger verification FAILED at {where}{result.problem}")
        checked = (
            "and anchors on the chain" if anchors is not None else "(anchors not checked: no LEDGER_CHAIN_RPC_URL)"
        )
        self.stdout.write(f"ledger OK: {result.entries_checked} entries, chain, head, checkpoints {checked}")
        self.stdout.write(f"verifier key: {verifier_key()}")
