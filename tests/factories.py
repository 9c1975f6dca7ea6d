"""factory_boy factories for the rows tests build by hand."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from marketplace.models import Membership, Organization, OrganizationKind, Role
from providers.models import Provider, ProviderAccount


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


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    organization = factory.SubFactory(OrganizationFactory)
    role = Role.MEMBER


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
