"""Several management commands in one process, for the run command's start-up.

Each ``manage.py`` pays a whole Django start-up (every app and its SDKs imported, seconds on a busy two-core
machine); the run command used to pay it once per step. Here the steps share one::

    python -m broker.devsteps [--not-before EPOCH] COMMAND [ARGS...] [--then COMMAND [ARGS...]]...

The commands run in order and the first that fails stops the rest (exit code 1, its error on stderr).
``--not-before`` holds the first command until that wall-clock time (seconds since the epoch), so a step that
must wait for something outside (agents registering) spends the wait importing Django instead of after it.
"""

from __future__ import annotations

import os
import sys
import time

import django
from django.core.management import call_command
from django.core.management.base import CommandError

THEN = "--then"


def steps_parse(argv: list[str]) -> tuple[float | None, list[list[str]]]:
    """``(not_before, commands)`` from ``argv``; ``ValueError`` naming what is wrong when it does not parse."""
    not_before = None
    if argv[:1] == ["--not-before"]:
        if len(argv) < 2:
            raise ValueError("--not-before needs a time (seconds since the epoch)")
        try:
            not_before = float(argv[1])
        except ValueError:
            raise ValueError(f"--not-before needs a time in seconds since the epoch, not {argv[1]!r}") from None
        argv = argv[2:]
    commands: list[list[str]] = [[]]
    for word in argv:
        if word == THEN:
            commands.append([])
        else:
            commands[-1].append(word)
    if any(not command for command in commands):
        raise ValueError(f"a command is missing (nothing before or after {THEN}, or no command at all)")
    return not_before, commands


def main(argv: list[str]) -> int:
    try:
        not_before, commands = steps_parse(argv)
    except ValueError as exc:
        print(f"broker.devsteps: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    django.setup()
    if not_before is not None:
        time.sleep(max(0.0, not_before - time.time()))
    for command in commands:
        try:
            call_command(*command)
        except CommandError as exc:
            print(f"manage.py {' '.join(command)}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
