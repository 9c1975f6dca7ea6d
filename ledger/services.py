"""Writing and verifying the ledger. The only module that creates ledger rows."""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connection, connections, transaction
from django.db.models import Count, Min
from django.utils import timezone

from ledger import merkle, note
from ledger.anchoring import anchor_sender
from ledger.canonical import canonical_bytes, entry_envelope, sha256_hex
from ledger.chain import AnchorError, read_anchor
from ledger.keys import key_history, verifier_keys
from ledger.maintenance import wipe_allowed
from ledger.models import GENESIS_HASH, Anchor, Checkpoint, LedgerEntry, LedgerHead, PersonalDatum

log = logging.getLogger(__name__)


class LedgerError(Exception):
    """Raised when an append is attempted outside a transaction or the chain head is inconsistent."""


def ledger_append(*, kind: str, subject: str, payload: dict[str, Any]) -> int:
    """Queue one entry in the caller's transaction and return its id; the sequencer chains it once that
    transaction commits.

    Must run inside the caller's ``transaction.atomic()`` block, so the entry commits or rolls back with the
    change it records. No lock is taken: writers never wait for each other here. The sequencer process
    (``manage.py ledger sequence --follow``) gives committed entries their place in the chain within moments;
    receipts and checkpoints sequence what is queued before they read, and the periodic ``ledger.sequence``
    task does when no sequencer process runs. The id is all a caller gets back: nobody used the queued entry
    itself, and building a model instance for every change cost more than the database's own work for it.
    """
    # The connection itself, not the ``connection`` proxy: each attribute read through the proxy is a
    # context-local look-up, and every change in the marketplace comes through here.
    db = connections[DEFAULT_DB_ALIAS]
    if not db.in_atomic_block:
        raise LedgerError("ledger_append must be called inside the transaction of the change it records")
    payload_text = canonical_bytes(payload).decode("utf-8")
    payload_hash = sha256_hex(payload_text.encode("utf-8"))
    # Microseconds are dropped so the timestamp survives every database's datetime precision unchanged.
    created_at = timezone.now().replace(microsecond=0)
    if db.vendor == "postgresql":
        return _append_prepared(db, [kind, subject, payload_text, payload_hash, created_at])
    # One plain INSERT: the ORM's save machinery (signals, field preparation per call) costs more than the
    # database's own work for a row this small.
    with db.cursor() as cursor:
        cursor.execute(
            _APPEND_SQL, [kind, subject, payload_text, payload_hash, db.ops.adapt_datetimefield_value(created_at)]
        )
        return int(cursor.fetchone()[0])


_APPEND_SQL = (
    f"INSERT INTO {LedgerEntry._meta.db_table} (kind, subject, payload, payload_hash, created_at, leaf_hash) "  # noqa: S608 - our table
    "VALUES (%s, %s, %s, %s, %s, '') RETURNING id"
)


