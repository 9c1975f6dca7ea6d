"""Benchmark: ledgered changes per second with concurrent writers, queued and sequenced (issue 23, point 8),
against the locked append the broker used before, measured in the same run.

    .venv/bin/python bench/ledger_writers.py [--writers 1 8] [--entries 16000] [--locked-entries 2000]
        [--rounds 3] [--database postgres://postgres@127.0.0.1:5432/broker_bench_ledger]

Each writer is a process of its own with its own database connection; each change is one transaction holding
one ledger entry, as in the issue's measurement. ``queued``: ``ledger_append`` as the broker runs it, the entry
queued in the writer's transaction, with the sequencer process (``ledger sequence --follow``) chaining entries
beside the writers, in a process of its own. ``locked``: the append
before this issue, every writer holding the head row's lock until its transaction commits (kept here, verbatim
in effect, as the baseline). ``bare``: the same transactions writing the same row to a table with no ledger
at all (a primary key and a subject index, as the queued row has): the most this machine commits through
Django, whatever a ledger does. The clock stops when every entry is written *and* chained; then the ledger is
checked whole (``ledger_verify``: gapless, links, hashes) and must hold exactly the entries written. Last, the
sequencer alone: how many queued entries per second one sequencer chains, the ledger's own ceiling.

Goal (issue 39): with 8 writers, ledgered (``queued``) changes at 90 % or more of ``bare``. Bare and queued
run in turns, ``--rounds`` times for each writer count, and each queued run is divided by the bare run just
before it; the goal is judged on the median of those ratios, and every one is printed, because on a machine
others share the load moves from one run to the next. Beside each rate, the CPU each change cost the run's own
processes (writers, sequencer and their database backends, read from ``/proc`` when the database is local):
unlike the rate, it hardly moves with what else the machine runs, so queued against bare says where the
ledger's cost is even when the rates cannot.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sync import django_on  # noqa: E402

GOAL_SHARE = 0.90  # issue 39: ledgered changes at this share of no ledger, or more, with 8 writers


def _locked_append(*, kind: str, subject: str, payload: dict[str, Any]) -> None:
    """The append before issue 23: sequence and chain inside the writer's transaction, under the head row's
    lock, which every other writer then waits for until this transaction commits."""
    from django.utils import timezone

    from ledger import merkle
    from ledger.canonical import canonical_bytes, entry_envelope, sha256_hex
    from ledger.models import LedgerEntry, LedgerHead

    head, _ = LedgerHead.objects.select_for_update().get_or_create(id=1)
    payload_text = canonical_bytes(payload).decode("utf-8")
    payload_hash = sha256_hex(payload_text.encode("utf-8"))
    sequence = head.size + 1
    created_at = timezone.now().replace(microsecond=0)
    envelope = entry_envelope(
        sequence=sequence,
        kind=kind,
        subject=subject,
        created_at=created_at,
        payload_hash=payload_hash,
        prev_hash=head.head_hash,
    )
    entry_hash = sha256_hex(envelope)
    LedgerEntry.objects.create(
        sequence=sequence,
        kind=kind,
        subject=subject,
        payload=payload_text,
        payload_hash=payload_hash,
        prev_hash=head.head_hash,
        entry_hash=entry_hash,
        leaf_hash=merkle.leaf_hash(envelope).hex(),
        created_at=created_at,
    )
    LedgerHead.objects.filter(id=1).update(size=sequence, head_hash=entry_hash)


def _bare_append(*, kind: str, subject: str, payload: dict[str, Any]) -> None:
    """The same row written without a ledger: no queue, no chain."""
    from django.db import connection
    from django.utils import timezone

    from ledger.canonical import canonical_bytes, sha256_hex

    payload_text = canonical_bytes(payload).decode("utf-8")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_bare_change (kind, subject, payload, payload_hash, created_at) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id",
            [kind, subject, payload_text, sha256_hex(payload_text.encode()), timezone.now().replace(microsecond=0)],
        )
        cursor.fetchone()


APPENDS = {"bare": _bare_append, "locked": _locked_append}


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU a PostgreSQL process of this machine has used, or None when there is none by that id
    (a database elsewhere: a process here with the same id is someone else)."""
    try:
        if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"postgres"):
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _CpuMeter:
    """This process's CPU and its database backend's, from its creation until ``put``, which sends the sum to
    ``used`` (None for the backend's share when the database is not on this machine)."""

    def __init__(self, used: Any) -> None:
        from django.db import connection

        connection.ensure_connection()
        self.used = used
        self.backend = connection.connection.info.backend_pid
        self.own, self.backend_at = time.process_time(), _cpu_seconds(self.backend)

    def put(self) -> None:
        backend_now = _cpu_seconds(self.backend)
        backend = None if backend_now is None or self.backend_at is None else backend_now - self.backend_at
        self.used.put((time.process_time() - self.own, backend))


