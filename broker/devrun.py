"""The run command: the whole broker on embedded defaults, in the foreground, until Ctrl-C.

Starts the sandbox clouds and the anchor chain's node while it migrates (three independent steps, in parallel;
migrating is skipped when no migration changed since the last run against the same database), then seeds the
demo accounts and syncs offers while the web app and the ledger sequencer import, and runs one real Celery worker
that consumes every queue, with beat inside it (``demo_worker_command``), on the filesystem broker. Production
keeps a pool per queue (``worker_commands``, docs/DEPLOY.md). If any part dies, everything stops. The banner says
how long start-up took, from ``bin/run``'s start (``BROKER_RUN_STARTED``) when it set one, install included.

The ledger's anchors go through JSON-RPC to ``ledger.chainnode``, a local chain in its own process that keeps its
blocks in ``var/chain`` across restarts (``chain_node_command``), so an auditor checks them from outside exactly
as against a public chain. The broker signs them with a dev key made once in ``var/chain-anchor.key``. Set
``LEDGER_CHAIN_RPC_URL`` to anchor to another chain instead; no node is started then.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.devsteps import THEN
from broker.queues import DEFAULT_QUEUE, LEDGER_QUEUE, PROVISIONING_QUEUE, QUEUES, SYNC_QUEUE, WEBHOOK_QUEUE
from marketplace.demo import DEMO_BUYER, DEMO_CLUSTER_ADMIN, DEMO_PASSWORD, DEMO_PROVIDER_ADMIN, DEMO_STAFF
from providers.manifest import manifest_service_url

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


# An account that cannot be reached at start-up must not stop the broker: its failure is printed and shown on the
# account (the portal, the admin, /metrics), and the other accounts' offers go on sale.
OFFERS_SYNC = ("offers", "sync", "--keep-going")


def _wait_http(url: str, what: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - a fixed 127.0.0.1 URL
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"{what} did not answer at {url} within {timeout:.0f}s")


def _post_json(url: str, body: dict[str, str]) -> None:
    request = urllib.request.Request(  # noqa: S310 - a 127.0.0.1 sandbox URL from its own manifest
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10):  # noqa: S310
        pass


def _wait_file(path: Path, what: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode} while starting")
        if path.exists():
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not write {path} within {timeout:.0f}s")


def chain_key(path: Path) -> tuple[str, str]:
    """The anchor key in ``path`` (made on first use, readable by its owner only) and its address."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write("0x" + secrets.token_hex(32) + "\n")
    from ledger.chain import Web3  # web3 only through ledger.chain, which keeps the recursion limit

    key = path.read_text().strip()
    return key, str(Web3().eth.account.from_key(key).address)


