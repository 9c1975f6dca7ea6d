"""The host agent protocol: how the broker and an independent provider's machine talk, both ways, over HTTP.

Every request, in either direction, is signed with the machine's secret (issued once when the machine is
listed) and carries four headers:

- ``X-Agent-Key``: the machine's key id (public);
- ``X-Agent-Timestamp``: Unix seconds when the request was made;
- ``X-Agent-Nonce``: 16+ random characters, never reused with that key;
- ``X-Agent-Signature``: hex HMAC-SHA256 over ``METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n
  hex SHA-256(body)``, keyed by the secret.

A receiver refuses (401, ``{"code": "bad_signature" | "stale" | "replayed" | "unknown_key"}``) a request
whose signature does not match, whose timestamp is more than ``MAX_SKEW_S`` away from its clock, or whose
nonce it has seen with that key within the window; it logs each refusal.

Agent -> broker (``/agent/v1/...`` on the broker):

- ``POST register`` ``{"agent_url", "hardware": {"gpus": [{"model", "memory_gb"}], "driver", "cuda"},
  "self_test": {...}}``: the agent is up at ``agent_url`` (empty: outbound-only, below); the broker records the
  hardware and self-test.
- ``POST heartbeat`` ``{"gpus": [{"index", "utilization_pct", "temperature_c", "power_w", "memory_used_gb"}],
  "instances": n}``: every ``HEARTBEAT_S``; a machine silent for longer than the broker's limit is withdrawn.

Broker -> agent (on ``agent_url``):

- ``GET /v1/status``: ``{"hardware", "gpus_free", "instances"}``;
- ``POST /v1/instances`` ``{"client_token", "order_ref", "gpus", "gpu_indexes", "boot", "tags"}``: start a
  lease on ``gpus`` of the machine's GPUs. ``gpu_indexes`` (optional) names them (``[1, 2]``: distinct, as many
  as ``gpus``, each below the machine's GPU count, else ``400 {"code": "invalid"}``); without it the agent takes
  the lowest free ones. A GPU belongs to one live lease at a time: ``409 {"code": "gpus_busy"}`` when a named
  one is held by another, ``409 {"code": "no_capacity"}`` when too few are free. With ``"mig_profile":
  "3g.40gb"`` (and ``gpus`` 1) the lease is one MIG slice of one GPU: the agent creates that MIG instance on
  the GPU named (else where it packs best) and the lease sees only it; ``400 {"code": "invalid"}`` names a
  profile the machine does not sell, ``409 {"code": "gpus_busy"}`` when the GPU is leased whole or its free
  memory slices cannot hold the profile (providers/community/mig.py). Idempotent on ``client_token``: a
  repeat returns the same instance;
- ``GET /v1/instances/<id>``, ``DELETE /v1/instances/<id>`` (idempotent), ``GET /v1/instances?order_ref=``.
  A terminate kills the lease's processes (SIGTERM, SIGKILL after a grace), removes its container and working
  directory and frees its ports before it answers;
- ``POST /v1/instances/<id>/stop``, ``/start``, ``/reboot`` (issue 36): the lease's container stopped (its disk,
  ports and GPUs kept, the instance ``"stopped"``), started again, or restarted in place; each answers the
  instance and is idempotent (stopping a stopped lease answers it as it is). ``409 {"code": "not_running"}`` for
  an instance still pending, ending or ended, ``409 {"code": "unsupported"}`` on a host that runs leases as
  processes rather than containers;
- ``GET /v1/instances`` with no query: ``{"instances": [...], "all": true}``, every instance the agent holds for
  the broker, in the shape ``?order_ref=`` lists them: each live one (pending or running), then as many of the
  ended ones, most recently launched first, as keep the list within ``MAX_LISTED`` items and
  ``MAX_LISTING_BYTES``. The broker asks each machine once this way for all the leases it polls; an instance not
  listed is one the agent no longer knows. ``"all": true`` tells the listing from an older agent's answer to the
  same request (which reads the missing ``order_ref`` as the empty one and lists nothing): without it, or when
  the agent does not route the request (404, 405) or refuses it (400), the broker asks for each instance by id.

Outbound-only agents (behind NAT, no public URL): an agent that registers with an empty ``agent_url`` is
reached through a per-machine command queue on the broker instead. It polls

- ``POST /agent/v1/commands`` ``{}`` -> ``{"commands": [{"id", "method", "target", "body", "headers"}],
  "poll_s"}`` every ``poll_s`` seconds (beyond the broker's per-machine rate: ``429 {"code":
  "too_many_polls"}``); each command is one of the broker -> agent requests above, handed out once;
- ``POST /agent/v1/commands/<id>/answer`` ``{"status", "answer"}``: the HTTP status and JSON object the
  agent would have answered that request with (a late answer, to a command the broker gave up on, is
  refused with ``409 {"code": "expired"}`` and ignored).

A command's ``headers`` are the broker's signature (``sign_command``): the four headers above plus
``X-Agent-Command`` (its id) and ``X-Agent-Expires`` (Unix seconds), both inside the signed message. The
agent checks them as it checks an inbound request (signature, skew, nonce never seen) and refuses a command
past its expiry (``expired``) without running it: the broker has stopped waiting for it by then.

An instance is ``{"id", "state": "pending"|"running"|"terminated"|"failed", "client_token", "order_ref",
"gpus", "gpu_indexes", "tags", "ssh": "host:port"}``, with ``"mig_profile"`` for a MIG slice, ``"problem"``
when the agent stopped the workload (``"disk quota exceeded"``) and, once terminated, ``"cleanup":
{"processes_killed", "killed_after_grace", "container_removed", "bytes_freed", "work_dir_removed",
"ports_released", "user"}`` (and ``"mig_device_destroyed"`` for a slice). Errors are
``{"code", "message"}``.

Standard library only, so the reference agent runs on a bare machine.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_SKEW_S = 300
# The bare ``GET /v1/instances`` listing: at most this many instances, in a JSON object of at most this many bytes
# (under the broker's 256 KiB bound on any answer, with room for the command queue's wrapper).
MAX_LISTED = 256
MAX_LISTING_BYTES = 192 * 1024
HEARTBEAT_S = 15
HEADER_KEY = "X-Agent-Key"
HEADER_TIMESTAMP = "X-Agent-Timestamp"
HEADER_NONCE = "X-Agent-Nonce"
HEADER_SIGNATURE = "X-Agent-Signature"
HEADER_COMMAND = "X-Agent-Command"
HEADER_EXPIRES = "X-Agent-Expires"


class Rejected(Exception):
    """A request that fails authentication. ``code`` is what the 401 answer names."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def new_secret() -> str:
    """A machine secret: 32 random bytes, URL-safe text."""
    return secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "mk_" + secrets.token_hex(8)


