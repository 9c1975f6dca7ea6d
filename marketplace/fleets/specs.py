"""A fleet as the buyer states it, checked field by field: the demand of one replica, the price cap and budget,
the replica bounds and the scaling rule. Pure (no ORM, no I/O): every refusal names its field, so the API, the
storefront and the CLI all answer with the same words. ``rule_of`` turns a stored rule back into the policy's."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from marketplace.fleets.policy import MAX_REPLICAS, RuleKind, ScalingRule, ScheduleWindow
from marketplace.matching.types import Profile, Tolerance
from providers import gpu_names
from providers.types import PricingModel

MAX_NAME = 80
MAX_GPUS_PER_REPLICA = 64
MAX_REGIONS = 50
MAX_GPU_MODELS = 30
MAX_SCHEDULE_WINDOWS = 48
MAX_PRICE_PER_GPU_HOUR = Decimal("1000")
MAX_BUDGET_USD = Decimal("10000000")
MAX_TARGET = 1e9
MAX_WINDOW_S = 3600
MAX_COOLDOWN_S = 86400
MAX_STEP = MAX_REPLICAS
METRIC_SOURCES = ("post", "prometheus")
DEFAULT_METRIC_PATH = "/metrics"
# Prometheus' own rule for metric names (https://prometheus.io/docs/concepts/data_model/, "Metric names and labels").
METRIC_NAME_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,127}$"
PATH_PATTERN = r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,199}$"
HHMM_PATTERN = r"^([01][0-9]|2[0-3]):([0-5][0-9])$"
REGION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
METRIC_NAME = re.compile(METRIC_NAME_PATTERN)
_PATH = re.compile(PATH_PATTERN)
_HHMM = re.compile(HHMM_PATTERN)
_REGION = re.compile(REGION_PATTERN)


class FleetInvalid(Exception):
    """Fields of a fleet are wrong; ``fields`` maps each (``demand.gpu_count``, ``rule.target``...) to why."""

    code = "invalid"

    def __init__(self, fields: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
        self.fields = dict(fields)


class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def add(self, name: str, message: str) -> None:
        self.fields.setdefault(name, message)


def _whole(value: Any, name: str, low: int, high: int, errors: _Errors) -> int | None:
    # A bool is an int to Python, and a long string of digits is slow to convert: refuse both before converting.
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(name, f"a whole number from {low} to {high}")
        return None
    if not low <= value <= high:
        errors.add(name, f"{value} is not between {low} and {high}")
        return None
    return value


def _real(value: Any, name: str, low: float, high: float, errors: _Errors) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.add(name, f"a number from {low:g} to {high:g}")
        return None
    if isinstance(value, int) and abs(value) > 10**15:
        errors.add(name, f"a number from {low:g} to {high:g}")
        return None
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        errors.add(name, f"a number from {low:g} to {high:g}")
        return None
    return number


def _money(value: Any, name: str, high: Decimal, errors: _Errors) -> Decimal | None:
    # Money arrives as a string ("2.50") or a number; a float is read through its shortest repr, never binary.
    if isinstance(value, bool) or not isinstance(value, str | int | float) or len(str(value)) > 32:
        errors.add(name, f"an amount in USD above 0 and at most {high}")
        return None
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        errors.add(name, f"an amount in USD above 0 and at most {high}")
        return None
    if not amount.is_finite() or not Decimal(0) < amount <= high or amount != amount.quantize(Decimal("0.0001")):
        errors.add(name, f"an amount in USD above 0 and at most {high}, to 4 decimal places")
        return None
    return amount


def _choices(value: Any, name: str, allowed: tuple[str, ...], limit: int, errors: _Errors) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        errors.add(name, f"a list of at most {limit}")
        return []
    chosen = []
    for item in value:
        if not isinstance(item, str) or item not in allowed:
            shown = item if isinstance(item, str) and len(item) <= 40 else "this"
            errors.add(name, f"{shown!r} is not one of {', '.join(allowed)}")
            return []
        chosen.append(item)
    return sorted(set(chosen))


def demand_parse(value: Any, errors: _Errors) -> dict[str, Any]:
    """One replica's demand, stored as the engine's field names with defaults filled in."""
    if not isinstance(value, Mapping):
        errors.add("demand", "an object: gpu_count, gpu_models, regions, pricing_models, ...")
        return {}
    allowed = {
        "gpu_count",
        "gpu_models",
        "regions",
        "pricing_models",
        "interruption_tolerance",
        "profile",
        "min_gpu_memory_gb",
    }
    for name in sorted(set(value) - allowed):
        errors.add(f"demand.{name}" if isinstance(name, str) and len(name) <= 40 else "demand", "not a demand field")
    regions = value.get("regions") or []
    if not isinstance(regions, list) or len(regions) > MAX_REGIONS:
        errors.add("demand.regions", f"a list of at most {MAX_REGIONS} region names")
        regions = []
    elif not all(isinstance(r, str) and _REGION.match(r) for r in regions):
        errors.add("demand.regions", "region names such as us-east-1")
        regions = []
    tolerance = value.get("interruption_tolerance", Tolerance.STATELESS.value)
    if tolerance not in [t.value for t in Tolerance]:
        errors.add("demand.interruption_tolerance", f"one of {', '.join(t.value for t in Tolerance)}")
    profile = value.get("profile", Profile.INFERENCE.value)
    if profile not in [p.value for p in Profile]:
        errors.add("demand.profile", f"one of {', '.join(p.value for p in Profile)}")
    return {
        "gpu_count": _whole(value.get("gpu_count", 1), "demand.gpu_count", 1, MAX_GPUS_PER_REPLICA, errors),
        "gpu_models": _choices(
            value.get("gpu_models"), "demand.gpu_models", tuple(gpu_names.SORTED), MAX_GPU_MODELS, errors
        ),
        "regions": sorted(set(regions)),
        "pricing_models": _choices(
            value.get("pricing_models"), "demand.pricing_models", tuple(p.value for p in PricingModel), 3, errors
        ),
        "interruption_tolerance": tolerance,
        "profile": profile,
        "min_gpu_memory_gb": _whole(value.get("min_gpu_memory_gb", 0), "demand.min_gpu_memory_gb", 0, 1024, errors),
    }


def _minute(value: Any, name: str, errors: _Errors) -> int | None:
    match = _HHMM.match(value) if isinstance(value, str) else None
    if match is None:
        errors.add(name, "a time of day in UTC as HH:MM")
        return None
    return int(match.group(1)) * 60 + int(match.group(2))


def schedule_parse(value: Any, errors: _Errors) -> list[dict[str, Any]]:
    """[{days: [0..6] (0 = Monday), start: "HH:MM", end: "HH:MM", replicas}], UTC; an end not after the start
    runs past midnight."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SCHEDULE_WINDOWS:
        errors.add("rule.schedule", f"a list of 1 to {MAX_SCHEDULE_WINDOWS} windows")
        return []
    windows = []
    for i, item in enumerate(value):
        where = f"rule.schedule[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"days", "start", "end", "replicas"}:
            errors.add(where, "an object with days, start, end and replicas")
            continue
        days = item.get("days", list(range(7)))
        weekdays = isinstance(days, list) and 1 <= len(days) <= 7
        if not weekdays or not all(not isinstance(d, bool) and isinstance(d, int) and 0 <= d <= 6 for d in days):
            errors.add(f"{where}.days", "a list of weekdays, 0 (Monday) to 6 (Sunday)")
            continue
        start, end = (
            _minute(item.get("start"), f"{where}.start", errors),
            _minute(item.get("end"), f"{where}.end", errors),
        )
        replicas = _whole(item.get("replicas"), f"{where}.replicas", 0, MAX_REPLICAS, errors)
        if start is not None and end is not None and start == end:
            errors.add(f"{where}.end", "the window must not end when it starts")
        window = {"days": sorted(set(days)), "start": item.get("start"), "end": item.get("end")}
        windows.append({**window, "replicas": replicas})
    return windows


