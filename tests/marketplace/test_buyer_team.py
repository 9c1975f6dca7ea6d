"""A buyer organisation's team: invitations, roles and what each may do, leaving, and the never-ownerless rule;
another organisation's team objects are 404."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from marketplace.api.tokens import api_token_create
from marketplace.models import (
    ApiToken,
    Invitation,
    InvitationStatus,
    Membership,
    Offer,
    Order,
    OrderState,
    Organization,
    OrganizationKind,
    Quote,
    Role,
    WebhookDelivery,
    WebhookEndpoint,
)
from marketplace.portal.selectors import token_hash
from marketplace.portal.services import PortalError, invitation_create, membership_role_set
from tests.factories import MembershipFactory
from tests.leases import boot_if_launched

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-9"


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def vera(acme):
    """A viewer of Acme."""
    return MembershipFactory(user__username="vera", organization=acme, role=Role.VIEWER).user


def _invite(client: Client, email: str, role: str) -> str:
    response = client.post("/team/", {"email": email, "role": role})
    assert response.status_code == 200, response.content
    assert "no-store" in response["Cache-Control"]
    match = re.search(r'value="(http://testserver/invitations/[^"]+)"', response.content.decode())
    assert match, "the page shows the invitation link"
    return match.group(1).removeprefix("http://testserver")


# --- The team page ---------------------------------------------------------------------------------------------


def test_the_team_page_lists_members_with_role_and_join_date(alice, bob, vera, acme):
    Membership.objects.filter(user=bob).update(joined_at=dt.datetime(2026, 3, 4, tzinfo=dt.UTC))
    page = client_for(alice).get("/team/").content.decode()

    members = page[page.index('id="members"') : page.index("</table>")]
    assert [name in members for name in ("alice", "bob", "vera")] == [True, True, True]
    assert "2026-03-04" in members
    assert 'id="invite-form"' in page and "Invitations" in page


def test_viewers_and_members_see_the_team_without_the_controls(bob, vera, alice):
    for user in (bob, vera):
        page = client_for(user).get("/team/").content.decode()
        assert "alice" in page and 'id="invite-form"' not in page and "Change role" not in page
        assert "Remove" not in page and 'id="leave-form"' in page


# --- Invitations ----------------------------------------------------------------------------------------------


def test_an_owner_invites_and_only_the_links_hash_is_stored(alice, acme):
    path = _invite(client_for(alice), "Nina@Example.com", Role.MEMBER)

    token = path.rsplit("/", 1)[1]
    invitation = Invitation.objects.get()
    assert (invitation.organization, invitation.email, invitation.role, invitation.invited_by) == (
        acme,
        "nina@example.com",
        Role.MEMBER,
        alice,
    )
    assert invitation.token_hash == token_hash(token)
    assert invitation.expires_at - invitation.created_at == dt.timedelta(days=7)
    page = client_for(alice).get("/team/").content.decode()
    assert "nina@example.com" in page and token not in page


def test_the_invitation_is_emailed_to_the_address_with_the_link(alice, acme, mailoutbox):
    path = _invite(client_for(alice), "nina@example.com", Role.VIEWER)

    (message,) = mailoutbox
    assert (message.to, message.subject) == (
        ["nina@example.com"],
        "You are invited to join Acme Research on the GPU Broker",
    )
    assert f"http://testserver{path}" in message.body and "viewer" in message.body
    assert "invited to the buyer organisation" in Client().get(path).content.decode()


def test_a_new_person_signs_up_through_the_link_and_joins_with_the_role(alice, acme):
    path = _invite(client_for(alice), "nina@example.com", Role.VIEWER)
    client = Client()
    assert "Acme Research" in client.get(path).content.decode()

    response = client.post(path, {"username": "nina", "password1": PASSWORD, "password2": PASSWORD})

    assert (response.status_code, response["Location"]) == (302, "/orders/")
    nina = get_user_model().objects.get(username="nina")
    assert nina.email == "nina@example.com"
    assert list(Membership.objects.filter(user=nina).values_list("organization", "role")) == [(acme.pk, Role.VIEWER)]
    assert Invitation.objects.get().status() == InvitationStatus.ACCEPTED
    assert "Acme Research" in client.get("/team/").content.decode()
    # The link works once.
    assert Client().get(path).status_code == 410
    again = Client().post(path, {"username": "nina2", "password1": PASSWORD, "password2": PASSWORD})
    assert again.status_code == 410 and not get_user_model().objects.filter(username="nina2").exists()


def test_someone_already_in_another_organisation_accepts_and_gets_it_in_the_switcher(alice, acme, charlie):
    charlie.email = "charlie@labs.example"
    charlie.save()
    path = _invite(client_for(alice), "charlie@labs.example", Role.MEMBER)
    client = client_for(charlie)

    response = client.post(path)

    assert response["Location"] == "/orders/"
    assert set(Membership.objects.filter(user=charlie).values_list("organization__name", "role")) == {
        ("Charlie Labs", Role.OWNER),
        ("Acme Research", Role.MEMBER),
    }
    header = client.get("/").content.decode()
    switcher = header[header.index('id="org-switch"') : header.index("</details>")]
    assert "Acme Research" in switcher and "Charlie Labs" in switcher
    assert 'Team <span class="muted">· Acme Research' in client.get("/team/").content.decode()  # switched to it


def test_accepting_needs_the_invited_address(alice, charlie):
    path = _invite(client_for(alice), "someone-else@example.com", Role.MEMBER)
    response = client_for(charlie).post(path)
    assert response.status_code == 400
    assert "this invitation is for someone-else@example.com" in response.content.decode()
    assert Invitation.objects.get().status() == InvitationStatus.OPEN
    assert not Membership.objects.filter(user=charlie, organization__name="Acme Research").exists()


def test_an_expired_invitation_cannot_be_used(alice, acme):
    path = _invite(client_for(alice), "nina@example.com", Role.MEMBER)
    Invitation.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    response = Client().post(path, {"username": "nina", "password1": PASSWORD, "password2": PASSWORD})

    assert response.status_code == 410 and "expired" in response.content.decode()
    assert not get_user_model().objects.filter(username="nina").exists()
    assert "expired" in client_for(alice).get("/team/").content.decode()


def test_a_revoked_invitation_cannot_be_used(alice, acme):
    path = _invite(client_for(alice), "nina@example.com", Role.MEMBER)
    invitation = Invitation.objects.get()

    revoked = client_for(alice).post(f"/team/invitations/{invitation.pk}/revoke")

    assert revoked["Location"] == "/team/"
    assert Client().get(path).status_code == 410
    response = Client().post(path, {"username": "nina", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 410 and not get_user_model().objects.filter(username="nina").exists()


def test_unknown_and_provider_invitation_links_are_404_here(alice):
    provider = MembershipFactory(
        user__username="petra", organization__name="Petra Cloud", organization__kind=OrganizationKind.PROVIDER,
        role=Role.OWNER,
    )  # fmt: skip
    _, token = invitation_create(
        organization=provider.organization, email="olga@example.com", role=Role.OPERATOR, by=provider.user
    )
    assert Client().get(f"/invitations/{token}").status_code == 404
    assert Client().get("/invitations/not-a-token").status_code == 404


def test_a_buyer_organisation_gives_buyer_roles_only(alice, acme, bob):
    with pytest.raises(PortalError, match="choose one of owner, member, viewer"):
        invitation_create(organization=acme, email="x@example.com", role=Role.OPERATOR, by=alice)
    response = client_for(alice).post("/team/", {"email": "x@example.com", "role": "operator"})
    assert response.status_code == 400 and not Invitation.objects.exists()
    with pytest.raises(PortalError):
        membership_role_set(membership=Membership.objects.get(user=bob), role=Role.OPERATOR)


def test_inviting_someone_already_in_the_team_is_refused(alice, bob):
    response = client_for(alice).post("/team/", {"email": bob.email, "role": Role.MEMBER})
    assert response.status_code == 400 and "already in the team" in response.content.decode()
    assert not Invitation.objects.exists()


# --- Roles, removal, leaving ----------------------------------------------------------------------------------


def test_an_owner_changes_a_role_and_removes_a_member(alice, bob, vera, acme):
    client = client_for(alice)
    bob_membership = Membership.objects.get(user=bob)
    vera_membership = Membership.objects.get(user=vera)

    client.post(f"/team/members/{vera_membership.pk}", {f"m{vera_membership.pk}-role": Role.MEMBER})
    client.post(f"/team/members/{bob_membership.pk}", {"remove": "1"})

    assert Membership.objects.get(pk=vera_membership.pk).role == Role.MEMBER
    assert not Membership.objects.filter(pk=bob_membership.pk).exists()


def test_the_last_owner_can_neither_be_demoted_nor_leave(alice, bob, acme):
    client = client_for(alice)
    mine = Membership.objects.get(user=alice)

    demoted = client.post(f"/team/members/{mine.pk}", {f"m{mine.pk}-role": Role.MEMBER}, follow=True)
    left = client.post("/team/leave", follow=True)
    removed = client.post(f"/team/members/{mine.pk}", {"remove": "1"}, follow=True)

    assert "needs at least one owner" in demoted.content.decode()
    assert "You cannot leave Acme Research: the organisation needs at least one owner." in left.content.decode()
    assert "needs at least one owner" in removed.content.decode()
    assert Membership.objects.get(pk=mine.pk).role == Role.OWNER
    page = client.get("/team/").content.decode()
    assert 'id="leave-form"' not in page and "make someone else owner" in page
    # With a second owner, the first may step down.
    membership_role_set(membership=Membership.objects.get(user=bob), role=Role.OWNER)
    client.post(f"/team/members/{mine.pk}", {f"m{mine.pk}-role": Role.MEMBER})
    assert Membership.objects.get(pk=mine.pk).role == Role.MEMBER


def test_anyone_can_leave_an_organisation_that_keeps_an_owner(alice, bob, vera, acme):
    for user in (bob, vera):
        response = client_for(user).post("/team/leave", follow=True)
        assert "You left Acme Research. You are in no buyer organisation now." in response.content.decode()
    assert list(Membership.objects.filter(organization=acme).values_list("user__username", flat=True)) == ["alice"]


def test_team_changes_are_ledgered_with_people_only_as_commitments(alice, bob, acme):
    import json

    from ledger.services import ledger_verify, personal_erase, personal_reveal

    path = _invite(client_for(alice), "nina@example.com", Role.MEMBER)
    nina = Client()
    nina.post(path, {"username": "nina", "password1": PASSWORD, "password2": PASSWORD})
    client_for(alice).post(
        f"/team/members/{Membership.objects.get(user=bob).pk}",
        {f"m{Membership.objects.get(user=bob).pk}-role": Role.VIEWER},
    )
    refused = client_for(alice).post(
        f"/team/members/{Membership.objects.get(user=alice).pk}",
        {f"m{Membership.objects.get(user=alice).pk}-role": Role.MEMBER},
    )
    assert refused.status_code == 302  # the last owner keeps the role, and nothing is ledgered for it
    client_for(bob).post("/team/leave")
    nina_user = get_user_model().objects.get(username="nina")
    client_for(alice).post(f"/team/members/{Membership.objects.get(user=nina_user).pk}", {"remove": "1"})

    entries = list(LedgerEntry.objects.filter(subject=f"organization:{acme.pk}").order_by("id"))
    assert [e.kind for e in entries] == ["team.joined", "team.role_changed", "team.left", "team.removed"]
    payloads = [json.loads(e.payload) for e in entries]
    assert (payloads[1]["from"], payloads[1]["to"], payloads[3]["role"]) == (Role.MEMBER, Role.VIEWER, Role.MEMBER)
    assert personal_reveal(payloads[0]["member"]) == {"username": "nina"}
    assert personal_reveal(payloads[0]["invited_by"]) == personal_reveal(payloads[1]["by"]) == {"username": "alice"}
    assert personal_reveal(payloads[2]["by"]) == {"username": "bob"}
    assert not any(name in e.payload for e in entries for name in ("alice", "bob", "nina", "example.com"))

    personal_erase(person=f"user:{nina_user.pk}", reason="asked to be forgotten")
    assert personal_reveal(payloads[0]["member"]) is None and ledger_verify().ok


# --- What a role may do ---------------------------------------------------------------------------------------


@pytest.fixture
def world(acme, alice, bob, vera, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    """Acme's things, made by its owner: a running order, a quote, a webhook with a delivery, a token, an
    invitation."""
    api = APIClient()
    api.force_authenticate(alice)
    offer = Offer.objects.order_by("price_usd").first()
    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json")
        hook = api.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}, format="json").json()
        api.post(f"/api/v1/webhooks/{hook['id']}/ping")
    assert placed.status_code == 201, placed.json()
    boot_if_launched(Order.objects.get(public_id=placed.json()["id"]), aws_sandbox)
    quote = api.post("/api/v1/quotes", {"profile": "inference"}, format="json").json()["quotes"][0]
    token = api_token_create(organization=acme, user=alice, name="alice-ci", scopes=["offers:read"]).token
    invitation, _ = invitation_create(organization=acme, email="nina@example.com", role=Role.MEMBER, by=alice)
    return {
        "order": Order.objects.get(public_id=placed.json()["id"]),
        "offer": offer,
        "quote": quote["id"],
        "hook": hook["id"],
        "delivery": WebhookDelivery.objects.filter(endpoint_id=hook["id"]).first().pk,
        "token": token,
        "invitation": invitation,
    }


def _snapshot() -> dict[str, object]:
    return {
        "orders": list(Order.objects.order_by("pk").values_list("pk", "state")),
        "quotes": Quote.objects.count(),
        "tokens": list(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        "hooks": list(WebhookEndpoint.objects.order_by("pk").values_list("pk", "active")),
        "deliveries": WebhookDelivery.objects.count(),
        "invitations": list(Invitation.objects.order_by("pk").values_list("pk", "revoked_at")),
        "memberships": list(Membership.objects.order_by("pk").values_list("pk", "role")),
        "budgets": list(Organization.objects.order_by("pk").values_list("budget_per_hour", "budget_monthly")),
        "ledger": LedgerEntry.objects.count(),
    }


def _api_writes(world) -> list[tuple[str, str, dict[str, object] | None]]:
    order, hook, delivery = world["order"].public_id, world["hook"], world["delivery"]
    return [
        ("post", "/api/v1/orders", {"offer": world["offer"].pk}),
        ("post", "/api/v1/orders", {"quote": world["quote"]}),
        ("post", f"/api/v1/orders/{order}/terminate", None),
        ("post", "/api/v1/quotes", {"profile": "inference"}),
        ("post", "/api/v1/procurements", {"demands": [{"profile": "inference"}]}),
        ("put", "/api/v1/budget", {"budget_per_hour": "5.00", "budget_monthly": None}),
        ("post", "/api/v1/webhooks", {"url": "http://127.0.0.1:9/other"}),
        ("delete", f"/api/v1/webhooks/{hook}", None),
        ("post", f"/api/v1/webhooks/{hook}/ping", None),
        ("post", f"/api/v1/webhooks/{hook}/deliveries/{delivery}/redeliver", None),
    ]


def test_a_viewer_is_refused_every_changing_api_call_and_nothing_is_written(world, vera):
    api = APIClient()
    api.force_authenticate(vera)
    before = _snapshot()
    for method, path, body in _api_writes(world):
        response = getattr(api, method)(path, body, format="json", HTTP_IDEMPOTENCY_KEY=f"k-{path}")
        assert response.status_code == 403, (method, path, response.status_code)
        message = response.json()["error"]["message"]
        assert "role; you are a viewer" in message and ("owner" in message), (path, message)
    assert _snapshot() == before
    # Reading stays open to a viewer.
    for path in ["/api/v1/orders", f"/api/v1/orders/{world['order'].public_id}", "/api/v1/invoice", "/api/v1/budget",
                 f"/api/v1/orders/{world['order'].public_id}/receipt"]:  # fmt: skip
        assert api.get(path).status_code == 200, path
    assert api.get("/api/v1/webhooks").status_code == 403


def test_a_member_may_order_but_not_set_budgets_or_run_the_team(world, bob):
    api = APIClient()
    api.force_authenticate(bob)
    refused = api.put("/api/v1/budget", {"budget_per_hour": "5.00", "budget_monthly": None}, format="json")
    assert refused.status_code == 403 and "needs the owner role; you are a member" in refused.json()["error"]["message"]
    assert api.post("/api/v1/quotes", {"profile": "inference"}, format="json").status_code == 201
    browser = client_for(bob)
    before = _snapshot()
    assert browser.post("/team/", {"email": "x@example.com", "role": "member"}).status_code == 403
    assert browser.post(f"/team/invitations/{world['invitation'].pk}/revoke").status_code == 403
    assert browser.post("/spending", {"budget_per_hour": "5"}).status_code == 403
    assert _snapshot() == before


def _storefront_writes(world) -> list[tuple[str, dict[str, object]]]:
    order, hook, delivery = world["order"].public_id, world["hook"], world["delivery"]
    alice_membership = Membership.objects.get(user__username="alice")
    return [
        ("/orders/new", {"offer": world["offer"].pk, "duration_hours": "1", "allow_failover": "on"}),
        ("/orders/new", {"quote": world["quote"], "duration_hours": "1"}),
        ("/orders/place", {"nonce": "a-nonce-of-sixteen-or-more"}),
        ("/workload/", {"profile": "inference", "duration_hours": "8", "interruption_tolerance": "checkpointed"}),
        (f"/orders/{order}/terminate", {}),
        ("/tokens/", {"name": "mine", "scopes": ["offers:read"]}),
        (f"/tokens/{world['token'].pk}/revoke", {}),
        ("/webhooks/", {"url": "http://127.0.0.1:9/other"}),
        (f"/webhooks/{hook}/delete", {}),
        (f"/webhooks/{hook}/ping", {}),
        (f"/webhooks/{hook}/deliveries/{delivery}/redeliver", {}),
        ("/spending", {"budget_per_hour": "5"}),
        ("/team/", {"email": "x@example.com", "role": "viewer"}),
        (f"/team/members/{alice_membership.pk}", {"remove": "1"}),
        (f"/team/invitations/{world['invitation'].pk}/revoke", {}),
    ]


def test_a_viewer_is_refused_every_storefront_form_and_nothing_is_written(world, vera):
    client = client_for(vera)
    before = _snapshot()
    for path, data in _storefront_writes(world):
        response = client.post(path, data)
        assert response.status_code == 403, (path, response.status_code)
        page = response.content.decode()
        assert "role; you are a viewer" in page, path
    assert _snapshot() == before
    assert world["order"].state == OrderState.RUNNING


def test_a_viewer_sees_the_pages_without_the_buttons_they_cannot_use(world, vera):
    client = client_for(vera)
    order = world["order"].public_id
    assert 'disabled title="a viewer cannot order' in client.get("/").content.decode()
    assert "Terminate" not in client.get("/orders/").content.decode()
    assert "Terminate" not in client.get(f"/orders/{order}/").content.decode()
    tokens = client.get("/tokens/").content.decode()
    assert 'id="viewer-note"' in tokens and "Create token" not in tokens and "Revoke" not in tokens
    assert world["token"].prefix in tokens  # but sees them
    workload = client.get("/workload/").content.decode()
    assert "quoting and ordering need the member or owner role" in workload
    header = client.get("/orders/").content.decode()
    assert 'href="/webhooks/"' not in header and '<span class="role-tag">viewer</span>' in header
    assert client.get("/webhooks/").status_code == 403
    for path in ["/orders/", f"/orders/{order}/", f"/orders/{order}/receipt", "/spending", "/spending.csv", "/team/"]:
        assert client.get(path).status_code == 200, path


# --- Another organisation's team ------------------------------------------------------------------------------


def test_a_stranger_gets_404_on_another_organisations_team_objects(world, charlie, alice, bob):
    client = client_for(charlie)  # owner of Charlie Labs: every permission there, none in Acme
    bob_membership = Membership.objects.get(user=bob)
    before = _snapshot()

    assert client.post(f"/team/members/{bob_membership.pk}", {"remove": "1"}).status_code == 404
    assert client.post(f"/team/members/{bob_membership.pk}", {f"m{bob_membership.pk}-role": "owner"}).status_code == 404
    assert client.post(f"/team/invitations/{world['invitation'].pk}/revoke").status_code == 404
    page = client.get("/team/").content.decode()
    assert "bob" not in page and "nina@example.com" not in page and "Acme Research" not in page
    assert _snapshot() == before


def test_a_buyer_invitation_opened_at_the_portal_address_goes_to_the_storefront(alice):
    path = _invite(client_for(alice), "nina@example.com", Role.MEMBER)
    token = path.rsplit("/", 1)[-1]
    response = Client().get(f"/provider/invitations/{token}")
    assert response.status_code == 302 and response["Location"] == path
