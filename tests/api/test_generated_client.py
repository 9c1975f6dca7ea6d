"""A client generated from the broker's OpenAPI schema can use the API (issue 36): openapi-python-client builds
one from /api/v1/schema into a temporary directory (nothing generated is kept), and through it a buyer builds a
launch configuration field by field, with typed models, and places an order with it on a live broker."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from marketplace.models import Order, SshKey

GENERATOR = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(GENERATOR is None, reason="openapi-python-client is a dev dependency: bin/bootstrap")
# The PDF invoice is bytes to a client; no hooks, so generation needs nothing but the generator.
CONFIG = {"content_type_overrides": {"application/pdf": "application/octet-stream"}, "post_hooks": []}


def _generated_client(base_url: str, where: Path):
    """Generate the client from the live schema and import it as the package ``broker_api``."""
    spec = requests.get(f"{base_url}/api/v1/schema", headers={"Accept": "application/json"}, timeout=30)
    spec.raise_for_status()
    (where / "openapi.json").write_text(spec.text)
    (where / "config.json").write_text(json.dumps(CONFIG))
    result = subprocess.run(
        [GENERATOR, "generate", "--path", "openapi.json", "--config", "config.json", "--meta", "none",
         "--output-path", "broker_api", "--fail-on-warning"],
        cwd=where, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module("broker_api")
    finally:
        sys.path.remove(str(where))


@pytest.mark.django_db(transaction=True)
def test_a_generated_client_places_an_order_with_a_launch_configuration(
    live_server, acme, alice, aws_account, tmp_path
):
    from marketplace.api.tokens import api_token_create

    # Given a client generated from the schema, and alice's token
    broker_api = _generated_client(live_server.url, tmp_path)
    from broker_api.api.orders import orders_create, orders_retrieve
    from broker_api.models import (
        LaunchConfiguration,
        LaunchEnvVar,
        LaunchWorkloadContainer,
        LaunchWorkloadContainerKind,
        OrderPlacedOutput,
        OrderPlaceInputRequest,
    )

    token = api_token_create(organization=acme, user=alice, name="generated", scopes=["orders:place"]).raw
    client = broker_api.AuthenticatedClient(base_url=live_server.url, token=token)
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    key = SshKey.objects.get(organization=acme)

    # When the buyer builds the launch configuration from the generated models and orders with it
    launch = LaunchConfiguration(
        workload=LaunchWorkloadContainer(
            kind=LaunchWorkloadContainerKind.CONTAINER,
            image="vllm/vllm-openai:v0.6.3",
            args=["--model", "facebook/opt-125m"],
            env=[LaunchEnvVar(name="MODE", value="serve"), LaunchEnvVar(name="HF_TOKEN", value="hf_x", secret=True)],
            ports=[8000],
        ),
        disk_gb=200,
        allowed_cidrs=["198.51.100.0/24"],
        ssh_keys=[key.public_id],
        spend_cap_usd="50",
    )
    body = OrderPlaceInputRequest(offer=offer.pk, max_price_per_hour=str(offer.price_usd), launch=launch)
    placed = orders_create.sync_detailed(client=client, body=body, idempotency_key="generated-1")

    # Then the order exists with that configuration, and the answer parses into the typed order
    assert placed.status_code == 201, placed.content
    assert isinstance(placed.parsed, OrderPlacedOutput)
    order = Order.objects.get(public_id=placed.parsed.id)
    spec = order.launch_config.spec
    assert spec["workload"] == {
        "kind": "container", "image": "vllm/vllm-openai:v0.6.3", "command": [],
        "args": ["--model", "facebook/opt-125m"], "ports": [8000],
        "env": [{"name": "MODE", "value": "serve"}, {"name": "HF_TOKEN", "secret": True}],
    }  # fmt: skip
    assert (spec["disk_gb"], spec["ports"], spec["allowed_cidrs"]) == (200, [22, 8000], ["198.51.100.0/24"])
    assert [k["id"] for k in spec["ssh_keys"]] == [str(key.public_id)] and spec["spend_cap_usd"] == "50.00"
    assert Decimal(order.max_price_per_hour) == offer.price_usd
    fetched = orders_retrieve.sync(order_id=str(order.public_id), client=client)
    assert fetched.launch.workload.image == "vllm/vllm-openai:v0.6.3"
    assert fetched.launch.sha256 == order.launch_config.sha256 and "hf_x" not in json.dumps(fetched.to_dict())
