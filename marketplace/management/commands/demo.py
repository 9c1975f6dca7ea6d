"""``manage.py demo seed``: the demo buyer, provider and sandbox cloud account used by the run command."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from marketplace.demo import DEMO_PASSWORD
from marketplace.models import Membership, Organization, OrganizationKind, Role
from providers.services import provider_account_connect


class Command(BaseCommand):
    help = "Seed the demo buyer (alice), provider admin (petra) and an AWS account pointed at the sandbox."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        seed = sub.add_parser("seed")
        seed.add_argument("--aws-endpoint", required=True, help="the AWS sandbox URL")
        seed.add_argument("--aws-regions", required=True, help="comma-separated regions")

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
        account = provider_account_connect(
            provider_name="Petra Cloud Resale",
            kind="aws",
            name="aws-sandbox",
            credentials={"access_key_id": "AKIDEMOSANDBOX000001", "secret_access_key": "sandbox-secret"},
            regions=[r.strip() for r in options["aws_regions"].split(",") if r.strip()],
            endpoint_url=options["aws_endpoint"],
        )
        seller, _ = Organization.objects.get_or_create(
            name="Petra Cloud Resale", defaults={"kind": OrganizationKind.PROVIDER, "provider": account.provider}
        )
        Membership.objects.get_or_create(user=petra, organization=seller, defaults={"role": Role.OWNER})
        self.stdout.write(json.dumps({"buyer": "alice", "provider_admin": "petra", "aws_account": account.pk}))
