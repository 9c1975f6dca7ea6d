"""Tampering as an attacker with full database rights would: past the append-only triggers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection


@contextmanager
def triggers_bypassed() -> Iterator[Any]:
    """A cursor whose writes skip the ledger's triggers: PostgreSQL's ``session_replication_role = replica``
    (superusers only), or on SQLite dropping the triggers and putting them back afterwards."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")
            try:
                yield cursor
            finally:
                cursor.execute("SET session_replication_role = DEFAULT")
            return
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name LIKE 'ledger_%'")
        saved = cursor.fetchall()
        for name, _sql in saved:
            cursor.execute(f'DROP TRIGGER "{name}"')
        try:
            yield cursor
        finally:
            for _name, sql in saved:
                cursor.execute(sql)
