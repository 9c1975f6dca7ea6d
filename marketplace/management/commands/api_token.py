"""``manage.py api_token create alice [--organization Acme] [--name laptop] [--scope offers:read ...]`` prints a
new ``brk_…`` token, the one kind of token the API, the CLI and the storefront's API tokens page share;
``manage.py api_token revoke brk_abcdefgh`` revokes the tokens whose listed prefix is that."""

from __future__ import annotations

import argparse
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from marketplace.api.tokens import ROLE_SCOPES, api_token_create, api_token_revoke
from marketplace.models import ApiToken, Membership, OrganizationKind


class Command(BaseCommand):
    help = "Create or revoke the broker's API tokens (brk_…), as the storefront's API tokens page does."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="print a new token (shown once)")
        create.add_argument("username")
        create.add_argument("--organization", help="the buyer organisation's name (needed if the user has several)")
        create.add_argument("--name", default="manage.py", help="what the token is for, shown in token lists")
        create.add_argument(
            "--scope", action="append", dest="scopes", help="repeatable; default every scope the user's role allows"
        )
        revoke = sub.add_parser("revoke", help="revoke by the prefix token lists show (brk_ and 8 characters)")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "revoke":
            tokens = list(ApiToken.objects.filter(prefix=options["prefix"], revoked_at__isnull=True))
            if not tokens:
                raise CommandError(f"no live token has the prefix {options['prefix']!r}")
            for token in tokens:
                api_token_revoke(token=token)
                self.stdout.write(f"revoked {token} of {token.organization}")
            return
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        memberships = Membership.objects.select_related("organization").filter(
            user=user, organization__kind=OrganizationKind.BUYER
        )
        if options["organization"]:
            memberships = memberships.filter(organization__name=options["organization"])
        found = list(memberships.order_by("organization__name"))
        if len(found) != 1:
            names = ", ".join(m.organization.name for m in found) or "none"
            raise CommandError(
                f"{user} must be in exactly one buyer organisation named by --organization (in: {names})"
            )
        membership = found[0]
        scopes = options["scopes"] or sorted(ROLE_SCOPES.get(membership.role, frozenset()))
        try:
            issued = api_token_create(
                organization=membership.organization, user=user, name=options["name"], scopes=scopes
            )
        except (PermissionError, ValueError) as error:
            raise CommandError(str(error)) from None
        self.stderr.write(f"token {issued.token} for {user} in {membership.organization}, scopes {' '.join(scopes)}")
        self.stdout.write(issued.raw)
