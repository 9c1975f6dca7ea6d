"""Benchmark: honest offer searches while hostile callers send what used to crash or freeze a worker.

    .venv/bin/python bench/hostile.py [--offers 3000] [--concurrency 2] [--attackers 1] [--seconds 10] [--rounds 2]

It creates (or reuses) its own database and fills it with ``--offers`` offers as bench/api.py does, and serves
the broker in gunicorn with production settings (DEBUG off, Redis for the throttle counters when it answers on
127.0.0.1:6379, the rates raised so that every request reaches the code under test). From this process, over
loopback, it keeps ``--concurrency`` honest searches in flight (``GET /api/v1/offers`` with a token scoped
``offers:read``, bench/api.py's mix of searches)

- alone: the baseline; and
- while ``--attackers`` threads send, one after another, in a loop, the requests of issue 17: a
  ``POST /api/v1/orders`` whose ``offer`` is nested 100,000 deep, the searches ``count<1e1000000``,
  ``max_price<1e309`` and ``price<1e309``, and a 3 MB JSON body (``POST /api/v1/orders``, a token scoped
  ``orders:place``),

alternating the two for ``--rounds`` rounds of ``--seconds`` each. It sends each hostile request once first and
shows the answer. It reports the honest p50/p95 and requests/s of both phases and their ratios, the hostile
answers by kind and status code with their p50/p95, and the gunicorn workers before and after with anything
gunicorn logged about a worker's death or timeout. It exits non-zero when a worker was lost, a hostile request
got anything but 400/413 (a 5xx, no answer) or took longer than ``--slow`` seconds, or an honest search failed.

Goal (issue 17): the honest p95 under attack within ~2x of the baseline, no worker lost, every hostile request
refused in well under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api import SEARCHES, Target, _free_port, _get, _load, _ms, _path, _redis_answers, _seed, _token  # noqa: E402
from bench.sync import django_on  # noqa: E402 - after the path is set

OFFERS = "/api/v1/offers"
ORDERS = "/api/v1/orders"
DEPTH = 100_000
# Longer than gunicorn's worker timeout (30 s): a request that freezes a worker is waited out and counted, not dropped.
HOSTILE_TIMEOUT_S = 40.0
REFUSED = (400, 413)
# What gunicorn's arbiter logs when a worker ends other than by a graceful shutdown.
DEATHS = ("WORKER TIMEOUT", "was sent SIG", "exited with code")


@dataclasses.dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    body: bytes = b""


def _hostiles() -> list[Hostile]:
    nested = b'{"offer": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"
    # Valid JSON, a quarter of a million strings: costly to decode, had the size not been checked first.
    big = json.dumps({"offer": 1, "regions": ["us-east-1"] * 250_000}).encode()
    return [
        Hostile(f"nested {DEPTH:,} deep", "POST", ORDERS, nested),
        Hostile("q=count<1e1000000", "GET", _path(OFFERS, "count<1e1000000", "price")),
        Hostile("q=max_price<1e309", "GET", _path(OFFERS, "max_price<1e309", "price")),
        Hostile("q=price<1e309", "GET", _path(OFFERS, "price<1e309", "price")),
        Hostile(f"{len(big) / 1e6:.1f} MB JSON body", "POST", ORDERS, big),
    ]


def _hostile_send(port: int, hostile: Hostile, token: str) -> tuple[int, float, bytes]:
    """One hostile request on a connection of its own: (status, seconds to the whole answer, answer body).

    The body is sent from a thread while this one reads, because a server that refuses a body by its
    Content-Length answers and closes before reading it: the answer counts, the broken pipe does not. Status 0
    is no answer at all (a worker that died or a connection that timed out)."""
    head = [
        f"{hostile.method} {hostile.path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {token}",
        "Connection: close",
    ]
    if hostile.method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(hostile.body)}"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + hostile.body
    received = bytearray()
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=HOSTILE_TIMEOUT_S) as sock:

        def send() -> None:
            try:
                sock.sendall(request)
            except OSError:
                pass  # closed by the server before it read everything

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except OSError:  # a reset after the answer (the unread rest of the body), or the timeout
            pass
        elapsed = time.perf_counter() - began
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sender.join(timeout=5)
    head_bytes, _, body = bytes(received).partition(b"\r\n\r\n")
    status_line = head_bytes.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    return status, elapsed, body


def _workers(master: int) -> set[int]:
    """The PIDs of the gunicorn master's children, read from /proc."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == master:  # after the name: state, then the parent's PID
            pids.add(int(entry.name))
    return pids