def chain_address(key_file: Path) -> str:
    """The address of the anchor key in ``key_file`` (made on first use), derived in a child process and kept
    beside the key (``.address``, with a digest of the key it belongs to): web3 takes seconds and 40 MB to
    import, and the run command would hold those for as long as it runs."""
    cache = key_file.with_suffix(".address")
    if key_file.exists():
        digest = hashlib.sha256(key_file.read_bytes()).hexdigest()[:16]
        if cache.exists():
            kept_digest, _, address = cache.read_text().strip().partition(" ")
            if kept_digest == digest and address:
                return address
    script = "import sys, pathlib, broker.devrun as d; print(d.chain_key(pathlib.Path(sys.argv[1]))[1])"
    derive = [PY, "-c", script, str(key_file)]
    address = subprocess.run(derive, cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()  # noqa: S603
    cache.write_text(f"{hashlib.sha256(key_file.read_bytes()).hexdigest()[:16]} {address}\n")
    return address


def chain_node_command(*, data: Path, port: int, fund: str, ready_file: Path) -> list[str]:
    """The anchor chain's node: its blocks in ``data``, ``fund`` (the broker's anchor address) funded in its
    genesis, ``ready_file`` written once it serves."""
    return [PY, "-m", "ledger.chainnode", "--host", "127.0.0.1", "--port", str(port), "--data", str(data),
            "--fund", fund, "--ready-file", str(ready_file)]  # fmt: skip


def worker_commands(*options: str, concurrency: int = 2) -> dict[str, list[str]]:
    """The Celery workers the broker needs, by name: a pool per queue (broker/queues.py), so a flood on one
    (thousands of offer syncs, slow webhook receivers, a slow chain) never takes a slot a buyer's launch needs;
    the prefork pool (the default) enforces the tasks' time limits. ``options`` are added to each command
    (tests pass ``--pool solo``)."""
    base = [PY, "-m", "celery", "-A", "broker", "worker", "--loglevel", "WARNING"]
    pools = {
        "worker": (DEFAULT_QUEUE, "default", concurrency),
        "provisioning-worker": (PROVISIONING_QUEUE, "provisioning", concurrency),
        "sync-worker": (SYNC_QUEUE, "sync", concurrency),
        "ledger-worker": (LEDGER_QUEUE, "ledger", 1),
        "webhook-worker": (WEBHOOK_QUEUE, "webhooks", concurrency),
    }
    return {
        name: [*base, "--concurrency", str(size), "--queues", queue, "--hostname", f"{host}@%h", *options]
        for name, (queue, host, size) in pools.items()
    }


def demo_worker_command(*options: str, concurrency: int = 1) -> list[str]:
    """The run command's one Celery worker: every queue (broker/queues.py) in one prefork pool, which still
    enforces the tasks' time limits, and beat embedded (``--beat``). A demo needs no isolation between queues;
    five pools with a parent each held over 2 GB, and a pool process grows to about 500 MB once it has used every
    cloud's SDK, so the demo keeps one. Production runs ``worker_commands`` instead."""
    return [PY, "-m", "celery", "-A", "broker", "worker", "--loglevel", "WARNING", "--concurrency", str(concurrency),
            "--queues", ",".join(QUEUES), "--hostname", "demo@%h", "--beat", *options]  # fmt: skip


def _manage(*commands: tuple[str, ...], not_before: float | None = None) -> str:
    """Runs management ``commands`` in order in one process (broker.devsteps): one Django start-up for all.
    Their output is printed as it would have been, and returned."""
    argv = [PY, "-m", "broker.devsteps"]
    if not_before is not None:
        argv += ["--not-before", f"{not_before:.3f}"]
    for index, command in enumerate(commands):
        argv += [THEN, *command] if index else list(command)
    done = subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)  # noqa: S603
    print(done.stdout, end="", flush=True)
    return done.stdout


def community_sync(seed_output: str) -> tuple[str, ...]:
    """The offer sync of the independent hosts' account alone, its id read from the seed's JSON line: the clouds'
    accounts were synced with the seed, and only the hosts' machines appear after it. Every account when the
    seed did not name one."""
    for line in seed_output.splitlines():
        if line.startswith("{"):
            try:
                account = json.loads(line).get("accounts", {}).get("community")
            except ValueError:
                continue
            if isinstance(account, int):
                return (*OFFERS_SYNC, "--account", str(account))
    return OFFERS_SYNC


