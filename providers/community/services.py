"""Independent providers' machines on the broker's side: listing, agent authentication, registration,
heartbeats, and withdrawing machines that fell silent."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from broker.text import name_problem
from providers.community import protocol
from providers.endpoints import EndpointRefused, endpoint_check
from providers.gpu_names import reported_model_matches
from providers.models import AgentNonce, Machine, MachineHeartbeat, MachineState, ProviderAccount, ProviderKind

log = logging.getLogger("providers.community.security")


class MachineInvalid(ValueError):
    """A listing that cannot be accepted; the message names the field."""


class HeartbeatRefused(Exception):
    """A heartbeat the broker does not keep: ``code`` and ``status`` are the agent protocol's answer."""

    def __init__(self, code: str, message: str, *, status: int):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# A machine not verified keeps only its latest heartbeats (the portal shows it is alive, nothing more).
UNVERIFIED_HEARTBEATS_KEPT = 20
MAX_AGENT_URL = 200  # ``Machine.agent_url``


@dataclass(frozen=True)
class ListedMachine:
    machine: Machine
    secret: str  # shown to the provider once, for the agent's --secret-file; stored only encrypted


def machine_list(*, account: ProviderAccount, name: str, listing: dict[str, Any]) -> ListedMachine:
    """List a machine on a community account, pending verification, with a fresh agent key and secret.
    Raises ``MachineInvalid`` naming the field: another account, a name that is not a readable name
    (``broker.text.name_problem``) or one the account already uses."""
    if account.kind != ProviderKind.COMMUNITY:
        raise MachineInvalid("account: machines are listed on an independent-provider (community) account")
    if problem := name_problem(name):
        raise MachineInvalid(f"name: {problem}")
    secret = protocol.new_secret()
    machine = Machine(account=account, name=name, key_id=protocol.new_key_id(), **listing)
    machine.set_secret(secret)
    try:
        with transaction.atomic():
            machine.save()
    except IntegrityError:
        raise MachineInvalid(f"name: this account already has a machine called {name!r}") from None
    return ListedMachine(machine, secret)


def authenticate(headers: Any, method: str, target: str, body: bytes, *, now: dt.datetime | None = None) -> Machine:
    """The machine that signed this agent request; raises ``protocol.Rejected`` (logged) for a forged, stale
    or replayed one. A nonce is stored once per key: the unique constraint makes a replay fail even when
    two copies arrive at the same moment."""
    moment = now or timezone.now()
    key_id = str(headers.get(protocol.HEADER_KEY, ""))
    machine = Machine.objects.filter(key_id=key_id).first()
    try:
        if machine is None:
            raise protocol.Rejected("unknown_key", f"unknown key {key_id[:32]!r}")
        signed = protocol.check(headers, None, method, target, body, now=moment.timestamp(), secret=machine.secret())
        try:
            with transaction.atomic():
                AgentNonce.objects.create(key_id=key_id, nonce=signed.nonce, seen_at=moment)
        except IntegrityError:
            raise protocol.Rejected("replayed", "this nonce was already used") from None
    except protocol.Rejected as exc:
        log.warning(
            "agent request refused: %s %s key=%s code=%s: %s", method, target, key_id[:32], exc.code, exc.message
        )
        raise
    return machine


def machine_register(
    *, machine: Machine, agent_url: str, hardware: dict[str, Any], self_test: dict[str, Any]
) -> Machine:
    """The agent is up: record where, what hardware it found, and whether that matches the listing.

    ``agent_url`` must be one the broker may connect to (``providers.endpoints``, as for a cloud account's
    endpoint), else ``MachineInvalid`` names it and nothing changes; so does any text in the URL, hardware or
    self-test that is not a readable name (``broker.text.name_problem``: control, format, private-use
    characters, NUL, lone surrogates). A verified machine that comes back at a different URL leaves sale
    until staff verify it again (``machine.pending``, ledgered): the broker would otherwise send buyers to a
    host nobody checked. Its orders carry on; the broker still reaches them at the new URL to describe and
    stop them."""
    from ledger.services import ledger_append

    if len(agent_url) > MAX_AGENT_URL:
        raise MachineInvalid(f"agent_url: at most {MAX_AGENT_URL} characters")
    for field, value in (("agent_url", agent_url), ("hardware", hardware), ("self_test", self_test)):
        if problem := _unreadable(field, value):
            raise MachineInvalid(problem)
    try:
        endpoint_check("agent_url", agent_url)
    except EndpointRefused as exc:
        raise MachineInvalid(str(exc)) from None
    now = timezone.now()
    ok, problem = self_test_matches(machine, self_test)
    with transaction.atomic():
        locked = Machine.objects.select_for_update().get(pk=machine.pk)
        moved = locked.state == MachineState.VERIFIED and bool(locked.agent_url) and locked.agent_url != agent_url
        Machine.objects.filter(pk=machine.pk).update(
            agent_url=agent_url,
            hardware=hardware,
            self_test={**self_test, "problem": problem},
            self_test_ok=ok,
            registered_at=now,
            last_heartbeat_at=now,
            online=True,
            **({"state": MachineState.PENDING} if moved else {}),
        )
        if moved:
            ledger_append(
                kind=f"machine.{MachineState.PENDING}",
                subject=f"machine:{machine.key_id}",
                payload={
                    "machine": machine.key_id,
                    "account": machine.account_id,
                    "previous": MachineState.VERIFIED.value,
                    "state": MachineState.PENDING.value,
                    "reason": "the agent registered at a new URL: staff verify the machine again",
                    "self_test_ok": ok,
                },
            )
    if moved:
        log.warning("machine %s moved to a new agent URL: out of sale until verified again", machine.key_id)
    machine.refresh_from_db()
    return machine


