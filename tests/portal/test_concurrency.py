"""The portal's claims under real concurrency (PostgreSQL): one decision per state, one use per invitation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth import get_user_model

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.models import Invitation, InvitationStatus, Membership, ProviderProfile, ProviderState, Role
from marketplace.portal.services import PortalError, invitation_accept, invitation_create, provider_state_change
from tests.races import race, require_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def _race(workers: list[Callable[[], object]]) -> tuple[int, list[BaseException]]:
    won, refused = race(workers)
    return len(won), refused


def test_staff_verifying_the_same_provider_at_once_make_one_decision(ready, staff):
    require_postgresql()

    def verify() -> object:
        return provider_state_change(profile_id=ready.pk, to=ProviderState.VERIFIED, reason="checked", by=staff)

    won, refused = _race([verify] * 8)

    assert won == 1
    assert len(refused) == 7
    assert all(isinstance(e, PortalError) for e in refused), refused
    assert ProviderProfile.objects.get(pk=ready.pk).state == ProviderState.VERIFIED
    assert list(LedgerEntry.objects.filter(kind__startswith="provider.").values_list("kind", flat=True)) == [
        "provider.verified"
    ]
    assert ledger_verify().ok


def test_an_invitation_used_by_two_people_at_once_admits_one(petra, petra_org):
    require_postgresql()
    invitation, _ = invitation_create(organization=petra_org, email="ops@petra.example", role=Role.OPERATOR, by=petra)
    # Addresses are not unique: two users with the invited address race for the one invitation.
    users = [
        get_user_model().objects.create_user(username=f"ops{i}", email="ops@petra.example", password="x")
        for i in range(6)
    ]

    won, refused = _race([lambda u=u: invitation_accept(invitation=invitation, user=u) for u in users])

    assert won == 1
    assert all(isinstance(e, PortalError) for e in refused), refused
    assert Membership.objects.filter(organization=petra_org, role=Role.OPERATOR).count() == 1
    assert Invitation.objects.get().status() == InvitationStatus.ACCEPTED
