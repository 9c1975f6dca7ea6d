"""The client against a real broker: pytest-django's live server, the AWS sandbox, alice's scoped token.

The client is its own package (client/); when the virtualenv has not installed it yet, it is imported from
the source tree, as the CLI subprocesses are.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"
try:
    import brokerclient  # noqa: F401
except ImportError:  # pragma: no cover - bin/bootstrap installs it
    sys.path.insert(0, str(CLIENT_DIR))

from brokerclient import BrokerClient  # noqa: E402

ALL_SCOPES = ["offers:read", "orders:place", "instances:manage", "ledger:read"]


@pytest.fixture
def token(acme, alice) -> str:
    from marketplace.api.tokens import api_token_create

    return api_token_create(organization=acme, user=alice, name="client-tests", scopes=ALL_SCOPES).raw


@pytest.fixture
def broker(live_server, token, machines_phone_home) -> Iterator[BrokerClient]:
    """The client on the live server; the machines it orders boot and phone home by themselves."""
    with BrokerClient(live_server.url, token, timeout=30, retries=2, backoff=0.05) as client:
        yield client


@pytest.fixture
def t4_offer(aws_account):
    """The cheapest on-demand T4 in the sandbox, and a price cap just above it."""
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    return offer, offer.price_usd + Decimal("0.01")
