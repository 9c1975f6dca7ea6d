"""Launching a usable machine from the storefront: the organisation's SSH keys, ordering in three steps
(configure, confirm, place) with a launch configuration, launch templates, and the order page from boot to
the connection details. Driven through the real views on independent hosts whose machines' agents the test
boots (tests/leases.py), in the test's own transaction."""

from __future__ import annotations

import html
import re
from decimal import Decimal

import pytest
from django.test import Client

from marketplace.launch.config import launch_secrets
from marketplace.models import LaunchTemplate, Lease, LeaseState, Offer, Order, OrderState, Role, SshKey
from tests.factories import MembershipFactory
from tests.leases import ClientTransport, boot, held_agent
from tests.sshkeys import ed25519_pair, ed25519_public, rsa_public

pytestmark = pytest.mark.django_db

SECRET = "hf_sEcReT-storefront-do-not-leak"
REGISTRY_SECRET = "ghp_registry-PASSWORD-do-not-leak"


@pytest.fixture
def hosts(held_hosts):
    return held_hosts


@pytest.fixture
def offer(hosts):
    return Offer.objects.get(zone="fra-h100-1", pricing_model="on_demand")


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def vera(acme):
    return MembershipFactory(user__username="vera", organization=acme, role=Role.VIEWER).user


def _text(page: str) -> str:
    """The page's text as a reader sees it: tags dropped, whitespace collapsed."""
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    return re.sub(r" ([,.:;])", r"\1", text)


def _nonce(page: str) -> str:
    return re.search(r'name="nonce" value="([^"]+)"', page).group(1)


def _container_form(offer: Offer, nonce: str, key: SshKey, **fields: object) -> dict[str, object]:
    """The configure form as a buyer fills it: a vLLM container serving on 8000, one secret variable."""
    form = {
        "offer": offer.pk, "nonce": nonce, "duration_hours": "2", "ssh_keys": [str(key.public_id)],
        "workload_kind": "container", "container_image": "vllm/vllm-openai:v0.6.3",
        "args": "--model meta-llama/Llama-3.1-8B --max-model-len 8192", "container_ports": "8000",
        "env_rows": "3", "env_name_0": "HF_TOKEN", "env_value_0": SECRET, "env_secret_0": "1",
        "env_name_1": "MODE", "env_value_1": "serve", "access": "mine", "allow_failover": "on",
    }  # fmt: skip
    form.update(fields)
    return form


def _configure(browser: Client, offer: Offer, **fields: object):
    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    key = SshKey.objects.get(name="alice@laptop")
    return browser.post("/orders/new", _container_form(offer, _nonce(page), key, **fields))


# --------------------------------------------------------------------------------------------- SSH keys


def test_the_keys_page_lists_each_key_with_its_fingerprint_and_who_added_it(browser, acme):
    key = SshKey.objects.get(organization=acme)

    page = browser.get("/keys/").content.decode()

    assert key.name in page and key.fingerprint in page
    assert "<code>ssh-ed25519</code>" in page and ">256<" in page
    assert ">alice<" in page
    assert 'enctype="multipart/form-data"' in page and 'name="public_key_file"' in page
    assert f'action="/keys/{key.public_id}/delete"' in page
    assert 'href="/keys/"' in browser.get("/").content.decode()  # in the header


def test_a_pasted_key_is_added_under_its_comment(browser, acme):
    response = browser.post("/keys/", {"public_key": ed25519_public("alice@desktop"), "name": ""}, follow=True)

    added = SshKey.objects.get(organization=acme, name="alice@desktop")
    assert response.redirect_chain == [("/keys/", 302)]
    assert f"Key alice@desktop added ({added.fingerprint})." in response.content.decode()
    assert added.created_by.username == "alice"


def test_an_uploaded_pub_file_is_added_and_leads_back_to_the_order(browser, acme, offer):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("id_ed25519.pub", ed25519_public("alice@tablet").encode(), "text/plain")
    back = f"/orders/new?offer={offer.pk}"

    response = browser.post("/keys/", {"public_key_file": upload, "name": "tablet", "next": back})

    assert (response.status_code, response["Location"]) == (302, back)
    assert SshKey.objects.filter(organization=acme, name="tablet").exists()


