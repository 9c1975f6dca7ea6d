"""The smaller holes of issue 17, item 9: absurd GPU telemetry, quotes and procurements on a read-only token and
without bound, a password equal to the username, IPv4 hidden in IPv6 forms, and instances left active after
their order ended."""

from __future__ import annotations

import importlib
import json
import threading

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client, override_settings
from rest_framework.test import APIClient

from ledger.services import ledger_verify
from marketplace.api.tokens import api_token_create
from marketplace.models import AttemptOutcome, Instance, Lease, LeaseHeartbeat, LeaseState, Order, OrderState, Quote
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.portal.forms import InvitationSignupForm
from marketplace.portal.services import invitation_create
from marketplace.webhooks.destinations import WebhookUrlRefused, destination_check
from providers.addresses import is_public
from providers.community import protocol
from providers.community.services import machine_list
from providers.endpoints import EndpointRefused, endpoint_check
from providers.models import MachineHeartbeat
from providers.services import adapter_for_account
from tests.hosts import LISTING
from tests.leases import LAUNCH, boot, claimed_lease

pytestmark = pytest.mark.django_db

SAMPLE = {"index": 0, "utilization_pct": 50, "temperature_c": 60, "power_w": 300, "memory_used_gb": 10}


def _signed_post(client, path: str, body: dict, key_id: str, secret: str):
    raw = json.dumps(body).encode()
    headers = protocol.sign(key_id, secret, "POST", path, raw)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(path, data=raw, content_type="application/json", **extra)


# --- Telemetry ------------------------------------------------------------------------------------------------

ABSURD = [
    ({"utilization_pct": -500}, "gpus.utilization_pct"),
    ({"utilization_pct": 100.5}, "gpus.utilization_pct"),
    ({"temperature_c": 9999}, "gpus.temperature_c"),
    ({"temperature_c": -273}, "gpus.temperature_c"),
    ({"utilization_pct": "lots"}, "gpus.utilization_pct"),
    ({"temperature_c": "60"}, "gpus.temperature_c"),
    ({"power_w": 1e308}, "gpus.power_w"),
    ({"power_w": True}, "gpus.power_w"),
    ({"memory_used_gb": 81 * 1.2}, "gpus.memory_used_gb"),  # more than the listing's 80 GB GPU
    ({"index": -1}, "gpus.index"),
    ({"index": "0"}, "gpus.index"),
]


@pytest.fixture
def host(fleet):
    return machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))


@pytest.mark.parametrize(("change", "field"), ABSURD)
def test_a_host_heartbeat_with_telemetry_no_gpu_can_show_is_refused_naming_the_field(client, host, change, field):
    answer = _signed_post(
        client,
        "/agent/v1/heartbeat",
        {"gpus": [{**SAMPLE, **change}], "instances": 0},
        host.machine.key_id,
        host.secret,
    )

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid" and answer.json()["message"].startswith(field)
    assert not MachineHeartbeat.objects.exists()


def test_a_host_heartbeat_within_bounds_is_kept(client, host):
    edge = {"index": 7, "utilization_pct": 100, "temperature_c": 0, "power_w": 2000, "memory_used_gb": 80}
    answer = _signed_post(client, "/agent/v1/heartbeat", {"gpus": [edge, {"utilization_pct": 3}]}, host.machine.key_id,
                          host.secret)  # fmt: skip

    assert answer.status_code == 200
    assert MachineHeartbeat.objects.get().gpus == [edge, {"utilization_pct": 3}]


@pytest.fixture
def claimed(acme, alice, aws_account, aws_sandbox, client, django_capture_on_commit_callbacks):
    """A T4 order (16 GB) whose agent has claimed its lease, reported ready by the test: (lease, key, secret)."""
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    lease, key_id, secret = claimed_lease(order, client)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.READY)
    return lease, key_id, secret


def test_a_lease_heartbeat_reporting_more_memory_than_the_gpu_has_is_refused(client, claimed):
    lease, key_id, secret = claimed
    gpu_memory = lease.order.offer.gpu_memory_gb
    too_much = {**SAMPLE, "memory_used_gb": gpu_memory * 2}
    within = {**SAMPLE, "memory_used_gb": gpu_memory}

    refused = _signed_post(client, "/agent/v1/lease/heartbeat", {"gpus": [too_much]}, key_id, secret)
    assert refused.status_code == 400 and refused.json()["message"].startswith("gpus.memory_used_gb")
    assert not LeaseHeartbeat.objects.exists()
    kept = _signed_post(client, "/agent/v1/lease/heartbeat", {"gpus": [within]}, key_id, secret)
    assert kept.status_code == 200 and LeaseHeartbeat.objects.count() == 1


