"""The reference host agent's per-lease executor (issue 19, item 1): each lease on its own GPUs, ports, disk and
account; a real process runner under ``--simulate`` (only the GPUs are fake); termination kills the lease's
process group and wipes its directory, and says so.

The ``docker run`` argv is checked against the NVIDIA Container Toolkit's "Specialized Configurations with
Docker" (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/1.20.2/docker-specialized.html:
``--gpus '"device=2,3"'`` or ``NVIDIA_VISIBLE_DEVICES``, a list of indexes or UUIDs, MIG instances by UUID) and
Docker's ``docker run`` reference (https://manpages.ubuntu.com/manpages/kinetic/man1/docker-container-run.1.html:
``--storage-opt``, ``--pids-limit``, ``--cap-drop``, ``--security-opt``, ``--label``, ``-p``, ``--user``)."""

from __future__ import annotations

import json
import os
import pwd
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.test import Client

from providers.boot import render_boot_script
from providers.community import protocol
from providers.community.agent import Agent
from providers.community.devices import FakeDevices, visible_devices
from providers.community.executor import DISK_QUOTA_EXCEEDED, LeaseExecutor
from providers.community.executor_base import ExecutorError
from providers.community.host_gpus import parse_simulated
from providers.community.lease_plan import LeasePlan, UserPlan, docker_run_argv, user_plan
from providers.community.ports import PortPool
from providers.launch import BootSpec, IngressRule

KEY_ID, SECRET = "mk_h100host", "s3cret-of-the-machine"
H100 = ("H100", 80)


def _alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


