"""Idempotency-Key on the creating POSTs: a retry gets the first answer, never a second thing."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.api.idempotency import idempotent_responses_expire
from marketplace.catalog.services import offers_ingest
from marketplace.models import IdempotentResponse, Quote
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes

OD = PricingModel.ON_DEMAND
BOOK = [
    ("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", OD, None),
    ("g4dn.xlarge", "T4", 1, 16, "0.526", "us-east-1", OD, None),
    ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "us-east-1", OD, 2),
]


@pytest.fixture
def book(db):
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    gpu_models_upsert(GpuModel)  # a transactional test before this one may have flushed the spec table
    account = ProviderAccountFactory(name="main")
    offers_ingest(account=account, quotes=listed_quotes(BOOK), now=timezone.now() - dt.timedelta(seconds=5))
    return account


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _post(client, path, body, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(path, data=json.dumps(body), content_type="application/json", **headers)


@pytest.mark.django_db
def test_a_retried_quote_gets_the_first_answer_and_creates_nothing(alice, book):
    api = _client(alice)
    first = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="q-1")
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    quotes = Quote.objects.count()
    again = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="q-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert Quote.objects.count() == quotes
    fresh = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="q-2")
    assert fresh.json()["batch"] != first.json()["batch"] and Quote.objects.count() == 2 * quotes
    unkeyed = [_post(api, "/api/v1/quotes", {"profile": "inference"}) for _ in range(2)]
    assert unkeyed[0].json()["batch"] != unkeyed[1].json()["batch"]


@pytest.mark.django_db
def test_a_key_reused_with_another_body_is_refused_and_changes_nothing(alice, book):
    api = _client(alice)
    _post(api, "/api/v1/quotes", {"profile": "inference"}, key="k")
    quotes = Quote.objects.count()
    clash = _post(api, "/api/v1/quotes", {"profile": "training"}, key="k")
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "idempotency_conflict" and "'k'" in clash.json()["error"]["message"]
    assert Quote.objects.count() == quotes and IdempotentResponse.objects.count() == 1


@pytest.mark.django_db
def test_a_refusal_is_not_remembered_so_the_corrected_retry_runs(alice, book):
    api = _client(alice)
    wrong = _post(api, "/api/v1/quotes", {"profile": "no-such-profile"}, key="fix-me")
    assert wrong.status_code == 400 and not IdempotentResponse.objects.exists()
    right = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="fix-me")
    assert right.status_code == 201 and "Idempotent-Replayed" not in right


@pytest.mark.django_db
def test_keys_belong_to_their_organisation(alice, charlie, book):
    mine = _post(_client(alice), "/api/v1/quotes", {"profile": "inference"}, key="shared")
    theirs = _post(_client(charlie), "/api/v1/quotes", {"profile": "inference"}, key="shared")
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs
    assert theirs.json()["batch"] != mine.json()["batch"]


@pytest.mark.django_db
def test_a_procurement_replays_too(alice, book):
    api = _client(alice)
    body = {"demands": [{"id": "a", "profile": "training", "gpu_count": 8}], "time_limit": 2}
    first = _post(api, "/api/v1/procurements", body, key="p")
    again = _post(api, "/api/v1/procurements", body, key="p")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json()["batch"] == first.json()["batch"]
    assert Quote.objects.filter(batch=first.json()["batch"]).count() == 1 == Quote.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/quotes", "/api/v1/procurements", "/api/v1/orders"])
def test_a_key_longer_than_255_characters_is_refused_by_name(alice, book, path):
    response = _post(_client(alice), path, {"profile": "inference"}, key="k" * 256)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_answers_are_forgotten_after_the_keep_window(alice, book, settings):
    settings.IDEMPOTENCY_KEEP_HOURS = 24
    api = _client(alice)
    first = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="old")
    assert idempotent_responses_expire(now=timezone.now() + dt.timedelta(hours=23)) == 0
    assert idempotent_responses_expire(now=timezone.now() + dt.timedelta(hours=25)) == 1
    later = _post(api, "/api/v1/quotes", {"profile": "inference"}, key="old")
    assert later.status_code == 201 and later.json()["batch"] != first.json()["batch"]


@pytest.mark.django_db(transaction=True)
def test_racing_retries_with_one_key_create_one_quote_batch(alice, book):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    barrier, answers = threading.Barrier(6), []

    def retry():
        try:
            barrier.wait()
            answers.append(_post(_client(alice), "/api/v1/quotes", {"profile": "inference"}, key="race"))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [201] * 6
    assert len({a.json()["batch"] for a in answers}) == 1 and answers[0].json()["quotes"]
    assert sum(1 for a in answers if "Idempotent-Replayed" not in a) == 1
    assert Quote.objects.values("batch").distinct().count() == 1


@pytest.mark.django_db
def test_a_retried_webhook_registration_makes_one_webhook_and_keeps_its_secret_out_of_the_store(alice):
    from marketplace.models import WebhookEndpoint

    api = _client(alice)
    body = {"url": "http://127.0.0.1:9/hook", "description": "ci"}
    first = _post(api, "/api/v1/webhooks", body, key="wh-1")
    again = _post(api, "/api/v1/webhooks", body, key="wh-1")
    assert first.status_code == again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert WebhookEndpoint.objects.count() == 1
    secret = first.json()["secret"]
    assert secret and again.json() == first.json() and again["Cache-Control"] == "no-store"
    stored = IdempotentResponse.objects.get(operation="webhooks.create")
    assert secret not in json.dumps(stored.body)


@pytest.mark.django_db
def test_a_retried_ping_queues_one_delivery(alice):
    from marketplace.models import WebhookDelivery

    api = _client(alice)
    hook = _post(api, "/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"}).json()
    pings = [_post(api, f"/api/v1/webhooks/{hook['id']}/ping", {}, key="p-1") for _ in range(2)]
    assert [p.status_code for p in pings] == [202, 202] and pings[1]["Idempotent-Replayed"] == "true"
    assert WebhookDelivery.objects.filter(event_type="ping").count() == 1