def migrations_fingerprint(root: Path, database_url: str) -> str:
    """What decides whether ``migrate`` has anything to do: every migration file's name and content, and the
    database they were applied to."""
    digest = hashlib.sha256(database_url.encode())
    for package in ("broker", "marketplace", "providers", "ledger", "untrusted", "sandboxes"):
        for path in sorted((root / package).rglob("migrations/*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def migrate_if_changed(root: Path) -> bool:
    """Migrates the embedded SQLite database unless its file is there and the migrations are those of the last
    successful migrate (recorded in ``var/migrated``). A database named by ``DATABASE_URL`` may have been
    dropped and made again behind the stamp's back: it is always migrated. True when it ran ``migrate``."""
    var = Path(os.environ.get("BROKER_VAR_DIR") or root / "var").resolve()
    sqlite = var / "broker.sqlite3"  # where settings put the database without DATABASE_URL
    stamp = var / "migrated"
    fingerprint = migrations_fingerprint(root, str(sqlite))
    embedded = not os.environ.get("DATABASE_URL")
    if embedded and sqlite.exists() and stamp.exists() and stamp.read_text().strip() == fingerprint:
        return False
    _manage(("migrate", "--verbosity", "0"))
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint + "\n")
    return True


def containers_ready() -> str:
    """Real lease containers for the sandboxes' machines and hosts: ``bin/containers`` starts dockerd where it
    can and builds the lease image (a minute, the first time). "" when ready, else why not
    (``BROKER_LEASE_CONTAINERS=0`` turns them off)."""
    if os.environ.get("BROKER_LEASE_CONTAINERS", "1") == "0":
        return "turned off (BROKER_LEASE_CONTAINERS=0)"
    try:
        done = subprocess.run([str(ROOT / "bin" / "containers")], capture_output=True, text=True, timeout=900)  # noqa: S603
    except subprocess.TimeoutExpired:
        return "bin/containers took longer than 15 minutes"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["bin/containers failed"])[-1]
    return ""


def machines_line(why_not: str) -> str:
    """The banner's line on what a rented machine is here."""
    if not why_not:
        return "  Machines are real containers (Docker): broker ssh ORDER gives a real shell in one.\n"
    return f"  Machines are simulated (SSH answers only its greeting): no lease containers, {why_not}.\n"


def banner(
    port: int,
    sandbox_url: str,
    chain_line: str,
    stripe_url: str | None = None,
    machines: str = "",
    started_in: float | None = None,
) -> str:
    """What the run command prints last, once everything is up: where the broker is, who to sign in as and, given
    ``started_in`` (seconds), how long start-up took."""
    url = f"http://127.0.0.1:{port}/"
    rule = "=" * 78
    logins = [
        (DEMO_BUYER, "buyer ($500 credit): find GPUs, order, top up", url),
        (DEMO_PROVIDER_ADMIN, "provider (cloud reseller): accounts, earnings", f"{url}provider/"),
        ("helga", "provider (three independent machines)", f"{url}provider/"),
        (DEMO_CLUSTER_ADMIN, "provider (a Kubernetes GPU cluster)", f"{url}provider/"),
        (DEMO_STAFF, "marketplace staff: verify providers, machines", f"{url}admin/"),
    ]
    people = "".join(f"    {name:<6} {what:<48} {where}\n" for name, what, where in logins)
    return (
        f"\n{rule}\n"
        f"  The broker is running at {url}"
        + (f" (started in {started_in:.1f} s)" if started_in is not None else "")
        + "\n\n"
        f"  Sign in with password {DEMO_PASSWORD} as:\n{people}\n"
        f"  API: {url}api/v1/offers (docs {url}api/v1/docs)\n"
        f"  Sandbox clouds from {sandbox_url} (see var/sandbox.json).\n"
        + (
            f"  Payments go to the Stripe sandbox at {stripe_url}: pay with its test cards at {url}billing/\n"
            f"  Stripe is reconciled against the book hourly; staff see mismatches at\n"
            f"  {url}admin/marketplace/reconciliationmismatch/\n"
            if stripe_url
            else ""
        )
        + f"{chain_line}{machines}"
        f"  Press Ctrl-C to stop everything.\n{rule}\n"
    )


def run_started(environ: Mapping[str, str], now: float) -> float:
    """When the run began: ``BROKER_RUN_STARTED`` (epoch seconds, set by ``bin/run`` before it installs), else
    ``now``. A value that is not a time in the past is ignored."""
    try:
        started = float(environ.get("BROKER_RUN_STARTED", ""))
    except ValueError:
        return now
    return started if 0 < started <= now else now


