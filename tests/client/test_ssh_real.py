"""``broker ssh ORDER -- command`` into a real lease container (issue 33, point 3): an order on an independent host
whose agent walls each lease off boots by itself against a live broker, and the buyer's own ``ssh`` (Debian's
OpenSSH client) logs in with ``StrictHostKeyChecking=yes`` against the host key the lease reported, runs the
command and prints its output. A key the organisation never registered is refused by the server.

ssh(1): the client offers the identities an ``ssh-agent`` holds (``SSH_AUTH_SOCK``); ssh_config(5),
``StrictHostKeyChecking yes``: never add a host key, refuse a host whose key is not the one known.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from marketplace.catalog.services import offers_sync
from marketplace.models import Order, SshKey
from providers.services import provider_account_connect
from tests.client.conftest import CLIENT_DIR
from tests.containers import lease_runtime, stand_in_gpus
from tests.hosts import start_hosts, stop_hosts

ALL = ["offers:read", "orders:place", "instances:manage", "ledger:read", "keys:manage"]


@pytest.fixture
def walled_host(live_server, transactional_db, acme, alice, tmp_path):
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    runtime = lease_runtime(stand_in_gpus(tmp_path / "dev", 8))
    if not GpuModel.objects.exists():  # a transactional test before this one flushed the seeded rows
        gpu_models_upsert(GpuModel)
    settings.PUBLIC_URL = live_server.url  # the boot script's broker: the machine phones home here
    fleet = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=True, containers=runtime)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


@pytest.fixture
def ssh_agent(tmp_path) -> Iterator[dict[str, str]]:
    """An ``ssh-agent`` of the test's own; its environment for the ``ssh`` the CLI starts."""
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if socket_path.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        yield {"SSH_AUTH_SOCK": str(socket_path)}
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def _keypair(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, timeout=30)  # fmt: skip
    return path.with_suffix(".pub").read_text().strip()


def broker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerclient", *args],
        env={**os.environ, "PYTHONPATH": str(CLIENT_DIR), **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_broker_ssh_runs_a_command_in_the_real_lease_container_and_a_stranger_key_is_refused(
    live_server, walled_host, ssh_agent, acme, alice, tmp_path
):
    from marketplace.api.tokens import api_token_create

    env = {"BROKER_URL": live_server.url,
           "BROKER_TOKEN": api_token_create(organization=acme, user=alice, name="cli", scopes=ALL).raw}  # fmt: skip
    _keypair(tmp_path / "alice")
    assert broker(env, "keys", "add", str(tmp_path / "alice.pub")).returncode == 0
    assert SshKey.objects.filter(organization=acme, name="alice").exists()  # beside the fixture's laptop key
    launched = broker(env, "launch", "--gpu", "H100:8", "--profile", "inference", "--hours", "1",
                      "--wait", "240", "--interval", "0.5")  # fmt: skip
    assert launched.returncode == 0, launched.stdout + launched.stderr
    order = Order.objects.get(organization=acme)
    lease = order.leases.get()
    (instance,) = walled_host[0].instances.values()
    assert instance.executor is not None and instance.executor.walls is not None  # a real container
    assert [key["public_key"] for key in lease.host_keys] == [instance.executor.host_keys()[0]]

    stranger = {**env, **ssh_agent}
    _keypair(tmp_path / "stranger")
    subprocess.run(["ssh-add", "-q", str(tmp_path / "stranger")], env={**os.environ, **ssh_agent}, check=True)
    refused = broker(stranger, "ssh", str(order.public_id), "--", "id -un")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr

    subprocess.run(["ssh-add", "-D", "-q"], env={**os.environ, **ssh_agent}, check=True)
    subprocess.run(["ssh-add", "-q", str(tmp_path / "alice")], env={**os.environ, **ssh_agent}, check=True)
    ran = broker(stranger, "ssh", str(order.public_id), "--", "id -un; ls /dev | grep -c '^nvidia[0-9]'")
    assert (ran.returncode, ran.stdout) == (0, "lease\n8\n"), ran.stderr
    assert "Warning: Permanently added" not in ran.stderr  # the host key was known, never learnt on first use
