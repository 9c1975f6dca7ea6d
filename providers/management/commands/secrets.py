"""``manage.py secrets rotate``: re-encrypt every stored secret with the newest key of ``BROKER_SECRETS_KEYS``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from providers.secrets import SecretUnreadable, secrets_rotate


class Command(BaseCommand):
    help = (
        "Stored secrets. `secrets rotate`: put the new key first in BROKER_SECRETS_KEYS (keep the old ones after "
        "it), run this, then drop the old keys."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("rotate", help="re-encrypt every stored secret with the first (newest) key")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = secrets_rotate()
        except SecretUnreadable as exc:
            raise CommandError(str(exc)) from None
        for where, count in sorted(report.rotated.items()):
            self.stdout.write(f"{where}: {count}")
        self.stdout.write(
            f"rotated {report.total} secret{'s' if report.total != 1 else ''} to the newest of {report.keys} key(s)"
        )
