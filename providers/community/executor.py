"""What a host agent runs for each lease on a shared machine: the lease's own GPUs, ports, disk and login.

One ``LeaseExecutor`` for every lease, real or simulated. It is put together from three layers:

- devices: ``NvidiaDevices`` reads ``nvidia-smi`` (and its MIG instances); ``FakeDevices`` stands in for them
  under ``--simulate``. Nothing else differs between a real host and a simulated one.
- the runner: a container through Docker with the NVIDIA runtime (``docker_run_argv``) where the host has
  Docker, else a process in its own session and process group (``ProcessGroup``). A container image cannot run
  without Docker, so there a stand-in process holds the lease's ports in its place.
- the login: SSH inside the container on the lease's first port, the host's sshd for a per-lease unprivileged
  user, or (simulated) an SSH banner on a port of the lease's own. Never the host's root. The buyer's keys go
  into the lease home's ``.ssh/authorized_keys`` with ``restrict,pty`` (no tunnels to other leases' ports);
  a container gets that file read-only at ``/etc/gpu-broker/authorized_keys`` for the image's own sshd.
- the image: pulled for every lease with the lease's own Docker client configuration (its registry login,
  wiped with the lease), so a private image in the host's shared cache never starts for a lease that cannot
  pull it itself.

Contract: ``stop`` is idempotent and safe from any thread. It ends the lease's process group (SIGTERM, then
SIGKILL after ``grace_s``), removes the lease's container and working directory, and records what it freed in
``cleanup``. ``check_disk`` stops the workload once the working directory holds more than the quota.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from providers.community.containers import SSH_PORT_IN_CONTAINER, ContainerRuntime, LeaseWalls, Limits
from providers.community.lease import ExecutorError, GpuSeen, SshSeen, _tail, telemetry_sample

DISK_QUOTA_EXCEEDED = "disk quota exceeded"
PIDS_LIMIT = 4096
PULL_LOGIN_S = 120
PULL_S = 3600  # a large image over a slow uplink; the broker's boot deadline ends the lease sooner anyway
RUN_S = 300
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[0-9A-Za-z-]+)\)")
_GPU_LINE = re.compile(r"^GPU (\d+):")
# What ``nvidia-smi mig -cgi ... -C`` prints: "Successfully created GPU instance ID  5 on GPU  0 using profile
# MIG 3g.40gb (ID  9)", then "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  5 ...".
_GI_CREATED = re.compile(r"created GPU instance ID\s+(\d+)")
_CI_CREATED = re.compile(r"created compute instance ID\s+(\d+)")


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance the agent created for one lease: the GPU it is on, its UUID (what the lease's
    ``CUDA_VISIBLE_DEVICES`` names), and the GPU and compute instance ids it is destroyed by."""

    gpu_index: int
    uuid: str
    gpu_instance: int
    compute_instance: int


# ------------------------------------------------------------------------------------------------ devices


