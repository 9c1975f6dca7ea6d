"""One kind of API token: the one the docs tell people to make is the one the CLI, the Python client and the REST
API take, and a refused token's 401 says what was wrong with it (issue 36: the documented
``manage.py drf_create_token`` token was refused by the CLI with "credentials were not provided")."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
from brokerclient import BrokerClient
from brokerclient.errors import AuthenticationFailed
from django.core.management import call_command
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create, api_token_revoke
from marketplace.models import ApiToken

DOCS = Path(__file__).resolve().parents[2] / "docs" / "API.md"


def _documented_token_command() -> list[str]:
    """The manage.py command docs/API.md's command table gives for "an API token for a user"."""
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| an API token for a user"))
    command = re.search(r"`manage\.py ([^`]+)`", row)
    assert command, row
    return [word for word in shlex.split(command.group(1)) if not word.startswith("[")][:3]


@pytest.mark.django_db(transaction=True)
def test_the_token_the_docs_say_to_make_is_taken_by_the_cli(live_server, acme, alice, aws_account):
    # Given the token the documentation's command makes for alice
    name, *args = _documented_token_command()
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO())
    raw = out.getvalue().strip()

    # When the CLI's client uses it
    with BrokerClient(live_server.url, raw, retries=0) as broker:
        offers = list(broker.offers(limit=1))

    # Then the broker takes it: the same kind the storefront's API tokens page lists
    assert len(offers) == 1
    assert ApiToken.objects.get().organization == acme and raw.startswith("brk_")


@pytest.mark.django_db(transaction=True)
def test_the_cli_hears_why_a_token_was_refused(live_server, acme, alice):
    revoked = api_token_create(organization=acme, user=alice, name="old", scopes=["offers:read"])
    api_token_revoke(token=revoked.token)
    for token, code in [
        ("abc123", "token_malformed"),
        ("brk_" + "x" * 43, "token_unknown"),
        (revoked.raw, "token_revoked"),
    ]:
        with BrokerClient(live_server.url, token, retries=0) as broker, pytest.raises(AuthenticationFailed) as refused:
            list(broker.offers(limit=1))
        assert (refused.value.status, refused.value.code) == (401, code), refused.value


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("header", "code", "says"),
    [
        (None, "token_missing", "no API token"),
        ("Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b", "token_malformed", "must be 'Bearer brk_"),
        ("Bearer 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b", "token_malformed", "must be 'Bearer brk_"),
        ("Basic YWxpY2U6c2VjcmV0", "token_malformed", "must be 'Bearer brk_"),
        ("Bearer brk_not-a-token-of-this-broker", "token_unknown", "no such API token"),
    ],
)
def test_a_refused_token_is_told_what_was_wrong(header, code, says, acme, alice):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    answer = client.get("/api/v1/offers")
    assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Bearer"
    assert answer.json()["error"]["code"] == code and says in answer.json()["error"]["message"]
    assert "api_token create" in answer.json()["error"]["message"] or code == "token_revoked"


@pytest.mark.django_db
def test_a_revoked_token_is_told_it_was_revoked(acme, alice):
    issued = api_token_create(organization=acme, user=alice, name="old", scopes=["offers:read"])
    api_token_revoke(token=issued.token)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
    error = client.get("/api/v1/offers").json()["error"]
    assert error["code"] == "token_revoked" and f"{issued.token.prefix}… was revoked on" in error["message"]


@pytest.mark.django_db
def test_the_command_refuses_what_it_cannot_make(acme, alice):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("api_token", "create", "nobody")
    with pytest.raises(CommandError, match="scopes: choose from"):
        call_command("api_token", "create", "alice", "--scope", "everything")
    assert not ApiToken.objects.exists()
    out = io.StringIO()
    call_command("api_token", "create", "alice", "--scope", "offers:read", stdout=out, stderr=io.StringIO())
    token = ApiToken.objects.get()
    assert token.scopes == ["offers:read"] and token.prefix == out.getvalue().strip()[:12]
    call_command("api_token", "revoke", token.prefix, stdout=io.StringIO())
    assert ApiToken.objects.get().revoked_at is not None
