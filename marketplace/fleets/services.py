"""What a buyer does to a fleet (create it, change its bounds, rule, cap or budget, end it) and the evaluation
that makes it follow its rule.

``fleet_evaluate`` is the heart: under the fleet's row lock it sorts the replicas (running, starting, silent
past the grace, gone), reads the load over the rule's window, works out what the budget still affords, asks
``policy.decide`` and acts: each new replica is the matching engine's best offer across every provider kind
within the price cap and the budget left, placed as a plain order with an idempotency key derived from the fleet,
the decision's number and the replica's index; a scale-in ends starting replicas first, then the dearest. The
decision, its ``fleet.scaled`` ledger entry and webhook, and every order it placed or ended commit together,
so two evaluations at once (the beat's and a replica's reaction) decide one after the other, and the second
sees what the first did.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.billing.credit import PaymentRequired
from marketplace.fleets import telemetry
from marketplace.fleets.policy import Action, Decision, FleetView, RuleKind, decide
from marketplace.fleets.selectors import (
    HELD_STATES,
    LIVE_STATES,
    STARTING_STATES,
    fleet_price_per_hour,
    fleet_spent_usd,
)
from marketplace.fleets.specs import FleetFields, FleetInvalid, fleet_fields_parse, rule_of
from marketplace.launch.config import LaunchChoice, LaunchConfigInvalid, launch_configuration_create
from marketplace.matching import Demand
from marketplace.matching.types import Amount, Profile, Tolerance
from marketplace.models import (
    Fleet,
    FleetAction,
    FleetDecision,
    FleetState,
    Order,
    OrderHealth,
    OrderState,
    Organization,
    Quote,
    SilentPeriod,
    WebhookEventType,
)
from marketplace.models.fleets import MetricSource
from marketplace.orders.budgets import BudgetExceeded
from marketplace.orders.errors import IdempotencyConflict, OrderError, TransitionRefused
from marketplace.orders.quoting import quote_request
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import webhook_event_emit

log = logging.getLogger(__name__)

TOKEN_PREFIX = "fmt_"  # noqa: S105 - a label that makes a leaked metrics token recognisable, not a secret
TOKEN_ENV = "BROKER_FLEET_METRICS_TOKEN"  # noqa: S105 - the variable's name
URL_ENV = "BROKER_FLEET_METRICS_URL"
_HOUR = Decimal("1")


class FleetEnded(OrderError):
    """The fleet has ended: it neither changes nor places again."""

    code = "fleet_ended"


def _ledger(fleet: Fleet, kind: str, **fields: Any) -> None:
    ledger_append(
        kind=kind,
        subject=f"fleet:{fleet.public_id}",
        payload={"fleet": str(fleet.public_id), "organization": fleet.organization_id, **fields},
    )


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def metrics_url(fleet_public_id: uuid.UUID) -> str:
    return f"{settings.PUBLIC_URL}/api/v1/fleets/{fleet_public_id}/metrics"


# --- Create, update, end ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetCreated:
    fleet: Fleet
    created: bool
    metrics_token: str | None  # shown once, on creation; None on a replay


def _fingerprint(data: Mapping[str, Any]) -> str:
    # Keyed: the launch configuration may hold the buyer's secret values, and a plain hash of one can be guessed.
    message = json.dumps(data, sort_keys=True, default=str).encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def fleet_create(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    data: Mapping[str, Any],
    idempotency_key: str | None = None,
    caller_address: str | None = None,
    now: dt.datetime | None = None,
) -> FleetCreated:
    """Create a fleet from the buyer's ``data`` (``specs.fleet_fields_parse`` for the fields, ``launch`` an inline
    launch configuration) and queue its first evaluation, which places its minimum.

    Raises ``FleetInvalid`` or ``LaunchConfigInvalid`` naming every wrong field, before anything is stored.
    Idempotent on (organization, ``idempotency_key``): the same body again returns the first fleet (``created``
    False, no token shown again); another body raises ``IdempotencyConflict``. The metrics token is made here,
    kept only as its SHA-256, and travels to the replicas as a secret env var of the launch configuration."""
    now = now or timezone.now()
    fields = fleet_fields_parse(data)
    fingerprint = _fingerprint(data)
    if idempotency_key:
        existing = Fleet.objects.filter(organization=organization, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replay(existing, fingerprint)
    public_id = uuid.uuid4()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    # The metrics token and URL reach the machine over the lease agent's signed channel, never in user data.
    broker_env = ((TOKEN_ENV, token, True), (URL_ENV, metrics_url(public_id), False))
    try:
        with transaction.atomic():
            config = launch_configuration_create(
                organization=organization,
                user=user,
                choice=LaunchChoice(data=data.get("launch"), caller_address=caller_address),
                broker_env=broker_env,
            )
            fleet = Fleet.objects.create(
                public_id=public_id,
                organization=organization,
                created_by=user,
                launch_config=config,
                metrics_token_hash=token_hash(token),
                state=FleetState.ACTIVE,
                state_changed_at=now,
                desired=0,
                idempotency_key=idempotency_key or None,
                request_fingerprint=fingerprint,
                **_columns(fields),
            )
            _ledger(fleet, "fleet.created", launch_sha256=config.sha256, **_ledgered(fleet))
            enqueue_on_commit("marketplace.fleet_evaluate", fleet.pk)
    except IntegrityError:
        if not idempotency_key:
            raise
        existing = Fleet.objects.get(organization=organization, idempotency_key=idempotency_key)
        return _replay(existing, fingerprint)
    # Read back: the columns as stored (a price given as "2.5" is 2.5000), with the configuration.
    fleet = Fleet.objects.select_related("launch_config").get(pk=fleet.pk)
    return FleetCreated(fleet=fleet, created=True, metrics_token=token)


def _replay(existing: Fleet, fingerprint: str) -> FleetCreated:
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyConflict("this Idempotency-Key was already used with a different request body")
    return FleetCreated(fleet=existing, created=False, metrics_token=None)


def _columns(fields: FleetFields) -> dict[str, Any]:
    rule = fields.rule
    return {
        "name": fields.name,
        "demand": fields.demand,
        "max_price_per_gpu_hour": fields.max_price_per_gpu_hour,
        "budget_usd": fields.budget_usd,
        "min_replicas": fields.min_replicas,
        "max_replicas": fields.max_replicas,
        "rule_kind": rule.rule_kind,
        "rule_target": rule.rule_target,
        "rule_tolerance": rule.rule_tolerance,
        "rule_window_s": rule.rule_window_s,
        "scale_out_cooldown_s": rule.scale_out_cooldown_s,
        "scale_in_cooldown_s": rule.scale_in_cooldown_s,
        "step_out": rule.step_out,
        "step_in": rule.step_in,
        "schedule": rule.schedule,
        "metric_name": rule.metric_name,
        "metric_source": rule.metric_source,
        "metric_port": rule.metric_port,
        "metric_path": rule.metric_path,
    }


def fleet_rule_json(fleet: Fleet) -> dict[str, Any]:
    """The fleet's rule as the buyer states it (what ``specs.rule_parse`` reads)."""
    rule: dict[str, Any] = {
        "kind": fleet.rule_kind,
        "target": fleet.rule_target,
        "tolerance": fleet.rule_tolerance,
        "window_s": fleet.rule_window_s,
        "scale_out_cooldown_s": fleet.scale_out_cooldown_s,
        "scale_in_cooldown_s": fleet.scale_in_cooldown_s,
        "step_out": fleet.step_out,
        "step_in": fleet.step_in,
    }
    if fleet.rule_kind == RuleKind.SCHEDULE:
        rule["schedule"] = fleet.schedule
    if fleet.rule_kind == RuleKind.METRIC:
        metric: dict[str, Any] = {"name": fleet.metric_name, "source": fleet.metric_source}
        if fleet.metric_source == MetricSource.PROMETHEUS:
            metric.update(port=fleet.metric_port, path=fleet.metric_path)
        rule["metric"] = metric
    return rule


