"""The webhooks REST API (scope webhooks:manage) and the storefront's webhooks page: the secret shown once, the
delivery log with every attempt, redeliver and ping, and a stranger answered 404 everywhere."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.models import DeliveryState, TokenScope, WebhookDelivery, WebhookEndpoint
from marketplace.webhooks.services import webhook_deliver, webhook_ping
from marketplace.webhooks.signing import signature_verify
from tests.marketplace.test_webhooks import Receiver, free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def closed_port() -> int:
    return free_port()


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def api(alice) -> APIClient:
    return _client(alice)


def _create(api, url, **extra):
    return api.post("/api/v1/webhooks", {"url": url, **extra}, format="json")


def test_creating_a_webhook_answers_its_secret_once(api, receiver):
    response = _create(api, receiver.url(), description="ops", events=["order.running", "order.failed"])

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["secret"].startswith("whsec_")
    assert response["Cache-Control"] == "no-store"
    assert (body["url"], body["description"], body["events"], body["active"]) == (
        receiver.url(),
        "ops",
        ["order.failed", "order.running"],
        True,
    )
    detail = api.get(f"/api/v1/webhooks/{body['id']}")
    listing = api.get("/api/v1/webhooks")
    assert detail.status_code == listing.status_code == 200
    assert "secret" not in detail.json()
    assert [w["id"] for w in listing.json()["results"]] == [body["id"]]
    assert "secret" not in listing.json()["results"][0]
    assert body["secret"] not in (detail.content + listing.content).decode()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://example.com/hooks", "only to 127.0.0.1, ::1 or localhost"),
        ("http://192.168.0.10/", "not allowed"),
        ("gopher://127.0.0.1/", "http:// or https://"),
        ("not a url", "printable ASCII"),
    ],
)
def test_a_refused_url_is_a_400_naming_the_url_field(api, url, says):
    response = _create(api, url)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == ["url"]
    assert says in error["fields"]["url"][0]
    assert WebhookEndpoint.objects.count() == 0


def test_an_unknown_event_type_is_a_400_naming_the_events_field(api, receiver):
    response = _create(api, receiver.url(), events=["order.exploded"])

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["events"]


def test_the_list_pages_newest_first(api, receiver):
    ids = [_create(api, receiver.url(f"/{i}")).json()["id"] for i in range(3)]

    first = api.get("/api/v1/webhooks?limit=2").json()
    second = api.get(f"/api/v1/webhooks?limit=2&cursor={first['next_cursor']}").json()

    assert [w["id"] for w in first["results"] + second["results"]] == ids[::-1]
    assert second["next_cursor"] is None


def test_the_delivery_log_shows_every_attempt_newest_delivery_first(api, receiver):
    receiver.script = [500, 200]
    webhook = _create(api, receiver.url()).json()
    endpoint = WebhookEndpoint.objects.get(pk=webhook["id"])
    older, newer = webhook_ping(endpoint=endpoint), webhook_ping(endpoint=endpoint)
    webhook_deliver(delivery_id=older.pk)
    WebhookDelivery.objects.filter(pk=older.pk).update(next_attempt_at=older.created_at)
    webhook_deliver(delivery_id=older.pk)

    response = api.get(f"/api/v1/webhooks/{webhook['id']}/deliveries")

    assert response.status_code == 200
    results = response.json()["results"]
    assert [d["id"] for d in results] == [newer.pk, older.pk]
    assert results[1]["state"] == "delivered" and results[1]["attempt_count"] == 2
    assert [(a["number"], a["status_code"]) for a in results[1]["attempts"]] == [(1, 500), (2, 200)]
    assert results[1]["event_id"] == str(older.event_id)
    assert (results[0]["state"], results[0]["attempts"]) == ("pending", [])


def test_ping_and_redeliver_send_the_event_again_with_the_same_id(api, receiver, django_capture_on_commit_callbacks):
    created = _create(api, receiver.url()).json()

    with django_capture_on_commit_callbacks(execute=True):
        ping = api.post(f"/api/v1/webhooks/{created['id']}/ping")

    assert ping.status_code == 202, ping.content
    assert ping.json()["event_type"] == "ping"
    assert receiver.events() == ["ping"]
    assert WebhookDelivery.objects.get(pk=ping.json()["id"]).state == DeliveryState.DELIVERED

    with django_capture_on_commit_callbacks(execute=True):
        again = api.post(f"/api/v1/webhooks/{created['id']}/deliveries/{ping.json()['id']}/redeliver")

    assert again.status_code == 202, again.content
    assert again.json()["redelivery_of"] == ping.json()["id"]
    assert again.json()["event_id"] == ping.json()["event_id"]
    assert [r["headers"]["Broker-Delivery"] for r in receiver.requests] == [ping.json()["event_id"]] * 2
    for request in receiver.requests:
        assert signature_verify(created["secret"], str(request["headers"]["Broker-Signature"]), request["body"])


def test_a_pending_delivery_cannot_be_redelivered(api, receiver):
    created = _create(api, receiver.url()).json()
    pending = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=created["id"]))

    response = api.post(f"/api/v1/webhooks/{created['id']}/deliveries/{pending.pk}/redeliver")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "delivery_pending"
    assert WebhookDelivery.objects.count() == 1


def test_delete_removes_the_webhook_and_its_log(api, receiver):
    created = _create(api, receiver.url()).json()
    webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=created["id"]))

    assert api.delete(f"/api/v1/webhooks/{created['id']}").status_code == 204

    assert api.get(f"/api/v1/webhooks/{created['id']}").status_code == 404
    assert WebhookDelivery.objects.count() == 0


def test_a_stranger_gets_404_on_every_webhook_endpoint(api, charlie, receiver):
    created = _create(api, receiver.url()).json()
    delivery = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=created["id"]))
    stranger = _client(charlie)
    base = f"/api/v1/webhooks/{created['id']}"

    answers = [
        stranger.get(base),
        stranger.delete(base),
        stranger.get(f"{base}/deliveries"),
        stranger.post(f"{base}/deliveries/{delivery.pk}/redeliver"),
        stranger.post(f"{base}/ping"),
    ]

    assert [a.status_code for a in answers] == [404] * 5
    assert {a.json()["error"]["code"] for a in answers} == {"not_found"}
    assert stranger.get("/api/v1/webhooks").json()["results"] == []
    assert WebhookEndpoint.objects.filter(pk=created["id"]).exists()
    assert WebhookDelivery.objects.count() == 1  # no ping, no redelivery


def test_a_delivery_of_another_webhook_is_not_found(api, receiver):
    first, second = _create(api, receiver.url("/a")).json(), _create(api, receiver.url("/b")).json()
    delivery = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=first["id"]))

    response = api.post(f"/api/v1/webhooks/{second['id']}/deliveries/{delivery.pk}/redeliver")

    assert response.status_code == 404
    assert api.get("/api/v1/webhooks/not-a-number").status_code == 404


def test_a_token_needs_the_webhooks_scope(acme, alice, receiver):
    def bearer(scopes):
        raw = api_token_create(organization=acme, user=alice, name="t", scopes=scopes).raw
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    without = bearer([TokenScope.ORDERS_PLACE])
    with_scope = bearer([TokenScope.WEBHOOKS_MANAGE])

    refused = _create(without, receiver.url())
    assert refused.status_code == 403
    assert "webhooks:manage" in refused.json()["error"]["message"]
    assert without.get("/api/v1/webhooks").status_code == 403
    assert _create(with_scope, receiver.url()).status_code == 201


# --- The storefront page -----------------------------------------------------------------------------------------


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def test_the_page_creates_a_webhook_and_shows_its_secret_once(browser, receiver):
    response = browser.post("/webhooks/", {"url": receiver.url(), "description": "ops", "events": ["order.running"]})

    assert response.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    html = response.content.decode()
    secret = html.split('id="webhook-secret">')[1].split("<")[0]
    assert secret.startswith("whsec_")
    assert response["Cache-Control"] == "no-store"
    later = browser.get("/webhooks/").content.decode()
    assert receiver.url() in later and "order.running" in later and "active" in later
    assert secret not in later
    assert endpoint.description == "ops"


def test_the_page_names_a_refused_url(browser):
    response = browser.post("/webhooks/", {"url": "http://10.0.0.1/hooks"})

    assert response.status_code == 200
    assert "is not allowed" in response.content.decode()
    assert WebhookEndpoint.objects.count() == 0


def test_the_delivery_log_page_shows_each_attempt_and_redelivers(browser, receiver, closed_port):
    browser.post("/webhooks/", {"url": f"http://127.0.0.1:{closed_port}/"})
    endpoint = WebhookEndpoint.objects.get()
    delivery = webhook_ping(endpoint=endpoint)
    webhook_deliver(delivery_id=delivery.pk)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state=DeliveryState.DEAD)

    page = browser.get(f"/webhooks/{endpoint.pk}/").content.decode()

    assert "#1" in page and "connection failed" in page and str(delivery.event_id) in page
    response = browser.post(f"/webhooks/{endpoint.pk}/deliveries/{delivery.pk}/redeliver")
    assert response.status_code == 302
    assert WebhookDelivery.objects.filter(redelivery_of=delivery).count() == 1
    assert browser.post(f"/webhooks/{endpoint.pk}/ping").status_code == 302
    assert WebhookDelivery.objects.filter(endpoint=endpoint, event_type="ping").count() == 3


def test_the_page_deletes_and_needs_the_csrf_token(alice, browser, receiver):
    browser.post("/webhooks/", {"url": receiver.url()})
    endpoint = WebhookEndpoint.objects.get()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)

    assert strict.post(f"/webhooks/{endpoint.pk}/delete").status_code == 403
    assert strict.post("/webhooks/", {"url": receiver.url()}).status_code == 403
    assert WebhookEndpoint.objects.count() == 1
    assert browser.post(f"/webhooks/{endpoint.pk}/delete").status_code == 302
    assert WebhookEndpoint.objects.count() == 0


def test_a_stranger_gets_404_on_the_pages(browser, charlie, receiver):
    browser.post("/webhooks/", {"url": receiver.url()})
    endpoint = WebhookEndpoint.objects.get()
    delivery = webhook_ping(endpoint=endpoint)
    stranger = Client()
    stranger.force_login(charlie)

    answers = [
        stranger.get(f"/webhooks/{endpoint.pk}/"),
        stranger.post(f"/webhooks/{endpoint.pk}/delete"),
        stranger.post(f"/webhooks/{endpoint.pk}/ping"),
        stranger.post(f"/webhooks/{endpoint.pk}/deliveries/{delivery.pk}/redeliver"),
    ]

    assert [a.status_code for a in answers] == [404] * 4
    assert receiver.url() not in stranger.get("/webhooks/").content.decode()
    assert WebhookEndpoint.objects.count() == 1 and WebhookDelivery.objects.count() == 1


def test_the_page_needs_a_login(client):
    response = client.get("/webhooks/")

    assert response.status_code == 302 and "/login" in response["Location"]


def test_a_resubmitted_webhook_or_token_form_creates_one(client, alice, acme):
    from marketplace.models import ApiToken, WebhookEndpoint

    client.force_login(alice)
    hook = {"url": "http://127.0.0.1:9/hook", "description": "", "nonce": "form-1"}
    first = client.post("/webhooks/", hook)
    again = client.post("/webhooks/", hook)  # a reload that re-posts, or a double click
    assert first.status_code == 200 and again.status_code == 302
    assert WebhookEndpoint.objects.filter(organization=acme).count() == 1
    assert "already created" in client.get("/webhooks/").content.decode()
    assert client.post("/webhooks/", {**hook, "nonce": "form-2"}).status_code == 200
    assert WebhookEndpoint.objects.filter(organization=acme).count() == 2

    token = {"name": "ci", "scopes": ["offers:read"], "nonce": "form-3"}
    assert client.post("/tokens/", token).status_code == 200
    assert client.post("/tokens/", token).status_code == 302
    assert ApiToken.objects.filter(organization=acme).count() == 1
    refused = client.post("/webhooks/", {"url": "ftp://nowhere", "description": "", "nonce": "form-4"})
    assert refused.status_code in (200, 400) and WebhookEndpoint.objects.filter(organization=acme).count() == 2
    fixed = client.post("/webhooks/", {"url": "http://127.0.0.1:9/other", "description": "", "nonce": "form-4"})
    assert fixed.status_code == 200 and WebhookEndpoint.objects.filter(organization=acme).count() == 3


# --- Re-enabling, pausing, editing and rotating the secret ------------------------------------------------------


def _disable_by_dead_deliveries(endpoint_id: int, closed_port: int) -> None:
    """Point the webhook at a closed port and let DISABLE_AFTER_DEAD deliveries die, as a broken receiver would."""
    import datetime as dt

    from django.utils import timezone

    from marketplace.webhooks.services import DISABLE_AFTER_DEAD, MAX_ATTEMPTS

    WebhookEndpoint.objects.filter(pk=endpoint_id).update(url=f"http://127.0.0.1:{closed_port}/")
    now = timezone.now() + dt.timedelta(seconds=1)  # each ping is due by then
    for _ in range(DISABLE_AFTER_DEAD):
        delivery = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=endpoint_id))
        for _ in range(MAX_ATTEMPTS):
            webhook_deliver(delivery_id=delivery.pk, now=now)
            now += dt.timedelta(days=2)


def test_a_disabled_webhook_is_switched_on_again_with_its_failures_cleared(api, receiver, closed_port):
    hook = _create(api, receiver.url()).json()
    _disable_by_dead_deliveries(hook["id"], closed_port)
    disabled = api.get(f"/api/v1/webhooks/{hook['id']}").json()
    assert disabled["active"] is False and disabled["disabled_reason"].startswith("disabled after")

    fixed = api.patch(f"/api/v1/webhooks/{hook['id']}", {"url": receiver.url("/v2"), "active": True}, format="json")

    assert fixed.status_code == 200, fixed.content
    body = fixed.json()
    assert (body["active"], body["consecutive_failures"], body["disabled_reason"], body["disabled_at"]) == (
        True, 0, "", None,
    )  # fmt: skip
    assert body["url"] == receiver.url("/v2")
    delivery = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=hook["id"]))
    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.DELIVERED
    assert receiver.requests[-1]["path"] == "/v2"


def test_pausing_gives_up_what_is_pending_and_queues_nothing_new(api, receiver, acme):
    from marketplace.webhooks.services import webhook_event_emit

    hook = _create(api, receiver.url()).json()
    pending = webhook_ping(endpoint=WebhookEndpoint.objects.get(pk=hook["id"]))

    paused = api.patch(f"/api/v1/webhooks/{hook['id']}", {"active": False}, format="json").json()

    assert (paused["active"], paused["disabled_reason"]) == (False, "paused by the organisation")
    assert WebhookDelivery.objects.get(pk=pending.pk).state == DeliveryState.DEAD
    assert webhook_event_emit(organization_id=acme.pk, event_type="order.placed", data={}) == []
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"url": "ftp://127.0.0.1/x"}, "url"),
        ({"events": ["order.exploded"]}, "events"),
        ({"description": "x" * 201}, "description"),
        ({"active": "sometimes"}, "active"),
    ],
)
def test_a_bad_change_is_a_400_naming_the_field_and_changes_nothing(api, receiver, change, field):
    hook = _create(api, receiver.url(), description="ops").json()

    response = api.patch(f"/api/v1/webhooks/{hook['id']}", change, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert api.get(f"/api/v1/webhooks/{hook['id']}").json() == {k: v for k, v in hook.items() if k != "secret"}


def test_switching_on_again_respects_the_active_limit(api, receiver, monkeypatch):
    from marketplace.webhooks import services

    first = _create(api, receiver.url()).json()
    api.patch(f"/api/v1/webhooks/{first['id']}", {"active": False}, format="json")
    monkeypatch.setattr(services, "MAX_ENDPOINTS", 1)
    assert _create(api, receiver.url("/other")).status_code == 201

    refused = api.patch(f"/api/v1/webhooks/{first['id']}", {"active": True}, format="json")

    assert refused.status_code == 409 and refused.json()["error"]["code"] == "webhook_limit"
    assert WebhookEndpoint.objects.get(pk=first["id"]).active is False


def test_a_rotated_secret_signs_beside_the_old_one_for_the_overlap_then_alone(api, receiver):
    import datetime as dt

    from django.utils import timezone

    from marketplace.webhooks.services import ROTATION_OVERLAP, webhook_signing_secrets

    hook = _create(api, receiver.url()).json()
    old = hook["secret"]

    rotated = api.post(f"/api/v1/webhooks/{hook['id']}/secret", headers={"Idempotency-Key": "rotate-1"})

    assert rotated.status_code == 200, rotated.content
    assert rotated["Cache-Control"] == "no-store"
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != old
    until = dt.datetime.fromisoformat(rotated.json()["previous_secret_valid_until"])
    assert dt.timedelta(0) < until - timezone.now() <= ROTATION_OVERLAP
    assert new not in api.get(f"/api/v1/webhooks/{hook['id']}").content.decode()
    replay = api.post(f"/api/v1/webhooks/{hook['id']}/secret", headers={"Idempotency-Key": "rotate-1"})
    assert replay.json()["secret"] == new  # a retried rotation answers the same secret, rotates nothing more

    endpoint = WebhookEndpoint.objects.get(pk=hook["id"])
    delivery = webhook_ping(endpoint=endpoint)
    webhook_deliver(delivery_id=delivery.pk)
    sent = receiver.requests[-1]
    header = sent["headers"]["Broker-Signature"]
    assert signature_verify(new, header, sent["body"]) and signature_verify(old, header, sent["body"])

    assert webhook_signing_secrets(endpoint, now=until + dt.timedelta(seconds=1)) == [new]
    assert webhook_signing_secrets(endpoint, now=until - dt.timedelta(seconds=1)) == [new, old]


def test_the_page_pauses_switches_on_again_and_rotates_the_secret_once(browser, receiver, closed_port):
    from marketplace.webhooks.services import webhook_secret

    browser.post("/webhooks/", {"url": receiver.url()})
    endpoint = WebhookEndpoint.objects.get()
    old = webhook_secret(endpoint)
    _disable_by_dead_deliveries(endpoint.pk, closed_port)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=receiver.url())
    page = browser.get(f"/webhooks/{endpoint.pk}/").content.decode()
    assert "disabled after" in page and "Switch on again" in page

    assert browser.post(f"/webhooks/{endpoint.pk}/active", {"active": "on"}).status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.active, endpoint.consecutive_failures) == (True, 0)
    assert "Pause" in browser.get(f"/webhooks/{endpoint.pk}/").content.decode()

    rotated = browser.post(f"/webhooks/{endpoint.pk}/secret", {"nonce": "rotate-page-1"})
    assert rotated.status_code == 200 and rotated["Cache-Control"] == "no-store"
    new = rotated.content.decode().split('id="webhook-secret">')[1].split("<")[0]
    assert new.startswith("whsec_") and new != old == webhook_signing_old(endpoint)
    again = browser.post(f"/webhooks/{endpoint.pk}/secret", {"nonce": "rotate-page-1"})  # a reload
    assert again.status_code == 302 and webhook_secret(WebhookEndpoint.objects.get()) == new
    assert new not in browser.get(f"/webhooks/{endpoint.pk}/").content.decode()

    assert browser.post(f"/webhooks/{endpoint.pk}/active", {"active": "off"}).status_code == 302
    assert WebhookEndpoint.objects.get().disabled_reason == "paused by the organisation"


def webhook_signing_old(endpoint) -> str:
    """The secret signing beside the current one during a rotation's overlap."""
    from marketplace.webhooks.services import webhook_signing_secrets

    _, previous = webhook_signing_secrets(WebhookEndpoint.objects.get(pk=endpoint.pk))
    return previous