def test_a_private_key_is_refused_with_the_reason_and_its_text_never_comes_back(browser, acme):
    _, private = ed25519_pair("alice@laptop-private")
    body = private.strip().splitlines()[1]  # a line of the key's secret material

    response = browser.post("/keys/", {"public_key": private, "name": "oops"})

    page = response.content.decode()
    assert response.status_code == 400
    assert "this is a private key: it was not stored" in page
    assert body not in page and "PRIVATE KEY" not in page
    assert SshKey.objects.filter(organization=acme).count() == 1


def test_a_weak_key_is_refused_with_the_reason(browser, acme):
    weak = rsa_public(2048, "alice@old")

    response = browser.post("/keys/", {"public_key": weak})

    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    assert "2048" in page and "3072" in page
    assert weak.split()[1][:40] not in page
    assert SshKey.objects.filter(organization=acme).count() == 1


def test_a_key_is_removed(browser, acme):
    key = SshKey.objects.get(organization=acme)

    response = browser.post(f"/keys/{key.public_id}/delete", follow=True)

    assert "Key alice@laptop removed." in response.content.decode()
    assert not SshKey.objects.filter(organization=acme).exists()


# ------------------------------------------------------------------------------------------- ordering


def test_the_order_button_opens_the_configure_page_with_every_key_ticked(browser, offer):
    offers_page = browser.get("/").content.decode()
    assert f'href="/orders/new?offer={offer.pk}"' in offers_page
    assert 'action="/orders/place"' not in offers_page  # no one-click order any more

    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()

    key = SshKey.objects.get(name="alice@laptop")
    assert f'name="ssh_keys" value="{key.public_id}" checked' in page
    assert 'id="caller-cidr">127.0.0.1/32<' in page  # who may reach it by default, shown
    assert 'value="mine" id="access-mine" checked' in page
    assert "0.0.0.0/0" in page and 'value="anywhere" id="access-anywhere">' in page  # a choice, not the default
    assert "8\u00d7 H100-SXM5" in page and "15.2000 USD" in page


def test_configure_confirm_place_orders_the_configuration_and_never_shows_the_secret(
    browser, offer, hosts, django_capture_on_commit_callbacks, client
):
    responses = []
    configured = _configure(browser, offer)
    responses.append(configured)
    assert configured.status_code == 302, _text(configured.content.decode())
    confirm = browser.get(configured["Location"])
    responses.append(confirm)
    text = _text(confirm.content.decode())

    # The confirmation: what runs, where, how long and at most what cost, who reaches which ports.
    assert "container vllm/vllm-openai:v0.6.3" in text
    assert "--model meta-llama/Llama-3.1-8B --max-model-len 8192" in text
    assert "HF_TOKEN = •••••• secret" in text and "MODE = serve" in text
    assert "Helga's GPU Farm" in text and "fra-h100-1" in text and "eu-de" in text
    assert "Runs 2 h, then stops." in text and "At most 30.40 USD" in text
    assert "22 SSH, with the keys above 127.0.0.1/32 (your address)" in text and "8000 127.0.0.1/32" in text
    nonce = re.search(r'name="nonce" value="([^"]+)"', confirm.content.decode()).group(1)

    with django_capture_on_commit_callbacks(execute=True):
        placed = browser.post("/orders/place", {"nonce": nonce})
    responses.append(placed)
    order = Order.objects.get()
    assert placed["Location"] == f"/orders/{order.public_id}/"
    assert order.state == OrderState.PROVISIONING and order.duration_hours == Decimal("2.00")
    assert order.idempotency_key == nonce
    spec = order.launch_config.spec
    assert spec["workload"]["image"] == "vllm/vllm-openai:v0.6.3"
    assert spec["workload"]["env"] == [{"name": "HF_TOKEN", "secret": True}, {"name": "MODE", "value": "serve"}]
    assert (spec["ports"], spec["allowed_cidrs"]) == ([22, 8000], ["127.0.0.1/32"])
    assert [k["name"] for k in spec["ssh_keys"]] == ["alice@laptop"]
    assert launch_secrets(order.launch_config) == {"env": {"HF_TOKEN": SECRET}}

    provisioning = browser.get(f"/orders/{order.public_id}/")
    responses.append(provisioning)
    text = _text(provisioning.content.decode())
    assert "Starting the machine" in text and "Broker's agent started waiting…" in text
    assert "Fails over to another machine if not ready by" in text

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "running"
    running = browser.get(f"/orders/{order.public_id}/")
    responses.append(running)
    page = running.content.decode()
    lease = Lease.objects.get(order=order, state=LeaseState.READY)
    assert re.search(r'id="ssh-command">ssh -p \d+ lease@127\.0\.0\.1<', page)
    assert 'data-copy="ssh-command"' in page
    assert lease.host_keys[0]["fingerprint"] in page
    # A URL per exposed port, at the port the machine serves it on.
    url = r'href="http://127\.0\.0\.1:\d+"[^>]*>http://127\.0\.0\.1:\d+</a> <span class="muted small">port 8000<'
    assert re.search(url, page)
    assert "container vllm/vllm-openai:v0.6.3" in _text(page)
    for response in responses:
        assert SECRET not in response.content.decode()