class NvidiaDevices:
    """The host's GPUs through ``nvidia-smi``."""

    def _smi(self, *args: str) -> str:
        binary = shutil.which("nvidia-smi")
        if binary is None:
            raise ExecutorError("nvidia-smi not found: the NVIDIA driver is not installed")
        out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
        if out.returncode != 0:
            raise ExecutorError(f"nvidia-smi failed: {' '.join(out.stderr.split())[:200]}")
        return out.stdout

    def _query(self, fields: str) -> list[list[str]]:
        text = self._smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
        return [[part.strip() for part in line.split(",")] for line in text.strip().splitlines()]

    def gpus(self, indexes: tuple[int, ...]) -> list[GpuSeen]:
        rows = self._query("index,name,memory.total")
        return [GpuSeen(int(i), name, round(float(mib) / 1024)) for i, name, mib in rows if int(i) in indexes]

    def telemetry(self, indexes: tuple[int, ...], busy: bool) -> list[dict[str, Any]]:
        rows = self._query("index,utilization.gpu,temperature.gpu,power.draw,memory.used")
        return [
            telemetry_sample(int(i), float(u), float(t), float(p), float(m) / 1024)
            for i, u, t, p, m in rows
            if int(i) in indexes
        ]

    def mig_instances(self) -> dict[int, list[str]]:
        """GPU index -> the UUIDs of the MIG instances the host created on it (none where MIG is off)."""
        found: dict[int, list[str]] = {}
        current = -1
        for line in self._smi("-L").splitlines():
            if gpu := _GPU_LINE.match(line):
                current = int(gpu.group(1))
            elif (mig := _MIG_LINE.match(line)) and current >= 0:
                found.setdefault(current, []).append(mig.group(1))
        return found

    def mig_create(self, index: int, profile: str) -> MigDevice:
        """A GPU instance of ``profile`` on GPU ``index`` (in MIG mode) with its default compute instance, as
        NVIDIA's MIG User Guide creates one ("Creating GPU Instances": ``nvidia-smi mig -cgi <profile> -C``,
        here with ``-i <index>``). Its UUID is the one MIG device ``nvidia-smi -L`` lists on that GPU that it
        did not before, so callers serialise creations on the host (the agent's lock). ``ExecutorError`` when
        the driver refuses (no room, MIG mode off), with nothing left behind."""
        before = set(self.mig_instances().get(index, []))
        out = self._smi("mig", "-i", str(index), "-cgi", profile, "-C")
        gi, ci = _GI_CREATED.search(out), _CI_CREATED.search(out)
        new = [found for found in self.mig_instances().get(index, []) if found not in before]
        if gi is None or ci is None or len(new) != 1:
            if gi is not None:
                # Half made (no compute instance, or no device to name): take the GPU instance away again.
                with contextlib.suppress(ExecutorError):
                    self._smi("mig", "-i", str(index), "-gi", gi.group(1), "-dci")
                    self._smi("mig", "-i", str(index), "-gi", gi.group(1), "-dgi")
            raise ExecutorError(
                f"nvidia-smi made no {profile} MIG device on GPU {index}: {' '.join(out.split())[:200]}"
            )
        return MigDevice(index, new[0], int(gi.group(1)), int(ci.group(1)))

    def mig_destroy(self, device: MigDevice) -> None:
        """Destroy the lease's MIG instance: its compute instances, then its GPU instance, in the order the
        MIG User Guide's "Destroying GPU Instances" gives (``nvidia-smi mig -dci``, then ``-dgi``), with
        ``-i`` and ``-gi`` naming only this one. ``ExecutorError`` when the driver refuses (a process still
        on it)."""
        gpu, gi = str(device.gpu_index), str(device.gpu_instance)
        self._smi("mig", "-i", gpu, "-gi", gi, "-dci")
        self._smi("mig", "-i", gpu, "-gi", gi, "-dgi")


@dataclass
class FakeDevices:
    """GPUs that are not there, for ``--simulate``: the models given, and MIG instances if the test says so.
    MIG instances made for leases (``mig_create``) get a fake UUID and are listed like the host's own."""

    models: list[tuple[str, int]] | list[tuple[str, int, int]]  # (name, memory GB[, rated power W])
    mig: dict[int, list[str]] = field(default_factory=dict)
    created: list[MigDevice] = field(default_factory=list)  # live ones this host made, oldest first

    def gpus(self, indexes: tuple[int, ...]) -> list[GpuSeen]:
        return [GpuSeen(i, *self.models[i]) for i in indexes if 0 <= i < len(self.models)]

    def telemetry(self, indexes: tuple[int, ...], busy: bool) -> list[dict[str, Any]]:
        samples = []
        for gpu in self.gpus(indexes):
            util = random.uniform(88, 99) if busy else random.uniform(0, 4)  # noqa: S311 - a simulation
            power = gpu.power_limit_w * (0.1 + 0.8 * util / 100)
            samples.append(telemetry_sample(gpu.index, util, 36 + util * 0.4, power, gpu.memory_gb * 0.7 * busy))
        return samples

    def mig_instances(self) -> dict[int, list[str]]:
        return {index: list(uuids) for index, uuids in self.mig.items()}

    def mig_create(self, index: int, profile: str) -> MigDevice:
        """``NvidiaDevices.mig_create`` without the driver: a fake UUID on GPU ``index``."""
        if not 0 <= index < len(self.models):
            raise ExecutorError(f"no GPU {index} to make a {profile} MIG device on")
        gpu_instance = 1 + max((d.gpu_instance for d in self.created if d.gpu_index == index), default=0)
        device = MigDevice(index, f"MIG-{uuid.uuid4()}", gpu_instance, 0)
        self.mig.setdefault(index, []).append(device.uuid)
        self.created.append(device)
        return device

    def mig_destroy(self, device: MigDevice) -> None:
        if device in self.created:
            self.created.remove(device)
            self.mig[device.gpu_index].remove(device.uuid)
            if not self.mig[device.gpu_index]:
                del self.mig[device.gpu_index]


