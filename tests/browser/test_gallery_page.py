"""The template gallery in a browser, at a laptop's and a phone's width: the cards on the Templates page,
"Use" through the offers that fit to an order form filled from it, and "Copy to my templates"."""

from __future__ import annotations

import re

import pytest

from marketplace.catalog.services import offers_sync
from marketplace.models import LaunchTemplate
from providers.services import provider_account_connect
from tests.browser.conftest import shoot, sign_in
from tests.hosts import start_hosts, stop_hosts

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(gpu_models):
    account = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = start_hosts(account, ["fra-h100-1"], lease_threads=False)
    assert offers_sync(account_id=account.pk).ok
    yield account
    stop_hosts(agents)


def _no_sideways_scroll(page, width: int) -> None:
    wide = page.evaluate(
        "w => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w)"
        ".map(e => e.tagName + '.' + e.className + '#' + e.id).slice(0, 8)",
        width,
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= width, wide


def test_use_a_gallery_entry_from_the_templates_page_to_a_filled_order_form(page, live_server, alice, fleet):
    from playwright.sync_api import expect

    base = live_server.url
    page.set_viewport_size({"width": 1366, "height": 900})
    sign_in(page, base, alice)
    page.goto(f"{base}/templates/")
    cards = page.locator(".gallery-card")
    expect(cards).to_have_count(4)
    expect(page.locator("#gallery-vllm")).to_contain_text("≥ 24 GB")
    _no_sideways_scroll(page, 1366)
    shoot(page, "gallery-templates-1366")

    page.get_by_role("button", name="Use vLLM OpenAI-compatible server").click()
    expect(page).to_have_url(re.compile(r"\?q=mem%3E%3D24$"))
    expect(page.locator("body")).to_contain_text("Starting from vLLM OpenAI-compatible server")
    page.locator("a.button.primary", has_text="Order").first.click()
    expect(page.locator("#gallery-start")).to_contain_text("Filled from the gallery's vLLM OpenAI-compatible server")
    expect(page.locator("input[name=container_image]")).to_have_value("vllm/vllm-openai:v0.11.0")
    expect(page.locator("input[name=env_value_0]")).to_have_value("Qwen/Qwen2.5-7B-Instruct")
    _no_sideways_scroll(page, 1366)
    shoot(page, "gallery-order-filled-1366")


def test_copy_a_gallery_entry_on_a_phone(page, live_server, alice, acme, gpu_models):
    from playwright.sync_api import expect

    base = live_server.url
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, base, alice)
    page.goto(f"{base}/templates/")
    expect(page.locator(".gallery-card")).to_have_count(4)
    _no_sideways_scroll(page, 390)
    shoot(page, "gallery-templates-390")

    card = page.locator("#gallery-jupyter")
    card.get_by_text("Copy to my templates").click()
    card.locator("input[name=name]").fill("notebooks")
    card.locator("input[name=value_JUPYTER_TOKEN]").fill("a-long-random-token-for-the-test")
    shoot(page, "gallery-copy-open-390")
    card.get_by_role("button", name="Save the copy").click()

    expect(page.locator("#templates")).to_contain_text("notebooks")
    expect(page.locator("#templates")).to_contain_text("quay.io/jupyter/pytorch-notebook")
    assert LaunchTemplate.objects.get(organization=acme).name == "notebooks"
    _no_sideways_scroll(page, 390)
    shoot(page, "gallery-copied-390")
