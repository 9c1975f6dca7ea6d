"""A buyer launches a usable machine in the browser: adds an SSH key, orders an independent host's offer with a
container workload and an exposed port, confirms, watches the order become ready with its ssh line and live
telemetry, and terminates it. The machine's agent phones home by itself to the live server, as on a real
machine; a second journey shows a boot that fails and why."""

from __future__ import annotations

import re
import time

import pytest

from marketplace.catalog.services import offers_sync
from marketplace.models import Lease, LeaseHeartbeat, Order, OrderState
from providers.services import provider_account_connect
from tests.browser.conftest import shoot, sign_in
from tests.hosts import start_hosts, stop_hosts
from tests.leases import ClientTransport, held_agent
from tests.sshkeys import ed25519_pair, ed25519_public

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "hf_browser-SECRET-value-never-shown"


def _fleet():
    return provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )


@pytest.fixture
def farm(gpu_models, settings, live_server):
    """One machine whose agent runs each lease in a thread that phones home to the live server."""
    settings.PUBLIC_URL = live_server.url  # the boot script's broker URL, read when an attempt launches
    settings.LEASE_HEARTBEAT_S = 1.0  # the agent's telemetry every second, so the page shows it soon
    account = _fleet()
    agents = start_hosts(account, ["fra-h100-1"], lease_threads=True)
    assert offers_sync(account_id=account.pk).ok
    yield account
    stop_hosts(agents)


@pytest.fixture
def held_farm(gpu_models):
    """One machine whose agent holds each lease for the test to boot (or to fail)."""
    account = _fleet()
    agents = start_hosts(account, ["fra-h100-1"], lease_threads=False)
    assert offers_sync(account_id=account.pk).ok
    account.agents = agents
    yield account
    stop_hosts(agents)