def visible_devices(indexes: tuple[int, ...], mig: dict[int, list[str]], own: tuple[str, ...] = ()) -> list[str]:
    """What ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` name: a GPU's MIG instances where the host
    enabled MIG on it (CUDA sees only those), else the GPU's index. ``own``: the MIG devices the agent made for
    this lease alone (a MIG slice), which are then all it sees, whatever else runs on that GPU."""
    if own:
        return list(own)
    devices: list[str] = []
    for index in indexes:
        devices.extend(mig.get(index) or [str(index)])
    return devices


# ------------------------------------------------------------------------------------------- the lease plan


@dataclass(frozen=True)
class UserPlan:
    """The lease's unprivileged account: created with ``useradd`` only by a root agent on a real host; else
    recorded, and the workload runs as the agent's own (non-root on a real host) user."""

    name: str
    useradd: tuple[str, ...]
    userdel: tuple[str, ...]


def user_plan(name: str, home: Path) -> UserPlan:
    # No extra groups: not sudo, not docker (docker group membership is root on the host).
    return UserPlan(
        name=name,
        useradd=("useradd", "--home-dir", str(home), "--no-create-home", "--shell", "/bin/bash", "--user-group",
                 "--no-log-init", name),
        userdel=("userdel", name),
    )  # fmt: skip


@dataclass(frozen=True)
class LeasePlan:
    """What one lease owns on the host. ``host_ports[0]`` is kept for the lease's SSH endpoint."""

    lease_id: str
    gpu_indexes: tuple[int, ...]
    host_ports: tuple[int, ...]
    work_dir: Path
    disk_quota_bytes: int
    user: UserPlan
    exposed: tuple[int, ...] = ()  # the workload's ports, published on host_ports[1:]
    authorized_keys: tuple[str, ...] = ()  # the buyer's public keys ("<type> <base64>"), checked by the agent
    mig_devices: tuple[str, ...] = ()  # a MIG slice's lease: the MIG device (UUID) the agent made for it alone
    uid: int = 0  # a walled lease's own uid (``containers.lease_uid``); 0 where the host cannot wall leases
    share: float = 1.0  # the part of the host's GPUs it rented: its CPU, memory and process limits follow
    login_name: str = "lease"  # the user name its SSH login takes, inside its container


# sshd(8), AUTHORIZED_KEYS FILE FORMAT: "restrict" turns off port, agent and X11 forwarding and the pty, and
# "pty" gives the terminal back. A lease's login cannot tunnel to another lease's ports or the host's loopback;
# it reaches its workload on the ports the lease publishes.
KEY_OPTIONS = "restrict,pty"
AUTHORIZED_KEYS_IN_CONTAINER = "/etc/gpu-broker/authorized_keys"


def authorized_keys_text(keys: tuple[str, ...]) -> str:
    """The lease login's ``authorized_keys``: each buyer key on its own line, restricted."""
    return "".join(f"{KEY_OPTIONS} {key}\n" for key in keys)


def docker_run_argv(
    plan: LeasePlan,
    workload: dict[str, Any],
    *,
    devices: list[str],
    mig: bool,
    env_file: Path,
    user: str,
    docker: str = "docker",
    config_dir: Path | None = None,
) -> list[str]:
    """The ``docker run`` for a lease's container: only its GPUs, its disk quota, its ports, an unprivileged
    ``user`` (``uid:gid``: Docker needs no account of that number inside the image), no capabilities and no
    privilege escalation, the buyer's keys read-only for the image's sshd, labelled with the lease so cleanup
    finds it. ``config_dir``: the lease's own Docker client configuration (its registry login)."""
    args = [docker, *(("--config", str(config_dir)) if config_dir is not None else ())]
    args += [
        "run",
        "-d",
        "--name",
        container_name(plan.lease_id),
        "--label",
        f"gpu-broker.lease={plan.lease_id}",
    ]
    if mig:
        # MIG instances are named by UUID to the NVIDIA runtime, which --gpus does not take for every toolkit.
        args += ["--runtime", "nvidia", "-e", f"NVIDIA_VISIBLE_DEVICES={','.join(devices)}"]
    else:
        args += ["--gpus", f'"device={",".join(devices)}"']
    args += ["--storage-opt", f"size={plan.disk_quota_bytes}"]
    args += ["--user", user, "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    args += ["--pids-limit", str(PIDS_LIMIT)]
    args += ["-p", f"{plan.host_ports[0]}:22"]
    for port, host_port in zip(plan.exposed, plan.host_ports[1:], strict=False):
        args += ["-p", f"{host_port}:{port}"]
    if plan.authorized_keys:
        keys = plan.work_dir / ".ssh" / "authorized_keys"
        args += ["--mount", f"type=bind,source={keys},target={AUTHORIZED_KEYS_IN_CONTAINER},readonly"]
    if workload.get("shm_size_gb"):
        args += ["--shm-size", f"{int(workload['shm_size_gb'])}g"]
    args += ["--env-file", str(env_file)]  # a file, not argv: secret values stay out of the process list
    command = [str(c) for c in workload.get("command") or []]
    if command:
        args += ["--entrypoint", command[0]]
    args += [str(workload["image"]), *command[1:], *(str(a) for a in workload.get("args") or [])]
    return args


def container_name(lease_id: str) -> str:
    return f"gpu-broker-{lease_id}"


# ----------------------------------------------------------------------------------------- process groups


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from ``/proc``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@dataclass
class ProcessGroup:
    """A workload process started in its own session (so its own process group), ended as a group."""

    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, uid: int | None) -> ProcessGroup:
        with open(log, "ab") as out:
            process = subprocess.Popen(  # noqa: S603 - the buyer's workload, as the lease's user
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, user=uid, group=_gid(uid), extra_groups=[] if uid is not None else None,
            )  # fmt: skip
        return cls(process)

    @property
    def pgid(self) -> int:
        return self.process.pid  # a session leader's group id is its pid

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float) -> dict[str, Any]:
        """SIGTERM to the group, SIGKILL to whatever is left after ``grace_s``: (processes, forced)."""
        members = set(_group_members(self.pgid))
        if self.process.poll() is None:
            members.add(self.process.pid)
        forced = False
        if members:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and (self.process.poll() is None or _group_members(self.pgid)):
                time.sleep(0.05)
            if self.process.poll() is None or _group_members(self.pgid):
                forced = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return {"processes": sorted(members), "forced": forced}


