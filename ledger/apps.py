from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created

from ledger.maintenance import wipe_allowed


def _register_sqlite_functions(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function(
            "ledger_maintenance", 0, lambda: int(getattr(wipe_allowed, "on", False)), deterministic=False
        )


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        connection_created.connect(_register_sqlite_functions, dispatch_uid="ledger-sqlite-functions")
        # Registered in every process: receipts queue the prompt signing by the task's name. Imported here, the
        # one place Django allows: the task module imports the models, which load only after this module.
        from ledger import tasks  # noqa: F401
