"""Leases: the broker's side of the agent on each launched machine (``providers/community/lease.py``).

Each provisioning attempt opens a lease in the transaction that records the attempt, before the provider
hears of it. Its boot token is derived from the attempt's client token with the broker's secret key, so a
resumed attempt renders the same user data (idempotent launch APIs compare requests), and only the
token's SHA-256 is stored. The agent spends the token once (``lease_claim``) for a key of its own, with
which it signs everything after: fetching the buyer's secrets (``lease_secrets``), the ready report
(``lease_ready``) or a failure (``lease_failed``), and telemetry (``lease_heartbeat``). A machine that cannot
run the agent at all (no Python, or one too old) says so with the token instead (``lease_boot_failed``).

What the agent reports is validated into DTOs with bounds before anything is stored: a machine is hostile
until it proves otherwise.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from marketplace.events import LeaseReady, publish
from marketplace.launch.config import ingress_rules, launch_secrets, spec_ssh_keys
from marketplace.models import (
    Attempt,
    Instance,
    LaunchConfiguration,
    Lease,
    LeaseHeartbeat,
    LeaseState,
    Offer,
    Order,
    OrderHealth,
    OrderState,
)
from marketplace.taskkit import enqueue_on_commit
from providers.boot import AGENT_MODULES, AGENT_PYTHON, BOOT_FAILURE_CODES
from providers.community import protocol
from providers.community.bundle import agent_bundle_sha256
from providers.errors import ProviderError
from providers.gpu_names import reported_gpu_matches
from providers.launch import BootSpec, LaunchProblem
from providers.models import AgentNonce
from providers.secrets import decrypt_secret, encrypt_secret
from providers.services import adapter_for_account
from providers.sshkeys import fingerprint_sha256
from providers.types import LaunchSpec, PricingModel

log = logging.getLogger("marketplace.leases")

TOKEN_PREFIX = "bt_"  # noqa: S105 - a prefix, not a secret
KEY_PREFIX = "lk_"
MAX_GPUS = 64
MAX_HOST_KEYS = 8
HOST_KEY_TYPES = frozenset(
    {"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"}
)
FAILURE_STAGES = frozenset({"gpus", "workload", "ssh", "boot"})
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}$")
_PYTHON_VERSION = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){0,2}$")


class LeaseRefused(Exception):
    """An agent request the broker will not act on; ``code`` and ``status`` are what the answer says."""

    def __init__(self, code: str, message: str, *, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# ----------------------------------------------------------------------------------- opening a lease


def boot_token(client_token: str) -> str:
    """The attempt's one-time boot token: an HMAC of its client token under the broker's secret key."""
    mac = hmac.new(settings.SECRET_KEY.encode(), b"gpu-broker boot token\n" + client_token.encode(), hashlib.sha256)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def lease_open(*, attempt: Attempt, now: dt.datetime) -> Lease:
    """The attempt's lease, waiting for its machine's agent. Runs inside the attempt's own transaction.
    The token is good from now until the boot deadline's worst case (launch after now, plus the timeout)."""
    return Lease.objects.create(
        attempt=attempt,
        order_id=attempt.order_id,
        token_hash=token_hash(boot_token(attempt.client_token)),
        token_expires_at=now + dt.timedelta(seconds=settings.BOOT_TIMEOUT_S + 600),
    )


def boot_spec(*, order: Order, attempt: Attempt) -> BootSpec | None:
    """What the attempt's machine needs to become usable; None for an order placed before launch
    configurations existed (it launches bare and runs when the provider says so)."""
    if order.launch_config is None:
        return None
    return _boot(order.launch_config, boot_token(attempt.client_token))


def _boot(config: LaunchConfiguration, token: str) -> BootSpec:
    spec = config.spec
    workload = dict(spec.get("workload") or {})
    # Secret env entries carry no value here; the agent fetches the values over the signed channel.
    workload["env"] = [e for e in workload.get("env") or [] if not e.get("secret")]
    return BootSpec(
        broker_url=settings.PUBLIC_URL,
        boot_token=token,
        agent_sha256=agent_bundle_sha256(),
        ssh_keys=spec_ssh_keys(spec),
        ingress=ingress_rules(spec),
        disk_gb=spec.get("disk_gb"),
        image=spec.get("image"),
        workload=workload,
    )


