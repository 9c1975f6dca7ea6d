"""The webhooks page in the browser: register a receiver on 127.0.0.1, copy the secret shown once, send a ping,
and read the delivery log with its attempt; the receiver checks the signature with that secret."""

from __future__ import annotations

import pytest

from marketplace.webhooks.signing import signature_verify
from tests.browser.conftest import shoot, sign_in
from tests.marketplace.test_webhooks import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.stop()


def test_register_a_webhook_ping_it_and_read_the_delivery_log(page, live_server, alice, receiver):
    sign_in(page, live_server.url, alice)

    page.goto(f"{live_server.url}/webhooks/")
    page.fill("input[name=url]", receiver.url("/broker-events"))
    page.fill("input[name=description]", "ops alerts")
    page.click("text=Create webhook")
    secret = page.locator("#webhook-secret").inner_text().strip()
    assert secret
    shoot(page, "webhooks-1-created")
    page.goto(f"{live_server.url}/webhooks/")
    assert secret not in page.content()  # shown once

    page.click("#webhooks >> text=Deliveries")
    page.click("text=Send a ping")
    assert "delivered" in page.inner_text("body") and "HTTP 200" in page.inner_text("body")
    shoot(page, "webhooks-2-delivery-log")

    (ping,) = receiver.requests
    headers = ping["headers"]
    assert headers["Broker-Event"] == "ping"
    assert signature_verify(secret, str(headers["Broker-Signature"]), bytes(ping["body"]))  # type: ignore[arg-type]

    page.click("text=Rotate secret")
    rotated = page.locator("#webhook-secret").inner_text().strip()
    assert rotated.startswith("whsec_") and rotated != secret
    shoot(page, "webhooks-3-secret-rotated")
    page.click("text=Send a ping")
    second = receiver.requests[-1]
    signed = str(second["headers"]["Broker-Signature"])
    assert signed.count("v1=") == 2  # the old and the new secret both sign during the overlap
    assert signature_verify(rotated, signed, bytes(second["body"]))  # type: ignore[arg-type]
    assert signature_verify(secret, signed, bytes(second["body"]))  # type: ignore[arg-type]
    page.click("text=Pause")
    assert "paused by the organisation" in page.inner_text("body")
    page.click("text=Switch on again")
    assert "Active" in page.inner_text("body")