def _ledgered(fleet: Fleet) -> dict[str, Any]:
    """The fleet's terms as its ledger entries record them (no launch secrets: the configuration's hash only)."""
    return {
        "name": fleet.name,
        "demand": fleet.demand,
        "max_price_per_gpu_hour": fleet.max_price_per_gpu_hour,
        "budget_usd": fleet.budget_usd,
        "min_replicas": fleet.min_replicas,
        "max_replicas": fleet.max_replicas,
        "rule": json.loads(json.dumps(fleet_rule_json(fleet)), parse_float=Decimal),
    }


UPDATABLE = frozenset({"name", "min_replicas", "max_replicas", "rule", "budget_usd", "max_price_per_gpu_hour"})


def fleet_update(*, fleet: Fleet, data: Mapping[str, Any], now: dt.datetime | None = None) -> Fleet:
    """Change the fields given (``UPDATABLE``; ``budget_usd`` None removes the budget), checked as on creation,
    and evaluate the fleet again at once. Raises ``FleetInvalid`` naming the field, ``FleetEnded`` for an ended
    fleet."""
    if not isinstance(data, Mapping):
        raise FleetInvalid({"non_field_errors": "a JSON object of the fields to change"})
    unknown = sorted(str(k)[:40] for k in set(data) - UPDATABLE)
    if unknown:
        raise FleetInvalid({name: "not a field that can be changed" for name in unknown})
    now = now or timezone.now()
    with transaction.atomic():
        locked = Fleet.objects.select_for_update().get(pk=fleet.pk)
        if locked.state != FleetState.ACTIVE:
            raise FleetEnded(f"fleet {locked.public_id} has ended")
        merged = {
            "name": locked.name,
            "demand": locked.demand,
            "max_price_per_gpu_hour": format(locked.max_price_per_gpu_hour, "f"),
            "budget_usd": None if locked.budget_usd is None else format(locked.budget_usd, "f"),
            "min_replicas": locked.min_replicas,
            "max_replicas": locked.max_replicas,
            "rule": fleet_rule_json(locked),
            **data,
        }
        fields = fleet_fields_parse(merged)
        for name, value in _columns(fields).items():
            setattr(locked, name, value)
        locked.save()
        _ledger(locked, "fleet.updated", changed=sorted(data), **_ledgered(locked))
        enqueue_on_commit("marketplace.fleet_evaluate", locked.pk)
    return Fleet.objects.select_related("launch_config").get(pk=fleet.pk)  # as stored: "2.5" reads 2.5000