def test_a_confirmation_sent_twice_places_one_order(browser, offer, django_capture_on_commit_callbacks):
    confirm = browser.get(_configure(browser, offer)["Location"]).content.decode()
    nonce = _nonce(confirm)

    with django_capture_on_commit_callbacks(execute=False):
        first = browser.post("/orders/place", {"nonce": nonce})
        again = browser.post("/orders/place", {"nonce": nonce}, follow=True)

    order = Order.objects.get()
    assert first["Location"] == again.redirect_chain[0][0] == f"/orders/{order.public_id}/"
    assert f"Order {order.public_id} was already placed from this form." in again.content.decode()


def test_wrong_fields_are_shown_next_to_them_and_nothing_is_ordered(browser, offer):
    response = _configure(
        browser, offer, container_image="", ports="22, 8888", access="custom", cidrs="10.0.0.0/8 not-a-range",
        env_name_1="2BAD", duration_hours="",
    )  # fmt: skip

    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    assert 'id="form-errors"' in page
    assert "give the hours to run, a spend cap, or both" in page
    # The form's own checks come first; with them fixed, the service's field errors show in place.
    response = _configure(
        browser, offer, container_image="", ports="22, 8888", access="custom", cidrs="10.0.0.0/8 not-a-range",
        env_name_1="2BAD",
    )  # fmt: skip
    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    image = page.index('name="container_image"')
    assert page.index("a container image reference", image) - image < 400
    assert "item 1: 22 is the machine's SSH, always open to the allowed addresses" in page
    assert "item 2: an IPv4 or IPv6 address range, e.g. 203.0.113.0/24" in page
    row = page.index('name="env_name_1"')
    assert page.index("letters, digits and _, not starting with a digit", row) - row < 800
    # The secret typed is kept for the next try but never sent back to the browser.
    assert SECRET not in page and "kept: leave empty to keep" in page
    assert Order.objects.count() == 0


def test_a_secret_kept_from_a_failed_try_is_used_without_being_typed_again(
    browser, offer, django_capture_on_commit_callbacks
):
    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    key = SshKey.objects.get(name="alice@laptop")
    nonce = _nonce(page)
    assert browser.post("/orders/new", _container_form(offer, nonce, key, container_image="")).status_code == 400

    fixed = browser.post("/orders/new", _container_form(offer, nonce, key, env_value_0=""))

    assert fixed.status_code == 302
    with django_capture_on_commit_callbacks(execute=False):
        browser.post("/orders/place", {"nonce": nonce})
    assert launch_secrets(Order.objects.get().launch_config) == {"env": {"HF_TOKEN": SECRET}}


def test_a_configuration_the_provider_would_refuse_comes_back_with_the_field_marked(
    browser, offer, django_capture_on_commit_callbacks
):
    # Within the broker's own limit, but over what the host agent's boot field takes once encoded.
    script = "#!/bin/bash\n" + "echo filler-line-of-the-script\n" * 6800
    configured = _configure(browser, offer, workload_kind="script", script=script)
    assert configured.status_code == 302
    nonce = _nonce(browser.get(configured["Location"]).content.decode())

    with django_capture_on_commit_callbacks(execute=False):
        response = browser.post("/orders/place", {"nonce": nonce})

    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    script_field = page.index('name="script"')
    assert "the host agent's boot field" in page[script_field : script_field + 300_000]
    assert SECRET not in page
    assert Order.objects.count() == 0