RULE_FIELDS = frozenset(
    {
        "kind",
        "target",
        "tolerance",
        "window_s",
        "scale_out_cooldown_s",
        "scale_in_cooldown_s",
        "step_out",
        "step_in",
        "schedule",
        "metric",
    }
)


@dataclass(frozen=True)
class RuleFields:
    """The rule's columns on ``Fleet``, checked."""

    rule_kind: str
    rule_target: float = 60.0
    rule_tolerance: float = 0.1
    rule_window_s: int = 300
    scale_out_cooldown_s: int = 180
    scale_in_cooldown_s: int = 600
    step_out: int = 4
    step_in: int = 2
    schedule: list[dict[str, Any]] = field(default_factory=list)
    metric_name: str = ""
    metric_source: str = ""
    metric_port: int | None = None
    metric_path: str = ""


def rule_parse(value: Any, errors: _Errors) -> RuleFields | None:
    """The scaling rule: ``{"kind": "utilization" | "metric" | "schedule", "target", "tolerance", "window_s",
    "scale_out_cooldown_s", "scale_in_cooldown_s", "step_out", "step_in", "schedule": [...], "metric": {"name",
    "source": "post" | "prometheus", "port", "path"}}``."""
    if not isinstance(value, Mapping):
        errors.add("rule", "an object with a kind: utilization, metric or schedule")
        return None
    for name in sorted(set(value) - RULE_FIELDS):
        errors.add(f"rule.{name}" if isinstance(name, str) and len(name) <= 40 else "rule", "not a rule field")
    kind = value.get("kind")
    if kind not in [k.value for k in RuleKind]:
        errors.add("rule.kind", "utilization, metric or schedule")
        return None
    defaults = RuleFields(rule_kind=kind)
    high_target = 100.0 if kind == RuleKind.UTILIZATION else MAX_TARGET
    target = _real(value.get("target", defaults.rule_target), "rule.target", 0.0, high_target, errors)
    if target is not None and target <= 0:
        errors.add("rule.target", f"a number above 0 and at most {high_target:g}")
    fields = RuleFields(
        rule_kind=kind,
        rule_target=target or defaults.rule_target,
        rule_tolerance=_real(value.get("tolerance", 0.1), "rule.tolerance", 0.0, 0.9, errors) or 0.0,
        rule_window_s=_whole(value.get("window_s", 300), "rule.window_s", 30, MAX_WINDOW_S, errors) or 300,
        scale_out_cooldown_s=_whole(
            value.get("scale_out_cooldown_s", 180), "rule.scale_out_cooldown_s", 0, MAX_COOLDOWN_S, errors
        )
        or 0,
        scale_in_cooldown_s=_whole(
            value.get("scale_in_cooldown_s", 600), "rule.scale_in_cooldown_s", 0, MAX_COOLDOWN_S, errors
        )
        or 0,
        step_out=_whole(value.get("step_out", 4), "rule.step_out", 1, MAX_STEP, errors) or 1,
        step_in=_whole(value.get("step_in", 2), "rule.step_in", 1, MAX_STEP, errors) or 1,
    )
    if kind == RuleKind.SCHEDULE:
        return dataclasses.replace(fields, schedule=schedule_parse(value.get("schedule"), errors))
    if value.get("schedule") is not None:
        errors.add("rule.schedule", "only a schedule rule has one")
    metric = value.get("metric")
    if kind != RuleKind.METRIC:
        if metric is not None:
            errors.add("rule.metric", "only a metric rule reads a metric")
        return fields
    if not isinstance(metric, Mapping) or set(metric) - {"name", "source", "port", "path"}:
        errors.add("rule.metric", "an object with name, source (post or prometheus), and port and path for prometheus")
        return fields
    name = metric.get("name")
    if not isinstance(name, str) or not METRIC_NAME.match(name):
        errors.add("rule.metric.name", "a Prometheus metric name: letters, digits, _ and :, at most 128")
    source = metric.get("source", "post")
    if source not in METRIC_SOURCES:
        errors.add("rule.metric.source", "post or prometheus")
    port, path = None, ""
    if source == "prometheus":
        port = _whole(metric.get("port"), "rule.metric.port", 1, 65535, errors)
        path = metric.get("path", DEFAULT_METRIC_PATH)
        if not isinstance(path, str) or not _PATH.match(path):
            errors.add("rule.metric.path", "a URL path starting with /, at most 200 characters")
            path = ""
    elif metric.get("port") is not None or metric.get("path") is not None:
        errors.add("rule.metric.port", "only a prometheus source is read from a port")
    return dataclasses.replace(
        fields,
        metric_name=name if isinstance(name, str) else "",
        metric_source=source if isinstance(source, str) else "",
        metric_port=port,
        metric_path=path,
    )


