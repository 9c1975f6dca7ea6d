"""The walls around one lease on a shared host: its own container, uid, GPU device nodes, network and login.

A host sells per GPU only when every lease runs in a container of its own (DESIGN.md, "the lease agent"):

- **uid**: a number of its own from ``LEASE_UID_FIRST`` on, which no account on the host has; the lease's home
  on the host belongs to it alone, and ``--user`` runs everything in the container as it.
- **devices**: only the device nodes of its own GPUs, through the device cgroup (``--device``, or ``--gpus
  device=N`` where the NVIDIA runtime is installed, which adds the same nodes and the driver's libraries). An
  environment variable never decides which GPUs a lease can open.
- **privileges**: ``--cap-drop ALL``, ``no-new-privileges``, and pid, memory and CPU limits in proportion to
  the share of the host's GPUs it rented.
- **network**: a bridge of its own (``enable_icc=false``; Docker already drops traffic between two user-defined
  bridges), published ports for its SSH and its workload, and a firewall rule on the host's ``INPUT`` chain that
  drops what the lease's bridge sends to the host itself (the host agent's port, the host's sshd, other leases'
  published ports) except answers to connections the host opened.
- **login**: the lease image's OpenSSH server, run as the lease's uid with a host key made for this lease, the
  buyer's keys as its only ``authorized_keys`` (read-only), and a ``/etc/passwd`` naming the lease's user.
- **environment**: a file handed to ``docker run --env-file``; nothing of the host's environment.

``runtime_probe`` says whether this host can build those walls, and if not, why (the portal shows it, and the
host is sold whole only).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.community.executor_base import ExecutorError, _tail

LEASE_IMAGE = "gpu-broker-lease:1"
LEASE_UID_FIRST = 3_000_000  # above every distribution's ranges for accounts and subordinate ids
SSH_PORT_IN_CONTAINER = 2222  # the lease's sshd is unprivileged, so it listens above 1024
PIDS_PER_HOST = 32768
ETC_IN_CONTAINER = "/etc/gpu-broker"
FIREWALL_CHAIN = "GPU-BROKER-LEASES"
# NVIDIA's control nodes every CUDA process opens besides its GPUs' own /dev/nvidiaN (NVIDIA Container
# Toolkit, "Specialized Configurations with Docker": the nodes a container needs without the runtime).
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DOCKER_S = 120


@dataclass(frozen=True)
class ContainerRuntime:
    """A host's Docker, ready to wall leases off. ``dev_root``: where the GPUs' device nodes are (``/dev``; a
    directory of stand-in nodes in tests). ``publish_address``: where published ports listen."""

    docker: str
    image: str = LEASE_IMAGE
    dev_root: Path = Path("/dev")
    nvidia_runtime: bool = False
    host_cpus: int = 1
    host_memory_bytes: int = 1 << 30
    publish_address: str = "0.0.0.0"  # noqa: S104 - buyers reach leases from outside
    firewall: bool = True
    iptables: str = "iptables"
    keygen: str | None = None  # ssh-keygen on the host; None: made in a one-off lease container
    owner: str = "host-agent"  # labels what it makes, so a sandbox can clear what a killed run left behind


def _docker_info(docker: str) -> dict[str, Any] | str:
    try:
        out = subprocess.run([docker, "info", "--format", "{{json .}}"],  # noqa: S603
                             capture_output=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info did not answer: {exc}"
    if out.returncode != 0:
        return f"docker info failed: {' '.join(_tail(out.stderr, 200).split())}"
    try:
        info = json.loads(out.stdout)
    except ValueError:
        return "docker info answered something other than JSON"
    if not isinstance(info, dict) or info.get("ServerVersion") in (None, ""):
        return "no Docker daemon answers"
    return info


def runtime_probe(
    *, docker: str | None = None, image: str = LEASE_IMAGE, dev_root: Path = Path("/dev"),
    publish_address: str = "0.0.0.0",  # noqa: S104
) -> ContainerRuntime | str:  # fmt: skip
    """The host's container runtime, or why the host cannot put each lease in a container of its own (the
    reason a per-GPU sale is refused)."""
    binary = docker or shutil.which("docker")
    if binary is None:
        return "no container runtime: the docker command is not installed"
    if os.geteuid() != 0:
        return "the agent is not root, so it cannot give each lease its own uid, home and firewall rule"
    iptables = shutil.which("iptables")
    if iptables is None:
        return "iptables is not installed, so a lease's network could reach the host's own ports"
    info = _docker_info(binary)
    if isinstance(info, str):
        return info
    found = subprocess.run([binary, "image", "inspect", image], capture_output=True, timeout=30, check=False)  # noqa: S603
    if found.returncode != 0:
        return f"the lease image {image} is not on this host (deploy/lease-image/build.sh makes it)"
    runtimes = info.get("Runtimes") if isinstance(info.get("Runtimes"), dict) else {}
    return ContainerRuntime(
        docker=binary,
        image=image,
        dev_root=dev_root,
        nvidia_runtime="nvidia" in (runtimes or {}),
        host_cpus=int(info.get("NCPU") or os.cpu_count() or 1),
        host_memory_bytes=int(info.get("MemTotal") or 1 << 30),
        publish_address=publish_address,
        iptables=iptables,
        keygen=shutil.which("ssh-keygen"),
    )


def lease_uid(slot: int, first: int = LEASE_UID_FIRST) -> int:
    return first + slot


def bridge_name(lease_id: str) -> str:
    """The lease's bridge interface: Linux allows 15 characters."""
    return "gb-" + lease_id.removeprefix("i-")[-12:]