_CHECK_ATTEMPT = "ord-00000000000000000000000000000000-a1"  # an attempt's shape, for sizes only


def launch_problems_for(*, offer: Offer, config: LaunchConfiguration) -> list[LaunchProblem]:
    """What the offer's provider would refuse in this configuration (its documented limits), checked before
    anything launches: the boot rendered as an attempt's would be, with a token of the same length. An
    account that cannot build an adapter is not judged here; its attempt fails with the reason instead."""
    try:
        adapter = adapter_for_account(offer.account)
    except ProviderError:
        return []
    spec = LaunchSpec(
        region=offer.region,
        zone=offer.zone,
        instance_type=offer.instance_type,
        pricing_model=PricingModel(offer.pricing_model),
        client_token=_CHECK_ATTEMPT,
        order_ref="ord-" + "0" * 32,
        image=config.spec.get("image"),
        boot=_boot(config, boot_token(_CHECK_ATTEMPT)),
    )
    return adapter.launch_problems(spec)


# -------------------------------------------------------------------------------- what agents report


@dataclass(frozen=True)
class GpuReport:
    index: int
    name: str
    memory_gb: int


@dataclass(frozen=True)
class HostKey:
    key_type: str
    public_key: str
    fingerprint: str


@dataclass(frozen=True)
class ReadyReport:
    gpus: tuple[GpuReport, ...]
    workload_kind: str
    workload_detail: str
    ssh_port: int
    ssh_user: str
    ssh_host: str | None
    host_keys: tuple[HostKey, ...]
    ports: tuple[tuple[int, int], ...] = ()  # (the machine's port, where it is reached), when they differ


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise LeaseRefused("invalid", f"{name}: expected {getattr(kind, '__name__', kind)}")
    return value


def _bounded_int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LeaseRefused("invalid", f"{name}: a whole number from {low} to {high}")
    return value


def host_key_parse(line: Any) -> HostKey:
    """A host public key as sshd publishes it (``/etc/ssh/ssh_host_*_key.pub``); its fingerprint is computed
    here, never taken from the agent."""
    if not isinstance(line, str) or len(line) > 16384:
        raise LeaseRefused("invalid", "host_keys: public key lines")
    parts = line.split()
    if len(parts) < 2 or parts[0] not in HOST_KEY_TYPES:
        raise LeaseRefused("invalid", "host_keys: '<type> <base64>' with an SSH key type")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise LeaseRefused("invalid", "host_keys: the key is not base64") from None
    if not blob.startswith(len(parts[0]).to_bytes(4, "big") + parts[0].encode()):
        raise LeaseRefused("invalid", "host_keys: the key's data names another type")
    canonical = f"{parts[0]} {base64.b64encode(blob).decode()}"
    return HostKey(parts[0], canonical, fingerprint_sha256(blob))


def ready_report_parse(body: Any) -> ReadyReport:
    if not isinstance(body, dict):
        raise LeaseRefused("invalid", "the report is a JSON object")
    gpus_raw = _field(body, "gpus", list)
    if len(gpus_raw) > MAX_GPUS:
        raise LeaseRefused("invalid", f"gpus: at most {MAX_GPUS}")
    gpus = []
    for item in gpus_raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or len(item["name"]) > 96:
            raise LeaseRefused("invalid", "gpus: objects with index, name and memory_gb")
        gpus.append(
            GpuReport(
                _bounded_int(item.get("index"), "gpus.index", 0, 1023),
                item["name"],
                _bounded_int(item.get("memory_gb"), "gpus.memory_gb", 0, 4096),
            )
        )
    workload = body.get("workload") if isinstance(body.get("workload"), dict) else {}
    ssh = _field(body, "ssh", dict)
    user = ssh.get("user")
    if not isinstance(user, str) or not _USER.match(user):
        raise LeaseRefused("invalid", "ssh.user: a plain user name")
    host = ssh.get("host")
    if host is not None and (not isinstance(host, str) or not _HOST.match(host)):
        raise LeaseRefused("invalid", "ssh.host: a host name or address")
    if ssh.get("listening") is not True:
        raise LeaseRefused("invalid", "ssh.listening: report ready only once SSH answers")
    keys_raw = _field(body, "host_keys", list)
    if not keys_raw or len(keys_raw) > MAX_HOST_KEYS:
        raise LeaseRefused("invalid", f"host_keys: 1 to {MAX_HOST_KEYS} host public keys")
    ports_raw = body.get("ports") or []
    if not isinstance(ports_raw, list) or len(ports_raw) > 32 or not all(isinstance(p, dict) for p in ports_raw):
        raise LeaseRefused("invalid", "ports: at most 32 {port, host_port} objects")
    ports = tuple(
        (
            _bounded_int(p.get("port"), "ports.port", 1, 65535),
            _bounded_int(p.get("host_port"), "ports.host_port", 1, 65535),
        )
        for p in ports_raw
    )
    return ReadyReport(
        ports=ports,
        gpus=tuple(gpus),
        workload_kind=str(workload.get("kind") or "none")[:16],
        workload_detail=str(workload.get("detail") or "")[:2000],
        ssh_port=_bounded_int(ssh.get("port"), "ssh.port", 1, 65535),
        ssh_user=user,
        ssh_host=host,
        host_keys=tuple(host_key_parse(line) for line in keys_raw),
    )


