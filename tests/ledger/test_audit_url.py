"""The auditor's tool against a running broker (``python -m ledger.audit --url``): the public ledger endpoints alone,
on pytest-django's live server, with the checkpoints anchored through JSON-RPC to the run command's chain node,
as the demo does; then the log rewritten in the database, and brokers that answer badly."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from ledger import merkle, note
from ledger.audit import FetchError, audit, bundle_from_api
from ledger.chain import Web3
from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.keys import signing_key, verifier_key
from ledger.models import Checkpoint, LedgerEntry
from ledger.receipts import audit_bundle
from ledger.services import ledger_append, ledger_sequence
from tests.ledger.chainnode_process import Node, chain_node
from tests.ledger.tamper import triggers_bypassed

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def _append(n: int, start: int) -> None:
    for i in range(start, start + n):
        with transaction.atomic():
            ledger_append(kind="order.event", subject=f"order:{i % 4}", payload={"i": i})
    ledger_sequence()  # as the writer would right after its commit, which this test transaction never makes


@pytest.fixture
def node(tmp_path, settings) -> Iterator[Node]:
    """The chain node the broker anchors to, with its own funded key, as ``bin/run`` sets it up."""
    key = "0x" + secrets.token_hex(32)
    address = str(Web3().eth.account.from_key(key).address)
    with chain_node(tmp_path / "chain", address) as running:
        settings.LEDGER_CHAIN_RPC_URL = running.url
        settings.LEDGER_CHAIN_PRIVATE_KEY = key
        yield running


@pytest.fixture
def published(node) -> None:
    """12 entries and an anchored checkpoint, 8 more and a second, 2 pending."""
    _append(12, start=0)
    ledger_checkpoint_and_anchor()
    _append(8, start=12)
    ledger_checkpoint_and_anchor()
    _append(2, start=20)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-m", "ledger.audit", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _rewrite_leaf(sequence: int) -> None:
    """Rewrite the log as an insider holding the database and the signing key would: a leaf changed, every
    checkpoint's root recomputed and re-signed with the real key. Only the anchors stay as they were."""
    leaves = [bytes.fromhex(h) for h in LedgerEntry.objects.order_by("sequence").values_list("leaf_hash", flat=True)]
    leaves[sequence - 1] = merkle.leaf_hash(b"a different entry")
    key = signing_key()
    with triggers_bypassed() as cursor:
        cursor.execute(
            "UPDATE ledger_ledgerentry SET leaf_hash = %s WHERE sequence = %s", [leaves[sequence - 1].hex(), sequence]
        )
        for checkpoint in Checkpoint.objects.order_by("size"):
            root = merkle.root_from_hashes(leaves[: checkpoint.size])
            signed = note.sign(note.CheckpointBody(checkpoint.origin, checkpoint.size, root), checkpoint.origin, key)
            cursor.execute(
                "UPDATE ledger_checkpoint SET root_hash = %s, note = %s WHERE id = %s",
                [root.hex(), signed, checkpoint.pk],
            )


# --- A broker read through its API -------------------------------------------------------------------------------


def test_the_bundle_read_from_the_api_is_the_one_the_operator_exports(live_server, published):
    read = bundle_from_api(live_server.url)

    exported = json.loads(json.dumps(audit_bundle(with_leaves=True)))
    assert read == {k: exported[k] for k in read}
    assert [cp["size"] for cp in read["checkpoints"]] == [12, 20]
    assert all(cp["anchor"]["tx_hash"].startswith("0x") for cp in read["checkpoints"])
    assert len(read["leaf_hashes"]) == 20  # up to the newest checkpoint, not the 2 pending entries


def test_a_clean_broker_passes_with_its_anchors_checked_on_the_chain_node(live_server, published, node, tmp_path):
    state = tmp_path / "audit-state.json"

    run = _cli("--url", live_server.url, "--key", verifier_key(), "--rpc-url", node.url, "--state", state)

    assert run.returncode == 0, run.stdout + run.stderr
    assert "audit PASSED" in run.stdout
    assert "checkpoints 12 -> 20: checkpoint 20 extends checkpoint 12" in run.stdout
    assert "checkpoint 20: the root recomputed from the bundle's leaf hashes matches" in run.stdout
    assert run.stdout.count("the chain states this size and root") == 2
    saved = json.loads(state.read_text())
    newest = Checkpoint.objects.get(size=20)
    assert (saved["size"], saved["root"], saved["verifier_key"]) == (20, newest.root_hash, verifier_key())
    assert saved["anchor_sender"] == newest.anchor.sender

    # The log grows; the next audit, with only the state, holds it to what the first one saw.
    _append(6, start=22)
    ledger_checkpoint_and_anchor()
    run = _cli("--url", live_server.url, "--rpc-url", node.url, "--state", state)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "remembered in the state" in run.stdout and "still in the log unchanged" in run.stdout
    assert json.loads(state.read_text())["size"] == 28


def test_a_log_rewritten_after_an_audit_fails_against_its_state_and_its_anchors(live_server, published, node, tmp_path):
    state = tmp_path / "audit-state.json"
    assert _cli("--url", live_server.url, "--key", verifier_key(), "--state", state).returncode == 0
    saved = state.read_text()

    _rewrite_leaf(5)

    # Consistent and signed with the real key: an auditor with neither memory nor chain cannot tell ...
    fresh = _cli("--url", live_server.url, "--key", verifier_key())
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    # ... the state from before can ...
    run = _cli("--url", live_server.url, "--state", state)
    assert run.returncode == 1, run.stdout + run.stderr
    assert (
        "FAILED  state" in run.stdout and "checkpoint 20 (root" in run.stdout and "the log was rewritten" in run.stdout
    )
    assert state.read_text() == saved  # a failed audit keeps the state it was held to
    # ... and so can the chain.
    run = _cli("--url", live_server.url, "--key", verifier_key(), "--rpc-url", node.url)
    assert run.returncode == 1
    assert (
        "FAILED  anchor       checkpoint 12: anchor tx 0x" in run.stdout
        and "the chain holds size 12 root" in run.stdout
    )


