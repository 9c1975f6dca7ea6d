"""A launch configuration as the storefront shows it: one summary for the confirmation, the order page and
the templates page. It reads the stored ``spec`` (``marketplace/launch/config.py``), which holds no secret
values: a secret variable shows as masked, whatever the page."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

SSH_PORT = 22
MASK = "••••••"


@dataclass(frozen=True)
class EnvShown:
    name: str
    value: str
    secret: bool


@dataclass(frozen=True)
class LaunchShown:
    kind: str  # none | container | script
    headline: str  # e.g. "container vllm/vllm-openai:v0.6.3"
    image: str  # the machine image, "" for the provider's default
    command: str = ""
    args: str = ""
    env: list[EnvShown] = field(default_factory=list)
    script: str = ""
    shm_size_gb: int | None = None
    registry: str = ""
    disk_gb: int | None = None
    ports: list[int] = field(default_factory=list)  # every open port, SSH first
    workload_ports: list[int] = field(default_factory=list)
    cidrs: list[str] = field(default_factory=list)
    keys: list[dict[str, Any]] = field(default_factory=list)
    spend_cap_usd: Decimal | None = None
    on_silence: str = "keep"  # keep | replace: what happens once the machine's agent stops reporting

    @property
    def open_to_anyone(self) -> bool:
        return any(c in ("0.0.0.0/0", "::/0") for c in self.cidrs)


def launch_shown(spec: Mapping[str, Any] | None) -> LaunchShown | None:
    if not spec:
        return None
    workload = spec.get("workload") or {"kind": "none"}
    kind = str(workload.get("kind") or "none")
    env = [
        EnvShown(name=str(e.get("name")), value=MASK if e.get("secret") else str(e.get("value", "")),
                 secret=bool(e.get("secret")))
        for e in workload.get("env") or []
    ]  # fmt: skip
    headline = {"none": "just the machine (no workload)", "script": "a script at boot"}.get(kind, "")
    if kind == "container":
        headline = f"container {workload.get('image', '')}"
    registry = ""
    if workload.get("registry"):
        reg = workload["registry"]
        registry = f"{reg.get('username', '')} @ {reg.get('server') or 'Docker Hub'} (password {MASK})"
    ports = [int(p) for p in spec.get("ports") or []]
    cap = spec.get("spend_cap_usd")
    return LaunchShown(
        kind=kind,
        headline=headline,
        image=str(spec.get("image") or ""),
        command=shlex.join(workload.get("command") or []),
        args=shlex.join(workload.get("args") or []),
        env=env,
        script=str(workload.get("script") or ""),
        shm_size_gb=workload.get("shm_size_gb"),
        registry=registry,
        disk_gb=spec.get("disk_gb"),
        ports=sorted(ports, key=lambda p: (p != SSH_PORT, p)),
        workload_ports=[int(p) for p in workload.get("ports") or []],
        cidrs=list(spec.get("allowed_cidrs") or []),
        keys=list(spec.get("ssh_keys") or []),
        spend_cap_usd=None if cap is None else Decimal(str(cap)),
        on_silence=str(spec.get("on_silence") or "keep"),
    )
