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
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from providers.community import protocol
from providers.community.mig import mig_profiles_problem
from providers.community.plausibility import CardLimits, reason_text, telemetry_problems
from providers.community.pricing import PriceFallRule
from providers.community.signals import machine_state_changed
from providers.endpoints import EndpointRefused, endpoint_check
from providers.gpu_names import reported_model_matches
from providers.gpu_specs import gpu_spec_get
from providers.models import AgentNonce, Machine, MachineHeartbeat, MachineState, ProviderAccount, ProviderKind
from providers.text import name_problem

log = logging.getLogger("providers.community.security")


class MachineInvalid(ValueError):
    """A listing that cannot be accepted; the message names the field."""


class AgentCallRefused(Exception):
    """An agent's call the broker does not accept: ``code`` and ``status`` are the agent protocol's answer."""

    def __init__(self, code: str, message: str, *, status: int):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class HeartbeatRefused(AgentCallRefused):
    """A heartbeat the broker does not keep."""


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
    (``providers.text.name_problem``) or one the account already uses, a minimum GPUs per lease outside 1 to the
    GPU count, MIG profiles its GPU model does not offer. Without ``min_gpus_per_lease`` it is sold whole."""
    if account.kind != ProviderKind.COMMUNITY:
        raise MachineInvalid("account: machines are listed on an independent-provider (community) account")
    if problem := name_problem(name):
        raise MachineInvalid(f"name: {problem}")
    listing = {**listing, "min_gpus_per_lease": listing.get("min_gpus_per_lease") or listing["gpu_count"]}
    if not 1 <= listing["min_gpus_per_lease"] <= listing["gpu_count"]:
        raise MachineInvalid("min_gpus_per_lease: from 1 to the machine's GPU count")
    listing["mig_profiles"] = list(listing.get("mig_profiles") or [])
    if problem := mig_profiles_problem(str(listing["gpu_model"]), listing["mig_profiles"]):
        raise MachineInvalid(f"mig_profiles: {problem}")
    secret = protocol.new_secret()
    machine = Machine(account=account, name=name, key_id=protocol.new_key_id(), **listing)
    machine.set_secret(secret)
    try:
        with transaction.atomic():
            machine.save()
    except IntegrityError:
        raise MachineInvalid(f"name: this account already has a machine called {name!r}") from None
    return ListedMachine(machine, secret)


# The rule's percentages are stored with two decimals (``Machine.fragment_discount_pct`` and its siblings).
_PCT_PLACES = Decimal("0.01")
PRICE_FALL_FIELDS = ("fragment_discount_pct", "idle_after_hours", "idle_step_pct", "floor_pct")


def machine_price_fall_set(*, machine: Machine, rule: PriceFallRule) -> Machine:
    """Store the price falls the seller accepts for ``machine``. ``rule`` was checked when it was made
    (``PriceFallRule`` raises ``PriceRuleError`` naming the field); here its percentages must also fit the
    columns' two decimals, and a discount needs a floor below 100 %, else ``MachineInvalid`` names the field
    and nothing is stored. The offers follow at the account's next sync (the caller asks for one); setting the
    same rule again writes nothing."""
    for name in ("fragment_discount_pct", "idle_step_pct", "floor_pct"):
        value = getattr(rule, name)
        if value != value.quantize(_PCT_PLACES):
            raise MachineInvalid(f"{name}: at most two decimals, not {value}")
    if rule.floor_pct == 100 and (rule.fragment_discount_pct > 0 or rule.idle_step_pct > 0):
        # The rule would be stored and silently do nothing: the seller meant a fall, so ask for its floor.
        raise MachineInvalid("floor_pct: a floor of 100 % keeps the list price; set the lowest share you accept")
    values = {name: getattr(rule, name) for name in PRICE_FALL_FIELDS}
    if all(getattr(machine, name) == value for name, value in values.items()):
        return machine
    Machine.objects.filter(pk=machine.pk).update(**values)
    for name, value in values.items():
        setattr(machine, name, value)
    return machine


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
    self-test that is not a readable name (``providers.text.name_problem``: control, format, private-use
    characters, NUL, lone surrogates). A verified machine that comes back at a different URL (or at a URL
    after being outbound-only) leaves sale until staff verify it again (``machine.pending``, ledgered): the
    broker would otherwise send buyers to a host nobody checked. Its orders carry on; the broker still reaches
    them at the new URL to describe and stop them."""
    if len(agent_url) > MAX_AGENT_URL:
        raise MachineInvalid(f"agent_url: at most {MAX_AGENT_URL} characters")
    for field, value in (("agent_url", agent_url), ("hardware", hardware), ("self_test", self_test)):
        if problem := _unreadable(field, value):
            raise MachineInvalid(problem)
    try:
        if agent_url:  # empty: an outbound-only agent, which the broker never connects to
            endpoint_check("agent_url", agent_url)
    except EndpointRefused as exc:
        raise MachineInvalid(str(exc)) from None
    now = timezone.now()
    ok, problem = self_test_matches(machine, self_test, hardware)
    with transaction.atomic():
        locked = Machine.objects.select_for_update().get(pk=machine.pk)
        # Any URL staff did not verify, an outbound-only machine's first one too; dropping to outbound-only is
        # not a move (the broker then connects nowhere), nor is a first registration (nothing was verified at
        # any URL: staff verify a registered self-test, so only a seeded machine is verified unregistered).
        moved = (
            locked.state == MachineState.VERIFIED
            and locked.registered_at is not None
            and bool(agent_url)
            and locked.agent_url != agent_url
        )
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
            # In this transaction: the market's record of the change (marketplace/machines.py) commits with it.
            machine_state_changed.send(
                sender=Machine,
                machine=locked,
                previous=MachineState.VERIFIED.value,
                state=MachineState.PENDING.value,
                reason="the agent registered at a new URL: staff verify the machine again",
                self_test_ok=ok,
                by=None,
            )
    if moved:
        log.warning("machine %s moved to a new agent URL: out of sale until verified again", machine.key_id)
    machine.refresh_from_db()
    return machine


