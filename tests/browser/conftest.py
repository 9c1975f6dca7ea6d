"""Browser tests: Playwright driving Debian's Chromium against a live server of the broker.

Skipped when /usr/bin/chromium is missing (.ci/run installs it). Screenshots go to test-artifacts/ for a
person to look at.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# Chromium's own background traffic is pointless here and refused by closed networks.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; Django refuses ORM calls from such a thread
    # unless told the test owns it.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def shoot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as a test artifact and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def gpu_models(transactional_db: Any) -> None:
    """The GPU spec table, which a transactional test before this one may have flushed with every table."""
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)


def sign_in(page: Any, base_url: str, user: Any) -> None:
    """Sign ``user`` in through the login form, with the demo password set for the purpose."""
    from marketplace.demo import DEMO_PASSWORD

    user.set_password(DEMO_PASSWORD)
    user.save()
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", user.get_username())
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.click("button[type=submit]")
