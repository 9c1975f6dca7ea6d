"""Provider personas: petra owns Petra GPU Cloud (signed up through the service), olga operates its accounts,
victor only views. Alice (a buyer) and charlie (a stranger) come from tests/conftest.py."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from marketplace.models import Membership, Organization, ProviderProfile, Role
from marketplace.portal.services import BusinessDetails, provider_details_update, provider_signup

PASSWORD = "correct-horse-battery-9"


@pytest.fixture
def petra(db):
    return provider_signup(
        username="petra", email="petra@petra.example", password=PASSWORD, organization_name="Petra GPU Cloud"
    )


@pytest.fixture
def petra_org(petra) -> Organization:
    return Organization.objects.get(name="Petra GPU Cloud")


def _member(org: Organization, username: str, role: str):
    user = get_user_model().objects.create_user(username=username, email=f"{username}@petra.example", password=PASSWORD)
    Membership.objects.create(user=user, organization=org, role=role)
    return user


@pytest.fixture
def olga(petra_org):
    return _member(petra_org, "olga", Role.OPERATOR)


@pytest.fixture
def victor(petra_org):
    return _member(petra_org, "victor", Role.VIEWER)


@pytest.fixture
def quentin(db):
    """The owner of another provider organisation."""
    return provider_signup(
        username="quentin", email="quentin@qcompute.example", password=PASSWORD, organization_name="Q Compute"
    )


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_superuser(username="sam", email="sam@broker.example", password=PASSWORD)


@pytest.fixture
def ready(petra_org) -> ProviderProfile:
    """Petra's details filled in and the terms accepted: ready for verification."""
    from marketplace.portal.services import TERMS_VERSION, provider_terms_accept

    provider_details_update(
        organization=petra_org,
        details=BusinessDetails(
            legal_name="Petra GPU Cloud GmbH",
            country="DE",
            registered_address="Invalidenstraße 1\n10115 Berlin",
            tax_id="DE123456789",
            contact_email="ops@petra.example",
        ),
    )
    owner = Membership.objects.get(organization=petra_org, role=Role.OWNER).user
    provider_terms_accept(organization=petra_org, user=owner, version=TERMS_VERSION)
    return ProviderProfile.objects.get(organization=petra_org)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client
