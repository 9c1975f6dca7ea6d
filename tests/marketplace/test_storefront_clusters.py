"""The storefront's side of multi-node jobs (issue 20, point 4): the workload form asks for machines, the quotes
show the group, ordering one places a cluster, and its page shows every node; plus the workload form's deadline
and a fixed-work quote's hours not prefilled as the run time."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from marketplace.models import Cluster, ClusterState, Order, Quote, SshKey
from tests.leases import boot_if_launched
from tests.marketplace.test_clusters import INSTANCE_TYPE
from tests.marketplace.test_storefront_launch import _nonce, _text

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def _quotes(browser: Client, **fields: object) -> tuple[str, list[Quote]]:
    form = {"profile": "inference", "duration_hours": "3", "interruption_tolerance": "checkpointed", **fields}
    page = browser.post("/workload/", form)
    assert page.status_code == 200
    return page.content.decode(), list(Quote.objects.order_by("-created_at", "rank"))


def _order_quote(browser: Client, quote: Quote, capture, **fields: object):
    page = browser.get(f"/orders/new?quote={quote.public_id}").content.decode()
    key = SshKey.objects.get(name="alice@laptop")
    form = {"quote": str(quote.public_id), "nonce": _nonce(page), "duration_hours": "3",
            "ssh_keys": [str(key.public_id)], "workload_kind": "none", "access": "mine", "allow_failover": "on",
            "env_rows": "0", **fields}  # fmt: skip
    configured = browser.post("/orders/new", form)
    assert configured.status_code == 302, _text(configured.content.decode())
    confirm = browser.get(configured["Location"])
    nonce = _nonce(confirm.content.decode())
    with capture(execute=True):
        placed = browser.post("/orders/place", {"nonce": nonce})
    return confirm, placed, nonce


def test_a_buyer_asks_for_two_machines_orders_the_group_and_follows_its_nodes(
    browser, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    page, quotes = _quotes(browser, gpu_count="4", nodes="2", max_price_per_hour="")
    best = quotes[0]
    assert best.demand["nodes"] == 2 and best.offer.instance_type == INSTANCE_TYPE
    text = _text(page)
    assert f"2 machines \u00d7 {INSTANCE_TYPE}" in text
    assert "2 machines in one zone, priced and launched as one (all or nothing)" in text

    configure = _text(browser.get(f"/orders/new?quote={best.public_id}").content.decode())
    assert "2 machines \u00d7 4\u00d7 A10G" in configure and "for all 2 machines" in configure
    confirm, placed, nonce = _order_quote(browser, best, django_capture_on_commit_callbacks)
    assert "2 machines \u00d7 4\u00d7 A10G" in _text(confirm.content.decode())

    cluster = Cluster.objects.get()
    assert placed["Location"] == f"/clusters/{cluster.public_id}/"
    assert (cluster.nodes, cluster.quote_id, cluster.idempotency_key) == (2, best.pk, nonce)
    # The same confirmation sent again leads to the same cluster, not a second one
    again = browser.post("/orders/place", {"nonce": nonce})
    assert again["Location"] == placed["Location"] and Cluster.objects.count() == 1

    for order in Order.objects.filter(cluster=cluster):
        with django_capture_on_commit_callbacks(execute=True):
            boot_if_launched(order, aws_sandbox)
    shown = browser.get(placed["Location"]).content.decode()
    text = _text(shown)
    assert f"Cluster {str(cluster.public_id)[:8]} running" in text and "2 \u00d7 4\u00d7 A10G" in text
    # Each amount names its currency once (issue 35: the page showed "USD USD")
    assert "USD USD" not in text and "for the group, USD" not in text and text.count(" USD") == 3
    assert len(re.findall(r'href="/orders/[0-9a-f-]+/"', shown)) == 2
    # Each node's own page, and the orders list, lead back to the cluster
    node = Order.objects.get(cluster=cluster, cluster_node=2)
    cluster_link = f'href="/clusters/{cluster.public_id}/"'
    assert cluster_link in browser.get(f"/orders/{node.public_id}/").content.decode()
    assert "Node 2 of a 2-machine job" in _text(browser.get(f"/orders/{node.public_id}/").content.decode())
    assert browser.get("/orders/").content.decode().count(cluster_link) == 2
    assert Cluster.objects.get().state == ClusterState.RUNNING

    with django_capture_on_commit_callbacks(execute=True):
        ended = browser.post(f"/clusters/{cluster.public_id}/terminate")
    assert ended.status_code == 302
    assert Cluster.objects.get().state == ClusterState.TERMINATED


def test_a_stranger_gets_404_on_a_clusters_pages_and_changes_nothing(
    browser, charlie, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    _, quotes = _quotes(browser, gpu_count="4", nodes="2")
    _order_quote(browser, quotes[0], django_capture_on_commit_callbacks)
    cluster = Cluster.objects.get()
    stranger = Client()
    stranger.force_login(charlie)

    assert stranger.get(f"/clusters/{cluster.public_id}/").status_code == 404
    assert stranger.post(f"/clusters/{cluster.public_id}/terminate").status_code == 404
    assert stranger.get("/clusters/not-a-uuid/").status_code == 404
    assert Cluster.objects.get().state == ClusterState.PROVISIONING


def test_the_workload_form_takes_a_deadline_and_refuses_one_shorter_than_fixed_hours(browser, aws_account):
    refused, _ = _quotes(browser, deadline_hours="2")
    assert "at least the 3 hours asked for" in _text(refused)
    assert Quote.objects.count() == 0

    page, quotes = _quotes(browser, deadline_hours="5")
    assert quotes and all(q.demand["deadline_hours"] == 5.0 for q in quotes)
    assert "finished within 5.0 h" in _text(page)


def test_a_fixed_work_quotes_estimated_hours_are_not_prefilled_as_the_run_time(browser, aws_account):
    _, quotes = _quotes(browser, profile="fine_tuning")
    work = quotes[0]
    assert work.demand["amount"] == "work"

    page = browser.get(f"/orders/new?quote={work.public_id}").content.decode()

    assert re.search(r'name="duration_hours"[^>]*value=""', page)
    assert f"estimated at {work.duration_hours} h on this offer" in _text(page)
    _, rentals = _quotes(browser)
    rental = rentals[0]
    assert rental.demand["amount"] == "duration"
    assert re.search(
        rf'name="duration_hours"[^>]*value="{rental.duration_hours}"',
        browser.get(f"/orders/new?quote={rental.public_id}").content.decode(),
    )
