"""Marketplace staff verify and suspend providers in the admin; each decision is ledgered and decides whether
the provider's accounts sell."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from ledger.models import LedgerEntry, PersonalDatum
from ledger.services import ledger_verify, personal_reveal
from marketplace.catalog.services import offers_ingest
from marketplace.models import Offer, OfferStatus, ProviderProfile, ProviderState
from providers.models import ProviderAccount
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

# Staff decisions about providers; signing up ledgers the new team too (team.created), which is not one.
DECISIONS = LedgerEntry.objects.filter(kind__startswith="provider.")

CHANGELIST = "/admin/marketplace/providerprofile/"


def _decide(client, profile: ProviderProfile, action: str, reason: str | None):
    data = {"action": action, "_selected_action": [str(profile.pk)]}
    if reason is not None:
        data.update(apply="1", reason=reason)
    return client.post(CHANGELIST, data)


@pytest.fixture
def petra_account(petra_org):
    """An account of Petra's with an offer on sale, as an earlier sync left it."""
    account = ProviderAccountFactory(provider=petra_org.provider, name="main", enabled=False)
    rows = [("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", PricingModel.ON_DEMAND)]
    offers_ingest(account=account, quotes=listed_quotes(rows), now=timezone.now())
    return account


def test_verifying_asks_for_a_reason_first(staff, ready):
    response = _decide(client_for(staff), ready, "verify", None)

    assert response.status_code == 200
    assert "Reason" in response.content.decode()
    assert "Petra GPU Cloud" in response.content.decode()
    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.PENDING
    assert not DECISIONS.exists()


def test_an_empty_reason_is_asked_again_and_changes_nothing(staff, ready):
    response = _decide(client_for(staff), ready, "verify", "   ")

    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.PENDING
    assert not DECISIONS.exists()


def test_staff_verify_a_provider_its_accounts_sell_and_the_decision_is_ledgered(
    staff, ready, petra_org, petra_account, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _decide(client_for(staff), ready, "verify", "documents checked")

    assert response.status_code == 302
    profile = ProviderProfile.objects.get(pk=ready.pk)
    assert (profile.state, profile.state_reason) == (ProviderState.VERIFIED, "documents checked")
    assert ProviderAccount.objects.get(pk=petra_account.pk).enabled is True
    assert len(callbacks) == 1  # one sync queued per account, after commit
    entry = DECISIONS.get()
    payload = json.loads(entry.payload)
    assert (entry.kind, entry.subject) == ("provider.verified", f"provider:{petra_org.provider_id}")
    assert {k: v for k, v in payload.items() if k != "by"} == {
        "provider": petra_org.provider_id,
        "organization": petra_org.pk,
        "from": "pending",
        "to": "verified",
        "reason": "documents checked",
        "accounts": [petra_account.pk],
        "offers_withdrawn": 0,
    }
    assert "sam" not in entry.payload
    assert personal_reveal(payload["by"]) == {"username": "sam"}
    assert PersonalDatum.objects.get(commitment=payload["by"]).person == f"user:{staff.pk}"
    assert ledger_verify().ok


def test_staff_suspend_a_verified_provider_its_accounts_stop_selling_and_its_offers_leave_the_shop(
    staff, ready, petra_org, petra_account, django_capture_on_commit_callbacks
):
    client = client_for(staff)
    with django_capture_on_commit_callbacks(execute=False):
        _decide(client, ready, "verify", "documents checked")
    assert Offer.objects.filter(account=petra_account, status=OfferStatus.AVAILABLE).count() == 1

    response = _decide(client, ready, "suspend", "chargebacks under review")

    assert response.status_code == 302
    profile = ProviderProfile.objects.get(pk=ready.pk)
    assert (profile.state, profile.state_reason) == (ProviderState.SUSPENDED, "chargebacks under review")
    assert ProviderAccount.objects.get(pk=petra_account.pk).enabled is False
    assert Offer.objects.filter(account=petra_account, status=OfferStatus.AVAILABLE).count() == 0
    entry = LedgerEntry.objects.last()  # the newest, chained or still queued
    payload = json.loads(entry.payload)
    assert (entry.kind, payload["from"], payload["to"], payload["reason"], payload["offers_withdrawn"]) == (
        "provider.suspended",
        "verified",
        "suspended",
        "chargebacks under review",
        1,
    )
    assert "sam" not in entry.payload
    assert ledger_verify().ok
    # The provider sees why.
    page = client_for(petra_org.memberships.get().user).get("/provider/").content.decode()
    assert "chargebacks under review" in page


def test_a_suspended_provider_is_verified_again(staff, ready, petra_account, django_capture_on_commit_callbacks):
    client = client_for(staff)
    with django_capture_on_commit_callbacks(execute=False):
        _decide(client, ready, "verify", "ok")
        _decide(client, ready, "suspend", "check")
        _decide(client, ready, "verify", "cleared")

    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.VERIFIED
    assert ProviderAccount.objects.get(pk=petra_account.pk).enabled is True
    assert list(DECISIONS.order_by("id").values_list("kind", flat=True)) == [
        "provider.verified",
        "provider.suspended",
        "provider.verified",
    ]
    assert ledger_verify().ok


def test_a_transition_outside_the_table_is_refused_and_not_ledgered(staff, ready):
    response = client_for(staff).post(
        CHANGELIST,
        {"action": "suspend", "_selected_action": [str(ready.pk)], "apply": "1", "reason": "no reason to"},
        follow=True,
    )

    assert "Petra GPU Cloud is pending: it cannot become suspended" in response.content.decode()
    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.PENDING
    assert not DECISIONS.exists()
    assert not PersonalDatum.objects.filter(person=f"user:{staff.pk}").exists()


def test_a_provider_without_details_and_terms_cannot_be_verified(staff, petra_org, petra_account):
    profile = ProviderProfile.objects.get(organization=petra_org)

    response = client_for(staff).post(
        CHANGELIST,
        {"action": "verify", "_selected_action": [str(profile.pk)], "apply": "1", "reason": "looks fine"},
        follow=True,
    )

    assert "has not completed its business details and accepted the terms" in response.content.decode()
    assert ProviderProfile.objects.get(pk=profile.pk).state == ProviderState.PENDING
    assert ProviderAccount.objects.get(pk=petra_account.pk).enabled is False
    assert not DECISIONS.exists()


def test_only_staff_reach_the_admin(petra, ready):
    response = _decide(client_for(petra), ready, "verify", "self-service")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.PENDING