def _unreadable(where: str, value: Any) -> str | None:
    """``"field: why"`` for the first text in an agent's report (keys too) that is not a name people may read,
    else None. Staff read the hardware and self-test, and the provider reads the self-test's error: the same
    rule as for any name (``broker.text``), which also keeps NUL and lone surrogates out of the JSON column."""
    if isinstance(value, str):
        problem = name_problem(value)
        return f"{where}: {problem}" if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            if problem := name_problem(str(key)):
                return f"{where} (a key): {problem}"
            if problem := _unreadable(f"{where}.{key}", item):
                return problem
    if isinstance(value, list):
        for index, item in enumerate(value):
            if problem := _unreadable(f"{where}[{index}]", item):
                return problem
    return None


def self_test_matches(machine: Machine, self_test: dict[str, Any]) -> tuple[bool, str]:
    """Does the agent's self-test show the GPUs the listing promises? (ok, what differs)."""
    if not self_test.get("ok"):
        return False, str(self_test.get("error") or "the self-test failed")
    gpus = self_test.get("gpus") or []
    matching = [g for g in gpus if reported_model_matches(str(g.get("model", "")), machine.gpu_model)]
    if len(matching) < machine.gpu_count:
        return False, f"listing promises {machine.gpu_count}x {machine.gpu_model}, the agent found {len(matching)}"
    if any(int(g.get("memory_gb") or 0) < machine.gpu_memory_gb for g in matching[: machine.gpu_count]):
        return False, f"listing promises {machine.gpu_memory_gb} GB per GPU, the agent found less"
    return True, ""


def machine_heartbeat(
    *, machine: Machine, gpus: list[dict[str, Any]], instances: int, now: dt.datetime | None = None
) -> MachineHeartbeat:
    """Keep one heartbeat. At most ``BROKER_AGENT_HEARTBEATS_PER_MINUTE`` per machine per minute, counted
    on the machine's row with conditional updates (so the limit holds across web processes and racing
    requests): beyond it ``HeartbeatRefused`` (429) and nothing is kept. A machine that is not verified
    keeps only its latest ``UNVERIFIED_HEARTBEATS_KEPT``. Each GPU sample must be telemetry a GPU can show
    (``protocol.telemetry_check``, memory within the listing's): else ``HeartbeatRefused`` (400, naming the
    field)."""
    try:
        # Checked before the rate is counted: a refused sample keeps nothing and takes no slot.
        gpus = [protocol.telemetry_check(g, memory_gb=machine.gpu_memory_gb, required=False) for g in gpus]
    except ValueError as exc:
        raise HeartbeatRefused("invalid", str(exc), status=400) from None
    now = now or timezone.now()
    if not _heartbeat_admitted(machine, now):
        raise HeartbeatRefused(
            "too_many_heartbeats",
            f"at most {settings.AGENT_HEARTBEATS_PER_MINUTE} heartbeats a minute; send one every "
            f"{protocol.HEARTBEAT_S} s",
            status=429,
        )

    def mean(key: str) -> Decimal:
        values = [Decimal(str(g.get(key) or 0)) for g in gpus]
        return (sum(values, Decimal(0)) / len(values)).quantize(Decimal("0.1")) if values else Decimal(0)

    with transaction.atomic():
        beat = MachineHeartbeat.objects.create(
            machine=machine,
            at=now,
            utilization_pct=mean("utilization_pct"),
            temperature_c=max((Decimal(str(g.get("temperature_c") or 0)) for g in gpus), default=Decimal(0)),
            power_w=sum((Decimal(str(g.get("power_w") or 0)) for g in gpus), Decimal(0)),
            gpus=gpus,
            instances=instances,
        )
        Machine.objects.filter(pk=machine.pk).update(last_heartbeat_at=now, online=True)
        if machine.state != MachineState.VERIFIED:
            kept = MachineHeartbeat.objects.filter(machine=machine).order_by("-at", "-pk")
            oldest_kept = kept.values_list("pk", flat=True)[UNVERIFIED_HEARTBEATS_KEPT - 1 : UNVERIFIED_HEARTBEATS_KEPT]
            if oldest_kept:
                cut = kept.get(pk=oldest_kept[0])
                kept.filter(Q(at__lt=cut.at) | Q(at=cut.at, pk__lt=cut.pk)).delete()
    return beat


