"""Crash drill: the SIGKILL test of tests/test_crash.py with more runs, on RabbitMQ and PostgreSQL.

    .venv/bin/python bench/crash.py [--runs 100] [--seed N]

Each run starts a real Celery worker, places an order, kills the worker with SIGKILL 0-1 s later and
starts the next; a last worker then finishes everything. It passes when every order runs with exactly
one live machine at the provider and the ledger verifies; it prints where each kill landed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    env = dict(os.environ, BROKER_CRASH_RUNS=str(args.runs))
    env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    env.setdefault("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    if args.seed is not None:
        env["BROKER_CRASH_SEED"] = str(args.seed)
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_crash.py"]
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
