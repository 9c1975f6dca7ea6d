"""Behind the TLS proxy, a launch's default access rule is the buyer's address, not the proxy's: the API and
the storefront read where a request came from through ``marketplace.clients.client_address`` (the
``X-Forwarded-For`` entry of the outermost trusted proxy, ``BROKER_TRUSTED_PROXY_HOPS``), never from the
connection alone, and never from an entry the client wrote itself."""

from __future__ import annotations

import re

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from marketplace.models import LaunchConfiguration, Order, SshKey

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.2"  # the TLS proxy in front of the broker, as the connection shows it
BUYER = "198.51.100.23"


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient(REMOTE_ADDR=PROXY)
    client.force_authenticate(alice)
    return client


@pytest.fixture
def offer(aws_account):
    return aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]


@pytest.mark.parametrize(
    "forwarded",
    [
        BUYER,  # what the proxy appends
        f"192.0.2.1, {BUYER}",  # the client's own X-Forwarded-For, with the proxy's entry after it
    ],
)
def test_an_api_order_through_the_proxy_is_open_to_the_buyers_address(
    api, offer, forwarded, django_capture_on_commit_callbacks
):
    with override_settings(TRUSTED_PROXY_HOPS=1), django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/orders", {"offer": offer.pk}, format="json", HTTP_X_FORWARDED_FOR=forwarded)

    assert response.status_code == 201, response.json()
    assert response.json()["launch"]["allowed_cidrs"] == [f"{BUYER}/32"]
    assert Order.objects.get().launch_config.spec["allowed_cidrs"] == [f"{BUYER}/32"]


def test_without_trusted_proxies_a_forwarded_header_is_not_believed(api, offer, django_capture_on_commit_callbacks):
    with override_settings(TRUSTED_PROXY_HOPS=0), django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/api/v1/orders", {"offer": offer.pk}, format="json", REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR=BUYER
        )

    assert response.status_code == 201, response.json()
    assert response.json()["launch"]["allowed_cidrs"] == ["203.0.113.7/32"]


def test_an_api_quote_through_the_proxy_is_open_to_the_buyers_address(api, aws_account):
    with override_settings(TRUSTED_PROXY_HOPS=1):
        response = api.post(
            "/api/v1/quotes",
            {"profile": "inference", "limit": 1, "launch": {"disk_gb": 200}},
            format="json",
            HTTP_X_FORWARDED_FOR=BUYER,
        )

    assert response.status_code == 201, response.json()
    assert response.json()["quotes"][0]["launch"]["allowed_cidrs"] == [f"{BUYER}/32"]
    assert [c.spec["allowed_cidrs"] for c in LaunchConfiguration.objects.all()] == [[f"{BUYER}/32"]]


def test_a_storefront_order_through_the_proxy_is_open_to_the_buyers_address(
    acme, alice, offer, django_capture_on_commit_callbacks
):
    browser = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=BUYER)
    browser.force_login(alice)
    key = SshKey.objects.get(organization=acme)

    with override_settings(TRUSTED_PROXY_HOPS=1):
        page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
        nonce = re.search(r'name="nonce" value="([^"]+)"', page).group(1)
        configured = browser.post(
            "/orders/new",
            {"offer": offer.pk, "nonce": nonce, "duration_hours": "1", "ssh_keys": [str(key.public_id)],
             "workload_kind": "none", "access": "mine", "env_rows": "0"},
        )  # fmt: skip
        assert configured.status_code == 302, configured.content.decode()
        confirm = browser.get(configured["Location"]).content.decode()
        with django_capture_on_commit_callbacks(execute=True):
            placed = browser.post("/orders/place", {"nonce": re.search(r'name="nonce" value="([^"]+)"', confirm)[1]})

    assert f'id="caller-cidr">{BUYER}/32<' in page  # the default shown is the buyer's, not the proxy's
    assert PROXY not in confirm
    order = Order.objects.get()
    assert placed["Location"] == f"/orders/{order.public_id}/"
    assert order.launch_config.spec["allowed_cidrs"] == [f"{BUYER}/32"]
