"""The broker's image (deploy/image/Dockerfile) runs the broker's own processes: built on a base made from Debian's
packages (no registry answers here), its migrate, web, workers, sequencer and AWS sandbox run as containers on
the host's network against this machine's PostgreSQL (a database of the test's own), RabbitMQ (a vhost of its
own) and Redis, and one order placed through the web container's API runs on the sandbox's machine.

Skipped, saying why, where Docker, mmdebstrap or rabbitmqctl are missing, or the run is not against PostgreSQL
and RabbitMQ. The image is cached by deploy/image/build.sh, so a second run costs the containers' start-up.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "gpu-broker:test"
BOUND_S = 180.0  # the most any one wait below may take, so a broken image fails instead of hanging CI


SEED = (
    "from django.core.management import call_command as run; "
    "run('demo', 'seed', '--sandbox-manifest', '/shared/sandbox.json'); "
    "run('offers', 'sync', '--keep-going'); "
    "run('api_token', 'create', 'alice')"
)


def _docker_answers() -> str:
    """Why the test cannot run here, or ""."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "no Docker daemon answers (bin/containers starts one)"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed: the image's base is made from Debian's packages here"
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed: the containers get a RabbitMQ vhost of their own"
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        return "needs PostgreSQL (DATABASE_URL): containers cannot share the test's SQLite file"
    if not settings.CELERY_BROKER_URL.startswith("amqp"):
        return "needs RabbitMQ (CELERY_BROKER_URL=amqp://...)"
    return ""


WHY_NOT = _docker_answers()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "runs")


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (the sandbox serves one cloud per port)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count >= 65535:
            continue
        taken = False
        for port in range(first, first + count):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    taken = True
        if not taken:
            return first
    raise AssertionError(f"no {count} consecutive free ports")


@pytest.fixture(scope="module")
def image() -> str:
    done = subprocess.run(
        [str(ROOT / "deploy" / "image" / "build.sh"), IMAGE], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"the image did not build:\n{done.stdout}\n{done.stderr}"
    return IMAGE


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database of the test's own on the configured server, dropped afterwards: its URL."""
    db = settings.DATABASES["default"]
    user, host, port = db.get("USER") or "postgres", db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    password = db.get("PASSWORD") or ""
    name = f"gpu_broker_image_{secrets.token_hex(4)}"
    admin = psycopg.connect(host=host, port=port, user=user, password=password, dbname="postgres", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        secret = f":{password}" if password else ""
        yield f"postgres://{user}{secret}@{host}:{port}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def task_broker() -> Iterator[str]:
    """A RabbitMQ vhost of the test's own, so no other test run's worker takes these tasks, nor these workers
    theirs: its URL."""
    parts = urlsplit(settings.CELERY_BROKER_URL)
    vhost = f"gpu_broker_image_{secrets.token_hex(4)}"
    user = parts.username or "guest"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    try:
        subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, user, ".*", ".*", ".*"], check=True,
                       capture_output=True)  # fmt: skip
        yield f"{parts.scheme}://{parts.netloc}/{vhost}"
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], check=False, capture_output=True)


class Containers:
    """The containers a test starts, all removed at its end whatever happened."""

    def __init__(self, image: str, env: dict[str, str]) -> None:
        self.image, self.env, self.names = image, env, []
        self.prefix = f"gpu-broker-test-{secrets.token_hex(3)}"

    def _args(self, env: dict[str, str], volumes: list[str]) -> list[str]:
        args = ["--network", "host"]
        for key, value in {**self.env, **env}.items():
            args += ["--env", f"{key}={value}"]
        for volume in volumes:
            args += ["--volume", volume]
        return args

    def start(self, name: str, *command: str, env: dict[str, str] | None = None, volumes: list[str] = ()) -> str:
        full = f"{self.prefix}-{name}"
        self.names.append(full)
        run = ["docker", "run", "--detach", "--init", "--name", full, *self._args(env or {}, list(volumes))]
        subprocess.run([*run, self.image, *command], check=True, capture_output=True)
        return full

    def once(self, *command: str, env: dict[str, str] | None = None, volumes: list[str] = ()) -> str:
        """Run a one-shot process to its end: its standard output; its output and error when it fails."""
        run = ["docker", "run", "--rm", "--init", *self._args(env or {}, list(volumes)), self.image, *command]
        done = subprocess.run(run, capture_output=True, text=True, timeout=BOUND_S, check=False)
        assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def running(self, name: str) -> bool:
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                               text=True, check=False)  # fmt: skip
        return state.stdout.strip() == "true"

    def logs(self) -> str:
        out = []
        for name in self.names:
            tail = subprocess.run(["docker", "logs", "--tail", "30", name], capture_output=True, text=True, check=False)
            out.append(f"--- {name}\n{tail.stdout}{tail.stderr}")
        return "\n".join(out)

    def remove(self) -> None:
        if self.names:
            subprocess.run(["docker", "rm", "--force", *self.names], capture_output=True, check=False)