def _heartbeat_admitted(machine: Machine, now: dt.datetime) -> bool:
    """Count one heartbeat in the machine's current one-minute window, or open a new window; False when the
    window is full. Each step is one conditional UPDATE, so two processes cannot both take the last slot."""
    window_open = now - dt.timedelta(seconds=60)
    rows = Machine.objects.filter(pk=machine.pk)
    counted = rows.filter(
        beat_window_start__gt=window_open,
        beat_window_start__lte=now,
        beat_window_count__lt=settings.AGENT_HEARTBEATS_PER_MINUTE,
    ).update(beat_window_count=F("beat_window_count") + 1)
    if counted:
        return True
    renewed = rows.filter(
        Q(beat_window_start__isnull=True) | Q(beat_window_start__lte=window_open) | Q(beat_window_start__gt=now)
    ).update(beat_window_start=now, beat_window_count=1)
    return bool(renewed)


def machines_withdraw_silent(*, now: dt.datetime | None = None) -> int:
    """Take offline every machine whose agent has not been heard for ``BROKER_AGENT_SILENCE_S``; their offers go
    at the account's next sync. Also forgets nonces older than the signature window and heartbeats older than
    ``BROKER_HEARTBEAT_RETENTION_S`` (``BROKER_UNVERIFIED_HEARTBEAT_RETENTION_S`` for a machine that is not
    verified). Returns how many machines went offline."""
    moment = now or timezone.now()
    cutoff = moment - dt.timedelta(seconds=settings.AGENT_SILENCE_S)
    silent = Machine.objects.filter(online=True, last_heartbeat_at__lt=cutoff)
    names = list(silent.values_list("name", flat=True))
    withdrawn = silent.update(online=False)
    if withdrawn:
        log.info("withdrew %d silent machine(s): %s", withdrawn, ", ".join(names))
    AgentNonce.objects.filter(seen_at__lt=moment - dt.timedelta(seconds=2 * protocol.MAX_SKEW_S)).delete()
    # Reliability reads a day of heartbeats and the chart an hour: older ones would only grow the table.
    MachineHeartbeat.objects.filter(at__lt=moment - dt.timedelta(seconds=settings.HEARTBEAT_RETENTION_S)).delete()
    # A machine not verified has no reliability to compute: its heartbeats only show it is alive.
    MachineHeartbeat.objects.filter(
        at__lt=moment - dt.timedelta(seconds=settings.UNVERIFIED_HEARTBEAT_RETENTION_S)
    ).exclude(machine__state=MachineState.VERIFIED).delete()
    return withdrawn


def machine_decide(*, machine: Machine, state: str, by: Any, reason: str) -> Machine:
    """Staff verify (or suspend) a machine; ledgered with why, and who as an erasable commitment."""
    from ledger.services import ledger_append, user_commitment

    if state not in (MachineState.VERIFIED, MachineState.SUSPENDED):
        raise MachineInvalid(f"state: {state!r} is not verified or suspended")
    if not reason.strip():
        raise MachineInvalid("reason: say why, for the record")
    with transaction.atomic():
        previous = Machine.objects.select_for_update().get(pk=machine.pk).state
        Machine.objects.filter(pk=machine.pk).update(state=state)
        ledger_append(
            kind=f"machine.{state}",
            subject=f"machine:{machine.key_id}",
            payload={
                "machine": machine.key_id,
                "account": machine.account_id,
                "previous": previous,
                "state": state,
                "reason": reason,
                "self_test_ok": machine.self_test_ok,
                "by": user_commitment(by),
            },
        )
    machine.refresh_from_db()
    return machine
