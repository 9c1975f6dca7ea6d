"""Benchmark: filtered, sorted offer search over the API on PostgreSQL, against a bare Django view of the same query.

    .venv/bin/python bench/api.py [--offers 100000] [--concurrency 2] [--seconds 5] [--rounds 3]

It creates (or reuses) its own database and fills it with ``--offers`` offers: the sandbox clouds' real
catalogues (as their adapters list them) resold by many sellers at varied markups, ingested by the broker's
own ingestion. It serves the broker in gunicorn with production settings (DEBUG off, Redis for the
throttle counters when it answers on 127.0.0.1:6379), and from this process, over loopback, keeps
``--concurrency`` requests in flight against

- ``GET /api/v1/offers`` with a scoped bearer token: authentication, scope check, throttling, the query
  language, cursor pagination, DRF serializers; and
- ``GET /bench/bare-offers``: a plain Django view running the same query (bench/api_urls.py),

alternating the two for ``--rounds`` rounds of ``--seconds`` each, over a mix of searches. It checks first that
both return the same offers in the same order. It reports p50/p95 latency and requests/s of each, and their
ratio.

Goals (issue 8): the API's p95 under 50 ms, and the API within 2x of the bare view.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sync import django_on, sandboxes_serving  # noqa: E402 - after the path is set

# The searches a procurement script would send: a plain listing, a model, a fleet, residency and spot, the
# computed sorts and a reliability floor.
SEARCHES = [
    ("", "price"),
    ("gpu=H100", "price"),
    ("gpu=A100,H100 count>=8", "gpuprice"),
    ("region=eu pricing=spot price<40", "price"),
    ("count>=4 reliability>0.9", "tflops"),
    ("provider=gcp mem>=40", "gpuprice"),
    ("gpu=T4 region=us pricing=on_demand", "price"),
    ("gpuprice<2 count>=2", "gpuprice"),
]
PAGE = 100


def _seed(target: int) -> int:
    """Fill the offer table to ``target`` rows from the sandboxes' catalogues; returns the row count."""
    from django.db import connection
    from django.utils import timezone

    from marketplace.catalog.services import offers_ingest
    from marketplace.models import Offer, PricePoint, QuarantinedOffer
    from providers.models import Provider, ProviderAccount
    from providers.services import adapter_for_account

    now = timezone.now()
    have = Offer.objects.count()
    if have >= target:
        Offer.objects.update(last_seen_at=now)  # fresh enough to be for sale
        return have
    PricePoint.objects.all().delete()
    Offer.objects.all().delete()
    QuarantinedOffer.objects.all().delete()
    ProviderAccount.objects.all().delete()
    Provider.objects.all().delete()
    catalogue = {}
    with sandboxes_serving("bench-api-sandbox.json") as specs:
        for spec in specs:
            account = ProviderAccount(
                provider=Provider.objects.get_or_create(name="bench catalogue")[0], kind=spec.kind,
                name=f"{spec.kind}-catalogue", endpoint_url=spec.endpoint_url, regions=spec.all_regions,
                options=spec.options,
            )  # fmt: skip
            account.set_credentials(spec.credentials)
            account.save()
            catalogue[account] = adapter_for_account(account).list_offers()
    per_seller = sum(len(q) for q in catalogue.values())
    sellers = -(-target // per_seller) + 1  # a few catalogue rows are refused (quarantined) on every seller
    print(f"seeding: {sellers} sellers x {per_seller} catalogue rows", flush=True)
    started = time.perf_counter()
    for seller in range(sellers):
        provider = Provider.objects.create(name=f"bench seller {seller}")
        markup = Decimal(85 + (seller * 37) % 60) / 100  # 0.85 .. 1.44, spread over the sellers
        for source, quotes in catalogue.items():
            account = ProviderAccount.objects.create(
                provider=provider, kind=source.kind, name=f"{source.kind}-{seller}", endpoint_url=source.endpoint_url,
                regions=source.regions, options=source.options, credentials_encrypted=source.credentials_encrypted,
            )  # fmt: skip
            resold = [dataclasses.replace(q, price=(q.price * markup).quantize(Decimal("0.0001"))) for q in quotes]
            offers_ingest(account=account, quotes=resold, now=now)
    ProviderAccount.objects.filter(provider__name="bench catalogue").update(enabled=False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would soon; the planner needs the new rows' statistics
    print(f"seeded {Offer.objects.count()} offers in {time.perf_counter() - started:.0f} s", flush=True)
    return Offer.objects.count()


def _token() -> str:
    from django.contrib.auth import get_user_model

    from marketplace.api.tokens import api_token_create
    from marketplace.models import Membership, Organization, OrganizationKind, Role

    user, _ = get_user_model().objects.get_or_create(username="bench-buyer")
    org, _ = Organization.objects.get_or_create(
        name="Bench Buyer", kind=OrganizationKind.BUYER, defaults={"payment_terms": "invoiced"}
    )
    Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Role.OWNER})
    return api_token_create(organization=org, user=user, name="bench", scopes=["offers:read"]).raw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