def test_hours_or_a_spend_cap_sets_the_most_it_can_cost(browser, offer):
    configured = _configure(browser, offer, duration_hours="", spend_cap_usd="7.60")

    text = _text(browser.get(configured["Location"]).content.decode())

    assert "Stops once it has cost 7.60 USD: about 0.5 h at this price." in text
    assert "At most 7.60 USD" in text


def test_anywhere_is_an_explicit_choice_and_the_confirmation_says_so(browser, offer):
    configured = _configure(browser, offer, access="anywhere")

    text = _text(browser.get(configured["Location"]).content.decode())

    assert "0.0.0.0/0 anyone on the internet" in text


def test_an_organisation_without_keys_is_told_to_add_one(browser, acme, offer):
    SshKey.objects.filter(organization=acme).delete()

    page = browser.get(f"/orders/new?offer={offer.pk}").content.decode()
    response = _configure_without_keys(browser, offer, _nonce(page))

    assert 'id="no-keys"' in page and f'href="/keys/?next=/orders/new%3Foffer%3D{offer.pk}"' in page
    assert "a machine without a workload needs an SSH key to be of use" in html.unescape(response.content.decode())


def _configure_without_keys(browser, offer, nonce):
    return browser.post(
        "/orders/new",
        {"offer": offer.pk, "nonce": nonce, "duration_hours": "1", "workload_kind": "none", "access": "mine",
         "env_rows": "0"},
    )  # fmt: skip


def test_a_quote_is_ordered_through_the_same_steps_at_its_locked_price(
    browser, offer, django_capture_on_commit_callbacks
):
    browser.post("/workload/", {"profile": "training", "gpu_count": "8", "duration_hours": "3",
                                "interruption_tolerance": "checkpointed"})  # fmt: skip
    from marketplace.models import Quote

    quote = Quote.objects.order_by("rank").first()
    page = browser.get(f"/orders/new?quote={quote.public_id}").content.decode()
    # Training fixes the work (3 hours on its reference A100): the hours it takes on this card are an estimate
    # from datasheets, shown but not filled in as the run time, which would stop the job there.
    assert 'name="duration_hours" id="id_duration_hours" step="0.01" min="0.01" value=""' in page
    assert f"estimated at {quote.duration_hours} h on this offer" in page
    form = _container_form(offer, _nonce(page), SshKey.objects.get(name="alice@laptop"))
    del form["offer"]
    form["quote"] = str(quote.public_id)

    configured = browser.post("/orders/new", form)
    nonce = _nonce(browser.get(configured["Location"]).content.decode())
    with django_capture_on_commit_callbacks(execute=False):
        browser.post("/orders/place", {"nonce": nonce})

    order = Order.objects.get()
    assert (order.quote_id, order.price_per_hour) == (quote.pk, quote.price_per_hour)
    assert order.launch_config.spec["workload"]["kind"] == "container"


# ------------------------------------------------------------------------------------------ templates


def test_save_as_template_then_start_from_it_keeps_its_secret_unseen(
    browser, acme, offer, django_capture_on_commit_callbacks
):
    configured = _configure(
        browser, offer, save_template="on", save_name="vllm-8b", registry_server="ghcr.io",
        registry_username="acme", registry_password=REGISTRY_SECRET,
    )  # fmt: skip
    assert configured.status_code == 302
    template = LaunchTemplate.objects.get(organization=acme)
    assert template.name == "vllm-8b"

    listing = browser.get("/templates/").content.decode()
    text = _text(listing)
    assert "vllm-8b" in text and "container vllm/vllm-openai:v0.6.3" in text and "HF_TOKEN (secret)" in text
    assert "22, 8000" in text and "127.0.0.1/32" in text and "alice@laptop" in text
    assert 'href="/templates/"' in listing
    started = browser.get(f"/orders/new?offer={offer.pk}&start={template.public_id}").content.decode()
    assert 'value="vllm/vllm-openai:v0.6.3"' in started and 'name="env_name_0" value="HF_TOKEN"' in started
    assert 'name="env_value_0" value=""' in started and "kept: leave empty to keep" in started

    # Started from the template, the secret fields left empty: its values carry over, unseen.
    key = SshKey.objects.get(name="alice@laptop")
    form = _container_form(offer, _nonce(started), key, env_value_0="", start=str(template.public_id),
                           registry_server="ghcr.io", registry_username="acme")  # fmt: skip
    nonce = _nonce(browser.get(browser.post("/orders/new", form)["Location"]).content.decode())
    with django_capture_on_commit_callbacks(execute=False):
        browser.post("/orders/place", {"nonce": nonce})

    order = Order.objects.get()
    assert launch_secrets(order.launch_config) == {"env": {"HF_TOKEN": SECRET}, "registry_password": REGISTRY_SECRET}
    for page in (listing, started, browser.get(f"/orders/{order.public_id}/").content.decode()):
        assert SECRET not in page and REGISTRY_SECRET not in page


