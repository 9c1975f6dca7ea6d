"""A host that reboots under a running lease (issue 33, point 4): the host agent, a real process, is killed with
SIGKILL, the lease's container is stopped and the host's firewall rules are gone, as after a power cut; the agent
is started again as its service would be at boot, and with no buyer action the lease's container runs again (the
same one, never a second), fenced by its rule again, and its heartbeats reach the broker again.

The state the agent keeps to do this (each lease's record and its key, root-only) is in its ``--data-dir``.
iptables(8): rules live in the kernel and do not outlive a reboot, which is why the agent, not Docker's restart
policy, starts a lease's container again once the rule is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from marketplace.catalog.services import offers_sync
from marketplace.models import Order
from providers.community.containers import FIREWALL_CHAIN
from providers.community.ports import free_ports
from providers.community.services import machine_list
from providers.models import Machine, MachineState
from providers.services import provider_account_connect
from tests.client.conftest import CLIENT_DIR
from tests.containers import lease_runtime
from tests.hosts import LISTING

ROOT = Path(__file__).resolve().parents[2]
ALL = ["offers:read", "orders:place", "instances:manage", "ledger:read", "keys:manage"]


def _wait(predicate, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=False).stdout.strip()


@pytest.fixture
def host_process(live_server, transactional_db, acme, alice, tmp_path):
    """A listed, verified machine whose agent runs as its own process with a data directory that survives it."""
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    lease_runtime(tmp_path)  # skips where real containers cannot run; builds the lease image
    if not GpuModel.objects.exists():
        gpu_models_upsert(GpuModel)
    settings.PUBLIC_URL = live_server.url
    settings.PROVIDER_ENDPOINTS = "public+loopback"  # the agent registers at its loopback URL
    fleet = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    listed = machine_list(account=fleet, name="fra-h100-1", listing=dict(LISTING))
    secret = tmp_path / "secret"
    secret.write_text(listed.secret)
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "providers.community.agent", "--broker", live_server.url,
            "--key-id", listed.machine.key_id, "--secret-file", str(secret), "--listen", f"127.0.0.1:{port}",
            "--public-url", f"http://127.0.0.1:{port}", "--simulate", "H100:80x8", "--launch-seconds", "0",
            "--data-dir", str(tmp_path / "data")]  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"agent-{len(processes)}.log", "wb")
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    start()
    _wait(lambda: Machine.objects.filter(pk=listed.machine.pk, registered_at__isnull=False).exists(),
          "the agent's registration")  # fmt: skip
    Machine.objects.filter(pk=listed.machine.pk).update(state=MachineState.VERIFIED, online=True)
    assert offers_sync(account_id=fleet.pk).ok
    yield start, processes, tmp_path
    for process in processes:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
    for container in _docker("ps", "-aq", "--filter", "label=gpu-broker.lease").split():
        _docker("rm", "-f", container)


def test_a_rebooted_host_brings_its_lease_back_heartbeating_with_no_buyer_action(host_process, live_server, acme,
                                                                                   alice):  # fmt: skip
    from marketplace.api.tokens import api_token_create

    start, processes, tmp_path = host_process
    env = {**os.environ, "PYTHONPATH": str(CLIENT_DIR), "BROKER_URL": live_server.url,
           "BROKER_TOKEN": api_token_create(organization=acme, user=alice, name="cli", scopes=ALL).raw}  # fmt: skip
    launched = subprocess.run(
        [sys.executable, "-m", "brokerclient", "launch", "--gpu", "H100:8", "--profile", "inference", "--hours", "1",
         "--run", "exec sleep 3600", "--wait", "240", "--interval", "0.5"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout + launched.stderr
    order = Order.objects.get(organization=acme)
    lease = order.leases.get()
    (container,) = _docker("ps", "-q", "--no-trunc", "--filter", "label=gpu-broker.lease").split()

    # The power cut: the agent dies at once, the container stops, the kernel's rules are gone.
    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait(timeout=30)
    _docker("kill", container)
    subprocess.run(["iptables", "-F", FIREWALL_CHAIN], check=True, timeout=30)
    cut = timezone.now()
    assert _docker("inspect", "-f", "{{.State.Running}}", container) == "false"

    start()  # the service starting again at boot

    # The re-attached agent asks the broker first (a heartbeat), then starts the container: wait for both.
    _wait(lambda: order.leases.filter(pk=lease.pk, last_heartbeat_at__gt=cut).exists(), "a heartbeat after the boot")
    _wait(lambda: _docker("inspect", "-f", "{{.State.Running}}", container) == "true", "the container again")
    restarted = timezone.now()
    _wait(lambda: order.leases.filter(pk=lease.pk, last_heartbeat_at__gt=restarted).exists(),
          "a heartbeat once the container runs again")  # fmt: skip
    # The same container, never a second for this lease (containers other tests' leases left are not its own).
    lease_label = _docker("inspect", "-f", '{{index .Config.Labels "gpu-broker.lease"}}', container)
    assert _docker("ps", "-aq", "--no-trunc", "--filter", f"label=gpu-broker.lease={lease_label}").split() == [
        container
    ]
    bridge = "gb-" + lease_label[-12:]
    rules = subprocess.run(["iptables", "-S", FIREWALL_CHAIN], capture_output=True, text=True, timeout=30).stdout
    assert f"-i {bridge} -j DROP" in rules
    order.refresh_from_db()
    assert order.state == "running"
    assert "resumed 1 lease(s)" in (tmp_path / "agent-1.log").read_text()
    lease.refresh_from_db()
    assert lease.claimed_at is not None and lease.state == "ready"  # one claim: the token was never spent again
