"""Webhooks against a real HTTP receiver on 127.0.0.1: events from the order path, signatures, retries on the
backoff schedule (driven by an explicit ``now``), timeouts, dead deliveries, and where a webhook may point."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import (
    DeliveryState,
    Order,
    OrderState,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEventType,
)
from marketplace.orders.transitions import order_transition
from marketplace.webhooks import destinations, sending
from marketplace.webhooks import services as webhook_services
from marketplace.webhooks.destinations import WebhookUrlRefused, destination_check
from marketplace.webhooks.services import (
    DISABLE_AFTER_DEAD,
    MAX_ATTEMPTS,
    RETRY_DELAYS_S,
    WebhookInvalid,
    endpoints_known,
    event_body,
    order_event_emit,
    webhook_deliver,
    webhook_deliveries_due,
    webhook_endpoint_create,
    webhook_event_emit,
    webhook_ping,
    webhook_secret,
    with_endpoints,
)
from marketplace.webhooks.signing import signature_header, signature_verify
from marketplace.webhooks.tasks import webhooks_sweep_task
from tests.leases import LAUNCH, boot

pytestmark = pytest.mark.django_db


class Receiver:
    """An HTTP server on 127.0.0.1 that records every request and answers from a script of status codes
    (200 once the script is used up); ``("redirect", url)`` answers 302 to ``url``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, object]] = []
        self.script: list[object] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
                answer = receiver.script.pop(0) if receiver.script else 200
                if isinstance(answer, tuple):
                    self.send_response(302)
                    self.send_header("Location", answer[1])
                else:
                    self.send_response(int(answer))  # type: ignore[call-overload]
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hooks") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self) -> list[str]:
        return [str(r["headers"]["Broker-Event"]) for r in self.requests]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


