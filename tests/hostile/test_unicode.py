"""Strings no person types: a NUL (PostgreSQL's text and jsonb refuse it), a lone surrogate (not encodable as
UTF-8, so the database driver raises), bytes that are not UTF-8, and bidirectional or invisible format characters
in a name another person reads. Each is refused with a 400 naming the field, never a 500, and nothing is written."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.models import LaunchTemplate, SshKey, WebhookEndpoint
from tests.sshkeys import ed25519_pair

pytestmark = pytest.mark.django_db

# JSON texts written out by hand: json.dumps would refuse some of these or escape them differently.
NUL = "a\\u0000b"
LONE_SURROGATE = "a\\ud800b"
RIGHT_TO_LEFT_OVERRIDE = "invoice\\u202egpj.exe"


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _post(api: APIClient, path: str, body: str):
    return api.generic("POST", path, body.encode(), content_type="application/json")


def _fields(response) -> str:
    error = response.json()["error"]
    return " ".join([error.get("message", ""), *error.get("fields", {}).keys()])


@pytest.mark.parametrize("text", [NUL, LONE_SURROGATE, RIGHT_TO_LEFT_OVERRIDE])
def test_an_ssh_key_name_with_characters_no_person_types_is_refused(api, text):
    public, _ = ed25519_pair("x")
    response = _post(api, "/api/v1/ssh-keys", f'{{"public_key": "{public}", "name": "{text}"}}')

    assert response.status_code == 400, response.content
    assert "name" in _fields(response)
    assert not SshKey.objects.filter(public_key__contains=public.split()[1]).exists()


@pytest.mark.parametrize("text", [NUL, LONE_SURROGATE])
def test_a_launch_template_with_a_bad_string_anywhere_is_refused(api, text):
    body = (
        f'{{"name": "t", "launch": {{"workload": {{"kind": "container", "image": "nginx:1", '
        f'"env": [{{"name": "A", "value": "{text}"}}]}}}}}}'
    )
    response = _post(api, "/api/v1/launch-templates", body)

    assert response.status_code == 400, response.content
    assert not LaunchTemplate.objects.exists()


@pytest.mark.parametrize("text", [NUL, LONE_SURROGATE])
def test_a_webhook_url_with_a_bad_string_is_refused(api, text):
    response = _post(api, "/api/v1/webhooks", f'{{"url": "https://hooks.example.com/{text}"}}')

    assert response.status_code == 400, response.content
    assert not WebhookEndpoint.objects.exists()


def test_a_body_that_is_not_utf8_is_refused_naming_the_encoding(api):
    response = api.generic(
        "POST", "/api/v1/quotes", b'{"profile": "inf\xff\xfeerence"}', content_type="application/json"
    )

    assert response.status_code == 400, response.content
    assert "utf-8" in response.json()["error"]["message"].lower()


@pytest.mark.parametrize("query", ["gpu:%00", "gpu:%ED%A0%80", "gpu:%FF", "name:%22a%00b%22"])
def test_a_search_with_bad_bytes_is_a_clear_400(api, query):
    response = api.get(f"/api/v1/offers?q={query}")

    assert response.status_code == 400, response.content


@pytest.mark.parametrize("query", ["gpu:%00", "gpu:%ED%A0%80", "gpu:%FF"])
def test_the_storefront_search_with_bad_bytes_shows_an_error_not_a_500(client, alice, query):
    client.force_login(alice)
    response = client.get(f"/?q={query}")

    assert response.status_code in (200, 400)