def test_a_remembered_checkpoint_the_broker_no_longer_lists_is_proven_by_a_consistency_proof(live_server, node):
    _append(12, start=0)
    ledger_checkpoint_and_anchor()
    first = audit(bundle_from_api(live_server.url), trusted_key=verifier_key())
    assert first.ok and first.state is not None and first.state["size"] == 12
    _append(8, start=12)
    ledger_checkpoint_and_anchor()
    with triggers_bypassed() as cursor:  # the broker drops checkpoint 12 from what it publishes
        cursor.execute("DELETE FROM ledger_anchor WHERE checkpoint_id = %s", [Checkpoint.objects.get(size=12).pk])
        cursor.execute("DELETE FROM ledger_checkpoint WHERE size = 12")

    bundle = bundle_from_api(live_server.url, state=first.state)
    report = audit({**bundle, "leaf_hashes": None}, state=first.state)  # the proof alone, not the leaves

    assert [(p["old_size"], p["new_size"]) for p in bundle["consistency"]] == [(12, 20)]
    assert report.ok, report.text()
    (check,) = report.family("state")
    assert "checkpoint 20 extends it (consistency proof)" in check.message


# --- Brokers that answer badly: a clear error naming what failed --------------------------------------------------


@pytest.fixture
def stub() -> Iterator[Callable[[Callable[[BaseHTTPRequestHandler], None]], str]]:
    """A web server answering every GET with ``respond(handler)``: a broker that misbehaves. Its URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(respond: Callable[[BaseHTTPRequestHandler], None]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                respond(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _answer(status: int, body: bytes, **headers: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name.replace("_", "-"), value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def test_an_unreachable_broker_exits_2_naming_the_url(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = tmp_path / "state.json"

    run = _cli("--url", f"http://127.0.0.1:{port}", "--state", state)

    assert run.returncode == 2
    assert f"cannot read the broker's ledger at http://127.0.0.1:{port}" in run.stderr
    assert f"http://127.0.0.1:{port}/api/v1/ledger/key" in run.stderr and "Traceback" not in run.stderr
    assert not state.exists()


def test_an_answer_over_the_size_bound_is_refused(live_server, published):
    over = r"/api/v1/ledger/checkpoints\?after=0&limit=1000: the answer is [0-9]+ bytes, over the 600 "
    with pytest.raises(FetchError, match=over):
        bundle_from_api(live_server.url, max_answer_bytes=600)  # the key fits in 600 bytes, two checkpoints do not


def test_an_oversized_or_deep_answer_says_so_on_the_command_line(stub):
    huge = stub(_answer(200, b'{"origin": "' + b"x" * (65 * 1024 * 1024) + b'"}'))
    deep = stub(_answer(200, b"[" * 100 + b"]" * 100))

    too_big, too_deep = _cli("--url", huge), _cli("--url", deep)

    assert too_big.returncode == too_deep.returncode == 2
    assert re.search(
        r"/api/v1/ledger/key: the answer is [0-9]{8} bytes, over the 67108864 this tool reads", too_big.stderr
    )
    assert "/api/v1/ledger/key: the answer is not JSON within the tool's bounds" in too_deep.stderr
    assert "nests deeper than 16 levels" in too_deep.stderr


def test_a_redirect_to_another_host_is_not_followed(stub):
    elsewhere = stub(_answer(200, b"{}"))
    url = stub(_answer(302, b"", Location=elsewhere + "/api/v1/ledger/key"))

    with pytest.raises(FetchError, match=r"redirects to http://127\.0\.0\.1:[0-9]+/api/v1/ledger/key, another host"):
        bundle_from_api(url)


def test_an_error_answer_is_named_with_its_status_and_message(stub):
    url = stub(_answer(404, b'{"error": {"code": "not_found", "message": "no ledger here"}}'))

    with pytest.raises(FetchError, match=r"/api/v1/ledger/key answered HTTP 404: not_found: no ledger here") as exc:
        bundle_from_api(url)
    assert exc.value.status == 404


def test_a_broker_that_trickles_its_answer_is_cut_off_at_the_request_deadline(stub):
    stop = threading.Event()

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.flush_headers()
        try:
            while not stop.is_set():  # one header byte at a time, each well within a socket timeout
                handler.wfile.write(b"X")
                handler.wfile.flush()
                stop.wait(0.05)
        except OSError:
            return  # the auditor hung up

    url = stub(trickle)
    started = time.monotonic()
    try:
        with pytest.raises(FetchError, match="/api/v1/ledger/key: no whole answer within 1 s"):
            bundle_from_api(url, request_timeout_s=1.0)
    finally:
        stop.set()
    assert time.monotonic() - started < 10


def test_the_overall_deadline_bounds_every_request_together(stub):
    pages = iter(range(1, 10**6))

    def endless(handler: BaseHTTPRequestHandler) -> None:
        if handler.path.startswith("/api/v1/ledger/key"):
            _answer(200, b'{"origin": "x", "verifier_key": "k", "key_history": []}')(handler)
        else:  # a broker whose checkpoint pages never end
            page = next(pages)
            _answer(200, json.dumps({"checkpoints": [], "next_after": page}).encode())(handler)

    with pytest.raises(FetchError, match="the audit's deadline of 1 s"):
        bundle_from_api(stub(endless), deadline_s=1.0)
