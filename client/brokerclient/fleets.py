"""``broker fleet …``: define a fleet that scales on its own telemetry, watch its decisions, change its limits,
end it, and post its workload's metric. ``cli.parser`` registers these with ``register_fleets``, handing in what
they share with ``broker launch`` (the launch options and how they read) and the table format."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from typing import Any, TextIO

from brokerclient import bounds
from brokerclient.api import BrokerClient
from brokerclient.commands_more import CommandUsageError

Table = Callable[[list[list[Any]], list[str], TextIO], None]
DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
# "mon-fri 09:00-18:00=4", "sat,sun 00:00-24:00=1" or "22:00-06:00=2" (every day).
_WINDOW = re.compile(r"^(?:(?P<days>[a-z,\-]+)\s+)?(?P<start>\d\d:\d\d)-(?P<end>\d\d:\d\d)=(?P<replicas>\d{1,2})$")


def _json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _days(text: str) -> list[int]:
    days: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise CommandUsageError(f"--schedule days are {','.join(DAYS)} or a range like mon-fri, not {part!r}")
        a, b = DAYS.index(first), DAYS.index(last or first)
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return sorted(days)


def schedule_window(text: str) -> dict[str, Any]:
    """One ``--schedule`` value as the API's window: ``[DAYS ]HH:MM-HH:MM=REPLICAS`` in UTC."""
    match = _WINDOW.match(text.strip().lower())
    if not match:
        raise CommandUsageError(
            f"--schedule wants [DAYS ]HH:MM-HH:MM=REPLICAS, e.g. 'mon-fri 09:00-18:00=4', not {text!r}"
        )
    end = "00:00" if match["end"] == "24:00" else match["end"]
    window: dict[str, Any] = {"start": match["start"], "end": end, "replicas": int(match["replicas"])}
    window["days"] = _days(match["days"]) if match["days"] else list(range(7))
    return window


def _rule(args: argparse.Namespace) -> dict[str, Any]:
    chosen = [flag for flag, given in (("--utilization", args.utilization is not None), ("--metric", bool(args.metric)),
                                       ("--schedule", bool(args.schedule))) if given]  # fmt: skip
    if len(chosen) != 1:
        raise CommandUsageError("give exactly one rule: --utilization PERCENT, --metric NAME --target N, or --schedule")
    rule: dict[str, Any]
    if args.utilization is not None:
        rule = {"kind": "utilization", "target": args.utilization}
    elif args.metric:
        if args.target is None:
            raise CommandUsageError("--metric needs --target: the metric's value one replica handles")
        metric: dict[str, Any] = {"name": args.metric, "source": "prometheus" if args.metric_port else "post"}
        if args.metric_port:
            metric["port"] = args.metric_port
            if args.metric_path:
                metric["path"] = args.metric_path
        rule = {"kind": "metric", "target": args.target, "metric": metric}
    else:
        rule = {"kind": "schedule", "schedule": [schedule_window(w) for w in args.schedule]}
    for option in ("window_s", "scale_out_cooldown_s", "scale_in_cooldown_s", "tolerance"):
        if getattr(args, option) is not None:
            rule[option] = getattr(args, option)
    return rule


def fleet_lines(fleet: dict[str, Any], out: TextIO, table: Table) -> None:
    """A fleet as ``broker fleet show`` prints it: what it is, what it costs, its live replicas."""
    reason = f" ({fleet['state_reason']})" if fleet.get("state_reason") else ""
    rule = fleet.get("rule") or {}
    demand = fleet.get("demand") or {}
    gpus = f"{demand.get('gpu_count', 1)} x {'/'.join(demand.get('gpu_models') or ['any GPU'])}"
    out.write(f"fleet     {fleet['id']}  {fleet['name']}\nstate     {fleet['state']}{reason}\n")
    out.write(f"replicas  {len(fleet.get('replicas') or [])} live, {fleet['desired']} wanted, "
              f"{fleet['min_replicas']}..{fleet['max_replicas']}, each {gpus}\n")  # fmt: skip
    target = rule.get("target")
    what = {"utilization": f"{target} % GPU utilization per replica",
            "metric": f"{target} {(rule.get('metric') or {}).get('name', '')} per replica",
            "schedule": "a schedule"}.get(str(rule.get("kind")), str(rule.get("kind")))  # fmt: skip
    out.write(f"rule      {what}\n")
    budget = f", budget left {fleet['budget_left_usd']} of {fleet['budget_usd']} USD" if fleet.get("budget_usd") else ""
    out.write(f"cost      {fleet['spent_usd']} USD so far, {fleet['price_per_hour']} USD/h now{budget}\n")
    out.write(f"price cap {fleet['max_price_per_gpu_hour']} USD per GPU-hour\n")
    rows = [[r["order"], r["state"], r["provider"], r["instance_type"], r["region"], r["price_per_hour"]]
            for r in fleet.get("replicas") or []]  # fmt: skip
    if rows:
        table(rows, ["order", "state", "provider", "type", "region", "usd/h"], out)


