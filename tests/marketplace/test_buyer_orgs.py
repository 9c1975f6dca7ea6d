"""Buyer sign-up, belonging to several buyer organisations and switching between them, and API tokens that act
in their own organisation only, for as long as their creator belongs to it."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.models import (
    ApiToken,
    Membership,
    Offer,
    Order,
    Organization,
    OrganizationKind,
    Role,
    WebhookEndpoint,
)
from marketplace.portal.services import membership_remove, membership_role_set
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-9"


def _signup(client: Client, **overrides: str):
    data = {
        "username": "dora",
        "email": "Dora@Example.com",
        "password1": PASSWORD,
        "password2": PASSWORD,
        "organization_name": "Dora  Dynamics",
    }
    return client.post("/signup", {**data, **overrides})


# --- Signing up -----------------------------------------------------------------------------------------------


def test_signing_up_makes_the_user_owner_of_a_new_buyer_organisation_and_lands_on_the_offers():
    client = Client()

    response = _signup(client)

    assert (response.status_code, response["Location"]) == (302, "/")
    dora = get_user_model().objects.get(username="dora")
    assert dora.email == "dora@example.com" and dora.check_password(PASSWORD)
    membership = Membership.objects.select_related("organization").get(user=dora)
    assert (membership.organization.name, membership.organization.kind, membership.role) == (
        "Dora Dynamics",
        OrganizationKind.BUYER,
        Role.OWNER,
    )
    assert membership.joined_at is not None
    page = client.get("/").content.decode()  # signed in, acting for the new organisation
    assert "Sign out dora" in page and "Dora Dynamics" in page
    assert client.get("/orders/").status_code == 200


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"username": "ALICE"}, "username", "that username is taken"),
        ({"organization_name": "acme research"}, "organization_name", "already on the marketplace"),
        ({"password1": "password", "password2": "password"}, "password1", "too common"),
        ({"password2": "something-else-entirely"}, "password2", "the two passwords differ"),
        ({"email": "not-an-address"}, "email", "valid email"),
    ],
)
def test_signing_up_names_what_is_wrong_and_writes_nothing(alice, overrides, field, says):
    users, organizations = get_user_model().objects.count(), Organization.objects.count()

    response = _signup(Client(), **overrides)

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert says in " ".join(errors[field]), errors
    assert (get_user_model().objects.count(), Organization.objects.count()) == (users, organizations)


def test_the_login_page_links_to_signing_up():
    page = Client().get("/login/").content.decode()
    assert 'href="/signup"' in page


def test_a_signed_in_buyer_going_to_signup_lands_on_the_offers(alice):
    client = Client()
    client.force_login(alice)
    assert client.get("/signup")["Location"] == "/"


# --- Several organisations and switching ----------------------------------------------------------------------


@pytest.fixture
def labs(charlie) -> Organization:
    return Organization.objects.get(name="Charlie Labs")


@pytest.fixture
def two_orgs(acme, alice, charlie, labs, aws_account, django_capture_on_commit_callbacks):
    """Alice owns Acme and is a member of Charlie Labs; each organisation has an order, a token and a webhook."""
    Membership.objects.create(user=alice, organization=labs, role=Role.MEMBER)
    offer = Offer.objects.order_by("price_usd").first()
    made = {}
    for org, user in ((acme, alice), (labs, charlie)):
        api = APIClient()
        api.force_authenticate(user)  # alice's session starts in her oldest organisation, Acme
        with django_capture_on_commit_callbacks(execute=True):
            placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json")
        assert placed.status_code == 201, placed.json()
        hook = api.post("/api/v1/webhooks", {"url": f"http://127.0.0.1:9/{org.pk}"}, format="json")
        assert hook.status_code == 201
        token = api_token_create(organization=org, user=user, name=f"ci-{org.pk}", scopes=["offers:read"]).token
        made[org.pk] = {"order": str(placed.json()["id"]), "token": token.prefix, "hook": f"127.0.0.1:9/{org.pk}"}
    assert Order.objects.get(public_id=made[acme.pk]["order"]).organization == acme
    assert Order.objects.get(public_id=made[labs.pk]["order"]).organization == labs
    return made


def _everything_shows(client: Client, shown: dict[str, str], hidden: dict[str, str]) -> None:
    for path in ["/orders/", "/spending", "/spending.csv", "/tokens/", "/webhooks/", "/team/"]:
        response = client.get(path)
        assert response.status_code == 200, path
        page = response.content.decode()
        assert hidden["order"] not in page and hidden["token"] not in page and hidden["hook"] not in page, path
    assert shown["order"] in client.get("/orders/").content.decode()
    assert shown["token"] in client.get("/tokens/").content.decode()
    assert shown["hook"] in client.get("/webhooks/").content.decode()
    assert client.get(f"/orders/{shown['order']}/").status_code == 200
    assert client.get(f"/orders/{hidden['order']}/").status_code == 404
    assert client.get(f"/orders/{hidden['order']}/receipt").status_code == 404
    # The API, by the same session, lists the same organisation's things.
    orders = json.dumps(client.get("/api/v1/orders").json())
    hooks = json.dumps(client.get("/api/v1/webhooks").json())
    assert shown["order"] in orders and hidden["order"] not in orders
    assert shown["hook"] in hooks and hidden["hook"] not in hooks
    assert client.get(f"/api/v1/orders/{hidden['order']}").status_code == 404


def test_switching_shows_the_chosen_organisations_things_only_on_every_page_and_api_list(two_orgs, alice, acme, labs):
    client = Client()
    client.force_login(alice)
    _everything_shows(client, shown=two_orgs[acme.pk], hidden=two_orgs[labs.pk])

    switched = client.post("/organizations/switch", {"organization": labs.pk, "next": "/orders/"})

    assert switched["Location"] == "/orders/"
    _everything_shows(client, shown=two_orgs[labs.pk], hidden=two_orgs[acme.pk])
    header = client.get("/").content.decode()
    assert 'id="org-switch"' in header and "Charlie Labs" in header and "Acme Research" in header
    # Switching back works the same way.
    client.post("/organizations/switch", {"organization": acme.pk})
    _everything_shows(client, shown=two_orgs[acme.pk], hidden=two_orgs[labs.pk])


def test_the_switcher_lists_only_the_persons_buyer_organisations(alice, labs, acme):
    Membership.objects.create(user=alice, organization=labs, role=Role.VIEWER)
    MembershipFactory(organization__name="Zed Hosting", organization__kind=OrganizationKind.PROVIDER, user=alice)
    MembershipFactory(organization__name="Other Buyer")  # someone else's
    client = Client()
    client.force_login(alice)

    page = client.get("/").content.decode()
    switcher = page[page.index('id="org-switch"') : page.index("</details>")]

    assert switcher.count('name="organization"') == 2
    assert "Acme Research" in switcher and "Charlie Labs" in switcher
    assert "Zed Hosting" not in switcher and "Other Buyer" not in switcher
    assert 'aria-current="true"' in switcher.split("Charlie Labs")[0]  # Acme (the oldest) is active


def test_switching_to_an_organisation_one_is_not_in_is_404(alice, acme, labs):
    provider = MembershipFactory(
        organization__name="Zed Hosting", organization__kind=OrganizationKind.PROVIDER, user=alice
    ).organization
    client = Client()
    client.force_login(alice)
    for target in (labs.pk, provider.pk, 999_999, "acme"):
        assert client.post("/organizations/switch", {"organization": target}).status_code == 404
    assert client.session.get("buyer_organization") in (None, acme.pk)
    assert "Acme Research" in client.get("/team/").content.decode()


def test_switching_needs_a_post_with_the_csrf_token(alice, labs):
    Membership.objects.create(user=alice, organization=labs, role=Role.MEMBER)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/organizations/switch", {"organization": labs.pk}).status_code == 405
    assert client.post("/organizations/switch", {"organization": labs.pk}).status_code == 403
    assert "Acme Research" in client.get("/team/").content.decode()


@pytest.mark.parametrize(
    ("next_page", "lands"),
    [
        ("/spending?month=2026-01", "/spending?month=2026-01"),
        ("/orders/4b6c44c4-5b5e-4d8e-a1b6-3b4c1c7d3e11/", "/orders/"),  # an order of the other organisation
        ("https://evil.example/", "/orders/"),
        ("", "/orders/"),
    ],
)
def test_after_switching_a_list_page_is_shown_again_and_anything_else_goes_to_the_orders(alice, labs, next_page, lands):
    Membership.objects.create(user=alice, organization=labs, role=Role.MEMBER)
    client = Client()
    client.force_login(alice)
    response = client.post("/organizations/switch", {"organization": labs.pk, "next": next_page})
    assert response["Location"] == lands


def test_a_removed_membership_falls_back_to_another_organisation_never_the_left_one(alice, acme, labs, charlie):
    Membership.objects.create(user=alice, organization=labs, role=Role.MEMBER)
    client = Client()
    client.force_login(alice)
    client.post("/organizations/switch", {"organization": labs.pk})
    assert "Charlie Labs" in client.get("/team/").content.decode()

    membership_remove(membership=Membership.objects.get(user=alice, organization=labs))

    page = client.get("/team/").content.decode()
    assert 'Team <span class="muted">· Acme Research' in page
    assert "no longer in the organisation you had chosen" in page
    assert client.session["buyer_organization"] == acme.pk
    assert "Charlie Labs" not in client.get("/orders/").content.decode()
    api = client.get("/api/v1/budget")  # the API by session follows the same fallback
    assert api.status_code == 200


def test_leaving_the_active_organisation_falls_back_and_the_left_one_is_gone_from_the_switcher(alice, bob, acme, labs):
    Membership.objects.create(user=bob, organization=labs, role=Role.MEMBER)
    client = Client()
    client.force_login(bob)
    client.post("/organizations/switch", {"organization": acme.pk})

    left = client.post("/team/leave", follow=True)

    assert "You left Acme Research; now acting for Charlie Labs." in left.content.decode()
    assert not Membership.objects.filter(user=bob, organization=acme).exists()
    header = client.get("/").content.decode()
    assert "Acme Research" not in header and "Charlie Labs" in header


def test_someone_in_no_buyer_organisation_gets_404_on_the_buyer_pages():
    loner = get_user_model().objects.create_user(username="loner", password=PASSWORD)
    client = Client()
    client.force_login(loner)
    for path in ["/orders/", "/team/", "/tokens/", "/spending"]:
        assert client.get(path).status_code == 404, path
    assert client.get("/api/v1/orders").status_code == 403


# --- Tokens act in their own organisation ---------------------------------------------------------------------


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_token_acts_in_its_own_organisation_even_when_its_creator_belongs_to_two(two_orgs, alice, acme, labs):
    # Alice's oldest organisation is Acme, but this token was made in Charlie Labs.
    raw = api_token_create(
        organization=labs, user=alice, name="labs-ci", scopes=["orders:place", "webhooks:manage"]
    ).raw
    client = _bearer(raw)

    orders = json.dumps(client.get("/api/v1/orders").json())
    hooks = json.dumps(client.get("/api/v1/webhooks").json())

    assert two_orgs[labs.pk]["order"] in orders and two_orgs[acme.pk]["order"] not in orders
    assert two_orgs[labs.pk]["hook"] in hooks and two_orgs[acme.pk]["hook"] not in hooks
    assert client.get(f"/api/v1/orders/{two_orgs[acme.pk]['order']}").status_code == 404
    created = client.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/new"}, format="json")
    assert created.status_code == 201
    assert WebhookEndpoint.objects.get(pk=created.json()["id"]).organization == labs
    # A session switched elsewhere does not move the token.
    session = Client()
    session.force_login(alice)
    session.post("/organizations/switch", {"organization": acme.pk})
    assert two_orgs[acme.pk]["order"] not in json.dumps(client.get("/api/v1/orders").json())


def test_a_token_stops_working_once_its_creator_leaves_its_organisation(acme, alice, bob):
    raw = api_token_create(organization=acme, user=bob, name="bob-ci", scopes=["offers:read", "orders:place"]).raw
    assert _bearer(raw).get("/api/v1/orders").status_code == 200

    membership_remove(membership=Membership.objects.get(user=bob, organization=acme))

    for path in ["/api/v1/orders", "/api/v1/offers", "/api/v1/budget"]:
        refused = _bearer(raw).get(path)
        assert refused.status_code == 401, path
        assert "no longer in its organisation" in refused.json()["error"]["message"]


def test_a_token_whose_creator_became_a_viewer_carries_only_the_read_scopes(acme, alice, bob, aws_account):
    everything = ["offers:read", "orders:place", "instances:manage", "ledger:read", "webhooks:manage"]
    raw = api_token_create(organization=acme, user=bob, name="bob-all", scopes=everything).raw
    offer = Offer.objects.order_by("price_usd").first()
    assert _bearer(raw).get("/api/v1/orders").status_code == 200

    membership_role_set(membership=Membership.objects.get(user=bob, organization=acme), role=Role.VIEWER)

    client = _bearer(raw)
    assert client.get("/api/v1/offers").status_code == 200
    for method, path, body in [
        ("get", "/api/v1/orders", None),
        ("post", "/api/v1/orders", {"offer": offer.pk}),
        ("get", "/api/v1/webhooks", None),
        ("post", "/api/v1/webhooks", {"url": "http://127.0.0.1:9/x"}),
    ]:
        refused = getattr(client, method)(path, body, format="json")
        assert refused.status_code == 403, (method, path)
        assert "now that its creator is a viewer" in refused.json()["error"]["message"]
    # Quoting needs orders:place (issue 17), which a viewer's token no longer carries.
    quoted = client.post("/api/v1/quotes", {"profile": "inference"}, format="json")
    assert quoted.status_code == 403 and "now that its creator is a viewer" in quoted.json()["error"]["message"]
    assert not Order.objects.exists() and not WebhookEndpoint.objects.exists()


def test_tokens_carry_no_more_than_their_creators_role(acme, alice, bob, labs):
    vera = MembershipFactory(user__username="vera", organization=acme, role=Role.VIEWER).user
    with pytest.raises(PermissionError, match="owner or member role"):
        api_token_create(organization=acme, user=vera, name="v", scopes=["offers:read"])
    with pytest.raises(PermissionError, match="not in this organisation"):
        api_token_create(organization=labs, user=bob, name="b", scopes=["offers:read"])
    member_token = api_token_create(organization=acme, user=bob, name="b", scopes=["orders:place", "webhooks:manage"])
    assert member_token.token.scopes == ["orders:place", "webhooks:manage"]
    assert ApiToken.objects.filter(created_by=vera).count() == 0
