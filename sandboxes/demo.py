"""How a provider account reaches each sandbox: endpoint, credentials, options and regions per kind.

Used by the run command (through the manifest the standalone sandbox writes here and the broker reads with
``providers.manifest``), the benchmarks and tests, so every caller connects to a sandbox the same way.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from providers.manifest import SandboxAccount
from sandboxes import DEMO_REGIONS
from sandboxes.aws import keys as aws_keys
from sandboxes.tencent.auth import DEFAULT_SECRETS


def _aws(sandbox: Any) -> SandboxAccount:
    regions = sorted({row.region for row in sandbox.seed})
    return SandboxAccount(
        kind="aws",
        endpoint_url=sandbox.url,
        credentials=aws_keys.DEMO.credentials(),
        demo_regions=DEMO_REGIONS["aws"],
        all_regions=regions,
    )


def _azure(sandbox: Any) -> SandboxAccount:
    return SandboxAccount(
        kind="azure",
        endpoint_url=sandbox.url,
        credentials=dict(sandbox.demo_credentials),
        demo_regions=DEMO_REGIONS["azure"],
        all_regions=list(sandbox.regions),
        options=sandbox.account_options(),
    )


def _tencent(sandbox: Any) -> SandboxAccount:
    # The sandbox's own key, so its signature is checked as Tencent checks it (any other id is taken unchecked).
    secret_id, secret_key = next(iter(DEFAULT_SECRETS.items()))
    return SandboxAccount(
        kind="tencent",
        endpoint_url=sandbox.url,
        credentials={"secret_id": secret_id, "secret_key": secret_key},
        demo_regions=DEMO_REGIONS["tencent"],
        all_regions=DEMO_REGIONS["tencent"],
    )


def _alibaba(sandbox: Any) -> SandboxAccount:
    return SandboxAccount(
        kind="alibaba",
        endpoint_url=sandbox.url,
        credentials=dict(sandbox.demo_credentials),
        demo_regions=DEMO_REGIONS["alibaba"],
        all_regions=list(sandbox.regions),
    )


def _gcp(sandbox: Any) -> SandboxAccount:
    return SandboxAccount(
        kind="gcp",
        endpoint_url=sandbox.url,
        credentials=sandbox.account_credentials(),
        demo_regions=DEMO_REGIONS["gcp"],
        all_regions=sorted({m.region for m in sandbox.machines}),
    )


def _kubernetes(sandbox: Any) -> SandboxAccount:
    # One cluster, one region: the API server URL, a service account token and the cluster CA (PEM text).
    return SandboxAccount(
        kind="kubernetes",
        endpoint_url=sandbox.url,
        credentials=sandbox.account_credentials(),
        demo_regions=DEMO_REGIONS["kubernetes"],
        all_regions=[sandbox.region],
        options=sandbox.account_options(),
    )


SANDBOX_ACCOUNTS: dict[str, Callable[[Any], SandboxAccount]] = {
    "aws": _aws,
    "azure": _azure,
    "tencent": _tencent,
    "alibaba": _alibaba,
    "gcp": _gcp,
    "kubernetes": _kubernetes,
}

# kind -> "module:function" starting that sandbox in-process on a free port.
STARTERS: dict[str, str] = {
    "aws": "sandboxes.aws.app:start_aws_sandbox",
    "azure": "sandboxes.azure.app:start_azure_sandbox",
    "tencent": "sandboxes.tencent.app:start_tencent_sandbox",
    "alibaba": "sandboxes.alibaba.app:start_alibaba_sandbox",
    "gcp": "sandboxes.gcp.app:start_gcp_sandbox",
    "kubernetes": "sandboxes.kubernetes.app:start_kubernetes_sandbox",
}


def start_all(kinds: list[str] | None = None) -> dict[str, Any]:
    """Start every sandbox (or ``kinds``) in this process; the caller stops them."""
    started: dict[str, Any] = {}
    for kind in kinds or list(STARTERS):
        module, _, func = STARTERS[kind].partition(":")
        started[kind] = getattr(importlib.import_module(module), func)()
    return started


def write_manifest(path: Path, sandboxes: dict[str, Any]) -> None:
    """Record how to reach each running sandbox, for a process that did not start them: each cloud's demo
    account, and other services (the Stripe sandbox) under ``_services`` with their URL."""
    manifest: dict[str, Any] = {
        kind: asdict(SANDBOX_ACCOUNTS[kind](sandbox)) for kind, sandbox in sandboxes.items() if kind in SANDBOX_ACCOUNTS
    }
    manifest["_services"] = {kind: sandbox.url for kind, sandbox in sandboxes.items() if kind not in SANDBOX_ACCOUNTS}
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(manifest, indent=2))
    partial.replace(path)  # atomic: a reader never sees half a file