def _unreadable(where: str, value: Any) -> str | None:
    """``"field: why"`` for the first text in an agent's report (keys too) that is not a name people may read,
    else None. Staff read the hardware and self-test, and the provider reads the self-test's error: the same
    rule as for any name (``providers.text``), which also keeps NUL and lone surrogates out of the JSON column."""
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


# A host-to-device copy over a healthy link reaches well over half its one-way rate (pinned memory, x16).
# Under a third the card sits in a much narrower or older slot than its listing implies, or the figure
# is invented: either way buyers would not get the machine listed.
H2D_MIN_SHARE = 1 / 3
# For cards whose spec row gives NVLink rather than the host link: the slowest host link any of them ships
# with, PCIe Gen3 x16 (16 GB/s each way; the V100 SXM2).
SLOWEST_HOST_LINK_GBS = 16.0


def expected_h2d_gbs(gpu_model: str) -> float:
    """The host-to-device rate (GB/s, one way) a card of ``gpu_model`` in its proper slot offers: half the
    spec table's bidirectional PCIe figure for a PCIe card, else ``SLOWEST_HOST_LINK_GBS``."""
    spec = gpu_spec_get(gpu_model)
    if spec is not None and spec["interconnect"] == "pcie":
        return float(spec["interconnect_gbs"]) / 2
    return SLOWEST_HOST_LINK_GBS


