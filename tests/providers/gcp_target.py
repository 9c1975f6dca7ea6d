"""The GCP adapter under the contract suite: real google-cloud-compute/-billing against the GCP sandbox, signing
self-signed JWTs with service-account keys generated at sandbox start."""

from __future__ import annotations

import json
import re
from typing import Any

from providers.gcp.adapter import GcpAdapter
from providers.types import Credentials, InstanceHandle
from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox
from sandboxes.gcp.boot import ssh_key_lines
from sandboxes.gcp.seed import REGION_ZONES
from tests.providers.contract import ContractTarget, LaunchedView

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


def launched_view(sandbox: GcpSandbox, handle: InstanceHandle) -> LaunchedView:
    """What the sandbox keeps for the instance, read from its Compute Engine resources: the boot Disk's
    ``sourceImage`` and ``sizeGb``, the ``startup-script`` and ``ssh-keys`` metadata values, what the project's VPC
    firewall rules let in, and the order named by each rule that targets the instance's network tags (rules have
    no labels: the order is in the description; a rule without it shows as "")."""
    body = sandbox.instance_resource(handle.instance_id)
    disk = sandbox.disk_resource(handle.zone, body["name"])
    metadata = {item["key"]: item["value"] for item in body["metadata"].get("items") or []}
    project = body["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
    tags = set((body.get("tags") or {}).get("items") or [])
    created = [r for r in sandbox.firewall_rules(project) if tags & set(r.get("targetTags") or [])]
    orders = [(m[1] if (m := re.search(r"broker-order=(\S+)", r.get("description", ""))) else "") for r in created]
    return LaunchedView(
        image=disk["sourceImage"],
        disk_gb=int(disk["sizeGb"]),
        user_data=metadata.get("startup-script", "").encode(),
        public_keys=[key for _, key in ssh_key_lines(metadata.get("ssh-keys", ""))],
        ingress=sandbox.lets_in(handle.instance_id),
        resource_tags=orders,
    )


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
        launched=lambda handle: launched_view(sandbox, handle),
        extra={"start_action": "compute.instances.start"},
    )