@dataclass(frozen=True)
class FleetFields:
    """Everything of a fleet but its launch configuration, checked (``fleet_fields_parse``)."""

    name: str
    demand: dict[str, Any]
    max_price_per_gpu_hour: Decimal
    budget_usd: Decimal | None
    min_replicas: int
    max_replicas: int
    rule: RuleFields


FLEET_FIELDS = frozenset(
    {"name", "demand", "max_price_per_gpu_hour", "budget_usd", "min_replicas", "max_replicas", "rule", "launch"}
)


def fleet_fields_parse(data: Mapping[str, Any]) -> FleetFields:
    """A new fleet's fields, or ``FleetInvalid`` naming every wrong one."""
    errors = _Errors()
    if not isinstance(data, Mapping):
        raise FleetInvalid({"non_field_errors": "a fleet is a JSON object"})
    for unknown in sorted(set(data) - FLEET_FIELDS, key=str):
        errors.add(str(unknown)[:40], "not a fleet field")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        errors.add("name", f"a printable name of 1 to {MAX_NAME} characters")
    demand = demand_parse(data.get("demand"), errors)
    cap = _money(data.get("max_price_per_gpu_hour"), "max_price_per_gpu_hour", MAX_PRICE_PER_GPU_HOUR, errors)
    budget = None
    if data.get("budget_usd") is not None:
        budget = _money(data["budget_usd"], "budget_usd", MAX_BUDGET_USD, errors)
    low = _whole(data.get("min_replicas", 0), "min_replicas", 0, MAX_REPLICAS, errors)
    high = _whole(data.get("max_replicas"), "max_replicas", 1, MAX_REPLICAS, errors)
    if low is not None and high is not None and low > high:
        errors.add("min_replicas", f"at most max_replicas ({high})")
    rule = rule_parse(data.get("rule"), errors)
    if errors.fields:
        raise FleetInvalid(errors.fields)
    assert cap is not None and low is not None and high is not None and rule is not None and isinstance(name, str)
    return FleetFields(
        name=name.strip(),
        demand=demand,
        max_price_per_gpu_hour=cap,
        budget_usd=budget,
        min_replicas=low,
        max_replicas=high,
        rule=rule,
    )


def rule_of(
    *,
    kind: str,
    target: float,
    tolerance: float,
    window_s: int,
    scale_out_cooldown_s: int,
    scale_in_cooldown_s: int,
    step_out: int,
    step_in: int,
    schedule: list[dict[str, Any]],
) -> ScalingRule:
    """The policy's rule from a fleet's stored columns."""
    windows = tuple(
        ScheduleWindow(
            days=frozenset(int(d) for d in w["days"]),
            start_minute=int(w["start"][:2]) * 60 + int(w["start"][3:]),
            end_minute=int(w["end"][:2]) * 60 + int(w["end"][3:]),
            replicas=int(w["replicas"]),
        )
        for w in schedule
    )
    return ScalingRule(
        kind=RuleKind(kind),
        target=target,
        tolerance=tolerance,
        window_s=window_s,
        scale_out_cooldown_s=scale_out_cooldown_s,
        scale_in_cooldown_s=scale_in_cooldown_s,
        step_out=step_out,
        step_in=step_in,
        schedule=windows,
    )
