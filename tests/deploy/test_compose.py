"""The compose files (deploy/compose.yaml and its host-services override) and the image's entrypoint
(broker/processes.py) agree: every broker service's command is a process the image runs, every queue has its
pool, every setting the example env file sets is one the broker reads. Docker is not needed; where a compose
tool is installed it validates the files too."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from broker.processes import PROCESSES, WORKER_POOLS, UnknownProcess, healthcheck_host, probe_command, process_command
from broker.queues import QUEUES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BROKER_IMAGE = "${BROKER_IMAGE:-gpu-broker:latest}"


def _services(name: str) -> dict[str, dict]:
    return yaml.safe_load((DEPLOY / name).read_text())["services"]


def _broker_services() -> dict[str, dict]:
    return {name: spec for name, spec in _services("compose.yaml").items() if spec.get("image") == BROKER_IMAGE}


def test_every_broker_service_runs_a_process_the_image_knows():
    services = _broker_services()
    commands = {name: process_command(spec["command"], {}) for name, spec in services.items()}
    assert sorted(services) == sorted(
        ["migrate", "static", "web-1", "web-2", "beat", "sequencer", "sandboxes"]
        + [f"worker-{'default' if queue == 'celery' else queue}" for queue in QUEUES]
    )
    assert commands["web-1"][:2] == ["gunicorn", "broker.wsgi:application"] and commands["web-1"] == commands["web-2"]
    assert commands["migrate"][-3:] == ["manage.py", "migrate", "--noinput"]
    assert commands["sequencer"][-4:] == ["manage.py", "ledger", "sequence", "--follow"]
    assert commands["beat"][:4] == ["celery", "-A", "broker", "beat"]


def test_each_queue_has_a_worker_service_consuming_it_alone():
    assert set(WORKER_POOLS) == set(QUEUES), "broker/processes.py must size a pool for every queue of broker/queues.py"
    consumed = sorted(spec["command"][1] for spec in _broker_services().values() if spec["command"][0] == "worker")
    assert consumed == sorted(QUEUES)
    for queue in QUEUES:
        command = process_command(["worker", queue], {})
        assert command[command.index("--queues") + 1] == queue
        assert command[command.index("--concurrency") + 1] == str(WORKER_POOLS[queue][1])


def test_the_processes_wait_for_the_migrations_and_the_services():
    for name, spec in _broker_services().items():
        if name in {"migrate", "static", "sandboxes"}:
            continue
        assert spec["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert spec["depends_on"]["rabbitmq"] == {"condition": "service_healthy"}, name
    assert _broker_services()["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}


def test_the_host_override_puts_every_broker_process_on_the_hosts_network():
    base, override = _services("compose.yaml"), _services("compose.host-services.yaml")
    assert set(override) <= set(base)
    for name in _broker_services():
        assert override[name]["network_mode"] == "host", name
        assert override[name]["environment"]["DATABASE_URL"].startswith("${HOST_DATABASE_URL:-postgres://"), name
    # Two web nodes on one network need a port each.
    assert {override[f"web-{n}"]["environment"]["BROKER_WEB_PORT"] for n in (1, 2)} == {"8001", "8002"}
    for stand_in in ("postgres", "rabbitmq", "redis"):
        assert override[stand_in]["image"] == BROKER_IMAGE and override[stand_in]["healthcheck"]["test"], stand_in
    assert override["proxy"]["profiles"] == ["proxy"]


def test_the_example_env_file_sets_only_settings_the_broker_reads():
    read = (ROOT / "broker" / "settings.py").read_text() + (ROOT / "broker" / "processes.py").read_text()
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=", (DEPLOY / "broker.env.example").read_text(), flags=re.M)
    unread = [n for n in names if not n.startswith(("POSTGRES_", "RABBITMQ_")) and f'"{n}"' not in read]
    assert unread == []
    # What a deployed broker refuses to start without (docs/DEPLOY.md, "Settings").
    assert {"SECRET_KEY", "BROKER_PUBLIC_URL", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "CELERY_BROKER_URL"} <= set(
        names
    )


def test_the_image_copies_every_package_the_project_ships():
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = sorted(pattern.rstrip("*") for pattern in includes["include"])
    copied = sorted(re.findall(r"^COPY (\w+) /app/\1$", dockerfile, flags=re.M))
    assert copied == sorted([*packages, "templates"])
    assert "ARG BASE=python:3.11-slim" in dockerfile and re.search(r"^USER broker$", dockerfile, flags=re.M)


def test_an_unknown_process_or_a_worker_without_its_queue_is_refused_naming_what_exists():
    with pytest.raises(UnknownProcess, match=r"unknown process 'wbe'(.|\n)*web +gunicorn"):
        process_command(["wbe"], {})
    with pytest.raises(UnknownProcess, match="worker needs a queue: one of celery, provisioning, sync, ledger, "):
        process_command(["worker", "billing"], {})
    with pytest.raises(UnknownProcess, match="no process given"):
        process_command([], {})
    assert set(PROCESSES) >= {"web", "worker", "beat", "sequencer", "migrate", "sandboxes", "manage"}


def test_a_process_takes_its_settings_and_extra_arguments():
    web = process_command(["web", "--timeout", "60"], {"BROKER_WEB_PORT": "8002", "BROKER_WEB_WORKERS": "2"})
    assert web[web.index("--bind") + 1] == "0.0.0.0:8002" and web[web.index("--workers") + 1] == "2"
    assert web[-2:] == ["--timeout", "60"]
    worker = process_command(["worker", "sync"], {"BROKER_WORKER_CONCURRENCY": "1"})
    assert worker[worker.index("--concurrency") + 1] == "1" and worker[worker.index("--hostname") + 1] == "sync@%h"


def test_the_healthcheck_probes_the_process_the_container_runs():
    assert (
        probe_command(["/opt/broker/bin/python3", "/opt/broker/bin/gunicorn", "broker.wsgi:application"], "h") is None
    )
    worker = ["/opt/broker/bin/python3", "/opt/broker/bin/celery", "-A", "broker", "worker", "--hostname", "sync@%h"]
    assert probe_command(worker, "c0ffee") == [
        "celery", "-A", "broker", "inspect", "ping", "--destination", "sync@c0ffee", "--timeout", "5"
    ]  # fmt: skip
    assert probe_command(["/usr/bin/python3", "manage.py", "ledger", "sequence", "--follow"], "h") == []
    assert healthcheck_host({"DJANGO_ALLOWED_HOSTS": ".example.com,broker.example.com"}) == "example.com"
    assert healthcheck_host({"DJANGO_ALLOWED_HOSTS": "*"}) == "127.0.0.1"


@pytest.mark.skipif(
    not (shutil.which("docker-compose") or shutil.which("docker")), reason="no compose tool is installed"
)
def test_a_compose_tool_accepts_the_files(tmp_path):
    tools = [["docker", "compose"], ["docker-compose"]]
    usable = [
        t for t in tools if shutil.which(t[0]) and subprocess.run([*t, "version"], capture_output=True).returncode == 0
    ]
    if not usable:
        pytest.skip("neither docker compose (v2) nor docker-compose answers")
    env_file = DEPLOY / "broker.env"
    made = not env_file.exists()
    if made:  # compose reads the env file while it validates; the example stands in for it
        shutil.copy(DEPLOY / "broker.env.example", env_file)
    try:
        for extra in ([], ["-f", str(DEPLOY / "compose.host-services.yaml")]):
            files = ["-f", str(DEPLOY / "compose.yaml"), *extra]
            done = subprocess.run([*usable[0], *files, "config", "-q"], capture_output=True, text=True, cwd=DEPLOY)
            assert done.returncode == 0, done.stderr
    finally:
        if made:
            env_file.unlink()
