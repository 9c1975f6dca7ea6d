"""The sequencer's UPDATE of each queued entry costs less (issue 39); the rules stay what they were.

PostgreSQL: the one UPDATE an entry may take (its chain fields filled once, nothing else touched) is now stated
in the trigger's ``WHEN`` condition, which the database evaluates itself, instead of in a PL/pgSQL function
called for every row chained: a refused UPDATE still reaches ``ledger_refuse_change`` and fails as before, and
DELETE is refused by a trigger of its own. SQLite's triggers already work this way and are left alone.

The unique index on ``entry_hash`` goes: every chained row's hash covers its ``sequence``, which its own unique
index keeps distinct, so two rows could share a hash only through a SHA-256 collision; meanwhile it was the most
expensive index to keep, one random insert into a tree of 64-character keys per entry chained. Nothing looks an
entry up by its hash; ``ledger verify`` recomputes every one.
"""

import importlib

from django.db import migrations, models

TABLE = "ledger_ledgerentry"

queued_entries = importlib.import_module("ledger.migrations.0005_queued_entries")

PG_SEQUENCING = (
    "OLD.sequence IS NULL AND NEW.sequence IS NOT NULL AND NEW.prev_hash IS NOT NULL "
    "AND NEW.entry_hash IS NOT NULL AND NEW.leaf_hash <> '' AND NEW.id = OLD.id AND NEW.kind = OLD.kind "
    "AND NEW.subject = OLD.subject AND NEW.payload = OLD.payload AND NEW.payload_hash = OLD.payload_hash "
    "AND NEW.created_at = OLD.created_at"
)


def _when_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_sequence_once ON {TABLE}")
    # coalesce: a condition that came out NULL must refuse, never let the UPDATE through.
    schema_editor.execute(
        f"CREATE TRIGGER {TABLE}_sequence_once BEFORE UPDATE ON {TABLE} FOR EACH ROW "
        f"WHEN (NOT coalesce({PG_SEQUENCING}, false)) EXECUTE FUNCTION ledger_refuse_change()"
    )
    schema_editor.execute(
        f"CREATE TRIGGER {TABLE}_no_delete BEFORE DELETE ON {TABLE} FOR EACH ROW "
        "EXECUTE FUNCTION ledger_refuse_change()"
    )
    schema_editor.execute("DROP FUNCTION IF EXISTS ledger_entry_sequence_once()")


def _function_trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_sequence_once ON {TABLE}")
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_delete ON {TABLE}")
    schema_editor.execute(queued_entries.PG_FUNCTION, params=None)  # no placeholders: its % are RAISE markers
    schema_editor.execute(
        f"CREATE TRIGGER {TABLE}_sequence_once BEFORE UPDATE OR DELETE ON {TABLE} "
        "FOR EACH ROW EXECUTE FUNCTION ledger_entry_sequence_once()"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0005_queued_entries"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="ledgerentry", name="ledger_entry_hash_unique"),
        migrations.RunPython(_when_triggers, _function_trigger),
    ]
