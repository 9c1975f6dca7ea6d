"""The run command's last words (issue 21, point 4): where the broker is and every demo login with its page."""

from __future__ import annotations

from broker.devrun import banner, machines_line
from marketplace.demo import DEMO_BUYER, DEMO_CLUSTER_ADMIN, DEMO_PASSWORD, DEMO_PROVIDER_ADMIN, DEMO_STAFF


def test_the_banner_names_the_url_and_each_demo_login_with_where_to_go():
    text = banner(8123, "http://127.0.0.1:8701", "  anchors: local chain\n")

    lines = text.splitlines()
    assert "The broker is running at http://127.0.0.1:8123/" in text
    assert f"password {DEMO_PASSWORD}" in text
    for name, page in ((DEMO_BUYER, "/"), (DEMO_PROVIDER_ADMIN, "/provider/"), ("helga", "/provider/"),
                       (DEMO_CLUSTER_ADMIN, "/provider/"),
                       (DEMO_STAFF, "/admin/")):  # fmt: skip
        line = next(line for line in lines if line.strip().startswith(name + " "))
        assert line.endswith(f"http://127.0.0.1:8123{page}")
    assert lines[-1].startswith("=")  # the last line closes the box: nothing of it scrolls off below
    assert "Stripe" not in text  # payments pointed elsewhere (real keys): no sandbox to name


def test_the_banner_says_where_payments_go_when_it_is_the_stripe_sandbox():
    text = banner(8123, "http://127.0.0.1:8701", "", "http://127.0.0.1:8706")
    assert "Stripe sandbox at http://127.0.0.1:8706" in text and "http://127.0.0.1:8123/billing/" in text


def test_the_banner_says_whether_machines_are_real_containers_or_simulated():
    real = banner(8123, "http://127.0.0.1:8701", "", None, machines_line(""))
    simulated = banner(8123, "http://127.0.0.1:8701", "", None, machines_line("no Docker daemon answers"))
    assert "Machines are real containers (Docker): broker ssh ORDER gives a real shell" in real
    assert "Machines are simulated (SSH answers only its greeting): no lease containers, no Docker" in simulated


def test_the_banner_says_how_long_start_up_took_when_given():
    assert "running at http://127.0.0.1:8123/ (started in 41.3 s)" in banner(
        8123, "http://127.0.0.1:8701", "", started_in=41.26
    )
    assert "started in" not in banner(8123, "http://127.0.0.1:8701", "")
