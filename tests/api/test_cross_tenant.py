"""Every route, checked for cross-tenant access: a stranger (charlie, of another buyer organisation) gets 404 on
everything of alice's, by session and by a token with every scope, sees none of it in any list, and changes
nothing. A route added without a line in ``ROUTES`` fails ``test_every_route_is_accounted_for``."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.models import (
    ApiToken,
    Instance,
    LaunchTemplate,
    Offer,
    Order,
    OrderState,
    SshKey,
    TokenScope,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.leases import boot

pytestmark = pytest.mark.django_db

# Every route and where its tenancy is proven. "object": below, by id; "list": below, by content; "own": acts
# on the caller's own organisation only, below; "public": nothing private; the rest name their tests.
ROUTES = {
    "metrics": "public (aggregates only; loopback or a metrics token: tests/test_metrics.py)",
    "healthz": "public (says the process answers, nothing more: tests/test_health.py)",
    "readyz": "public (each dependency ok or the kind of failure, no address: tests/test_health.py)",
    "login/": "public",
    "logout/": "public",
    "api/v1/schema": "public",
    "api/v1/docs": "public",
    "api/v1/offers": "public catalogue (token scope offers:read)",
    "api/v1/offers/<str:offer_id>": "public catalogue (token scope offers:read)",
    "api/v1/offers/<str:offer_id>/prices": "public catalogue (token scope offers:read)",
    "api/v1/quotes": "own",
    "api/v1/procurements": "own",
    "api/v1/orders": "list",
    "api/v1/clusters": "list (tests/marketplace/test_clusters_api.py: a stranger lists none of them)",
    "api/v1/clusters/<str:cluster_id>": "tests/marketplace/test_clusters_api.py (another organisation's: 404)",
    "api/v1/clusters/<str:cluster_id>/terminate": "tests/marketplace/test_clusters_api.py (another's: 404)",
    "api/v1/fleets": "list (tests/api/test_fleets_api.py: a stranger lists none of them)",
    "api/v1/fleets/<str:fleet_id>": "tests/api/test_fleets_api.py (another organisation's: 404, read or patch)",
    "api/v1/fleets/<str:fleet_id>/end": "tests/api/test_fleets_api.py (another organisation's: 404)",
    "api/v1/fleets/<str:fleet_id>/decisions": "tests/api/test_fleets_api.py (another organisation's: 404)",
    "api/v1/fleets/<str:fleet_id>/metrics": "the fleet's own metrics token only; any other token or another "
    "fleet's: 404 (tests/api/test_fleets_api.py)",
    "api/v1/budget": "own",
    "api/v1/invoice": "list",
    "api/v1/billing": "own (the caller's organisation: tests/marketplace/test_prepaid.py)",
    "api/v1/billing/topups": "list (tests/marketplace/test_prepaid.py: a stranger lists none of them)",
    "api/v1/billing/topups/<str:topup_id>": "tests/marketplace/test_prepaid.py (another organisation's: 404)",
    "api/v1/billing/topups/<str:topup_id>/cancel": "tests/marketplace/test_prepaid.py (another organisation's: 404)",
    "api/v1/stripe/webhook": "public (Stripe's signature decides: tests/marketplace/test_prepaid.py)",
    "api/v1/invoices": "list (tests/marketplace/test_invoices.py: another organisation's are not listed)",
    "api/v1/invoices/<str:number>.pdf": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "api/v1/invoices/<str:number>.csv": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "api/v1/invoices/<str:number>": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "api/v1/orders/<str:order_id>": "object",
    "api/v1/orders/<str:order_id>/terminate": "object",
    "api/v1/orders/<str:order_id>/stop": "object",
    "api/v1/orders/<str:order_id>/start": "object",
    "api/v1/orders/<str:order_id>/restart": "object",
    "api/v1/orders/<str:order_id>/logs": "object",
    "api/v1/orders/<str:order_id>/receipt": "object",
    "api/v1/ssh-keys": "list",
    "api/v1/ssh-keys/<str:key_id>": "object",
    "api/v1/launch-templates": "list",
    "api/v1/launch-templates/<str:template_id>": "object",
    "api/v1/templates/gallery": "public (the broker's own gallery, the same for everyone)",
    "api/v1/templates/gallery/<str:slug>": "public (the broker's own gallery, the same for everyone)",
    "api/v1/webhooks": "list",
    "api/v1/webhooks/<str:webhook_id>": "object",
    "api/v1/webhooks/<str:webhook_id>/deliveries": "object",
    "api/v1/webhooks/<str:webhook_id>/deliveries/<str:delivery_id>/redeliver": "object",
    "api/v1/webhooks/<str:webhook_id>/ping": "object",
    "api/v1/webhooks/<str:webhook_id>/secret": "object",
    "api/v1/ledger/key": "public",
    "api/v1/ledger/checkpoints": "public",
    "api/v1/ledger/checkpoints/latest": "public",
    "api/v1/ledger/consistency": "public",
    "api/v1/ledger/leaves": "public (leaf hashes reveal nothing of the entries)",
    "provider/": "tests/portal/test_onboarding.py::test_buyers_and_strangers_get_404_on_provider_pages",
    "provider/signup": "public",
    "provider/details": "tests/portal/test_onboarding.py::test_buyers_and_strangers_get_404_on_provider_pages",
    "provider/terms": "tests/portal/test_onboarding.py::test_buyers_and_strangers_get_404_on_provider_pages",
    "provider/team": "tests/portal/test_onboarding.py::test_buyers_and_strangers_get_404_on_provider_pages",
    "provider/team/members/<int:membership_id>": "tests/portal/test_team.py (another provider's member: 404)",
    "provider/team/invitations/<int:invitation_id>/revoke": "tests/portal/test_team.py (another's invitation: 404)",
    "provider/invitations/<str:token>": "tests/portal/test_team.py::test_an_unknown_token_is_404",
    "provider/accounts": "tests/portal/test_accounts.py::test_buyers_get_404_on_account_pages",
    "provider/accounts/connect/<str:kind>": "tests/portal/test_accounts.py::test_buyers_get_404_on_account_pages",
    "provider/accounts/<int:account_id>/edit": "tests/portal/test_accounts.py (another provider's account: 404)",
    "provider/accounts/<int:account_id>/sync": "tests/portal/test_accounts.py (another provider's account: 404)",
    "provider/accounts/<int:account_id>/sla": "tests/portal/test_sla_portal.py (another provider's account: 404)",
    "provider/machines": "tests/portal/test_machines.py::test_a_viewer_cannot_list_and_a_stranger_sees_nothing",
    "provider/machines/new": "tests/portal/test_machines.py",
    "provider/machines/<int:machine_id>/prices": "tests/portal/test_machine_prices.py (another provider, a buyer: 404)",
    "provider/earnings": "tests/portal/test_onboarding.py::test_buyers_and_strangers_get_404_on_provider_pages",
    "provider/payouts": "tests/portal/test_connect_payouts.py (a buyer or a stranger: 404; a viewer: 403)",
    "provider/payouts/onboard": "tests/portal/test_connect_payouts.py (owners of their own organisation only)",
    "provider/payouts/connect/return": "tests/portal/test_connect_payouts.py (owners of their own organisation only)",
    "provider/payouts/run": "tests/portal/test_connect_payouts.py (owners of their own organisation only)",
    "provider/dashboard": "tests/portal/test_dashboard.py (another provider: nothing of theirs; a buyer: 404)",
    "provider/orders/<uuid:order_id>/receipt": "tests/portal/test_machines.py (another provider, a buyer: 404)",
    "agent/v1/lease/claim": "a one-time boot token: tests/marketplace/test_leases.py, tests/api/test_agent_hostile.py",
    "agent/v1/lease/boot-failed": "a one-time boot token: tests/marketplace/test_lease_boot_failed.py, "
    "tests/api/test_agent_hostile.py",
    "agent/v1/lease/secrets": "HMAC per lease, one lease's secrets only: tests/marketplace/test_leases.py",
    "agent/v1/lease/ready": "HMAC per lease: tests/marketplace/test_leases.py",
    "agent/v1/lease/failed": "HMAC per lease: tests/marketplace/test_leases.py",
    "agent/v1/lease/heartbeat": "HMAC per lease: tests/marketplace/test_leases.py",
    "agent/v1/lease/agent.pyz": "public (the lease agent's code, which boot scripts fetch and hash-check)",
    "agent/v1/register": "HMAC per machine: tests/providers/test_community*.py",
    "agent/v1/heartbeat": "HMAC per machine: tests/providers/test_community*.py",
    "agent/v1/commands": "HMAC per machine, its own commands only: tests/providers/test_community_outbound.py",
    "agent/v1/commands/<uuid:command_id>/answer": "HMAC per machine; another's command: 404 (test_community_outbound)",
    "": "public catalogue",
    "workload/": "own",
    "offers/<int:offer_id>/prices": "public catalogue",
    "compare": "public catalogue",
    "spending": "list",
    "spending.csv": "list",
    "billing/": "own (the active organisation's credit and top-ups: tests/marketplace/test_prepaid.py)",
    "billing/topups/return": "own (the top-up is looked up in the active organisation only: test_prepaid.py)",
    "billing/topups/checkout-return": "own (the session's top-up is looked up in the active organisation only: "
    "test_topup_checkout.py)",
    "billing/verify-email": "own (the signed-in person's own address)",
    "account/verify-email/<str:token>": "public (a signed, expiring token for one user's address)",
    "billing/invoices/": "list (tests/marketplace/test_invoices.py)",
    "billing/invoices/<str:number>/": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "billing/invoices/<str:number>.pdf": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "billing/invoices/<str:number>.csv": "tests/marketplace/test_invoices.py (another organisation's: 404)",
    "orders/": "list",
    "orders/<str:order_id>/": "object",
    "tokens/": "list",
    "tokens/<int:token_id>/revoke": "object",
    "webhooks/": "list",
    "webhooks/<int:webhook_id>/": "object",
    "webhooks/<int:webhook_id>/delete": "object",
    "webhooks/<int:webhook_id>/ping": "object",
    "webhooks/<int:webhook_id>/active": "object",
    "webhooks/<int:webhook_id>/secret": "object",
    "webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver": "object",
    "signup": "public (creates a new user and organisation)",
    "organizations/switch": "tests/marketplace/test_buyer_orgs.py (an organisation one is not in: 404)",
    "team/": "own (the active organisation's team: tests/marketplace/test_buyer_team.py)",
    "team/members/<int:membership_id>": "tests/marketplace/test_buyer_team.py (another organisation's member: 404)",
    "team/invitations/<int:invitation_id>/revoke": "tests/marketplace/test_buyer_team.py (another's invitation: 404)",
    "team/leave": "own (leaves the active organisation only)",
    "invitations/<str:token>": "tests/marketplace/test_buyer_team.py (unknown or a provider's token: 404)",
    "orders/new": "object (an offer is public; another organisation's quote is 404)",
    "orders/new/confirm": "own (a draft in the caller's own session, for the organisation it was made for)",
    "orders/place": "own (places the caller's own session draft, for the organisation it was made for)",
    "keys/": "list",
    "keys/<str:key_id>/delete": "object",
    "templates/": "list",
    "templates/<str:template_id>/delete": "object",
    "templates/gallery/<str:slug>/use": "own (the caller's session: test_storefront_gallery.py)",
    "templates/gallery/<str:slug>/copy": "own (the caller's organisation: test_storefront_gallery.py)",
    "orders/<str:order_id>/terminate": "object",
    "orders/<str:order_id>/stop": "object",
    "orders/<str:order_id>/start": "object",
    "orders/<str:order_id>/restart": "object",
    "orders/<str:order_id>/receipt": "object",
    "clusters/<str:cluster_id>/": "tests/marketplace/test_storefront_clusters.py (another organisation's: 404)",
    "clusters/<str:cluster_id>/terminate": "tests/marketplace/test_storefront_clusters.py (another's: 404)",
    "fleets/": "list (tests/marketplace/test_storefront_fleets.py: a stranger's list shows none of them)",
    "fleets/<str:fleet_id>/": "tests/marketplace/test_storefront_fleets.py (another organisation's: 404)",
    "fleets/<str:fleet_id>/end": "tests/marketplace/test_storefront_fleets.py (another's: 404, the fleet unended)",
}


def _routes(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def test_every_route_is_accounted_for():
    served = {r for r in _routes(get_resolver().url_patterns) if not r.startswith("admin/")}
    assert served - set(ROUTES) == set(), "classify the new route in ROUTES and test its tenancy"
    assert set(ROUTES) - served == set(), "a route in ROUTES is no longer served"


@pytest.fixture
def world(acme, alice, charlie, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    """Alice's things: a webhook with deliveries, a running order, a quote, a token, a launch template, an SSH
    key."""
    api = APIClient()
    api.force_authenticate(alice)
    hook = api.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}, format="json").json()
    offer = Offer.objects.order_by("price_usd").first()
    with django_capture_on_commit_callbacks(execute=True):  # provisioning (and webhook sends) run on commit
        placed = api.post("/api/v1/orders", {"offer": offer.pk, "allow_failover": False}, format="json")
    assert placed.status_code == 201, placed.json()
    order = Order.objects.get(public_id=placed.json()["id"])
    with django_capture_on_commit_callbacks(execute=True):
        boot(order, aws_sandbox)
    assert order.state == OrderState.RUNNING
    template = api.post(
        "/api/v1/launch-templates", {"name": "alice-dev", "launch": {"allowed_cidrs": ["198.51.100.0/24"]}},
        format="json",
    ).json()  # fmt: skip
    quote = api.post("/api/v1/quotes", {"profile": "inference"}, format="json").json()["quotes"][0]
    delivery = WebhookDelivery.objects.filter(endpoint_id=hook["id"]).first()
    assert delivery is not None
    token = api_token_create(organization=acme, user=alice, name="alice-ci", scopes=["offers:read"]).token
    secret = WebhookEndpoint.objects.get(pk=hook["id"]).secret_encrypted
    key = SshKey.objects.get(organization=acme)
    return {"order": order, "hook": hook["id"], "delivery": delivery.pk, "quote": quote["id"], "token": token,
            "secret": secret, "template": template["id"], "key": key}  # fmt: skip


def _strangers(charlie):
    """Charlie signed in, and charlie's token with every scope."""
    session = APIClient()
    session.force_authenticate(charlie)
    everything = [s.value for s in TokenScope]
    raw = api_token_create(organization=charlie.memberships.get().organization, user=charlie, name="x",
                           scopes=everything).raw  # fmt: skip
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return {"session": session, "token": bearer}