def _gid(uid: int | None) -> int | None:
    return None if uid is None else pwd.getpwuid(uid).pw_gid


def disk_usage(path: Path) -> int:
    """Bytes a directory tree holds on disk (allocated blocks, symlinks not followed)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += stat.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


# Stands in for a container image where there is no Docker: answers HTTP on each of the lease's ports.
_STAND_IN = """
import socket, sys, threading
def serve(host_port, port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], host_port))
    s.listen(16)
    body = ("simulated workload (%s) on the machine's port %d\\n" % (sys.argv[2], port)).encode()
    head = "HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n"
    while True:
        c, _ = s.accept()
        try:
            c.recv(4096); c.sendall((head % len(body)).encode() + body)
        except OSError:
            pass
        c.close()
pairs = [a.split(":") for a in sys.argv[3:]]
for host_port, port in pairs:
    threading.Thread(target=serve, args=(int(host_port), int(port))).start()
"""


# ------------------------------------------------------------------------------------------------ executor


class LeaseExecutor:
    """One lease on a shared host (see the module docstring). With a ``runtime`` every workload kind runs in
    the lease's own walled container (``containers.py``), with a real SSH server; ``simulate`` then only fakes
    the GPUs. Without one (a host that cannot isolate, sold whole only), ``simulate`` swaps the SSH endpoint
    for a banner on the lease's first port and keeps Docker and system users out of it."""

    name = "host"

    def __init__(
        self,
        plan: LeasePlan,
        devices: NvidiaDevices | FakeDevices,
        *,
        simulate: bool,
        ssh_host: str = "127.0.0.1",
        grace_s: float = 10.0,
        disk_poll_s: float | None = 5.0,
        docker: str | None = None,
        fail_workload: str | None = None,
        runtime: ContainerRuntime | None = None,
    ):
        self.plan = plan
        self.devices = devices
        self.simulate = simulate
        self.ssh_host = ssh_host
        self.grace_s = grace_s
        self.disk_poll_s = disk_poll_s
        self.docker = None if simulate else (docker or shutil.which("docker"))
        self.fail_workload = fail_workload  # simulated only: a start that fails so (a pull refused, ...)
        self.kind = "none"
        self.runner = "none"  # docker | process | stand-in | none
        self.problem = ""
        self.cleanup: dict[str, Any] | None = None
        self.user_created = False
        self._group: ProcessGroup | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._ssh_listener: socket.socket | None = None
        blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + os.urandom(32)
        self._host_key = "ssh-ed25519 " + base64.b64encode(blob).decode()
        self._walled_host_key = ""
        self._walled_image_is_ours = True
        if simulate:
            self.name = "simulated"
        self.walls: LeaseWalls | None = None
        if runtime is not None:
            self.name = "container"
            self.docker = runtime.docker
            self.walls = LeaseWalls(runtime, lease_id=plan.lease_id, uid=plan.uid, work_dir=plan.work_dir,
                                    login_name=plan.login_name)  # fmt: skip

    # --------------------------------------------------------------------------------------- devices

    def gpus(self) -> list[GpuSeen]:
        return self.devices.gpus(self.plan.gpu_indexes)

    def telemetry(self) -> list[dict[str, Any]]:
        return self.devices.telemetry(self.plan.gpu_indexes, busy=self.runner != "none")

    def visible(self) -> list[str]:
        return visible_devices(self.plan.gpu_indexes, self.devices.mig_instances(), self.plan.mig_devices)

    # -------------------------------------------------------------------------------------- workload

    def _run_as(self) -> int | None:
        """The uid the workload runs as: the lease's account where it exists; else the agent's own user, which a
        real agent refuses to be when it is root (a buyer's workload never runs as the host's root)."""
        try:
            return pwd.getpwnam(self.plan.user.name).pw_uid
        except KeyError:
            if os.geteuid() == 0 and not self.simulate:
                raise ExecutorError(f"no unprivileged account {self.plan.user.name} for the lease") from None
            return None

    def _prepare(self) -> int | None:
        work = self.plan.work_dir
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.simulate and os.geteuid() == 0 and not self._exists(self.plan.user.name):
            made = subprocess.run(list(self.plan.user.useradd), capture_output=True, timeout=30, check=False)  # noqa: S603
            if made.returncode != 0:
                raise ExecutorError(f"useradd failed: {made.stderr.decode('utf-8', 'replace')[-300:]}")
            self.user_created = True
        uid = self._run_as()
        self._authorize_keys(uid)
        if uid is not None:
            os.chown(work, uid, pwd.getpwuid(uid).pw_gid)
        return uid

    def _authorize_keys(self, uid: int | None) -> None:
        """The buyer's keys in the lease home's ``.ssh/authorized_keys``, owned by the lease's account with the
        modes sshd's StrictModes asks for (sshd_config(5)); the home itself is the lease's, mode 0700."""
        ssh_dir = self.plan.work_dir / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        keys = ssh_dir / "authorized_keys"
        fd = os.open(keys, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(authorized_keys_text(self.plan.authorized_keys))
        if uid is not None:
            gid = pwd.getpwuid(uid).pw_gid
            for path in (ssh_dir, keys):
                os.chown(path, uid, gid)

    @staticmethod
    def _exists(user: str) -> bool:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return False
        return True

    def environment(self, workload: dict[str, Any], secrets: dict[str, Any]) -> dict[str, str]:
        if self.walls is not None:
            return self._walled_environment(workload, secrets)
        visible = ",".join(self.visible())
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.plan.work_dir), "LANG": "C.UTF-8"}
        env.update({str(e["name"]): str(e.get("value") or "") for e in workload.get("env") or []})
        env.update({str(k): str(v) for k, v in (secrets.get("env") or {}).items()})
        # Set last so the buyer's variables cannot widen the lease to another lease's GPUs or ports.
        env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"] = visible
        env["LEASE_PORTS"] = ",".join(str(p) for p in self.plan.host_ports[1:])
        for port, host_port in zip(self.plan.exposed, self.plan.host_ports[1:], strict=False):
            env[f"LEASE_PORT_{port}"] = str(host_port)
        return env

    def _walled_environment(self, workload: dict[str, Any], secrets: dict[str, Any]) -> dict[str, str]:
        """A walled lease's environment: the buyer's values and the lease's ports, nothing of the host's. The
        NVIDIA runtime reads ``NVIDIA_*`` variables when it makes the container, so the buyer's are dropped and
        the lease's own devices named; inside, CUDA numbers the container's GPUs from 0 on its own."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        env.update({str(e["name"]): str(e.get("value") or "") for e in workload.get("env") or []})
        env.update({str(k): str(v) for k, v in (secrets.get("env") or {}).items()})
        for name in [name for name in env if name.startswith("NVIDIA_") or name == "CUDA_VISIBLE_DEVICES"]:
            del env[name]
        if self.walls is not None and self.walls.runtime.nvidia_runtime:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(self.visible())
        env["LEASE_PORTS"] = ",".join(str(p) for p in self.plan.host_ports[1:])
        for port, host_port in zip(self.plan.exposed, self.plan.host_ports[1:], strict=False):
            env[f"LEASE_PORT_{port}"] = str(host_port)
        return env

    def start(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        self.kind = str(workload.get("kind") or "none")
        if self.simulate and self.fail_workload:
            raise ExecutorError(self.fail_workload)
        if self.walls is not None:
            detail = self._start_walled(self.walls, workload, secrets)
            if self.disk_poll_s:
                threading.Thread(target=self._watch_disk, name=f"disk:{self.plan.lease_id}", daemon=True).start()
            return detail
        uid = self._prepare()
        env = self.environment(workload, secrets)
        log = self.plan.work_dir / "workload.log"
        if self.kind == "container" and self.docker is not None:
            detail = self._start_container(workload, env, secrets, uid)
        elif self.kind == "script":
            script = self.plan.work_dir / "workload.sh"
            script.write_text(str(workload.get("script") or ""))
            if uid is not None:
                os.chown(script, uid, pwd.getpwuid(uid).pw_gid)
            self._group = ProcessGroup.start(["bash", str(script)], env=env, cwd=self.plan.work_dir, log=log, uid=uid)
            self.runner = "process"
            detail = f"script started (pid {self._group.process.pid}, output in {log})"
        elif self.kind == "container" or (self.simulate and self.plan.exposed):
            pairs = [f"{h}:{p}" for p, h in zip(self.plan.exposed, self.plan.host_ports[1:], strict=False)]
            argv = [sys.executable, "-I", "-c", _STAND_IN, self.ssh_host, self.kind, *pairs]
            self._group = ProcessGroup.start(argv, env=env, cwd=self.plan.work_dir, log=log, uid=uid)
            self.runner = "stand-in"
            detail = f"container running {workload.get('image')} (simulated)" if self.kind == "container" else ""
        else:
            detail = ""
        if self._group is not None and self.disk_poll_s:
            threading.Thread(target=self._watch_disk, name=f"disk:{self.plan.lease_id}", daemon=True).start()
        return detail or "no workload: the machine is yours over SSH"

    def _docker(self, *args: str, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """One Docker CLI call with the lease's own client configuration (``docker --config``), so one lease's
        registry login never serves another lease's pull, and is wiped with the lease's directory."""
        argv = [str(self.docker), "--config", str(self._docker_config), *args]
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)  # noqa: S603
        except subprocess.TimeoutExpired:
            raise ExecutorError(f"docker {args[0]} took longer than {timeout:g} s") from None

    @property
    def _docker_config(self) -> Path:
        return self.plan.work_dir / ".docker"

    def _pull(self, workload: dict[str, Any], secrets: dict[str, Any]) -> None:
        """Log in to the workload's registry (when it names a user) and pull its image, every time: a host's
        image cache is shared, so a private image another lease pulled must not start for a lease that cannot
        pull it itself (the multi-tenant reason for Kubernetes' AlwaysPullImages admission controller)."""
        self._docker_config.mkdir(mode=0o700, exist_ok=True)
        image = str(workload["image"])
        registry = workload.get("registry") or {}
        if registry.get("username"):
            server = str(registry.get("server") or "")
            password = str(secrets.get("registry_password") or "").encode()
            login = self._docker("login", server, "-u", str(registry["username"]), "--password-stdin",
                                 timeout=PULL_LOGIN_S, stdin=password)  # fmt: skip
            if login.returncode != 0:
                raise ExecutorError(f"registry login to {server or 'Docker Hub'} failed: {_tail(login.stderr)}")
        pulled = self._docker("pull", image, timeout=PULL_S)
        if pulled.returncode != 0:
            raise ExecutorError(f"could not pull {image}: {_tail(pulled.stderr)}")

    def _start_container(self, workload: dict[str, Any], env: dict[str, str], secrets: dict[str, Any],
                         uid: int | None) -> str:  # fmt: skip
        self._pull(workload, secrets)
        env_file = self.plan.work_dir / "workload.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.writelines(f"{name}={value}\n" for name, value in env.items())
            if self.plan.authorized_keys:
                handle.write(f"BROKER_AUTHORIZED_KEYS={AUTHORIZED_KEYS_IN_CONTAINER}\n")
        mig = any(self.devices.mig_instances().get(i) for i in self.plan.gpu_indexes)
        uid = os.geteuid() if uid is None else uid
        argv = docker_run_argv(self.plan, workload, devices=self.visible(), mig=mig, env_file=env_file,
                               user=f"{uid}:{pwd.getpwuid(uid).pw_gid}", docker=str(self.docker),
                               config_dir=self._docker_config)  # fmt: skip
        try:
            started = subprocess.run(argv, capture_output=True, timeout=RUN_S, check=False)  # noqa: S603
        except subprocess.TimeoutExpired:
            raise ExecutorError(f"docker run took longer than {RUN_S} s") from None
        finally:
            env_file.unlink(missing_ok=True)
        if started.returncode != 0:
            raise ExecutorError(f"docker run failed: {_tail(started.stderr)}")
        self.runner = "docker"
        return f"container {started.stdout.decode().strip()[:12]} running {workload['image']}"

    def resume(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        """The lease again after the agent or the machine restarted (``LeaseAgent.reattach``): a walled lease's
        network and firewall rule made sure of, then its own container started again, never a second one (a
        reboot stopped it; its environment is in its configuration); a lease whose container is gone, or one
        without walls (its processes died with the agent), is started from the top."""
        self.kind = str(workload.get("kind") or "none")
        walls = self.walls
        if walls is None or not walls.exists():
            return self.start(workload, secrets, login_user)
        self._walled_host_key = walls.host_key_line()
        self._walled_image_is_ours = walls.image() == walls.runtime.image
        walls.network_ensure()
        walls.restart()
        self.runner = "docker"
        if self.disk_poll_s:
            threading.Thread(target=self._watch_disk, name=f"disk:{self.plan.lease_id}", daemon=True).start()
        return f"container {walls.container} started again"

    def _start_walled(self, walls: LeaseWalls, workload: dict[str, Any], secrets: dict[str, Any]) -> str:
        """The lease in its own container: the lease image (our sshd, the buyer's script if any) or the buyer's
        image (pulled with the lease's own login; its own sshd, given the keys at the usual place)."""
        own_image = self.kind != "container"
        stand_in = ""
        self.plan.work_dir.mkdir(mode=0o711, parents=True, exist_ok=True)  # the pull's own login lives in it
        if not own_image:
            try:
                self._pull(workload, secrets)
            except ExecutorError:
                if not self.simulate:
                    raise
                # A simulated machine (the sandbox's) reaches no registry: the lease image stands in for the
                # buyer's, so the login and the walls are still real, and the order says so.
                own_image, stand_in = True, f" (simulated: {workload['image']} cannot be pulled here)"
        self._walled_host_key = walls.prepare(authorized_keys_text(self.plan.authorized_keys))
        if self.kind == "script":
            walls.write_script(str(workload.get("script") or ""))
        walls.network_up()
        env_file = self.plan.work_dir / "workload.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.writelines(f"{name}={value}\n" for name, value in self.environment(workload, secrets).items())
            if not own_image and self.plan.authorized_keys:
                handle.write(f"BROKER_AUTHORIZED_KEYS={AUTHORIZED_KEYS_IN_CONTAINER}\n")
        self._walled_image_is_ours = own_image
        ssh_port = SSH_PORT_IN_CONTAINER if own_image else 22
        ports = [(self.plan.host_ports[0], ssh_port)]
        ports += [(host, port) for port, host in zip(self.plan.exposed, self.plan.host_ports[1:], strict=False)]
        mig = bool(self.plan.mig_devices) or any(self.devices.mig_instances().get(i) for i in self.plan.gpu_indexes)
        command = [] if own_image else [str(c) for c in workload.get("command") or []]
        argv = walls.run_argv(
            image=walls.runtime.image if own_image else str(workload["image"]), env_file=env_file,
            devices=self.visible(), mig=mig, limits=Limits.share_of(walls.runtime, self.plan.share), ports=ports,
            script=self.kind == "script", command=command,
            args=[] if own_image else [str(a) for a in workload.get("args") or []],
            shm_size_gb=int(workload.get("shm_size_gb") or 0), own_image=own_image,
        )  # fmt: skip
        try:
            container = walls.start(argv)
        finally:
            env_file.unlink(missing_ok=True)
        self.runner = "docker"
        what = "the lease image" if own_image else str(workload["image"])
        script = " with the script" if self.kind == "script" else ""
        return f"container {container} running {what}{script}{stand_in}"

    def workload_state(self) -> dict[str, Any]:
        if self.problem:
            return {"state": "exited", "exit_code": -1}
        if self.walls is not None:
            return self.walls.state() if self.kind != "none" else {"state": "none"}
        if self._group is not None:
            code = self._group.process.poll()
            return {"state": "running"} if code is None else {"state": "exited", "exit_code": code}
        return {"state": "running" if self.runner == "docker" else "none"}

    # ------------------------------------------------------------------------------------------ disk

    def check_disk(self) -> bool:
        """Stop the workload (not the lease's bookkeeping) once its directory holds more than the quota; True
        when the quota is exceeded. Safe to call from any thread, and again."""
        used = disk_usage(self.plan.work_dir)
        if self.walls is not None and self.runner == "docker":
            used += self.walls.written_bytes()
        if used <= self.plan.disk_quota_bytes:
            return False
        with self._lock:
            if not self.problem:
                self.problem = DISK_QUOTA_EXCEEDED
                if self._group is not None:
                    self._group.stop(self.grace_s)
                if self.walls is not None:
                    self.walls.docker("stop", "-t", str(int(self.grace_s)), self.walls.container)
        return True

    def _watch_disk(self) -> None:
        while not self._stopped.wait(self.disk_poll_s):
            if self.check_disk():
                return

    # ------------------------------------------------------------------------------------------- SSH

    def ssh(self) -> SshSeen:
        if self.walls is not None:
            port = self.plan.host_ports[0]
            return SshSeen(_banner_wait("127.0.0.1", port), port, self.ssh_host)
        if self.simulate:
            return self._simulated_ssh()
        if self.runner == "docker":
            return SshSeen(_banner("127.0.0.1", self.plan.host_ports[0]), self.plan.host_ports[0])
        return SshSeen(_banner("127.0.0.1", 22), 22)

    def _simulated_ssh(self) -> SshSeen:
        port = self.plan.host_ports[0]
        if self._ssh_listener is None:
            self._ssh_listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._ssh_listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._ssh_listener.bind((self.ssh_host, port))
            self._ssh_listener.listen(8)
            threading.Thread(target=self._answer_ssh, args=(self._ssh_listener,), daemon=True).start()
        return SshSeen(_banner(self.ssh_host, port), port, self.ssh_host)

    def _answer_ssh(self, listener: socket.socket) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"SSH-2.0-gpu-broker-sandbox\r\n")

    def host_keys(self) -> list[str]:
        if self.walls is not None:
            # The lease image's sshd presents the key made for this lease; a buyer's own image, its own keys.
            return [self._walled_host_key] if self._walled_image_is_ours else []
        if self.simulate:
            return [self._host_key]
        keys = []
        for kind in ("ed25519", "ecdsa", "rsa"):
            path = Path(f"/etc/ssh/ssh_host_{kind}_key.pub")
            if path.exists():
                keys.append(" ".join(path.read_text().split()[:2]))
        return keys

    def expose(self, ports: list[int]) -> list[dict[str, int]]:
        """The lease's host port for each of the workload's ports; a stand-in waits until it answers there."""
        exposed = []
        for port, host_port in zip(self.plan.exposed, self.plan.host_ports[1:], strict=False):
            if port in ports:
                exposed.append({"port": port, "host_port": host_port})
                if self.runner == "stand-in":
                    self._wait_listening(host_port)
        return exposed

    def _wait_listening(self, port: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.ssh_host, port), timeout=1):
                return
            time.sleep(0.05)

    # ----------------------------------------------------------------------------------- termination

    def stop(self) -> None:
        """End the lease on the host and record ``cleanup``: processes killed, bytes freed, ports released."""
        with self._lock:
            if self.cleanup is not None:
                return
            self._stopped.set()
            killed: dict[str, Any] = {"processes": [], "forced": False}
            if self._group is not None:
                killed = self._group.stop(self.grace_s)
            container = ""
            if self.walls is not None:
                container = self.walls.tear_down()
            elif self.runner == "docker" and self.docker is not None:
                subprocess.run([self.docker, "rm", "-f", container_name(self.plan.lease_id)],  # noqa: S603
                               capture_output=True, timeout=120, check=False)  # fmt: skip
                container = container_name(self.plan.lease_id)
            if self._ssh_listener is not None:
                self._ssh_listener.close()
            freed = disk_usage(self.plan.work_dir) if self.plan.work_dir.exists() else 0
            shutil.rmtree(self.plan.work_dir, ignore_errors=True)
            if self.user_created:
                subprocess.run(list(self.plan.user.userdel), capture_output=True, timeout=30, check=False)  # noqa: S603
            self.cleanup = {
                "processes_killed": len(killed["processes"]),
                "killed_after_grace": killed["forced"],
                "container_removed": container,
                "bytes_freed": freed,
                "work_dir_removed": not self.plan.work_dir.exists(),
                "ports_released": list(self.plan.host_ports),
                "user": self.plan.user.name,
            }


def _banner_wait(host: str, port: int, timeout: float = 30.0) -> bool:
    """An SSH server's greeting on host:port within ``timeout``: a container's sshd takes a moment to start."""
    deadline = time.monotonic() + timeout
    while True:
        if _banner(host, port):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _banner(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False
