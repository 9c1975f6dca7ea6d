"""Drill: two tenants on one host try to rob each other, with and without the walls.

    .venv/bin/python bench/lease_isolation.py [--rounds 3]

Needs root and a Docker daemon (``bin/containers`` starts one and builds the lease image). On a host with four
stand-in GPUs (device nodes made with ``mknod``) it starts two leases of one GPU each twice over:

- **walled**: each in its own container (``providers/community/containers.py``), as a host sold per GPU runs them;
- **bare**: as processes sharing the host (the runner of a host that cannot isolate, sold whole only), the
  baseline of what the walls are for.

The first tenant keeps a secret in its environment and a file in its home and listens on its SSH port; the
second then tries each escape of issue 33 from inside its own lease (its uid, namespaces and cgroup) and the
drill prints, per escape, whether it held. It also times a lease from start to its SSH server answering, walled
against bare, over ``--rounds`` rounds, and prints the ratio. It exits non-zero when any escape got through the
walls.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.community.containers import ContainerRuntime, lease_uid, runtime_probe
from providers.community.devices import FakeDevices
from providers.community.executor import LeaseExecutor
from providers.community.lease_plan import LeasePlan, user_plan
from providers.community.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
SECRET = "tenant-one-secret-4f1d"  # noqa: S105 - the bait, not a credential


def _stand_in_gpus(directory: Path, count: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        os.mknod(directory / f"nvidia{index}", 0o666 | 0o020000, os.makedev(195, index))
    os.mknod(directory / "nvidiactl", 0o666 | 0o020000, os.makedev(195, 255))
    return directory


def _lease(root: Path, name: str, gpu: int, slot: int, runtime: ContainerRuntime | None) -> LeaseExecutor:
    work = root / "leases" / name
    plan = LeasePlan(lease_id=name, gpu_indexes=(gpu,), host_ports=free_ports(2), work_dir=work,
                     disk_quota_bytes=10**9, user=user_plan("unused", work), uid=lease_uid(slot),
                     share=0.25)  # fmt: skip
    return LeaseExecutor(plan, FakeDevices([("H100", 80)] * 4), simulate=True, disk_poll_s=None, runtime=runtime)


def _in_lease(lease: LeaseExecutor, command: str) -> str:
    """A command as the lease's own processes run: inside its container, or (bare) as its process would."""
    if lease.walls is not None:
        argv = ["docker", "exec", lease.walls.container, "bash", "-c", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout
    env = lease.environment({}, {})
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False,
                          env=env, cwd=lease.plan.work_dir).stdout  # fmt: skip


def _docker_field(template: str, *what: str) -> str:
    argv = ["docker", *what[:-1], "-f", template, what[-1]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout.strip()


def _escapes(first: LeaseExecutor, second: LeaseExecutor, agent_port: int, dev_root: Path) -> list[tuple[str, bool]]:
    """(escape, held) for each way the second tenant tries to reach the first."""
    if first.walls is not None and second.walls is not None:
        home = first.walls.home
        target = _docker_field("{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", "inspect",
                               first.walls.container)  # fmt: skip
        target_port, devices = 2222, "/dev"
        gateway = _docker_field("{{(index .IPAM.Config 0).Gateway}}", "network", "inspect", second.walls.network)
    else:
        home, target, target_port, gateway = first.plan.work_dir, "127.0.0.1", first.plan.host_ports[0], "127.0.0.1"
        devices = str(dev_root)  # the host's own nodes: a bare lease's only GPU boundary is a variable

    def reaches(address: str, port: int) -> bool:
        probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null && echo open"
        return _in_lease(second, probe).strip() == "open"

    environ = _in_lease(second, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    processes = _in_lease(second, "ps -eo args 2>/dev/null")
    nodes = _in_lease(second, f"export CUDA_VISIBLE_DEVICES=0,1,2,3; ls {devices} | grep -c '^nvidia[0-9]'")
    mknod = _in_lease(second, "mknod gpu-node c 195 0 && echo made")
    return [
        ("read the other tenant's secret from /proc/<pid>/environ", SECRET not in environ),
        ("see the other tenant's processes", "sleep 601" not in processes),
        ("read the other tenant's files", "secret-file" not in _in_lease(second, f"cat {home}/note 2>/dev/null")),
        ("open GPUs beyond its own by widening CUDA_VISIBLE_DEVICES", nodes.strip() in ("0", "1")),
        ("make a device node for another GPU (mknod)", "made" not in mknod),
        ("run as root", _in_lease(second, "id -u").strip() != "0"),
        ("reach the other tenant's SSH port", not reaches(target, target_port)),
        ("reach the host agent's port", not reaches(gateway, agent_port)),
    ]


def _ready_seconds(lease: LeaseExecutor) -> float:
    started = time.perf_counter()
    lease.start({"kind": "none"}, {}, "lease")
    if not lease.ssh().listening:
        raise SystemExit(f"lease {lease.plan.lease_id}: no SSH server answered")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("docker") is None:
        raise SystemExit("needs root and Docker (bin/containers starts dockerd and builds the lease image)")
    subprocess.run([str(ROOT / "bin" / "containers")], check=True)
    listener = socket.create_server(("0.0.0.0", 0))  # noqa: S104 - stands for the host agent's port
    agent_port = listener.getsockname()[1]
    threading.Thread(target=lambda: [listener.accept()[0].close() for _ in range(1000)], daemon=True).start()
    failed = False
    with tempfile.TemporaryDirectory(prefix="lease-drill-") as made:
        root = Path(made)
        runtime = runtime_probe(dev_root=_stand_in_gpus(root / "dev", 4), publish_address="127.0.0.1")
        if isinstance(runtime, str):
            raise SystemExit(runtime)
        results = {}
        for label, walls in (("walled", runtime), ("bare", None)):
            first, second = _lease(root, f"i-{label}00001", 1, 0, walls), _lease(root, f"i-{label}00002", 2, 1, walls)
            try:
                first.start({"kind": "script", "script": "echo secret-file > note\nexec sleep 601\n"},
                            {"env": {"TENANT_SECRET": SECRET}}, "lease")  # fmt: skip
                second.start({"kind": "none"}, {}, "lease")
                first.ssh(), second.ssh()
                deadline = time.monotonic() + 30
                home = first.walls.home if first.walls is not None else first.plan.work_dir
                while not (home / "note").exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                results[label] = _escapes(first, second, agent_port, runtime.dev_root)
            finally:
                first.stop(), second.stop()
        print(f"{'escape tried by the second tenant':<60} {'walled':>8} {'bare':>8}")
        for (escape, held), (_, bare_held) in zip(results["walled"], results["bare"], strict=True):
            print(f"{escape:<60} {'held' if held else 'GOT IN':>8} {'held' if bare_held else 'got in':>8}")
            failed = failed or not held
        timings: dict[str, list[float]] = {"walled": [], "bare": []}
        for round_ in range(args.rounds):
            for label, walls in (("walled", runtime), ("bare", None)):
                lease = _lease(root, f"i-t{label[0]}{round_:09d}", 0, 0, walls)
                try:
                    timings[label].append(_ready_seconds(lease))
                finally:
                    lease.stop()
        walled, bare = statistics.median(timings["walled"]), statistics.median(timings["bare"])
        print(f"\nstart to SSH answering, median of {args.rounds}: walled {walled:.2f} s, bare {bare:.3f} s "
              f"(ratio {walled / bare:.1f}x)")  # fmt: skip
    listener.close()
    print("\nevery escape held against the walls" if not failed else "\nSOME ESCAPE GOT THROUGH THE WALLS")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