def fleet_end(*, fleet: Fleet, reason: str = "ended by the buyer", now: dt.datetime | None = None) -> Fleet:
    """End the fleet: claim active -> ended (a conditional UPDATE), terminate every live replica, record the
    decision with its ledger entry and webhook. Idempotent: an ended fleet is returned as it is."""
    now = now or timezone.now()
    with transaction.atomic():
        claimed = Fleet.objects.filter(pk=fleet.pk, state=FleetState.ACTIVE).update(
            state=FleetState.ENDED,
            state_reason=reason[:500],
            state_changed_at=now,
            desired=0,
            decision_count=F("decision_count") + 1,
        )
        locked = Fleet.objects.select_for_update().get(pk=fleet.pk)
        if not claimed:
            return locked
        live = list(Order.objects.filter(fleet=locked, state__in=LIVE_STATES).order_by("pk"))
        ended = [o for o in live if _terminate(o, f"fleet {locked.name} ended: {reason}")]
        _record(
            locked,
            action=FleetAction.END,
            desired=0,
            current=len(live),
            load=None,
            reason=reason,
            placed=[],
            ended=ended,
            now=now,
        )
    return locked


def _terminate(order: Order, reason: str) -> bool:
    try:
        order_terminate(order=order, reason=reason[:1000])
    except TransitionRefused:
        return False  # it ended on its own meanwhile
    return True


# --- Evaluation -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation decided and did; ``record`` is None for a hold whose reason had not changed."""

    decision: Decision
    load: float | None
    placed: tuple[Order, ...]
    ended: tuple[Order, ...]
    record: FleetDecision | None