def telemetry_parse(body: Any) -> tuple[list[dict[str, Any]], str]:
    """(per-GPU samples with every figure bounded to what a GPU can show, the workload's state)."""
    if not isinstance(body, dict) or not isinstance(body.get("gpus"), list) or len(body["gpus"]) > MAX_GPUS:
        raise LeaseRefused("invalid", f"gpus: a list of at most {MAX_GPUS} per-GPU samples")
    try:
        # The same bounds as an independent host's heartbeat (one validator, in the agent protocol).
        samples = [protocol.telemetry_check(item) for item in body["gpus"]]
    except ValueError as exc:
        raise LeaseRefused("invalid", str(exc)) from None
    workload = body.get("workload") if isinstance(body.get("workload"), dict) else {}
    state = str(workload.get("state") or "")[:16]
    return samples, state


# What the broker keeps of the workload's output a heartbeat carries: the agent sends at most its last 8 KiB
# (providers/community/executor_base.py), but a report is untrusted.
MAX_WORKLOAD_LOG_CHARS = 16 * 1024


def workload_log_parse(body: Any) -> str | None:
    """The heartbeat's ``logs``: None when absent (an older agent), else its last ``MAX_WORKLOAD_LOG_CHARS``
    characters without NULs (PostgreSQL text holds none). ``LeaseRefused`` for anything but text."""
    logs = body.get("logs") if isinstance(body, dict) else None
    if logs is None:
        return None
    if not isinstance(logs, str):
        raise LeaseRefused("invalid", "logs: the workload's recent output, as text")
    return logs[-MAX_WORKLOAD_LOG_CHARS:].replace("\x00", "")


# ----------------------------------------------------------------------------------------- agent calls


