"""Sign-in throttling against a hostile guesser: every login form, concurrent guesses, the client behind the TLS
proxy, and one attacker unable to lock a user out from everywhere (issue 17, item 6)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from rest_framework.test import APIClient

from marketplace.clients import client_address

pytestmark = pytest.mark.django_db

WRONG = {"username": "alice", "password": "not-her-password"}
RIGHT_PASSWORD = "right-password-42"


class _Gate:
    """Where the password checks of the concurrency test wait: each one that arrives is counted, and none
    finishes until the test opens the gate."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.changed = threading.Condition()
        self.arrived = 0
        self.answered = 0


GATE = _Gate()


class GatedBackend(ModelBackend):
    """A real authentication backend (configured through AUTHENTICATION_BACKENDS) whose password check blocks
    on the gate, so that concurrent attempts are all inside the login view at once."""

    def authenticate(self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any):
        with GATE.changed:
            GATE.arrived += 1
            GATE.changed.notify_all()
        GATE.opened.wait(timeout=60)
        return super().authenticate(request, username=username, password=password, **kwargs)


@pytest.fixture(autouse=True)
def _fresh_counts():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def alice_password(alice):
    alice.set_password(RIGHT_PASSWORD)
    alice.save()
    return RIGHT_PASSWORD


def _login_routes() -> list[str]:
    """Every route whose view checks a password: Django's LoginView (the site's, the admin's) wherever it is."""
    from django.contrib.admin.sites import AdminSite
    from django.contrib.auth.views import LoginView

    found: list[str] = []

    def walk(patterns: list, prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
                continue
            assert isinstance(pattern, URLPattern)
            callback = pattern.callback
            view_class = getattr(callback, "view_class", None)
            wrapped = getattr(callback, "__wrapped__", None)
            is_login = (view_class is not None and issubclass(view_class, LoginView)) or (
                getattr(callback, "__func__", None) is AdminSite.login
                or getattr(wrapped, "__func__", None) is AdminSite.login
                or issubclass(getattr(wrapped, "view_class", object), LoginView)
            )
            if is_login:
                found.append("/" + route)

    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


def test_every_login_route_is_throttled():
    routes = _login_routes()
    assert "/login/" in routes and "/admin/login/" in routes
    # The route that answers each path (the first match) is the throttled one.
    unthrottled = [route for route in routes if not getattr(resolve(route).func, "login_throttled", False)]
    assert unthrottled == []


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_each_login_form_refuses_guesses_past_the_limit(client, alice_password, settings, path):
    settings.LOGIN_FAILURE_LIMIT = 3
    tries = [client.post(path, WRONG).status_code for _ in range(3)]
    refused = client.post(path, {"username": "alice", "password": alice_password})
    assert tries == [200, 200, 200]
    assert refused.status_code == 429
    assert refused["Retry-After"] == str(settings.LOGIN_FAILURE_WINDOW_S)
    assert "Too many failed sign-ins" in refused.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_admin_login_still_signs_staff_in(client, alice, alice_password):
    alice.is_staff = True
    alice.save()
    assert client.get("/admin/login/").status_code == 200
    signed_in = client.post("/admin/login/", {"username": "alice", "password": alice_password, "next": "/admin/"})
    assert signed_in.status_code == 302 and signed_in["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_the_site_and_the_admin_share_one_count(client, alice_password, settings):
    settings.LOGIN_FAILURE_LIMIT = 4
    statuses = [client.post(path, WRONG).status_code for path in ["/login/", "/admin/login/"] * 2]
    assert statuses == [200, 200, 200, 200]
    assert client.post("/admin/login/", WRONG).status_code == 429
    assert client.post("/login/", WRONG).status_code == 429


@pytest.mark.django_db(transaction=True)
def test_concurrent_wrong_guesses_reach_the_password_check_only_up_to_the_limit(settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.AUTHENTICATION_BACKENDS = [f"{__name__}.GatedBackend"]
    threads_n = 8
    GATE.opened.clear()
    GATE.arrived = GATE.answered = 0
    start = threading.Barrier(threads_n)
    statuses: list[int] = []

    def guess(i: int) -> None:
        start.wait()
        status = Client().post("/login/", {"username": "alice", "password": f"guess-{i}"}).status_code
        with GATE.changed:
            statuses.append(status)
            GATE.answered += 1
            GATE.changed.notify_all()

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    try:
        # Every attempt has either reached the password check (held there) or been answered without one.
        with GATE.changed:
            assert GATE.changed.wait_for(lambda: GATE.arrived + GATE.answered == threads_n, timeout=60)
            checked = GATE.arrived
    finally:
        GATE.opened.set()
        for thread in threads:
            thread.join(timeout=60)
    assert checked == 3
    assert sorted(statuses) == [200] * 3 + [429] * 5


def test_a_successful_sign_in_forgives_its_own_failures(client, alice_password, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    assert [client.post("/login/", WRONG).status_code for _ in range(2)] == [200, 200]
    assert client.post("/login/", {"username": "alice", "password": alice_password}).status_code == 302
    client.logout()
    assert [client.post("/login/", WRONG).status_code for _ in range(3)] == [200, 200, 200]
    assert client.post("/login/", WRONG).status_code == 429


def test_one_attacker_cannot_lock_a_user_out_from_elsewhere(alice_password, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_ACCOUNT = 8
    attacker = Client(REMOTE_ADDR="203.0.113.66")
    assert [attacker.post("/login/", WRONG).status_code for _ in range(10)] == [200] * 3 + [429] * 7
    # Refused guesses took no place in alice's account-wide count: she signs in from home.
    home = Client(REMOTE_ADDR="198.51.100.7")
    assert home.post("/login/", {"username": "alice", "password": alice_password}).status_code == 302


def test_many_places_guessing_one_account_hit_the_looser_account_limit(alice_password, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_ACCOUNT = 6
    for host in (1, 2):
        bot = Client(REMOTE_ADDR=f"203.0.113.{host}")
        assert [bot.post("/login/", WRONG).status_code for _ in range(3)] == [200] * 3
    third = Client(REMOTE_ADDR="203.0.113.3")
    assert third.post("/login/", WRONG).status_code == 429
    # Other accounts are untouched.
    assert third.post("/login/", {"username": "bob", "password": "x"}).status_code == 200


def test_one_address_guessing_many_names_hits_the_address_limit(settings):
    settings.LOGIN_FAILURE_LIMIT_ADDRESS = 4
    sprayer = Client(REMOTE_ADDR="203.0.113.9")
    statuses = [sprayer.post("/login/", {"username": f"user{i}", "password": "x"}).status_code for i in range(6)]
    assert statuses == [200] * 4 + [429] * 2
    assert Client(REMOTE_ADDR="203.0.113.10").post("/login/", WRONG).status_code == 200


def test_an_ipv6_guesser_cannot_rotate_addresses_within_its_64(settings):
    settings.LOGIN_FAILURE_LIMIT_ADDRESS = 3
    statuses = [
        Client(REMOTE_ADDR=f"2001:db8:1:2::{i:x}").post("/login/", {"username": f"u{i}", "password": "x"}).status_code
        for i in range(1, 5)
    ]
    assert statuses == [200, 200, 200, 429]


def test_behind_the_proxy_each_client_has_its_own_count(alice_password, settings):
    settings.TRUSTED_PROXY_HOPS = 1
    settings.LOGIN_FAILURE_LIMIT = 3
    proxy = "10.0.0.2"
    mallory = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.66")
    assert [mallory.post("/login/", WRONG).status_code for _ in range(4)] == [200, 200, 200, 429]
    # Made-up entries left of the proxy's own do not give mallory a fresh count.
    spoofed = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="192.0.2.1, 203.0.113.66")
    assert spoofed.post("/login/", WRONG).status_code == 429
    alice_at_home = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert alice_at_home.post("/login/", {"username": "alice", "password": alice_password}).status_code == 302


@pytest.mark.parametrize(
    ("hops", "forwarded", "expected"),
    [
        (0, "203.0.113.5", "10.0.0.2"),  # no trusted proxy: the header is the client's to make up
        (1, "203.0.113.5", "203.0.113.5"),
        (1, "192.0.2.1, 203.0.113.5", "203.0.113.5"),
        (1, " 192.0.2.1 ,203.0.113.5 ", "203.0.113.5"),
        (2, "192.0.2.1, 203.0.113.5, 10.0.0.9", "203.0.113.5"),
        (2, "203.0.113.5", "10.0.0.2"),  # shorter than the trusted chain
        (1, "", "10.0.0.2"),
        (1, "not-an-address", "10.0.0.2"),
        (1, "203.0.113.5, ", "10.0.0.2"),
        (1, "203.0.113.5:4711", "10.0.0.2"),
        (1, "2001:DB8::1", "2001:db8::1"),
        (1, "192.0.2.1, " * 10_000 + "203.0.113.5", "203.0.113.5"),
    ],
)
def test_the_client_address_trusts_only_the_configured_proxies(settings, hops, forwarded, expected):
    settings.TRUSTED_PROXY_HOPS = hops
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


def test_anonymous_api_callers_cannot_make_up_a_fresh_address(settings, throttle_mid_window):
    settings.API_RATES = {"read": "2/min"}
    statuses = [
        APIClient().get("/api/v1/ledger/key", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code for i in range(3)
    ]
    assert statuses == [200, 200, 429]


def test_anonymous_api_callers_behind_the_proxy_are_counted_apart(settings, throttle_mid_window):
    settings.API_RATES = {"read": "1/min"}
    settings.TRUSTED_PROXY_HOPS = 1
    first = APIClient(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.1")
    second = APIClient(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.2")
    assert [first.get("/api/v1/ledger/key").status_code for _ in range(2)] == [200, 429]
    assert second.get("/api/v1/ledger/key").status_code == 200