def _message(method: str, target: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    return "\n".join([method.upper(), target, timestamp, nonce, hashlib.sha256(body).hexdigest()]).encode()


def signature(secret: str, method: str, target: str, timestamp: str, nonce: str, body: bytes) -> str:
    return hmac.new(secret.encode(), _message(method, target, timestamp, nonce, body), hashlib.sha256).hexdigest()


def sign(
    key_id: str, secret: str, method: str, target: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The headers that authenticate one request; ``target`` is the path with its query string."""
    timestamp = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(12)
    return {
        HEADER_KEY: key_id,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(secret, method, target, timestamp, nonce, body),
    }


@dataclass(frozen=True)
class SignedRequest:
    key_id: str
    timestamp: int
    nonce: str


def check(
    headers: Mapping[str, str] | Any, secret_for: Mapping[str, str] | None, method: str, target: str, body: bytes, *,
    now: float | None = None, secret: str | None = None,
) -> SignedRequest:  # fmt: skip
    """Authenticate a request's headers; raises ``Rejected``. The caller keeps the nonce to refuse replays
    (``SignedRequest.nonce``) within ``MAX_SKEW_S``. Give the secret directly or a key id -> secret map."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}  # header names are case-insensitive
    key_id = lower.get(HEADER_KEY.lower(), "")
    timestamp = lower.get(HEADER_TIMESTAMP.lower(), "")
    nonce = lower.get(HEADER_NONCE.lower(), "")
    given = lower.get(HEADER_SIGNATURE.lower(), "")
    if not (key_id and timestamp and nonce and given):
        raise Rejected("bad_signature", "missing authentication headers")
    if not timestamp.isascii() or not timestamp.isdigit() or not 16 <= len(nonce) <= 128:
        raise Rejected("bad_signature", "malformed timestamp or nonce")
    if secret is None:
        secret = (secret_for or {}).get(key_id)
        if secret is None:
            raise Rejected("unknown_key", f"unknown key {key_id[:32]!r}")
    expected = signature(secret, method, target, timestamp, nonce, body)
    if not hmac.compare_digest(expected, given):
        raise Rejected("bad_signature", "the signature does not match the request")
    if abs((now if now is not None else time.time()) - int(timestamp)) > MAX_SKEW_S:
        raise Rejected("stale", f"timestamp {timestamp} is more than {MAX_SKEW_S} s from the receiver's clock")
    return SignedRequest(key_id, int(timestamp), nonce)


def _command_target(target: str, command_id: str, expires: str) -> str:
    # The id and expiry join the signed message, so neither can be moved to another command or extended.
    return f"{target}\n{command_id}\n{expires}"


def sign_command(
    key_id: str, secret: str, *, command_id: str, method: str, target: str, body: bytes, expires: float,
    now: float | None = None,
) -> dict[str, str]:  # fmt: skip
    """The headers of one queued broker -> agent request: ``sign``'s, bound to the command's id and to the
    Unix second after which the agent must not run it."""
    stamp = str(int(expires))
    headers = sign(key_id, secret, method, _command_target(target, command_id, stamp), body, now=now)
    return {**headers, HEADER_COMMAND: command_id, HEADER_EXPIRES: stamp}


def check_command(
    headers: Mapping[str, str] | Any, method: str, target: str, body: bytes, *, command_id: str, secret: str,
    now: float | None = None,
) -> SignedRequest:  # fmt: skip
    """Authenticate a queued command as ``check`` does a request, and refuse one that names another id
    (``bad_signature``) or whose expiry has passed (``expired``). The caller keeps the nonce, as for ``check``."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    signed_id = lower.get(HEADER_COMMAND.lower(), "")
    expires = lower.get(HEADER_EXPIRES.lower(), "")
    if not expires.isascii() or not expires.isdigit() or len(expires) > 12:
        raise Rejected("bad_signature", "missing or malformed command expiry")
    if not hmac.compare_digest(signed_id.encode(), command_id.encode()):
        raise Rejected("bad_signature", "the command's signature names another command")
    signed = check(headers, None, method, _command_target(target, signed_id, expires), body, now=now, secret=secret)
    if (now if now is not None else time.time()) > int(expires):
        raise Rejected("expired", f"the command expired at {expires}; the broker no longer waits for it")
    return signed


# What one GPU can report (per GPU, as nvidia-smi does): a busy share, a die temperature a GPU reaches before
# it shuts itself down (NVIDIA's slowdown and shutdown points are around 90 and 100 degrees C), a board power
# above any accelerator's (H100 SXM 700 W, B200 1,000 W) but within reach, and memory no larger than any GPU
# carries. Anything else is a broken sensor or a lying agent, and would be shown to buyers and providers.
TELEMETRY_BOUNDS: dict[str, tuple[float, float]] = {
    "utilization_pct": (0.0, 100.0),
    "temperature_c": (0.0, 130.0),
    "power_w": (0.0, 2000.0),
    "memory_used_gb": (0.0, 512.0),
}
MAX_GPU_INDEX = 1023
# Memory is reported in GiB (MiB / 1024) and listed in GB: a GPU's own memory with this slack.
GPU_MEMORY_SLACK = 1.1


def telemetry_check(sample: Any, *, memory_gb: float | None = None, required: bool = True) -> dict[str, Any]:
    """One GPU's telemetry sample as the broker keeps it: ``index`` and the figures of ``TELEMETRY_BOUNDS``,
    each a finite number (not a bool, not text) within its bounds, memory also within ``memory_gb`` (the
    GPU's, when known). With ``required`` every figure must be there; else missing ones stay missing (an
    agent without a power sensor). ``ValueError`` naming the field and the range on anything else."""
    if not isinstance(sample, dict):
        raise ValueError("gpus: each sample must be a JSON object")
    kept: dict[str, Any] = {}
    index = sample.get("index")
    if index is not None or required:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_GPU_INDEX:
            raise ValueError(f"gpus.index: a whole number from 0 to {MAX_GPU_INDEX}")
        kept["index"] = index
    for name, (low, high) in TELEMETRY_BOUNDS.items():
        if name == "memory_used_gb" and memory_gb is not None:
            high = min(high, round(memory_gb * GPU_MEMORY_SLACK, 2))
        value = sample.get(name)
        if value is None and not required:
            continue
        # Comparisons are False for NaN, so a NaN fails the range check too.
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ValueError(f"gpus.{name}: a number from {low:g} to {high:g}, not {str(value)[:32]!r}")
        kept[name] = round(float(value), 2)
    return kept
