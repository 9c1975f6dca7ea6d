"""The sandbox manifest, read on the broker's side: how a provider account reaches each running sandbox.

The standalone sandbox (``python -m sandboxes serve --manifest FILE``) writes it once every emulator listens; the
run command and ``manage.py demo seed`` read it here, so production code never imports the sandboxes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SandboxAccount:
    """What a ProviderAccount needs to use one sandbox."""

    kind: str
    endpoint_url: str
    credentials: dict[str, str]
    demo_regions: list[str]
    all_regions: list[str]
    options: dict[str, str] = field(default_factory=dict)


def read_manifest(path: Path) -> list[SandboxAccount]:
    """The cloud accounts of a manifest (``sandboxes.demo.write_manifest``)."""
    return [SandboxAccount(**entry) for kind, entry in json.loads(path.read_text()).items() if kind != "_services"]


def manifest_service_url(path: Path, kind: str) -> str | None:
    """The URL of a non-cloud sandbox (``"stripe"``) in a manifest, None when it was not served."""
    services = json.loads(path.read_text()).get("_services", {})
    url = services.get(kind) if isinstance(services, dict) else None
    return url if isinstance(url, str) else None
