"""The sandbox clouds' machines as real walled containers (issue 33, point 3): where Docker answers, a machine a
sandbox boots from its user data is a container of the lease image with an OpenSSH server presenting the host
key its lease reports, holding the buyer's keys from the boot script's lease file; its end removes it. A
container workload's image, which no registry here can give, is stood in for by the lease image, and the
workload's detail says so. Without Docker, the simulated executor remains (tests/providers/*_sandbox_boot.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from pathlib import Path

import pytest

from providers.boot import render_boot_script
from providers.community.executor import LeaseExecutor
from providers.launch import BootSpec, IngressRule
from sandboxes.boot import Booter, simulated_gpus
from sandboxes.faults import FaultRegistry
from tests.containers import lease_runtime
from tests.sshkeys import ed25519_public, parsed


@pytest.fixture
def booter():
    with tempfile.TemporaryDirectory(prefix="sandbox-walls-") as made:
        booter = Booter(FaultRegistry())
        booter.containers = dataclasses.replace(lease_runtime(Path(made) / "no-gpus"), owner="test-sandbox")
        yield booter
        booter.reset()


def _user_data(workload: dict) -> bytes:
    spec = BootSpec(broker_url="http://127.0.0.1:9", boot_token="bt", agent_sha256="0" * 64,
                    ssh_keys=parsed(ed25519_public()), ingress=(IngressRule(8000, ("10.0.0.0/8",)),),
                    workload=workload)  # fmt: skip
    return render_boot_script(spec, login_user="ubuntu")


def test_a_sandbox_machine_is_a_walled_container_with_the_login_its_lease_reports(booter):
    machine = booter.boot(instance_id="i-0123456789abcdef0", user_data=_user_data({"kind": "none"}),
                          gpus=simulated_gpus("T4", 1, 16))  # fmt: skip
    assert machine is not None and isinstance(machine.executor, LeaseExecutor)
    executor = machine.executor

    detail = executor.start({"kind": "none"}, {}, "ubuntu")
    ssh = executor.ssh()

    assert detail.startswith("container ") and "the lease image" in detail and ssh.listening
    assert [g.name for g in executor.gpus()] == ["Tesla T4"]
    inside = subprocess.run(["docker", "exec", executor.walls.container, "bash", "-c",
                             "id -un; id -u; cat /etc/gpu-broker/authorized_keys"],
                            capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()  # fmt: skip
    assert inside[:2] == ["ubuntu", str(booter.uid_first)]
    assert inside[2].startswith("restrict,pty ssh-ed25519 ")
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(ssh.port), "127.0.0.1"],
                          capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    assert executor.host_keys()[0] in scan  # the key the server presents is the one the lease reports

    booter.halt("i-0123456789abcdef0")

    assert executor.cleanup is not None and executor.cleanup["container_removed"] == executor.walls.container


def test_a_container_workload_no_registry_can_give_is_stood_in_for_and_says_so(booter):
    workload = {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000]}
    machine = booter.boot(instance_id="i-0fedcba9876543210", user_data=_user_data(workload),
                          gpus=simulated_gpus("T4", 1, 16))  # fmt: skip
    assert machine is not None

    detail = machine.executor.start(workload, {}, "ubuntu")

    assert "running the lease image (simulated: vllm/vllm-openai:v0.6.3 cannot be pulled here)" in detail
    assert machine.executor.ssh().listening