def _api(base: str, token: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"}
    request = urllib.request.Request(f"{base}{path}", data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _until(what: str, check, containers: Containers, watched: list[str]):
    """Poll ``check`` until it returns something truthy, failing at once when a watched container died, and
    after BOUND_S seconds in all."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        dead = [name for name in watched if not containers.running(name)]
        assert not dead, f"{', '.join(dead)} exited while waiting for {what}:\n{containers.logs()}"
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {BOUND_S:.0f}s:\n{containers.logs()}")


def test_the_images_processes_provision_an_order_placed_through_its_web_container(
    image, database, task_broker, tmp_path
):
    # Given the image's sandbox (AWS and Stripe) and a state folder it writes its manifest to
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the container's user (uid 10001) writes the manifest there
    sandbox_port, web_port = _free_ports(2), _free_ports(1)
    web = f"http://127.0.0.1:{web_port}"
    env = {
        "DATABASE_URL": database,
        "CELERY_BROKER_URL": task_broker,
        "REDIS_URL": os.environ.get("REDIS_URL", ""),
        "SECRET_KEY": secrets.token_urlsafe(40),
        "LEDGER_SIGNING_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        # DJANGO_DEBUG=1 only because a deployed broker's public URL must be https, and the sandbox's machines
        # phone home to it over plain HTTP here; everything else is as deployed (gunicorn, prefork workers).
        "DJANGO_DEBUG": "1",
        "BROKER_PUBLIC_URL": web,
        "BROKER_PROVISION_POLL_INTERVAL_S": "0.5",
        "BROKER_WORKER_CONCURRENCY": "1",
        "BROKER_WEB_PORT": str(web_port),
        "BROKER_WEB_WORKERS": "1",
    }
    env = {key: value for key, value in env.items() if value}
    containers = Containers(image, env)
    try:
        sandbox = containers.start(
            "sandboxes", "sandboxes", "--only", "aws,stripe",
            env={"BROKER_VAR_DIR": "/shared", "BROKER_SANDBOX_HOST": "127.0.0.1",
                 "BROKER_SANDBOX_PORT": str(sandbox_port)},
            volumes=[f"{shared}:/shared"],
        )  # fmt: skip
        # When the one-shot migrate runs (the sandbox starts meanwhile)
        containers.once("migrate")
        manifest = shared / "sandbox.json"
        _until("sandbox manifest", manifest.exists, containers, [sandbox])
        seeded = {"STRIPE_API_BASE": json.loads(manifest.read_text())["_services"]["stripe"]}

        # and the long-running processes start: web, the provisioning and default workers, the sequencer
        running = [
            sandbox,
            containers.start("web", "web", env=seeded),
            containers.start("worker-provisioning", "worker", "provisioning", env=seeded),
            containers.start("worker-default", "worker", "celery", env=seeded),
            containers.start("sequencer", "sequencer"),
        ]
        # while one more one-shot seeds alice and an AWS account, syncs its offers and makes alice's token (one
        # process for the three commands: each start of Django costs seconds on a busy CI machine)
        out = containers.once("manage", "shell", "--command", SEED, env=seeded, volumes=[f"{shared}:/shared:ro"])
        token = out.strip().splitlines()[-1]
        healthy = ["docker", "exec", running[1], "python3", "/app/broker/processes.py", "healthcheck"]
        _until("healthy web container", lambda: subprocess.run(healthy, capture_output=True).returncode == 0,
               containers, running)  # fmt: skip

        # and alice orders the cheapest on-demand AWS offer through the web container's API
        status, offers = _api(web, token, "GET", "/api/v1/offers?provider=aws&pricing=on_demand&sort=price")
        assert status == 200, offers
        offer = next(o for o in offers["results"] if o["provider"] == "aws" and o["pricing_model"] == "on_demand")
        cap = str(Decimal(offer["price_usd"]) + Decimal("0.01"))
        body = {"offer": offer["id"], "max_price_per_hour": cap, "launch": {"allowed_cidrs": ["127.0.0.1/32"]}}
        status, order = _api(web, token, "POST", "/api/v1/orders", body)
        assert status == 201, order

        # Then the workers provision it and the sandbox's machine reports ready: the order runs
        def settled() -> dict | None:
            got = _api(web, token, "GET", f"/api/v1/orders/{order['id']}")[1]
            return got if got.get("state") in {"running", "failed"} else None

        done = _until("running or failed order", settled, containers, running)
        assert done["state"] == "running", f"{done}\n{containers.logs()}"
        assert done["instance"]["provider_instance_id"].startswith("i-"), done["instance"]
        assert (done["instance"]["instance_type"], done["instance"]["zone"]) == (offer["instance_type"], offer["zone"])
        assert Decimal(done["price_per_hour"]) == Decimal(offer["price_usd"])
        assert done["boot"]["state"] == "ready", done["boot"]
    finally:
        containers.remove()
