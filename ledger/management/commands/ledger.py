"""``manage.py ledger verify``: recompute the chain and exit non-zero on any tampering."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.services import ledger_verify


class Command(BaseCommand):
    help = "Ledger operations. `ledger verify` recomputes every hash and names the first bad entry."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("verify", help="recompute the hash chain; exit 1 on tampering")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "verify":
            result = ledger_verify()
            if not result.ok:
                where = f"entry #{result.first_bad_sequence}: " if result.first_bad_sequence else ""
                raise CommandError(f"ledger verification FAILED at {where}{result.problem}")
            self.stdout.write(f"ledger OK: {result.entries_checked} entries, chain and head verified")
