"""SSH keys and launch templates over the API, and launch configurations on orders and quotes: validation with
field errors, scopes and roles, idempotent creates, and a private key pasted by mistake kept nowhere."""

from __future__ import annotations

import json
import logging

import pytest
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.models import IdempotentResponse, LaunchConfiguration, LaunchTemplate, Membership, Role, SshKey
from tests.factories import MembershipFactory
from tests.sshkeys import ecdsa_public, ed25519_pair, rsa_public

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _bearer(acme, user, scopes) -> APIClient:
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_token_create(organization=acme, user=user, name='t', scopes=scopes).raw}"
    )
    return client


def test_a_key_is_added_listed_by_fingerprint_and_removed(api, acme, alice):
    public, _ = ed25519_pair("alice@desk")

    added = api.post("/api/v1/ssh-keys", {"public_key": public}, format="json")

    assert added.status_code == 201, added.json()
    body = added.json()
    key = SshKey.objects.get(public_id=body["id"])
    assert (body["name"], body["key_type"], body["bits"], body["added_by"]) == (
        "alice@desk",
        "ssh-ed25519",
        256,
        "alice",
    )
    assert body["fingerprint"] == key.fingerprint and body["public_key"] == " ".join(public.split()[:2])
    listed = api.get("/api/v1/ssh-keys").json()["results"]
    assert {k["fingerprint"] for k in listed} == set(
        SshKey.objects.filter(organization=acme).values_list("fingerprint", flat=True)
    )
    assert api.delete(f"/api/v1/ssh-keys/{body['id']}").status_code == 204
    assert not SshKey.objects.filter(public_id=body["id"]).exists()
    assert api.get(f"/api/v1/ssh-keys/{body['id']}").status_code == 404


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (lambda: rsa_public(2048), "at least 3072 bits, this one has 2048"),
        (lambda: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA== truncated", "damaged or truncated"),
        (lambda: "hello", "a public key reads"),
    ],
)
def test_a_key_that_does_not_parse_or_is_too_weak_is_a_400_naming_the_problem(api, text, message):
    response = api.post("/api/v1/ssh-keys", {"public_key": text()}, format="json")

    assert response.status_code == 400
    assert message in response.json()["error"]["fields"]["public_key"][0]


def test_a_private_key_is_refused_and_kept_nowhere(api, acme, caplog):
    caplog.set_level(logging.DEBUG)
    _, private = ed25519_pair("oops")
    secret_line = next(line for line in private.splitlines() if "PRIVATE" not in line)

    response = api.post("/api/v1/ssh-keys", {"public_key": private, "name": "oops"}, format="json",
                        HTTP_IDEMPOTENCY_KEY="paste-1")  # fmt: skip

    assert response.status_code == 400
    assert "private key: it was not stored" in response.json()["error"]["fields"]["public_key"][0]
    assert secret_line not in response.content.decode()
    assert not SshKey.objects.filter(name="oops").exists()
    assert not IdempotentResponse.objects.exists()
    assert secret_line not in caplog.text


