"""A buyer team in the browser: an owner invites someone, the invitee signs up through the link, joins a second
organisation, and switches between the two, each showing its own orders only."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.models import Membership, Offer, Organization, Role
from marketplace.portal.services import invitation_create
from tests.browser.conftest import shoot, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def _order_for(user) -> str:
    api = APIClient()
    api.force_authenticate(user)
    offer = Offer.objects.order_by("price_usd").first()
    placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json")
    assert placed.status_code == 201, placed.json()
    return str(placed.json()["id"])[:8]


def test_an_invitee_signs_up_joins_two_organisations_and_switches(
    browser, page, live_server, alice, charlie, aws_account
):
    base = live_server.url
    acme_order = _order_for(alice)
    labs = Organization.objects.get(name="Charlie Labs")
    _, labs_token = invitation_create(organization=labs, email="nina@example.com", role=Role.VIEWER, by=charlie)

    # Alice, owner of Acme, invites Nina as a member; the link is shown once.
    sign_in(page, base, alice)
    page.goto(f"{base}/team/")
    page.fill("#invite-form input[name=email]", "nina@example.com")
    page.select_option("#invite-form select[name=role]", "member")
    page.click("#invite-form button[type=submit]")
    link = page.input_value("#invitation-link-value")
    assert link.startswith(f"{base}/invitations/")
    assert "nina@example.com" in page.inner_text("#invitations")
    shoot(page, "buyer-team-1-invited")

    # Nina signs up through the link and lands on Acme's orders.
    nina = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    nina.set_default_timeout(15_000)
    nina.goto(f"{base}/signup")
    shoot(nina, "buyer-team-2-signup")
    nina.goto(link)
    shoot(nina, "buyer-team-2-invitation")
    nina.fill("input[name=username]", "nina")
    nina.fill("input[name=password1]", "correct-horse-battery-9")
    nina.fill("input[name=password2]", "correct-horse-battery-9")
    nina.click("#invitation-signup button[type=submit]")
    nina.wait_for_url(f"{base}/orders/")
    assert acme_order in nina.inner_text("main")
    assert "Acme Research" in nina.inner_text("#org-switch summary")

    # Charlie's invitation to Charlie Labs, accepted while signed in, switches her there: Acme's order is gone.
    nina.goto(f"{base}/invitations/{labs_token}")
    nina.click("button:has-text('Join as nina')")
    nina.wait_for_url(f"{base}/orders/")
    assert "Charlie Labs" in nina.inner_text("#org-switch summary")
    assert acme_order not in nina.inner_text("main")
    assert nina.locator("button:has-text('Terminate')").count() == 0  # a viewer there

    # The switcher lists both; choosing Acme brings its order back, and Charlie Labs hides it again.
    nina.click("#org-switch summary")
    items = nina.locator("#org-switch button[name=organization]")
    assert sorted(" ".join(text.split()) for text in items.all_inner_texts()) == [
        "Acme Research member",
        "Charlie Labs viewer",
    ]
    shoot(nina, "buyer-team-3-switcher")
    nina.click("#org-switch button:has-text('Acme Research')")
    nina.wait_for_url(f"{base}/orders/")
    assert acme_order in nina.inner_text("main")
    assert "Now acting for Acme Research as member." in nina.inner_text("main")
    shoot(nina, "buyer-team-4-acme-orders")
    nina.click("#org-switch summary")
    nina.click("#org-switch button:has-text('Charlie Labs')")
    nina.wait_for_url(f"{base}/orders/")
    assert acme_order not in nina.inner_text("main")
    shoot(nina, "buyer-team-5-labs-orders")

    # As a viewer there, ordering is disabled and the webhooks page says which role it needs.
    nina.goto(f"{base}/?q=gpu%3DT4+count%3D1+pricing%3Don_demand")
    assert nina.locator("button:has-text('Order'):disabled").count() > 0
    shoot(nina, "buyer-team-6-viewer-offers")
    response = nina.goto(f"{base}/webhooks/")
    assert response.status == 403
    assert "This needs the owner or member role; you are a viewer" in nina.inner_text("#forbidden")
    shoot(nina, "buyer-team-7-forbidden")

    # Alice's team page now shows Nina, joined today.
    page.goto(f"{base}/team/")
    assert "nina" in page.inner_text("#members")
    assert set(Membership.objects.filter(user__username="nina").values_list("organization__name", "role")) == {
        ("Acme Research", Role.MEMBER),
        ("Charlie Labs", Role.VIEWER),
    }
    shoot(page, "buyer-team-8-members")
