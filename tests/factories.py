"""factory_boy factories for the rows tests build by hand."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import factory
from django.contrib.auth import get_user_model

from marketplace.models import Membership, Organization, OrganizationKind, Role, SshKey
from providers.models import Provider, ProviderAccount
from providers.sshkeys import ssh_key_parse
from providers.types import OfferQuote
from tests.sshkeys import ed25519_public


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("pw")


class OrganizationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organization

    name = factory.Sequence(lambda n: f"Org {n}")
    kind = OrganizationKind.BUYER
    # Most tests are about what orders do, not how they are paid: invoiced terms let them order without a
    # top-up. The payment tests (tests/marketplace/test_prepaid*.py) make prepaid organisations, as sign-up does.
    payment_terms = "invoiced"


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    organization = factory.SubFactory(OrganizationFactory)
    role = Role.MEMBER


class SshKeyFactory(factory.django.DjangoModelFactory):
    """A validated ed25519 key (one key pair per comment, made once per test run)."""

    class Meta:
        model = SshKey

    class Params:
        parsed = factory.LazyAttribute(lambda k: ssh_key_parse(ed25519_public(k.name)))

    organization = factory.SubFactory(OrganizationFactory)
    name = "alice@laptop"
    created_by = factory.SubFactory(UserFactory)
    key_type = factory.LazyAttribute(lambda k: k.parsed.key_type)
    public_key = factory.LazyAttribute(lambda k: k.parsed.public_key)
    fingerprint = factory.LazyAttribute(lambda k: k.parsed.fingerprint)
    bits = factory.LazyAttribute(lambda k: k.parsed.bits)


class ProviderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Provider

    name = factory.Sequence(lambda n: f"Provider {n}")


class ProviderAccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ProviderAccount

    provider = factory.SubFactory(ProviderFactory)
    kind = "aws"
    name = factory.Sequence(lambda n: f"account-{n}")
    regions = factory.LazyFunction(lambda: ["us-east-1"])


def listed_quotes(rows: list[tuple[Any, ...]]) -> list[OfferQuote]:
    """What a provider lists, from compact rows: (instance type, GPU, count, GB per GPU, USD/h, region,
    pricing[, capacity]); the zone is the region's "a" zone."""
    return [
        OfferQuote(
            region=row[5],
            zone=row[5] + "a",
            instance_type=row[0],
            pricing_model=row[6],
            gpu_model=row[1],
            gpu_count=row[2],
            gpu_memory_gb=row[3],
            vcpus=8,
            memory_gib=Decimal(64),
            price=Decimal(row[4]),
            currency="USD",
            capacity=row[7] if len(row) > 7 else None,
        )
        for row in rows
    ]