def test_the_same_key_twice_is_a_409_and_a_retry_with_its_key_replays(api, acme):
    public = ecdsa_public()
    first = api.post("/api/v1/ssh-keys", {"public_key": public, "name": "ecdsa"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="k1")  # fmt: skip
    again = api.post("/api/v1/ssh-keys", {"public_key": public, "name": "ecdsa"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="k1")  # fmt: skip
    duplicate = api.post("/api/v1/ssh-keys", {"public_key": public, "name": "other"}, format="json")

    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (201, 201, "true")
    assert again.json()["id"] == first.json()["id"]
    assert duplicate.status_code == 409 and "already added, as 'ecdsa'" in duplicate.json()["error"]["message"]
    assert SshKey.objects.filter(organization=acme, name__in=["ecdsa", "other"]).count() == 1


def test_a_viewer_reads_keys_but_may_not_add_or_remove_them(acme, alice):
    viewer = MembershipFactory(user__username="vera", organization=acme, role=Role.VIEWER).user
    client = APIClient()
    client.force_authenticate(viewer)
    key = SshKey.objects.get(organization=acme)

    assert client.get("/api/v1/ssh-keys").status_code == 200
    assert client.post("/api/v1/ssh-keys", {"public_key": ecdsa_public()}, format="json").status_code == 403
    assert client.delete(f"/api/v1/ssh-keys/{key.public_id}").status_code == 403
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_a_token_needs_keys_manage_to_add_a_key(acme, alice):
    reader = _bearer(acme, alice, ["offers:read"])
    keeper = _bearer(acme, alice, ["keys:manage"])

    refused = reader.post("/api/v1/ssh-keys", {"public_key": ecdsa_public()}, format="json")
    added = keeper.post("/api/v1/ssh-keys", {"public_key": ecdsa_public()}, format="json")

    assert refused.status_code == 403 and "keys:manage" in refused.json()["error"]["message"]
    assert added.status_code == 201


def test_a_template_is_saved_used_by_name_and_updated_without_changing_orders_placed(
    api, acme, aws_account, django_capture_on_commit_callbacks
):
    launch = {"workload": {"kind": "script", "script": "#!/bin/bash\nnvidia-smi\n"}, "ports": [8888],
              "allowed_cidrs": ["203.0.113.0/24"], "disk_gb": 200}  # fmt: skip
    created = api.post("/api/v1/launch-templates", {"name": "jupyter", "launch": launch}, format="json")
    assert created.status_code == 201, created.json()
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]

    with django_capture_on_commit_callbacks(execute=True):
        ordered = api.post("/api/v1/orders", {"offer": offer.pk, "launch_template": "jupyter"}, format="json")
    changed = api.put(f"/api/v1/launch-templates/{created.json()['id']}",
                      {"name": "jupyter", "launch": {**launch, "disk_gb": 500}}, format="json")  # fmt: skip

    assert ordered.status_code == 201, ordered.json()
    assert ordered.json()["launch"]["ports"] == [22, 8888] and ordered.json()["launch"]["disk_gb"] == 200
    assert changed.status_code == 200 and changed.json()["launch"]["disk_gb"] == 500
    order_config = LaunchConfiguration.objects.get(orders__public_id=ordered.json()["id"])
    assert order_config.spec["disk_gb"] == 200  # the order keeps what it was placed with
    assert api.delete(f"/api/v1/launch-templates/{created.json()['id']}").status_code == 204
    assert not LaunchTemplate.objects.exists() and LaunchConfiguration.objects.filter(pk=order_config.pk).exists()


@pytest.mark.parametrize(
    ("launch", "field"),
    [
        ({"workload": {"kind": "vm"}}, "launch.workload.kind"),
        ({"workload": {"kind": "container"}}, "launch.workload.image"),
        ({"workload": {"kind": "container", "image": "x", "ports": [22]}}, "launch.workload.ports[0]"),
        ({"workload": {"kind": "script", "script": "  "}}, "launch.workload.script"),
        ({"workload": {"kind": "script", "script": "x", "env": [{"name": "1BAD", "value": "x"}]}},
         "launch.workload.env[0].name"),
        ({"workload": {"kind": "script", "script": "x", "env": [{"name": "A", "value": "x\ny"}]}},
         "launch.workload.env[0].value"),
        ({"disk_gb": 5}, "launch.disk_gb"),
        ({"disk_gb": True}, "launch.disk_gb"),
        ({"disk_gb": 10**400}, "launch.disk_gb"),
        ({"ports": [70000]}, "launch.ports[0]"),
        ({"allowed_cidrs": ["everyone"]}, "launch.allowed_cidrs[0]"),
        ({"allowed_cidrs": []}, "launch.allowed_cidrs"),
        ({"ssh_keys": ["nope"]}, "launch.ssh_keys[0]"),
        ({"ssh_keys": []}, "launch.ssh_keys"),
        ({"spend_cap_usd": "1e1000000"}, "launch.spend_cap_usd"),
        ({"spend_cap_usd": "-3"}, "launch.spend_cap_usd"),
        ({"colour": "blue"}, "launch.colour"),
        ([1, 2, 3], "launch"),
    ],
)  # fmt: skip
def test_a_bad_launch_configuration_is_a_400_naming_the_field_and_writes_nothing(
    api, aws_account, launch, field, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/orders", {"offer": offer.pk, "launch": launch}, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "invalid_launch"
    assert field in response.json()["error"]["fields"], response.json()
    assert not LaunchConfiguration.objects.exists()
    assert aws_account.offers.get(pk=offer.pk).orders.count() == 0


def test_ssh_is_open_to_the_callers_address_unless_the_buyer_says_otherwise(
    api, aws_account, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()
    with django_capture_on_commit_callbacks(execute=True):
        default = api.post("/api/v1/orders", {"offer": offer.pk}, format="json", REMOTE_ADDR="198.51.100.23")
        anywhere = api.post("/api/v1/orders", {"offer": offer.pk, "launch": {"allowed_cidrs": ["0.0.0.0/0"]}},
                            format="json")  # fmt: skip

    assert default.json()["launch"]["allowed_cidrs"] == ["198.51.100.23/32"]
    assert default.json()["launch"]["ports"] == [22]
    assert anywhere.json()["launch"]["allowed_cidrs"] == ["0.0.0.0/0"]


def test_a_quote_carries_its_launch_configuration_to_the_order(api, aws_account, django_capture_on_commit_callbacks):
    launch = {"workload": {"kind": "container", "image": "nvcr.io/nvidia/pytorch:24.10-py3"}, "spend_cap_usd": "25"}
    quoted = api.post("/api/v1/quotes", {"profile": "inference", "limit": 2, "launch": launch}, format="json")
    assert quoted.status_code == 201, quoted.json()
    quote = quoted.json()["quotes"][0]
    assert quote["launch"]["workload"]["image"] == "nvcr.io/nvidia/pytorch:24.10-py3"

    with django_capture_on_commit_callbacks(execute=True):
        ordered = api.post("/api/v1/orders", {"quote": quote["id"]}, format="json")

    assert ordered.json()["launch"]["id"] == quote["launch"]["id"]
    assert ordered.json()["spend_cap_usd"] == "25.00"
    bad = api.post("/api/v1/quotes", {"profile": "inference", "launch": {"disk_gb": 1}}, format="json")
    assert bad.status_code == 400 and "launch.disk_gb" in bad.json()["error"]["fields"]


def test_each_procurement_demand_may_name_its_own_launch(api, aws_account):
    demands = [{"profile": "inference", "launch": {"ports": [8000]}}, {"profile": "inference"},
               {"profile": "inference", "launch": {"disk_gb": 1}}]  # fmt: skip
    refused = api.post("/api/v1/procurements", {"demands": demands}, format="json")
    assert refused.status_code == 400 and "demands[2].launch.disk_gb" in refused.json()["error"]["fields"]

    accepted = api.post("/api/v1/procurements", {"demands": demands[:2]}, format="json").json()

    first, second = (a["quote"] for a in accepted["assignments"])
    assert first["launch"]["ports"] == [22, 8000] and second["launch"] is None


def test_the_answer_shows_a_secrets_name_never_its_value(api, aws_account, django_capture_on_commit_callbacks):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()
    launch = {"workload": {"kind": "script", "script": "echo", "env": [{"name": "TOKEN", "value": "s3cr3t-v4lue",
                                                                          "secret": True}]}}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        placed = api.post("/api/v1/orders", {"offer": offer.pk, "launch": launch}, format="json")

    assert placed.json()["launch"]["workload"]["env"] == [{"name": "TOKEN", "secret": True}]
    assert "s3cr3t-v4lue" not in json.dumps(placed.json())
    config = LaunchConfiguration.objects.get()
    assert "s3cr3t-v4lue" not in config.secrets_encrypted and len(config.sha256) == 64
    assert Membership.objects.exists()
