"""Ordering through the storefront's pages, as a buyer's browser does (configure, confirm), for tests."""

from __future__ import annotations

import re

from django.test import Client

from marketplace.models import Offer


def order_from_the_page(client: Client, offer: Offer) -> str:
    """Configure (just the machine, the organisation's keys, for an hour) and confirm; the confirmation's nonce,
    which ``POST /orders/place`` takes to place the order."""
    page = client.get(f"/orders/new?offer={offer.pk}").content.decode()
    nonce = re.search(r'name="nonce" value="([^"]+)"', page).group(1)
    keys = re.findall(r'name="ssh_keys" value="([^"]+)" checked', page)
    configured = client.post(
        "/orders/new",
        {"offer": offer.pk, "nonce": nonce, "duration_hours": "1", "ssh_keys": keys, "workload_kind": "none",
         "access": "mine", "allow_failover": "on", "env_rows": "0"},
    )  # fmt: skip
    assert configured.status_code == 302
    confirm = client.get(configured["Location"]).content.decode()
    assert 'action="/orders/place"' in confirm
    return nonce
