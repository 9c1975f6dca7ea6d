"""``python -m brokerclient`` is the ``broker`` command."""

from brokerclient.cli import run

run()
