"""A host's or cluster's seller chooses its SLA in the portal, never below the market's floor, and the dashboard
shows each account's and machine's measured availability against it (issue 38)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import LedgerEntry
from marketplace.catalog.selectors import account_reliability, machine_reliability
from marketplace.models import (
    Attempt,
    GpuModel,
    Instance,
    Membership,
    Offer,
    Order,
    OrderState,
    OutageCause,
    Role,
)
from marketplace.orders.outages import outage_close, outage_open
from providers.community.services import machine_heartbeat, machine_register
from providers.models import Machine, ProviderAccount
from tests.factories import ProviderAccountFactory
from tests.leases import boot_if_launched
from tests.portal.conftest import _member, client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def host_account(petra_org) -> ProviderAccount:
    return ProviderAccountFactory(provider=petra_org.provider, kind="community", name="home-lab")


def test_a_host_account_commits_to_a_figure_above_the_floor(petra, host_account):
    response = client_for(petra).post(f"/provider/accounts/{host_account.pk}/sla", {"sla_commitment_pct": "99.25"})

    assert response.status_code == 302
    host_account.refresh_from_db()
    assert host_account.sla_commitment_pct == Decimal("99.250")
    assert host_account.sync_wanted_at is not None
    (entry,) = LedgerEntry.objects.filter(kind="provider.sla_committed")
    assert entry.subject == f"provider_account:{host_account.pk}"
    page = client_for(petra).get("/provider/accounts").content.decode()
    assert 'name="sla_commitment_pct" step="0.001" min="95" max="100" required value="99.25"' in page


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("94.999", "choose from the market&#x27;s floor, 95.000 %, to 100 %"),
        ("100.5", "Ensure this value is less than or equal to 100."),
        ("99.1234", "Ensure that there are no more than 3 decimal places."),
        ("lots", "Enter a number."),
    ],
)
def test_a_commitment_below_the_floor_or_malformed_is_refused_and_nothing_changes(petra, host_account, value, message):
    client = client_for(petra)
    response = client.post(f"/provider/accounts/{host_account.pk}/sla", {"sla_commitment_pct": value}, follow=True)

    assert message in response.content.decode()
    host_account.refresh_from_db()
    assert (host_account.sla_commitment_pct, host_account.sync_wanted_at) == (None, None)
    assert not LedgerEntry.objects.filter(kind="provider.sla_committed").exists()


def test_a_cloud_account_has_no_figure_to_choose(petra, petra_org):
    account = ProviderAccountFactory(provider=petra_org.provider, kind="aws")
    response = client_for(petra).post(
        f"/provider/accounts/{account.pk}/sla", {"sla_commitment_pct": "99.9"}, follow=True
    )
    assert "state their cloud&#x27;s published SLA" in response.content.decode()
    account.refresh_from_db()
    assert account.sla_commitment_pct is None


def test_another_provider_and_a_viewer_cannot_set_it(petra_org, quentin, host_account):
    assert (
        client_for(quentin).post(f"/provider/accounts/{host_account.pk}/sla", {"sla_commitment_pct": "99"}).status_code
        == 404
    )
    viewer = _member(petra_org, "vera", Role.VIEWER)
    assert (
        client_for(viewer).post(f"/provider/accounts/{host_account.pk}/sla", {"sla_commitment_pct": "99"}).status_code
        == 403
    )
    host_account.refresh_from_db()
    assert host_account.sla_commitment_pct is None


def test_the_dashboard_shows_each_accounts_measured_availability_against_its_commitment(petra, host_account):
    ProviderAccount.objects.filter(pk=host_account.pk).update(sla_commitment_pct=Decimal("99.5"))
    page = client_for(petra).get("/provider/dashboard").content.decode()
    assert 'id="sla"' in page
    assert '<td>home-lab</td><td><span class="muted">all</span></td><td class="num">99.5 %</td>' in page
    assert "nothing ran" in page


def test_a_sellers_measured_availability_lowers_its_ranking_reliability(
    alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    api = APIClient()
    api.force_authenticate(alice)
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        api.post("/api/v1/orders", data=json.dumps({"offer": offer.pk}), content_type="application/json")
    order = Order.objects.latest("id")
    with django_capture_on_commit_callbacks(execute=True):
        boot_if_launched(order, aws_sandbox)
    now = timezone.now()
    Instance.objects.filter(order=order).update(ready_at=now - dt.timedelta(hours=10))
    untouched = account_reliability(now=now)[aws_account.pk]

    outage_open(order_id=order.pk, cause=OutageCause.SSH_UNREACHABLE, at=now - dt.timedelta(hours=5))
    outage_close(order_id=order.pk, cause=OutageCause.SSH_UNREACHABLE, at=now)

    # Half of the last ten hours down: the launch share is multiplied by 0.5.
    assert account_reliability(now=now)[aws_account.pk] == pytest.approx(untouched * 0.5)


def _order_on_machine(machine: Machine, buyer, *, ready_at: dt.datetime) -> Order:
    """A running order on ``machine``: its offer (zone = the machine's name), an attempt and a ready instance."""
    now = timezone.now()
    offer = Offer.objects.create(
        account_id=machine.account_id, region=machine.region, zone=machine.name, instance_type="1x",
        pricing_model="on_demand", gpu_model=GpuModel.objects.get(key="H100-SXM5"), gpu_count=1, gpu_memory_gb=80,
        vcpus=12, memory_gib=128, price=Decimal("1.95"), currency="USD", price_usd=Decimal("1.95"),
        price_per_gpu_usd=1.95, usd_per_tflop_hour=0.002, first_seen_at=now, last_seen_at=now,
        sla_availability=Decimal("95.000"),
    )  # fmt: skip
    organization = Membership.objects.get(user=buyer).organization
    order = Order.objects.create(
        organization=organization, created_by=buyer, offer=offer, gpu_model=offer.gpu_model, gpu_count=1,
        pricing_model="on_demand", max_price_per_hour=Decimal(2), price_per_hour=Decimal("1.95"),
        state=OrderState.RUNNING, state_changed_at=ready_at,
    )  # fmt: skip
    attempt = Attempt.objects.create(
        order=order, number=1, offer=offer, client_token=f"t-{order.pk}", started_at=ready_at
    )
    Instance.objects.create(
        order=order, attempt=attempt, account_id=machine.account_id, provider_instance_id=f"lease-{order.pk}",
        region=machine.region, zone=machine.name, instance_type="1x", state="running", launched_at=ready_at,
        ready_at=ready_at,
    )  # fmt: skip
    return order


def test_a_host_machines_measured_availability_lowers_its_ranking_and_shows_on_the_dashboard(petra, olga, alice):
    client_for(olga).post("/provider/machines/new", {"name": "fra-h100-1", "gpu_model": "H100-SXM5",
                          "gpu_count": "1", "gpu_memory_gb": "80", "vcpus": "12", "memory_gib": "128",
                          "disk_gb": "500", "network_gbps": "10", "country": "DE", "region": "eu-de",
                          "price_per_gpu_hour": "1.95", "availability": ""})  # fmt: skip
    machine = Machine.objects.get(name="fra-h100-1")
    machine_register(machine=machine, agent_url="http://127.0.0.1:7070", hardware={},
                     self_test={"ok": True, "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_gb": 80}]})  # fmt: skip
    idle = {"utilization_pct": 0, "temperature_c": 34, "power_w": 70, "memory_used_gb": 0.5}
    machine_heartbeat(machine=machine, gpus=[{"index": 0, **idle}], instances=0)
    now = timezone.now() + dt.timedelta(seconds=1)
    key = (machine.account_id, machine.name)
    order = _order_on_machine(machine, alice, ready_at=now - dt.timedelta(hours=8))
    untouched = machine_reliability(now=now)[key]
    assert untouched == pytest.approx(19 / 20)  # the prior, at full heartbeat uptime

    outage_open(order_id=order.pk, cause=OutageCause.AGENT_SILENT, at=now - dt.timedelta(hours=2))
    outage_close(order_id=order.pk, cause=OutageCause.AGENT_SILENT, at=now)

    # Two of its eight hours down: three quarters of the score it had.
    assert machine_reliability(now=now)[key] == pytest.approx(untouched * 0.75)
    page = client_for(petra).get("/provider/dashboard").content.decode()
    row = '<td><code>fra-h100-1</code></td><td class="num">95 %</td><td class="num">75'
    assert row in page and "<strong>below</strong>" in page