def _unchanged(world) -> None:
    order = Order.objects.get(pk=world["order"].pk)
    assert order.state == OrderState.RUNNING
    assert WebhookEndpoint.objects.filter(
        pk=world["hook"], active=True, url="http://127.0.0.1:9/hook", secret_encrypted=world["secret"]
    ).exists()
    assert WebhookDelivery.objects.filter(endpoint_id=world["hook"], redelivery_of__isnull=False).count() == 0
    assert not WebhookDelivery.objects.filter(endpoint_id=world["hook"], event_type="ping").exists()
    assert ApiToken.objects.get(pk=world["token"].pk).revoked_at is None
    assert SshKey.objects.filter(pk=world["key"].pk, name=world["key"].name).exists()
    template = LaunchTemplate.objects.get(public_id=world["template"])
    assert (template.name, template.configuration.spec["allowed_cidrs"]) == ("alice-dev", ["198.51.100.0/24"])


@pytest.mark.parametrize("who", ["session", "token"])
def test_a_stranger_gets_404_on_every_api_object_and_changes_nothing(world, charlie, who):
    client = _strangers(charlie)[who]
    order, hook, delivery = world["order"].public_id, world["hook"], world["delivery"]
    calls = [
        ("get", f"/api/v1/orders/{order}"),
        ("post", f"/api/v1/orders/{order}/terminate"),
        ("post", f"/api/v1/orders/{order}/stop"),
        ("post", f"/api/v1/orders/{order}/start"),
        ("post", f"/api/v1/orders/{order}/restart"),
        ("get", f"/api/v1/orders/{order}/logs"),
        ("get", f"/api/v1/orders/{order}/receipt"),
        ("get", f"/api/v1/webhooks/{hook}"),
        ("delete", f"/api/v1/webhooks/{hook}"),
        ("get", f"/api/v1/webhooks/{hook}/deliveries"),
        ("post", f"/api/v1/webhooks/{hook}/deliveries/{delivery}/redeliver"),
        ("post", f"/api/v1/webhooks/{hook}/ping"),
        ("patch", f"/api/v1/webhooks/{hook}", {"active": False, "url": "http://127.0.0.1:9/charlie"}),
        ("post", f"/api/v1/webhooks/{hook}/secret"),
        ("get", f"/api/v1/ssh-keys/{world['key'].public_id}"),
        ("delete", f"/api/v1/ssh-keys/{world['key'].public_id}"),
        ("get", f"/api/v1/launch-templates/{world['template']}"),
        ("put", f"/api/v1/launch-templates/{world['template']}", {"name": "x", "launch": {}}),
        ("delete", f"/api/v1/launch-templates/{world['template']}"),
        ("get", "/api/v1/launch-templates/alice-dev"),
    ]
    for method, path, *body in calls:
        response = getattr(client, method)(path, *body, format="json")
        assert response.status_code == 404, (method, path, response.status_code)
        assert str(order) not in response.content.decode()
    ordered = client.post("/api/v1/orders", {"quote": world["quote"]}, format="json")
    assert ordered.status_code == 404 and ordered.json()["error"]["code"] == "quote_not_found"
    _unchanged(world)