def self_test_matches(
    machine: Machine, self_test: dict[str, Any], hardware: dict[str, Any] | None = None
) -> tuple[bool, str]:
    """Does the agent's self-test show the GPUs the listing promises? (ok, what differs). It must find at
    least the listed number of the listed model (``gpu_names.reported_model_matches``), each with the listed
    memory; its GPUs must be those of the agent's own hardware report, when it sends one; and its measured
    host-to-device copy rate (``h2d_bandwidth_gbs``, when measured) must not be far below what the model's
    host link offers (``expected_h2d_gbs``). A mismatch keeps the machine from being verified."""
    if not self_test.get("ok"):
        return False, str(self_test.get("error") or "the self-test failed")
    gpus = [g for g in self_test.get("gpus") or [] if isinstance(g, dict)]
    matching = [g for g in gpus if reported_model_matches(str(g.get("model", "")), machine.gpu_model)]
    if len(matching) < machine.gpu_count:
        found = _gpu_summary(gpus)
        return False, (
            f"listing promises {machine.gpu_count}x {machine.gpu_model}, the agent found {len(matching)}"
            + (f" (it reports {found})" if found else "")
        )
    if any(_number(g.get("memory_gb")) < machine.gpu_memory_gb for g in matching[: machine.gpu_count]):
        return False, f"listing promises {machine.gpu_memory_gb} GB per GPU, the agent found less"
    listed = (hardware or {}).get("gpus")
    if isinstance(listed, list) and listed and len(listed) != len(gpus):
        return False, f"the agent's hardware report lists {len(listed)} GPUs, its self-test {len(gpus)}"
    measured = self_test.get("h2d_bandwidth_gbs")
    if measured is not None:
        expected = expected_h2d_gbs(machine.gpu_model)
        if _number(measured) < expected * H2D_MIN_SHARE:
            return False, (
                f"host-to-device copies run at {_number(measured):g} GB/s; a {machine.gpu_model} in its proper "
                f"slot gives about {expected:g} GB/s (at least {expected * H2D_MIN_SHARE:.1f} expected)"
            )
    return True, ""


def _number(value: Any) -> float:
    """A figure from the agent's report, or 0 for anything that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0.0
    return float(value)


def _gpu_summary(gpus: list[dict[str, Any]]) -> str:
    """ "8x NVIDIA A100-SXM4-80GB" for what a self-test reports, each distinct model once, kept short."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        model = str(gpu.get("model", ""))[:48]
        counts[model] = counts.get(model, 0) + 1
    return ", ".join(f"{n}x {model}" for model, n in list(counts.items())[:4])


def machine_heartbeat(
    *, machine: Machine, gpus: list[dict[str, Any]], instances: int, now: dt.datetime | None = None
) -> MachineHeartbeat:
    """Keep one heartbeat. At most ``BROKER_AGENT_HEARTBEATS_PER_MINUTE`` per machine per minute, counted
    on the machine's row with conditional updates (so the limit holds across web processes and racing
    requests): beyond it ``HeartbeatRefused`` (429) and nothing is kept. A machine that is not verified
    keeps only its latest ``UNVERIFIED_HEARTBEATS_KEPT``. Each GPU sample must be telemetry a GPU can show
    (``protocol.telemetry_check``, memory within the listing's): else ``HeartbeatRefused`` (400, naming the
    field). Samples beyond what the listed model can physically report (``plausibility``) are kept, with
    ``unverified_reason`` saying why, so they are shown as unverified rather than as fact."""
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

    leased = _machine_leased(machine, now)
    problems = telemetry_problems(gpus, card=_card_limits(machine), listed_gpus=machine.gpu_count, leased=leased)
    with transaction.atomic():
        beat = MachineHeartbeat.objects.create(
            machine=machine,
            at=now,
            utilization_pct=mean("utilization_pct"),
            temperature_c=max((Decimal(str(g.get("temperature_c") or 0)) for g in gpus), default=Decimal(0)),
            power_w=sum((Decimal(str(g.get("power_w") or 0)) for g in gpus), Decimal(0)),
            gpus=gpus,
            instances=instances,
            unverified_reason=reason_text(problems),
        )
        Machine.objects.filter(pk=machine.pk).update(last_heartbeat_at=now, online=True)
        if machine.state != MachineState.VERIFIED:
            kept = MachineHeartbeat.objects.filter(machine=machine).order_by("-at", "-pk")
            oldest_kept = kept.values_list("pk", flat=True)[UNVERIFIED_HEARTBEATS_KEPT - 1 : UNVERIFIED_HEARTBEATS_KEPT]
            if oldest_kept:
                cut = kept.get(pk=oldest_kept[0])
                kept.filter(Q(at__lt=cut.at) | Q(at=cut.at, pk__lt=cut.pk)).delete()
    return beat


