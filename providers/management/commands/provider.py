"""``manage.py provider connect``: connect a provider's account on a cloud, checking the credentials."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from providers.errors import CredentialsRejected, ProviderError
from providers.kubernetes.permissions import cluster_role_yaml
from providers.models import ProviderKind
from providers.services import AccountInvalid, adapter_for_account, provider_account_connect


class Command(BaseCommand):
    help = (
        "Provider accounts. `provider connect --kind aws --name NAME --credential KEY=VALUE ... --regions R1,R2`; "
        "a cluster: `provider connect --kind kubernetes --kubeconfig FILE ...` (`provider clusterrole` prints the "
        "role its service account needs)"
    )

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
            help="repeat per field, e.g. access_key_id=... secret_access_key=...; KEY=@FILE reads the value from FILE",
        )
        connect.add_argument(
            "--kubeconfig", metavar="FILE", help="kubernetes: its current context's server, CA and token, read once"
        )
        connect.add_argument("--endpoint-url", default="", help="endpoint override (sandbox, sovereign region)")
        connect.add_argument("--regions", required=True, help="comma-separated regions")
        connect.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
        connect.add_argument("--no-check", action="store_true", help="save without the live credentials check")
        sub.add_parser("clusterrole", help="the ClusterRole a Kubernetes seller's service account needs (YAML)")

    @staticmethod
    def _pairs(items: list[str], what: str) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise CommandError(f"--{what} {item.split('=')[0]!r}: expected KEY=VALUE")
            pairs[key.strip()] = _file_text(value[1:], f"--{what} {key}") if value.startswith("@") else value
        return pairs

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "clusterrole":
            self.stdout.write(cluster_role_yaml())
            return
        credentials = self._pairs(options["credential"], "credential")
        if options["kubeconfig"]:
            credentials["kubeconfig"] = _file_text(options["kubeconfig"], "--kubeconfig")
        # Saved and checked in one transaction: credentials the provider refuses leave nothing behind.
        with transaction.atomic():
            try:
                account = provider_account_connect(
                    provider_name=options["provider"],
                    kind=options["kind"],
                    name=options["name"],
                    credentials=credentials,
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
                    hint = ""
                    if account.kind == ProviderKind.KUBERNETES and isinstance(exc, CredentialsRejected):
                        hint = " (`manage.py provider clusterrole` prints the role its service account needs)"
                    raise CommandError(f"the provider refused the account, nothing was saved: {exc}{hint}") from None
        self.stdout.write(json.dumps({"account": account.pk, "kind": account.kind, "regions": account.regions}))


MAX_FILE_BYTES = 256 * 1024  # a kubeconfig or a CA bundle is a few KB


def _file_text(path: str, what: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CommandError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CommandError(f"{what}: {path} is over {MAX_FILE_BYTES // 1024} KB")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise CommandError(f"{what}: {path} is not UTF-8 text") from None