def _writer(mode: str, number: int, count: int, start: Any, used: Any) -> None:
    from django.db import connections, transaction

    from ledger.services import ledger_append

    connections.close_all()  # a connection of this process's own, not the parent's
    append = APPENDS.get(mode, ledger_append)
    meter = _CpuMeter(used)
    start.wait()
    for i in range(count):
        with transaction.atomic():
            append(kind="bench.change", subject=f"order:w{number}-{i % 50}", payload={"writer": number, "i": i})
    meter.put()
    connections.close_all()


def _sequencer(stop: Any, used: Any) -> None:
    from django.db import connections

    from ledger.services import ledger_sequence_follow

    connections.close_all()
    meter = _CpuMeter(used)
    ledger_sequence_follow(stop=stop)
    meter.put()
    connections.close_all()


def _cpu_per_change(used: Any, processes: int, changes: int) -> str:
    """The CPU the run's processes and their backends used per change, as printed beside its rate."""
    own = backends = 0.0
    for _ in range(processes):
        process_cpu, backend_cpu = used.get(timeout=60)
        own += process_cpu
        if backend_cpu is None:
            return f"{own / changes * 1e6:4.0f} us CPU/change (backends not local)"
        backends += backend_cpu
    return f"{(own + backends) / changes * 1e6:4.0f} us CPU/change"


def _empty_ledger() -> None:
    from django.db import connection

    from ledger.services import ledger_allow_wipe

    ledger_allow_wipe(True)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE ledger_anchor, ledger_checkpoint, ledger_subtreehash, ledger_ledgerentry, ledger_ledgerhead"
        )
        cursor.execute("DROP TABLE IF EXISTS bench_bare_change")
        cursor.execute(
            "CREATE TABLE bench_bare_change (id bigserial PRIMARY KEY, kind varchar(64), subject varchar(128), "
            "payload text, payload_hash varchar(64), created_at timestamptz)"
        )
        cursor.execute("CREATE INDEX ON bench_bare_change (subject)")
    ledger_allow_wipe(False)