def _append_prepared(db: Any, values: list[Any]) -> int:
    """The append's INSERT as a server-side prepared statement, on the Django connection's own psycopg
    connection and so in the caller's transaction: Django's cursors bind on the client, quoting every value into
    the statement's text, which the server then parses and plans again for each change. psycopg prepares it on
    first use in each session (and again after a rollback, which drops its prepared statements). What Django's
    cursor does around a statement is kept: a broken transaction refused, errors as Django's, the connection's
    execute wrappers run, the query logged when queries are being captured."""
    db.validate_no_broken_transaction()
    began = time.monotonic()
    with db.wrap_database_errors, psycopg.Cursor(db.connection) as cursor:

        def prepared(sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
            return cursor.execute(sql, params, prepare=True)

        # Through the connection's execute wrappers, as Django's cursor would (a profiler, a query counter).
        executor: Any = prepared
        for wrapper in reversed(db.execute_wrappers):
            executor = functools.partial(wrapper, executor)
        executor(_APPEND_SQL, values, False, {"connection": db, "cursor": cursor})
        row = cursor.fetchone()
    if db.queries_logged:
        db.queries_log.append({"sql": f"{_APPEND_SQL} (prepared)", "time": f"{time.monotonic() - began:.3f}"})
    if row is None:
        raise LedgerError("the append's INSERT returned no row")
    return int(row[0])


SEQUENCE_BATCH = 2000
# A call made on someone's behalf (a receipt, a checkpoint) sequences at most this many batches, so a steady
# stream of new entries never holds it: the sequencer process takes the rest.
SEQUENCE_BATCHES_PER_CALL = 8
# Any 64-bit number of our own: the key of the sequencer's transaction-scoped advisory lock on PostgreSQL.
SEQUENCER_LOCK_KEY = 0x1ED6E55E0


def ledger_sequence(*, max_batches: int | None = None) -> int:
    """Give queued entries their sequence, ``prev_hash`` and hashes, in batches; the number sequenced.

    One sequencer at a time: on PostgreSQL a transaction-scoped advisory lock taken without waiting (a second
    caller returns 0 at once; SQLite's single writer serialises the same way), then the head row's lock. Entries
    are taken in the order they were written among those committed, so an entry written after another's change
    committed always comes after it. Safe to call from anywhere, any number of times. Call it outside a
    transaction or as the last step of a short one: inside one, the lock is held until that transaction ends.
    """
    nested = connection.in_atomic_block
    total = 0
    batches = 0
    with transaction.atomic():
        locked = _sequencer_lock()
        while locked and (max_batches is None or batches < max_batches):
            count = _sequence_batch()
            total += count
            batches += 1
            if count < SEQUENCE_BATCH:
                break
    if nested and connection.vendor == "postgresql":
        # The caller's transaction goes on: its own queries get bitmap scans back (the setting's default).
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_bitmapscan TO DEFAULT")
    return total


# While entries keep coming, the follower lets about this many gather before its next pass: each pass pays its
# transaction, the head's lock and a commit whatever it chains, on the cores the writers use. Never longer than
# FOLLOW_MAX_WAIT_S, so an entry waits a quarter of a second at most under load (idle_s when traffic is sparse).
FOLLOW_TARGET_BATCH = 400
FOLLOW_MAX_WAIT_S = 0.25


def ledger_sequence_follow(*, stop: threading.Event, idle_s: float = 0.02) -> int:
    """The sequencer process's loop: chain queued entries as they commit, until ``stop`` is set; the number
    chained. When nothing was queued it looks again after ``idle_s`` (a look is one query on the index of queued
    entries), so a lone entry waits about that long. While entries keep coming it paces itself by their rate,
    waiting until about ``FOLLOW_TARGET_BATCH`` have gathered (``FOLLOW_MAX_WAIT_S`` at most, ``idle_s`` at
    least), and at once after a full batch. A database error (a restart, a failover) is logged and retried
    after a pause rather than ending the process."""
    total = 0
    last_pass = time.monotonic()
    while not stop.is_set():
        try:
            # Looking first keeps an idle look to one read on the queued entries' index, with no transaction.
            count = ledger_sequence(max_batches=SEQUENCE_BATCHES_PER_CALL) if _any_queued() else 0
        except DatabaseError as exc:
            log.warning("ledger sequencer: %s; trying again in %.0f s", exc, 5.0)
            close_old_connections()
            connection.close()
            stop.wait(5.0)
            continue
        total += count
        now = time.monotonic()
        since, last_pass = now - last_pass, now
        if count >= SEQUENCE_BATCH:
            continue
        stop.wait(_follow_wait(count=count, since=since, idle_s=idle_s))
    return total


def _any_queued() -> bool:
    """Whether any entry waits for the sequencer: one read on the queued entries' index, written out because the
    ORM's building of it cost the follower more than the read."""
    with connection.cursor() as cursor:
        cursor.execute(_ANY_QUEUED_SQL)
        return cursor.fetchone() is not None


_ANY_QUEUED_SQL = f"SELECT 1 FROM {LedgerEntry._meta.db_table} WHERE sequence IS NULL LIMIT 1"  # noqa: S608 - our table


def _follow_wait(*, count: int, since: float, idle_s: float) -> float:
    """How long the follower waits after a pass that chained ``count`` entries, ``since`` seconds after the one
    before: the time about ``FOLLOW_TARGET_BATCH`` more take to arrive at that pace, within
    [``idle_s``, ``FOLLOW_MAX_WAIT_S``]; ``idle_s`` when nothing came (nothing to pace by)."""
    if count == 0:
        return idle_s
    return min(max(FOLLOW_TARGET_BATCH * since / count, idle_s), max(FOLLOW_MAX_WAIT_S, idle_s))


def _sequencer_lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    # Chaining a row leaves its old version's entry in the queued index until a vacuum. A plain index scan marks
    # such entries dead as it passes them, so the next batch skips them; a bitmap scan, which the planner prefers
    # for a few queued rows, never does, and then every batch re-read every row chained since the last vacuum
    # (50,000 index entries and 3,114 heap pages to find 400 queued rows, measured). Off for this transaction
    # only, in the lock's round trip; ``ledger_sequence`` puts it back for a caller whose transaction goes on.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s), set_config('enable_bitmapscan', 'off', true)", [SEQUENCER_LOCK_KEY]
        )
        return bool(cursor.fetchone()[0])


