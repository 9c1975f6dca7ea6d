"""A seller's account may not point the broker into the broker's own network: the endpoint override, Azure's
authority and prices URLs and a GCP key's token_uri are checked when the account is saved and whenever an
adapter is built for it (providers/endpoints.py)."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from marketplace.catalog.services import offers_sync
from providers.endpoints import EndpointRefused, account_endpoints, endpoint_check
from providers.models import ProviderAccount, SyncStatus
from providers.types import Credentials
from tests.conftest import AWS_TEST_CREDENTIALS
from tests.factories import ProviderAccountFactory
from tests.marketplace.test_webhooks import Receiver
from tests.portal.conftest import client_for

PRODUCTION = override_settings(PROVIDER_ENDPOINTS="public")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8701",
        "http://localhost:8701",  # a name, resolved (by /etc/hosts) to loopback
        "https://10.1.2.3/",
        "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
        "http://[::1]:80/",
        "http://[::ffff:192.168.0.1]/",  # IPv4 inside IPv6
        "https://nowhere.invalid/",  # does not resolve
    ],
)
def test_production_refuses_the_brokers_own_network_and_names_that_do_not_resolve(url):
    with PRODUCTION, pytest.raises(EndpointRefused) as refused:
        endpoint_check("endpoint_url", url)
    assert refused.value.field == "endpoint_url"


def test_production_accepts_public_addresses_and_development_adds_loopback():
    with PRODUCTION:
        endpoint_check("endpoint_url", "https://93.184.216.34/")
    endpoint_check("endpoint_url", "http://127.0.0.1:8701")
    endpoint_check("endpoint_url", "https://nowhere.invalid/")  # leads nowhere, so harmless in development
    for url in ("http://10.0.0.7/", "http://169.254.169.254/", "ftp://127.0.0.1/", "http:///path"):
        with pytest.raises(EndpointRefused):
            endpoint_check("endpoint_url", url)


def test_every_url_an_account_gives_is_found():
    key = json.dumps({"type": "service_account", "token_uri": "http://10.0.0.9/token"})
    credentials = Credentials(kind="gcp", values={"service_account_json": key}, endpoint_url="http://10.0.0.8/")
    options = {"authority_url": "http://10.0.0.10/", "prices_url": "http://10.0.0.11/", "image": "x"}

    assert account_endpoints(credentials, options) == [
        ("endpoint_url", "http://10.0.0.8/"),
        ("authority_url", "http://10.0.0.10/"),
        ("prices_url", "http://10.0.0.11/"),
        ("service_account_json", "http://10.0.0.9/token"),
    ]
    assert account_endpoints(Credentials(kind="gcp", values={"service_account_json": "not json"}), {}) == []


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


@pytest.mark.django_db
def test_the_portal_refuses_an_endpoint_in_the_brokers_network_before_any_request(petra, receiver):
    form = {"name": "main", "regions": "us-east-1", "endpoint_url": receiver.url("/"), **AWS_TEST_CREDENTIALS}

    with PRODUCTION:
        response = client_for(petra).post("/provider/accounts/connect/aws", form)

    assert response.status_code == 200
    (error,) = response.context["form"].errors["endpoint_url"]
    assert "resolves to 127.0.0.1" in error and "only to public addresses" in error
    assert receiver.requests == []  # refused before the credentials went anywhere
    assert not ProviderAccount.objects.exists()


@pytest.mark.django_db
def test_the_portal_refuses_a_gcp_key_whose_token_uri_points_inside(petra, gcp_sandbox):
    key = json.dumps(gcp_sandbox.new_service_account("broker@p.iam.gserviceaccount.com", "p"))

    with PRODUCTION:
        response = client_for(petra).post(
            "/provider/accounts/connect/gcp", {"name": "g", "regions": "us-central1", "service_account_json": key}
        )

    assert "resolves to 127.0.0.1" in response.context["form"].errors["service_account_json"][0]
    assert not ProviderAccount.objects.exists()


@pytest.mark.django_db
def test_a_stored_account_pointing_inside_fails_its_sync_with_the_reason(aws_sandbox):
    account = ProviderAccountFactory(endpoint_url=aws_sandbox.url)
    account.set_credentials(AWS_TEST_CREDENTIALS)
    account.save()
    assert offers_sync(account_id=account.pk).ok  # allowed in development

    with PRODUCTION:
        outcome = offers_sync(account_id=account.pk)

    assert not outcome.ok and "endpoint_url" in outcome.error and "127.0.0.1" in outcome.error
    account.refresh_from_db()
    assert account.sync_status == SyncStatus.FAILED