def _explain(body: bytes) -> str:
    try:
        error = json.loads(body)["error"]
        fields = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in error.get("fields", {}).items())
        return f"{error['code']}: {fields or error['message']}"[:120]
    except (ValueError, KeyError, TypeError):
        return repr(body[:110])


def _hostile_token() -> str:
    """A second token of the benchmark buyer: searches and orders, its own throttle buckets."""
    from django.contrib.auth import get_user_model

    from marketplace.api.tokens import api_token_create
    from marketplace.models import Organization, OrganizationKind

    user = get_user_model().objects.get(username="bench-buyer")
    org = Organization.objects.get(name="Bench Buyer", kind=OrganizationKind.BUYER)
    return api_token_create(
        organization=org, user=user, name="bench hostile", scopes=["offers:read", "orders:place"]
    ).raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offers", type=int, default=3_000)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_hostile")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="honest requests in flight")
    parser.add_argument("--attackers", type=int, default=1, help="threads sending hostile requests")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round and phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slow", type=float, default=2.0, help="seconds beyond which a hostile answer fails")
    args = parser.parse_args()

    django_on(args.database)
    rows = _seed(args.offers)
    honest_token = _token()
    hostile_token = _hostile_token()
    hostiles = _hostiles()

    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "DJANGO_DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "BROKER_SSL_REDIRECT": "0",
        "BROKER_PUBLIC_URL": "https://broker.example",
        # The throttle runs as in production, counting every request, but lets every one reach the parsers.
        "BROKER_API_RATE_READ": "10000000/min",
        "BROKER_API_RATE_WRITE": "10000000/min",
    }
    if _redis_answers():
        env["REDIS_URL"] = "redis://127.0.0.1:6379/4"
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("gunicorn")), "broker.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(args.workers), "--log-level", "warning"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log: list[str] = []

    def drain() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            log.append(line.rstrip())

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()

    baseline = Target("baseline", OFFERS, {"Authorization": f"Bearer {honest_token}"})
    attacked = Target("under attack", OFFERS, baseline.headers)
    answers: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(port, "/api/v1/ledger/key", {})[0] == 200 and len(_workers(server.pid)) >= args.workers:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gunicorn did not start:\n" + "\n".join(log[-20:]))
            time.sleep(0.2)
        before = _workers(server.pid)

        print("each hostile request once:")
        for hostile in hostiles:
            status, latency, body = _hostile_send(port, hostile, hostile_token)
            answers.append((hostile.name, status, latency))
            print(f"  {hostile.name:22} {status:3} {latency * 1000:8.1f} ms  {_explain(body)}", flush=True)

        _load(port, Target("warm", OFFERS, baseline.headers), concurrency=args.concurrency, seconds=1.0)

        def attack(offset: int, stop: threading.Event) -> None:
            i = offset
            while not stop.is_set():
                hostile = hostiles[i % len(hostiles)]
                i += 1
                status, latency, _ = _hostile_send(port, hostile, hostile_token)
                with lock:
                    answers.append((hostile.name, status, latency))

        for _ in range(args.rounds):
            _load(port, baseline, concurrency=args.concurrency, seconds=args.seconds)
            stop = threading.Event()
            attackers = [threading.Thread(target=attack, args=(n, stop)) for n in range(args.attackers)]
            for thread in attackers:
                thread.start()
            _load(port, attacked, concurrency=args.concurrency, seconds=args.seconds)
            stop.set()
            for thread in attackers:
                thread.join()
        time.sleep(1.0)  # time for the arbiter to reap and replace a worker that died last
        after = _workers(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=20)
        drainer.join(timeout=5)

    if not (baseline.latencies and attacked.latencies):
        print("FAIL: no honest search was answered in a phase")
        return 1
    print(f"\n{rows:,} offers on PostgreSQL; gunicorn {args.workers} workers; {args.concurrency} honest requests in "
          f"flight and {args.attackers} attacker(s) from this process; {args.rounds} rounds x {args.seconds:g} s "
          f"per phase, alternating; {len(SEARCHES)} searches")  # fmt: skip
    print(f"{'honest':14} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} {'req/s':>8}")
    for t in (baseline, attacked):
        rate = len(t.latencies) / t.seconds
        print(f"{t.name:14} {len(t.latencies):9} {t.errors:7} {_ms(t.latencies, 50):8.1f} {_ms(t.latencies, 95):8.1f} "
              f"{rate:8.1f}")  # fmt: skip
    ratio_p50 = _ms(attacked.latencies, 50) / _ms(baseline.latencies, 50)
    ratio_p95 = _ms(attacked.latencies, 95) / _ms(baseline.latencies, 95)
    ratio_rate = (len(attacked.latencies) / attacked.seconds) / (len(baseline.latencies) / baseline.seconds)
    print(f"under attack / baseline: p50 {ratio_p50:.2f}x, p95 {ratio_p95:.2f}x, throughput {ratio_rate:.2f}x")

    print(f"\n{'hostile':22} {'requests':>9} {'statuses':>16} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    groups = {h.name: [a for a in answers if a[0] == h.name] for h in hostiles}
    groups["all"] = answers
    for name, group in groups.items():
        counts: dict[int, int] = {}
        for _, status, _ in group:
            counts[status] = counts.get(status, 0) + 1
        statuses = " ".join(f"{s}x{n}" for s, n in sorted(counts.items()))
        latencies = [latency for _, _, latency in group]
        p50, p95 = _ms(latencies, 50, "inclusive"), _ms(latencies, 95, "inclusive")
        print(f"{name:22} {len(group):9} {statuses:>16} {p50:8.1f} {p95:8.1f} "
              f"{max(latencies) * 1000:8.1f}")  # fmt: skip

    deaths = [line for line in log if any(mark in line for mark in DEATHS)]
    lost = sorted(before - after)
    print(f"\ngunicorn workers before {sorted(before)}, after {sorted(after)}: "
          f"{f'{len(lost)} lost {lost}' if lost else 'none lost'}; "
          f"{len(deaths)} line(s) logged about a worker's death or timeout")  # fmt: skip
    for line in deaths[:10]:
        print(f"  {line}")

    problems = []
    if lost or deaths:
        problems.append("a worker was lost")
    wrong = [a for a in answers if a[1] not in REFUSED]
    if wrong:
        problems.append(f"{len(wrong)} hostile request(s) not refused with 400/413 (e.g. {wrong[0][0]}: {wrong[0][1]})")
    slow = [a for a in answers if a[2] > args.slow]
    if slow:
        problems.append(
            f"{len(slow)} hostile request(s) took over {args.slow:g} s (the slowest {max(a[2] for a in slow):.1f} s)"
        )
    if baseline.errors or attacked.errors:
        problems.append(f"{baseline.errors + attacked.errors} honest search(es) failed")
    hostile_p95 = _ms([a[2] for a in answers], 95, "inclusive")
    print(
        f"goal honest p95 under attack within 2x of the baseline: {'met' if ratio_p95 <= 2 else 'NOT met'} "
        f"({ratio_p95:.2f}x); no worker lost: {'met' if not (lost or deaths) else 'NOT met'}; hostile requests "
        f"refused in well under a second: {'met' if not wrong and hostile_p95 < 1000 else 'NOT met'} "
        f"(p95 {hostile_p95:.1f} ms)"
    )
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
