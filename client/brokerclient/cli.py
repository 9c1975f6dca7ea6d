"""``broker``: the command line over ``BrokerClient``.

The broker's address and token come from ``--url``/``--token`` or ``BROKER_URL``/``BROKER_TOKEN``. Output is
a table for people, or JSON with ``--json`` (``watch`` writes one JSON object per line, one per state change).
Exit status: 0 ok, 1 an API error (its code and message on stderr), 2 a usage error, 3 a receipt that did not
verify, 4 a receipt still pending (no check failed, but entries are not yet in a signed checkpoint).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from brokerclient import bounds
from brokerclient.api import ORDER_STATES, BrokerClient
from brokerclient.commands_more import CommandUsageError, register, template_launch
from brokerclient.errors import BrokerError
from brokerclient.fleets import register_fleets
from brokerclient.verify import Check, RememberedCheckpoint, VerificationResult, remembered_check, verify_receipt

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_UNVERIFIED, EXIT_PENDING = 0, 1, 2, 3, 4
PROFILES = ("training", "fine_tuning", "inference", "scientific", "rendering", "transcoding")


class UsageError(Exception):
    """A problem with the command line itself (exit 2)."""


# --- Output ----------------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO) -> None:
    """Columns padded to their widest cell; numbers are right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    numeric = [bool(cells) and all(_numeric(r[i]) for r in cells) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out.write(line(list(header)) + "\n")
    for row in cells:
        out.write(line(row) + "\n")


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text == "-"
    return True


def _json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _order_lines(order: dict[str, Any], out: TextIO) -> None:
    instance = order.get("instance") or {}
    usage = order.get("usage") or {}
    state = f"{order.get('state')} ({order['state_reason']})" if order.get("state_reason") else order.get("state")
    rows = [
        ("order", order.get("id")),
        ("state", state),
        ("gpu", f"{order.get('gpu_count')} x {order.get('gpu_model')} ({order.get('pricing_model')})"),
        ("price/h", f"{order.get('price_per_hour')} USD (cap {order.get('max_price_per_hour')})"),
        ("offer", order.get("offer")),
        ("quote", order.get("quote")),
        ("instance", " ".join(_cell(instance.get(k)) for k in ("provider_instance_id", "zone", "instance_type"))
         if instance else None),
        ("usage", f"{usage.get('seconds', 0)} s, {usage.get('amount_usd')} USD"),
        ("attempts", len(order.get("attempts") or [])),
    ]  # fmt: skip
    boot = order.get("boot") or {}
    if boot and order.get("state") == "provisioning":
        rows.append(("boot", f"{boot.get('state')} (ready by {boot.get('deadline') or 'launch'})"))
    if (boot.get("failure") or {}).get("reason"):
        rows.append(("failed", f"{boot['failure'].get('stage')}: {boot['failure'].get('reason')}"))
    periods = (order.get("silence") or {}).get("periods") or []
    if order.get("health") == "degraded" and periods:
        rows.append(("health", f"degraded: its agent has not reported since {periods[-1].get('started_at')}"))
    if periods:
        rows.append(("silent", f"{order['silence'].get('minutes')} min without reports, {len(periods)} period(s)"))
    for name, value in rows:
        out.write(f"{name:<9} {_cell(value)}\n")
    connection_lines(order.get("connection"), out)
    for warning in order.get("warnings") or []:
        out.write(f"warning   {warning}\n")


def connection_lines(connection: dict[str, Any] | None, out: TextIO) -> None:
    """How to reach a ready machine: the ssh line, the host keys to expect, the exposed ports' URLs."""
    if not connection:
        return
    out.write(f"connect   {connection.get('ssh')}\n")
    for key in connection.get("host_keys") or []:
        out.write(f"host key  {key.get('type')} {key.get('fingerprint')}\n")
    for url in connection.get("urls") or []:
        out.write(f"port {url.get('port'):<5}{url.get('url')}\n")


# --- Commands --------------------------------------------------------------------------------------------------


def cmd_offers(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    offers = list(client.offers(args.query, args.sort, limit=args.limit))
    if args.json:
        _json(offers, out)
        return EXIT_OK
    header = ["id", "provider", "gpu", "n", "instance_type", "zone", "pricing", "usd/h", "usd/gpu-h", "capacity"]
    rows = [
        [o["id"], o["provider"], o["gpu_model"], o["gpu_count"], o["instance_type"], o["zone"] or o["region"],
         o["pricing_model"], o["price_usd"], o["price_per_gpu_hour_usd"], o.get("capacity")]
        for o in offers
    ]  # fmt: skip
    table(rows, header, out)
    return EXIT_OK


def _expand_gpus(client: BrokerClient, names: list[str]) -> list[str]:
    """``A100`` means every A100 variant, as in the search language: a key is taken as it is, anything else as
    a family (``<name>-...``) looked up in the broker's schema."""
    if not names:
        return []
    keys = client.gpu_model_keys()
    if keys is None:
        return names
    exact = {k.lower(): k for k in keys}
    expanded: list[str] = []
    for name in names:
        if name.lower() in exact:
            expanded.append(exact[name.lower()])
            continue
        family = [k for k in keys if k.lower().startswith(f"{name.lower()}-")]
        if not family:
            raise UsageError(f"unknown GPU {name!r}; known: {', '.join(sorted(keys))}")
        expanded.extend(family)
    return list(dict.fromkeys(expanded))


def workload_from(args: argparse.Namespace, client: BrokerClient) -> dict[str, Any]:
    """The quote request the options describe; unset options are left to the profile's defaults."""
    workload: dict[str, Any] = {"profile": args.profile, "limit": args.limit}
    simple = {
        "gpu_count": args.count,
        "total_gpu_memory_gb": args.total_memory,
        "min_gpu_memory_gb": args.min_gpu_memory,
        "max_price_per_hour": args.max_price,
        "max_price_per_job": args.max_job_price,
        "duration_hours": args.hours,
        "interruption_tolerance": args.tolerance,
        "checkpoint_interval_hours": args.checkpoint_hours,
        "min_interconnect_gbs": args.min_interconnect,
        "needs_rdma": args.rdma,
        "min_fp64_tflops": args.min_fp64,
        "needs_ecc": args.ecc,
        "min_video_encoders": args.min_encoders,
        "id": args.id,
    }
    workload.update({k: v for k, v in simple.items() if v is not None})
    lists = {"gpu_models": _expand_gpus(client, _split(args.gpu)), "regions": _split(args.region),
             "jurisdictions": _split(args.jurisdiction), "pricing_models": _split(args.pricing)}  # fmt: skip
    workload.update({k: v for k, v in lists.items() if v})
    return workload


def _split(values: Iterable[str] | None) -> list[str]:
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def cmd_quote(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.quote(workload_from(args, client))
    if args.json:
        _json(result, out)
        return EXIT_OK
    header = ["rank", "quote", "offer", "provider", "gpu", "n", "instance_type", "zone", "pricing", "usd/h", "total"]
    rows = [
        [q["rank"], q["id"], q["offer"]["id"], q["offer"]["provider"], q["offer"]["gpu_model"],
         q["offer"]["gpu_count"], q["offer"]["instance_type"], q["offer"]["zone"], q["offer"]["pricing_model"],
         q["price_per_hour"], q["total_price"]]
        for q in result.get("quotes", [])
    ]  # fmt: skip
    table(rows, header, out)
    if rows:
        out.write(f"prices hold until {result.get('expires_at')}; order one with: broker order --quote <quote>\n")
    else:
        out.write("no offer fits this workload\n")
        for miss in result.get("near_misses", [])[:5]:
            out.write(f"  near miss: offer {miss['offer']} {miss['instance_type']} fails {', '.join(miss['failed'])}\n")
    return EXIT_OK


def cmd_order(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    order = client.order(
        offer=args.offer,
        quote=args.quote,
        max_price_per_hour=args.max_price,
        allow_failover=False if args.no_failover else None,
        regions=_split(args.region) or None,
        duration_hours=args.hours,
        idempotency_key=args.idempotency_key,
        bid_per_gpu_hour=args.bid,
    )
    if args.json:
        _json(order, out)
    else:
        _order_lines(order, out)
    return EXIT_OK


def cmd_show(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    order = client.order_get(args.order)
    if args.json:
        _json(order, out)
    else:
        _order_lines(order, out)
    return EXIT_OK


def cmd_orders(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    orders = list(client.orders(limit=args.limit))
    if args.json:
        _json(orders, out)
        return EXIT_OK
    rows = [[o["id"], o["state"], o["gpu_count"], o["gpu_model"], o["price_per_hour"], o["created_at"]] for o in orders]
    table(rows, ["order", "state", "n", "gpu", "usd/h", "created_at"], out)
    return EXIT_OK


def cmd_watch(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    until = _split(args.until) or ["running"]
    unknown = sorted(set(until) - ORDER_STATES)
    if unknown:
        raise UsageError(f"unknown state(s) {', '.join(unknown)}; states: {', '.join(sorted(ORDER_STATES))}")
    last: dict[str, Any] = {}
    for order in client.watch(args.order, until=until, timeout=args.wait, interval=args.interval):
        last = order
        if args.json:
            out.write(json.dumps(order, sort_keys=True) + "\n")
        else:
            reason = f"  {order['state_reason']}" if order.get("state_reason") else ""
            out.write(f"{order.get('state_changed_at')}  {order['state']}{reason}\n")
        out.flush()
    if last.get("state") not in until:
        sys.stderr.write(f"broker: order {args.order} ended {last.get('state')}, not {' or '.join(until)}\n")
        return EXIT_API
    return EXIT_OK


def cmd_terminate(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    order = client.terminate(args.order)
    if args.json:
        _json(order, out)
    else:
        _order_lines(order, out)
    return EXIT_OK


def cmd_order_action(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    """``stop``, ``start`` and ``restart``: the order as the broker answered (stopping, starting)."""
    order = {"stop": client.stop, "start": client.start, "restart": client.restart}[args.action](args.order)
    if args.json:
        _json(order, out)
    else:
        _order_lines(order, out)
    return EXIT_OK


def cmd_logs(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    logs = client.logs(args.order, lines=args.lines)
    if args.json:
        _json(logs, out)
        return EXIT_OK
    if logs.get("at") is None:
        sys.stderr.write(f"broker: order {args.order} has no output yet: its machine's agent sends it once ready\n")
        return EXIT_OK
    sys.stderr.write(f"# from {logs.get('source')}, sent at {logs.get('at')}\n")
    for line in logs.get("lines") or []:
        out.write(_printable(str(line)) + "\n")
    out.flush()
    return EXIT_OK


def _printable(line: str) -> str:
    """A workload's line with control characters shown, not obeyed: its output must not drive the terminal."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in line)


def _trusted_key(args: argparse.Namespace) -> str | None:
    if args.key and args.key_file:
        raise UsageError("give --key or --key-file, not both")
    if args.key_file:
        try:
            return Path(args.key_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read the key file: {exc}") from None
    key: str | None = args.key or os.environ.get("BROKER_VERIFIER_KEY") or None
    return key


def cmd_receipt(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    trusted = _trusted_key(args)
    if args.wait is not None and (args.file or not args.verify):
        raise UsageError("--wait fetches the receipt until it verifies: it needs --verify and an ORDER, not --file")
    if args.interval is not None and args.wait is None:
        raise UsageError("--interval goes with --wait")
    if args.file:
        try:
            receipt = bounds.loads(Path(args.file).read_text(), what=f"the receipt file {args.file}")
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the receipt file: {exc}") from None
        result = verify_receipt(receipt, trusted_key=trusted, order_id=args.order or None)
    elif args.verify:
        receipt, result = client.receipt_verified(
            args.order, trusted_key=trusted, wait=args.wait or 0.0, interval=args.interval
        )
    else:
        receipt = client.receipt(args.order)
    if not args.verify:
        if args.json:
            _json(receipt, out)
        else:
            _receipt_table(receipt, out)
        return EXIT_OK
    if args.state and result.ok and result.checkpoint is not None:
        _check_remembered(client, Path(args.state), result)
    if args.json:
        _json({"receipt": receipt, "verification": result.as_json()}, out)
    else:
        _receipt_table(receipt, out)
        out.write(result.text() + "\n")
        if not result.key_pinned:
            out.write("note: no key pinned (--key): the receipt's own key shows only that whoever answered signed it\n")
    if result.pending:
        after = f" after waiting {args.wait:g}s" if args.wait else "; ask again, or wait for it with --wait"
        sys.stderr.write(f"broker: pending: {result.pending_message()}{after}\n")
        return EXIT_PENDING
    return EXIT_OK if result.ok else EXIT_UNVERIFIED


def _check_remembered(client: BrokerClient, state: Path, result: VerificationResult) -> None:
    """Check the receipt's checkpoint against the one remembered in ``state`` (the first run remembers it),
    record the check on ``result``, and remember the newer checkpoint once it is shown to extend the old."""
    signed = result.checkpoint
    assert signed is not None
    try:
        remembered = (
            RememberedCheckpoint.from_json(bounds.loads(state.read_text(), what="the state file"))
            if state.exists()
            else None
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the state file {state}: {exc}") from None
    if remembered is None:
        result.checks.append(Check("consistency", True, f"first run: checkpoint {signed.size} remembered in {state}"))
    else:
        low, high = sorted((remembered.size, signed.size))
        proof = client.consistency(low, high) if low != high else []
        check = remembered_check(remembered, signed, proof)
        result.checks.append(check)
        if not check.ok or signed.size <= remembered.size:
            return
    state.write_text(json.dumps(RememberedCheckpoint.of(signed).as_json()) + "\n")


def _receipt_table(receipt: dict[str, Any], out: TextIO) -> None:
    rows = [[e.get("sequence"), e.get("kind"), e.get("created_at"), "proof"] for e in receipt.get("entries", [])]
    rows += [[e.get("sequence"), e.get("kind"), e.get("created_at"), "pending"] for e in receipt.get("pending", [])]
    rows += [["-", e.get("kind"), e.get("created_at"), "queued"] for e in receipt.get("queued", [])]
    table(rows, ["seq", "kind", "created_at", "status"], out)
    checkpoint = receipt.get("checkpoint")
    if checkpoint:
        out.write(f"checkpoint size {checkpoint.get('size')} root {checkpoint.get('root')}\n")
    else:
        out.write("no checkpoint covers these entries yet\n")


def cmd_keys(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "add":
        if not args.file:
            raise UsageError("keys add needs the public key file, e.g. ~/.ssh/id_ed25519.pub")
        text = _read_public_key(args.file)
        added = client.ssh_key_add(text, args.name or "")
        if args.json:
            _json(added, out)
        else:
            out.write(f"added {added['name']}: {added['key_type']} {added['bits']} bits {added['fingerprint']}\n")
        return EXIT_OK
    if args.action == "rm":
        if not args.file:
            raise UsageError("keys rm needs a key id (see broker keys list)")
        client.ssh_key_delete(args.file)
        out.write(f"removed {args.file}\n")
        return EXIT_OK
    keys = list(client.ssh_keys())
    if args.json:
        _json(keys, out)
        return EXIT_OK
    rows = [[k["id"], k["name"], k["key_type"], k["bits"], k["fingerprint"], k["added_by"]] for k in keys]
    table(rows, ["id", "name", "type", "bits", "fingerprint", "added_by"], out)
    return EXIT_OK


_PRIVATE_MARKERS = ("PRIVATE KEY", "PuTTY-User-Key-File", "openssh-key-v1")


def _read_public_key(path: str) -> str:
    """The public key in ``path``. A private key is refused here, before it is sent anywhere: the usual slip is
    ``~/.ssh/id_ed25519`` for ``~/.ssh/id_ed25519.pub``."""
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if any(marker in text for marker in _PRIVATE_MARKERS):
        pub = f"{path}.pub" if not path.endswith(".pub") else path
        raise UsageError(f"{path} is a private key: nothing was sent. Give the public half, e.g. {pub}")
    return text.strip()


def ssh_command(connection: dict[str, Any], known_hosts: str, extra: Sequence[str] = ()) -> list[str]:
    """The ``ssh`` invocation that connects to the machine and checks its host key against the ones its agent
    reported (pinned in ``known_hosts``), instead of trusting whatever answers on first use."""
    return [
        "ssh",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "StrictHostKeyChecking=yes",
        "-p", str(connection["port"]),
        f"{connection['user']}@{connection['host']}",
        *extra,
    ]  # fmt: skip


def cmd_ssh(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    order = client.order_get(args.order)
    connection = order.get("connection")
    if not connection:
        boot = order.get("boot") or {}
        why = (boot.get("failure") or {}).get("reason") or f"the order is {order.get('state')}"
        sys.stderr.write(f"broker: order {args.order} has no ready machine to connect to: {why}\n")
        return EXIT_API
    extra = list(args.command or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    with tempfile.TemporaryDirectory(prefix="broker-ssh-") as folder:
        known_hosts = Path(folder) / "known_hosts"
        known_hosts.write_text("\n".join(connection.get("known_hosts") or []) + "\n")
        command = ssh_command(connection, str(known_hosts), extra)
        if args.print:
            out.write(shlex.join(command) + "\n")
            out.write(known_hosts.read_text())
            return EXIT_OK
        return subprocess.call(command)  # noqa: S603 - the user's own ssh, with the order's address


def env_from(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The workload's variables ``--env`` and ``--secret-env`` give."""
    env: list[dict[str, Any]] = []
    for item, secret in [(e, False) for e in args.env or []] + [(e, True) for e in args.secret_env or []]:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env/--secret-env want NAME=VALUE, not {item!r}")
        env.append({"name": name, "value": value, **({"secret": True} if secret else {})})
    return env


def launch_config_from(args: argparse.Namespace) -> dict[str, Any]:
    """The launch configuration ``broker launch``'s options describe."""
    env = env_from(args)
    ports = [_port(p) for p in _split(args.port)] if args.port else []
    launch: dict[str, Any] = {}
    if args.image:
        command = ["/bin/sh", "-c", args.run_command] if args.run_command else []
        launch["workload"] = {"kind": "container", "image": args.image, "command": command, "env": env,
                              "ports": ports}  # fmt: skip
        if args.shm:
            launch["workload"]["shm_size_gb"] = args.shm
    elif args.run_command or args.script:
        if args.script:
            try:
                script = Path(args.script).read_text()
            except OSError as exc:
                raise UsageError(f"cannot read {args.script}: {exc}") from None
        else:
            script = f"#!/bin/bash\n{args.run_command}\n"
        launch["workload"] = {"kind": "script", "script": script, "env": env}
        if ports:
            launch["ports"] = ports
    elif ports:
        launch["ports"] = ports
    if args.vm_image:
        launch["image"] = args.vm_image
    if args.disk:
        launch["disk_gb"] = args.disk
    if args.allow:
        launch["allowed_cidrs"] = _split(args.allow)
    if args.key:
        launch["ssh_keys"] = _split(args.key)
    if args.spend_cap:
        launch["spend_cap_usd"] = args.spend_cap
    return launch


def _port(text: str) -> int:
    try:
        return int(bounds.number(1, 65535, whole=True)(text))
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--port: {exc}") from None


def cmd_launch(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    """Quote, order the best quote with the launch configuration, wait for ready, print how to connect."""
    model, _, count = args.gpu.partition(":")
    if count and not (count.isascii() and count.isdigit() and len(count) <= 3):
        raise UsageError(f"--gpu wants MODEL[:COUNT], e.g. H100:8, not {args.gpu!r}")
    workload = {"profile": args.profile, "limit": 5, "gpu_count": int(count or 1),
                "gpu_models": _expand_gpus(client, [model])}  # fmt: skip
    # A launched machine is meant to stay up: an interruptible (spot or bid) one only when asked for.
    extra = {"regions": _split(args.region), "pricing_models": _split(args.pricing) or ["on_demand"]}
    workload.update({k: v for k, v in extra.items() if v})
    if args.max_price:
        workload["max_price_per_hour"] = args.max_price
    if args.hours:
        workload["duration_hours"] = args.hours
    if args.template:  # a saved template, or a gallery entry filled with --env/--secret-env
        choice, needs = template_launch(client, args, env_from(args), _split)
        workload = {**needs, **workload}
    else:
        choice = {"launch": launch_config_from(args)}
    result = client.quote({**workload, **choice})
    quotes = result.get("quotes") or []
    if not quotes:
        misses = result.get("near_misses", [])[:3]
        why = "; ".join(
            f"{m['instance_type']} fails {', '.join(m['failed'])}" + (f" ({m['relax']})" if m.get("relax") else "")
            for m in misses
        )
        sys.stderr.write(f"broker: no offer fits: {why or f'no {args.gpu} on sale meets the {args.profile} profile'}\n")
        profile_bound = {"gpu memory", "interconnect", "fp64", "ecc", "video encoders"}
        if not misses or any(profile_bound & set(m.get("failed") or []) for m in misses):
            # A newcomer's --gpu T4 meets the default training profile's 80 GB: say which knob it is.
            sys.stderr.write(
                f"broker: the {args.profile} profile asks that of every GPU; for another card pick the profile "
                f"that fits the work, e.g. --profile inference or --profile fine_tuning\n"
            )
        return EXIT_API
    best = quotes[0]
    offer = best["offer"]
    say = sys.stderr if args.json else out
    pricing = str(offer.get("pricing_model") or "on_demand")
    kind = pricing.replace("_", "-") + (": it may be interrupted" if pricing == "spot" else "")
    say.write(f"ordering {offer['gpu_count']} x {offer['gpu_model']} {offer['instance_type']} in {offer['zone']} "
              f"({offer['provider']}) at {best['price_per_hour']} USD/h {kind}\n")  # fmt: skip
    order = client.order(quote=best["id"], duration_hours=args.hours, max_price_per_hour=args.max_price)
    last: dict[str, Any] = order
    for state in client.watch(order["id"], until=["running"], timeout=args.wait, interval=args.interval):
        last = state
        if not args.json:
            reason = f"  {state['state_reason']}" if state.get("state_reason") else ""
            out.write(f"{state.get('state_changed_at')}  {state['state']}{reason}\n")
            out.flush()
    final = client.order_get(order["id"])
    if args.json:
        _json(final, out)
    else:
        _order_lines(final, out)
        if final.get("connection"):
            out.write(f"ssh with the host key checked: broker ssh {final['id']}\n")
    return EXIT_OK if last.get("state") == "running" and final.get("state") == "running" else EXIT_API


def cmd_key(client: BrokerClient, args: argparse.Namespace, out: TextIO) -> int:
    key = client.ledger_key()
    if args.json:
        _json(key, out)
    else:
        out.write(f"{key['verifier_key']}\n")
        sys.stderr.write("note: this key came from the broker itself; compare it with one published out of band\n")
    return EXIT_OK


# --- Parsing ---------------------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("BROKER_URL"), help="the broker (env BROKER_URL)")
    common.add_argument("--token", default=os.environ.get("BROKER_TOKEN"), help="a brk_ token (env BROKER_TOKEN)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument(
        "--timeout", type=bounds.number(0.1, 3600), default=30.0, help="seconds per request (default 30)"
    )
    common.add_argument(
        "--retries", type=bounds.number(0, 100, whole=True), default=3, help="retries of a failed request (default 3)"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log each retry on stderr")
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    main = argparse.ArgumentParser(prog="broker", description="The GPU broker's procurement API from a shell.")
    sub = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("offers", parents=[common], help="search offers for sale")
    p.add_argument("query", nargs="?", default="", help='search terms, e.g. "gpu=H100 count>=8 price<40"')
    p.add_argument("--sort", choices=["price", "gpuprice", "tflops"], default="price")
    p.add_argument(
        "--limit", type=bounds.number(1, 10000, whole=True), default=20, help="at most this many offers (default 20)"
    )
    p.set_defaults(run=cmd_offers)

    p = sub.add_parser("quote", parents=[common], help="ranked quotes for a workload")
    p.add_argument("--profile", choices=PROFILES, default="training", help="the workload (default training)")
    p.add_argument("--gpu", action="append", help="GPU model key or family (A100 = every A100); repeatable")
    p.add_argument("--count", type=bounds.number(1, 64, whole=True), help="GPUs")
    p.add_argument(
        "--total-memory", type=bounds.number(1, 16384, whole=True), help="total GPU memory in GB (instead of --count)"
    )
    p.add_argument("--min-gpu-memory", type=bounds.number(0, 1024, whole=True), help="GB per GPU at least")
    p.add_argument("--region", action="append", help="region; repeatable or comma-separated")
    p.add_argument("--jurisdiction", action="append", help="eu, us, ...; repeatable")
    p.add_argument("--pricing", action="append", help="on_demand, spot, reserved; repeatable")
    p.add_argument("--max-price", help="USD per hour at most")
    p.add_argument("--max-job-price", help="USD for the whole job at most")
    p.add_argument("--hours", type=bounds.number(0.01, 8760), help="expected duration (default 1)")
    p.add_argument("--tolerance", choices=["none", "checkpointed", "stateless"], help="how it bears interruptions")
    p.add_argument("--checkpoint-hours", type=bounds.number(0, 8760), help="hours between checkpoints")
    p.add_argument("--min-interconnect", type=bounds.number(0, 100000, whole=True), help="GB/s between GPUs at least")
    p.add_argument("--rdma", action=argparse.BooleanOptionalAction, default=None, help="needs RDMA")
    p.add_argument("--ecc", action=argparse.BooleanOptionalAction, default=None, help="needs ECC memory")
    p.add_argument("--min-fp64", type=bounds.number(0, 1000), help="FP64 TFLOPS per GPU at least")
    p.add_argument("--min-encoders", type=bounds.number(0, 64, whole=True), help="video encoders per GPU at least")
    p.add_argument("--id", help="a name for the workload")
    p.add_argument("--limit", type=bounds.number(1, 50, whole=True), default=10, help="quotes to return (default 10)")
    p.set_defaults(run=cmd_quote)

    p = sub.add_parser("order", parents=[common], help="order an offer or a quote")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--offer", type=bounds.number(1, 2**63 - 1, whole=True), help="an offer id, at its price now")
    what.add_argument("--quote", help="a quote id, at the price it locked")
    p.add_argument("--max-price", help="USD per hour at most (failover stays under it)")
    p.add_argument("--no-failover", action="store_true", help="do not move to another offer when this one fails")
    p.add_argument("--bid", type=bounds.money(0.0001, 1_000_000),
                   help="USD per GPU-hour for a host's interruptible offer (at least its minimum)")  # fmt: skip
    p.add_argument("--region", action="append", help="regions failover may use; repeatable")
    p.add_argument("--hours", help="stop the instance after this many hours")
    p.add_argument("--idempotency-key", help="reuse to retry this order safely from another run")
    p.set_defaults(run=cmd_order)

    p = sub.add_parser("show", parents=[common], help="one order")
    p.add_argument("order")
    p.set_defaults(run=cmd_show)

    p = sub.add_parser("orders", parents=[common], help="your organisation's orders, newest first")
    p.add_argument("--limit", type=bounds.number(1, 10000, whole=True), default=20)
    p.set_defaults(run=cmd_orders)

    p = sub.add_parser("watch", parents=[common], help="follow an order's state until it reaches one")
    p.add_argument("order")
    p.add_argument("--until", action="append", help="state(s) to wait for (default running); final states stop too")
    p.add_argument(
        "--wait", type=bounds.number(0, 86400), default=600.0, help="give up after this many seconds (default 600)"
    )
    p.add_argument("--interval", type=bounds.number(0.1, 3600), default=2.0, help="seconds between looks (default 2)")
    p.set_defaults(run=cmd_watch)

    p = sub.add_parser("terminate", parents=[common], help="stop an order's instance")
    p.add_argument("order")
    p.set_defaults(run=cmd_terminate)

    for action, action_help in (
        ("stop", "stop an order's machine, keeping its disk (where its provider can)"),
        ("start", "start a stopped order's machine again"),
        ("restart", "reboot an order's machine in place"),
    ):
        p = sub.add_parser(action, parents=[common], help=action_help)
        p.add_argument("order")
        p.set_defaults(run=cmd_order_action, action=action)

    p = sub.add_parser("logs", parents=[common], help="the last lines of an order's workload output")
    p.add_argument("order")
    p.add_argument(
        "--lines", type=bounds.number(1, 1000, whole=True), default=100, help="how many lines, 1 to 1000 (default 100)"
    )
    p.set_defaults(run=cmd_logs)

    p = sub.add_parser("receipt", parents=[common], help="an order's ledger receipt, optionally verified")
    p.add_argument("order", nargs="?", default="", help="the order (or give --file)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="verify proofs and signature here; exit 3 if they do not verify, 4 if entries are still pending",
    )
    p.add_argument(
        "--wait",
        nargs="?",
        const=120.0,
        type=bounds.number(0, 3600),
        metavar="SECONDS",
        help="with --verify: while entries are pending, ask again until they verify, for at most SECONDS "
        "(default 120); exit 4 if still pending then",
    )
    p.add_argument(
        "--interval", type=bounds.number(0.1, 3600), help="with --wait: seconds between looks (default Retry-After)"
    )
    p.add_argument("--key", help="the verifier key you trust, obtained out of band (env BROKER_VERIFIER_KEY)")
    p.add_argument("--key-file", help="a file holding that key")
    p.add_argument("--file", help="verify a saved receipt instead of fetching one")
    p.add_argument("--state", help="a file remembering the newest checkpoint verified: each later one must extend it")
    p.set_defaults(run=cmd_receipt)

    p = sub.add_parser("key", parents=[common], help="the verifier key the broker publishes")
    p.set_defaults(run=cmd_key)

    p = sub.add_parser("keys", parents=[common], help="your organisation's SSH keys: list, add FILE, rm ID")
    p.add_argument("action", nargs="?", choices=["list", "add", "rm"], default="list")
    p.add_argument("file", nargs="?", help="add: the public key file (~/.ssh/id_ed25519.pub); rm: the key id")
    p.add_argument("--name", help="add: a name (default: the key's comment)")
    p.set_defaults(run=cmd_keys)

    p = sub.add_parser("ssh", parents=[common], help="ssh into an order's machine, its host key checked")
    p.add_argument("order")
    p.add_argument("--print", action="store_true", help="print the ssh command and known_hosts instead of running it")
    p.add_argument("command", nargs="*", help="a command to run there, after --: broker ssh ORDER -- nvidia-smi")
    p.set_defaults(run=cmd_ssh)

    p = sub.add_parser("launch", parents=[common], help="quote, order, wait until ready, print how to connect")
    p.add_argument("--gpu", required=True, help="MODEL[:COUNT], e.g. H100:8 or T4 (a family means any variant)")
    p.add_argument("--template", help="start from a saved template (NAME or id) or the gallery's (gallery:SLUG)")
    launch_arguments(p)
    p.add_argument("--hours", help="stop after this many hours")
    p.add_argument("--spend-cap", help="stop once the order has cost this many USD")
    p.add_argument("--max-price", help="USD per hour at most")
    p.add_argument("--profile", choices=PROFILES, default="training", help="the workload profile (default training)")
    p.add_argument("--region", action="append", help="regions allowed; repeatable")
    p.add_argument(
        "--pricing", action="append", help="on_demand (the default), spot (interruptible, cheaper); repeatable"
    )
    p.add_argument(
        "--wait", type=bounds.number(0, 86400), default=1800.0, help="give up waiting after this many seconds"
    )
    p.add_argument("--interval", type=bounds.number(0.1, 3600), default=3.0, help="seconds between looks")
    p.set_defaults(run=cmd_launch)

    register(sub, common)  # templates, clusters, billing
    register_fleets(sub, common, launch_arguments=launch_arguments, launch_from=launch_config_from, table=table)
    return main


def launch_arguments(p: argparse.ArgumentParser) -> None:
    """The options that describe a launch configuration (``launch_config_from`` reads them)."""
    p.add_argument("--image", help="a container image to run on the GPUs")
    p.add_argument(
        "--run", dest="run_command", help="the command: in the container with --image, else a script on the machine"
    )
    p.add_argument("--script", help="a script file to run on the machine (instead of --run)")
    p.add_argument("--env", action="append", help="NAME=VALUE for the workload; repeatable")
    p.add_argument("--secret-env", action="append", help="NAME=VALUE kept secret (never shown again); repeatable")
    p.add_argument("--port", action="append", help="ports to open (and expose from the container); repeatable")
    p.add_argument("--allow", action="append", help="address ranges that may connect (default: this machine's)")
    p.add_argument("--key", action="append", help="SSH key ids to install (default: all of the organisation's)")
    p.add_argument("--shm", type=bounds.number(1, 1024, whole=True), help="shared memory for the container, GB")
    p.add_argument("--disk", type=bounds.number(10, 16384, whole=True), help="disk size, GB")
    p.add_argument("--vm-image", help="the machine image id (default: the cloud's GPU-ready image)")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="broker: %(message)s", stream=sys.stderr)
    needs_server = not (args.command == "receipt" and args.file)
    if args.command == "receipt" and not args.file and not args.order:
        return _usage("receipt needs an ORDER or --file")
    if needs_server and not args.url:
        return _usage("no broker address: give --url or set BROKER_URL")
    if args.retries < 0 or args.timeout <= 0:
        return _usage("--retries must be >= 0 and --timeout > 0")
    client = BrokerClient(args.url or "http://127.0.0.1", args.token, timeout=args.timeout, retries=args.retries)
    try:
        code: int = args.run(client, args, out)
        return code
    except (UsageError, CommandUsageError) as exc:
        return _usage(str(exc))
    except BrokerError as exc:
        sys.stderr.write(f"broker: {exc.describe()}\n")
        return EXIT_API
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()


def _usage(message: str) -> int:
    sys.stderr.write(f"broker: {message}\n")
    return EXIT_USAGE


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