def _waiting_lease(token: Any, now: dt.datetime) -> Lease:
    """The lease whose unspent boot token this is, locked for the caller's transaction; ``LeaseRefused`` (401)
    for an unknown, spent or expired token, or a lease whose attempt is already over."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) or len(token) > 64:
        raise LeaseRefused("bad_token", "boot_token: not a boot token", status=401)
    # Only the lease's row: the attempt and order rows joined in are read, not locked, or a claim racing the
    # launch being recorded (which updates the attempt, then the lease) would deadlock with it.
    lease = (
        Lease.objects.select_for_update(of=("self",))
        .select_related("attempt", "order")
        .filter(token_hash=token_hash(token))
        .first()
    )
    if lease is None:
        log.warning("lease claim with an unknown boot token")
        raise LeaseRefused("bad_token", "this boot token is not known", status=401)
    if lease.state != LeaseState.WAITING:
        log.warning("lease claim with a spent boot token (attempt %s)", lease.attempt_id)
        raise LeaseRefused("spent", "this boot token was already used", status=401)
    if lease.token_expires_at <= now:
        raise LeaseRefused("expired", "this boot token has expired", status=401)
    if lease.order.state in Order.FINAL_STATES or lease.attempt.outcome == "failed":
        raise LeaseRefused("ended", "the order or attempt this machine was launched for is over", status=401)
    return lease


def lease_claim(*, token: Any, now: dt.datetime | None = None) -> tuple[Lease, str]:
    """Spend a boot token: the lease's key id and a fresh secret (returned once, stored encrypted). Refused
    (401) for an unknown, spent or expired token, or a lease whose attempt is already over."""
    now = now or timezone.now()
    with transaction.atomic():
        lease = _waiting_lease(token, now)
        secret = protocol.new_secret()
        lease.key_id = KEY_PREFIX + secrets.token_hex(12)
        lease.secret_encrypted = encrypt_secret({"secret": secret})
        lease.state = LeaseState.CLAIMED
        lease.claimed_at = now
        lease.save(update_fields=["key_id", "secret_encrypted", "state", "claimed_at"])
    return lease, secret


def boot_failure_reason(reason: Any, version: Any) -> str:
    """What the order shows for a machine that cannot run the agent, built from a reason code and a version
    number alone (``LeaseRefused`` for anything else): nothing a machine sends reaches the page as text."""
    if reason not in BOOT_FAILURE_CODES:
        raise LeaseRefused("invalid", f"reason: one of {', '.join(sorted(BOOT_FAILURE_CODES))}")
    if version is None or version == "":
        version = ""
    elif not isinstance(version, str) or not _PYTHON_VERSION.match(version):
        raise LeaseRefused("invalid", "version: a Python version number such as 3.8")
    needed = "the broker's agent needs Python {}.{} or newer (python3 on the PATH)".format(*AGENT_PYTHON)
    if reason == "no_python":
        return f"the image has no python3: {needed}"
    if reason == "python_incomplete":
        return (
            f"the image's python3 {version} lacks standard library modules ({AGENT_MODULES}): {needed} with its "
            "standard library (on Debian and Ubuntu the python3 package, not only python3-minimal)"
        )
    return f"the image's python3 is {version or 'too old (it does not say its version)'}: {needed}"


def lease_boot_failed(*, token: Any, reason: Any, version: Any, now: dt.datetime | None = None) -> Lease:
    """The boot script found that the machine cannot run the agent: the token is spent and the lease fails
    at the ``boot`` stage with the reason, as ``lease_failed`` does for a claimed one (the machine is
    terminated, its attempt failed, and the order fails over). Refused like a claim (401) for a token that is
    not unspent; a second report finds the token spent."""
    now = now or timezone.now()
    message = boot_failure_reason(reason, version)
    with transaction.atomic():
        lease = _waiting_lease(token, now)
        lease.state, lease.failure_stage, lease.failure_reason, lease.ended_at = LeaseState.FAILED, "boot", message, now
        lease.save(update_fields=["state", "failure_stage", "failure_reason", "ended_at"])
        _settle_on_commit(lease.order_id)
    log.info("attempt %s: the machine cannot run the agent (%s)", lease.attempt_id, reason)
    return lease


def lease_authenticate(headers: Any, method: str, target: str, body: bytes, *, now: dt.datetime | None = None) -> Lease:
    """The lease whose agent signed this request; raises ``protocol.Rejected`` (logged) for a forged, stale or
    replayed one. Nonces share the host agents' table, so a nonce is spent once per key."""
    moment = now or timezone.now()
    key_id = str(headers.get(protocol.HEADER_KEY, ""))
    lease = Lease.objects.select_related("order", "attempt").filter(key_id=key_id).first() if key_id else None
    try:
        if lease is None:
            raise protocol.Rejected("unknown_key", f"unknown key {key_id[:32]!r}")
        secret = decrypt_secret(lease.secret_encrypted).get("secret", "")
        signed = protocol.check(headers, None, method, target, body, now=moment.timestamp(), secret=secret)
        try:
            with transaction.atomic():
                AgentNonce.objects.create(key_id=key_id, nonce=signed.nonce, seen_at=moment)
        except IntegrityError:
            raise protocol.Rejected("replayed", "this nonce was already used") from None
    except protocol.Rejected as exc:
        log.warning("lease request refused: %s %s key=%s code=%s", method, target, key_id[:32], exc.code)
        raise
    return lease