def network_name(lease_id: str) -> str:
    return f"gpu-broker-{lease_id}"


@dataclass(frozen=True)
class Limits:
    """A lease's share of the host: CPUs, memory and processes in proportion to the GPUs it rented."""

    cpus: float
    memory_bytes: int
    pids: int

    @classmethod
    def share_of(cls, runtime: ContainerRuntime, share: float) -> Limits:
        share = min(max(share, 0.0), 1.0)
        return cls(
            cpus=max(round(runtime.host_cpus * share, 2), 0.1),
            memory_bytes=max(int(runtime.host_memory_bytes * share), 256 << 20),
            pids=max(int(PIDS_PER_HOST * share), 256),
        )


class LeaseWalls:
    """Builds and tears down one lease's container, network, firewall rule and login files. Every step of
    ``tear_down`` is safe to repeat and runs even when an earlier one failed."""

    def __init__(self, runtime: ContainerRuntime, *, lease_id: str, uid: int, work_dir: Path, login_name: str):
        self.runtime = runtime
        self.lease_id = lease_id
        self.uid = uid
        self.work_dir = work_dir
        self.login_name = login_name
        self.container = f"gpu-broker-{lease_id}"
        self.network = network_name(lease_id)
        self.bridge = bridge_name(lease_id)
        self.home = work_dir / "home"
        self.etc = work_dir / "etc"

    # ---------------------------------------------------------------------------------------------- docker

    def docker(self, *args: str, timeout: float = DOCKER_S) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run([self.runtime.docker, *args], capture_output=True, timeout=timeout, check=False)  # noqa: S603
        except subprocess.TimeoutExpired:
            raise ExecutorError(f"docker {args[0]} took longer than {timeout:g} s") from None

    # ----------------------------------------------------------------------------------------- the files

    def prepare(self, authorized_keys: str) -> str:
        """The lease's home (its uid's, mode 0700) and its read-only files: passwd and group naming its user,
        the buyer's keys, and a host key of its own. Returns the host key's public line."""
        self.work_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.home.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.home, self.uid, self.uid)
        self.etc.mkdir(mode=0o755, exist_ok=True)
        passwd = (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            f"{self.login_name}:x:{self.uid}:{self.uid}::/home/{self.login_name}:/bin/bash\n"
        )
        self._write("passwd", passwd, 0o644, owner=False)
        self._write("group", f"root:x:0:\nnogroup:x:65534:\n{self.login_name}:x:{self.uid}:\n", 0o644, owner=False)
        self._write("authorized_keys", authorized_keys, 0o600)
        return self._host_key()

    def _write(self, name: str, text: str, mode: int, *, owner: bool = True) -> Path:
        path = self.etc / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if owner:
            os.chown(path, self.uid, self.uid)  # sshd reads its key and the keys file as the lease's uid
        return path

    def _host_key(self) -> str:
        key = self.etc / "ssh_host_ed25519_key"
        if not key.exists():
            if self.runtime.keygen is not None:
                made = subprocess.run(  # noqa: S603
                    [self.runtime.keygen, "-q", "-t", "ed25519", "-N", "", "-C", self.lease_id, "-f", str(key)],
                    capture_output=True, timeout=30, check=False,
                )  # fmt: skip
            else:
                made = self.docker("run", "--rm", "--network", "none", "--entrypoint", "ssh-keygen",
                                   "-v", f"{self.etc}:/out", self.runtime.image, "-q", "-t", "ed25519",
                                   "-N", "", "-C", self.lease_id, "-f", "/out/ssh_host_ed25519_key")  # fmt: skip
            if made.returncode != 0:
                raise ExecutorError(f"could not make the lease's SSH host key: {_tail(made.stderr, 200)}")
        os.chown(key, self.uid, self.uid)
        os.chmod(key, 0o600)
        return " ".join((self.etc / "ssh_host_ed25519_key.pub").read_text().split()[:2])

    def write_script(self, script: str) -> None:
        self._write("workload.sh", script, 0o600)

    # ------------------------------------------------------------------------------------------ network

    def network_up(self) -> None:
        """The lease's own bridge and the firewall rule that keeps it off the host's own ports."""
        self.docker("network", "rm", self.network)  # a leftover of a crashed agent
        made = self.docker(
            "network", "create", "--driver", "bridge", "--label", f"gpu-broker.lease={self.lease_id}",
            "--label", f"gpu-broker.owner={self.runtime.owner}",
            "--opt", f"com.docker.network.bridge.name={self.bridge}",
            "--opt", "com.docker.network.bridge.enable_icc=false", self.network,
        )  # fmt: skip
        if made.returncode != 0:
            raise ExecutorError(f"could not make the lease's network: {_tail(made.stderr, 300)}")
        if self.runtime.firewall:
            self._firewall_up()

    def network_ensure(self) -> None:
        """The lease's network and firewall rule as ``network_up`` makes them, keeping a network that is still
        there (its container is attached to it): what a restarted agent does before starting the container."""
        if self.docker("network", "inspect", self.network, timeout=30).returncode != 0:
            self.network_up()
        elif self.runtime.firewall:
            self._firewall_up()

    def exists(self) -> bool:
        return self.docker("inspect", self.container, timeout=30).returncode == 0

    def image(self) -> str:
        out = self.docker("inspect", "-f", "{{.Config.Image}}", self.container, timeout=30)
        return out.stdout.decode().strip()

    def restart(self) -> None:
        """Start the lease's existing container again (never a second one)."""
        running = self.docker("inspect", "-f", "{{.State.Running}}", self.container, timeout=30)
        if running.stdout.decode().strip() != "true":
            started = self.docker("start", self.container, timeout=300)
            if started.returncode != 0:
                raise ExecutorError(f"docker start failed: {_tail(started.stderr)}")

    def host_key_line(self) -> str:
        return " ".join((self.etc / "ssh_host_ed25519_key.pub").read_text().split()[:2])

    def _iptables(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([self.runtime.iptables, "-w", "10", *args],  # noqa: S603
                              capture_output=True, timeout=30, check=False)  # fmt: skip

    def _rules(self) -> list[list[str]]:
        return [
            ["-i", self.bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
            ["-i", self.bridge, "-j", "DROP"],
        ]

    def _firewall_up(self) -> None:
        if self._iptables("-n", "-L", FIREWALL_CHAIN).returncode != 0:
            self._iptables("-N", FIREWALL_CHAIN)
        if self._iptables("-C", "INPUT", "-j", FIREWALL_CHAIN).returncode != 0:
            self._iptables("-I", "INPUT", "1", "-j", FIREWALL_CHAIN)
        for rule in self._rules():
            if self._iptables("-C", FIREWALL_CHAIN, *rule).returncode != 0:
                added = self._iptables("-A", FIREWALL_CHAIN, *rule)
                if added.returncode != 0:
                    raise ExecutorError(f"could not fence the lease's network: {_tail(added.stderr, 300)}")

    # --------------------------------------------------------------------------------------- container

    def run_argv(
        self, *, image: str, env_file: Path, devices: list[str], mig: bool, limits: Limits,
        ports: list[tuple[int, int]], script: bool, command: list[str], args: list[str], shm_size_gb: int = 0,
        own_image: bool,
    ) -> list[str]:  # fmt: skip
        """The ``docker run`` for the lease. ``ports``: (host port, container port) pairs, SSH's first.
        ``own_image``: the lease image (our sshd, passwd and login files mounted) rather than the buyer's."""
        argv = ["run", "-d", "--name", self.container, "--label", f"gpu-broker.lease={self.lease_id}"]
        argv += ["--label", f"gpu-broker.owner={self.runtime.owner}"]
        argv += ["--user", f"{self.uid}:{self.uid}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += ["--pids-limit", str(limits.pids), "--memory", str(limits.memory_bytes)]
        argv += ["--memory-swap", str(limits.memory_bytes), "--cpus", f"{limits.cpus:g}"]
        # No restart policy: after a reboot the agent starts the container again, once its firewall rule is back
        # (iptables rules do not outlive a reboot; Docker's own restart would run the lease unfenced meanwhile).
        argv += ["--network", self.network, "--hostname", "lease", "--restart", "no"]
        argv += self._device_args(devices, mig)
        for host_port, port in ports:
            argv += ["-p", f"{self.runtime.publish_address}:{host_port}:{port}"]
        home = f"/home/{self.login_name}"
        argv += ["--mount", f"type=bind,source={self.home},target={home}", "-w", home, "-e", f"HOME={home}"]
        keys = self.etc / "authorized_keys"
        argv += ["--mount", f"type=bind,source={keys},target={ETC_IN_CONTAINER}/authorized_keys,readonly"]
        if own_image:
            for name, target in (("passwd", "/etc/passwd"), ("group", "/etc/group"),
                                 ("ssh_host_ed25519_key", f"{ETC_IN_CONTAINER}/ssh_host_ed25519_key")):  # fmt: skip
                argv += ["--mount", f"type=bind,source={self.etc / name},target={target},readonly"]
            if script:
                source = self.etc / "workload.sh"
                argv += ["--mount", f"type=bind,source={source},target={ETC_IN_CONTAINER}/workload.sh,readonly"]
        if shm_size_gb:
            argv += ["--shm-size", f"{int(shm_size_gb)}g"]
        argv += ["--env-file", str(env_file)]  # a file, not argv: secret values stay out of the process list
        if command:
            argv += ["--entrypoint", command[0]]
        return [*argv, image, *command[1:], *args]

    def _device_args(self, devices: list[str], mig: bool) -> list[str]:
        if mig:
            # A MIG device is named by UUID to the NVIDIA runtime, whose hook on the host (not the workload)
            # reads this variable once, when it makes the container's device cgroup.
            return ["--runtime", "nvidia", "-e", f"NVIDIA_VISIBLE_DEVICES={','.join(devices)}"]
        if self.runtime.nvidia_runtime:
            return ["--gpus", f'"device={",".join(devices)}"']
        args: list[str] = []
        for node in [f"nvidia{d}" for d in devices] + list(CONTROL_NODES):
            path = self.runtime.dev_root / node
            if path.exists():
                args += ["--device", f"{path}:/dev/{node}"]
        return args

    def start(self, argv: list[str]) -> str:
        self.docker("rm", "-f", self.container)  # a leftover of a crashed agent: never two for one lease
        started = self.docker(*argv, timeout=300)
        if started.returncode != 0:
            raise ExecutorError(f"docker run failed: {_tail(started.stderr)}")
        return started.stdout.decode().strip()[:12]

    def state(self) -> dict[str, Any]:
        """The workload's state: the container's, or for a script its exit status once it ended."""
        out = self.docker("inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", self.container, timeout=30)
        running, _, code = out.stdout.decode().strip().partition(" ")
        if running != "true":
            return {"state": "exited", "exit_code": int(code) if code.lstrip("-").isdigit() else -1}
        exit_file = self.home / ".workload-exit"
        with contextlib.suppress(OSError, ValueError):
            return {"state": "exited", "exit_code": int(exit_file.read_text().strip()[:8])}
        return {"state": "running"}

    def written_bytes(self) -> int:
        """What the container wrote outside its home (its writable layer), for the disk quota."""
        out = self.docker("inspect", "--size", "-f", "{{.SizeRw}}", self.container, timeout=60)
        text = out.stdout.decode().strip()
        return int(text) if text.isdigit() else 0

    def tear_down(self) -> str:
        """Container, network and firewall rules gone; returns the container's name if one was removed."""
        removed = self.docker("rm", "-f", self.container).returncode == 0
        self.docker("network", "rm", self.network)
        if self.runtime.firewall:
            for rule in self._rules():
                while self._iptables("-D", FIREWALL_CHAIN, *rule).returncode == 0:
                    pass
        return self.container if removed else ""


def leftovers_clear(runtime: ContainerRuntime) -> int:
    """Remove the containers, networks and firewall rules of leases ``runtime.owner`` made in an earlier run that
    was killed before it could (the sandbox's, at start). Returns how many leases' walls were cleared."""
    owned = f"label=gpu-broker.owner={runtime.owner}"
    listed = subprocess.run([runtime.docker, "ps", "-aq", "--filter", owned],  # noqa: S603
                            capture_output=True, text=True, timeout=60, check=False).stdout.split()  # fmt: skip
    if listed:
        subprocess.run([runtime.docker, "rm", "-f", *listed], capture_output=True, timeout=120, check=False)  # noqa: S603
    lease_of = '{{.Label "gpu-broker.lease"}}'
    networks = subprocess.run([runtime.docker, "network", "ls", "--filter", owned, "--format", lease_of],  # noqa: S603
                              capture_output=True, text=True, timeout=60, check=False).stdout.split()  # fmt: skip
    for lease_id in networks:
        LeaseWalls(runtime, lease_id=lease_id, uid=0, work_dir=Path("/nonexistent"), login_name="lease").tear_down()
    return len(networks)
