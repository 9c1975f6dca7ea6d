"""Signing a provider organisation up, its business details and the terms, and who may see the portal."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from marketplace.models import Membership, Organization, OrganizationKind, ProviderProfile, ProviderState, Role
from marketplace.portal.services import TERMS_VERSION
from providers.models import Provider, ProviderAccount
from tests.portal.conftest import PASSWORD, client_for

pytestmark = pytest.mark.django_db

SIGNUP = {
    "username": "nadia",
    "email": "Nadia@Nimbus.example",
    "password1": PASSWORD,
    "password2": PASSWORD,
    "organization_name": "Nimbus  GPUs",
}


def test_signing_up_creates_the_user_provider_organisation_profile_and_owner_membership():
    client = Client()

    response = client.post("/provider/signup", SIGNUP)

    assert response.status_code == 302
    assert response["Location"] == "/provider/details"
    user = get_user_model().objects.get(username="nadia")
    assert user.email == "nadia@nimbus.example"
    assert user.check_password(PASSWORD)
    provider = Provider.objects.get(name="Nimbus GPUs")
    org = Organization.objects.get(provider=provider)
    assert (org.name, org.kind) == ("Nimbus GPUs", OrganizationKind.PROVIDER)
    assert list(Membership.objects.filter(user=user).values_list("organization", "role")) == [(org.pk, Role.OWNER)]
    profile = ProviderProfile.objects.get(organization=org)
    assert (profile.state, profile.terms_version, profile.contact_email) == (
        ProviderState.PENDING,
        "",
        "nadia@nimbus.example",
    )
    # Signed in, and the navigation leads to the portal.
    home = client.get("/provider/")
    assert home.status_code == 200
    assert "Provider portal" in home.content.decode()
    assert "Pending verification" in home.content.decode()


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"username": "bad name!"}, "username", "Enter a valid username"),
        ({"email": "not-an-address"}, "email", "Enter a valid email address."),
        ({"password2": "something-else-42"}, "password2", "the two passwords differ"),
        ({"password1": "short", "password2": "short"}, "password1", "This password is too short."),
        ({"organization_name": ""}, "organization_name", "This field is required."),
    ],
)
def test_a_bad_signup_shows_the_field_error_and_creates_nothing(change, field, message):
    response = Client().post("/provider/signup", {**SIGNUP, **change})

    assert response.status_code == 200
    assert any(message in e for e in response.context["form"].errors[field])
    assert message.replace("'", "&#x27;") in response.content.decode()
    assert not get_user_model().objects.exists()
    assert not Provider.objects.exists()
    assert not Organization.objects.exists()


def test_a_taken_username_or_organisation_name_is_refused_on_its_field(petra, alice):
    taken_user = Client().post("/provider/signup", {**SIGNUP, "username": "PETRA"})
    taken_org = Client().post("/provider/signup", {**SIGNUP, "organization_name": "petra gpu cloud"})
    taken_buyer = Client().post("/provider/signup", {**SIGNUP, "organization_name": "Acme Research"})

    assert taken_user.context["form"].errors["username"] == ["that username is taken"]
    assert taken_org.context["form"].errors["organization_name"] == [
        "an organisation of that name is already on the marketplace"
    ]
    assert "organization_name" in taken_buyer.context["form"].errors
    assert not get_user_model().objects.filter(username="nadia").exists()
    assert Provider.objects.count() == 1


def test_the_owner_fills_in_the_business_details(petra, petra_org):
    client = client_for(petra)

    response = client.post(
        "/provider/details",
        {
            "legal_name": "  Petra GPU Cloud   GmbH ",
            "country": "DE",
            "registered_address": "Invalidenstraße 1\r\n\r\n10115  Berlin",
            "tax_id": "de 123 456 789",
            "contact_email": "Ops@Petra.example",
        },
    )

    assert response.status_code == 302
    assert response["Location"] == "/provider/terms"
    profile = ProviderProfile.objects.get(organization=petra_org)
    assert (profile.legal_name, profile.country, profile.registered_address, profile.tax_id, profile.contact_email) == (
        "Petra GPU Cloud GmbH",
        "DE",
        "Invalidenstraße 1\n10115 Berlin",
        "DE123456789",
        "ops@petra.example",
    )
    assert profile.details_complete
    assert profile.details_updated_at is not None


def test_bad_business_details_show_an_error_on_each_field_and_save_nothing(petra, petra_org):
    response = client_for(petra).post(
        "/provider/details",
        {"legal_name": "", "country": "XX", "registered_address": "x", "tax_id": "#!", "contact_email": "nope"},
    )

    errors = response.context["form"].errors
    assert response.status_code == 200
    assert set(errors) == {"legal_name", "country", "registered_address", "tax_id", "contact_email"}
    assert errors["country"] == ["Select a valid choice. XX is not one of the available choices."]
    assert errors["tax_id"] == ["use 4 to 32 letters and digits (dots, dashes and slashes allowed)"]
    assert ProviderProfile.objects.get(organization=petra_org).legal_name == ""


def test_the_owner_accepts_the_terms_and_the_version_time_and_person_are_recorded(petra, petra_org):
    client = client_for(petra)
    page = client.get("/provider/terms").content.decode()
    assert f"version {TERMS_VERSION}" in page

    response = client.post("/provider/terms", {"version": TERMS_VERSION, "accept": "on"})

    assert response.status_code == 302
    profile = ProviderProfile.objects.get(organization=petra_org)
    assert (profile.terms_version, profile.terms_accepted_by) == (TERMS_VERSION, petra)
    assert profile.terms_accepted_at is not None
    assert f"Version {TERMS_VERSION} accepted" in client.get("/provider/terms").content.decode()


def test_terms_need_the_box_ticked_and_the_current_version(petra, petra_org):
    client = client_for(petra)

    unticked = client.post("/provider/terms", {"version": TERMS_VERSION})
    stale = client.post("/provider/terms", {"version": "2020-01", "accept": "on"})

    assert unticked.context["form"].errors == {"accept": ["This field is required."]}
    assert stale.context["form"].errors == {
        "accept": ["the terms changed while the page was open: read the current version"]
    }
    assert ProviderProfile.objects.get(organization=petra_org).terms_version == ""


@pytest.mark.parametrize(
    "path", ["/provider/", "/provider/details", "/provider/terms", "/provider/team", "/provider/accounts"]
)
def test_buyers_and_strangers_get_404_on_provider_pages(path, alice, charlie):
    assert client_for(alice).get(path).status_code == 404
    assert client_for(charlie).get(path).status_code == 404


@pytest.mark.parametrize("path", ["/provider/", "/provider/accounts"])
def test_provider_pages_need_a_login(path):
    response = Client().get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("path", ["/orders/", "/workload/"])
def test_providers_get_404_on_buyer_pages(path, petra):
    assert client_for(petra).get(path).status_code == 404


def test_the_provider_portal_link_shows_only_for_provider_members(petra, alice):
    provider_page = client_for(petra).get("/").content.decode()
    buyer_page = client_for(alice).get("/").content.decode()

    assert "Provider portal" in provider_page
    assert "My orders" not in provider_page
    assert "Provider portal" not in buyer_page
    assert "My orders" in buyer_page


@pytest.mark.parametrize(("enabled", "state"), [(True, ProviderState.VERIFIED), (False, ProviderState.PENDING)])
def test_a_provider_organisation_made_outside_the_signup_gets_a_profile_on_its_first_visit(enabled, state):
    """As ``manage.py demo`` makes one: an organisation and an owner, no profile. One already selling stays so."""
    from tests.factories import MembershipFactory, ProviderAccountFactory

    account = ProviderAccountFactory(provider__name="Legacy Cloud", enabled=enabled)
    org = Organization.objects.create(name="Legacy Cloud", kind=OrganizationKind.PROVIDER, provider=account.provider)
    owner = MembershipFactory(user__username="lena", organization=org, role=Role.OWNER).user

    response = client_for(owner).get("/provider/")

    assert response.status_code == 200
    assert ProviderProfile.objects.get(organization=org).state == state
    assert ProviderAccount.objects.get(pk=account.pk).enabled is enabled
    assert client_for(owner).get("/provider/accounts").status_code == 200