def lease_secrets(*, lease: Lease) -> dict[str, Any]:
    """The buyer's secret values, for the agent that claimed the lease and has not reported yet."""
    if lease.state != LeaseState.CLAIMED:
        raise LeaseRefused("wrong_state", f"secrets are handed out once, before ready (the lease is {lease.state})")
    order = Order.objects.select_related("launch_config").get(pk=lease.order_id)
    if order.launch_config is None:
        return {}
    return launch_secrets(order.launch_config)


@dataclass(frozen=True)
class ReadyOutcome:
    state: str  # "running" or "refused"
    problem: str = ""


def gpu_problem(order: Order, gpus: tuple[GpuReport, ...]) -> str:
    """Why the GPUs a machine reports are not what the order bought; empty when they are. A partition (an AWS
    g6f's share of an L4, a MIG profile) shows as its card's model with the slice's memory, which is the
    offer's ``gpu_memory_gb``; a whole card must show its model's full memory."""
    model, share = order.gpu_model, order.offer.gpu_fraction
    memory_gb = order.offer.gpu_memory_gb if share < 1 else model.memory_gb
    matching = [g for g in gpus if reported_gpu_matches(g.name, g.memory_gb, model.key, memory_gb)]
    if len(gpus) == order.gpu_count and len(matching) == order.gpu_count:
        return ""
    seen = ", ".join(sorted({f"{sum(1 for x in gpus if x.name == g.name)}x {g.name} {g.memory_gb} GB" for g in gpus}))
    sold = model.key if share >= 1 else f"{share} of one {model.key}"
    return f"the order is for {order.gpu_count}x {sold}; the machine has {seen or 'no GPUs'}"


def lease_ready(*, lease: Lease, report: ReadyReport, now: dt.datetime | None = None) -> ReadyOutcome:
    """The agent says the machine is usable. The GPUs must be what the order bought (count and model): if they
    are, the lease is ready and, once the provider's instance is recorded, the order runs; if not, the lease
    is refused and the machine is terminated and failed over. Safe to receive twice: a settled lease answers
    what it answered."""
    now = now or timezone.now()
    order = Order.objects.select_related("gpu_model", "offer").get(pk=lease.order_id)
    problem = gpu_problem(order, report.gpus)
    with transaction.atomic():
        locked = Lease.objects.select_for_update().get(pk=lease.pk)
        if locked.state == LeaseState.READY:
            return ReadyOutcome("running")
        if locked.state != LeaseState.CLAIMED:
            return ReadyOutcome("refused", locked.failure_reason or f"the lease is {locked.state}")
        locked.gpus = [vars(g) for g in report.gpus]
        locked.workload_detail = report.workload_detail
        locked.ssh_port, locked.ssh_user, locked.ssh_host = report.ssh_port, report.ssh_user, report.ssh_host or ""
        locked.host_keys = [{"type": k.key_type, "public_key": k.public_key, "fingerprint": k.fingerprint}
                            for k in report.host_keys]  # fmt: skip
        locked.ports = {str(port): host_port for port, host_port in report.ports}
        if problem:
            locked.state, locked.failure_stage, locked.failure_reason = LeaseState.REFUSED, "gpus", problem
            locked.save()
            _settle_on_commit(order.pk)
            return ReadyOutcome("refused", problem)
        locked.state, locked.ready_at = LeaseState.READY, now
        locked.save()
        publish(LeaseReady(order_id=order.pk))
    return ReadyOutcome("running")


def lease_failed(*, lease: Lease, stage: Any, reason: Any, now: dt.datetime | None = None) -> None:
    """The agent could not make the machine usable (``stage``: gpus, workload, ssh or boot). The machine is
    terminated; a workload that would not start fails the order (the buyer's configuration is at fault, another
    machine would fail the same way), any other stage fails over."""
    if stage not in FAILURE_STAGES:
        raise LeaseRefused("invalid", f"stage: one of {', '.join(sorted(FAILURE_STAGES))}")
    if not isinstance(reason, str) or not reason.strip():
        raise LeaseRefused("invalid", "reason: say what failed")
    with transaction.atomic():
        updated = Lease.objects.filter(pk=lease.pk, state=LeaseState.CLAIMED).update(
            state=LeaseState.FAILED, failure_stage=stage, failure_reason=reason[:2000], ended_at=now or timezone.now()
        )
        if updated:
            _settle_on_commit(lease.order_id)


