"""``manage.py provider connect``: connect a provider's account on a cloud, checking the credentials."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from providers.errors import ProviderError
from providers.models import ProviderKind
from providers.services import AccountInvalid, adapter_for_account, provider_account_connect


class Command(BaseCommand):
    help = "Provider accounts. `provider connect --kind aws --name NAME --credential KEY=VALUE ... --regions R1,R2`"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        connect = sub.add_parser("connect", help="create or update an account and check its credentials")
        connect.add_argument("--provider", required=True, help="the seller's name (created if new)")
        connect.add_argument("--kind", required=True, choices=ProviderKind.values)
        connect.add_argument("--name", required=True, help="the account's name within the provider")
        connect.add_argument(
            "--credential",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="repeat per field, e.g. access_key_id=... secret_access_key=...",
        )
        connect.add_argument("--endpoint-url", default="", help="endpoint override (sandbox, sovereign region)")
        connect.add_argument("--regions", required=True, help="comma-separated regions")
        connect.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
        connect.add_argument("--no-check", action="store_true", help="save without the live credentials check")

    @staticmethod
    def _pairs(items: list[str], what: str) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--{what} {item.split('=')[0]!r}: expected KEY=VALUE")
            pairs[key.strip()] = value
        return pairs

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            account = provider_account_connect(
                provider_name=options["provider"],
                kind=options["kind"],
                name=options["name"],
                credentials=self._pairs(options["credential"], "credential"),
                regions=[r.strip() for r in options["regions"].split(",") if r.strip()],
                endpoint_url=options["endpoint_url"],
                options=self._pairs(options["option"], "option"),
            )
        except AccountInvalid as exc:
            raise CommandError(str(exc)) from None
        if not options["no_check"]:
            try:
                adapter_for_account(account).check_credentials()
            except ProviderError as exc:
                raise CommandError(f"account {account.pk} saved, but the provider refused it: {exc}") from None
        self.stdout.write(json.dumps({"account": account.pk, "kind": account.kind, "regions": account.regions}))