# Utilization trails a lease's end by a heartbeat or two (the agent samples, then reports).
LEASE_TAIL = dt.timedelta(seconds=2 * protocol.HEARTBEAT_S)


def _card_limits(machine: Machine) -> CardLimits:
    """One listed GPU's physical limits: the spec table's rating and memory, the listing's memory for a model
    the table does not know."""
    spec = gpu_spec_get(machine.gpu_model)
    if spec is None:
        return CardLimits(tdp_w=None, memory_gb=float(machine.gpu_memory_gb))
    return CardLimits(tdp_w=spec["tdp_w"], memory_gb=float(spec["memory_gb"]))


def _machine_leased(machine: Machine, now: dt.datetime) -> bool:
    """Does the broker have an instance on this machine (one machine is one zone of its account), running
    now or ended within ``LEASE_TAIL``? The broker's own record, not the agent's ``instances`` count."""
    return (
        machine.account.instances.filter(zone=machine.name, launched_at__lte=now)
        .filter(Q(terminated_at__isnull=True) | Q(terminated_at__gte=now - LEASE_TAIL))
        .exists()
    )


def minute_window_admit(rows: QuerySet[Any], *, start: str, count: str, limit: int, now: dt.datetime) -> bool:
    """Count one call in the one-minute window held in the ``start`` and ``count`` fields of ``rows`` (one
    row), or open a new window; False when the window is full. Each step is one conditional UPDATE, so two
    processes cannot both take the last slot."""
    window_open = now - dt.timedelta(seconds=60)
    counted = rows.filter(**{f"{start}__gt": window_open, f"{start}__lte": now, f"{count}__lt": limit}).update(
        **{count: F(count) + 1}
    )
    if counted:
        return True
    stale = Q(**{f"{start}__isnull": True}) | Q(**{f"{start}__lte": window_open}) | Q(**{f"{start}__gt": now})
    return bool(rows.filter(stale).update(**{start: now, count: 1}))


def _heartbeat_admitted(machine: Machine, now: dt.datetime) -> bool:
    return minute_window_admit(
        Machine.objects.filter(pk=machine.pk),
        start="beat_window_start",
        count="beat_window_count",
        limit=settings.AGENT_HEARTBEATS_PER_MINUTE,
        now=now,
    )


def _silence_cutoff(now: dt.datetime) -> dt.datetime:
    """A machine last heard before this is silent: withdrawn from sale, and its leases lost."""
    return now - dt.timedelta(seconds=settings.AGENT_SILENCE_S)


def machine_silent_since(
    *, account_id: int, name: str, now: dt.datetime, heard_at: dt.datetime | None = None
) -> dt.datetime | None:
    """When the account's machine ``name`` was last heard from, if it is silent now; None while it is not.

    Heard from means its agent's last heartbeat or ``heard_at`` (a later report the caller knows of, such as
    a lease agent's on that machine), whichever is later; silent means that moment is older than
    ``BROKER_AGENT_SILENCE_S``, the rule ``machines_withdraw_silent`` withdraws by. None for an account with
    no such machine (a cloud's), so a caller can ask of any instance. A read only."""
    machine = Machine.objects.filter(account_id=account_id, name=name).first()
    if machine is None:
        return None
    # A machine that never heartbeated was last heard when it registered (or was listed).
    heard = [t for t in (machine.last_heartbeat_at or machine.registered_at or machine.created_at, heard_at) if t]
    last = max(heard)
    return last if last < _silence_cutoff(now) else None


def machines_withdraw_silent(*, now: dt.datetime | None = None) -> int:
    """Take offline every machine whose agent has not been heard for ``BROKER_AGENT_SILENCE_S``; their offers go
    at the account's next sync. Also forgets nonces older than the signature window and heartbeats older than
    ``BROKER_HEARTBEAT_RETENTION_S`` (``BROKER_UNVERIFIED_HEARTBEAT_RETENTION_S`` for a machine that is not
    verified). Returns how many machines went offline."""
    moment = now or timezone.now()
    silent = Machine.objects.filter(online=True, last_heartbeat_at__lt=_silence_cutoff(moment))
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