def _settle_on_commit(order_id: int) -> None:
    enqueue_on_commit("marketplace.order_boot_settle", order_id)


_HEARTBEAT_STATES = (
    OrderState.RUNNING,
    OrderState.PROVISIONING,
    OrderState.STOPPING,
    OrderState.STOPPED,
    OrderState.STARTING,
)


def lease_heartbeat(
    *,
    lease: Lease,
    gpus: list[dict[str, Any]],
    workload_state: str,
    logs: str | None = None,
    now: dt.datetime | None = None,
) -> str:
    """Record one telemetry report; answers ``running`` while the order runs on this lease, else ``ended``
    (the agent then stops the workload). ``LeaseRefused`` (400) for a GPU using more memory than it has. A
    report for an order degraded by its agent's silence queues its recovery (``marketplace/orders/silence.py``)."""
    now = now or timezone.now()
    # A machine its buyer stopped, or one starting again, still has its lease: its agent must not quit.
    state_health = (
        Order.objects.filter(pk=lease.order_id, state__in=_HEARTBEAT_STATES).values_list("state", "health").first()
    )
    health = None if state_health is None else state_health[1]
    live = (
        lease.state == LeaseState.READY
        and Instance.objects.filter(attempt_id=lease.attempt_id, active=True).exists()
        and health is not None
    )
    if not live:
        return "ended"
    # Memory within the GPU this lease's machine was launched with (the parser knew only that no GPU has more
    # than 512 GB).
    memory_gb = Attempt.objects.filter(pk=lease.attempt_id).values_list("offer__gpu_memory_gb", flat=True).first()
    if memory_gb:
        try:
            gpus = [protocol.telemetry_check(g, memory_gb=memory_gb) for g in gpus]
        except ValueError as exc:
            raise LeaseRefused("invalid", str(exc)) from None

    def mean(key: str) -> Decimal:
        values = [Decimal(str(g[key])) for g in gpus]
        return (sum(values, Decimal(0)) / len(values)).quantize(Decimal("0.1")) if values else Decimal(0)

    with transaction.atomic():
        LeaseHeartbeat.objects.create(
            lease=lease,
            at=now,
            utilization_pct=mean("utilization_pct"),
            temperature_c=max((Decimal(str(g["temperature_c"])) for g in gpus), default=Decimal(0)),
            power_w=sum((Decimal(str(g["power_w"])) for g in gpus), Decimal(0)),
            gpus=gpus,
            workload_state=workload_state,
        )
        if logs is None:
            Lease.objects.filter(pk=lease.pk).update(last_heartbeat_at=now)
        else:
            Lease.objects.filter(pk=lease.pk).update(last_heartbeat_at=now, workload_log=logs, workload_log_at=now)
        if state_health is not None and state_health[0] == OrderState.STARTING:
            # The first report after the provider accepted a start or reboot makes the order running again
            # (marketplace/orders/actions.py; by name: the orders app imports this one).
            enqueue_on_commit("marketplace.order_running_again", lease.order_id, now.isoformat())
        if health == OrderHealth.DEGRADED:
            # The agent is back: the order recovers, its silent period closing at this report (by name: the
            # orders app imports this one).
            enqueue_on_commit("marketplace.order_silence_recover", lease.order_id)
    return "running"


def lease_end(*, attempt_id: int, now: dt.datetime | None = None) -> None:
    """The attempt's machine is gone (terminated, failed over, lost): its lease ends and its agent is told so."""
    Lease.objects.filter(
        attempt_id=attempt_id, state__in=[LeaseState.WAITING, LeaseState.CLAIMED, LeaseState.READY]
    ).update(state=LeaseState.ENDED, ended_at=now or timezone.now())


def connection_host(lease: Lease, instance: Instance | None) -> str:
    """Where buyers reach the machine: the address the agent reported (an independent host or a sandbox knows
    it), else the provider's public address of the instance."""
    host = lease.ssh_host or (instance.public_ip if instance is not None else "")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host
