"""Hardening: secure headers and a content security policy on every page, sign-in throttling, deploy checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", "/login/", "/provider/signup", "/api/v1/ledger/key"])
def test_every_page_carries_the_security_headers(client, path):
    response = client.get(path)
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-eval" not in policy
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


@pytest.mark.parametrize(
    ("api_base", "origin"),
    [
        ("", "https://checkout.stripe.com https://connect.stripe.com"),
        ("https://api.stripe.com", "https://checkout.stripe.com https://connect.stripe.com"),
        ("http://127.0.0.1:8111", "http://127.0.0.1:8111"),
        ("ftp://odd.example", "https://checkout.stripe.com https://connect.stripe.com"),
    ],
)
def test_forms_may_lead_to_stripes_pages_and_nowhere_else(client, settings, api_base, origin):
    # Chromium checks form-action on the redirect a form's answer makes, so the top-up form needs Stripe's card
    # page and the payouts onboarding form Connect's.
    settings.STRIPE_API_BASE = api_base
    policy = client.get("/healthz")["Content-Security-Policy"]
    assert f"form-action 'self' {origin};" in policy


@pytest.mark.django_db
def test_sign_in_is_throttled_after_repeated_failures(client, alice, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    cache.clear()
    alice.set_password("right-password-42")
    alice.save()
    for _ in range(3):
        assert client.post("/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    refused = client.post("/login/", {"username": "alice", "password": "right-password-42"})
    assert refused.status_code == 429 and "Too many failed sign-ins" in refused.content.decode()
    assert refused["Retry-After"] == str(settings.LOGIN_FAILURE_WINDOW_S)
    cache.clear()
    assert client.post("/login/", {"username": "alice", "password": "right-password-42"}).status_code == 302


def test_production_settings_pass_the_deploy_checks(tmp_path):
    env = {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "SECRET_KEY": "a-long-random-production-secret-key-for-the-deploy-check-0123456789",
        "BROKER_PUBLIC_URL": "https://broker.example",
        "BROKER_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "broker.settings",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the browser tests' process-wide allowance is no deployment's
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
