"""Inviting teammates by email with a role, accepting by signing up or in, and what each role may do."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from marketplace.models import Invitation, InvitationStatus, Membership, ProviderProfile, Role
from marketplace.portal.selectors import token_hash
from marketplace.portal.services import TERMS_VERSION, invitation_create
from tests.portal.conftest import PASSWORD, client_for

pytestmark = pytest.mark.django_db


def _invite(client: Client, email: str, role: str) -> str:
    response = client.post("/provider/team", {"email": email, "role": role})
    assert response.status_code == 200, response.content
    assert "no-store" in response["Cache-Control"]
    match = re.search(r'value="(http://testserver/provider/invitations/[^"]+)"', response.content.decode())
    assert match, "the page shows the invitation link"
    return match.group(1).removeprefix("http://testserver")


def test_an_owner_invites_by_email_and_only_the_tokens_hash_is_stored(petra, petra_org):
    path = _invite(client_for(petra), "Olga@Petra.example", Role.OPERATOR)

    token = path.rsplit("/", 1)[1]
    invitation = Invitation.objects.get()
    assert (invitation.organization, invitation.email, invitation.role, invitation.invited_by) == (
        petra_org,
        "olga@petra.example",
        Role.OPERATOR,
        petra,
    )
    assert invitation.token_hash == token_hash(token)
    assert token not in invitation.token_hash
    assert invitation.expires_at - invitation.created_at == dt.timedelta(days=7)
    # The team page afterwards lists it, without the link.
    page = client_for(petra).get("/provider/team").content.decode()
    assert "olga@petra.example" in page
    assert token not in page


def test_the_invitation_is_emailed_with_the_link_shown_on_the_page(petra, petra_org, mailoutbox):
    path = _invite(client_for(petra), "olga@petra.example", Role.OPERATOR)

    (message,) = mailoutbox
    assert message.to == ["olga@petra.example"]
    assert petra_org.name in message.subject
    assert f"http://testserver{path}" in message.body and "operator" in message.body
    assert "petra" in message.body  # who invites
    page = Client().get(path).content.decode()  # one invitation page serves both kinds of organisation
    assert "invited to the provider organisation" in page


def test_a_mail_server_that_is_down_loses_no_invitation_and_the_link_is_still_shown(petra, settings, mailoutbox):
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", closed, 2

    response = client_for(petra).post("/provider/team", {"email": "olga@petra.example", "role": Role.OPERATOR})

    page = response.content.decode()
    assert response.status_code == 200 and "the email could not be sent" in page
    assert re.search(r'value="http://testserver/provider/invitations/[^"]+"', page)
    assert Invitation.objects.get().email == "olga@petra.example"


def test_an_invited_person_signs_up_from_the_link_and_joins_with_the_role(petra, petra_org):
    path = _invite(client_for(petra), "olga@petra.example", Role.OPERATOR)
    client = Client()
    assert "Petra GPU Cloud" in client.get(path).content.decode()

    response = client.post(path, {"username": "olga", "password1": PASSWORD, "password2": PASSWORD})

    assert response.status_code == 302
    olga = get_user_model().objects.get(username="olga")
    assert olga.email == "olga@petra.example"
    assert list(Membership.objects.filter(user=olga).values_list("organization", "role")) == [
        (petra_org.pk, Role.OPERATOR)
    ]
    invitation = Invitation.objects.get()
    assert (invitation.status(), invitation.accepted_by) == (InvitationStatus.ACCEPTED, olga)
    assert client.get("/provider/accounts").status_code == 200
    # The link works once.
    assert Client().get(path).status_code == 410


def test_an_invited_person_with_an_account_signs_in_and_accepts(petra, petra_org, charlie):
    charlie.email = "charlie@labs.example"
    charlie.save()
    path = _invite(client_for(petra), "charlie@labs.example", Role.VIEWER)
    client = Client()
    login_link = client.get(path).content.decode()
    assert f"/login/?next={path}" in login_link.replace("%2F", "/")

    client.post("/login/", {"username": "charlie", "password": "pw"})
    response = client.post(path)

    assert response.status_code == 302
    assert Membership.objects.get(user=charlie, organization=petra_org).role == Role.VIEWER


def test_accepting_needs_the_invited_address(petra, petra_org, charlie):
    path = _invite(client_for(petra), "someone-else@labs.example", Role.OPERATOR)

    response = client_for(charlie).post(path)

    assert response.status_code == 200
    assert "this invitation is for someone-else@labs.example" in response.content.decode()
    assert not Membership.objects.filter(user=charlie, organization=petra_org).exists()
    assert Invitation.objects.get().status() == InvitationStatus.OPEN


def test_a_bad_signup_from_an_invitation_shows_field_errors_and_joins_no_one(petra, petra_org):
    path = _invite(client_for(petra), "olga@petra.example", Role.OPERATOR)

    response = Client().post(path, {"username": "petra", "password1": PASSWORD, "password2": "other-password-1"})

    errors = response.context["form"].errors
    assert errors["password2"] == ["the two passwords differ"]
    assert Membership.objects.filter(organization=petra_org).count() == 1
    taken = Client().post(path, {"username": "petra", "password1": PASSWORD, "password2": PASSWORD})
    assert taken.context["form"].errors["username"] == ["that username is taken"]
    assert Invitation.objects.get().status() == InvitationStatus.OPEN


def test_a_revoked_invitation_cannot_be_accepted(petra, petra_org):
    path = _invite(client_for(petra), "olga@petra.example", Role.OPERATOR)
    invitation = Invitation.objects.get()

    revoked = client_for(petra).post(f"/provider/team/invitations/{invitation.pk}/revoke")
    response = Client().post(path, {"username": "olga", "password1": PASSWORD, "password2": PASSWORD})

    assert revoked.status_code == 302
    assert response.status_code == 410
    assert "This invitation is revoked" in response.content.decode()
    assert not get_user_model().objects.filter(username="olga").exists()


def test_an_invitation_expires_after_seven_days(petra, petra_org):
    invitation, token = invitation_create(
        organization=petra_org, email="olga@petra.example", role=Role.OPERATOR, by=petra
    )
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    response = Client().post(
        f"/provider/invitations/{token}", {"username": "olga", "password1": PASSWORD, "password2": PASSWORD}
    )

    assert response.status_code == 410
    assert "This invitation is expired" in response.content.decode()
    assert not get_user_model().objects.filter(username="olga").exists()


def test_inviting_the_same_address_again_revokes_the_first_link(petra, petra_org):
    first = _invite(client_for(petra), "olga@petra.example", Role.VIEWER)
    second = _invite(client_for(petra), "olga@petra.example", Role.OPERATOR)

    assert [i.status() for i in Invitation.objects.order_by("pk")] == [InvitationStatus.REVOKED, InvitationStatus.OPEN]
    assert Client().get(first).status_code == 410
    assert Client().get(second).status_code == 200


def test_an_unknown_token_is_404(petra):
    assert Client().get("/provider/invitations/not-a-token").status_code == 404


def test_an_invitation_form_validates_its_fields(petra, petra_org):
    response = client_for(petra).post("/provider/team", {"email": "nope", "role": "member"})

    errors = response.context["form"].errors
    assert errors["email"] == ["Enter a valid email address."]
    assert errors["role"] == ["Select a valid choice. member is not one of the available choices."]
    assert not Invitation.objects.exists()


def test_inviting_a_member_is_refused(petra, olga):
    response = client_for(petra).post("/provider/team", {"email": "olga@petra.example", "role": "viewer"})

    assert response.context["form"].errors["email"] == ["someone with this address is already in the team"]
    assert not Invitation.objects.exists()


def test_someone_in_another_provider_cannot_join_a_second_one(petra, quentin):
    path = _invite(client_for(petra), "quentin@qcompute.example", Role.VIEWER)

    response = client_for(quentin).post(path)

    assert "you are already in another provider organisation" in response.content.decode()
    assert Membership.objects.filter(user=quentin).count() == 1


# --- Roles -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/provider/team", {"email": "x@petra.example", "role": "viewer"}),
        ("/provider/details", {"legal_name": "X"}),
        ("/provider/terms", {"version": TERMS_VERSION, "accept": "on"}),
    ],
)
def test_operators_and_viewers_cannot_change_the_team_details_or_terms(path, data, olga, victor, petra_org):
    assert client_for(olga).post(path, data).status_code == 403
    assert client_for(victor).post(path, data).status_code == 403
    assert not Invitation.objects.exists()
    assert ProviderProfile.objects.get(organization=petra_org).legal_name == ""
    assert ProviderProfile.objects.get(organization=petra_org).terms_version == ""


@pytest.mark.parametrize("path", ["/provider/accounts/connect/aws"])
def test_viewers_cannot_connect_accounts(path, victor):
    client = client_for(victor)

    assert client.get(path).status_code == 403
    assert client.post(path, {"name": "x"}).status_code == 403


def test_viewers_see_pages_without_the_controls(victor, olga, petra):
    client = client_for(victor)

    team = client.get("/provider/team").content.decode()
    accounts = client.get("/provider/accounts").content.decode()
    details = client.get("/provider/details").content.decode()

    assert "Send invitation" not in team
    assert "Remove" not in team
    assert "Connect an account" not in accounts
    assert "<form" not in details.split("</header>")[1]
    assert "Only owners change the business details." in details
    assert "Connect an account" in client_for(olga).get("/provider/accounts").content.decode()


def test_an_owner_changes_a_role_and_removes_a_member(petra, olga, victor, petra_org):
    client = client_for(petra)
    olga_m = Membership.objects.get(user=olga)
    victor_m = Membership.objects.get(user=victor)

    client.post(f"/provider/team/members/{olga_m.pk}", {f"m{olga_m.pk}-role": "owner"})
    client.post(f"/provider/team/members/{victor_m.pk}", {"remove": "1"})

    assert dict(Membership.objects.filter(organization=petra_org).values_list("user__username", "role")) == {
        "petra": Role.OWNER,
        "olga": Role.OWNER,
    }


def test_the_last_owner_can_neither_step_down_nor_leave(petra, olga, petra_org):
    client = client_for(petra)
    own = Membership.objects.get(user=petra)

    demoted = client.post(f"/provider/team/members/{own.pk}", {f"m{own.pk}-role": "viewer"}, follow=True)
    removed = client.post(f"/provider/team/members/{own.pk}", {"remove": "1"}, follow=True)

    assert "the organisation needs at least one owner" in demoted.content.decode()
    assert "the organisation needs at least one owner" in removed.content.decode()
    assert Membership.objects.get(pk=own.pk).role == Role.OWNER


def test_another_providers_members_and_invitations_are_404(petra, quentin, petra_org):
    invitation, _ = invitation_create(organization=petra_org, email="x@petra.example", role=Role.VIEWER, by=petra)
    member = Membership.objects.get(user=petra)
    client = client_for(quentin)

    assert client.post(f"/provider/team/invitations/{invitation.pk}/revoke").status_code == 404
    assert client.post(f"/provider/team/members/{member.pk}", {"remove": "1"}).status_code == 404
    assert Invitation.objects.get().status() == InvitationStatus.OPEN
    assert Membership.objects.filter(pk=member.pk).exists()