def _sequence_batch() -> int:
    size, prev_hash = _head_locked()
    queued = _queued_batch()
    if not queued:
        return 0
    head_size = size
    rows: list[tuple[int, int, str, str, str]] = []
    for pk, kind, subject, created_at, payload_hash in queued:
        size += 1
        envelope = entry_envelope(
            sequence=size,
            kind=kind,
            subject=subject,
            created_at=created_at,
            payload_hash=payload_hash,
            prev_hash=prev_hash,
        )
        entry_hash = sha256_hex(envelope)
        rows.append((pk, size, prev_hash, entry_hash, merkle.leaf_hash(envelope).hex()))
        prev_hash = entry_hash
    chained, head_moved = _chain_rows(rows, head_size=head_size)
    if chained != len(rows):
        raise LedgerError("a queued entry was sequenced by someone else during this batch")
    if not head_moved:
        raise LedgerError("ledger head moved during sequencing")
    return len(rows)


def _head_locked() -> tuple[int, str]:
    """The chain's size and last hash from the head row, locked until this transaction ends; the row is created
    by the first pass ever. On PostgreSQL one plain statement: the ORM's query building cost more than the
    database's work for it, at every pass."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT size, head_hash FROM {LedgerHead._meta.db_table} WHERE id = 1 FOR UPDATE")  # noqa: S608 - our table
            row = cursor.fetchone()
        if row is not None:
            return int(row[0]), str(row[1])
    head, _ = LedgerHead.objects.select_for_update().get_or_create(id=1)
    return head.size, head.head_hash


# created_at as the envelope writes it (``2026-12-03T11:49:00Z``, microseconds only when there are some), made
# by the database: turning each timestamp into a datetime and back into text cost the sequencer more than
# hashing the entry. ``ledger verify`` recomputes every envelope from the datetime, so a slip would show.
PG_CANONICAL_CREATED_AT = (
    "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN date_trunc('second', "
    "created_at) = created_at THEN '' ELSE to_char(created_at AT TIME ZONE 'UTC', '.US') END || 'Z'"
)


def _queued_batch() -> list[tuple[int, str, str, Any, str]]:
    """The oldest queued entries, up to a batch: id, kind, subject, created_at (a datetime, or its canonical
    text on PostgreSQL) and payload hash."""
    if connection.vendor != "postgresql":
        return list(
            LedgerEntry.objects.filter(sequence__isnull=True)
            .order_by("id")
            .values_list("id", "kind", "subject", "created_at", "payload_hash")[:SEQUENCE_BATCH]
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, kind, subject, {PG_CANONICAL_CREATED_AT}, payload_hash FROM {LedgerEntry._meta.db_table} "  # noqa: S608 - our table and expression
            "WHERE sequence IS NULL ORDER BY id LIMIT %s",
            [SEQUENCE_BATCH],
        )
        return list(cursor.fetchall())


def _chain_rows(rows: list[tuple[int, int, str, str, str]], *, head_size: int) -> tuple[int, bool]:
    """Fill each queued row's chain fields (id, sequence, prev_hash, entry_hash, leaf_hash) and move the head,
    locked by this transaction at ``head_size``, to the last of them; the rows changed and whether the head
    moved. The rows' sequences are consecutive, in the order given, as ``_sequence_batch`` numbers them."""
    table = LedgerEntry._meta.db_table
    last_sequence, last_hash = rows[-1][1], rows[-1][3]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Four strings, not five placeholders a row: the driver binds on the client, parsing the statement
            # for placeholders and quoting every value, which for a batch of thousands cost more than the
            # UPDATE itself. Ids and hex hashes hold no comma; sequences are consecutive from the first. The
            # head moves in the same statement, one round trip less at every pass.
            ids, _, prevs, hashes, leaves = zip(*rows, strict=True)
            cursor.execute(
                f"WITH chained AS (UPDATE {table} AS e SET sequence = %s + v.n - 1, prev_hash = v.prev, "  # noqa: S608 - our tables, values are parameters
                "entry_hash = v.hash, leaf_hash = v.leaf FROM unnest(string_to_array(%s, ',')::bigint[], "
                "string_to_array(%s, ','), string_to_array(%s, ','), string_to_array(%s, ',')) "
                "WITH ORDINALITY AS v(id, prev, hash, leaf, n) WHERE e.id = v.id AND e.sequence IS NULL RETURNING 1), "
                f"moved AS (UPDATE {LedgerHead._meta.db_table} SET size = %s, head_hash = %s "
                "WHERE id = 1 AND size = %s RETURNING 1) "
                "SELECT (SELECT count(*) FROM chained), (SELECT count(*) FROM moved)",
                [
                    rows[0][1],
                    ",".join(map(str, ids)),
                    ",".join(prevs),
                    ",".join(hashes),
                    ",".join(leaves),
                    last_sequence,
                    last_hash,
                    head_size,
                ],
            )
            chained, moved = cursor.fetchone()
            return int(chained), moved == 1
        changed = 0
        for pk, sequence, prev, entry_hash, leaf in rows:
            cursor.execute(
                f"UPDATE {table} SET sequence = %s, prev_hash = %s, entry_hash = %s, leaf_hash = %s "  # noqa: S608 - our table
                "WHERE id = %s AND sequence IS NULL",
                [sequence, prev, entry_hash, leaf, pk],
            )
            changed += cursor.rowcount
    moved = LedgerHead.objects.filter(id=1, size=head_size).update(size=last_sequence, head_hash=last_hash)
    return changed, moved == 1


