"""Two tenants on one host, each in a real container of its own (issue 33, points 1 to 3 and 6): neither reads the
other's environment, files or processes, reaches the other's ports or the host's, or opens the other's GPU; each
logs in with real OpenSSH, by its own key only, to a server presenting the host key its lease reported.

Sources: Docker's ``docker run`` reference (https://docs.docker.com/reference/cli/docker/container/run/:
``--device``, ``--cap-drop``, ``--security-opt no-new-privileges``, ``--pids-limit``, ``--memory``, ``--cpus``,
``--user``, ``--env-file``: "the file should use the syntax <variable>=value ... lines beginning with # are
treated as comments"); Docker's "Bridge network driver" (https://docs.docker.com/engine/network/drivers/bridge/:
``com.docker.network.bridge.enable_icc``; containers on different user-defined bridges cannot reach each other);
"Packet filtering and firewalls" (https://docs.docker.com/engine/network/packet-filtering-firewalls/: rules for
traffic a container sends to the host itself belong in the host's INPUT chain, not DOCKER-USER); sshd_config(5)
(``AuthorizedKeysFile``, ``HostKey``, ``StrictModes``) and ssh_config(5) (``StrictHostKeyChecking yes``: "ssh
will never automatically add host keys ... and refuses to connect to hosts whose host key has changed").
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.community.containers import FIREWALL_CHAIN, lease_uid, leftovers_clear
from providers.community.devices import FakeDevices
from providers.community.executor import LeaseExecutor
from providers.community.lease_plan import LeasePlan, user_plan
from providers.community.ports import free_ports
from tests.containers import lease_runtime, stand_in_gpus

H100 = ("H100", 80)
SECRET_A = "alpha's $(secret) `value` with spaces, quotes \" and é"


@pytest.fixture
def host() -> Iterator[dict]:
    """A host of four stand-in GPUs with Docker, and every lease made on it torn down afterwards."""
    with tempfile.TemporaryDirectory(prefix="walled-host-") as made:
        root = Path(made)
        runtime = lease_runtime(stand_in_gpus(root / "dev", 4))
        leases: list[LeaseExecutor] = []
        yield {"root": root, "runtime": runtime, "leases": leases}
        for lease in leases:
            lease.stop()


def ed25519_keypair(path: Path) -> tuple[Path, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path, " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _lease(host: dict, name: str, gpu: int, slot: int, keys: tuple[str, ...] = ()) -> LeaseExecutor:
    work = host["root"] / "leases" / name
    plan = LeasePlan(lease_id=name, gpu_indexes=(gpu,), host_ports=free_ports(3), work_dir=work, disk_quota_bytes=10**9,
                     user=user_plan("unused", work), exposed=(8000,), authorized_keys=keys, uid=lease_uid(slot),
                     share=0.25, login_name="lease")  # fmt: skip
    executor = LeaseExecutor(plan, FakeDevices([H100] * 4), simulate=True, disk_poll_s=None, runtime=host["runtime"])
    host["leases"].append(executor)
    return executor


def _inside(executor: LeaseExecutor, command: str) -> subprocess.CompletedProcess[str]:
    """A command inside the lease's container, as the lease's own processes run (its uid, namespaces, cgroup)."""
    assert executor.walls is not None
    return subprocess.run(["docker", "exec", executor.walls.container, "bash", "-c", command],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def _wait_for_file(path: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} was never written")


def _reaches(executor: LeaseExecutor, address: str, port: int) -> bool:
    probe = _inside(executor, f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{port}' && echo open")
    return probe.stdout.strip() == "open"


def _gateway(executor: LeaseExecutor) -> str:
    assert executor.walls is not None
    return subprocess.run(
        ["docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", executor.walls.network],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def _address(executor: LeaseExecutor) -> str:
    assert executor.walls is not None
    return subprocess.run(
        [
            "docker",
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            executor.walls.container,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def test_two_leases_on_one_host_cannot_reach_each_others_secrets_files_processes_or_gpus(host):
    first, second = _lease(host, "i-aaaaaaaaaaaa", gpu=1, slot=0), _lease(host, "i-bbbbbbbbbbbb", gpu=2, slot=1)
    first.start({"kind": "script", "script": "echo ready > ~/ready\nexec sleep 600\n",
                 "env": [{"name": "PUBLIC", "value": "a"}]}, {"env": {"SECRET_A": SECRET_A}}, "lease")  # fmt: skip
    second.start({"kind": "script", "script": "echo ready > ~/ready\nexec sleep 600\n"}, {}, "lease")
    _wait_for_file(first.walls.home / "ready"), _wait_for_file(second.walls.home / "ready")

    # The first lease's secret is in its own environment: the probe below could find it.
    assert "alpha" in _inside(first, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'").stdout
    environs = _inside(second, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; ps -eo user,pid,args")
    assert "alpha" not in environs.stdout and "SECRET_A" not in environs.stdout
    assert "sleep 600" in environs.stdout and str(lease_uid(0)) not in environs.stdout  # its own processes only

    assert _inside(second, "id -u").stdout.strip() == str(lease_uid(1))
    assert _inside(second, f"ls {first.walls.home} 2>&1; ls /home").stdout.split()[-1] == "lease"
    assert _inside(second, "cat ~/ready").stdout == "ready\n"
    assert first.walls.home.stat().st_uid == lease_uid(0) and oct(first.walls.home.stat().st_mode)[-3:] == "700"

    # Only its own GPU's node (and the driver's control node), whatever CUDA_VISIBLE_DEVICES says.
    nodes = _inside(second, "export CUDA_VISIBLE_DEVICES=0,1,2,3; ls /dev | grep nvidia").stdout.split()
    assert nodes == ["nvidia2", "nvidiactl"]
    made = _inside(second, "mknod /tmp/nvidia1 c 195 1 && echo made")
    assert made.stdout == "" and "Operation not permitted" in made.stderr
    assert _inside(second, "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status").stdout.split()[1::2] == ["0" * 16] * 3
    assert _inside(second, "grep NoNewPrivs /proc/self/status").stdout.split() == ["NoNewPrivs:", "1"]


def test_a_lease_reaches_neither_another_leases_ports_nor_the_hosts_own(host):
    # Something of the host's own listening on every address, as a host agent's port does.
    listener = socket.create_server(("0.0.0.0", 0))  # noqa: S104 - the test's stand-in for the agent's port
    agent_port = listener.getsockname()[1]
    threading.Thread(target=lambda: [listener.accept()[0].close() for _ in range(100)], daemon=True).start()
    first, second = _lease(host, "i-cccccccccccc", gpu=0, slot=0), _lease(host, "i-dddddddddddd", gpu=3, slot=1)
    for lease in (first, second):
        lease.start({"kind": "none"}, {}, "lease")
        assert lease.ssh().listening
    gateway = _gateway(second)

    assert _reaches(second, "127.0.0.1", 2222)  # the probe can succeed: its own SSH server answers
    assert not _reaches(second, _address(first), 2222)  # the other lease's container
    assert not _reaches(second, gateway, agent_port)  # the host's own ports
    assert not _reaches(second, gateway, first.plan.host_ports[0])  # the other lease's published SSH port
    with socket.create_connection(("127.0.0.1", first.plan.host_ports[0]), timeout=10) as outside:
        assert outside.recv(8).startswith(b"SSH-2.0")  # what is published for it stays reachable from outside
    listener.close()


def test_the_limits_are_the_leases_share_of_the_host(host):
    lease = _lease(host, "i-eeeeeeeeeeee", gpu=0, slot=0)
    lease.start({"kind": "none"}, {}, "lease")
    runtime = host["runtime"]

    limits = subprocess.run(
        ["docker", "inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}",
         lease.walls.container], capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip

    assert int(limits[0]) == round(max(runtime.host_cpus * 0.25, 0.1), 2) * 1e9
    assert int(limits[1]) == max(int(runtime.host_memory_bytes * 0.25), 256 << 20)
    assert int(limits[2]) == 8192


def test_every_byte_of_an_env_value_reaches_the_containers_script_unchanged(host):
    values = {"QUOTES": "it's \"quoted\"", "DOLLAR": "$HOME and $(touch /tmp/pwned) and `id`", "SPACES": "  a  b  ",
              "UNICODE": "naïve - 東京 ✓", "EQUALS": "a=b=c", "HASH": "#not a comment"}  # fmt: skip
    names = " ".join(sorted(values))
    script = f"python3 - {names} > ~/env.json <<'PY'\nimport json, os, sys\n"
    script += "print(json.dumps({name: os.environ[name] for name in sys.argv[1:]}))\nPY\n"
    lease = _lease(host, "i-ffffffffffff", gpu=0, slot=0)
    lease.start({"kind": "script", "script": script + "exec sleep 600\n",
                 "env": [{"name": k, "value": v} for k, v in values.items()]}, {}, "lease")  # fmt: skip

    seen = json.loads(_wait_for_file(lease.walls.home / "env.json"))
    assert seen == values
    assert _inside(lease, "test -e /tmp/pwned && echo ran").stdout == ""


def test_the_buyer_logs_in_with_real_ssh_to_the_host_key_the_lease_reported_and_only_with_their_key(host, tmp_path):
    private, public = ed25519_keypair(tmp_path / "buyer")
    stranger, _ = ed25519_keypair(tmp_path / "stranger")
    lease = _lease(host, "i-111111111111", gpu=1, slot=0, keys=(public,))
    lease.start({"kind": "none"}, {}, "lease")
    ssh = lease.ssh()
    (host_key,) = lease.host_keys()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{ssh.port} {host_key}\n")

    def login(key: Path, known_hosts: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-i", str(key), "-p", str(ssh.port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
             "lease@127.0.0.1", "--", "id -un; ls /dev | grep nvidia"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    assert ssh.listening
    ok = login(private, known)
    assert (ok.returncode, ok.stdout) == (0, "lease\nnvidia1\nnvidiactl\n")
    refused = login(stranger, known)
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
    impostor = tmp_path / "impostor_known_hosts"
    impostor.write_text(f"[127.0.0.1]:{ssh.port} {public}\n")  # a key the server does not hold
    spoofed = login(private, impostor)
    assert spoofed.returncode == 255 and "Host key verification failed" in spoofed.stderr


def test_terminating_a_walled_lease_leaves_no_container_network_rule_or_directory(host):
    lease = _lease(host, "i-222222222222", gpu=2, slot=0)
    lease.start({"kind": "script", "script": "exec sleep 600\n"}, {}, "lease")
    walls = lease.walls
    rules = subprocess.run(["iptables", "-S", FIREWALL_CHAIN], capture_output=True, text=True, timeout=30).stdout
    assert f"-i {walls.bridge} -j DROP" in rules

    lease.stop()
    lease.stop()  # again: nothing more to do, nothing fails

    assert lease.cleanup["container_removed"] == walls.container and lease.cleanup["work_dir_removed"]
    left = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label=gpu-broker.lease={walls.lease_id}"],
                          capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"name={walls.network}"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    rules = subprocess.run(["iptables", "-S", FIREWALL_CHAIN], capture_output=True, text=True, timeout=30).stdout
    assert (left, networks, walls.bridge in rules) == ("", "", False)


def test_walls_a_killed_run_left_behind_are_cleared_at_the_next_start(host):
    host["runtime"] = dataclasses.replace(host["runtime"], owner="test-leftovers")
    lease = _lease(host, "i-333333333333", gpu=0, slot=0)
    lease.start({"kind": "none"}, {}, "lease")
    walls = lease.walls
    # The run is killed here: nothing of the lease is torn down.

    assert leftovers_clear(host["runtime"]) == 1

    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=gpu-broker.owner=test-leftovers"],
                          capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"name={walls.network}"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    rules = subprocess.run(["iptables", "-S", FIREWALL_CHAIN], capture_output=True, text=True, timeout=30).stdout
    assert (left, networks, walls.bridge in rules) == ("", "", False)