def fleet_evaluate(*, fleet_id: int, now: dt.datetime | None = None) -> Evaluation | None:
    """Make the fleet follow its rule now (see the module's doc); None for an ended or unknown fleet.

    Safe to run twice, and concurrently: the fleet's row lock orders evaluations, and each placement's
    idempotency key (fleet, decision number, index) makes a replayed one place nothing new. A placement the
    engine cannot fill, or the budget or credit refuses, is recorded in the decision's reason, never raised."""
    now = now or timezone.now()
    fleet = Fleet.objects.filter(pk=fleet_id).first()
    if fleet is None or fleet.state != FleetState.ACTIVE:
        return None
    if fleet.rule_kind == RuleKind.METRIC and fleet.metric_source == MetricSource.PROMETHEUS:
        # Network reads before the lock: each may take its whole deadline.
        telemetry.prometheus_scrape(fleet=fleet, now=now)
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().select_related("organization", "created_by").get(pk=fleet_id)
        if fleet.state != FleetState.ACTIVE:
            return None
        return _evaluate_locked(fleet, now)


def _evaluate_locked(fleet: Fleet, now: dt.datetime) -> Evaluation:
    live = list(Order.objects.filter(fleet=fleet, state__in=LIVE_STATES).order_by("pk"))
    silent = _silent(live, now)
    ended: list[Order] = []
    for order in silent:
        grace = int(settings.FLEET_SILENT_GRACE_S)
        if _terminate(order, f"fleet {fleet.name}: its agent was silent for over {grace} s; replaced"):
            ended.append(order)
    live = [o for o in live if o not in silent]
    running = [o for o in live if o.state in HELD_STATES]
    starting = [o for o in live if o.state in STARTING_STATES]

    rule = rule_of(
        kind=fleet.rule_kind,
        target=fleet.rule_target,
        tolerance=fleet.rule_tolerance,
        window_s=fleet.rule_window_s,
        scale_out_cooldown_s=fleet.scale_out_cooldown_s,
        scale_in_cooldown_s=fleet.scale_in_cooldown_s,
        step_out=fleet.step_out,
        step_in=fleet.step_in,
        schedule=fleet.schedule,
    )
    since = now - dt.timedelta(seconds=fleet.rule_window_s)
    load: float | None = None
    if fleet.rule_kind == RuleKind.UTILIZATION:
        load = telemetry.utilization_load(running=running, since=since, now=now)
    elif fleet.rule_kind == RuleKind.METRIC:
        load = telemetry.metric_load(fleet=fleet, since=since, now=now)
    remaining = _budget_left(fleet, now)
    affordable = None if remaining is None else _affordable(fleet, live, remaining)
    view = FleetView(
        now=now,
        minimum=fleet.min_replicas,
        maximum=fleet.max_replicas,
        running=len(running),
        starting=len(starting),
        desired_before=fleet.desired,
        load=load,
        affordable=affordable,
        last_scale_out=fleet.last_scale_out,
        last_scale_in=fleet.last_scale_in,
    )
    decision = decide(rule, view)
    number = fleet.decision_count + 1
    placed: list[Order] = []
    reason = decision.reason
    failures = _recent_failures(fleet, now)
    if decision.change > 0 and failures >= max(2, decision.desired):
        # Replicas that fail as fast as they are placed would otherwise churn orders in a loop (each failure
        # evaluates the fleet again): wait until they age out of the window.
        reason = f"{reason}; {failures} replicas failed in the last {settings.FLEET_FAILURE_WINDOW_S:g} s: none placed"
    elif decision.change > 0:
        placed, shortfall = _scale_out(fleet, decision.change, live, remaining, number, now)
        if shortfall:
            reason = f"{reason}; {shortfall}"
    elif decision.change < 0:
        ended += _scale_in(fleet, -decision.change, running, starting, decision.reason)

    fields: dict[str, Any] = {"desired": decision.desired, "decision_count": number, "evaluated_at": now}
    if decision.action == Action.SCALE_OUT and placed:
        fields["last_scale_out"] = now
    if decision.action == Action.SCALE_IN:
        fields["last_scale_in"] = now
    Fleet.objects.filter(pk=fleet.pk).update(**fields)
    for name, value in fields.items():
        setattr(fleet, name, value)

    record = None
    if _worth_recording(fleet, decision.action, reason, placed, ended):
        record = _record(
            fleet,
            action=FleetAction(decision.action.value),
            desired=decision.desired,
            current=decision.current,
            load=load,
            reason=reason,
            placed=placed,
            ended=ended,
            now=now,
        )
    return Evaluation(decision=decision, load=load, placed=tuple(placed), ended=tuple(ended), record=record)