def _run(mode: str, writers: int, entries: int) -> float:
    """Changes per second, from the writers' common start until every entry is chained."""
    from django.db import connections

    from ledger.models import LedgerEntry
    from ledger.services import ledger_queued, ledger_verify

    _empty_ledger()
    per_writer = entries // writers
    connections.close_all()
    context = multiprocessing.get_context("fork")
    start = context.Barrier(writers + 1)
    used = context.Queue()
    processes = [context.Process(target=_writer, args=(mode, n, per_writer, start, used)) for n in range(writers)]
    stop = context.Event()
    sequencer = context.Process(target=_sequencer, args=(stop, used)) if mode == "queued" else None
    for process in [*processes, *([sequencer] if sequencer else [])]:
        process.start()
    start.wait()
    began = time.perf_counter()
    for process in processes:
        process.join()
    while ledger_queued()[0]:  # the sequencer's last batches
        time.sleep(0.005)
    elapsed = time.perf_counter() - began
    if sequencer is not None:
        stop.set()
        sequencer.join()
    if any(p.exitcode for p in processes) or (sequencer is not None and sequencer.exitcode):
        raise SystemExit(f"{mode}: a writer or the sequencer failed")
    written = per_writer * writers
    cpu = _cpu_per_change(used, writers + (1 if sequencer is not None else 0), written)
    if mode == "bare":
        print(f"{mode:>6} {writers} writer{'s' if writers > 1 else ' '}: {written:6,} changes in {elapsed:6.2f} s = "
              f"{written / elapsed:7,.0f}/s, {cpu}   (no ledger)")  # fmt: skip
        return written / elapsed
    result = ledger_verify()
    stored = LedgerEntry.objects.count()
    if not result.ok or result.entries_checked != written or stored != written or ledger_queued()[0]:
        raise SystemExit(f"{mode} x{writers}: ledger not whole: {result} stored={stored} written={written}")
    rate = written / elapsed
    print(
        f"{mode:>6} {writers} writer{'s' if writers > 1 else ' '}: {written:6,} changes in {elapsed:6.2f} s = "
        f"{rate:7,.0f}/s, {cpu}   gapless, verified"
    )
    return rate


def _sequencer_alone(entries: int) -> float:
    """Entries chained per second by one sequencer with ``entries`` queued and no writer competing."""
    from django.db import transaction

    from ledger.services import ledger_append, ledger_sequence, ledger_verify

    _empty_ledger()
    with transaction.atomic():
        for i in range(entries):
            ledger_append(kind="bench.change", subject=f"order:s-{i % 50}", payload={"i": i})
    began = time.perf_counter()
    chained = ledger_sequence()
    elapsed = time.perf_counter() - began
    if chained != entries or not ledger_verify().ok:
        raise SystemExit("sequencer alone: the ledger is not whole")
    return chained / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--entries", type=int, default=16_000, help="changes per queued or bare run")
    parser.add_argument("--locked-entries", type=int, default=2_000, help="changes per locked (baseline) run")
    parser.add_argument("--rounds", type=int, default=3, help="bare and queued runs, taken in turns, per writer count")
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/broker_bench_ledger")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    # Production settings: DEBUG off (Django's debug cursor would time and keep every query).
    django_on(
        args.database,
        DJANGO_DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        BROKER_PUBLIC_URL="https://broker.example",
    )

    shares: dict[int, list[float]] = {}
    for writers in args.writers:
        locked = _run("locked", writers, args.locked_entries)
        queued: list[float] = []
        # Bare and queued in turns, each queued run against the bare run just before it: on a shared machine
        # the load moves between runs, and a pair measured back to back sees the same machine.
        for _ in range(args.rounds):
            bare = _run("bare", writers, args.entries)
            queued.append(_run("queued", writers, args.entries))
            shares.setdefault(writers, []).append(queued[-1] / bare)
        print(f"{writers} writer(s): queued/locked = {statistics.median(queued) / locked:.1f}x; queued/bare = "
              f"{_spread(shares[writers])} of what this machine commits with no ledger")  # fmt: skip
    print(f"sequencer alone: {_sequencer_alone(args.entries):,.0f} entries/s chained by one sequencer")
    if 8 not in shares:
        print(f"goal: ledgered changes at >= {GOAL_SHARE:.0%} of no ledger with 8 writers: not measured (no 8)")
        return
    share = statistics.median(shares[8])
    verdict = "met" if share >= GOAL_SHARE else "NOT met"
    print(f"goal: ledgered changes at >= {GOAL_SHARE:.0%} of no ledger with 8 writers: {verdict} "
          f"(median {share:.0%} over {len(shares[8])} rounds)")  # fmt: skip


def _spread(shares: list[float]) -> str:
    """The median share, and the lowest and highest when there are several rounds."""
    median = f"{statistics.median(shares):.0%}"
    if len(shares) == 1:
        return median
    return f"{median} (median of {', '.join(f'{s:.0%}' for s in shares)})"


if __name__ == "__main__":
    main()
