"""The GCP adapter under the contract suite: real google-cloud-compute/-billing against the GCP sandbox, signing
self-signed JWTs with service-account keys generated at sandbox start."""

from __future__ import annotations

import json
from typing import Any

from providers.gcp.adapter import GcpAdapter
from providers.sandbox.gcp import GcpSandbox, start_gcp_sandbox
from providers.sandbox.gcp_seed import REGION_ZONES
from providers.types import Credentials
from tests.providers.contract import ContractTarget

KIND = "gcp"
PROJECT = "broker-contract"
REGIONS = sorted(REGION_ZONES)
_keys: dict[int, dict[bool, str]] = {}


def start_sandbox() -> GcpSandbox:
    return start_gcp_sandbox()


def _key_json(sandbox: GcpSandbox, valid: bool) -> str:
    # One key pair per sandbox: RSA generation is the slow part of building credentials.
    keys = _keys.setdefault(id(sandbox), {})
    if valid not in keys:
        email = f"{'contract' if valid else 'bad-contract'}@{PROJECT}.iam.gserviceaccount.com"
        keys[valid] = json.dumps(sandbox.new_service_account(email, PROJECT))
    return keys[valid]


def target(sandbox: GcpSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> GcpAdapter:
        credentials = Credentials(
            kind=KIND,
            values={"service_account_json": _key_json(sandbox, valid), "project_id": PROJECT},
            endpoint_url=sandbox.url,
        )
        return GcpAdapter(credentials, REGIONS, options)

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=REGIONS,
        launch_action="compute.instances.insert",
        read_action="compute.machineTypes.aggregatedList",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
    )