def _silent(live: list[Order], now: dt.datetime) -> list[Order]:
    """Running replicas whose agent has been silent past the grace: the fleet ends and replaces them."""
    degraded = [o.pk for o in live if o.state == OrderState.RUNNING and o.health == OrderHealth.DEGRADED]
    if not degraded:
        return []
    cutoff = now - dt.timedelta(seconds=settings.FLEET_SILENT_GRACE_S)
    silent_ids = set(
        SilentPeriod.objects.filter(order_id__in=degraded, ended_at__isnull=True, started_at__lte=cutoff).values_list(
            "order_id", flat=True
        )
    )
    return [o for o in live if o.pk in silent_ids]


def _recent_failures(fleet: Fleet, now: dt.datetime) -> int:
    since = now - dt.timedelta(seconds=settings.FLEET_FAILURE_WINDOW_S)
    return Order.objects.filter(fleet=fleet, state=OrderState.FAILED, state_changed_at__gt=since).count()


def _budget_left(fleet: Fleet, now: dt.datetime) -> Decimal | None:
    if fleet.budget_usd is None:
        return None
    return fleet.budget_usd - fleet_spent_usd(fleet=fleet, now=now)


def replica_cap(fleet: Fleet) -> Decimal:
    """The most one replica may cost per hour: the price cap per GPU times the GPUs a replica asks for."""
    return fleet.max_price_per_gpu_hour * int(fleet.demand.get("gpu_count", 1))


def _affordable(fleet: Fleet, live: list[Order], remaining: Decimal) -> int:
    """The most replicas whose next hour fits in what the budget has left: the cheapest live ones first (a
    scale-in ends the dearest), new ones at the price cap."""
    prices = sorted(o.price_per_hour for o in live)
    cap = replica_cap(fleet)
    cost, count = Decimal(0), 0
    while count < fleet.max_replicas:
        following = prices[count] if count < len(prices) else cap
        if cost + following * _HOUR > remaining:
            break
        cost += following * _HOUR
        count += 1
    return count


def _engine_demand(fleet: Fleet, cap_per_hour: Decimal) -> Demand:
    demand = fleet.demand
    return Demand(
        demand_id=f"fleet-{fleet.public_id}",
        gpu_count=int(demand.get("gpu_count", 1)),
        gpu_models=frozenset(demand.get("gpu_models") or ()),
        regions=frozenset(demand.get("regions") or ()),
        pricing_models=frozenset(demand.get("pricing_models") or ()),
        min_gpu_memory_gb=int(demand.get("min_gpu_memory_gb", 0)),
        profile=Profile(demand.get("profile", Profile.INFERENCE.value)),
        interruption_tolerance=Tolerance(demand.get("interruption_tolerance", Tolerance.STATELESS.value)),
        max_price_per_hour=cap_per_hour,
        # A replica is rented by the hour until the fleet ends it: the cheapest hour wins.
        amount=Amount.DURATION,
        duration_hours=1.0,
    )


def placement_key(fleet: Fleet, number: int, index: int) -> str:
    """The idempotency key of the ``index``-th replica placed by the fleet's decision ``number``."""
    return f"fleet-{fleet.public_id.hex}-{number}-{index}"


def _scale_out(
    fleet: Fleet, count: int, live: list[Order], remaining: Decimal | None, number: int, now: dt.datetime
) -> tuple[list[Order], str]:
    """Place ``count`` replicas, each the best offer within the cap and the budget left; (placed, why fewer)."""
    placed: list[Order] = []
    # The next hour of every replica kept is spoken for before a new one is priced.
    left = None if remaining is None else remaining - sum((o.price_per_hour for o in live), Decimal(0))
    for index in range(count):
        cap = replica_cap(fleet)
        if left is not None:
            cap = min(cap, left)
            if cap <= 0:
                return placed, f"the budget has nothing left for {count - index} more"
        order, why = _place_one(fleet, cap, placement_key(fleet, number, index), now)
        if order is None:
            return placed, f"{count - index} not placed: {why}"
        placed.append(order)
        if left is not None:
            left -= order.price_per_hour
    return placed, ""


