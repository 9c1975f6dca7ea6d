"""The contract between the lease agent (``lease.py``) and what runs on its machine: the ``Executor`` protocol,
the facts an executor reports (``GpuSeen``, ``SshSeen``), the error a failed step raises, and the small helpers
every executor shares (the host agent's ``executor.LeaseExecutor`` among them).

Standard library only: it travels in the lease agent's bundle (``bundle.py``).
"""

from __future__ import annotations

import base64
import hashlib
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

# The workload's recent output the lease agent sends with each heartbeat (issue 36): its last lines, both
# bounds holding; the broker bounds what it keeps again (an agent's report is untrusted).
LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 8 * 1024  # JSON may escape a byte to six: well within the heartbeat body limit (64 KiB)


class ExecutorError(Exception):
    """A step of the lease failed on the machine; the message is what the buyer reads on the order page."""


@dataclass(frozen=True)
class GpuSeen:
    index: int
    name: str
    memory_gb: int
    power_limit_w: int = 300  # the board's rated power (nvidia-smi's power.limit); a simulation draws within it


@dataclass(frozen=True)
class SshSeen:
    listening: bool
    port: int
    host: str | None = None  # only when the machine knows the address buyers reach it at (a sandbox, a host)


class Executor(Protocol):
    """What runs on the machine. ``HostExecutor`` does it for real; ``SimulatedExecutor`` stands in."""

    name: str

    def gpus(self) -> list[GpuSeen]: ...

    def telemetry(self) -> list[dict[str, Any]]: ...

    def start(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str: ...

    def workload_state(self) -> dict[str, Any]: ...

    def ssh(self) -> SshSeen: ...

    def host_keys(self) -> list[str]: ...

    def expose(self, ports: list[int]) -> list[dict[str, int]]: ...

    def stop(self) -> None: ...

    # Optional: ``logs(lines) -> str``, the workload's last lines, sent with the heartbeats where present.


def host_key_fingerprint(line: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line (``ssh-keygen -lf``)."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def telemetry_sample(index: int, util: float, temp: float, power: float, used_gb: float) -> dict[str, Any]:
    return {
        "index": index,
        "utilization_pct": round(util, 1),
        "temperature_c": round(temp, 1),
        "power_w": round(power, 1),
        "memory_used_gb": round(used_gb, 2),
    }


def _run(args: list[str], *, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, input=stdin, capture_output=True, timeout=timeout, check=False)  # noqa: S603


def _tail(data: bytes, limit: int = 600) -> str:
    return data.decode("utf-8", "replace").strip()[-limit:]


def workload_env(workload: dict[str, Any], secrets: dict[str, Any]) -> dict[str, str]:
    """The workload's environment: the lease file's plain values, then the secret ones fetched from the broker."""
    env = {str(e["name"]): str(e.get("value") or "") for e in workload.get("env") or []}
    env.update({str(k): str(v) for k, v in (secrets.get("env") or {}).items()})
    return env


def _banner(host: str, port: int) -> bool:
    """Does an SSH server answer on host:port? (its identification string starts with ``SSH-``)"""
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def text_tail(data: bytes, lines: int = LOG_TAIL_LINES, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``data`` within its last ``limit`` bytes, as text."""
    return "\n".join(data[-limit:].decode("utf-8", "replace").splitlines()[-lines:])
