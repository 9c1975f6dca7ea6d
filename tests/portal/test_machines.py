"""Listing independent machines in the portal, watching them, and the earnings page."""

from __future__ import annotations

import pytest

from marketplace.portal.forms import parse_windows
from providers.models import Machine, ProviderAccount
from tests.leases import LAUNCH, boot_if_launched
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

LISTING = {
    "name": "fra-h100-1", "gpu_model": "H100-SXM5", "gpu_count": "8", "gpu_memory_gb": "80", "vcpus": "96",
    "memory_gib": "1024", "disk_gb": "4000", "network_gbps": "100", "country": "DE", "region": "eu-de",
    "price_per_gpu_hour": "1.95", "min_bid_per_gpu_hour": "0.95",
    "availability": "mon-fri 06:00-22:00\nsat 10:00-02:00",
}  # fmt: skip


def test_an_operator_lists_a_machine_and_sees_its_secret_once(petra, olga):
    client = client_for(olga)
    page = client.post("/provider/machines/new", LISTING)
    assert page.status_code == 200 and page["Cache-Control"].count("no-store") == 1
    machine = Machine.objects.get(name="fra-h100-1")
    html = page.content.decode()
    assert machine.key_id in html and machine.secret() in html  # shown now...
    listing = client.get("/provider/machines").content.decode()
    assert machine.key_id in listing and machine.secret() not in listing  # ...and never again
    assert machine.availability == [
        {"weekdays": [0, 1, 2, 3, 4], "start": "06:00", "end": "22:00"},
        {"weekdays": [5], "start": "10:00", "end": "02:00"},
    ]
    account = ProviderAccount.objects.get(kind="community", provider__name="Petra GPU Cloud")
    assert account.enabled is False  # Petra is not verified yet: her machines do not sell
    assert machine.secret_encrypted and machine.secret() not in machine.secret_encrypted


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"gpu_model": ""}, "gpu_model", "required"),
        ({"gpu_memory_gb": "96"}, "gpu_memory_gb", "has 80 GB"),
        ({"min_bid_per_gpu_hour": "2.10"}, "min_bid_per_gpu_hour", "below the on-demand price"),
        ({"region": "EU DE"}, "region", "lower-case"),
        ({"availability": "weekdays 9-5"}, "availability", "line 1"),
        ({"price_per_gpu_hour": "0"}, "price_per_gpu_hour", "greater than or equal to 0.01"),
        ({"gpu_count": "17"}, "gpu_count", "less than or equal to 16"),
    ],
)
def test_a_bad_listing_names_the_field(petra, change, field, message):
    page = client_for(petra).post("/provider/machines/new", {**LISTING, **change})
    assert page.status_code == 200
    assert message in " ".join(page.context["form"].errors[field])
    assert not Machine.objects.exists()


def test_a_viewer_cannot_list_and_a_stranger_sees_nothing(petra, victor, quentin, alice):
    client_for(petra).post("/provider/machines/new", LISTING)
    assert client_for(victor).get("/provider/machines/new").status_code == 403
    assert "fra-h100-1" in client_for(victor).get("/provider/machines").content.decode()
    assert "fra-h100-1" not in client_for(quentin).get("/provider/machines").content.decode()
    assert client_for(alice).get("/provider/machines").status_code == 404
    assert client_for(quentin).get("/provider/earnings").status_code == 200


def test_the_same_name_twice_is_refused_on_the_name_field(petra):
    client = client_for(petra)
    client.post("/provider/machines/new", LISTING)
    again = client.post("/provider/machines/new", LISTING)
    assert "already has a machine called" in " ".join(again.context["form"].errors["name"])


def test_windows_wrap_round_the_week():
    assert parse_windows("sun-mon 22:00-06:00") == [{"weekdays": [0, 6], "start": "22:00", "end": "06:00"}]
    assert parse_windows("") == []


def test_an_order_receipt_is_only_for_the_provider_it_ran_for(petra, quentin, acme, alice, aws_account, aws_sandbox,
                                                              django_capture_on_commit_callbacks):  # fmt: skip
    from decimal import Decimal

    from marketplace.models import Organization
    from marketplace.orders.services import PlaceRequest, order_place

    # Petra's organisation resells the AWS sandbox account in this test.
    org = Organization.objects.get(name="Petra GPU Cloud")
    aws_account.provider = org.provider
    aws_account.save(update_fields=["provider"])
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            launch=LAUNCH,
            offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("0.01"))).order  # fmt: skip
    boot_if_launched(order, aws_sandbox)
    url = f"/provider/orders/{order.public_id}/receipt"
    mine = client_for(petra).get(url)
    assert mine.status_code == 200 and mine.json()["subject"] == f"order:{order.public_id}"
    assert client_for(quentin).get(url).status_code == 404
    assert client_for(alice).get(url).status_code == 404
    earnings = client_for(petra).get("/provider/earnings").content.decode()
    assert str(order.public_id)[:8] in earnings


def test_the_machines_page_reads_utilization_in_one_query_however_many_machines(petra, olga):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from providers.community.services import machine_heartbeat

    client = client_for(olga)

    def list_with_heartbeats(name: str, utilization: int) -> None:
        client.post("/provider/machines/new", {**LISTING, "name": name})
        machine_heartbeat(machine=Machine.objects.get(name=name), gpus=[{"utilization_pct": utilization}], instances=0)

    def queries_for_the_page() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as captured:
            page = client.get("/provider/machines")
        assert page.status_code == 200
        return len(captured), page.content.decode()

    list_with_heartbeats("fra-h100-1", 20)
    one, _ = queries_for_the_page()
    list_with_heartbeats("fra-h100-2", 60)
    list_with_heartbeats("fra-h100-3", 90)
    three, html = queries_for_the_page()
    assert three == one
    assert all(f"{pct}.0" in html for pct in (20, 60, 90))  # each machine's own latest utilization


def test_a_machine_whose_agent_cannot_wall_leases_off_shows_it_is_sold_whole_only(petra, olga):
    client = client_for(olga)
    client.post("/provider/machines/new", {**LISTING, "min_gpus_per_lease": "1"})
    machine = Machine.objects.get(name="fra-h100-1")
    reason = "no container runtime: the docker command is not installed"
    Machine.objects.filter(pk=machine.pk).update(
        self_test={"ok": True, "isolation": {"containers": False, "simulated": False, "reason": reason}}
    )
    page = client.get("/provider/machines").content.decode()
    assert f"Sold whole only: leases cannot be walled off ({reason})" in page

    Machine.objects.filter(pk=machine.pk).update(self_test={"ok": True, "isolation": {"containers": True}})
    assert "Sold whole only" not in client.get("/provider/machines").content.decode()