def test_a_template_is_deleted(browser, acme, offer):
    _configure(browser, offer, save_template="on", save_name="scratch")
    template = LaunchTemplate.objects.get(organization=acme)

    page = browser.get("/templates/").content.decode()
    response = browser.post(f"/templates/{template.public_id}/delete", follow=True)

    assert "Delete the template <strong>scratch</strong>?" in page
    assert "Template scratch deleted" in response.content.decode()
    assert not LaunchTemplate.objects.filter(organization=acme).exists()


# ------------------------------------------------------------------------------------------------ roles


def test_a_viewer_sees_keys_and_templates_without_forms_and_is_refused_every_post(alice, vera, acme, offer):
    key = SshKey.objects.get(organization=acme)
    owner = Client()
    owner.force_login(alice)
    _configure(owner, offer, save_template="on", save_name="shared")
    template = LaunchTemplate.objects.get(organization=acme)
    client = Client()
    client.force_login(vera)

    keys_page = client.get("/keys/").content.decode()
    templates_page = client.get("/templates/").content.decode()

    assert key.fingerprint in keys_page and 'id="viewer-note"' in keys_page
    assert "<form" not in keys_page.split("</header>")[1] and "Remove" not in keys_page
    assert "shared" in templates_page and "Delete" not in templates_page
    for path, data in [
        ("/keys/", {"public_key": ed25519_public("vera@laptop")}),
        (f"/keys/{key.public_id}/delete", {}),
        (f"/templates/{template.public_id}/delete", {}),
        ("/orders/new", {"offer": offer.pk, "duration_hours": "1"}),
        ("/orders/place", {"nonce": "anything"}),
    ]:
        response = client.post(path, data)
        assert response.status_code == 403, path
        assert "role; you are a viewer" in response.content.decode()
    assert client.get(f"/orders/new?offer={offer.pk}").status_code == 403
    assert SshKey.objects.filter(organization=acme).count() == 1 and LaunchTemplate.objects.count() == 1
    assert Order.objects.count() == 0


def test_a_stranger_sees_none_of_alices_keys_or_templates(browser, charlie, acme, offer):
    _configure(browser, offer, save_template="on", save_name="alice-only")
    key = SshKey.objects.get(organization=acme)
    stranger = Client()
    stranger.force_login(charlie)

    assert key.fingerprint not in stranger.get("/keys/").content.decode()
    assert "alice-only" not in stranger.get("/templates/").content.decode()
    # Another organisation's template is not a starting point either.
    page = stranger.get(f"/orders/new?offer={offer.pk}&start={LaunchTemplate.objects.get().public_id}")
    assert 'value="vllm/vllm-openai' not in page.content.decode()


# ------------------------------------------------------------------------------------- a failed boot


def test_a_workload_that_does_not_start_shows_why_on_the_order_page(
    browser, offer, hosts, django_capture_on_commit_callbacks, client
):
    confirm = browser.get(_configure(browser, offer)["Location"]).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        browser.post("/orders/place", {"nonce": _nonce(confirm)})
    order = Order.objects.get()
    agent = held_agent(order, hosts)
    agent.executor.fail_workload = "pull access denied for vllm/vllm-openai, repository does not exist"

    with django_capture_on_commit_callbacks(execute=True):
        assert boot(order, hosts, ClientTransport(client)) == "failed"
    text = _text(browser.get(f"/orders/{order.public_id}/").content.decode())

    assert "Why it did not start" in text
    assert "The machine reported a failure while starting the workload: pull access denied for vllm/vllm-openai" in text
    assert "Attempts that failed" in text
    assert 'id="ssh-command"' not in text and "Terminate" not in text
