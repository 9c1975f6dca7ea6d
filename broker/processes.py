"""The image's entrypoint: ``python -m broker.processes <process> [arguments]`` runs one of the broker's process
types (docs/DEPLOY.md) in the foreground, so one image serves every service of the compose file.

``process_command`` is pure: it turns the container's command into the program to run, or raises ``UnknownProcess``
naming what was wrong and what exists, so a misspelt service fails at once with a readable line instead of running
something else. ``main`` replaces itself with that program (``exec``), so the process receives the container's
signals itself: gunicorn and Celery finish their requests and tasks on SIGTERM.

The standard library only, not even the ``broker`` package (which loads Celery): the image's HEALTHCHECK runs
this file as a script every few seconds, and it should cost little. The queue names are those of
``broker.queues``; tests/deploy/test_compose.py holds the two lists equal.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

# Each queue's worker: the name its hostname starts with and its pool size, as docs/DEPLOY.md lists them. The
# ledger's pool is 1: checkpoints and anchors are made one at a time.
WORKER_POOLS: dict[str, tuple[str, int]] = {
    "celery": ("default", 2),
    "provisioning": ("provisioning", 8),
    "sync": ("sync", 4),
    "ledger": ("ledger", 1),
    "webhooks": ("webhooks", 16),
}
QUEUES = tuple(WORKER_POOLS)

PROCESSES = {
    "web": "gunicorn on $BROKER_WEB_PORT (8000), $BROKER_WEB_WORKERS (4) processes",
    "worker": "worker QUEUE: the Celery pool of one queue (" + ", ".join(QUEUES) + ")",
    "beat": "Celery beat, its schedule in $BROKER_VAR_DIR",
    "sequencer": "the ledger sequencer (manage.py ledger sequence --follow)",
    "migrate": "apply the database migrations, then exit",
    "static": "collect the static files into STATIC_ROOT (a volume the proxy serves), then exit",
    "sandboxes": "the emulated clouds and Stripe on $BROKER_SANDBOX_PORT (8701) and the ports after it",
    "manage": "manage COMMAND ...: any manage.py command (demo seed, api_token create, offers sync)",
    "healthcheck": "exit 0 when this container's web process answers GET /healthz (the image's HEALTHCHECK)",
}

PYTHON = sys.executable or "python3"


class UnknownProcess(ValueError):
    """The container's command names no process type, or gives one a wrong argument."""


def _usage(problem: str) -> UnknownProcess:
    listing = "\n".join(f"  {name:<12} {what}" for name, what in PROCESSES.items())
    return UnknownProcess(f"{problem}\nprocesses:\n{listing}")