def _wait(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


def test_add_a_key_order_a_container_see_it_ready_and_terminate(page, live_server, alice, farm):
    base = live_server.url
    sign_in(page, base, alice)

    # SSH keys: a private key pasted by mistake is refused and not shown again; the public one is added.
    page.click("nav a:has-text('SSH keys')")
    page.wait_for_url(f"{base}/keys/")
    _, private = ed25519_pair("alice@workstation-private")
    page.fill("#id_public_key", private)
    page.click("#key-form button[type=submit]")
    page.locator("#key-form .err >> text=this is a private key").wait_for()
    assert page.input_value("#id_public_key") == "" and "PRIVATE KEY" not in page.content()
    shoot(page, "launch-1-key-refused")
    page.fill("#id_public_key", ed25519_public("alice@workstation"))
    page.fill("#id_name", "workstation")
    page.click("#key-form button[type=submit]")
    page.locator(".flash.success >> text=Key workstation added").wait_for()
    assert page.locator("#keys tbody tr").count() == 2
    shoot(page, "launch-2-keys")

    # Order the independent machine's on-demand offer: the configure step.
    page.goto(f"{base}/?gpu=H100-SXM5&pricing=on_demand")
    page.locator("tbody tr").first.locator("a:has-text('Order')").click()
    page.wait_for_url(re.compile(r".*/orders/new\?offer=\d+$"))
    assert page.locator("input[name=ssh_keys]:checked").count() == 2  # every key, ticked by default
    assert page.inner_text("#caller-cidr") == "127.0.0.1/32"
    assert not page.is_visible("#container-fields")  # shown once "A container" is chosen
    page.fill("#id_duration_hours", "2")
    page.check("#kind-container")
    assert page.is_visible("#container-fields")
    page.fill("#id_args", "--model meta-llama/Llama-3.1-8B --max-model-len 8192")
    page.fill("#id_container_ports", "8000")
    page.fill("input[name=env_name_0]", "HF_TOKEN")
    page.fill("input[name=env_value_0]", SECRET)
    page.check("input[name=env_secret_0]")
    page.fill("input[name=env_name_1]", "MODE")
    page.fill("input[name=env_value_1]", "serve")
    page.fill("#id_ports", "22")
    shoot(page, "launch-3-configure")

    # Sent without an image and with port 22: each error next to its field, the secret kept but not shown.
    page.click("#launch-form button[type=submit]")
    page.locator("#form-errors").wait_for()
    assert "a container image reference" in page.inner_text("#container-fields")
    assert "22 is the machine's SSH" in page.inner_text("label:has(#id_ports)")
    assert page.input_value("input[name=env_value_0]") == "" and SECRET not in page.content()
    assert "kept" in page.get_attribute("input[name=env_value_0]", "placeholder")
    shoot(page, "launch-3b-configure-errors")
    page.fill("#id_container_image", "vllm/vllm-openai:v0.6.3")
    page.fill("#id_ports", "")
    page.check("#save-template")
    page.fill("#id_save_name", "vllm-8b")

    # The confirmation: what runs where, for how long, at most what cost, who reaches which ports.
    page.click("#launch-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/orders/new/confirm\?draft=.+"))
    what = page.inner_text("#confirm-what")
    assert "container vllm/vllm-openai:v0.6.3" in what and "••••••" in what
    assert "At most 30.40 USD" in page.inner_text("#confirm-cost")
    assert "8000" in page.inner_text("#confirm-access") and "127.0.0.1/32" in page.inner_text("#confirm-access")
    assert SECRET not in page.content()
    shoot(page, "launch-4-confirm")

    page.click("#confirm-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/orders/[0-9a-f-]{36}/$"))
    order = Order.objects.get()
    assert order.launch_config.spec["workload"]["ports"] == [8000]

    # The machine's agent claims, checks, starts the container and reports ready; the page shows how to connect.
    page.locator("#ssh-command").wait_for(timeout=30_000)
    order.refresh_from_db()
    assert order.state == OrderState.RUNNING, order.state_reason
    ssh = page.inner_text("#ssh-command")
    assert re.fullmatch(r"ssh -p \d+ lease@127\.0\.0\.1", ssh)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click("button.copy[data-copy=ssh-command]")
    page.locator("button.copy[data-copy=ssh-command] >> text=Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == ssh
    lease = Lease.objects.get(order=order)
    assert lease.host_keys[0]["fingerprint"] in page.inner_text("#host-keys")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+ port 8000", page.inner_text("#service-urls"))
    assert page.inner_text("#order-state") == "running"
    # Telemetry from the agent on the machine, redrawn by the page without a reload.
    _wait(lambda: LeaseHeartbeat.objects.filter(lease=lease).count() >= 2)
    page.locator("#latest-utilization").wait_for(timeout=30_000)
    assert "From the broker's agent on the machine" in page.inner_text("#telemetry")
    assert SECRET not in page.content()
    shoot(page, "launch-5-ready")

    # Terminate: the confirmation says what stops and what it has cost so far.
    page.click("#terminate-form summary")
    panel = page.inner_text("#terminate-form .confirm-panel")
    assert "vllm/vllm-openai:v0.6.3" in panel
    assert re.search(r"Cost so far: \d[\d,]*\.\d\d USD for \d+ s of running", panel), panel  # the money rule
    shoot(page, "launch-6-terminate-confirm")
    page.click("#terminate-confirm")
    page.wait_for_url(f"{base}/orders/{order.public_id}/")
    page.locator("#order-state >> text=terminated").wait_for(timeout=20_000)
    order.refresh_from_db()
    assert order.state == OrderState.TERMINATED
    assert page.locator("#ssh-command").count() == 0
    shoot(page, "launch-7-terminated")

    # The configuration saved on the way is a template to start the next order from.
    page.click("nav a:has-text('Templates')")
    page.wait_for_url(f"{base}/templates/")
    row = page.inner_text("#templates tbody tr")
    assert "vllm-8b" in row and "container vllm/vllm-openai:v0.6.3" in row and "HF_TOKEN (secret)" in row
    shoot(page, "launch-10-templates")


def test_a_machine_whose_workload_does_not_start_shows_the_timeline_and_the_reason(
    page, live_server, alice, acme, held_farm
):
    from marketplace.launch.config import LaunchChoice
    from marketplace.orders.services import PlaceRequest, order_place

    offer = held_farm.offers.get(pricing_model="on_demand")
    container = {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000]}
    launch = LaunchChoice(data={"workload": container}, caller_address="127.0.0.1")
    order = order_place(organization=acme, user=alice, request=PlaceRequest(offer_id=offer.pk, launch=launch)).order
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING
    base = live_server.url
    sign_in(page, base, alice)

    page.goto(f"{base}/orders/{order.public_id}/")
    assert "Starting the machine" in page.inner_text("#boot")
    assert "Fails over to another machine if not ready by" in page.inner_text("#boot-deadline")
    assert page.locator("#boot-timeline li.current").count() == 1
    shoot(page, "launch-8-provisioning")

    agent = held_agent(order, held_farm.agents)
    agent.executor.fail_workload = "pull access denied for vllm/vllm-openai, repository does not exist"
    agent.transport = ClientTransport()
    assert agent.boot() == "failed"
    page.locator("#order-state >> text=failed").wait_for(timeout=20_000)
    page.locator("#boot-failure").wait_for(timeout=20_000)
    assert "pull access denied" in page.inner_text("#boot-failure")
    assert "Attempts that failed" in page.inner_text("#failed-attempts")
    shoot(page, "launch-9-failed")
