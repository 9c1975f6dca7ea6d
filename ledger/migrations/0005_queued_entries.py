"""Entries are queued in the writer's transaction and chained later by the sequencer (issue 23).

A queued entry has no sequence, ``prev_hash``, ``entry_hash`` or ``leaf_hash`` yet. The entry table's trigger
now allows exactly one UPDATE of a row: filling those four fields of a queued row, every other column
unchanged. Any other UPDATE, every DELETE and TRUNCATE are still refused as in 0003 (TRUNCATE and, on SQLite,
DELETE pass only in a maintenance session). The unique sequence and entry hash become unique among chained rows
(queued rows are NULL in both), and the table loses the indexes nobody reads. On SQLite the AlterFields below
rebuild the table, which drops its triggers: they are created again afterwards.
"""

from django.db import migrations, models

TABLE = "ledger_ledgerentry"

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_entry_sequence_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.sequence IS NULL AND NEW.sequence IS NOT NULL
        AND NEW.prev_hash IS NOT NULL AND NEW.entry_hash IS NOT NULL AND NEW.leaf_hash <> ''
        AND NEW.id = OLD.id AND NEW.kind = OLD.kind AND NEW.subject = OLD.subject
        AND NEW.payload = OLD.payload AND NEW.payload_hash = OLD.payload_hash
        AND NEW.created_at = OLD.created_at THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'ledger table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
"""

SQLITE_SEQUENCING = (
    "OLD.sequence IS NULL AND NEW.sequence IS NOT NULL AND NEW.prev_hash IS NOT NULL "
    "AND NEW.entry_hash IS NOT NULL AND NEW.leaf_hash <> '' AND NEW.id = OLD.id AND NEW.kind = OLD.kind "
    "AND NEW.subject = OLD.subject AND NEW.payload = OLD.payload AND NEW.payload_hash = OLD.payload_hash "
    "AND NEW.created_at = OLD.created_at"
)


def _sequencing_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FUNCTION, params=None)  # no placeholders: its % are RAISE format markers
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_sequence_once BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION ledger_entry_sequence_once()"
        )
    elif vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_update")
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_delete")
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_update BEFORE UPDATE ON {TABLE} WHEN NOT ({SQLITE_SEQUENCING}) BEGIN "
            f"SELECT RAISE(ABORT, 'ledger table {TABLE} is append-only: UPDATE refused'); END"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_delete BEFORE DELETE ON {TABLE} WHEN NOT ledger_maintenance() BEGIN "
            f"SELECT RAISE(ABORT, 'ledger table {TABLE} is append-only: DELETE refused'); END"
        )


def _append_only_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_sequence_once ON {TABLE}")
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()"
        )
        schema_editor.execute("DROP FUNCTION IF EXISTS ledger_entry_sequence_once()")
    elif vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_update")
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_update BEFORE UPDATE ON {TABLE} BEGIN "
            f"SELECT RAISE(ABORT, 'ledger table {TABLE} is append-only: UPDATE refused'); END"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0004_subtree_hashes"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="ledgerentry",
            options={"ordering": [models.OrderBy(models.F("sequence"), nulls_last=True), "id"]},
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="entry_hash",
            field=models.CharField(max_length=64, null=True),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="prev_hash",
            field=models.CharField(max_length=64, null=True),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="sequence",
            field=models.PositiveBigIntegerField(null=True),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="subject",
            field=models.CharField(max_length=128),
        ),
        migrations.AddIndex(
            model_name="ledgerentry",
            index=models.Index(
                condition=models.Q(("sequence__isnull", True)), fields=["id"], name="ledger_entry_queued"
            ),
        ),
        migrations.AddIndex(
            model_name="ledgerentry",
            index=models.Index(fields=["subject"], name="ledger_entry_subject"),
        ),
        migrations.AddConstraint(
            model_name="ledgerentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(("sequence__isnull", False)),
                fields=("sequence",),
                name="ledger_entry_sequence_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="ledgerentry",
            constraint=models.UniqueConstraint(
                condition=models.Q(("entry_hash__isnull", False)),
                fields=("entry_hash",),
                name="ledger_entry_hash_unique",
            ),
        ),
        migrations.RunPython(_sequencing_triggers, _append_only_triggers),
    ]