def process_command(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The program (argv) that runs process ``argv[0]`` with ``env``; arguments after what the process needs are
    passed on to its program (``worker sync --concurrency 2``). Raises ``UnknownProcess``."""
    if not argv:
        raise _usage("no process given")
    name, rest = argv[0], list(argv[1:])
    if name == "web":
        port = env.get("BROKER_WEB_PORT", "8000")
        workers = env.get("BROKER_WEB_WORKERS", "4")
        # Access lines go to stdout with the container's other logs; the request log of Django stays as it is.
        return ["gunicorn", "broker.wsgi:application", "--bind", f"0.0.0.0:{port}", "--workers", workers,
                "--access-logfile", "-", *rest]  # fmt: skip
    if name == "worker":
        if not rest or rest[0] not in WORKER_POOLS:
            raise _usage(f"worker needs a queue: one of {', '.join(QUEUES)} (got {' '.join(rest) or 'none'})")
        queue, options = rest[0], rest[1:]
        host, size = WORKER_POOLS[queue]
        # The prefork pool (Celery's default) is the only one that enforces the tasks' time limits.
        concurrency = env.get("BROKER_WORKER_CONCURRENCY", str(size))
        return ["celery", "-A", "broker", "worker", "--queues", queue, "--hostname", f"{host}@%h",
                "--concurrency", concurrency, "--loglevel", "INFO", *options]  # fmt: skip
    if name == "beat":
        schedule = os.path.join(env.get("BROKER_VAR_DIR", "/var/lib/broker"), "celerybeat-schedule")
        return ["celery", "-A", "broker", "beat", "--schedule", schedule, "--loglevel", "INFO", *rest]
    if name == "sequencer":
        return [PYTHON, "manage.py", "ledger", "sequence", "--follow", *rest]
    if name == "migrate":
        return [PYTHON, "manage.py", "migrate", "--noinput", *rest]
    if name == "static":
        return [PYTHON, "manage.py", "collectstatic", "--noinput", "--clear", "--verbosity", "0", *rest]
    if name == "sandboxes":
        port = env.get("BROKER_SANDBOX_PORT", "8701")
        manifest = os.path.join(env.get("BROKER_VAR_DIR", "/var/lib/broker"), "sandbox.json")
        return [PYTHON, "-m", "sandboxes", "serve", "--host", env.get("BROKER_SANDBOX_HOST", "0.0.0.0"),  # noqa: S104 - a container's port
                "--port", port, "--manifest", manifest, *rest]  # fmt: skip
    if name == "manage":
        if not rest:
            raise _usage("manage needs a manage.py command")
        return [PYTHON, "manage.py", *rest]
    raise _usage(f"unknown process {name!r}")


def healthcheck_host(env: Mapping[str, str]) -> str:
    """The Host header the probe sends: the first name Django accepts (``DJANGO_ALLOWED_HOSTS``), because a host
    it does not allow is answered 400 before the view runs."""
    for host in env.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1").split(","):
        name = host.strip().lstrip(".")
        if name and name != "*":
            return name
    return "127.0.0.1"


def probe_command(running: Sequence[str], hostname: str) -> list[str] | None:
    """How to probe the process ``running`` (the container's first process): None for the web process (GET
    /healthz, below), Celery's ping for a worker, and ``[]`` for the others, whose liveness is that they run
    (the sequencer's and the beat's health are metrics: docs/DEPLOY.md)."""
    # A console script runs under its interpreter: argv is [python, script, ...].
    programs = {os.path.basename(part) for part in running[:2]}
    if "gunicorn" in programs:
        return None
    if "celery" in programs and "worker" in running and "--hostname" in running:
        node = running[running.index("--hostname") + 1].replace("%h", hostname)
        return ["celery", "-A", "broker", "inspect", "ping", "--destination", node, "--timeout", "5"]
    return []


def healthz(env: Mapping[str, str]) -> int:
    """0 when this container's web process answers ``GET /healthz`` with 200 within 5 seconds, else 1. It says
    the request came through TLS, as the proxy in front does, so the HTTPS redirect of a deployed broker
    (``BROKER_BEHIND_TLS_PROXY=1``) answers instead of redirecting."""
    connection = http.client.HTTPConnection("127.0.0.1", int(env.get("BROKER_WEB_PORT", "8000")), timeout=5)
    try:
        connection.request("GET", "/healthz", headers={"Host": healthcheck_host(env), "X-Forwarded-Proto": "https"})
        status = connection.getresponse().status
    except OSError as error:
        print(f"healthz: {error}", file=sys.stderr)
        return 1
    finally:
        connection.close()
    if status != 200:
        print(f"healthz answered {status}", file=sys.stderr)
    return 0 if status == 200 else 1


def healthcheck(env: Mapping[str, str]) -> int:
    """The image's HEALTHCHECK: probes whichever process the container runs (``probe_command``)."""
    try:
        with open("/proc/1/cmdline", "rb") as handle:
            running = [part.decode() for part in handle.read().split(b"\0") if part]
    except OSError:
        running = []
    probe = probe_command(running, socket.gethostname())
    if probe is None:
        return healthz(env)
    if not probe:
        return 0
    return subprocess.run(probe, check=False, stdout=subprocess.DEVNULL).returncode  # noqa: S603 - fixed argv


def main(argv: Sequence[str]) -> int:
    if list(argv) == ["healthcheck"]:
        return healthcheck(os.environ)
    try:
        command = process_command(argv, os.environ)
    except UnknownProcess as error:
        print(error, file=sys.stderr)
        return 2
    os.execvp(command[0], command)  # noqa: S606 - the program is one of the fixed process types above


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
