"""A provider in the browser: sign up, connect a sandbox cloud (and see it refused first), list a machine, run
its agent, and see the machine sold and earning."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace.catalog.services import offers_sync
from marketplace.machines import machine_decide
from marketplace.models import Offer, Order, OrderState, ProviderProfile
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.portal.services import provider_state_change
from providers.community.agent import Agent, parse_simulated
from providers.models import Machine, MachineState, ProviderAccount
from tests.browser.conftest import shoot
from tests.conftest import AWS_TEST_CREDENTIALS
from tests.leases import LAUNCH

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-battery-9"


def test_sign_up_connect_list_a_machine_and_see_it_earn(
    page, live_server, aws_sandbox, acme, alice, gpu_models, settings
):
    base = live_server.url
    settings.PUBLIC_URL = base  # where the machine's lease agent phones home, as the boot script says
    # Sign up.
    page.goto(f"{base}/provider/signup")
    page.fill("input[name=username]", "helga")
    page.fill("input[name=email]", "helga@farm.example")
    page.fill("input[name=organization_name]", "Helga's GPU Farm")
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    shoot(page, "provider-1-signup")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/provider/details")

    page.fill("input[name=legal_name]", "Helga's GPU Farm GmbH")
    page.select_option("select[name=country]", "DE")
    page.fill("textarea[name=registered_address]", "Hafenstraße 7\n20359 Hamburg")
    page.fill("input[name=tax_id]", "DE987654321")
    page.fill("input[name=contact_email]", "ops@farm.example")
    page.click("button[type=submit]")
    page.goto(f"{base}/provider/terms")
    page.check("input[name=accept]")
    page.click("button[type=submit]")

    # Connect the AWS sandbox: first refused (the cloud's own error on the form), then accepted.
    aws_sandbox.faults.inject("credentials", action="DescribeAvailabilityZones", times=1)
    page.goto(f"{base}/provider/accounts/connect/aws")
    page.fill("input[name=name]", "main")
    page.fill("input[name=regions]", "us-east-1")
    page.fill("input[name=endpoint_url]", aws_sandbox.url)
    page.fill("input[name=access_key_id]", AWS_TEST_CREDENTIALS["access_key_id"])
    page.fill("input[name=secret_access_key]", AWS_TEST_CREDENTIALS["secret_access_key"])
    page.click("button[type=submit]")
    assert "AuthFailure" in page.content()
    shoot(page, "provider-2-credentials-refused")
    assert not ProviderAccount.objects.filter(provider__name="Helga's GPU Farm", kind="aws").exists()
    page.fill("input[name=secret_access_key]", AWS_TEST_CREDENTIALS["secret_access_key"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/provider/accounts")
    assert ProviderAccount.objects.filter(provider__name="Helga's GPU Farm", kind="aws").exists()
    shoot(page, "provider-3-accounts")

    # List a machine: the agent's key and secret are on the page once.
    page.goto(f"{base}/provider/machines/new")
    for name, value in {"name": "ham-l40s-1", "gpu_count": "4", "gpu_memory_gb": "48", "vcpus": "64",
                        "memory_gib": "512", "disk_gb": "2000", "network_gbps": "25", "region": "eu-de",
                        "price_per_gpu_hour": "0.79", "min_bid_per_gpu_hour": "0.39"}.items():  # fmt: skip
        page.fill(f"[name={name}]", value)
    page.select_option("select[name=gpu_model]", "L40S")
    page.select_option("select[name=country]", "DE")
    page.click("button[type=submit]")
    key_id, secret = page.inner_text("#agent-key"), page.inner_text("#agent-secret")
    shoot(page, "provider-4-machine-listed")

    # The provider runs the agent; it registers with a self-test and heartbeats to the live broker.
    agent = Agent(broker_url=base, key_id=key_id, secret=secret, simulated=parse_simulated("L40S:48x4"),
                  launch_seconds=0, heartbeat_s=1)  # fmt: skip
    agent.serve("127.0.0.1", 0)
    try:
        deadline = timezone.now() + dt.timedelta(seconds=15)
        while not Machine.objects.filter(key_id=key_id, self_test_ok=True).exists():
            assert timezone.now() < deadline, "the agent never registered"
            page.wait_for_timeout(200)

        # Marketplace staff verify the provider and the machine; the machine goes on sale.
        staff = get_user_model().objects.create_superuser(username="sam", email="sam@broker.example", password="x")
        profile = ProviderProfile.objects.get(organization__name="Helga's GPU Farm")
        provider_state_change(profile_id=profile.pk, to="verified", reason="documents checked", by=staff)
        machine = Machine.objects.get(key_id=key_id)
        machine_decide(machine=machine, state=MachineState.VERIFIED, by=staff, reason="self-test matched")
        assert offers_sync(account_id=machine.account_id).ok
        offer = Offer.objects.get(account=machine.account, zone="ham-l40s-1", pricing_model="on_demand")
        assert offer.price_usd == Decimal("3.16")

        page.goto(f"{base}/provider/machines")
        row = page.locator("tr[data-machine=ham-l40s-1]")
        assert all(word in row.inner_text() for word in ("verified", "online", "passed"))
        assert row.locator("svg.chart[role=img]").count() == 1

        # A buyer orders it; it runs on Helga's machine once the lease agent there reports ready.
        order = order_place(organization=acme, user=alice, request=PlaceRequest(
            offer_id=offer.pk, max_price_per_hour=offer.price_usd, launch=LAUNCH)).order  # fmt: skip
        deadline = timezone.now() + dt.timedelta(seconds=20)
        while Order.objects.get(pk=order.pk).state == OrderState.PROVISIONING and timezone.now() < deadline:
            page.wait_for_timeout(200)
        order.refresh_from_db()
        assert order.state == OrderState.RUNNING, order.state_reason
        assert [i.state for i in agent.instances.values()] == ["running"]
        page.wait_for_timeout(2500)  # a few heartbeats from the busy GPUs for the chart
        page.goto(f"{base}/provider/machines")
        shoot(page, "provider-5-machine-busy")
        page.goto(f"{base}/provider/earnings")
        assert str(order.public_id)[:8] in page.locator("section").first.inner_text()

        # Two hours later the buyer stops it: the statement shows the line, the commission and the net.
        Order.objects.get(pk=order.pk).instances.update(ready_at=timezone.now() - dt.timedelta(hours=2))
        order_terminate(order=Order.objects.get(pk=order.pk))
        page.goto(f"{base}/provider/earnings")
        net = Decimal(page.inner_text("#net-total"))
        assert Decimal("5.5") < net < Decimal("5.6")  # 2 h x $3.16, less 12 %
        shoot(page, "provider-6-earnings")
    finally:
        agent.stop()
