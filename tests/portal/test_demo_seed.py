"""The demo's people (issue 21, point 4): its providers have finished onboarding, so their checklists are all
done, and it has a staff user who can verify a provider that signs up during the demo."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from marketplace.demo import DEMO_PASSWORD, DEMO_STAFF
from marketplace.models import Organization, ProviderProfile, ProviderState
from marketplace.portal.services import (
    TERMS_VERSION,
    BusinessDetails,
    provider_details_update,
    provider_terms_accept,
)
from sandboxes.demo import write_manifest

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(aws_sandbox, tmp_path, settings):
    settings.VAR_DIR = tmp_path
    manifest = tmp_path / "sandbox.json"
    write_manifest(manifest, {"aws": aws_sandbox})
    call_command("demo", "seed", "--sandbox-manifest", str(manifest), "--community-hosts", str(tmp_path / "hosts.json"))
    return manifest


def test_the_demo_providers_checklists_are_done_and_say_view(seeded):
    for name, owner in (("Petra Cloud Resale", "petra"), ("Helga's GPU Farm", "helga")):
        profile = ProviderProfile.objects.get(organization__name=name)
        assert profile.state == ProviderState.VERIFIED
        assert profile.details_complete and profile.terms_accepted
        browser = Client()
        assert browser.login(username=owner, password=DEMO_PASSWORD)
        page = browser.get("/provider/").content.decode()
        assert "Fill in" not in page and "Read and accept" not in page
        assert page.count('class="done"') == 4


def test_the_demo_staff_user_verifies_a_provider_who_signs_up(seeded, client):
    staff = get_user_model().objects.get(username=DEMO_STAFF)
    assert staff.is_staff and staff.check_password(DEMO_PASSWORD)
    signup = {"username": "newco", "email": "ops@newco.example", "organization_name": "NewCo GPUs",
              "password1": "a-long-demo-password-1", "password2": "a-long-demo-password-1"}  # fmt: skip
    assert client.post("/provider/signup", signup).status_code == 302
    organization = Organization.objects.get(name="NewCo GPUs")
    profile = ProviderProfile.objects.get(organization=organization)
    assert profile.state == ProviderState.PENDING
    # The provider's part of onboarding: details and terms (the portal's forms call these services)
    details = BusinessDetails(
        "NewCo GPUs BV", "NL", "1 Voorbeeldstraat\nAmsterdam", "NL000000000B01", "ops@newco.example"
    )
    provider_details_update(organization=organization, details=details)
    provider_terms_accept(organization=organization, user=get_user_model().objects.get(username="newco"),
                          version=TERMS_VERSION)  # fmt: skip

    admin = Client()
    assert admin.login(username=DEMO_STAFF, password=DEMO_PASSWORD)
    listed = admin.get("/admin/marketplace/providerprofile/")
    assert listed.status_code == 200 and "NewCo GPUs" in listed.content.decode()
    decided = admin.post(
        "/admin/marketplace/providerprofile/",
        {"action": "verify", "_selected_action": [profile.pk], "apply": "1", "reason": "documents checked"},
    )

    assert decided.status_code == 302
    assert ProviderProfile.objects.get(pk=profile.pk).state == ProviderState.VERIFIED


def test_seeding_twice_changes_nothing(seeded):
    before = list(ProviderProfile.objects.order_by("pk").values_list("legal_name", "terms_accepted_at"))
    call_command("demo", "seed", "--sandbox-manifest", str(seeded))
    assert list(ProviderProfile.objects.order_by("pk").values_list("legal_name", "terms_accepted_at")) == before
    assert get_user_model().objects.filter(username=DEMO_STAFF).count() == 1
