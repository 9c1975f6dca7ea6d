"""Every page a person sees, checked for accessibility (issue 21, points 5 and 6): axe-core finds no "serious" or
"critical" violation on any page, signed out, as a buyer and as a provider, at a desktop's and at a phone's
width; and a buyer searches, orders and terminates with the keyboard alone.

The pages are the routes of ``tests/api/test_cross_tenant.ROUTES`` less the API, the agent's and the POST-only
ones; ``test_every_page_is_visited`` fails when a route is added without a line in ``PAGES`` or ``NOT_PAGES``.
Each page's full-page screenshot goes to test-artifacts/ (``every-<width>-<page>.png``) for a person to look at.

axe-core's rule and impact reference: https://github.com/dequelabs/axe-core/blob/develop/doc/rule-descriptions.md
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.billing.book import Line, book_account, book_post
from marketplace.billing.invoices import invoice_issue
from marketplace.billing.verification import email_verification_token
from marketplace.catalog.services import offers_ingest
from marketplace.fleets.services import fleet_evaluate
from marketplace.models import (
    BookAccountKind,
    Cluster,
    Fleet,
    Offer,
    Order,
    OrderState,
    Organization,
    Role,
    WebhookDelivery,
)
from marketplace.orders.services import order_terminate
from marketplace.portal.services import (
    TERMS_VERSION,
    BusinessDetails,
    invitation_create,
    machine_listing_create,
    provider_details_update,
    provider_signup,
    provider_state_change,
    provider_terms_accept,
)
from providers.models import Machine, MachineState
from providers.services import provider_account_connect
from tests.api.test_cross_tenant import ROUTES
from tests.browser.conftest import shoot, sign_in
from tests.conftest import AWS_TEST_CREDENTIALS, TEST_AWS_REGIONS
from tests.hosts import LISTING
from tests.leases import boot

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = {"desktop": (1366, 900), "phone": (390, 844)}
SEVERE = {"serious", "critical"}
# Routes that are no page of their own: the API, the machines' agents, the metrics for Prometheus, forms' POST
# targets (each redirects back to a page below), and a JSON receipt.
NOT_PAGES = {
    route
    for route, _ in ROUTES.items()
    if route.startswith(("api/", "agent/"))
    or route
    in {"metrics", "healthz", "readyz", "logout/", "spending.csv", "organizations/switch", "team/leave", "orders/place"}
    or route in {"billing/topups/return", "billing/topups/checkout-return", "billing/verify-email"}
    or route == "provider/payouts/connect/return"
    or route.endswith((".pdf", ".csv", "/onboard", "/run"))
    or route.endswith(
        (
            "/revoke",
            "/delete",
            "/ping",
            "/active",
            "/secret",
            "/redeliver",
            "/terminate",
            "/sync",
            "/stop",
            "/start",
            "/restart",
            "/end",
            "/sla",
        )
    )
    or route.startswith("templates/gallery/")  # Use and Copy: POSTs from the Templates page
    or route.startswith(("team/members/", "provider/team/members/"))
    or route == "provider/orders/<uuid:order_id>/receipt"  # JSON, for programs
}


@dataclass(frozen=True)
class Page:
    name: str
    route: str
    who: str  # "nobody", "buyer" or "provider"
    path: str  # with the world's ids filled in by ``str.format``


PAGES = [
    Page("login", "login/", "nobody", "/login/"),
    Page("signup", "signup", "nobody", "/signup"),
    Page("provider-signup", "provider/signup", "nobody", "/provider/signup"),
    Page("offers-signed-out", "", "nobody", "/"),
    Page("prices-signed-out", "offers/<int:offer_id>/prices", "nobody", "/offers/{offer}/prices"),
    Page("compare-signed-out", "compare", "nobody", "/compare?ids={offer}&ids={offer2}"),
    Page("invitation", "invitations/<str:token>", "nobody", "/invitations/{buyer_invitation}"),
    Page("provider-invitation", "provider/invitations/<str:token>", "nobody", "/provider/invitations/{invitation}"),
    Page("offers", "", "buyer", "/"),
    Page("offers-search", "", "buyer", "/?q=H100"),
    Page("workload", "workload/", "buyer", "/workload/"),
    Page("workload-quotes", "workload/", "buyer", "workload-quotes"),  # the form sent: its ranked quotes
    Page("prices", "offers/<int:offer_id>/prices", "buyer", "/offers/{offer}/prices"),
    Page("compare", "compare", "buyer", "/compare?ids={offer}&ids={offer2}"),
    Page("spending", "spending", "buyer", "/spending"),
    Page("billing", "billing/", "buyer", "/billing/"),
    Page("invoices", "billing/invoices/", "buyer", "/billing/invoices/"),
    Page("invoice", "billing/invoices/<str:number>/", "buyer", "/billing/invoices/{invoice}/"),
    Page("email-verified", "account/verify-email/<str:token>", "nobody", "/account/verify-email/{email_token}"),
    Page("orders", "orders/", "buyer", "/orders/"),
    Page("order-running", "orders/<str:order_id>/", "buyer", "/orders/{running}/"),
    Page("order-ended", "orders/<str:order_id>/", "buyer", "/orders/{ended}/"),
    Page("receipt", "orders/<str:order_id>/receipt", "buyer", "/orders/{ended}/receipt"),
    Page("cluster", "clusters/<str:cluster_id>/", "buyer", "/clusters/{cluster}/"),
    Page("fleets", "fleets/", "buyer", "/fleets/"),
    Page("fleet", "fleets/<str:fleet_id>/", "buyer", "/fleets/{fleet}/"),
    Page("order-configure", "orders/new", "buyer", "/orders/new?offer={offer}"),
    Page("order-configure-quote", "orders/new", "buyer", "/orders/new?quote={quote}"),
    # Reached by sending the configure form: first without a run time, then with one.
    Page("order-configure-errors", "orders/new", "buyer", "configure-errors"),
    Page("order-confirm", "orders/new/confirm", "buyer", "confirm"),
    Page("keys", "keys/", "buyer", "/keys/"),
    Page("templates", "templates/", "buyer", "/templates/"),
    Page("tokens", "tokens/", "buyer", "/tokens/"),
    Page("webhooks", "webhooks/", "buyer", "/webhooks/"),
    Page("webhook", "webhooks/<int:webhook_id>/", "buyer", "/webhooks/{webhook}/"),
    Page("team", "team/", "buyer", "/team/"),
    Page("portal-home", "provider/", "provider", "/provider/"),
    Page("portal-details", "provider/details", "provider", "/provider/details"),
    Page("portal-terms", "provider/terms", "provider", "/provider/terms"),
    Page("portal-team", "provider/team", "provider", "/provider/team"),
    Page("portal-accounts", "provider/accounts", "provider", "/provider/accounts"),
    Page("portal-connect", "provider/accounts/connect/<str:kind>", "provider", "/provider/accounts/connect/aws"),
    Page(
        "portal-account-edit",
        "provider/accounts/<int:account_id>/edit",
        "provider",
        "/provider/accounts/{account}/edit",
    ),
    Page("portal-machines", "provider/machines", "provider", "/provider/machines"),
    Page("portal-machine-new", "provider/machines/new", "provider", "/provider/machines/new"),
    Page(
        "portal-machine-prices",
        "provider/machines/<int:machine_id>/prices",
        "provider",
        "/provider/machines/{machine}/prices",
    ),
    Page("portal-dashboard", "provider/dashboard", "provider", "/provider/dashboard"),
    Page("portal-earnings", "provider/earnings", "provider", "/provider/earnings"),
    Page("portal-payouts", "provider/payouts", "provider", "/provider/payouts"),
]


def test_every_page_is_visited():
    visited = {page.route for page in PAGES}
    assert set(ROUTES) - NOT_PAGES - visited == set(), "add the new page to PAGES (or the route to NOT_PAGES)"
    assert visited & NOT_PAGES == set()


@pytest.fixture
def world(aws_sandbox, _aws_quotes, gpu_models, acme, alice, django_capture_on_commit_callbacks):
    """Petra's verified provider organisation selling an AWS account (the sandbox) and an independent machine;
    Acme (alice) with an order running there, one ended, a two-node cluster, a webhook with a delivery, an API
    token, an SSH key, a launch template and quotes; an open invitation to each team."""
    staff = get_user_model().objects.create_superuser(username="sam", email="sam@broker.example", password="x")
    petra = provider_signup(username="petra", email="petra@petra.example", password="x",
                            organization_name="Petra GPU Cloud")  # fmt: skip
    provider = Organization.objects.get(name="Petra GPU Cloud")
    provider_details_update(organization=provider, details=BusinessDetails(
        legal_name="Petra GPU Cloud GmbH", country="DE", registered_address="Invalidenstraße 1\n10115 Berlin",
        tax_id="DE123456789", contact_email="ops@petra.example"))  # fmt: skip
    provider_terms_accept(organization=provider, user=petra, version=TERMS_VERSION)
    provider_state_change(profile_id=provider.provider_profile.pk, to="verified", reason="documents checked", by=staff)
    account = provider_account_connect(
        provider_name="Petra GPU Cloud", kind="aws", name="aws-main", credentials=AWS_TEST_CREDENTIALS,
        regions=TEST_AWS_REGIONS, endpoint_url=aws_sandbox.url,
    )  # fmt: skip
    offers_ingest(account=account, quotes=_aws_quotes, now=timezone.now())
    machine = machine_listing_create(organization=provider, name="ber-h100-1", listing=dict(LISTING)).machine
    Machine.objects.filter(pk=machine.pk).update(state=MachineState.VERIFIED)
    _, invitation = invitation_create(organization=provider, email="olga@petra.example", role=Role.OPERATOR, by=petra)

    api = APIClient()
    api.force_authenticate(alice)
    hook = api.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}, format="json").json()
    cheapest = Offer.objects.filter(account=account, pricing_model="on_demand").order_by("price_usd", "pk")
    orders = []
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            placed = api.post("/api/v1/orders", {"offer": cheapest[0].pk, "allow_failover": False}, format="json")
        assert placed.status_code == 201, placed.json()
        order = Order.objects.get(public_id=placed.json()["id"])
        with django_capture_on_commit_callbacks(execute=True):
            boot(order, aws_sandbox)
        orders.append(order)
    running, ended = orders
    order_terminate(order=ended)
    pair = Offer.objects.filter(account=account, instance_type="g5.12xlarge", pricing_model="on_demand",
                                region="us-east-1").order_by("price_usd", "zone")[0]  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        cluster = api.post("/api/v1/clusters", {"offer": pair.pk, "nodes": 2}, format="json")
    assert cluster.status_code == 201, cluster.json()
    fleet_body = {"name": "web", "demand": {"gpu_models": ["T4"]}, "max_price_per_gpu_hour": "5", "min_replicas": 1,
                  "max_replicas": 3, "rule": {"kind": "utilization", "target": 60},
                  "launch": {"allowed_cidrs": ["127.0.0.1/32"]}}  # fmt: skip
    fleet = api.post("/api/v1/fleets", fleet_body, format="json")
    assert fleet.status_code == 201, fleet.json()
    with django_capture_on_commit_callbacks(execute=True):
        fleet_evaluate(fleet_id=Fleet.objects.get().pk)
    api.post("/api/v1/launch-templates", {"name": "alice-dev", "launch": {"allowed_cidrs": ["198.51.100.0/24"]}},
             format="json")  # fmt: skip
    quote = api.post("/api/v1/quotes", {"profile": "inference"}, format="json").json()["quotes"][0]
    assert WebhookDelivery.objects.filter(endpoint_id=hook["id"]).exists()
    api_token_create(organization=acme, user=alice, name="alice-ci", scopes=["offers:read"])
    _, buyer_invitation = invitation_create(organization=acme, email="bob@acme.example", role=Role.MEMBER, by=alice)
    assert Order.objects.get(pk=running.pk).state == OrderState.RUNNING
    # Last month Acme bought credit and was charged for an order: its invoice is issued.
    last_month = timezone.now().replace(day=1) - dt.timedelta(days=2)
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=acme)
    book_post(
        kind="topup",
        key="every-page-topup",
        now=last_month,
        lines=[Line(book_account(kind=BookAccountKind.CASH, currency="USD"), 5000), Line(credit, -5000)],
    )
    book_post(kind="order.charge", key="every-page-charge", now=last_month, order=ended, memo="tax GB VAT 0.20",
              lines=[Line(credit, 1200), Line(book_account(kind=BookAccountKind.COMMISSION, currency="USD"), -120),
                     Line(book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency="USD"), -880),
                     Line(book_account(kind=BookAccountKind.TAX_PAYABLE, currency="USD"), -200)])  # fmt: skip
    invoice = invoice_issue(acme, last_month.strftime("%Y-%m"))
    return {
        "users": {"buyer": alice, "provider": petra},
        "ids": {
            "offer": cheapest[0].pk,
            "offer2": cheapest[1].pk,
            "running": running.public_id,
            "ended": ended.public_id,
            "cluster": Cluster.objects.get().public_id,
            "fleet": Fleet.objects.get().public_id,
            "quote": quote["id"],
            "webhook": hook["id"],
            "account": account.pk,
            "machine": machine.pk,
            "invitation": invitation,
            "buyer_invitation": buyer_invitation,
            "invoice": invoice.number,
            "email_token": email_verification_token(alice),
        },
    }


def _severe(page: Any) -> list[dict[str, Any]]:
    results = Axe().run(page)
    return [v for v in results.response["violations"] if v.get("impact") in SEVERE]


def _visit(page: Any, base: str, spec: Page, ids: dict[str, Any]) -> None:
    if spec.path == "workload-quotes":
        page.goto(f"{base}/workload/")
        page.click("#workload-form button[type=submit]")
        page.locator("table.quotes").wait_for()
    elif spec.path == "configure-errors":
        page.goto(f"{base}/orders/new?offer={ids['offer']}")
        page.click("#launch-form button[type=submit]")
        page.locator("#form-errors").wait_for()
    elif spec.path == "confirm":
        page.fill("#id_duration_hours", "2")
        page.click("#launch-form button[type=submit]")
        page.wait_for_url(re.compile(r".*/orders/new/confirm\?draft=.+"))
    else:
        response = page.goto(base + spec.path.format(**ids))
        assert response is not None and response.ok, f"{spec.name}: HTTP {response and response.status}"
    page.wait_for_load_state("load")


@pytest.mark.parametrize("width", list(WIDTHS))
def test_every_page_has_no_serious_accessibility_violation(browser, live_server, world, width):
    base = live_server.url
    w, h = WIDTHS[width]
    contexts, found = {}, []
    try:
        for who in ("nobody", "buyer", "provider"):
            contexts[who] = browser.new_context(viewport={"width": w, "height": h})
            page = contexts[who].new_page()
            page.set_default_timeout(15_000)
            if who != "nobody":
                sign_in(page, base, world["users"][who])
                page.wait_for_load_state("load")
        for spec in PAGES:
            page = contexts[spec.who].pages[0]
            _visit(page, base, spec, world["ids"])
            shoot(page, f"every-{width}-{spec.name}")
            for violation in _severe(page):
                targets = [" ".join(map(str, node["target"])) for node in violation["nodes"]]
                found.append(f"{spec.name} [{violation['impact']}] {violation['id']}: {violation['help']} -> "
                             f"{'; '.join(targets)}")  # fmt: skip
    finally:
        for context in contexts.values():
            context.close()
    assert found == [], f"{len(found)} serious or critical violations at {width} width:\n" + "\n".join(found)


def _tab_to(page: Any, selector: str, *, backwards: bool = False, limit: int = 150) -> None:
    """Press Tab (or Shift+Tab) until the focused element matches ``selector``; fail if it never does."""
    key = "Shift+Tab" if backwards else "Tab"
    for _ in range(limit):
        page.keyboard.press(key)
        if page.evaluate("s => document.activeElement && document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} is not reachable with {key}")


def _assert_focus_visible(page: Any) -> None:
    """The focused element draws an outline: a style of "none" or a width of 0 would hide where focus is."""
    style, width = page.evaluate(
        "() => { const s = getComputedStyle(document.activeElement); return [s.outlineStyle, s.outlineWidth]; }"
    )
    assert style != "none" and width != "0px", (style, width)


def test_a_buyer_searches_orders_and_terminates_with_the_keyboard_alone(page, live_server, world):
    base = live_server.url
    running = world["ids"]["running"]
    sign_in(page, base, world["users"]["buyer"])
    page.wait_for_url(f"{base}/")

    # Search: Tab to the search field, type a query, Enter.
    _tab_to(page, "input[name=q]")
    page.keyboard.type("gpu=A10G pricing=on_demand")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*\?.*q=gpu%3DA10G.*"))
    page.wait_for_load_state("load")
    # An offer's order form, opened from its Order link; the link shows where focus is.
    _tab_to(page, "a.button.primary[href*='/orders/new?offer=']")
    _assert_focus_visible(page)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/orders/new\?offer=\d+$"))
    page.wait_for_load_state("load")
    _tab_to(page, "#id_duration_hours")
    page.keyboard.type("2")
    _tab_to(page, "#launch-form button[type=submit]")
    _assert_focus_visible(page)
    _tab_to(page, "#id_duration_hours", backwards=True)  # and back again, to check the value kept
    assert page.input_value("#id_duration_hours") == "2"
    _tab_to(page, "#launch-form button[type=submit]")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/orders/new/confirm\?draft=.+"))
    page.wait_for_load_state("load")
    _tab_to(page, "#confirm-form button[type=submit]")
    shoot(page, "keyboard-1-confirm-focused")

    # Terminate the running order: the disclosure opens with Enter, then its confirm button is next in reach.
    page.goto(f"{base}/orders/{running}/")
    _tab_to(page, "#terminate-form summary")
    _assert_focus_visible(page)
    assert page.get_attribute("#terminate-form", "open") is None
    page.keyboard.press("Enter")
    assert page.get_attribute("#terminate-form", "open") is not None
    page.keyboard.press("Space")  # Space toggles it too: closed again, then opened for good
    assert page.get_attribute("#terminate-form", "open") is None
    page.keyboard.press("Space")
    _tab_to(page, "#terminate-confirm")
    shoot(page, "keyboard-2-terminate-focused")
    page.keyboard.press("Enter")
    page.locator("#order-state >> text=/terminat/").wait_for()
    assert Order.objects.get(public_id=running).state in {OrderState.TERMINATING, OrderState.TERMINATED}
