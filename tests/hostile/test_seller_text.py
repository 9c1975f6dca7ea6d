"""Names that sellers and host agents write and other people read (issue 17): a machine's name and what its
agent reports, a provider's organisation and business details, a buyer organisation's name, an API token's
name, a webhook's description. Each refuses a NUL, a lone surrogate, and control or invisible formatting
characters (U+202E turns "invoice\u202egpj.exe" into "invoiceexe.jpg" on screen), naming the field, and
stores nothing; names in any script are welcome."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.models import ApiToken, Organization, ProviderProfile, TokenScope, WebhookEndpoint
from marketplace.portal.services import (
    AccountInput,
    BusinessDetails,
    PortalError,
    buyer_signup,
    provider_account_save,
    provider_details_update,
    provider_signup,
)
from providers.community import protocol
from providers.community.services import MachineInvalid, machine_list, machine_register
from providers.models import Machine, Provider
from tests.hosts import LISTING
from tests.marketplace.test_webhooks import Receiver
from tests.portal.conftest import PASSWORD, client_for

pytestmark = pytest.mark.django_db

# What no person types into a name. A lone surrogate cannot come through a form (Django decodes bytes that
# are not UTF-8 to U+FFFD), only through JSON, so the form tables leave it out.
TYPED = {
    "NUL": "Acme\x00Cloud",
    "right-to-left override": "invoice\u202egpj.exe",
    "zero-width space": "Acme\u200bCloud",
    "bell": "Acme\x07Cloud",
}
BAD = {**TYPED, "lone surrogate": "Acme\ud800Cloud"}
GOOD = ["Rechenzentrum Zürich", "北京机房"]
AGENT_URL = "http://127.0.0.1:7000"


def _ids(table: dict[str, str]) -> list:
    return [pytest.param(text, id=name) for name, text in table.items()]


# --- What a host agent reports --------------------------------------------------------------------------------


@pytest.fixture
def listed(fleet):
    return machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))


def _report(text: str, field: str) -> dict:
    """A registration with ``text`` in ``field`` and plausible values elsewhere."""
    report = {
        "agent_url": AGENT_URL,
        "hardware": {"hostname": "gpu-1", "gpus": [{"model": "H100-SXM5", "memory_gb": 80}]},
        "self_test": {"ok": False, "error": "nvidia-smi failed"},
    }
    if field == "agent_url":
        report["agent_url"] = f"{AGENT_URL}/{text}"
    elif field == "hardware.hostname":
        report["hardware"]["hostname"] = text
    elif field == "hardware.gpus[0].model":
        report["hardware"]["gpus"][0]["model"] = text
    elif field == "self_test.error":
        report["self_test"]["error"] = text
    elif field == "hardware (a key)":
        report["hardware"][text] = "x"
    return report


def _register(client, listed, report: dict):
    # json.dumps writes NUL and lone surrogates as \u escapes, as an agent's JSON would carry them.
    body = json.dumps(report).encode()
    headers = protocol.sign(listed.machine.key_id, listed.secret, "POST", "/agent/v1/register", body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post("/agent/v1/register", data=body, content_type="application/json", **extra)


@pytest.mark.parametrize(
    "field", ["agent_url", "hardware.hostname", "hardware.gpus[0].model", "self_test.error", "hardware (a key)"]
)
@pytest.mark.parametrize("text", _ids(BAD))
def test_an_agent_registering_text_no_person_types_is_refused_naming_the_field(client, listed, field, text):
    answer = _register(client, listed, _report(text, field))

    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid"
    assert answer.json()["message"].startswith(f"{field}: ")
    machine = Machine.objects.get(pk=listed.machine.pk)
    assert (machine.agent_url, machine.hardware, machine.self_test, machine.registered_at) == ("", {}, {}, None)


@pytest.mark.parametrize("text", GOOD)
def test_an_agent_reporting_a_name_in_any_script_is_registered(client, listed, text):
    answer = _register(client, listed, _report(text, "hardware.hostname"))

    assert answer.status_code == 200, answer.content
    assert Machine.objects.get(pk=listed.machine.pk).hardware["hostname"] == text


@pytest.mark.parametrize("text", _ids(BAD))
def test_a_machine_registered_in_process_with_unreadable_text_is_refused(listed, text):
    with pytest.raises(MachineInvalid, match=r"^self_test\.gpus\[0\]\.model: "):
        machine_register(machine=listed.machine, agent_url=AGENT_URL, hardware={},
                         self_test={"ok": True, "gpus": [{"model": text, "memory_gb": 80}]})  # fmt: skip

    assert Machine.objects.get(pk=listed.machine.pk).registered_at is None


@pytest.mark.parametrize("text", _ids(BAD))
def test_a_machine_name_no_person_types_is_refused(fleet, text):
    with pytest.raises(MachineInvalid, match=r"^name: "):
        machine_list(account=fleet, name=text, listing=dict(LISTING))

    assert not Machine.objects.exists()


# --- The provider portal --------------------------------------------------------------------------------------


@pytest.fixture
def petra(db):
    return provider_signup(username="petra", email="petra@petra.example", password=PASSWORD,
                           organization_name="Petra GPU Cloud")  # fmt: skip


@pytest.fixture
def petra_org(petra) -> Organization:
    return Organization.objects.get(name="Petra GPU Cloud")


SIGNUP = {"username": "nadia", "email": "nadia@nimbus.example", "password1": PASSWORD, "password2": PASSWORD}


@pytest.mark.parametrize("path", ["/provider/signup", "/signup"])
@pytest.mark.parametrize("text", _ids(TYPED))
def test_an_organisation_name_no_person_types_is_refused_on_the_signup_forms(path, text):
    response = Client().post(path, {**SIGNUP, "organization_name": text})

    assert response.status_code == 200
    assert response.context["form"].errors["organization_name"]
    assert not get_user_model().objects.exists()
    assert not Organization.objects.exists() and not Provider.objects.exists()


@pytest.mark.parametrize("path", ["/provider/signup", "/signup"])
@pytest.mark.parametrize("text", GOOD)
def test_an_organisation_name_in_any_script_signs_up(path, text):
    response = Client().post(path, {**SIGNUP, "organization_name": text})

    assert response.status_code == 302, response.context["form"].errors
    assert Organization.objects.get().name == text


@pytest.mark.parametrize("signup", [provider_signup, buyer_signup])
@pytest.mark.parametrize("text", _ids(BAD))
def test_an_organisation_name_no_person_types_is_refused_by_the_service(signup, text):
    with pytest.raises(PortalError) as refused:
        signup(username="nadia", email="nadia@nimbus.example", password=PASSWORD, organization_name=text)

    assert refused.value.field == "organization_name"
    assert not get_user_model().objects.exists() and not Organization.objects.exists()


DETAILS = {
    "legal_name": "Petra GPU Cloud GmbH",
    "country": "DE",
    "registered_address": "Invalidenstraße 1\r\n10115 Berlin",
    "tax_id": "DE123456789",
    "contact_email": "ops@petra.example",
}


@pytest.mark.parametrize("field", ["legal_name", "registered_address"])
@pytest.mark.parametrize("text", _ids(TYPED))
def test_business_details_no_person_types_are_refused(petra, petra_org, field, text):
    response = client_for(petra).post("/provider/details", {**DETAILS, field: text})

    assert response.status_code == 200
    assert response.context["form"].errors[field]
    assert ProviderProfile.objects.get(organization=petra_org).details_updated_at is None


@pytest.mark.parametrize("text", GOOD)
def test_business_details_in_any_script_are_saved(petra, petra_org, text):
    response = client_for(petra).post("/provider/details", {**DETAILS, "legal_name": text})

    assert response.status_code == 302
    assert ProviderProfile.objects.get(organization=petra_org).legal_name == text


@pytest.mark.parametrize("field", ["legal_name", "registered_address"])
@pytest.mark.parametrize("text", _ids(BAD))
def test_business_details_no_person_types_are_refused_by_the_service(petra_org, field, text):
    details = {**DETAILS, "registered_address": "Invalidenstraße 1\n10115 Berlin", field: f"Berlin\n{text}"}

    with pytest.raises(PortalError) as refused:
        provider_details_update(organization=petra_org, details=BusinessDetails(**details))

    assert refused.value.field == field
    assert ProviderProfile.objects.get(organization=petra_org).details_updated_at is None


@pytest.mark.parametrize("text", _ids(BAD))
def test_a_cloud_account_name_no_person_types_is_refused_before_any_check(petra_org, text):
    with pytest.raises(PortalError) as refused:
        provider_account_save(organization=petra_org, data=AccountInput(kind="aws", name=text, regions=["us-east-1"]))

    assert refused.value.field == "name"


# --- The storefront: API tokens and webhooks ------------------------------------------------------------------


@pytest.mark.parametrize("text", _ids(TYPED))
def test_an_api_token_name_no_person_types_is_refused_on_the_page(alice, text):
    response = client_for(alice).post("/tokens/", {"name": text, "scopes": ["offers:read"], "nonce": "n1"})

    assert response.status_code == 200
    assert response.context["form"].errors["name"]
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("text", _ids(BAD))
def test_an_api_token_name_no_person_types_is_refused_by_the_service(acme, alice, text):
    with pytest.raises(ValueError, match=r"^name: "):
        api_token_create(organization=acme, user=alice, name=text, scopes=[TokenScope.OFFERS_READ.value])

    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("text", GOOD)
def test_an_api_token_name_in_any_script_is_kept(alice, text):
    response = client_for(alice).post("/tokens/", {"name": text, "scopes": ["offers:read"], "nonce": "n2"})

    assert response.status_code == 200
    assert ApiToken.objects.get().name == text


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.mark.parametrize("text", _ids(BAD))
def test_a_webhook_description_no_person_types_is_refused(api, receiver, text):
    body = json.dumps({"url": receiver.url(), "description": text}).encode()
    response = api.generic("POST", "/api/v1/webhooks", body, content_type="application/json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "description" in error.get("fields", {}) or error["message"].startswith("description")
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("text", GOOD)
def test_a_webhook_description_in_any_script_is_kept(api, receiver, text):
    response = api.post("/api/v1/webhooks", {"url": receiver.url(), "description": text}, format="json")

    assert response.status_code == 201, response.content
    assert WebhookEndpoint.objects.get().description == text
