"""A sandbox machine stopped and started again (issue 36): its agent stops with it and a fresh one starts on the
same machine (same lease file, the key it kept at first boot), so it re-attaches to its lease instead of spending
the boot token again; a machine that is a container is stopped, never removed, and started again as the same
container with the same disk. Docker is not needed for what is checked here: a stand-in ``docker`` program
records what the sandbox asks of it (as tests/providers/test_lease_resume.py does)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from providers.boot import render_boot_script
from providers.community.containers import ContainerRuntime
from providers.community.executor import LeaseExecutor
from providers.community.lease_executors import SimulatedExecutor
from providers.launch import BootSpec, IngressRule
from sandboxes.boot import Booter, BootMode, simulated_gpus
from sandboxes.faults import FaultRegistry
from tests.sshkeys import ed25519_public, parsed

INSTANCE = "i-0123456789abcdef0"


def _user_data() -> bytes:
    spec = BootSpec(broker_url="http://127.0.0.1:9", boot_token="bt", agent_sha256="0" * 64,
                    ssh_keys=parsed(ed25519_public()), ingress=(IngressRule(8000, ("10.0.0.0/8",)),),
                    workload={"kind": "none"})  # fmt: skip
    return render_boot_script(spec, login_user="ubuntu")


@pytest.fixture
def booter():
    booter = Booter(FaultRegistry())
    yield booter
    booter.reset()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_stopped_machine_answers_nothing_and_starts_again_on_its_lease(booter):
    first = booter.boot(instance_id=INSTANCE, user_data=_user_data(), gpus=simulated_gpus("T4", 1, 16))
    assert first is not None and isinstance(first.executor, SimulatedExecutor)
    port = first.executor.ssh().port
    assert _answers(port)

    booter.power_off(INSTANCE)

    assert booter.powered_off(INSTANCE) and not _answers(port)
    with pytest.raises(KeyError):
        booter.machine(INSTANCE)
    booter.power_off(INSTANCE)  # off already: nothing more happens

    again = booter.power_on(INSTANCE)

    assert again is not None and again is booter.machine(INSTANCE) and again is not first
    assert again.lease == first.lease and again.key_file == first.key_file  # same machine, same kept key
    assert again.agent.key_file == first.key_file
    assert [g.name for g in again.executor.gpus()] == ["Tesla T4"]
    assert again.executor.ssh().listening
    assert booter.power_on(INSTANCE) is None  # running already: nothing to start
    assert [r.outcome for r in booter.records] == ["booted", "powered_off", "started_again"]


def test_a_machine_that_never_booted_an_agent_is_left_alone(booter):
    assert booter.boot(instance_id=INSTANCE, user_data=None, gpus=[]) is None

    booter.power_off(INSTANCE)

    assert not booter.powered_off(INSTANCE) and booter.power_on(INSTANCE) is None


def test_a_container_machine_is_stopped_not_removed_and_started_again_as_the_same_container(booter, tmp_path):
    calls = tmp_path / "docker-calls"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$*" >>{calls}\nexit 0\n')
    docker.chmod(0o755)
    booter.containers = ContainerRuntime(docker=str(docker), dev_root=tmp_path / "no-gpus", firewall=False,
                                         publish_address="127.0.0.1", owner="test-sandbox")  # fmt: skip
    first = booter.boot(instance_id=INSTANCE, user_data=_user_data(), gpus=simulated_gpus("T4", 1, 16))
    assert first is not None and isinstance(first.executor, LeaseExecutor) and first.executor.walls is not None
    container = first.executor.walls.container

    booter.power_off(INSTANCE)

    assert calls.read_text().splitlines() == [f"stop {container}"]
    again = booter.power_on(INSTANCE)
    assert again is not None and isinstance(again.executor, LeaseExecutor) and again.executor.walls is not None
    assert again.executor.walls.container == container
    assert again.executor.plan == first.executor.plan  # same uid, ports, work directory: the same disk

    booter.halt(INSTANCE)  # terminated: now it goes

    assert f"rm -f {container}" in calls.read_text().splitlines()
    assert os.path.exists(calls) and not Path(first.executor.plan.work_dir).exists()


def test_a_machine_stopped_while_it_still_boots_never_starts_its_agent(booter):
    booter.mode = BootMode.THREAD
    booter.start_delay_s = 3600.0  # a machine that takes its time to boot (sandboxes serve --boot-delay)
    machine = booter.boot(instance_id=INSTANCE, user_data=_user_data(), gpus=simulated_gpus("T4", 1, 16))
    assert machine is not None and machine.thread is not None and machine.thread.is_alive()

    booter.power_off(INSTANCE)

    # The stop ended the wait at once: the thread is gone and the agent never took a step (it would have failed
    # to phone home to the closed port in its lease).
    assert not machine.thread.is_alive()
    assert machine.agent.state == "booting"
