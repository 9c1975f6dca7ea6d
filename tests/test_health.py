"""Liveness and readiness probes (issue 23, point 5): the real database, broker and cache of the run."""

from __future__ import annotations

import pytest

from broker import health
from broker.celery import app as celery_app

pytestmark = pytest.mark.django_db


def test_liveness_answers_without_touching_anything(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        answer = client.get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "alive"}
    assert "no-cache" in answer["Cache-Control"]


def test_readiness_checks_the_database_the_task_broker_and_the_cache(client):
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "task_broker", "cache"}
    assert all(check["ok"] for check in body["checks"].values())


def test_a_broker_that_cannot_be_reached_makes_the_node_not_ready_without_saying_where(client, settings, monkeypatch):
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:9/"  # the discard port: nothing listens
    # On the embedded defaults the app is bound to the filesystem transport, which would ignore the URL's scheme.
    monkeypatch.setitem(celery_app.conf, "broker_transport", None)
    answer = client.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "not ready" and body["checks"]["task_broker"]["ok"] is False
    assert body["checks"]["database"]["ok"] is True
    assert "127.0.0.1" not in answer.content.decode() and "guest" not in answer.content.decode()
    assert health.CHECK_TIMEOUT_S <= 5