def ledger_queued() -> tuple[int, dt.datetime | None]:
    """How many entries wait for the sequencer, and when the oldest of them was written (one query)."""
    found = LedgerEntry.objects.filter(sequence__isnull=True).aggregate(count=Count("id"), oldest=Min("created_at"))
    return int(found["count"]), found["oldest"]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a full chain check. ``first_bad_sequence`` is None when the chain is intact."""

    entries_checked: int
    first_bad_sequence: int | None
    problem: str

    @property
    def ok(self) -> bool:
        return self.first_bad_sequence is None and not self.problem


def _entries(batch: int = 2000) -> Iterator[LedgerEntry]:
    last = 0
    while True:
        rows = list(LedgerEntry.objects.filter(sequence__gt=last).order_by("sequence")[:batch])
        if not rows:
            return
        yield from rows
        last = rows[-1].sequence


def ledger_verify(*, chain: Any = None) -> VerifyResult:
    """Recompute every hash from the stored payloads and check the links, the sequence and the head; then
    recompute the Merkle root at every checkpoint, check the checkpoint's signature, and, given ``chain`` (a
    ``Web3``), check each anchor's transaction states that same size and root.

    A chain rewritten consistently from the first entry passes the link checks but not the checkpoints'
    signed roots; rewritten checkpoints fail their signatures or their anchors. Reports the first problem;
    never modifies anything.
    """
    prev_hash = GENESIS_HASH
    expected = 1
    count = 0
    leaves: list[bytes] = []
    for entry in _entries():
        count += 1
        if entry.sequence != expected:
            return VerifyResult(count, expected, f"sequence gap: expected #{expected}, found #{entry.sequence}")
        payload_hash = sha256_hex(entry.payload.encode("utf-8"))
        if payload_hash != entry.payload_hash:
            return VerifyResult(count, entry.sequence, "payload does not match its stored hash")
        if entry.prev_hash != prev_hash:
            return VerifyResult(count, entry.sequence, "prev_hash does not match the previous entry's hash")
        envelope = entry_envelope(
            sequence=entry.sequence,
            kind=entry.kind,
            subject=entry.subject,
            created_at=entry.created_at,
            payload_hash=payload_hash,
            prev_hash=prev_hash,
        )
        if sha256_hex(envelope) != entry.entry_hash:
            return VerifyResult(count, entry.sequence, "entry_hash does not match its recomputed envelope")
        leaf = merkle.leaf_hash(envelope)
        if leaf.hex() != entry.leaf_hash:
            return VerifyResult(count, entry.sequence, "leaf_hash does not match its recomputed envelope")
        leaves.append(leaf)
        prev_hash = entry.entry_hash
        expected += 1
    head = LedgerHead.objects.filter(id=1).first()
    size = head.size if head else 0
    head_hash = head.head_hash if head else GENESIS_HASH
    if size != count or head_hash != prev_hash:
        return VerifyResult(count, None, f"head says size {size} / {head_hash[:12]}, chain has {count} entries")
    problem = _checkpoints_problem(leaves, chain)
    return VerifyResult(count, None, problem)


def _checkpoints_problem(leaves: list[bytes], chain: Any) -> str:
    """The first checkpoint or anchor that disagrees with the entries, or ""."""
    checkpoints = list(Checkpoint.objects.order_by("size"))
    if not checkpoints:
        return ""
    keys = verifier_keys()
    signers = [p.key_id for p in key_history()]
    again = next((key_id for n, key_id in enumerate(signers) if key_id in signers[:n]), None)
    if again is not None:
        return f"key {again} signed checkpoints again after it was retired"
    roots = merkle.roots_at(leaves, [c.size for c in checkpoints])
    sender = anchor_sender(chain) if chain is not None else ""
    for checkpoint in checkpoints:
        where = f"checkpoint {checkpoint.size}"
        if checkpoint.size > len(leaves):
            return f"{where} covers more entries than the ledger has ({len(leaves)})"
        vkey = keys.get(checkpoint.key_id)
        if vkey is None:
            return f"{where}: signed by key {checkpoint.key_id}, which is not a key of this ledger"
        try:
            body = note.open_note(checkpoint.note, vkey)
        except note.NoteError as exc:
            return f"{where}: {exc}"
        if body.origin != settings.LEDGER_ORIGIN:
            return f"{where}: its note names origin {body.origin!r}, not {settings.LEDGER_ORIGIN!r}"
        if (body.size, body.root.hex()) != (checkpoint.size, checkpoint.root_hash):
            return f"{where}: its row differs from its signed note"
        if roots[checkpoint.size].hex() != checkpoint.root_hash:
            return f"{where}: the entries' Merkle root differs from the signed root"
        anchor = Anchor.objects.filter(checkpoint=checkpoint).first()
        if chain is None or anchor is None:
            continue
        try:
            on_chain = read_anchor(chain, anchor.tx_hash)
        except AnchorError as exc:
            return f"{where}: anchor {anchor.tx_hash}: {exc}"
        if (on_chain.size, on_chain.root.hex()) != (checkpoint.size, checkpoint.root_hash):
            return f"{where}: the chain anchored size {on_chain.size} root {on_chain.root.hex()[:12]}, not this"
        recorded = (anchor.chain_id, anchor.block_number, anchor.block_hash.lower(), anchor.sender.lower())
        found = (on_chain.chain_id, on_chain.block_number, on_chain.block_hash.lower(), on_chain.sender.lower())
        if recorded != found:
            return f"{where}: anchor {anchor.tx_hash} is recorded as {recorded}, the chain says {found}"
        if on_chain.sender.lower() != sender.lower():
            return f"{where}: anchor {anchor.tx_hash} was sent by {on_chain.sender}, not the broker's {sender}"
    return ""


def ledger_allow_wipe(allow: bool = True) -> None:
    """Let this database session empty the ledger tables wholesale (PostgreSQL TRUNCATE, SQLite DELETE), or stop
    letting it. For flushing a test database only: the triggers refuse every other UPDATE or DELETE anyway."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('ledger.maintenance', %s, false)", ["on" if allow else "off"])
    wipe_allowed.on = allow