def main() -> int:
    started = run_started(os.environ, time.time())
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("BROKER_PORT", "8000")))
    parser.add_argument("--sandbox-port", type=int, default=int(os.environ.get("BROKER_SANDBOX_PORT", "8701")))
    parser.add_argument("--chain-port", type=int, default=int(os.environ.get("BROKER_CHAIN_PORT", "8545")))
    parser.add_argument("--timings", action="store_true", help="print how long each start-up step took")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    os.environ.setdefault("BROKER_LOG_LEVEL", "WARNING")
    # Only failed requests are logged (4xx, 5xx): a line per agent heartbeat would scroll the banner away.
    os.environ.setdefault("BROKER_REQUEST_LOG_LEVEL", "WARNING")
    # The web app's public URL (what a rented machine's lease agent phones home to) follows --port.
    os.environ["BROKER_PORT"] = str(args.port)
    children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def step_done(name: str, since: float) -> None:
        if args.timings:
            print(f"[start-up] {name}: {time.monotonic() - since:.1f} s", file=sys.stderr, flush=True)

    def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        # Own process group, so Ctrl-C reaches us once and we stop each part in order.
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # noqa: S603
        children.append((name, proc))
        return proc

    def stop_all() -> None:
        for _name, proc in reversed(children):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _name, proc in reversed(children):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    sandbox_url = f"http://127.0.0.1:{args.sandbox_port}"
    manifest = ROOT / "var" / "sandbox.json"

    def sandbox_up() -> str:
        """The sandbox clouds, serving (their manifest written); why lease containers are off, or ""."""
        since = time.monotonic()
        manifest.unlink(missing_ok=True)
        no_containers = containers_ready()
        walls = [] if no_containers else ["--containers"]
        sandbox = start(
            "sandbox",
            [PY, "-m", "sandboxes", "serve", "--host", "127.0.0.1", "--port", str(args.sandbox_port),
             "--manifest", str(manifest), *walls],
        )  # fmt: skip
        _wait_file(manifest, "the sandbox", sandbox)
        step_done("sandbox clouds", since)
        return no_containers

    def chain_up() -> tuple[dict[str, str], str]:
        """The anchor chain's node, serving: the settings that point every later process at it, and the banner's
        line about it."""
        if os.environ.get("LEDGER_CHAIN_RPC_URL"):
            return {}, f"  Anchors go to {os.environ['LEDGER_CHAIN_RPC_URL']} (LEDGER_CHAIN_RPC_URL).\n"
        since = time.monotonic()
        key_file = ROOT / "var" / "chain-anchor.key"
        address = chain_address(key_file)
        ready = ROOT / "var" / "chain-node.json"
        ready.unlink(missing_ok=True)
        node = start(
            "chain",
            chain_node_command(data=ROOT / "var" / "chain", port=args.chain_port, fund=address, ready_file=ready),
        )
        _wait_file(ready, "the chain node", node, timeout=600)  # it replays its blocks first, ~10 ms each
        rpc_url = json.loads(ready.read_text())["url"]
        step_done("chain node", since)
        line = (
            f"  Ledger anchors go to the local chain at {rpc_url} (blocks in var/chain, sender {address}).\n"
            f"  Audit from outside: python -m ledger.audit --url http://127.0.0.1:{args.port} --rpc-url {rpc_url}"
            " --state var/audit-state.json\n"
        )
        return {"LEDGER_CHAIN_RPC_URL": rpc_url, "LEDGER_CHAIN_PRIVATE_KEY_FILE": str(key_file)}, line

    def migrated() -> None:
        since = time.monotonic()
        ran = migrate_if_changed(ROOT)
        step_done("migrate" if ran else "migrate (nothing changed: skipped)", since)

    if args.timings:
        print(f"[start-up] bin/bootstrap and Python: {time.time() - started:.1f} s", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Three independent steps at once: the sandbox and the chain node mostly wait for their own processes, and
    # migrate touches only the database. Nothing else reads os.environ's changes before all three are done.
    parallel = ThreadPoolExecutor(max_workers=3, thread_name_prefix="start-up")
    try:
        sandbox_step = parallel.submit(sandbox_up)
        chain_step = parallel.submit(chain_up)
        migrate_step = parallel.submit(migrated)
        migrate_step.result()
        no_containers = sandbox_step.result()
        chain_env, chain_line = chain_step.result()
        # Every process started from here on (seed, sequencer, worker, web) anchors through the node.
        os.environ.update(chain_env)
        walls = [] if no_containers else ["--containers"]
        # Payments go to the Stripe sandbox served with the clouds, unless pointed elsewhere (real keys).
        stripe_url = manifest_service_url(manifest, "stripe")
        if stripe_url and "STRIPE_API_BASE" not in os.environ:
            os.environ["STRIPE_API_BASE"] = stripe_url
            os.environ.setdefault("STRIPE_API_KEY", "sk_test_sandbox")
            os.environ.setdefault("STRIPE_WEBHOOK_SECRET", "whsec_sandbox")
        # Chains ledger entries as their changes commit (ledger.services.ledger_sequence_follow).
        start("sequencer", [PY, "manage.py", "ledger", "sequence", "--follow"])
        web = start("web", [PY, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload"])
        since = time.monotonic()
        hosts = ROOT / "var" / "community-hosts.json"
        # The sandbox is new each run (new credentials, new hosts' secrets): the seed updates the demo accounts
        # to match and adds only what is missing; the database itself is the last run's.
        seeded = _manage(
            ("demo", "seed", "--sandbox-manifest", str(manifest), "--community-hosts", str(hosts)), OFFERS_SYNC
        )
        step_done("demo seed and offer sync", since)
        # As before, the worker (and beat in it) starts once the demo's accounts match the new sandbox.
        start("worker", demo_worker_command())
        since = time.monotonic()
        _wait_http(f"http://127.0.0.1:{args.port}/login/", "the web app", web)
        step_done("web app answering", since)
        if stripe_url and os.environ.get("STRIPE_API_BASE") == stripe_url:
            # The sandbox POSTs its signed events to the broker's webhook as they happen, as Stripe does.
            _post_json(
                f"{stripe_url}/_sandbox/stripe/webhook_endpoint",
                {
                    "url": f"http://127.0.0.1:{args.port}/api/v1/stripe/webhook",
                    "secret": os.environ["STRIPE_WEBHOOK_SECRET"],
                    "deliver": "auto",
                },
            )
        # Independent providers' machines: simulated hosts whose agents register with the broker just started.
        start("hosts", [PY, "-m", "sandboxes.community.hosts", "--broker", f"http://127.0.0.1:{args.port}",
                        "--hosts", str(hosts), *walls])  # fmt: skip
        since = time.monotonic()
        paying = stripe_url if os.environ.get("STRIPE_API_BASE") == stripe_url else None
        # The agents get 3 s to register before their machines' offers are synced; the step imports Django
        # meanwhile. The demo's payments are reconciled against the book once now; beat repeats it hourly.
        _manage(community_sync(seeded), *([("reconcile",)] if paying else []), not_before=time.time() + 3)
        step_done("hosts' offers synced" + (", payments reconciled" if paying else ""), since)
        print(
            banner(args.port, sandbox_url, chain_line, paying, machines_line(no_containers), time.time() - started),
            flush=True,
        )
        while True:
            for name, proc in children:
                if proc.poll() is not None:
                    print(f"{name} exited with code {proc.returncode}; stopping the broker", file=sys.stderr)
                    return 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping...", file=sys.stderr)
        return 0
    except subprocess.CalledProcessError as exc:
        if exc.stdout:
            print(exc.stdout, end="", flush=True)  # what the failed step said before it failed
        print(f"start-up step failed: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr)
        return 1
    finally:
        # A start-up step still waiting sees its process stopped below and ends; none is started after this.
        parallel.shutdown(wait=False, cancel_futures=True)
        stop_all()


if __name__ == "__main__":
    raise SystemExit(main())