def free_port() -> int:
    """A loopback port nothing listens on: connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return int(port)


@pytest.fixture
def closed_port() -> int:
    return free_port()


def _endpoint(org, user, url, events=()):
    return webhook_endpoint_create(organization=org, user=user, url=url, events=events)


def _ping(endpoint) -> WebhookDelivery:
    # Outside captured on-commit callbacks the send task never runs: the test drives webhook_deliver itself.
    return webhook_ping(endpoint=endpoint)


# --- Signatures ----------------------------------------------------------------------------------------------


def test_a_signature_verifies_and_a_tampered_body_or_a_wrong_secret_does_not():
    body = b'{"id":"e1","type":"order.running"}'
    header = signature_header("whsec_right", body)

    assert signature_verify("whsec_right", header, body)
    assert not signature_verify("whsec_right", header, body.replace(b"running", b"failed"))
    assert not signature_verify("whsec_wrong", header, body)
    assert not signature_verify("whsec_right", "t=abc,v1=00", body)
    assert not signature_verify("whsec_right", "t=²,v1=00", body)
    assert not signature_verify("whsec_right", "", body)


def test_a_signature_older_than_the_tolerance_is_refused():
    body = b"{}"
    header = signature_header("s", body, timestamp=1_700_000_000)

    assert signature_verify("s", header, body, now=1_700_000_299)
    assert not signature_verify("s", header, body, now=1_700_000_301)
    assert not signature_verify("s", header, body, tolerance_s=10, now=1_700_000_011)


def test_a_sent_event_carries_its_headers_and_a_signature_that_verifies(acme, alice, receiver):
    created = _endpoint(acme, alice, receiver.url())
    delivery = _ping(created.endpoint)

    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.DELIVERED

    (request,) = receiver.requests
    headers, body = request["headers"], request["body"]
    assert headers["Broker-Event"] == "ping"
    assert headers["Broker-Delivery"] == str(delivery.event_id)
    assert headers["Content-Type"] == "application/json"
    assert signature_verify(created.secret, headers["Broker-Signature"], body)
    assert not signature_verify(created.secret, headers["Broker-Signature"], body + b" ")
    assert json.loads(body)["id"] == str(delivery.event_id)
    assert body == event_body(WebhookDelivery.objects.get(pk=delivery.pk))


def test_the_secret_is_stored_encrypted_and_recoverable(acme, alice, receiver):
    created = _endpoint(acme, alice, receiver.url())

    stored = WebhookEndpoint.objects.get(pk=created.endpoint.pk)
    assert created.secret.startswith("whsec_")
    assert created.secret not in stored.secret_encrypted
    assert webhook_secret(stored) == created.secret


# --- Events from the order path ----------------------------------------------------------------------------------


def test_an_order_placed_through_the_api_sends_its_events_in_order(
    acme, alice, aws_account, aws_sandbox, receiver, django_capture_on_commit_callbacks
):
    created = _endpoint(acme, alice, receiver.url())
    api = APIClient()
    api.force_authenticate(alice)
    offers = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand")
    offer = offers.order_by("price_usd").first()

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/orders", {"offer": offer.pk}, format="json")

    assert response.status_code == 201, response.content
    order = Order.objects.get(public_id=response.json()["id"])
    with django_capture_on_commit_callbacks(execute=True):
        boot(order, aws_sandbox)
    assert order.state == OrderState.RUNNING
    assert receiver.events() == [
        "order.placed",
        "order.provisioning",
        "instance.launched",
        "instance.running",
        "instance.ready",
        "order.running",
    ]
    bodies = [json.loads(r["body"]) for r in receiver.requests]
    for request in receiver.requests:
        assert signature_verify(created.secret, str(request["headers"]["Broker-Signature"]), request["body"])
    running = bodies[-1]["data"]
    assert running["order"] == str(order.public_id)
    assert (running["previous_state"], running["state"]) == ("provisioning", "running")
    assert running["price_per_hour"] == str(order.price_per_hour)
    assert running["instance"]["provider_instance_id"] == order.instance.provider_instance_id
    assert running["instance"]["zone"] == order.instance.zone
    # The running event says how to connect, and which host key to expect.
    lease = order.leases.get()
    assert running["connection"]["ssh"] == f"ssh -p {lease.ssh_port} ubuntu@127.0.0.1"
    assert running["connection"]["host_keys"][0]["fingerprint"] == lease.host_keys[0]["fingerprint"]
    assert bodies[0]["data"]["previous_state"] is None and bodies[0]["data"]["instance"] is None
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    assert len({r["headers"]["Broker-Delivery"] for r in receiver.requests}) == 6

    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/api/v1/orders/{order.public_id}/terminate")

    assert receiver.events()[6:] == ["order.terminating", "instance.terminated", "order.terminated"]
    assert json.loads(receiver.requests[-1]["body"])["data"]["instance"]["terminated_at"] is not None


def _endpoint_checks(queries: list[dict]) -> list[str]:
    """The statements that read the endpoints table on their own (not as a subquery of another read)."""
    return [q["sql"] for q in queries if 'FROM "marketplace_webhookendpoint"' in q["sql"].split("(", 1)[0]]


def test_an_organisation_without_endpoints_pays_no_query_of_its_own_for_them_from_order_to_running_machine(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    api = APIClient()
    api.force_authenticate(alice)
    offer = aws_account.offers.filter(instance_type="g5.xlarge", pricing_model="on_demand").order_by("price_usd")[0]

    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/orders", {"offer": offer.pk}, format="json")

    assert response.status_code == 201, response.content
    instance = Order.objects.get(public_id=response.json()["id"]).instance
    assert instance.running_at is not None  # placed, launched and seen running: four events, none sent
    # Each event trusted the read its step made anyway (orders/launching.py, readiness.py, services.py).
    assert _endpoint_checks(queries.captured_queries) == []
    assert any("webhook_endpoints_active" in q["sql"] for q in queries.captured_queries)
    assert WebhookDelivery.objects.count() == 0


def test_an_event_trusts_its_steps_read_of_the_endpoints_only_for_a_moment(
    acme, alice, aws_account, receiver, monkeypatch
):
    from marketplace.orders.services import PlaceRequest, order_place

    offer = aws_account.offers.filter(instance_type="g5.xlarge").order_by("price_usd").first()
    placed = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    read = with_endpoints(Order.objects.filter(pk=placed.pk))
    _endpoint(acme, alice, receiver.url())  # created after the step read its row

    assert endpoints_known(read) is False
    order_event_emit(order=read, previous="placed")
    assert WebhookDelivery.objects.count() == 0  # the row was read before the endpoint existed

    monkeypatch.setattr(webhook_services, "ENDPOINTS_TRUSTED_S", 0.0)  # a step that outlasted the window
    assert endpoints_known(read) is None
    order_event_emit(order=read, previous="placed")
    assert list(WebhookDelivery.objects.values_list("event_type", flat=True)) == ["order.placed"]
    # A row read any other way never answers for its endpoints.
    assert endpoints_known(Order.objects.get(pk=placed.pk)) is None


def test_an_endpoint_receives_only_the_events_it_subscribed_to(acme, alice, receiver, closed_port):
    only_running = _endpoint(acme, alice, receiver.url(), events=["order.running"]).endpoint
    everything = _endpoint(acme, alice, f"http://127.0.0.1:{closed_port}/").endpoint

    webhook_event_emit(organization_id=acme.pk, event_type="order.placed", data={"order": "x"})
    webhook_event_emit(organization_id=acme.pk, event_type="order.running", data={"order": "x"})

    assert list(only_running.deliveries.values_list("event_type", flat=True)) == ["order.running"]
    assert sorted(everything.deliveries.values_list("event_type", flat=True)) == ["order.placed", "order.running"]


def test_a_stranger_organisation_gets_no_events(acme, alice, charlie, receiver):
    from marketplace.orders.selectors import buyer_organization

    _endpoint(buyer_organization(charlie), charlie, receiver.url())

    assert webhook_event_emit(organization_id=acme.pk, event_type="order.placed", data={}) == []
    assert WebhookDelivery.objects.count() == 0


def test_a_rolled_back_transition_sends_nothing(acme, alice, aws_account, receiver, django_capture_on_commit_callbacks):
    from marketplace.orders.services import PlaceRequest, order_place

    offer = aws_account.offers.filter(instance_type="g5.xlarge").order_by("price_usd").first()
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    _endpoint(acme, alice, receiver.url())

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                order_transition(order=order, to=OrderState.CANCELLED, reason="changed my mind")
                assert WebhookDelivery.objects.count() == 1  # queued inside the transaction...
                raise RuntimeError("the surrounding change fails")

    assert WebhookDelivery.objects.count() == 0  # ...and gone with it
    assert callbacks == []
    assert receiver.requests == []
    assert Order.objects.get(pk=order.pk).state == OrderState.PLACED


# --- Retries ---------------------------------------------------------------------------------------------------


def _due(now):
    return webhook_deliveries_due(now=now)


def test_a_failing_receiver_is_retried_on_the_backoff_schedule(acme, alice, receiver):
    receiver.script = [500, 500, 200]
    delivery = _ping(_endpoint(acme, alice, receiver.url()).endpoint)
    t0 = timezone.now()

    assert webhook_deliver(delivery_id=delivery.pk, now=t0) == DeliveryState.PENDING
    delivery.refresh_from_db()
    first_wait = (delivery.next_attempt_at - t0).total_seconds()
    assert RETRY_DELAYS_S[0] <= first_wait <= RETRY_DELAYS_S[0] * 1.2
    assert _due(t0 + dt.timedelta(seconds=RETRY_DELAYS_S[0] - 1)) == []
    t1 = t0 + dt.timedelta(seconds=RETRY_DELAYS_S[0] * 1.2 + 1)
    assert _due(t1) == [delivery.pk]

    assert webhook_deliver(delivery_id=delivery.pk, now=t1) == DeliveryState.PENDING
    delivery.refresh_from_db()
    assert RETRY_DELAYS_S[1] <= (delivery.next_attempt_at - t1).total_seconds() <= RETRY_DELAYS_S[1] * 1.2
    assert _due(t1 + dt.timedelta(seconds=RETRY_DELAYS_S[1] - 1)) == []
    assert webhook_deliver(delivery_id=delivery.pk, now=t1 + dt.timedelta(seconds=RETRY_DELAYS_S[1] - 1)) == "skipped"
    t2 = t1 + dt.timedelta(seconds=RETRY_DELAYS_S[1] * 1.2 + 1)

    assert webhook_deliver(delivery_id=delivery.pk, now=t2) == DeliveryState.DELIVERED

    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.delivered_at) == (DeliveryState.DELIVERED, 3, t2)
    log = list(delivery.attempt_log.values_list("number", "status_code", "at"))
    assert log == [(1, 500, t0), (2, 500, t1), (3, 200, t2)]
    assert len(receiver.requests) == 3
    assert len({r["headers"]["Broker-Delivery"] for r in receiver.requests}) == 1  # one event, three tries
    assert _due(t2 + dt.timedelta(days=30)) == []
    assert WebhookEndpoint.objects.get(pk=delivery.endpoint_id).consecutive_failures == 0


def test_a_receiver_that_never_answers_times_out_and_is_retried(acme, alice, monkeypatch):
    monkeypatch.setattr(sending, "TIMEOUT_S", 0.3)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog, but nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        delivery = _ping(_endpoint(acme, alice, url).endpoint)
        started = time.monotonic()

        assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.PENDING

        assert time.monotonic() - started < 3
    finally:
        silent.close()
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code is None
    assert attempt.error.startswith("timeout: no answer within 0.3 s")
    assert attempt.duration_ms >= 300


def test_a_receiver_that_is_down_is_retried(acme, alice, closed_port):
    delivery = _ping(_endpoint(acme, alice, f"http://127.0.0.1:{closed_port}/").endpoint)

    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.PENDING

    delivery.refresh_from_db()
    (attempt,) = delivery.attempt_log.all()
    assert attempt.status_code is None and attempt.error.startswith("connection failed")
    assert delivery.next_attempt_at > timezone.now()


def test_a_redirect_is_not_followed_and_counts_as_a_failure(acme, alice, receiver):
    receiver.script = [("redirect", receiver.url("/elsewhere"))]
    delivery = _ping(_endpoint(acme, alice, receiver.url()).endpoint)

    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.PENDING

    assert [r["path"] for r in receiver.requests] == ["/hooks"]
    assert list(delivery.attempt_log.values_list("status_code", flat=True)) == [302]


def _drive_to_the_end(delivery_id: int, start: dt.datetime) -> dt.datetime:
    now = start
    for _ in range(MAX_ATTEMPTS):
        webhook_deliver(delivery_id=delivery_id, now=now)
        now += dt.timedelta(days=2)
    return now


def test_a_delivery_is_dead_after_the_last_attempt(acme, alice, receiver):
    receiver.script = [500] * 20
    delivery = _ping(_endpoint(acme, alice, receiver.url()).endpoint)

    end = _drive_to_the_end(delivery.pk, timezone.now())

    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == (DeliveryState.DEAD, MAX_ATTEMPTS)
    assert list(delivery.attempt_log.values_list("status_code", flat=True)) == [500] * MAX_ATTEMPTS
    assert len(receiver.requests) == MAX_ATTEMPTS
    assert _due(end + dt.timedelta(days=30)) == []
    assert webhook_deliver(delivery_id=delivery.pk, now=end) == "skipped"
    endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
    assert (endpoint.active, endpoint.consecutive_failures) == (True, 1)


def test_an_endpoint_is_disabled_after_too_many_dead_deliveries(acme, alice, closed_port):
    endpoint = _endpoint(acme, alice, f"http://127.0.0.1:{closed_port}/").endpoint
    deliveries = [_ping(endpoint) for _ in range(DISABLE_AFTER_DEAD + 1)]
    now = timezone.now()

    for delivery in deliveries[:DISABLE_AFTER_DEAD]:
        now = _drive_to_the_end(delivery.pk, now)

    endpoint.refresh_from_db()
    assert endpoint.active is False
    assert endpoint.consecutive_failures == DISABLE_AFTER_DEAD
    assert endpoint.disabled_reason.startswith(f"disabled after {DISABLE_AFTER_DEAD} dead deliveries in a row")
    left = WebhookDelivery.objects.get(pk=deliveries[-1].pk)
    assert (left.state, left.attempts) == (DeliveryState.DEAD, 0)  # given up, never sent
    assert webhook_event_emit(organization_id=acme.pk, event_type="order.placed", data={}) == []


def test_the_sweep_task_sends_what_is_due_and_nothing_twice(acme, alice, receiver):
    endpoint = _endpoint(acme, alice, receiver.url()).endpoint
    first, second = _ping(endpoint), _ping(endpoint)

    assert webhooks_sweep_task.delay().get() == 2
    assert webhooks_sweep_task.delay().get() == 0

    assert len(receiver.requests) == 2
    assert {r["headers"]["Broker-Delivery"] for r in receiver.requests} == {str(first.event_id), str(second.event_id)}


def test_a_delivery_claimed_by_a_worker_is_not_sent_again_by_the_sweep(acme, alice, receiver):
    delivery = _ping(_endpoint(acme, alice, receiver.url()).endpoint)
    now = timezone.now()
    # A worker claimed it (its lease pushed the due time ahead) and crashed before recording anything.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=now + dt.timedelta(minutes=5))

    assert _due(now) == []
    assert _due(now + dt.timedelta(minutes=5)) == [delivery.pk]  # the lease ran out: sent again, not lost


# --- Where a webhook may point --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9000/hooks", "https://localhost/hooks?x=1", "http://[::1]:8080/", "http://LOCALHOST:1/"],
)
def test_loopback_urls_are_accepted_in_development_and_tests(url):
    assert destination_check(url).address in ("127.0.0.1", "::1")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://example.com/hooks", "not allowed"),
        ("https://8.8.8.8/", "not allowed"),
        ("http://10.0.0.1/", "not allowed"),
        ("http://127.0.0.2/", "not allowed"),
        ("http://0.0.0.0:8000/", "not allowed"),
        ("http://localhost.example.com/", "not allowed"),
        ("ftp://127.0.0.1/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("javascript:alert(1)", "http:// or https://"),
        ("127.0.0.1:8000/hooks", "http:// or https://"),
        ("http://user:pw@127.0.0.1/", "user name or password"),
        ("http:///nohost", "names no host"),
        ("http://127.0.0.1:99999/", "malformed"),
        ("http://127.0.0.1/a b", "printable ASCII"),
        ("", "give the URL"),
    ],
)
def test_other_urls_are_refused_with_the_reason(url, says):
    with pytest.raises(WebhookUrlRefused, match=says):
        destination_check(url)


def test_a_refused_url_is_named_as_the_url_field(acme, alice):
    with pytest.raises(WebhookInvalid) as refused:
        webhook_endpoint_create(organization=acme, user=alice, url="http://169.254.169.254/latest/meta-data")

    assert refused.value.field == "url"
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "[::1]",
        "localhost",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "[fe80::1]",
        "[fc00::1]",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::a00:1]",
        "0.0.0.0",  # noqa: S104 - a destination that must be refused; nothing binds to it
        "224.0.0.1",
    ],
)
def test_production_refuses_loopback_private_and_link_local_addresses(host, monkeypatch):
    monkeypatch.setattr(destinations, "_resolve", lambda name, port: ["127.0.0.1"])  # localhost, without DNS

    with override_settings(WEBHOOK_DESTINATIONS="public"), pytest.raises(WebhookUrlRefused, match="not allowed"):
        destination_check(f"https://{host}/hooks")


def test_production_refuses_a_name_that_resolves_to_a_private_address(monkeypatch):
    monkeypatch.setattr(destinations, "_resolve", lambda name, port: ["93.184.216.34", "10.0.0.7"])

    with override_settings(WEBHOOK_DESTINATIONS="public"), pytest.raises(WebhookUrlRefused, match=r"10\.0\.0\.7"):
        destination_check("https://hooks.example.test/")


def test_production_checks_again_at_send_time_against_dns_rebinding(acme, alice, receiver, monkeypatch):
    """The name resolved to a public address when registered and to this machine when sent: nothing is sent."""
    url = f"http://hooks.example.test:{receiver.port}/hooks"
    with override_settings(WEBHOOK_DESTINATIONS="public"):
        monkeypatch.setattr(destinations, "_resolve", lambda name, port: ["93.184.216.34"])
        checked = destination_check(url)
        assert (checked.address, checked.host, checked.netloc) == ("93.184.216.34", "hooks.example.test", url[7:-6])
        endpoint = _endpoint(acme, alice, url).endpoint
        delivery = _ping(endpoint)
        # Rebound to loopback, where the receiver listens: a send that skipped the check would reach it.
        monkeypatch.setattr(destinations, "_resolve", lambda name, port: ["127.0.0.1"])

        assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.PENDING

    assert receiver.requests == []
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code is None
    assert attempt.error.startswith("not sent: the host hooks.example.test is not allowed")


def test_localhost_is_sent_to_127_0_0_1_with_its_name_in_the_host_header(acme, alice, receiver):
    delivery = _ping(_endpoint(acme, alice, f"http://localhost:{receiver.port}/hooks").endpoint)

    assert webhook_deliver(delivery_id=delivery.pk) == DeliveryState.DELIVERED

    assert receiver.requests[0]["headers"]["Host"] == f"localhost:{receiver.port}"


def test_an_unknown_event_type_is_refused(acme, alice, receiver):
    with pytest.raises(WebhookInvalid) as refused:
        _endpoint(acme, alice, receiver.url(), events=["order.running", "order.exploded"])

    assert refused.value.field == "events"
    assert not WebhookEndpoint(events=[]).subscribes(WebhookEventType.PING)


def _certificate(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed certificate for ``name`` and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.mark.parametrize(("certificate_for", "delivered"), [("localhost", True), ("other.example", False)])
def test_https_connects_to_the_checked_address_and_verifies_the_certificate_for_the_url_host(
    acme, alice, receiver, tmp_path, monkeypatch, certificate_for, delivered
):
    import ssl

    cert, key = _certificate(tmp_path, certificate_for)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    monkeypatch.setattr(sending, "CA_BUNDLE", cert)
    delivery = _ping(_endpoint(acme, alice, f"https://localhost:{receiver.port}/hooks").endpoint)

    state = webhook_deliver(delivery_id=delivery.pk)

    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    if delivered:
        assert (state, attempt.status_code) == (DeliveryState.DELIVERED, 200)
        assert receiver.requests[0]["headers"]["Host"] == f"localhost:{receiver.port}"
    else:
        assert (state, attempt.status_code) == (DeliveryState.PENDING, None)
        assert attempt.error.startswith("TLS error") and "localhost" in attempt.error
        assert receiver.requests == []
