"""What the lease agent does when it starts again on a machine whose lease it had claimed (issue 33, point 4):
the container workload is started again with ``docker start``, never run a second time (Docker is not installed
here, so a stand-in ``docker`` program records what it is asked); a key the broker no longer knows stops the
agent for good; and the key file is replaced atomically, readable by root alone."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from providers.community.executor_base import ExecutorError
from providers.community.lease import LeaseAgent, write_private
from providers.community.lease_executors import CONTAINER_NAME, HostExecutor, SimulatedExecutor, parse_simulated

CONTAINER = {"kind": "container", "image": "ghcr.io/acme/train:1", "env": []}


def _stand_in_docker(tmp_path: Path, monkeypatch, *, inspect: str, inspect_status: int = 0) -> Path:
    """A ``docker`` on the PATH that logs its arguments and answers ``inspect`` with ``inspect``."""
    calls = tmp_path / "docker-calls"
    program = tmp_path / "bin" / "docker"
    program.parent.mkdir()
    program.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >>{calls}\n'
        f'if [ "$1" = inspect ]; then echo {inspect}; exit {inspect_status}; fi\n'
        "exit 0\n"
    )
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_stopped_container_is_started_again_not_run_a_second_time(tmp_path, monkeypatch):
    calls = _stand_in_docker(tmp_path, monkeypatch, inspect="false")

    detail = HostExecutor(work_dir=tmp_path).resume(CONTAINER, {}, "ubuntu")

    assert detail == f"container {CONTAINER_NAME} started again"
    assert calls.read_text().splitlines() == [f"inspect -f {{{{.State.Running}}}} {CONTAINER_NAME}",
                                              f"start {CONTAINER_NAME}"]  # fmt: skip


def test_a_container_docker_restarted_itself_is_left_running(tmp_path, monkeypatch):
    calls = _stand_in_docker(tmp_path, monkeypatch, inspect="true")

    HostExecutor(work_dir=tmp_path).resume(CONTAINER, {}, "ubuntu")

    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["inspect"]


def test_a_container_that_is_gone_is_named_and_not_replaced(tmp_path, monkeypatch):
    calls = _stand_in_docker(tmp_path, monkeypatch, inspect="", inspect_status=1)

    with pytest.raises(ExecutorError, match=f"{CONTAINER_NAME} is gone"):
        HostExecutor(work_dir=tmp_path).resume(CONTAINER, {}, "ubuntu")
    assert "run" not in [line.split()[0] for line in calls.read_text().splitlines()]


def test_a_kept_key_the_broker_refuses_stops_the_agent_without_starting_the_workload(tmp_path):
    key_file = tmp_path / "agent.key"
    write_private(key_file, json.dumps({"key_id": "lk_gone", "secret": "s", "heartbeat_s": 1}).encode())
    asked: list[str] = []

    def broker(method, target, body, headers):
        asked.append(target)
        return 401, json.dumps({"code": "unknown_key", "message": "unknown key"}).encode()

    executor = SimulatedExecutor(parse_simulated("Tesla T4:16x1"))
    lease = {"broker_url": "http://broker.invalid", "boot_token": "bt_spent", "workload": CONTAINER}
    state = LeaseAgent(lease, executor, transport=broker, key_file=key_file).run()

    assert state == "key_refused"
    assert asked == ["/agent/v1/lease/heartbeat"]  # never the claim: the token was spent long ago
    assert executor.workload_state() == {"state": "none"}


def test_the_key_file_is_replaced_whole_and_readable_by_its_owner_alone(tmp_path):
    key_file = tmp_path / "agent.key"
    write_private(key_file, b"old")
    key_file.chmod(0o644)

    write_private(key_file, b'{"key_id": "lk_1"}')

    assert key_file.read_bytes() == b'{"key_id": "lk_1"}'
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["agent.key"]  # no temporary file left behind


class DriverLoading(SimulatedExecutor):
    """A machine just rebooted: nvidia-smi does not answer yet."""

    def telemetry(self):
        raise ExecutorError("nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_a_gpu_driver_still_loading_after_the_reboot_does_not_stop_the_workload_coming_back(tmp_path):
    key_file = tmp_path / "agent.key"
    write_private(key_file, json.dumps({"key_id": "lk_1", "secret": "s", "heartbeat_s": 1}).encode())
    executor = DriverLoading(parse_simulated("Tesla T4:16x1"))
    lease = {"broker_url": "http://broker.invalid", "boot_token": "bt_spent", "workload": CONTAINER}

    def unreachable(method, target, body, headers):
        raise OSError("no route to host")

    state = LeaseAgent(lease, executor, transport=unreachable, key_file=key_file).reattach()

    assert state == "running"
    assert executor.workload_state() == {"state": "running"}
