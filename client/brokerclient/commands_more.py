"""``broker templates``, ``broker clusters`` and ``broker billing``, and ``broker launch --template``: the
commands over the launch templates (the organisation's and the broker's gallery), clusters and billing.
``cli.parser`` registers them with ``register``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO

from brokerclient import bounds
from brokerclient.api import BrokerClient

GALLERY_PREFIX = "gallery:"
Table = Callable[[list[list[Any]], list[str], TextIO], None]


class CommandUsageError(Exception):
    """A problem with these commands' command line, e.g. a gallery entry's variable left out (exit 2)."""


def _json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _table() -> Table:
    from brokerclient.cli import table  # the CLI's one table format; imported late, cli imports this module

    return table


# --- Templates ---------------------------------------------------------------------------------------------


def _runs(launch: dict[str, Any] | None) -> str:
    workload = (launch or {}).get("workload") or {}
    kind = workload.get("kind") or "none"
    return f"container {workload.get('image', '')}" if kind == "container" else kind


def _needs(entry: dict[str, Any]) -> str:
    names = [f"{v['name']}{' (secret)' if v['secret'] else ''}" for v in entry["variables"] if v["required"]]
    return ", ".join(names) or "-"


def cmd_templates(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "gallery":
        entries = client.gallery()
        if args.json:
            _json(entries, out)
            return 0
        rows = [[f"{GALLERY_PREFIX}{e['slug']}", e["name"], _runs(e["launch"]), f">= {e['min_gpu_memory_gb']} GB",
                 _needs(e)] for e in entries]  # fmt: skip
        _table()(rows, ["template", "name", "runs", "gpu memory", "variables"], out)
        out.write("details: broker templates show gallery:SLUG; start one: broker launch --template gallery:SLUG\n")
        return 0
    if args.action == "show":
        if not args.name:
            raise CommandUsageError("templates show needs a template's name or id, or gallery:SLUG")
        return _show(client, args.name, args.json, out)
    if args.name:
        raise CommandUsageError(f"templates list takes no name; to see one: broker templates show {args.name}")
    templates = list(client.launch_templates())
    if args.json:
        _json(templates, out)
        return 0
    rows = [[t["id"], t["name"], _runs(t["launch"]), ",".join(str(p) for p in (t["launch"] or {}).get("ports", [])),
             t["updated_at"][:16].replace("T", " ")] for t in templates]  # fmt: skip
    _table()(rows, ["id", "name", "runs", "ports", "updated"], out)
    if not rows:
        out.write("no templates yet; the gallery has ready ones: broker templates gallery\n")
    return 0


def _show(client: BrokerClient, name: str, as_json: bool, out: TextIO) -> int:
    if name.startswith(GALLERY_PREFIX):
        entry = client.gallery_entry(name.removeprefix(GALLERY_PREFIX))
        if as_json:
            _json(entry, out)
            return 0
        out.write(f"{entry['name']} ({GALLERY_PREFIX}{entry['slug']})\n{entry['description']}\n")
        out.write(f"runs      {_runs(entry['launch'])}\n")
        out.write(f"needs     >= {entry['min_gpu_memory_gb']} GB GPU memory: {entry['memory_note']}\n")
        for v in entry["variables"]:
            how = "required" if v["required"] else "optional"
            how += ", secret" if v["secret"] else ""
            default = f" [default {v['default']}]" if v["default"] else ""
            out.write(f"  {v['name']:<14} {how}: {v['purpose']}{default}\n")
        out.write(f"then      {entry['usage']}\n")
        out.write(json.dumps(entry["launch"], indent=2) + "\n")
        return 0
    template = client.launch_template(name)
    if as_json:
        _json(template, out)
        return 0
    description = f"\n{template['description']}" if template.get("description") else ""
    out.write(f"{template['name']} ({template['id']}){description}\n")
    out.write(f"runs      {_runs(template['launch'])}\n")
    out.write(json.dumps(template["launch"], indent=2, sort_keys=True) + "\n")
    return 0


def gallery_values(entry: dict[str, Any], env: list[dict[str, Any]]) -> dict[str, Any]:
    """The gallery entry's launch configuration with the ``--env``/``--secret-env`` values given. A name the
    entry does not have, a secret given in the open (or the reverse), or a required one left empty is refused
    here, before anything is quoted."""
    variables = {v["name"]: v for v in entry["variables"]}
    launch: dict[str, Any] = json.loads(json.dumps(entry["launch"]))
    workload = launch["workload"]
    current = {e["name"]: e for e in workload.get("env") or []}
    for item in env:
        variable = variables.get(item["name"])
        if variable is None:
            raise CommandUsageError(
                f"{GALLERY_PREFIX}{entry['slug']} has no variable {item['name']} (it has {', '.join(variables)})"
            )
        if variable["secret"] != bool(item.get("secret")):
            option = "--secret-env" if variable["secret"] else "--env"
            raise CommandUsageError(f"give {item['name']} with {option}")
        current[item["name"]] = {"name": item["name"], "value": item["value"], **({"secret": True} if variable[
            "secret"] else {})}  # fmt: skip
    missing = [name for name, v in variables.items() if v["required"] and not (current.get(name) or {}).get("value")]
    if missing:
        options = " ".join(f"{'--secret-env' if variables[name]['secret'] else '--env'} {name}=..." for name in missing)
        raise CommandUsageError(f"{GALLERY_PREFIX}{entry['slug']} needs {', '.join(missing)}: give {options}")
    workload["env"] = list(current.values())
    return launch


# The launch options that shape a configuration, and where each goes on a gallery entry's.
_OVERRIDES = {"allow": "allowed_cidrs", "key": "ssh_keys", "disk": "disk_gb", "spend_cap": "spend_cap_usd",
              "vm_image": "image"}  # fmt: skip
_WORKLOAD_OPTIONS = ("image", "run_command", "script", "port", "shm")


def template_launch(
    client: BrokerClient, args: argparse.Namespace, env: list[dict[str, Any]], split: Callable[[Any], list[str]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """For ``broker launch --template``: (what the quote takes instead of ``launch``, what the quote's workload
    needs on top). A gallery entry becomes its configuration, filled and with --allow, --key, --disk,
    --spend-cap and --vm-image applied, and asks for its GPU memory; an organisation's template is named as
    it is, whole."""
    given = [name for name in _WORKLOAD_OPTIONS if getattr(args, name, None)]
    if given:
        flags = ", ".join("--" + name.replace("_command", "").replace("_", "-") for name in given)
        raise CommandUsageError(f"--template sets what runs: drop {flags}")
    name = args.template
    if not name.startswith(GALLERY_PREFIX):
        extra = [f"--{option.replace('_', '-')}" for option in _OVERRIDES if getattr(args, option, None)] + (
            ["--env/--secret-env"] if env else []
        )
        if extra:
            raise CommandUsageError(
                f"a saved template is taken whole: drop {', '.join(extra)}, or save a changed copy first"
            )
        return {"launch_template": name}, {}
    entry = client.gallery_entry(name.removeprefix(GALLERY_PREFIX))
    launch = gallery_values(entry, env)
    for option, field in _OVERRIDES.items():
        value = getattr(args, option, None)
        if value:
            launch[field] = split(value) if option in ("allow", "key") else value
    return {"launch": launch}, {"min_gpu_memory_gb": entry["min_gpu_memory_gb"]}


# --- Clusters ----------------------------------------------------------------------------------------------


def cmd_clusters(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action in ("show", "terminate"):
        if not args.cluster:
            raise CommandUsageError(f"clusters {args.action} needs a cluster id (see broker clusters)")
        cluster = (client.cluster_terminate if args.action == "terminate" else client.cluster)(args.cluster)
        if args.json:
            _json(cluster, out)
            return 0
        _cluster_lines(cluster, out)
        return 0
    clusters = list(client.clusters(limit=args.limit))
    if args.json:
        _json(clusters, out)
        return 0
    rows = [[c["id"], c["state"], c["nodes"], f"{c['gpus_per_node']} x {c['gpu_model']}", c["instance_type"],
             c["zone"], c["price_per_hour"], c["created_at"][:16].replace("T", " ")] for c in clusters]  # fmt: skip
    _table()(rows, ["id", "state", "nodes", "gpus/node", "instance_type", "zone", "usd/h", "created"], out)
    return 0


def _cluster_lines(cluster: dict[str, Any], out: TextIO) -> None:
    reason = f" ({cluster['state_reason']})" if cluster.get("state_reason") else ""
    out.write(f"cluster   {cluster['id']}\nstate     {cluster['state']}{reason}\n")
    out.write(f"machines  {cluster['nodes']} x {cluster['gpus_per_node']} {cluster['gpu_model']} "
              f"{cluster['instance_type']} in {cluster['zone']}, round {cluster['round']}\n")  # fmt: skip
    out.write(f"price     {cluster['price_per_hour']} USD/h for all of them\n")
    rows = [[n["node"], n["order"], n["state"], n["zone"], n["public_ip"]] for n in cluster["current_nodes"]]
    _table()(rows, ["node", "order", "state", "zone", "public_ip"], out)


# --- Billing -----------------------------------------------------------------------------------------------


def cmd_billing(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "invoices":
        invoices = list(client.invoices(limit=args.limit))
        if args.json:
            _json(invoices, out)
            return 0
        rows = [[i["number"], i["month"], _minor(i["total_minor"]), _minor(i["tax_minor"]), i["currency"],
                 i["issued_at"][:10]] for i in invoices]  # fmt: skip
        _table()(rows, ["number", "month", "total", "tax", "currency", "issued"], out)
        return 0
    topups = list(client.topups(limit=args.limit))
    if args.action == "topups":
        if args.json:
            _json(topups, out)
            return 0
        _topup_table(topups, out)
        return 0
    billing = client.billing()
    if args.json:
        _json({**billing, "recent_topups": topups}, out)
        return 0
    currency = billing["currency"]
    out.write(f"credit    {billing['credit_available']} {currency} available\n")
    out.write(f"held      {billing['held_for_running_orders']} {currency} for running orders\n")
    out.write(f"terms     {billing['payment_terms']}\n")
    auto = billing.get("auto_topup")
    if auto:
        out.write(f"auto      top up {auto['amount']} {currency} when credit falls below {auto['below']}\n")
    out.write("recent top-ups:\n")
    _topup_table(topups, out)
    return 0


def _minor(amount: int) -> str:
    return f"{amount // 100}.{amount % 100:02d}" if amount >= 0 else f"-{_minor(-amount)}"


def _topup_table(topups: list[dict[str, Any]], out: TextIO) -> None:
    rows = [[t["id"], t["created_at"][:16].replace("T", " "), t["amount"], t["currency"], t["state"],
             "yes" if t["automatic"] else "", t["refunded"], t.get("failure") or ""] for t in topups]  # fmt: skip
    _table()(rows, ["id", "created", "amount", "currency", "state", "auto", "refunded", "failure"], out)


# --- Parsing -----------------------------------------------------------------------------------------------


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``templates``, ``clusters`` and ``billing`` to the CLI's subcommands."""
    p = sub.add_parser(
        "templates", parents=[common], help="launch templates: yours (list), the gallery's, show NAME|gallery:SLUG"
    )
    p.add_argument("action", nargs="?", choices=["list", "gallery", "show"], default="list")
    p.add_argument("name", nargs="?", help="show: a template's name or id, or gallery:SLUG")
    p.set_defaults(run=cmd_templates)

    p = sub.add_parser("clusters", parents=[common], help="your clusters: list, show ID, terminate ID")
    p.add_argument("action", nargs="?", choices=["list", "show", "terminate"], default="list")
    p.add_argument("cluster", nargs="?", help="show/terminate: the cluster id")
    p.add_argument("--limit", type=bounds.number(1, 10000, whole=True), default=20)
    p.set_defaults(run=cmd_clusters)

    p = sub.add_parser("billing", parents=[common], help="credit and recent top-ups; billing topups; billing invoices")
    p.add_argument("action", nargs="?", choices=["summary", "topups", "invoices"], default="summary")
    p.add_argument("--limit", type=bounds.number(1, 10000, whole=True), default=10, help="rows (default 10)")
    p.set_defaults(run=cmd_billing)
