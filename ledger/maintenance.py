"""The per-thread switch that lets a session empty the append-only ledger tables (a test database's flush, and
nothing else). ``ledger.services.ledger_allow_wipe`` turns it on and off; on SQLite the tables' triggers read it
through the SQL function ``ledger.apps`` registers on each connection. Django-free, so the app's configuration
can import it before the models load."""

from __future__ import annotations

import threading

# SQLite has no session settings: the append-only triggers ask this per-thread flag through a SQL function.
wipe_allowed = threading.local()