def _get(
    port: int, path: str, headers: dict[str, str], conn: http.client.HTTPConnection | None = None
) -> tuple[int, bytes]:
    """One GET on ``conn`` (reopened whenever the server closes it, as gunicorn's sync workers do after every
    response) or on a connection of its own."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        if own:
            conn.close()


def _path(base: str, search: str, sort: str) -> str:
    return f"{base}?{urllib.parse.urlencode({'q': search, 'sort': sort, 'limit': PAGE})}"


@dataclasses.dataclass
class Target:
    name: str
    base: str
    headers: dict[str, str]
    latencies: list[float] = dataclasses.field(default_factory=list)
    by_search: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    errors: int = 0


def _load(port: int, target: Target, *, concurrency: int, seconds: float) -> None:
    """Keep ``concurrency`` requests in flight for ``seconds``, cycling through the searches."""
    stop = time.perf_counter() + seconds
    lock = threading.Lock()

    def worker(offset: int) -> None:
        i = offset
        mine: list[tuple[int, float]] = []
        errors = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.perf_counter() < stop:
            which = i % len(SEARCHES)
            search, sort = SEARCHES[which]
            i += 1
            began = time.perf_counter()
            status, _ = _get(port, _path(target.base, search, sort), target.headers, conn)
            mine.append((which, time.perf_counter() - began))
            errors += status != 200
        conn.close()
        with lock:
            for which, latency in mine:
                target.latencies.append(latency)
                target.by_search.setdefault(which, []).append(latency)
            target.errors += errors

    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target.seconds += time.perf_counter() - began


def _ms(values: list[float], q: float, method: str = "exclusive") -> float:
    """The q-th percentile in ms. ``inclusive`` stays within the samples, for the few dozen of a kind where
    extrapolating past them misleads."""
    if len(values) < 2:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method=method)[int(q) - 1] * 1000  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offers", type=int, default=100_000)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_api")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and target")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    django_on(args.database)
    rows = _seed(args.offers)
    token = _token()

    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.api_settings",
        "DJANGO_DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "BROKER_SSL_REDIRECT": "0",
        "BROKER_PUBLIC_URL": "https://broker.example",
        # The throttle runs as in production, counting every request, but with room for the load.
        "BROKER_API_RATE_READ": "10000000/min",
    }
    if _redis_answers():
        env["REDIS_URL"] = "redis://127.0.0.1:6379/3"
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("gunicorn")), "broker.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(args.workers), "--log-level", "warning"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(port, "/api/v1/ledger/key", {})[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("gunicorn did not start")
            time.sleep(0.2)

        api = Target("API", "/api/v1/offers", {"Authorization": f"Bearer {token}"})
        bare = Target("bare view", "/bench/bare-offers", {})
        for search, sort in SEARCHES:  # the same offers, in the same order, or the comparison means nothing
            got = {}
            for target in (api, bare):
                status, body = _get(port, _path(target.base, search, sort), target.headers)
                if status != 200:
                    raise SystemExit(f"{target.name} answered {status} to {search!r}: {body[:300]!r}")
                got[target.name] = [row["id"] for row in json.loads(body)["results"]]
            if got["API"] != got["bare view"]:
                raise SystemExit(f"the API and the bare view disagree on {search!r} sorted by {sort}")
            print(f"  {search or '(all)':40} sort={sort:9} {len(got['API']):4} offers on the first page")
        for target in (api, bare):  # warm both workers' connections and caches
            _load(port, target, concurrency=args.concurrency, seconds=1.0)
            target.latencies.clear()
            target.by_search.clear()
            target.seconds = 0.0
        for _ in range(args.rounds):
            for target in (api, bare):
                _load(port, target, concurrency=args.concurrency, seconds=args.seconds)
    finally:
        server.terminate()
        server.wait(timeout=20)

    print(f"\n{rows:,} offers on PostgreSQL; gunicorn {args.workers} workers; {args.concurrency} requests in flight "
          f"from this process; {args.rounds} rounds x {args.seconds:g} s per target, alternating")  # fmt: skip
    print(f"{'':10} {'requests':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} {'req/s':>8}")
    for t in (api, bare):
        rate = len(t.latencies) / t.seconds
        print(f"{t.name:10} {len(t.latencies):9} {t.errors:7} {_ms(t.latencies, 50):8.1f} {_ms(t.latencies, 95):8.1f} "
              f"{rate:8.1f}")  # fmt: skip
    print("per search, p50 / p95 ms:")
    for which, (search, sort) in enumerate(SEARCHES):
        cells = "   ".join(
            f"{t.name} {_ms(t.by_search[which], 50):6.1f} / {_ms(t.by_search[which], 95):6.1f}" for t in (api, bare)
        )
        print(f"  {search or '(all)':36} sort={sort:9} {cells}")
    p95 = _ms(api.latencies, 95)
    ratio_p50 = _ms(api.latencies, 50) / _ms(bare.latencies, 50)
    ratio_p95 = p95 / _ms(bare.latencies, 95)
    ratio_rate = (len(bare.latencies) / bare.seconds) / (len(api.latencies) / api.seconds)
    print(f"API / bare view: p50 {ratio_p50:.2f}x, p95 {ratio_p95:.2f}x, time per request (1/rate) {ratio_rate:.2f}x")
    print(
        f"goal p95 < 50 ms: {'met' if p95 < 50 else 'NOT met'} ({p95:.1f} ms); "
        f"goal within 2x of the bare view: {'met' if max(ratio_p50, ratio_p95) <= 2 else 'NOT met'}"
    )
    return 0 if not (api.errors or bare.errors) else 1


if __name__ == "__main__":
    raise SystemExit(main())