@pytest.mark.parametrize("who", ["session", "token"])
def test_a_stranger_sees_nothing_of_alice_in_any_api_list(
    world, charlie, alice, who, django_capture_on_commit_callbacks
):
    client = _strangers(charlie)[who]
    owner = APIClient()
    owner.force_authenticate(alice)
    owner.put("/api/v1/budget", {"budget_per_hour": "123.45", "budget_monthly": None}, format="json")
    # An hour of running, so ending it writes an invoice line.
    Instance.objects.filter(order=world["order"]).update(ready_at=timezone.now() - dt.timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        owner.post(f"/api/v1/orders/{world['order'].public_id}/terminate")
    assert owner.get("/api/v1/invoice").json()["lines"], "alice's own invoice has her order"
    for path in ["/api/v1/orders", "/api/v1/webhooks", "/api/v1/invoice", "/api/v1/budget", "/api/v1/ssh-keys",
                 "/api/v1/launch-templates"]:  # fmt: skip
        body = client.get(path)
        assert body.status_code == 200, path
        text = json.dumps(body.json())
        assert str(world["order"].public_id) not in text and "123.45" not in text, path
        assert world["key"].fingerprint not in text and "alice-dev" not in text, path
    assert client.get("/api/v1/orders").json()["results"] == []
    assert client.get("/api/v1/webhooks").json()["results"] == []
    ordered = client.post("/api/v1/orders", {"offer": world["order"].offer_id, "launch_template": world["template"]},
                          format="json")  # fmt: skip
    assert ordered.status_code == 400 and "launch_template" in ordered.json()["error"]["fields"]
    ordered = client.post("/api/v1/orders", {"offer": world["order"].offer_id,
                          "launch": {"ssh_keys": [str(world["key"].public_id)]}}, format="json")  # fmt: skip
    assert ordered.status_code == 400 and "launch.ssh_keys[0]" in ordered.json()["error"]["fields"]


def test_a_stranger_gets_404_on_every_storefront_object_and_changes_nothing(world, charlie):
    browser = Client()
    browser.force_login(charlie)
    order, hook, delivery = world["order"].public_id, world["hook"], world["delivery"]
    calls = [
        ("get", f"/orders/{order}/"),
        ("post", f"/orders/{order}/terminate"),
        ("post", f"/orders/{order}/stop"),
        ("post", f"/orders/{order}/start"),
        ("post", f"/orders/{order}/restart"),
        ("get", f"/orders/{order}/receipt"),
        ("get", f"/webhooks/{hook}/"),
        ("post", f"/webhooks/{hook}/delete"),
        ("post", f"/webhooks/{hook}/ping"),
        ("post", f"/webhooks/{hook}/active", {"active": "off"}),
        ("post", f"/webhooks/{hook}/secret", {"nonce": "n1"}),
        ("post", f"/webhooks/{hook}/deliveries/{delivery}/redeliver"),
        ("post", f"/tokens/{world['token'].pk}/revoke"),
        ("post", f"/keys/{world['key'].public_id}/delete"),
        ("post", f"/templates/{world['template']}/delete"),
        ("get", f"/orders/new?quote={world['quote']}"),
    ]
    for method, path, *body in calls:
        response = getattr(browser, method)(path, *body)
        assert response.status_code == 404, (method, path, response.status_code)
    ordered = browser.post("/quotes/order", {"quote": world["quote"]})
    assert ordered.status_code in (302, 404)
    assert not Order.objects.filter(organization__name="Charlie Labs").exists()
    _unchanged(world)


def test_a_stranger_sees_nothing_of_alice_on_any_storefront_page(world, charlie):
    browser = Client()
    browser.force_login(charlie)
    for path in ["/orders/", "/webhooks/", "/spending", "/spending.csv", "/tokens/"]:
        response = browser.get(path)
        assert response.status_code == 200, path
        page = response.content.decode()
        assert str(world["order"].public_id) not in page, path
        assert world["token"].prefix not in page and "127.0.0.1:9/hook" not in page, path