# --- Personal data ----------------------------------------------------------------------------------------------


def personal_commitment(*, person: str, value: Any) -> str:
    """Keep ``value`` (personal data of ``person``, e.g. ``user:42``) outside the ledger and return the salted
    commitment to put in an entry's payload instead: SHA-256(salt || canonical JSON of value), hex.

    Call inside the transaction of the entry, so the datum and the entry commit together."""
    salt = secrets.token_bytes(32)
    text = canonical_bytes(value)
    commitment = sha256_hex(salt + text)
    PersonalDatum.objects.create(
        commitment=commitment, person=person, salt=salt.hex(), value=text.decode("utf-8"), created_at=timezone.now()
    )
    return commitment


def user_commitment(user: Any) -> str:
    """The commitment an entry carries for the user who made a change (``user:<pk>``, their username)."""
    return personal_commitment(person=f"user:{user.pk}", value={"username": user.get_username()})


def personal_reveal(commitment: str) -> Any | None:
    """The value behind a commitment, checked against it; None once the person was erased (or never existed)."""
    datum = PersonalDatum.objects.filter(commitment=commitment).first()
    if datum is None:
        return None
    if sha256_hex(bytes.fromhex(datum.salt) + datum.value.encode("utf-8")) != commitment:
        raise LedgerError(f"personal datum {commitment[:12]} does not match its commitment")
    return json.loads(datum.value)


def personal_erase(*, person: str, reason: str) -> int:
    """Erase everything kept about ``person``: their salts and values go, the entries stay, and every hash and
    proof still verifies (the commitments alone reveal nothing). Ledgered without personal data."""
    with transaction.atomic():
        erased, _ = PersonalDatum.objects.filter(person=person).delete()
        ledger_append(kind="personal.erased", subject=f"person:{person}", payload={"data": erased, "reason": reason})
    return erased
