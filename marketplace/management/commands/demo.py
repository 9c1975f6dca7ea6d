"""``manage.py demo seed``: the demo buyer, provider and sandbox cloud account used by the run command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from marketplace.demo import DEMO_PASSWORD
from marketplace.models import Membership, Organization, OrganizationKind, Role
from providers.sandbox.demo import read_manifest
from providers.services import provider_account_connect


class Command(BaseCommand):
    help = "Seed the demo buyer (alice), provider admin (petra) and one account per running sandbox cloud."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        seed = sub.add_parser("seed")
        seed.add_argument("--sandbox-manifest", required=True, help="the JSON file the running sandbox wrote")

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        alice, created = users.objects.get_or_create(username="alice", defaults={"email": "alice@example.com"})
        if created:
            alice.set_password(DEMO_PASSWORD)
            alice.save()
        petra, created = users.objects.get_or_create(username="petra", defaults={"email": "petra@example.com"})
        if created:
            petra.set_password(DEMO_PASSWORD)
            petra.save()
        buyer, _ = Organization.objects.get_or_create(name="Acme Research", defaults={"kind": OrganizationKind.BUYER})
        Membership.objects.get_or_create(user=alice, organization=buyer, defaults={"role": Role.OWNER})
        accounts = [
            provider_account_connect(
                provider_name="Petra Cloud Resale",
                kind=spec.kind,
                name=f"{spec.kind}-sandbox",
                credentials=spec.credentials,
                regions=spec.demo_regions,
                endpoint_url=spec.endpoint_url,
                options=spec.options,
            )
            for spec in read_manifest(Path(options["sandbox_manifest"]))
        ]
        account = accounts[0]
        seller, _ = Organization.objects.get_or_create(
            name="Petra Cloud Resale", defaults={"kind": OrganizationKind.PROVIDER, "provider": account.provider}
        )
        Membership.objects.get_or_create(user=petra, organization=seller, defaults={"role": Role.OWNER})
        self.stdout.write(
            json.dumps({"buyer": "alice", "provider_admin": "petra", "accounts": {a.kind: a.pk for a in accounts}})
        )
