"""Fill the new leaf hashes, then make the ledger tables append-only in the database itself.

PostgreSQL: a trigger function refuses UPDATE and DELETE on every row and TRUNCATE on the table; TRUNCATE
passes only in a session that set ``ledger.maintenance = 'on'`` (``ledger.services.ledger_allow_wipe``: how a
test database is flushed). SQLite: triggers refuse UPDATE, and DELETE unless the connection's
``ledger_maintenance()`` function (registered in ``ledger.apps``) says the same. Errors are integrity errors.

A later migration that makes Django rebuild one of these tables on SQLite (most ALTERs there) drops its
triggers with the old table and must create them again; ``tests/ledger/test_append_only.py`` would notice.
"""

from django.db import migrations

TABLES = ("ledger_ledgerentry", "ledger_checkpoint", "ledger_anchor")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' AND current_setting('ledger.maintenance', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'ledger table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
"""


def _fill_leaf_hashes(apps, schema_editor):
    from ledger import merkle
    from ledger.services import entry_envelope

    entry_model = apps.get_model("ledger", "LedgerEntry")
    for entry in entry_model.objects.filter(leaf_hash="").iterator():
        envelope = entry_envelope(
            sequence=entry.sequence,
            kind=entry.kind,
            subject=entry.subject,
            created_at=entry.created_at,
            payload_hash=entry.payload_hash,
            prev_hash=entry.prev_hash,
        )
        entry_model.objects.filter(pk=entry.pk).update(leaf_hash=merkle.leaf_hash(envelope).hex())


def _create_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FUNCTION, params=None)  # no placeholders: its % are RAISE format markers
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()"
            )
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change()"
            )
    elif vendor == "sqlite":
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN "
                f"SELECT RAISE(ABORT, 'ledger table {table} is append-only: UPDATE refused'); END"
            )
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} WHEN NOT ledger_maintenance() BEGIN "
                f"SELECT RAISE(ABORT, 'ledger table {table} is append-only: DELETE refused'); END"
            )


def _drop_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in TABLES:
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        elif vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
    if vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS ledger_refuse_change()")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_merkle_checkpoints")]

    operations = [
        migrations.RunPython(_fill_leaf_hashes, migrations.RunPython.noop),
        migrations.RunPython(_create_triggers, _drop_triggers),
    ]