def cmd_fleet(client: BrokerClient, args: argparse.Namespace, out: TextIO, *, table: Table,
              launch_from: Callable[[argparse.Namespace], dict[str, Any]]) -> int:  # fmt: skip
    action = args.action
    if action == "list":
        fleets = list(client.fleets(limit=args.limit))
        if args.json:
            _json(fleets, out)
            return 0
        rows = [
            [f["id"], f["name"], f["state"], len(f.get("replicas") or []), f["desired"],
             f"{f['min_replicas']}..{f['max_replicas']}", f["price_per_hour"], f["spent_usd"]]
            for f in fleets
        ]  # fmt: skip
        table(rows, ["fleet", "name", "state", "live", "wanted", "limits", "usd/h", "spent"], out)
        return 0
    if action == "create":
        model, _, count = (args.gpu or "").partition(":")
        if not model or (count and not (count.isascii() and count.isdigit() and len(count) <= 2)):
            raise CommandUsageError(f"--gpu wants MODEL[:COUNT] per replica, e.g. T4 or A100:2, not {args.gpu!r}")
        demand: dict[str, Any] = {"gpu_count": int(count or 1), "gpu_models": [model], "profile": args.profile}
        if args.region:
            demand["regions"] = [r for item in args.region for r in item.split(",") if r]
        if args.pricing:
            demand["pricing_models"] = [p for item in args.pricing for p in item.split(",") if p]
        body: dict[str, Any] = {
            "name": args.name, "demand": demand, "max_price_per_gpu_hour": args.max_price_per_gpu,
            "max_replicas": args.max, "rule": _rule(args),
        }  # fmt: skip
        if args.min is not None:
            body["min_replicas"] = args.min
        if args.budget:
            body["budget_usd"] = args.budget
        launch = launch_from(args)
        if launch:
            body["launch"] = launch
        fleet = client.fleet_create(body)
        if args.json:
            _json(fleet, out)
            return 0
        fleet_lines(fleet, out, table)
        out.write(f"metrics   POST {fleet['metrics_url']} with 'Authorization: Bearer {fleet.get('metrics_token')}'\n"
                  "          (shown once; the replicas have it as BROKER_FLEET_METRICS_TOKEN)\n")  # fmt: skip
        return 0
    if not args.fleet:
        raise CommandUsageError(f"fleet {action} needs a fleet id (see broker fleet list)")
    if action == "decisions":
        decisions = list(client.fleet_decisions(args.fleet, limit=args.limit))
        if args.json:
            _json(decisions, out)
            return 0
        rows = [[d["at"][:19].replace("T", " "), d["action"], f"{d['current']}->{d['desired']}", d["reason"]]
                for d in decisions]  # fmt: skip
        table(rows, ["at (UTC)", "action", "replicas", "why"], out)
        return 0
    if action == "metric":
        token = args.metrics_token or os.environ.get("BROKER_FLEET_METRICS_TOKEN")
        if not token or args.name is None or args.value is None:
            raise CommandUsageError("fleet metric needs ID --name NAME --value N and the fleet's metrics token "
                                    "(--metrics-token or env BROKER_FLEET_METRICS_TOKEN)")  # fmt: skip
        posted = client.fleet_metric(args.fleet, args.name, args.value, metrics_token=token)
        _json(posted, out) if args.json else out.write(f"{posted['name']} = {posted['value']:g} at {posted['at']}\n")
        return 0
    if action == "scale":
        changes = {k: v for k, v in (("min_replicas", args.min), ("max_replicas", args.max)) if v is not None}
        if args.budget:
            changes["budget_usd"] = args.budget
        if args.max_price_per_gpu:
            changes["max_price_per_gpu_hour"] = args.max_price_per_gpu
        if not changes:
            raise CommandUsageError("fleet scale needs --min, --max, --budget or --max-price-per-gpu")
        fleet = client.fleet_update(args.fleet, changes)
    elif action == "end":
        fleet = client.fleet_end(args.fleet)
    else:
        fleet = client.fleet(args.fleet)
    if args.json:
        _json(fleet, out)
    else:
        fleet_lines(fleet, out, table)
    return 0


