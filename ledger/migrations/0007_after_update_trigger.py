"""The sequencer's UPDATE of each queued entry costs less again (issue 39); the rules stay what they were.

On PostgreSQL the trigger that refuses every UPDATE but the sequencer's one change of a queued row runs after
the row is updated instead of before. A row trigger that runs before an UPDATE makes the database lock the old
row first, a tuple lock written to the WAL for every entry chained (about one more WAL record per entry, with
the sequencer's own; ``pg_get_wal_stats``); one that runs after has its ``WHEN`` condition checked as the row is
updated and nothing to lock. A refused UPDATE still reaches ``ledger_refuse_change``, whose exception fails the
statement and so undoes the change, as before. SQLite's triggers are left alone.
"""

import importlib

from django.db import migrations

TABLE = "ledger_ledgerentry"

append_fast = importlib.import_module("ledger.migrations.0006_append_fast")


def _trigger(when: str):
    def create(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_sequence_once ON {TABLE}")
        # coalesce: a condition that came out NULL must refuse, never let the UPDATE through.
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_sequence_once {when} UPDATE ON {TABLE} FOR EACH ROW "
            f"WHEN (NOT coalesce({append_fast.PG_SEQUENCING}, false)) EXECUTE FUNCTION ledger_refuse_change()"
        )

    return create


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0006_append_fast"),
    ]

    operations = [
        migrations.RunPython(_trigger("AFTER"), _trigger("BEFORE")),
    ]
