"""The auditor's command line (``python -m ledger.audit``): reads the bundle or the broker's URL, the receipts,
the key and the state file; prints the report; saves the new state when the audit passes. Exit status 0 when
everything checked passed, 1 when a check failed, 2 when an input could not be read."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledger import note
from ledger.audit.checks import audit
from ledger.audit.fetch import DEADLINE_S, REQUEST_TIMEOUT_S, FetchError, bundle_from_api
from ledger.audit.inputs import (
    BUNDLE_FORMAT,
    MAX_INPUT_BYTES,
    MAX_INPUT_DEPTH,
    RECEIPT_FORMAT,
    _kind,
    _Malformed,
    _parse_state,
)
from untrusted.jsonbody import bounded_json  # standard library only, as this tool is

_DECIMAL = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?", re.ASCII)


class _Unreadable(Exception):
    """An input the tool cannot start from: exit status 2."""


def _load_json(path: str, what: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Unreadable(f"cannot read {what} {path}: {exc}") from None
    try:
        value = bounded_json(text, max_bytes=MAX_INPUT_BYTES, max_depth=MAX_INPUT_DEPTH)
    except ValueError as exc:
        raise _Unreadable(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Unreadable(f"{what} {path} is {_kind(value)}, not a JSON object")
    return value


def _expect_format(value: dict[str, Any], expected: str, what: str, path: str) -> None:
    if value.get("format") != expected:
        raise _Unreadable(f"{what} {path} is not a {expected} document (its format is {value.get('format')!r})")


def _write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file in one step, so a crash never leaves half of one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _seconds(text: str) -> float:
    """An argparse type: seconds written with the digits 0-9 (``float`` would take other scripts' digits and
    exponents), from 0.1 to a day."""
    if not _DECIMAL.fullmatch(text.strip()) or not 0.1 <= float(text) <= 86_400:
        raise argparse.ArgumentTypeError(f"seconds from 0.1 to 86400 in the digits 0-9, not {text[:40]!r}")
    return float(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ledger.audit",
        description="Audit the broker's ledger: from its public API (--url) or an exported audit bundle, and receipts.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("bundle", nargs="?", help="the audit bundle (manage.py ledger export --out bundle.json)")
    source.add_argument(
        "--url", metavar="URL", help="the broker's site (http://127.0.0.1:8000): read its public ledger endpoints"
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=REQUEST_TIMEOUT_S,
        metavar="S",
        help=f"with --url: seconds for each request, start to end (default {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--deadline",
        type=_seconds,
        default=DEADLINE_S,
        metavar="S",
        help=f"with --url: seconds for reading the whole ledger (default {DEADLINE_S:g})",
    )
    parser.add_argument("--receipt", action="append", default=[], metavar="R.json", help="an order's receipt")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--key",
        action="append",
        metavar="VKEY",
        help="the broker's verifier key, obtained out of band (repeat for a rotation its old key did not cosign)",
    )
    keys.add_argument("--key-file", metavar="F", help="a file holding the verifier key(s), one a line")
    parser.add_argument("--rpc-url", metavar="URL", help="a JSON-RPC node of the anchor chain: check anchors")
    parser.add_argument("--anchor-sender", metavar="ADDR", help="the broker's anchor address, if known")
    parser.add_argument(
        "--state", metavar="STATE.json", help="the state of the last audit: read, and rewritten on success"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # names from the bundle must not crash a non-UTF-8 terminal
            stream.reconfigure(errors="backslashreplace")
    try:
        if args.bundle is not None:
            bundle = _load_json(args.bundle, "bundle")
            _expect_format(bundle, BUNDLE_FORMAT, "bundle", args.bundle)
        receipts = []
        for path in args.receipt:
            receipt = _load_json(path, "receipt")
            _expect_format(receipt, RECEIPT_FORMAT, "receipt", path)
            receipts.append(receipt)
        key: list[str] | None = args.key
        if args.key_file:
            try:
                key = Path(args.key_file).read_text(encoding="utf-8").split()
            except (OSError, UnicodeDecodeError) as exc:
                raise _Unreadable(f"cannot read key file {args.key_file}: {exc}") from None
            if not key:
                raise _Unreadable(f"the key file {args.key_file} holds no verifier key")
        for one in key or []:
            try:
                note.parse_verifier_key(one)
            except ValueError as exc:
                raise _Unreadable(f"the verifier key is unusable: {exc}") from None
        state = None
        if args.state and Path(args.state).exists():
            state = _load_json(args.state, "state file")
            try:
                _parse_state(state)
            except _Malformed as exc:
                raise _Unreadable(f"state file {args.state} is malformed: {exc}") from None
        if args.url is not None:
            try:
                bundle = bundle_from_api(
                    args.url, state=state, request_timeout_s=args.timeout, deadline_s=args.deadline
                )
            except FetchError as exc:
                raise _Unreadable(f"cannot read the broker's ledger at {args.url}: {exc}") from None
    except _Unreadable as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    w3 = None
    if args.rpc_url:
        from ledger.chain import Web3  # imported there with the process's recursion limit kept

        w3 = Web3(Web3.HTTPProvider(args.rpc_url, request_kwargs={"timeout": 30}))
    report = audit(bundle, receipts=receipts, w3=w3, trusted_key=key, state=state, anchor_sender=args.anchor_sender)
    print(report.text())
    if not report.ok:
        return 1
    if args.state and report.state is not None:
        try:
            _write_state(Path(args.state), report.state)
        except OSError as exc:
            print(f"audit: passed, but the state file {args.state} could not be written: {exc}", file=sys.stderr)
            return 2
        print(f"state saved to {args.state}: checkpoint {report.state['size']}")
    return 0
