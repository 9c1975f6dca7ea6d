"""``manage.py offers sync`` and ``manage.py offers list``."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count
from django.utils import timezone

from marketplace.api.serializers import OfferOutput
from marketplace.catalog.selectors import OfferFilters, offer_list
from marketplace.catalog.services import offers_sync
from marketplace.models import QuarantinedOffer
from providers.models import ProviderAccount


class Command(BaseCommand):
    help = "Offers. `offers sync [--account ID]` fetches from the providers; `offers list` prints JSON."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sync = sub.add_parser("sync", help="sync offers from every enabled account (or one)")
        sync.add_argument("--account", type=int, help="account id")
        sync.add_argument(
            "--keep-going",
            action="store_true",
            help="exit 0 when some accounts fail (each failure is still printed and kept on the account)",
        )
        listing = sub.add_parser("list", help="print offers for sale as JSON")
        listing.add_argument("--gpu", default="")
        listing.add_argument("--count", type=int)
        listing.add_argument("--region", default="")
        listing.add_argument("--pricing", default="", choices=["", "on_demand", "spot", "reserved"])
        listing.add_argument("--max-price", type=Decimal)
        listing.add_argument("--limit", type=int, default=100)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "sync":
            self._sync(options.get("account"), keep_going=options.get("keep_going", False))
        else:
            self._list(options)

    def _sync(self, account_id: int | None, *, keep_going: bool = False) -> None:
        accounts = ProviderAccount.objects.filter(enabled=True)
        if account_id is not None:
            accounts = ProviderAccount.objects.filter(pk=account_id)
            if not accounts.exists():
                raise CommandError(f"no provider account {account_id}")
        failed = 0
        for account in accounts.order_by("pk"):
            outcome = offers_sync(account_id=account.pk)
            if outcome.ok and outcome.report is not None:
                r = outcome.report
                self.stdout.write(
                    f"account {account.pk} ({account}): {r.upserted} offers, {r.quarantined} quarantined, "
                    f"{r.vanished} no longer listed, {r.price_changes} price changes"
                )
                if r.quarantined:
                    self.stdout.write(_quarantine_note(account))
            else:
                failed += 1
                self.stderr.write(f"account {account.pk} ({account}): sync FAILED: {outcome.error}")
        if failed and not keep_going:
            raise CommandError(f"{failed} account(s) failed to sync")
        if failed:
            self.stderr.write(f"{failed} account(s) failed to sync: their offers are not for sale until one syncs")

    def _list(self, options: dict[str, Any]) -> None:
        filters = OfferFilters(
            gpu_model=options["gpu"],
            min_gpu_count=options["count"],
            region=options["region"],
            pricing_model=options["pricing"],
            max_price_per_hour=options["max_price"],
        )
        offers = offer_list(filters=filters, now=timezone.now())[: options["limit"]]
        self.stdout.write(json.dumps(OfferOutput(offers, many=True).data, indent=2, default=str))


def _quarantine_note(account: ProviderAccount) -> str:
    """What "quarantined" means for this account: rows it listed that cannot be sold, and the commonest reasons."""
    reasons = (
        QuarantinedOffer.objects.filter(account=account)
        .values("reason")
        .annotate(rows=Count("id"))
        .order_by("-rows", "reason")[:3]
    )
    said = "; ".join(f"{r['rows']} x {r['reason']}" for r in reasons)
    return (
        f"  quarantined: rows the provider listed that the broker will not sell (kept with the reason for the "
        f"provider and staff: admin > Quarantined offers): {said}"
    )
