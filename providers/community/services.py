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
from django.utils import timezone

from providers.community import protocol
from providers.gpu_names import reported_model_matches
from providers.models import AgentNonce, Machine, MachineHeartbeat, MachineState, ProviderAccount, ProviderKind

log = logging.getLogger("providers.community.security")


class MachineInvalid(ValueError):
    """A listing that cannot be accepted; the message names the field."""


@dataclass(frozen=True)
class ListedMachine:
    machine: Machine
    secret: str  # shown to the provider once, for the agent's --secret-file; stored only encrypted


def machine_list(*, account: ProviderAccount, name: str, listing: dict[str, Any]) -> ListedMachine:
    """List a machine on a community account, pending verification, with a fresh agent key and secret."""
    if account.kind != ProviderKind.COMMUNITY:
        raise MachineInvalid("account: machines are listed on an independent-provider (community) account")
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
    """The agent is up: record where, what hardware it found, and whether that matches the listing."""
    now = timezone.now()
    ok, problem = self_test_matches(machine, self_test)
    Machine.objects.filter(pk=machine.pk).update(
        agent_url=agent_url,
        hardware=hardware,
        self_test={**self_test, "problem": problem},
        self_test_ok=ok,
        registered_at=now,
        last_heartbeat_at=now,
        online=True,
    )
    machine.refresh_from_db()
    return machine


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


def machine_heartbeat(*, machine: Machine, gpus: list[dict[str, Any]], instances: int) -> MachineHeartbeat:
    now = timezone.now()

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
    return beat


def machines_withdraw_silent(*, now: dt.datetime | None = None) -> int:
    """Take offline every machine whose agent has not been heard for ``BROKER_AGENT_SILENCE_S``; their offers go
    at the account's next sync. Also forgets nonces older than the signature window and heartbeats older than
    ``BROKER_HEARTBEAT_RETENTION_S``. Returns how many machines went offline."""
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
