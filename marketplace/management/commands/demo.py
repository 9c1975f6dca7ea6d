"""``manage.py demo seed``: the demo buyer, provider and sandbox cloud account used by the run command."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from marketplace.billing.payments import TopUpRequest, billing_profile, topup_start
from marketplace.billing.stripe_gateway import PaymentError
from marketplace.demo import DEMO_CLUSTER_ADMIN, DEMO_PASSWORD, DEMO_STAFF
from marketplace.launch.keys import ssh_key_add
from marketplace.models import Membership, Organization, OrganizationKind, Role, SshKey
from marketplace.models.billing import EmailVerification
from marketplace.portal.services import (
    TERMS_VERSION,
    BusinessDetails,
    provider_details_update,
    provider_profile_ensure,
    provider_terms_accept,
)
from providers.community.protocol import new_secret
from providers.community.services import machine_list
from providers.manifest import SandboxAccount, read_manifest
from providers.models import Machine, MachineState, ProviderKind
from providers.services import provider_account_connect


class Command(BaseCommand):
    help = (
        "Seed the demo buyer (alice), provider admin (petra), marketplace staff (sam) and one account per running "
        "sandbox cloud."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        seed = sub.add_parser("seed")
        seed.add_argument("--sandbox-manifest", required=True, help="the JSON file the running sandbox wrote")
        seed.add_argument(
            "--community-hosts", help="write the demo independent machines' agent keys here (for the simulated hosts)"
        )

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
        _seed_ssh_key(buyer, alice)
        manifest = read_manifest(Path(options["sandbox_manifest"]))
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
            for spec in manifest
            if spec.kind != ProviderKind.KUBERNETES
        ]
        account = accounts[0]
        seller, _ = Organization.objects.get_or_create(
            name="Petra Cloud Resale", defaults={"kind": OrganizationKind.PROVIDER, "provider": account.provider}
        )
        Membership.objects.get_or_create(user=petra, organization=seller, defaults={"role": Role.OWNER})
        _seed_onboarded(seller, petra, "Petra Cloud Resale GmbH", "DE", "Beispielstrasse 1\n10115 Berlin")
        if options.get("community_hosts"):
            fleet = _seed_community(users, Path(options["community_hosts"]))
            accounts.append(fleet)
            helga_org = Organization.objects.get(provider=fleet.provider)
            helga = helga_org.memberships.get(role=Role.OWNER).user
            _seed_onboarded(helga_org, helga, "Helga's GPU Farm Ltd", "IE", "1 Example Quay\nDublin 2")
        for spec in manifest:
            if spec.kind == ProviderKind.KUBERNETES:
                accounts.append(_seed_cluster(users, spec))
        _seed_staff(users)
        _seed_credit(buyer, alice)
        self.stdout.write(
            json.dumps(
                {
                    "buyer": "alice",
                    "provider_admin": "petra",
                    "staff": DEMO_STAFF,
                    "accounts": {a.kind: a.pk for a in accounts},
                }
            )
        )


def _seed_onboarded(organization: Organization, owner: Any, legal_name: str, country: str, address: str) -> None:
    """A demo provider that has done its onboarding: business details filled in and the current terms accepted
    (its profile is verified, as a provider whose accounts already sell), so its checklist is all done."""
    profile = provider_profile_ensure(organization=organization)
    if not profile.details_complete:
        details = BusinessDetails(
            legal_name=legal_name,
            country=country,
            registered_address=address,
            tax_id=f"{country}000000000",
            contact_email=owner.email or f"{owner.username}@example.com",
        )
        provider_details_update(organization=organization, details=details)
    provider_terms_accept(organization=organization, user=owner, version=TERMS_VERSION)


def _seed_cluster(users: Any, spec: SandboxAccount) -> Any:
    """Kai's neocloud: a Kubernetes cluster (the sandbox's nodes) priced per GPU-hour per model, onboarded."""
    kai, created = users.objects.get_or_create(username=DEMO_CLUSTER_ADMIN, defaults={"email": "kai@example.com"})
    if created:
        kai.set_password(DEMO_PASSWORD)
        kai.save()
    account = provider_account_connect(
        provider_name="Kai's Neocloud",
        kind=spec.kind,
        name="kai-cluster",
        credentials=spec.credentials,
        regions=spec.demo_regions,
        endpoint_url=spec.endpoint_url,
        options=spec.options,
    )
    org, _ = Organization.objects.get_or_create(
        name="Kai's Neocloud", defaults={"kind": OrganizationKind.PROVIDER, "provider": account.provider}
    )
    Membership.objects.get_or_create(user=kai, organization=org, defaults={"role": Role.OWNER})
    _seed_onboarded(org, kai, "Kai's Neocloud B.V.", "NL", "1 Voorbeeldstraat\n1011 Amsterdam")
    return account


def _seed_staff(users: Any) -> None:
    """The marketplace's operator: staff with every admin permission, who verifies providers that sign up
    (admin, Provider profiles, action "verify") and independent machines."""
    staff, created = users.objects.get_or_create(username=DEMO_STAFF, defaults={"email": "sam@example.com"})
    if created:
        staff.set_password(DEMO_PASSWORD)
    staff.is_staff = staff.is_superuser = True
    staff.save()


def _seed_credit(organization: Organization, owner: Any) -> None:
    """Alice has verified her address and bought $500 of credit with Stripe's test Visa through the Stripe
    sandbox (a real PaymentIntent), so the demo buyer can order at once, as a paying customer would."""
    EmailVerification.objects.get_or_create(
        user=owner, email=owner.email.lower(), defaults={"verified_at": timezone.now()}
    )
    profile = billing_profile(organization)
    if not profile.country:
        profile.country = "GB"
        profile.save()
    try:
        topup_start(
            organization=organization,
            user=owner,
            request=TopUpRequest(
                amount_minor=50_000, payment_method="pm_card_visa", return_url="", idempotency_key="demo-seed"
            ),
        )
    except PaymentError as exc:  # the demo still starts; Billing shows the balance and how to top up
        print(f"demo credit not bought: {exc.message}")


def _seed_ssh_key(organization: Organization, user: Any) -> None:
    """Alice's demo key: a fresh ed25519 pair, its private half in var/demo-ssh (for the ssh lines the demo
    prints; the sandbox's machines answer SSH's greeting only), its public half on the organisation."""
    if SshKey.objects.filter(organization=organization).exists():
        return
    folder = Path(settings.VAR_DIR) / "demo-ssh"
    folder.mkdir(exist_ok=True)
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path = folder / "id_ed25519"
    path.write_bytes(pem)
    path.chmod(0o600)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (folder / "id_ed25519.pub").write_bytes(public + b" alice@demo\n")
    ssh_key_add(organization=organization, user=user, public_key=public.decode() + " alice@demo")


# The demo's independent provider: machines listed at plausible community prices (USD per GPU-hour), each
# run by a simulated agent (sandboxes/community/hosts.py). The H100 host rents 2 GPUs or more at a time and
# the L40S host single GPUs; the A100 host is sold whole.
DEMO_MACHINES = [
    ("fra-h100-1", "H100-SXM5", 8, 80, "DE", "eu-de", "1.95", "0.95", 2, [], "H100:80x8"),
    ("fra-l40s-1", "L40S", 4, 48, "DE", "eu-de", "0.79", "0.39", 1, [], "L40S:48x4"),
    # Sold whole, or in MIG slices of one card.
    ("dal-a100-1", "A100-80GB-SXM4", 4, 80, "US", "us-tx", "1.15", None, 4, ["1g.10gb", "3g.40gb"], "A100:80x4"),
]


def _seed_community(users: Any, hosts_path: Path) -> Any:
    """Helga's independent fleet: three verified machines; their agents' keys go to ``hosts_path`` (0600)."""
    helga, created = users.objects.get_or_create(username="helga", defaults={"email": "helga@example.com"})
    if created:
        helga.set_password(DEMO_PASSWORD)
        helga.save()
    fleet = provider_account_connect(
        provider_name="Helga's GPU Farm",
        kind="community",
        name="helga-fleet",
        credentials={},
        regions=["eu-de", "us-tx"],
    )
    org, _ = Organization.objects.get_or_create(
        name="Helga's GPU Farm", defaults={"kind": OrganizationKind.PROVIDER, "provider": fleet.provider}
    )
    Membership.objects.get_or_create(user=helga, organization=org, defaults={"role": Role.OWNER})
    hosts = []
    for name, model, count, memory, country, region, price, bid, min_lease, mig, simulate in DEMO_MACHINES:
        machine = Machine.objects.filter(account=fleet, name=name).first()
        if machine is None:
            listing = {
                "gpu_model": model, "gpu_count": count, "gpu_memory_gb": memory, "vcpus": 16 * count,
                "memory_gib": 128 * count, "disk_gb": 2000, "network_gbps": Decimal(25), "country": country,
                "region": region, "price_per_gpu_hour": Decimal(price),
                "min_bid_per_gpu_hour": None if bid is None else Decimal(bid), "min_gpus_per_lease": min_lease,
                "mig_profiles": mig,
            }  # fmt: skip
            listed = machine_list(account=fleet, name=name, listing=listing)
            machine, secret = listed.machine, listed.secret
        else:
            # The secret is shown once: a re-seed issues a new one for the simulated agent.
            secret = new_secret()
            machine.set_secret(secret)
            machine.save(update_fields=["secret_encrypted"])
        # Its simulated agent registers afresh at a new port each run: not a verified machine moving away.
        Machine.objects.filter(pk=machine.pk).update(state=MachineState.VERIFIED, agent_url="", registered_at=None)
        hosts.append({"key_id": machine.key_id, "secret": secret, "simulate": simulate, "launch_seconds": 2})
    hosts_path.parent.mkdir(parents=True, exist_ok=True)
    hosts_path.touch(mode=0o600)
    hosts_path.write_text(json.dumps(hosts, indent=1))
    return fleet
