"""``manage.py fx list`` and ``manage.py fx set CNY 0.1385 --source "..." [--as-of 2026-12-01]``."""

from __future__ import annotations

import argparse
import datetime as dt
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from marketplace.models import FxRate


class Command(BaseCommand):
    help = "FX rates used to convert offer prices to USD (applied at the next offer sync)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        setter = sub.add_parser("set")
        setter.add_argument("currency")
        setter.add_argument("usd_per_unit")
        setter.add_argument("--source", required=True, help="where the rate comes from")
        setter.add_argument("--as-of", default=None, help="YYYY-MM-DD (default today)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "list":
            for rate in FxRate.objects.order_by("currency"):
                self.stdout.write(f"{rate.currency} {rate.usd_per_unit} USD  as of {rate.as_of}  ({rate.source})")
            return
        currency = options["currency"].upper()
        if len(currency) != 3 or not currency.isalpha() or currency == "USD":
            raise CommandError(f"currency {options['currency']!r}: expected a 3-letter ISO code other than USD")
        try:
            rate = Decimal(options["usd_per_unit"])
        except InvalidOperation:
            raise CommandError(f"usd_per_unit {options['usd_per_unit']!r} is not a number") from None
        if rate <= 0:
            raise CommandError("usd_per_unit must be positive")
        try:
            as_of = dt.date.fromisoformat(options["as_of"]) if options["as_of"] else dt.date.today()
        except ValueError:
            raise CommandError(f"--as-of {options['as_of']!r} is not YYYY-MM-DD") from None
        FxRate.objects.update_or_create(
            currency=currency, defaults={"usd_per_unit": rate, "source": options["source"][:255], "as_of": as_of}
        )
        self.stdout.write(f"{currency} = {rate} USD as of {as_of}; offers are re-converted at their next sync")