def register_fleets(
    sub: Any,
    common: argparse.ArgumentParser,
    *,
    launch_arguments: Callable[[argparse.ArgumentParser], None],
    launch_from: Callable[[argparse.Namespace], dict[str, Any]],
    table: Table,
) -> None:
    """Add ``fleet`` to the CLI's subcommands."""
    p = sub.add_parser(
        "fleet",
        parents=[common],
        help="fleets that scale on their own: list, create, show, decisions, scale, end, metric",
    )
    p.add_argument("action", choices=["list", "create", "show", "decisions", "scale", "end", "metric"])
    p.add_argument("fleet", nargs="?", help="the fleet id (all but list and create)")
    p.add_argument("--limit", type=bounds.number(1, 10000, whole=True), default=50, help="rows to list (default 50)")
    p.add_argument("--name", help="create: the fleet's name; metric: the metric's name")
    p.add_argument("--gpu", help="create: MODEL[:COUNT] per replica, e.g. T4 or A100:2")
    p.add_argument("--profile", default="inference", help="create: the workload profile (default inference)")
    p.add_argument("--region", action="append", help="create: regions allowed; repeatable")
    p.add_argument("--pricing", action="append", help="create: on_demand (default), spot; repeatable")
    p.add_argument("--max-price-per-gpu", help="USD per GPU-hour at most, for every replica")
    p.add_argument("--budget", help="USD that every replica together may spend")
    p.add_argument("--min", type=bounds.number(0, 64, whole=True), help="replicas at least")
    p.add_argument("--max", type=bounds.number(1, 64, whole=True), help="replicas at most")
    p.add_argument("--utilization", type=bounds.number(1, 100), help="rule: target mean GPU utilization, percent")
    p.add_argument("--metric", help="rule: the workload's metric to follow (posted, or scraped with --metric-port)")
    p.add_argument("--target", type=bounds.number(0, 1e9), help="rule: the metric's value one replica handles")
    p.add_argument("--metric-port", type=bounds.number(1, 65535, whole=True), help="scrape this port's /metrics")
    p.add_argument("--metric-path", help="the Prometheus endpoint's path (default /metrics)")
    p.add_argument("--schedule", action="append", help="rule: '[DAYS ]HH:MM-HH:MM=N' in UTC; repeatable")
    p.add_argument("--window-s", type=bounds.number(30, 86400, whole=True), help="rule: seconds the load is averaged")
    p.add_argument("--scale-out-cooldown-s", type=bounds.number(0, 86400, whole=True), help="rule: between scale-outs")
    p.add_argument("--scale-in-cooldown-s", type=bounds.number(0, 86400, whole=True), help="rule: after any change")
    p.add_argument("--tolerance", type=bounds.number(0, 0.9), help="rule: no change within this share of the target")
    p.add_argument("--value", type=bounds.number(-1e12, 1e12), help="metric: the value to post")
    p.add_argument("--metrics-token", help="metric: the fleet's fmt_ token (default env BROKER_FLEET_METRICS_TOKEN)")
    launch_arguments(p)
    p.set_defaults(spend_cap=None, run=lambda client, args, out: cmd_fleet(client, args, out, table=table,
                                                                          launch_from=launch_from))  # fmt: skip