# --- Quotes and procurements ------------------------------------------------------------------------------------


def _bearer(acme, alice, scopes: list[str]) -> APIClient:
    client = APIClient()
    raw = api_token_create(organization=acme, user=alice, name="-".join(scopes), scopes=scopes).raw
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/quotes", {"profile": "inference"}),
        ("/api/v1/procurements", {"demands": [{"profile": "inference"}]}),
    ],
)
def test_a_read_only_token_cannot_quote_or_procure(acme, alice, aws_account, path, body):
    reader = _bearer(acme, alice, ["offers:read"])
    buyer = _bearer(acme, alice, ["orders:place"])

    refused = reader.post(path, body, format="json")

    assert refused.status_code == 403 and "orders:place" in refused.json()["error"]["message"]
    assert Quote.objects.count() == 0
    assert buyer.post(path, body, format="json").status_code == 201


def test_a_procurement_of_more_demands_than_runs_quickly_is_refused(acme, alice, aws_account):
    buyer = _bearer(acme, alice, ["orders:place"])

    refused = buyer.post("/api/v1/procurements", {"demands": [{"profile": "inference"}] * 101}, format="json")
    accepted = buyer.post("/api/v1/procurements", {"demands": [{"profile": "inference"}] * 100}, format="json")

    assert refused.status_code == 400 and "demands" in refused.json()["error"]["fields"]
    assert accepted.status_code == 201 and len(accepted.json()["assignments"]) == 100


def test_quotes_and_procurements_have_their_own_tighter_rate(acme, alice, aws_account, settings, throttle_mid_window):
    settings.API_RATES = {"read": "100/min", "write": "100/min", "expensive": "2/min"}
    cache.clear()
    buyer = _bearer(acme, alice, ["orders:place", "offers:read"])

    quotes = [buyer.post("/api/v1/quotes", {"profile": "inference"}, format="json").status_code for _ in range(2)]
    procurement = buyer.post("/api/v1/procurements", {"demands": [{"profile": "inference"}]}, format="json")

    assert quotes == [201, 201]
    assert procurement.status_code == 429 and procurement.json()["error"]["code"] == "throttled"
    # Cheap calls keep their own, looser buckets.
    assert buyer.get("/api/v1/offers").status_code == 200
    assert buyer.get("/api/v1/orders").status_code == 200
    cache.clear()


# --- Passwords ------------------------------------------------------------------------------------------------

SAME = "nadia-nimbus"


@pytest.mark.parametrize("path", ["/signup", "/provider/signup"])
def test_a_sign_up_password_equal_to_the_username_is_refused(path):
    data = {"username": SAME, "email": "nadia@nimbus.example", "password1": SAME, "password2": SAME,
            "organization_name": "Nimbus GPUs"}  # fmt: skip

    response = Client().post(path, data)

    assert response.status_code == 200
    assert any("too similar to the username" in e for e in response.context["form"].errors["password1"])
    assert not get_user_model().objects.filter(username=SAME).exists()


def test_an_invitation_password_equal_to_the_username_is_refused(acme, alice):
    _, token = invitation_create(organization=acme, email="nadia@nimbus.example", role="member", by=alice)

    response = Client().post(f"/invitations/{token}", {"username": SAME, "password1": SAME, "password2": SAME})

    assert response.status_code == 400
    assert any("too similar to the username" in e for e in response.context["form"].errors["password1"])
    assert not get_user_model().objects.filter(username=SAME).exists()
    form = InvitationSignupForm({"username": SAME, "password1": SAME, "password2": SAME})
    assert not form.is_valid() and "too similar to the username" in " ".join(form.errors["password1"])


def test_every_place_that_validates_passwords_with_the_user_refuses_the_username():
    # createsuperuser (interactive), the admin's password forms and the sign-up forms all call this.
    with pytest.raises(ValidationError, match="too similar to the username"):
        validate_password(SAME, get_user_model()(username=SAME))
    with pytest.raises(ValidationError, match="too similar to the email"):
        validate_password("nadia@nimbus.example", get_user_model()(username="n", email="nadia@nimbus.example"))


