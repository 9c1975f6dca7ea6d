"""The template gallery in the storefront: its cards on the Templates page, "Use" (the offers that fit, then
one order form filled from it), starting from an entry on the order form, and "Copy to my templates"."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest
from django.test import Client

from marketplace.launch.config import launch_parse, launch_secrets
from marketplace.models import LaunchConfiguration, LaunchTemplate, Offer, Order, Role, SshKey
from tests.factories import MembershipFactory
from tests.marketplace.test_storefront_launch import _nonce, _text

pytestmark = pytest.mark.django_db

TOKEN = "jupyter-token-do-not-show-again"


@pytest.fixture
def offer(held_hosts):
    return Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def viewer(acme) -> Client:
    client = Client()
    client.force_login(MembershipFactory(user__username="vera", organization=acme, role=Role.VIEWER).user)
    return client


def test_the_templates_page_shows_each_gallery_card_with_what_it_needs(browser):
    page = browser.get("/templates/").content.decode()
    text = _text(page)

    for name, needs in [("PyTorch (CUDA 12.6)", "≥ 8 GB"), ("vLLM OpenAI-compatible server", "≥ 24 GB"),
                        ("Jupyter Lab with PyTorch", "≥ 8 GB"), ("Batch job", "≥ 8 GB")]:  # fmt: skip
        card = _text(re.search(rf"<h3>{re.escape(html.escape(name))}</h3>.*?</article>", page, re.S).group(0))
        assert needs in card and "GPU memory" in card
    assert "vllm/vllm-openai:v0.11.0" in text and "JUPYTER_TOKEN secret" in text
    assert "HF_TOKEN secret optional a Hugging Face token, for gated models only" in text
    assert page.count('aria-label="Use ') == 4 and page.count("Copy to my templates") == 4
    assert "<script>" not in page and "style=" not in page  # the CSP allows neither


def test_a_viewer_sees_the_gallery_without_use_or_copy(viewer):
    page = viewer.get("/templates/").content.decode()

    assert "vLLM OpenAI-compatible server" in page
    assert 'aria-label="Use ' not in page and "Copy to my templates" not in page
    assert viewer.post("/templates/gallery/vllm/copy", {"name": "x"}).status_code == 403
    assert LaunchTemplate.objects.count() == 0


def test_use_opens_the_offers_that_fit_and_fills_the_next_order_form_once(browser, offer):
    used = browser.post("/templates/gallery/vllm/use")

    assert used.status_code == 302 and used["Location"] == "/?q=mem%3E%3D24"
    first = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    again = browser.get(f"/orders/new?offer={offer.pk}").content.decode()

    assert 'id="gallery-start"' in first and "Filled from the gallery's vLLM OpenAI-compatible server" in _text(first)
    assert 'value="vllm/vllm-openai:v0.11.0"' in first and 'value="8000"' in first
    assert 'name="env_name_0" value="MODEL"' in first and 'value="Qwen/Qwen2.5-7B-Instruct"' in first
    assert 'id="gallery-start"' not in again and 'value="vllm/vllm-openai:v0.11.0"' not in again


def test_an_unknown_gallery_entry_is_404_and_remembers_nothing(browser, offer):
    assert browser.post("/templates/gallery/nope/use").status_code == 404
    assert browser.post("/templates/gallery/nope/copy", {"name": "x"}).status_code == 404
    assert browser.get("/templates/gallery/vllm/use").status_code == 405
    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    assert 'id="gallery-start"' not in page
    assert LaunchTemplate.objects.count() == 0


def test_starting_from_a_gallery_entry_asks_for_its_secret_then_orders_with_it(browser, offer, acme):
    started = browser.get(f"/orders/new?offer={offer.pk}&start=gallery:jupyter").content.decode()
    assert 'name="env_name_0" value="JUPYTER_TOKEN"' in started and "kept: leave empty" not in started
    key = SshKey.objects.get(name="alice@laptop")
    form = {
        "offer": offer.pk, "nonce": _nonce(started), "duration_hours": "1", "ssh_keys": [str(key.public_id)],
        "workload_kind": "container", "container_image": "quay.io/jupyter/pytorch-notebook:cuda12-2025-08-18",
        "container_ports": "8888", "env_rows": "1", "env_name_0": "JUPYTER_TOKEN", "env_value_0": "",
        "env_secret_0": "1", "access": "mine", "allow_failover": "on",
    }  # fmt: skip

    empty = browser.post("/orders/new", form)
    filled = browser.post("/orders/new", {**form, "env_value_0": TOKEN})

    assert empty.status_code == 400 and "enter the value: secret values are kept" in empty.content.decode()
    assert filled.status_code == 302, filled.content.decode()[:2000]
    confirm = browser.get(filled["Location"]).content.decode()
    assert "pytorch-notebook" in confirm and TOKEN not in confirm + started


def test_copy_saves_the_entry_as_the_organisations_template_with_its_secret(browser, acme):
    copied = browser.post("/templates/gallery/jupyter/copy", {"name": "our jupyter", "value_JUPYTER_TOKEN": TOKEN})

    assert copied.status_code == 302
    template = LaunchTemplate.objects.get(organization=acme)
    assert copied["Location"] == f"/templates/#template-{template.public_id}"
    workload = template.configuration.spec["workload"]
    assert (template.name, workload["image"], workload["ports"]) == (
        "our jupyter", "quay.io/jupyter/pytorch-notebook:cuda12-2025-08-18", [8888]
    )  # fmt: skip
    assert launch_secrets(template.configuration) == {"env": {"JUPYTER_TOKEN": TOKEN}}
    listing = browser.get("/templates/").content.decode()
    assert "our jupyter" in listing and TOKEN not in listing


def test_copy_without_the_secret_or_under_a_taken_name_saves_nothing_and_says_why(browser, acme):
    browser.post("/templates/gallery/vllm/copy", {"name": "serving"})
    configurations = LaunchConfiguration.objects.count()

    no_token = browser.post("/templates/gallery/jupyter/copy", {"name": "nb"}, follow=True)
    taken = browser.post("/templates/gallery/pytorch/copy", {"name": "serving"}, follow=True)

    assert "Not copied: JUPYTER_TOKEN: the password Jupyter Lab asks for" in _text(no_token.content.decode())
    assert "Not copied: name: the organisation already has a template called 'serving'" in html.unescape(
        taken.content.decode()
    )
    assert list(LaunchTemplate.objects.values_list("name", flat=True)) == ["serving"]
    assert LaunchConfiguration.objects.count() == configurations


class _FormFields(HTMLParser):
    """The fields of the page's launch form as a browser would send them unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, object] = {}
        self._in_form = False
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self._in_form = a.get("id") == "launch-form"
        if not self._in_form:
            return
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            if a["name"] == "ssh_keys":
                self.fields.setdefault("ssh_keys", []).append(a.get("value", ""))
            else:
                self.fields[a["name"]] = a.get("value") or ("on" if kind == "checkbox" else "")
        elif tag == "textarea":
            self._textarea = a.get("name")
            self.fields[self._textarea] = ""
        elif tag == "option" and "selected" in a and self._select:
            self.fields[self._select] = a.get("value", "")
        if tag == "select":
            self._select = a.get("name")

    _select: str | None = None

    def handle_data(self, data):
        if self._textarea:
            # As browsers do, the newline right after <textarea> is not part of the value.
            value = self.fields[self._textarea] + data
            self.fields[self._textarea] = value.removeprefix("\n") if not self.fields[self._textarea] else value

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self._in_form = False


@pytest.mark.parametrize("slug", ["pytorch", "vllm", "batch"])
def test_the_form_a_gallery_entry_fills_places_its_configuration_unchanged(
    browser, offer, slug, django_capture_on_commit_callbacks
):
    """Sent as filled (the command and arguments through the form's shell quoting and back), the order's
    workload is the gallery's."""
    from marketplace.launch.gallery import gallery_get

    page = browser.get(f"/orders/new?offer={offer.pk}&start=gallery:{slug}").content.decode()
    fields = _FormFields()
    fields.feed(page)

    sent = browser.post("/orders/new", {**fields.fields, "duration_hours": "1"})

    assert sent.status_code == 302, _text(sent.content.decode())[:1500]
    nonce = _nonce(browser.get(sent["Location"]).content.decode())
    with django_capture_on_commit_callbacks(execute=False):
        browser.post("/orders/place", {"nonce": nonce})

    workload = Order.objects.get().launch_config.spec["workload"]
    expected, _ = launch_parse(gallery_get(slug).launch, keys=[], caller_address="127.0.0.1")
    expected = expected["workload"]
    for field in ("kind", "image", "command", "args", "script", "ports", "shm_size_gb", "env"):
        assert workload.get(field) == expected.get(field), field