def _place_one(fleet: Fleet, cap: Decimal, key: str, now: dt.datetime) -> tuple[Order | None, str]:
    """One replica: the engine's best quote that the offer's provider takes, placed from its locked price."""
    demand = _engine_demand(fleet, cap)
    batch = quote_request(
        organization=fleet.organization,
        user=fleet.created_by,
        demand=demand,
        limit=settings.FLEET_QUOTES_TRIED,
        now=now,
    )
    if not batch.quotes:
        return None, f"no offer on sale fits the demand at {cap.quantize(Decimal('0.0001'))} USD/h or less"
    # Each replica launches the fleet's own configuration (its metrics token included).
    Quote.objects.filter(batch=batch.batch).update(launch_config=fleet.launch_config)
    why = ""
    for quote in batch.quotes:
        request = PlaceRequest(
            quote_id=str(quote.public_id),
            max_price_per_hour=cap,
            allow_failover=True,
            regions=tuple(fleet.demand.get("regions") or ()),
            open_ended=True,
        )
        try:
            result = order_place(
                organization=fleet.organization, user=fleet.created_by, request=request, idempotency_key=key, now=now
            )
        except (BudgetExceeded, PaymentRequired) as exc:
            return None, str(exc)
        except (OrderError, LaunchConfigInvalid) as exc:
            why = str(exc)  # this offer's provider refuses it: the next-ranked one may not
            continue
        Order.objects.filter(pk=result.order.pk).update(fleet=fleet)
        result.order.fleet = fleet
        return result.order, ""
    return None, why or "no quoted offer could be ordered"


def _scale_in(fleet: Fleet, count: int, running: list[Order], starting: list[Order], reason: str) -> list[Order]:
    """End ``count`` replicas: starting ones first (newest first: they have done least), then the dearest."""
    order_of_leaving = sorted(starting, key=lambda o: -o.pk) + sorted(running, key=lambda o: (-o.price_per_hour, -o.pk))
    ended = []
    for order in order_of_leaving[:count]:
        if _terminate(order, f"fleet {fleet.name} scaled in: {reason}"):
            ended.append(order)
    return ended


_NUMBERS = re.compile(r"[0-9][0-9.:%]*")


def _worth_recording(fleet: Fleet, action: Action, reason: str, placed: list[Order], ended: list[Order]) -> bool:
    """Every decision that changed something is kept; a hold, or a placement that placed nothing, only when its
    reason (figures aside) differs from the last kept decision's, so the page is not a wall of the same line."""
    if placed or ended:
        return True
    last = FleetDecision.objects.filter(fleet=fleet).order_by("-at", "-id").first()
    if last is None:
        return True
    return _NUMBERS.sub("#", last.reason) != _NUMBERS.sub("#", reason) or last.action != action


def _record(
    fleet: Fleet,
    *,
    action: FleetAction,
    desired: int,
    current: int,
    load: float | None,
    reason: str,
    placed: list[Order],
    ended: list[Order],
    now: dt.datetime,
) -> FleetDecision:
    """The decision's row, its ``fleet.scaled`` ledger entry and its webhook, in the caller's transaction."""
    price = fleet_price_per_hour(fleet)
    record = FleetDecision.objects.create(
        fleet=fleet,
        number=fleet.decision_count,
        at=now,
        action=action,
        desired=desired,
        current=current,
        load=None if load is None else round(load, 6),
        reason=reason,
        placed=[str(o.public_id) for o in placed],
        ended=[str(o.public_id) for o in ended],
        price_per_hour=price,
    )
    body = {
        "decision": str(record.public_id),
        "action": action.value,
        "desired": desired,
        "current": current,
        "load": None if load is None else f"{load:.6g}",
        "reason": reason,
        "placed": record.placed,
        "ended": record.ended,
        "price_per_hour": price,
    }
    _ledger(fleet, "fleet.scaled", **body)
    webhook_event_emit(
        organization_id=fleet.organization_id,
        event_type=WebhookEventType.FLEET_SCALED,
        data={"fleet": str(fleet.public_id), "name": fleet.name, "currency": "USD", "at": now, **body},
        now=now,
    )
    return record


def fleets_to_evaluate() -> list[int]:
    """Every active fleet's id, for the periodic sweep."""
    return list(Fleet.objects.filter(state=FleetState.ACTIVE).order_by("pk").values_list("pk", flat=True))