# --- Public addresses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("::127.0.0.1", False),  # IPv4-compatible, loopback inside
        ("::10.0.0.1", False),
        ("::8.8.8.8", False),  # IPv4-compatible is deprecated: refused whatever it carries
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        ("::ffff:0:127.0.0.1", False),  # SIIT IPv4-translated
        ("::ffff:0:8.8.8.8", False),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
        ("2002:808:808::1", True),  # 6to4 of a public address
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("2001:0:7f00:1::", False),
        ("64:ff9b::127.0.0.1", False),  # well-known NAT64
        ("64:ff9b::8.8.8.8", True),
        ("64:ff9b:1::7f00:1", False),  # local-use NAT64
        ("64:ff9b:1::808:808", False),
        ("fec0::1", False),  # site-local
        ("fefe::1", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("::", False),
        ("::1", False),
        ("2606:4700:4700::1111", True),
        ("8.8.8.8", True),
    ],
)
def test_ipv4_hidden_in_ipv6_is_judged_or_refused(address, public):
    assert is_public(address) is public


@pytest.mark.parametrize("host", ["[::127.0.0.1]", "[::ffff:0:7f00:1]", "[fec0::1]", "[64:ff9b:1::a9fe:a9fe]"])
def test_webhooks_and_provider_endpoints_refuse_the_hidden_forms(host):
    with override_settings(WEBHOOK_DESTINATIONS="public"), pytest.raises(WebhookUrlRefused, match="not allowed"):
        destination_check(f"https://{host}/hooks")
    with override_settings(PROVIDER_ENDPOINTS="public+loopback"), pytest.raises(EndpointRefused):
        endpoint_check("endpoint_url", f"http://{host}:8080/")


# --- Instances of ended orders ----------------------------------------------------------------------------------


@pytest.fixture
def ended(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    assert boot(order, aws_sandbox) == "running"
    with django_capture_on_commit_callbacks(execute=True):
        order_terminate(order=order)
    order.refresh_from_db()
    return order


def test_a_normally_terminated_order_leaves_no_active_instance(ended):
    assert ended.state == OrderState.TERMINATED
    instance = Instance.objects.get(order=ended)
    assert (instance.active, instance.terminated_at is not None) == (False, True)
    assert Lease.objects.get(order=ended).state == LeaseState.ENDED


def test_the_migration_deactivates_instances_of_orders_that_ended(ended, acme, alice, aws_account, aws_sandbox,
                                                                  django_capture_on_commit_callbacks):  # fmt: skip
    Instance.objects.filter(order=ended).update(active=True)  # as the code before the fix left it
    live_offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with django_capture_on_commit_callbacks(execute=True):
        live = order_place(
            organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=live_offer.pk)
        ).order
    boot(live, aws_sandbox)
    assert Order.objects.get(pk=live.pk).state == OrderState.RUNNING

    migration = importlib.import_module("marketplace.migrations.0022_instance_inactive_when_ended")
    migration.deactivate_ended(apps, None)

    assert list(Instance.objects.filter(order=ended).values_list("active", flat=True)) == [False]
    assert list(Instance.objects.filter(order=live).values_list("active", flat=True)) == [True]


@pytest.mark.django_db(transaction=True)
def test_provisioning_stops_when_its_order_ends_during_a_launch(acme, alice, aws_account, aws_sandbox):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    # The provider holds the launch until the test lets it go: the order ends meanwhile.
    held = aws_sandbox.faults.inject("slow", action="RunInstances", seconds=120, times=1)
    errors: list[BaseException] = []

    def place() -> None:
        try:  # placing provisions at once (eager tasks), and the launch waits in the sandbox
            order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    placing = threading.Thread(target=place)
    placing.start()
    try:
        waited = threading.Event()
        for _ in range(1200):  # the state to wait for: the launch request reached the provider
            if held.fired:
                break
            waited.wait(0.05)
        assert held.fired == 1
        order = Order.objects.get()
        order_terminate(order=order)  # its terminate task finds no machine yet, and ends the order
        assert Order.objects.get(pk=order.pk).state == OrderState.TERMINATED
    finally:
        aws_sandbox.faults.clear()
        placing.join(timeout=120)
    assert errors == []
    # The held launch failed (the terminate task released the order's key pair meanwhile); the ended order
    # opened no second attempt and launched no second machine.
    assert list(order.attempts.values_list("number", "outcome")) == [(1, AttemptOutcome.FAILED)]
    assert len(aws_sandbox.calls("RunInstances")) == 1
    assert list(Instance.objects.filter(order=order)) == []
    assert [i.instance_id for i in aws_sandbox.instances() if i.state != "terminated"] == []
    assert [r for r in adapter_for_account(aws_account).list_order_resources() if r.order_ref == order.ref] == []
    assert list(Lease.objects.filter(order=order).values_list("state", flat=True)) == [LeaseState.ENDED]
    assert Order.objects.get(pk=order.pk).state == OrderState.TERMINATED
    assert ledger_verify().ok
