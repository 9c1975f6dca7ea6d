"""Benchmark: the broker scaled out on loopback, one of each process type against two of each (issue 23, point 6).

    .venv/bin/python bench/scale.py [--accounts 2000] [--offers 1000000] [--orders 60] [--seconds 20]
        [--database postgres://postgres@127.0.0.1:5432/broker_bench_scale]
        [--amqp amqp://guest:guest@127.0.0.1:5672/bench_scale] [--redis redis://127.0.0.1:6379/7]

One PostgreSQL, one RabbitMQ (its own vhost: ``rabbitmqctl add_vhost bench_scale`` and ``set_permissions``) and
one Redis; the sandbox clouds in a process of their own. It fills its database once (reused while the counts
match) with ``--accounts`` seller accounts on the five sandbox clouds and their offers: every cloud's catalogue
ingested by the broker for one account, then copied to the others at varied markups by SQL, up to
``--offers`` rows (a copy of what thousands of syncs would write, without waiting for them).

Then, for 1 and for 2 of each (gunicorn web node of 2 workers, Celery worker pool over every queue, beat,
ledger sequencer), all started as the deployment guide says, it puts a bounded burst on the web nodes from
this process: ``--orders`` orders placed at once (each with an idempotency key; a few sent twice, as a
retrying client would) while searches run for ``--seconds``, round-robin over the web nodes. It waits until
every order is running (or failed, with its reason), then checks and prints:

- no lost order: every order the API accepted is running or failed, none stuck placed or provisioning;
- no double launch: no order has two active instances, and the retried requests made no second order;
- no duplicate periodic run: no job ran twice at once or twice in one interval (``PeriodicRun``);
- the ledger gapless and whole (``ledger_verify``) once the sequencers are done;
- searches per second, their p95, orders placed per second, the p95 of placing one and of order to running,
  and the ratios of two of each to one of each, measured in the same run.

Offer syncs run on the beat's schedule like any other job, but at ``BROKER_OFFER_SYNC_INTERVAL_S`` 3600: a
round over thousands of accounts would take the two cores from the load being measured (bench/sync.py
measures syncs). Each order installs the buyer's SSH key; the sandbox (its own process, as a cloud is) boots its
machine's lease agent, which phones home over http to the first web node and reports ready, and only then is
the order running. Plain http needs ``DJANGO_DEBUG`` on (production settings require an https public URL); both
rounds run so.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from api import SEARCHES, _free_port, _get, _path  # noqa: E402
from sync import django_on, sandboxes_serving  # noqa: E402

PY = sys.executable
FINAL_OR_RUNNING = {"running", "failed", "terminated", "cancelled"}


def _fill(accounts: int, offers: int) -> tuple[int, int]:
    """Seller accounts and offers, written once; (accounts, offers) in the database."""
    from django.db import connection
    from django.utils import timezone

    from marketplace.catalog.services import offers_ingest
    from marketplace.models import Offer
    from providers.models import Provider, ProviderAccount
    from providers.services import adapter_for_account

    have_accounts = ProviderAccount.objects.filter(provider__name__startswith="scale seller").count()
    if have_accounts >= accounts and Offer.objects.count() >= offers:
        Offer.objects.update(last_seen_at=timezone.now())
        return have_accounts, Offer.objects.count()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE marketplace_offer, providers_provideraccount, providers_provider CASCADE")
    kinds = ("aws", "azure", "gcp", "alibaba", "tencent")
    templates: dict[str, ProviderAccount] = {}
    with sandboxes_serving("bench-scale-seed.json") as specs:
        for spec in specs:
            if spec.kind not in kinds:
                continue
            provider = Provider.objects.create(name=f"scale seller {spec.kind}-0")
            account = ProviderAccount(
                provider=provider,
                kind=spec.kind,
                name=f"{spec.kind}-0",
                endpoint_url=spec.endpoint_url,
                regions=spec.all_regions,
                options=spec.options,
            )
            account.set_credentials(spec.credentials)
            account.save()
            offers_ingest(account=account, quotes=adapter_for_account(account).list_offers(), now=timezone.now())
            templates[spec.kind] = account
    per_round = Offer.objects.count()  # one account of each cloud
    rounds = max(-(-accounts // len(templates)), -(-offers // per_round))
    print(f"seeding {rounds} sellers x {len(templates)} clouds ({per_round} offers per seller)", flush=True)
    started = time.perf_counter()
    for n in range(1, rounds):
        provider = Provider.objects.create(name=f"scale seller {n}")
        ProviderAccount.objects.bulk_create(
            ProviderAccount(provider=provider, kind=t.kind, name=f"{t.kind}-{n}", endpoint_url=t.endpoint_url,
                            regions=t.regions, options=t.options, credentials_encrypted=t.credentials_encrypted)
            for t in templates.values()
        )  # fmt: skip
    columns = [f.column for f in Offer._meta.concrete_fields if f.column not in ("id", "account_id")]
    priced = {"price", "price_usd", "price_per_gpu_usd", "usd_per_tflop_hour"}
    select = ", ".join(f"o.{c} * m.markup" if c in priced else f"o.{c}" for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO marketplace_offer ({', '.join(columns)}, account_id) "  # noqa: S608 - our own columns
            f"SELECT {select}, a.id FROM marketplace_offer o "
            "JOIN providers_provideraccount t ON t.id = o.account_id "
            "JOIN providers_provideraccount a ON a.kind = t.kind AND a.id <> t.id "
            "CROSS JOIN LATERAL (SELECT (0.85 + mod(a.id * 37, 60) / 100.0)::numeric AS markup) m "
            "WHERE t.id = ANY(%s)",
            [[t.pk for t in templates.values()]],
        )
        cursor.execute("ANALYZE")
    total = Offer.objects.count()
    print(f"seeded {ProviderAccount.objects.count()} accounts, {total} offers in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return ProviderAccount.objects.count(), total


def _buyer_token() -> str:
    from django.contrib.auth import get_user_model

    from marketplace.api.tokens import api_token_create
    from marketplace.models import Membership, Organization, OrganizationKind, Role

    user, _ = get_user_model().objects.get_or_create(username="scale-buyer")
    org, _ = Organization.objects.get_or_create(
        name="Scale Buyer", kind=OrganizationKind.BUYER, defaults={"payment_terms": "invoiced"}
    )
    Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Role.OWNER})
    if not org.ssh_keys.exists():  # orders install the organisation's key (a machine without one is of no use)
        from boot import _public_key

        from marketplace.launch.keys import ssh_key_add

        ssh_key_add(organization=org, user=user, public_key=_public_key())
    scopes = ["offers:read", "orders:place", "instances:manage", "ledger:read"]
    return api_token_create(organization=org, user=user, name=f"scale-{uuid.uuid4().hex[:6]}", scopes=scopes).raw


class Cluster:
    """``size`` of each process type, started as docs/DEPLOY.md says; stopped (SIGTERM, then SIGKILL) at exit."""

    def __init__(self, size: int, env: dict[str, str]) -> None:
        self.size, self.env = size, env
        self.ports = [_free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, cmd: list[str]) -> None:
        log = open(Path(self.env["BROKER_VAR_DIR"]) / f"proc-{len(self.procs)}.log", "wb")
        self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))  # fmt: skip

    def __enter__(self) -> Cluster:
        # The machines' agents phone home to the first web node (a load balancer's address in production).
        self.env = {**self.env, "BROKER_PUBLIC_URL": f"http://127.0.0.1:{self.ports[0]}"}
        queues = "provisioning,celery,ledger,webhooks,sync"
        for n in range(self.size):
            self._start([PY, "-m", "gunicorn", "broker.wsgi:application", "--bind", f"127.0.0.1:{self.ports[n]}",
                         "--workers", "2", "--log-level", "warning"])  # fmt: skip
            self._start([PY, "-m", "celery", "-A", "broker", "worker", "-Q", queues, "--hostname", f"pool{n}@%h",
                         "--concurrency", "2", "--loglevel", "WARNING"])  # fmt: skip
            self._start([PY, "-m", "celery", "-A", "broker", "beat", "--loglevel", "WARNING", "--schedule",
                         str(Path(self.env["BROKER_VAR_DIR"]) / f"beat-{self.size}-{n}")])  # fmt: skip
            self._start([PY, "manage.py", "ledger", "sequence", "--follow"])
        deadline = time.monotonic() + 120
        try:
            for port in self.ports:
                while not _answers(port):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"web node on {port} did not answer; see {self.env['BROKER_VAR_DIR']}")
                    time.sleep(0.2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    try:
        return _get(port, "/healthz", {})[0] == 200
    except OSError:
        return False


def _request(port: int, method: str, path: str, token: str, body: Any = None, key: str = "") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    return answer.status, json.loads(data) if data else None


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] * 1000 if len(values) >= 2 else float("nan")


def _round(size: int, env: dict[str, str], token: str, offer_ids: list[int], orders: int, seconds: float) -> dict:
    from django.db.models import Count

    from ledger.services import ledger_queued, ledger_verify
    from marketplace.models import Instance, Order, PeriodicRun

    runs_before = dict(PeriodicRun.objects.values_list("name", "runs"))
    round_began = time.perf_counter()
    with Cluster(size, env) as cluster:
        ports = cluster.ports
        search_ms: list[float] = []
        stop = threading.Event()

        auth = {"Authorization": f"Bearer {token}"}

        def searcher(n: int) -> None:
            i = n
            while not stop.is_set():
                search, sort = SEARCHES[i % len(SEARCHES)]
                started = time.perf_counter()
                status, _ = _get(ports[i % len(ports)], _path("/api/v1/offers", search, sort), auth)
                if status == 200:
                    search_ms.append(time.perf_counter() - started)
                i += 1

        place_s: list[float] = []
        placed: list[str] = []

        def place(n: int) -> None:
            key = f"scale-{size}-{n}-{uuid.uuid4().hex[:8]}"
            body = {"offer": offer_ids[n % len(offer_ids)], "max_price_per_hour": "10000", "allow_failover": True}
            started = time.perf_counter()
            status, answer = _request(ports[n % len(ports)], "POST", "/api/v1/orders", token, body, key)
            place_s.append(time.perf_counter() - started)
            if status in (200, 201):
                placed.append(answer["id"])
                if n % 10 == 0:  # a client that lost the answer sends it again, to the other node
                    again = _request(ports[(n + 1) % len(ports)], "POST", "/api/v1/orders", token, body, key)
                    assert again[1]["id"] == answer["id"], "a retried order made a second order"
            else:
                print(f"  order {n}: {status} {answer}", flush=True)

        began = time.perf_counter()
        searchers = [threading.Thread(target=searcher, args=(n,)) for n in range(2 * size)]
        for thread in searchers:
            thread.start()
        with ThreadPoolExecutor(max_workers=orders) as pool:
            list(pool.map(place, range(orders)))
        placing = time.perf_counter() - began
        remaining = seconds - (time.perf_counter() - began)
        if remaining > 0:
            stop.wait(remaining)
        stop.set()
        for thread in searchers:
            thread.join()
        searching = time.perf_counter() - began
        deadline = time.monotonic() + 300
        while Order.objects.filter(public_id__in=placed).exclude(state__in=FINAL_OR_RUNNING).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        while ledger_queued()[0] and time.monotonic() < deadline:
            time.sleep(0.2)
    elapsed = time.perf_counter() - round_began
    mine = Order.objects.filter(public_id__in=placed)
    states = dict(mine.values_list("state").annotate(n=Count("pk")))
    stuck = mine.exclude(state__in=FINAL_OR_RUNNING).count()
    doubled = (
        Instance.objects.filter(order__in=mine, active=True).values("order").annotate(n=Count("pk")).filter(n__gt=1)
    ).count()
    to_running = [
        (o.state_changed_at - o.created_at).total_seconds() for o in mine.filter(state="running").only(
            "state_changed_at", "created_at")
    ]  # fmt: skip
    runs = {
        name: runs - runs_before.get(name, 0)
        for name, runs in PeriodicRun.objects.values_list("name", "runs")
        if runs - runs_before.get(name, 0)
    }
    # Two beats send each job twice per interval: the leases must still make one run per interval at most.
    from django.conf import settings

    intervals = {
        name: float(entry["schedule"])
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if isinstance(entry["schedule"], float | int)
    }
    too_many = {name: n for name, n in runs.items() if name in intervals and n > elapsed // intervals[name] + 1}
    verified = ledger_verify()
    result = {
        "size": size,
        "searches_per_s": len(search_ms) / searching,
        "search_p95_ms": _p95(search_ms),
        "orders_per_s": len(placed) / placing,
        "place_p95_ms": _p95(place_s),
        "to_running_p95_s": _p95(to_running) / 1000,
        "states": states,
        "stuck": stuck,
        "doubled": doubled,
        "runs": runs,
        "too_many_runs": too_many,
        "ledger_ok": verified.ok,
        "ledger_entries": verified.entries_checked,
    }
    print(
        f"{size} of each: {result['searches_per_s']:6.1f} searches/s (p95 {result['search_p95_ms']:.0f} ms), "
        f"{result['orders_per_s']:5.1f} orders/s placed (p95 {result['place_p95_ms']:.0f} ms), order to running "
        f"p95 {result['to_running_p95_s']:.1f} s; orders {states}; stuck {stuck}, double launches {doubled}; "
        f"periodic runs {runs} in {elapsed:.0f} s (more than one per interval: {too_many or 'none'}); "
        f"ledger {'gapless, verified' if verified.ok else 'BROKEN: ' + verified.problem} "
        f"({verified.entries_checked} entries)",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accounts", type=int, default=2000)
    parser.add_argument("--offers", type=int, default=1_000_000)
    parser.add_argument("--orders", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_scale")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/bench_scale")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7")
    args = parser.parse_args()

    var = Path("/tmp") / "broker-bench-scale"  # noqa: S108 - a scratch directory of this benchmark
    var.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "DATABASE_URL": args.database,
        "CELERY_BROKER_URL": args.amqp,
        "REDIS_URL": args.redis,
        # Debug on only because the machines' agents phone home over plain http on loopback, which production
        # settings refuse (BROKER_PUBLIC_URL must be https); both rounds run the same way.
        "DJANGO_DEBUG": "1",
        # Fixed: the seeded accounts' credentials are encrypted under it, and the database is reused.
        "SECRET_KEY": "bench-scale-only-" + "k" * 40,
        "BROKER_PUBLIC_URL": "http://127.0.0.1:8000",
        "BROKER_SSL_REDIRECT": "0",
        "BROKER_PROVIDER_ENDPOINTS": "public+loopback",  # the sandbox clouds listen on 127.0.0.1
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "BROKER_VAR_DIR": str(var),
        "BROKER_LOG_LEVEL": "WARNING",
        "BROKER_OFFER_SYNC_INTERVAL_S": "3600",
        "BROKER_PROVISION_POLL_INTERVAL_S": "0.5",
        "BROKER_API_RATE_READ": "10000000/min",
        "BROKER_API_RATE_WRITE": "10000000/min",
        "BROKER_API_RATE_EXPENSIVE": "10000000/min",
    }
    os.environ.update({k: env[k] for k in ("CELERY_BROKER_URL", "REDIS_URL", "BROKER_VAR_DIR")})
    django_on(args.database, **{k: env[k] for k in ("DJANGO_DEBUG", "SECRET_KEY", "BROKER_PUBLIC_URL",
                                                    "BROKER_PROVIDER_ENDPOINTS")})  # fmt: skip
    accounts, offers = _fill(args.accounts, args.offers)
    print(f"{accounts:,} seller accounts, {offers:,} offers", flush=True)

    from marketplace.models import Offer

    with sandboxes_serving("bench-scale-sandbox.json") as specs:
        endpoints = {spec.kind: spec.endpoint_url for spec in specs}
        from providers.models import ProviderAccount

        for kind, url in endpoints.items():  # the sandbox listens on new ports each start
            ProviderAccount.objects.filter(kind=kind).update(endpoint_url=url)
        # Cheap single whole-GPU AWS offers (the sandbox boots their agents), spread over sellers. Not the GPU
        # partitions (g6f): the sandbox's agent reports a partition's memory, which the broker's check refuses.
        offer_ids = list(
            Offer.objects.filter(
                status="available", gpu_count=1, gpu_memory_gb__gte=16, price_usd__lt=Decimal("3"), account__kind="aws"
            )
            .order_by("account_id", "price_usd")
            .values_list("pk", flat=True)[: args.orders]
        )
        token = _buyer_token()
        one = _round(1, env, token, offer_ids, args.orders, args.seconds)
        two = _round(2, env, token, offer_ids, args.orders, args.seconds)
    for key, label in (("searches_per_s", "searches/s"), ("orders_per_s", "orders placed/s"),
                       ("search_p95_ms", "search p95"), ("place_p95_ms", "placing p95"),
                       ("to_running_p95_s", "order-to-running p95")):  # fmt: skip
        ratio = two[key] / one[key] if one[key] else float("nan")
        print(f"{label}: two of each / one of each = {ratio:.2f}x")
    sound = all(r["stuck"] == 0 and r["doubled"] == 0 and r["ledger_ok"] and not r["too_many_runs"] for r in (one, two))
    print("no lost order, no double launch, no duplicate periodic run, ledger gapless: " + ("yes" if sound else "NO"))
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
