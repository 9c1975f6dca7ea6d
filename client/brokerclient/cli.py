"""``broker``: the command line over ``BrokerClient``.

The broker's address and token come from ``--url``/``--token`` or ``BROKER_URL``/``BROKER_TOKEN``. Output is
a table for people, or JSON with ``--json`` (``watch`` writes one JSON object per line, one per state change).
Exit status: 0 ok, 1 an API error (its code and message on stderr), 2 a usage error, 3 a receipt that did not
verify.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from brokerclient.api import ORDER_STATES, BrokerClient
from brokerclient.errors import BrokerError
from brokerclient.verify import Check, RememberedCheckpoint, VerificationResult, remembered_check, verify_receipt

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_UNVERIFIED = 0, 1, 2, 3
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
    for name, value in rows:
        out.write(f"{name:<9} {_cell(value)}\n")
    for warning in order.get("warnings") or []:
        out.write(f"warning   {warning}\n")


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
    if args.file:
        try:
            receipt = json.loads(Path(args.file).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the receipt file: {exc}") from None
    else:
        receipt = client.receipt(args.order)
    if not args.verify:
        if args.json:
            _json(receipt, out)
        else:
            _receipt_table(receipt, out)
        return EXIT_OK
    order_id = None if args.file and not args.order else args.order
    result = verify_receipt(receipt, trusted_key=trusted, order_id=order_id)
    if args.state and result.ok and result.checkpoint is not None:
        _check_remembered(client, Path(args.state), result)
    if args.json:
        _json({"receipt": receipt, "verification": result.as_json()}, out)
    else:
        _receipt_table(receipt, out)
        out.write(result.text() + "\n")
        if not result.key_pinned:
            out.write("note: no key pinned (--key): the receipt's own key shows only that whoever answered signed it\n")
    return EXIT_OK if result.ok else EXIT_UNVERIFIED


def _check_remembered(client: BrokerClient, state: Path, result: VerificationResult) -> None:
    """Check the receipt's checkpoint against the one remembered in ``state`` (the first run remembers it),
    record the check on ``result``, and remember the newer checkpoint once it is shown to extend the old."""
    signed = result.checkpoint
    assert signed is not None
    try:
        remembered = RememberedCheckpoint.from_json(json.loads(state.read_text())) if state.exists() else None
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
    table(rows, ["seq", "kind", "created_at", "status"], out)
    checkpoint = receipt.get("checkpoint")
    if checkpoint:
        out.write(f"checkpoint size {checkpoint.get('size')} root {checkpoint.get('root')}\n")
    else:
        out.write("no checkpoint covers these entries yet\n")


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
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    common.add_argument("--retries", type=int, default=3, help="retries of a failed request (default 3)")
    common.add_argument("-v", "--verbose", action="store_true", help="log each retry on stderr")
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    main = argparse.ArgumentParser(prog="broker", description="The GPU broker's procurement API from a shell.")
    sub = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("offers", parents=[common], help="search offers for sale")
    p.add_argument("query", nargs="?", default="", help='search terms, e.g. "gpu=H100 count>=8 price<40"')
    p.add_argument("--sort", choices=["price", "gpuprice", "tflops"], default="price")
    p.add_argument("--limit", type=int, default=20, help="at most this many offers (default 20)")
    p.set_defaults(run=cmd_offers)

    p = sub.add_parser("quote", parents=[common], help="ranked quotes for a workload")
    p.add_argument("--profile", choices=PROFILES, default="training", help="the workload (default training)")
    p.add_argument("--gpu", action="append", help="GPU model key or family (A100 = every A100); repeatable")
    p.add_argument("--count", type=int, help="GPUs")
    p.add_argument("--total-memory", type=int, help="total GPU memory in GB (instead of --count)")
    p.add_argument("--min-gpu-memory", type=int, help="GB per GPU at least")
    p.add_argument("--region", action="append", help="region; repeatable or comma-separated")
    p.add_argument("--jurisdiction", action="append", help="eu, us, ...; repeatable")
    p.add_argument("--pricing", action="append", help="on_demand, spot, reserved; repeatable")
    p.add_argument("--max-price", help="USD per hour at most")
    p.add_argument("--max-job-price", help="USD for the whole job at most")
    p.add_argument("--hours", type=float, help="expected duration (default 1)")
    p.add_argument("--tolerance", choices=["none", "checkpointed", "stateless"], help="how it bears interruptions")
    p.add_argument("--checkpoint-hours", type=float, help="hours between checkpoints")
    p.add_argument("--min-interconnect", type=int, help="GB/s between GPUs at least")
    p.add_argument("--rdma", action=argparse.BooleanOptionalAction, default=None, help="needs RDMA")
    p.add_argument("--ecc", action=argparse.BooleanOptionalAction, default=None, help="needs ECC memory")
    p.add_argument("--min-fp64", type=float, help="FP64 TFLOPS per GPU at least")
    p.add_argument("--min-encoders", type=int, help="video encoders per GPU at least")
    p.add_argument("--id", help="a name for the workload")
    p.add_argument("--limit", type=int, default=10, help="quotes to return (default 10)")
    p.set_defaults(run=cmd_quote)

    p = sub.add_parser("order", parents=[common], help="order an offer or a quote")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--offer", type=int, help="an offer id, at its price now")
    what.add_argument("--quote", help="a quote id, at the price it locked")
    p.add_argument("--max-price", help="USD per hour at most (failover stays under it)")
    p.add_argument("--no-failover", action="store_true", help="do not move to another offer when this one fails")
    p.add_argument("--region", action="append", help="regions failover may use; repeatable")
    p.add_argument("--hours", help="stop the instance after this many hours")
    p.add_argument("--idempotency-key", help="reuse to retry this order safely from another run")
    p.set_defaults(run=cmd_order)

    p = sub.add_parser("show", parents=[common], help="one order")
    p.add_argument("order")
    p.set_defaults(run=cmd_show)

    p = sub.add_parser("orders", parents=[common], help="your organisation's orders, newest first")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(run=cmd_orders)

    p = sub.add_parser("watch", parents=[common], help="follow an order's state until it reaches one")
    p.add_argument("order")
    p.add_argument("--until", action="append", help="state(s) to wait for (default running); final states stop too")
    p.add_argument("--wait", type=float, default=600.0, help="give up after this many seconds (default 600)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between looks (default 2)")
    p.set_defaults(run=cmd_watch)

    p = sub.add_parser("terminate", parents=[common], help="stop an order's instance")
    p.add_argument("order")
    p.set_defaults(run=cmd_terminate)

    p = sub.add_parser("receipt", parents=[common], help="an order's ledger receipt, optionally verified")
    p.add_argument("order", nargs="?", default="", help="the order (or give --file)")
    p.add_argument("--verify", action="store_true", help="verify proofs and signature here; exit 3 if not")
    p.add_argument("--key", help="the verifier key you trust, obtained out of band (env BROKER_VERIFIER_KEY)")
    p.add_argument("--key-file", help="a file holding that key")
    p.add_argument("--file", help="verify a saved receipt instead of fetching one")
    p.add_argument("--state", help="a file remembering the newest checkpoint verified: each later one must extend it")
    p.set_defaults(run=cmd_receipt)

    p = sub.add_parser("key", parents=[common], help="the verifier key the broker publishes")
    p.set_defaults(run=cmd_key)
    return main


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
    except UsageError as exc:
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
