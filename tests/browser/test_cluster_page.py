"""The cluster page keeps itself current (issue 36: it did not refresh itself): while the cluster is not final the
page redraws its state, reason and nodes from a fresh copy every few seconds, and stops once the cluster ends."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from marketplace.models import Cluster, ClusterState
from tests.browser.conftest import shoot, sign_in
from tests.marketplace.test_storefront_clusters import _order_quote, _quotes

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_cluster_page_follows_the_cluster_without_a_reload(
    page, live_server, alice, aws_account, django_capture_on_commit_callbacks
):
    client = Client()
    client.force_login(alice)
    _page, quotes = _quotes(client, gpu_count="4", nodes="2", max_price_per_hour="")
    _order_quote(client, quotes[0], django_capture_on_commit_callbacks)
    cluster = Cluster.objects.get()
    sign_in(page, live_server.url, alice)
    page.goto(f"{live_server.url}/clusters/{cluster.public_id}/")
    assert page.locator("#cluster-state").inner_text() == "provisioning"

    Cluster.objects.filter(pk=cluster.pk).update(
        state=ClusterState.FAILED, state_reason="every offer tried ran out of capacity", state_changed_at=timezone.now()
    )

    # No reload: the page's own script redraws it (the site's CSP allows no string evaluation, hence expect).
    expect(page.locator("#cluster-state")).to_have_text("failed", timeout=20_000)
    expect(page.locator("#cluster-reason")).to_have_text("every offer tried ran out of capacity")
    expect(page.locator("#cluster-live-note")).to_have_text("final")
    assert page.locator("#terminate-form").count() == 0
    shoot(page, "cluster-followed-to-failed")