_STARTED: list[LeaseExecutor] = []


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory, and every executor the test made stopped afterwards, even when it failed midway."""
    with tempfile.TemporaryDirectory(prefix="agent-data-") as made:
        yield Path(made)
        while _STARTED:
            _STARTED.pop().stop()


def _plan(data_dir: Path, *, indexes=(1, 2), quota=10**9, exposed=(8000,)) -> LeasePlan:
    work = data_dir / "leases" / "i-abc"
    return LeasePlan(lease_id="i-abc", gpu_indexes=indexes, host_ports=(40000, 40001, 40002), work_dir=work,
                     disk_quota_bytes=quota, user=user_plan("lease-abc", work), exposed=exposed)  # fmt: skip


def _executor(data_dir: Path, **plan: object) -> LeaseExecutor:
    executor = LeaseExecutor(_plan(data_dir, **plan), FakeDevices([H100] * 4), simulate=True, grace_s=0.5,
                             disk_poll_s=None)  # fmt: skip
    _STARTED.append(executor)
    return executor


# --- The agent's GPU bookkeeping --------------------------------------------------------------------------------


@pytest.fixture
def host(data_dir) -> Iterator[Agent]:
    # A long grace: a workload that obeys SIGTERM must never be counted as killed after it, however busy the
    # machine (stopping returns as soon as the group is gone, so the grace costs nothing here).
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET, simulated=parse_simulated("H100:80x8"),
                  launch_seconds=0, lease_threads=False, data_dir=data_dir, grace_s=30, disk_poll_s=None)  # fmt: skip
    agent.public_url = "http://127.0.0.1:7070"
    yield agent
    for instance in list(agent.instances.values()):
        agent._end_lease(instance)


def _call(agent: Agent, method: str, path: str, payload: dict | None = None, **override: str):
    body = json.dumps(payload).encode() if payload is not None else b""
    headers = {**protocol.sign(KEY_ID, SECRET, method, path, body), **override}
    answer = Client(agent).open(path, method=method, data=body, headers=headers)
    return answer.status_code, answer.get_json(), headers, body


def _launch(agent: Agent, token: str, gpus: int, indexes: object = None, boot: str = ""):
    payload: dict = {"client_token": token, "order_ref": "ord-1", "gpus": gpus}
    if indexes is not None:
        payload["gpu_indexes"] = indexes
    if boot:
        payload["boot"] = boot
    status, answer, _, _ = _call(agent, "POST", "/v1/instances", payload)
    return status, answer


def test_two_leases_never_share_a_gpu(host):
    status, first = _launch(host, "ord-1-a1", 2, [2, 1])
    assert (status, first["gpu_indexes"]) == (201, [1, 2])

    status, refused = _launch(host, "ord-2-a1", 2, [2, 3])
    assert (status, refused["code"]) == (409, "gpus_busy")
    assert refused["message"] == "GPUs [2] are held by another lease"
    for asked, gpus in [([8, 9], 2), ([3], 2), ([3, 3], 2), ([True, 3], 2), ("3,4", 2)]:
        status, invalid = _launch(host, "ord-3-a1", gpus, asked)
        assert (status, invalid["code"]) == (400, "invalid"), asked
    assert len(host.instances) == 1  # nothing refused was started

    status, lowest = _launch(host, "ord-4-a1", 3)  # no indexes named: the lowest free ones
    assert (status, lowest["gpu_indexes"]) == (201, [0, 3, 4])
    assert {s["index"] for s in host.telemetry() if s["utilization_pct"] > 50} == {0, 1, 2, 3, 4}

    status, _, _, _ = _call(host, "DELETE", f"/v1/instances/{first['id']}")
    assert status == 200
    status, again = _launch(host, "ord-2-a2", 2, [2, 1])  # free once the first lease ended
    assert (status, again["gpu_indexes"]) == (201, [1, 2])
    status, full = _launch(host, "ord-5-a1", 4)
    assert (status, full["code"]) == (409, "no_capacity")


def test_forged_stale_and_replayed_commands_to_the_agent_are_refused(host):
    status, launched = _launch(host, "ord-1-a1", 1)
    assert status == 201
    path = f"/v1/instances/{launched['id']}"

    forged = protocol.sign(KEY_ID, "not-the-secret", "DELETE", path, b"")
    assert Client(host).delete(path, headers=forged).status_code == 401
    stale = protocol.sign(KEY_ID, SECRET, "DELETE", path, b"", now=time.time() - protocol.MAX_SKEW_S - 5)
    assert Client(host).delete(path, headers=stale).status_code == 401
    # A read's signature does not carry over to a terminate of the same path.
    status, _, launch_headers, _ = _call(host, "GET", path)
    assert Client(host).delete(path, headers=launch_headers).status_code == 401
    assert host.instances[launched["id"]].state == "running"

    status, ended, headers, _ = _call(host, "DELETE", path)
    assert (status, ended["state"]) == (200, "terminated")
    replay = Client(host).delete(path, headers=headers)
    assert (replay.status_code, replay.get_json()["code"]) == (401, "replayed")
    assert host.rejected == ["bad_signature", "stale", "bad_signature", "replayed"]


def _boot(script: str) -> str:
    """A boot script as the broker renders it, for a lease running ``script`` with port 8000 exposed."""
    spec = BootSpec(broker_url="http://127.0.0.1:9", boot_token="bt", agent_sha256="0" * 64, ssh_keys=(),
                    ingress=(IngressRule(8000, ("10.0.0.0/8",)),),
                    workload={"kind": "script", "script": script})  # fmt: skip
    return render_boot_script(spec, login_user="lease").decode()


def test_terminating_a_lease_kills_it_wipes_its_directory_and_reports_the_cleanup(host, data_dir):
    boot = _boot("echo started > up\nexec sleep 300\n")
    status, launched = _launch(host, "ord-1-a1", 2, [5, 6], boot=boot)
    assert status == 201
    executor = host.instances[launched["id"]].executor
    assert executor is not None and executor.plan.gpu_indexes == (5, 6)
    # What the lease agent does once the broker answers the claim: start the workload and expose its port.
    executor.start({"kind": "script", "script": "echo started > up\nexec sleep 300\n"}, {}, "lease")
    work = executor.plan.work_dir
    assert _wait_for(work / "up") == "started\n"
    assert executor.expose([8000]) == [{"port": 8000, "host_port": executor.plan.host_ports[1]}]
    (work / "data.bin").write_bytes(b"x" * 200_000)
    pid = executor._group.process.pid

    status, ended, _, _ = _call(host, "DELETE", f"/v1/instances/{launched['id']}")

    assert (status, ended["state"]) == (200, "terminated")
    cleanup = ended["cleanup"]
    assert cleanup["processes_killed"] == 1 and cleanup["killed_after_grace"] is False
    assert cleanup["bytes_freed"] >= 200_000 and cleanup["work_dir_removed"] is True
    assert cleanup["ports_released"] == list(executor.plan.host_ports) and len(cleanup["ports_released"]) == 16
    assert not _alive(pid) and not work.exists()
    assert host.ports.held == {} and host._held_gpus() == {}


def test_real_hosts_give_each_lease_its_own_block_of_ports():
    pool = PortPool(40000, per_lease=4)
    assert pool.take("i-a") == (40000, 40001, 40002, 40003)
    assert pool.take("i-b") == (40004, 40005, 40006, 40007)
    assert pool.release("i-a") == (40000, 40001, 40002, 40003)
    assert pool.take("i-c") == (40000, 40001, 40002, 40003)


# --- The process runner ------------------------------------------------------------------------------------------


def test_the_workload_runs_in_its_own_session_on_its_own_gpus_and_ports(data_dir):
    executor = _executor(data_dir)
    script = (
        'echo "$CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES $LEASE_PORTS $LEASE_PORT_8000 $PWD" > seen\nsleep 300\n'
    )
    # The buyer's own variables cannot widen the lease to other GPUs.
    executor.start({"kind": "script", "script": script, "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1,2,3"}]},
                   {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "lease")  # fmt: skip
    seen = _wait_for(executor.plan.work_dir / "seen")
    assert seen == f"1,2 1,2 40001,40002 40001 {executor.plan.work_dir}\n"
    pid = executor._group.process.pid
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid  # a session and a group of its own, not the agent's
    assert executor.workload_state() == {"state": "running"}
    assert [g.index for g in executor.gpus()] == [1, 2]
    assert [s["index"] for s in executor.telemetry()] == [1, 2]
    executor.stop()
    assert executor.workload_state()["state"] == "exited"


def test_a_process_that_ignores_sigterm_is_killed_with_its_whole_group(data_dir):
    executor = _executor(data_dir)
    script = "trap '' TERM\nsleep 300 &\necho $! > child\nwait\n"
    executor.start({"kind": "script", "script": script}, {}, "lease")
    child = int(_wait_for(executor.plan.work_dir / "child"))
    leader = executor._group.process.pid
    assert _alive(child) and _alive(leader)

    executor.stop()

    assert executor.cleanup["processes_killed"] == 2
    assert executor.cleanup["killed_after_grace"] is True
    assert not _alive(child) and not _alive(leader)
    assert not executor.plan.work_dir.exists()
    executor.stop()  # twice is once
    assert executor.cleanup["processes_killed"] == 2


def test_a_lease_filling_its_disk_is_stopped_and_the_host_keeps_its_space(data_dir):
    executor = _executor(data_dir, quota=1_000_000)
    script = "head -c 3000000 /dev/zero > fill\necho written > done\nexec sleep 300\n"
    executor.start({"kind": "script", "script": script}, {}, "lease")
    _wait_for(executor.plan.work_dir / "done")
    pid = executor._group.process.pid

    assert executor.check_disk() is True

    assert executor.problem == DISK_QUOTA_EXCEEDED
    assert executor.workload_state() == {"state": "exited", "exit_code": -1}
    assert not _alive(pid)
    assert executor.check_disk() is True and executor.problem == DISK_QUOTA_EXCEEDED  # once
    executor.stop()
    assert executor.cleanup["bytes_freed"] >= 3_000_000 and not executor.plan.work_dir.exists()


def test_a_lease_within_its_quota_keeps_running(data_dir):
    executor = _executor(data_dir, quota=10_000_000)
    executor.start({"kind": "script", "script": "head -c 100000 /dev/zero > fill\nexec sleep 300\n"}, {}, "lease")
    assert executor.check_disk() is False
    assert executor.workload_state() == {"state": "running"} and executor.problem == ""
    executor.stop()


def test_a_container_without_docker_is_stood_in_for_by_a_real_process_on_the_lease_ports(data_dir):
    executor = _executor(data_dir)
    executor.plan = LeasePlan(**{**executor.plan.__dict__, "host_ports": tuple(_free_ports(3))})
    executor.start({"kind": "container", "image": "vllm/vllm-openai:v0.6.3"}, {}, "lease")
    host_port = executor.plan.host_ports[1]
    assert executor.expose([8000]) == [{"port": 8000, "host_port": host_port}]
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{host_port}", timeout=5) as answer:
        assert answer.read() == b"simulated workload (container) on the machine's port 8000\n"
    ssh = executor.ssh()
    assert (ssh.listening, ssh.port) == (True, executor.plan.host_ports[0])
    executor.stop()
    assert executor.cleanup["processes_killed"] == 1


def _free_ports(count: int) -> list[int]:
    import socket

    held = [socket.socket() for _ in range(count)]
    for probe in held:
        probe.bind(("127.0.0.1", 0))
    ports = [int(p.getsockname()[1]) for p in held]
    for probe in held:
        probe.close()
    return ports


# --- Docker, users and MIG (planned, not run: no Docker or GPUs here) ------------------------------------------------


def test_the_docker_run_pins_gpus_quota_ports_and_drops_privileges(data_dir):
    plan = _plan(data_dir)
    workload = {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "command": ["python", "-m", "vllm"],
                "args": ["--port", "8000"], "shm_size_gb": 16}  # fmt: skip
    env_file = data_dir / "workload.env"

    argv = docker_run_argv(plan, workload, devices=["1", "2"], mig=False, env_file=env_file, user="1001:1001")

    assert argv == [
        "docker", "run", "-d", "--name", "gpu-broker-i-abc", "--label", "gpu-broker.lease=i-abc",
        "--gpus", '"device=1,2"',
        "--storage-opt", "size=1000000000",
        "--user", "1001:1001", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--pids-limit", "4096",
        "-p", "40000:22", "-p", "40001:8000",
        "--shm-size", "16g",
        "--env-file", str(env_file),
        "--entrypoint", "python", "vllm/vllm-openai:v0.6.3", "-m", "vllm", "--port", "8000",
    ]  # fmt: skip
    assert "--privileged" not in argv and "root" not in argv


def test_mig_instances_are_what_a_lease_on_a_mig_gpu_sees(data_dir):
    mig = {1: ["MIG-aaaa-1111", "MIG-aaaa-2222"]}
    assert visible_devices((1, 2), mig) == ["MIG-aaaa-1111", "MIG-aaaa-2222", "2"]
    argv = docker_run_argv(_plan(data_dir), {"image": "img"}, devices=visible_devices((1,), mig), mig=True,
                           env_file=data_dir / "e", user="1001:1001")  # fmt: skip
    assert argv[7:12] == ["--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=MIG-aaaa-1111,MIG-aaaa-2222",
                          "--storage-opt"]  # fmt: skip
    executor = LeaseExecutor(_plan(data_dir, indexes=(1,)), FakeDevices([H100] * 4, mig), simulate=True)
    assert executor.environment({}, {})["CUDA_VISIBLE_DEVICES"] == "MIG-aaaa-1111,MIG-aaaa-2222"


def test_the_lease_account_is_planned_unprivileged_and_not_created_when_simulated(data_dir):
    plan = user_plan("lease-abc", data_dir / "leases" / "i-abc")
    assert plan.useradd == ("useradd", "--home-dir", str(data_dir / "leases" / "i-abc"), "--no-create-home",
                            "--shell", "/bin/bash", "--user-group", "--no-log-init", "lease-abc")  # fmt: skip
    assert not any(flag in plan.useradd for flag in ("-G", "--groups", "-o", "--non-unique", "-u"))
    executor = _executor(data_dir)
    executor.start({"kind": "none"}, {}, "lease")
    with pytest.raises(KeyError):
        pwd.getpwnam("lease-abc")
    assert executor.user_created is False
    executor.stop()
    assert executor.cleanup["user"] == "lease-abc"


def test_a_real_root_agent_never_runs_a_workload_as_root(data_dir):
    if os.geteuid() != 0:
        pytest.skip("only a root agent could run the workload as root")
    # The lease's account cannot be made (useradd refuses): the lease fails rather than run as root.
    refusing = UserPlan(name="lease-abc", useradd=("false",), userdel=("true",))
    plan = LeasePlan(**{**_plan(data_dir).__dict__, "user": refusing})
    executor = LeaseExecutor(plan, FakeDevices([H100] * 4), simulate=False, docker="/nonexistent")

    with pytest.raises(ExecutorError, match="useradd failed"):
        executor.start({"kind": "script", "script": "id -u > uid\n"}, {}, "lease")

    assert executor._group is None and not (plan.work_dir / "uid").exists()


def test_the_agent_reports_a_lease_stopped_for_filling_its_disk(data_dir):
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET, simulated=parse_simulated("H100:80x8"),
                  launch_seconds=0, lease_threads=False, data_dir=data_dir, grace_s=0.5, disk_poll_s=None,
                  disk_quota_bytes=500_000)  # fmt: skip
    script = "head -c 2000000 /dev/zero > fill\necho written > done\nexec sleep 300\n"
    status, launched = _launch(agent, "ord-1-a1", 1, boot=_boot(script))
    executor = agent.instances[launched["id"]].executor
    assert status == 201 and executor is not None
    _STARTED.append(executor)
    executor.start({"kind": "script", "script": script}, {}, "lease")
    _wait_for(executor.plan.work_dir / "done")

    assert executor.check_disk() is True

    status, described, _, _ = _call(agent, "GET", f"/v1/instances/{launched['id']}")
    assert (status, described["problem"]) == (200, "disk quota exceeded")
    status, ended, _, _ = _call(agent, "DELETE", f"/v1/instances/{launched['id']}")
    assert ended["cleanup"]["bytes_freed"] >= 2_000_000 and not executor.plan.work_dir.exists()


def test_a_restarted_agent_skips_a_lease_record_it_cannot_read_and_resumes_nothing_from_it(data_dir, caplog):
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET, simulated=parse_simulated("H100:80x8"),
                  launch_seconds=0, lease_threads=False, data_dir=data_dir, disk_poll_s=None)  # fmt: skip
    state = data_dir / "state"
    state.mkdir(mode=0o700)
    (state / "i-0123456789ab.json").write_text("{not json")
    (state / "i-ba9876543210.json").write_text(json.dumps({"id": "i-ba9876543210", "gpus": 1}))  # fields missing

    assert agent.recover() == []

    assert agent.instances == {} and agent.ports.held == {}
    assert [r.message.split(":")[0] for r in caplog.records if r.levelname == "ERROR"] == [
        "cannot resume the lease recorded in i-0123456789ab.json",
        "cannot resume the lease recorded in i-ba9876543210.json",
    ]
