"""``manage.py reconcile [--day YYYY-MM-DD]``: match a day's Stripe movements against the book now (today by
default), as the hourly ``reconcile-stripe`` job does, and list what disagrees."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from marketplace.billing.reconciliation import reconcile_day
from marketplace.billing.stripe_gateway import PaymentError


class Command(BaseCommand):
    help = "Reconcile one day of Stripe's balance transactions and payouts against the book."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--day", default=None, help="YYYY-MM-DD, UTC (default today)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            day = dt.date.fromisoformat(options["day"]) if options["day"] else timezone.now().date()
        except ValueError:
            raise CommandError(f"--day {options['day'][:20]!r}: expected YYYY-MM-DD") from None
        try:
            run = reconcile_day(day)
        except PaymentError as exc:
            raise CommandError(f"Stripe could not be read: {exc.code}: {exc.message}") from None
        self.stdout.write(
            f"reconciliation {run.day}: {run.stripe_items} Stripe movement(s), {run.book_items} book entr(ies), "
            f"{run.matched} matched, {run.mismatches} mismatch(es)"
        )
        for mismatch in run.found.order_by("pk"):
            self.stdout.write(f"  {mismatch.kind}: {mismatch.detail}")
