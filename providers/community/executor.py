"""What a host agent runs for each lease on a shared machine: the lease's own GPUs, ports, disk and login.

One ``LeaseExecutor`` for every lease, real or simulated. It is put together from three layers:

- devices (``devices.py``): ``NvidiaDevices`` reads ``nvidia-smi`` (and its MIG instances); ``FakeDevices``
  stands in for them under ``--simulate``. Nothing else differs between a real host and a simulated one.
- the runner: a container through Docker with the NVIDIA runtime (``lease_plan.docker_run_argv``) where the
  host has Docker, else a process in its own session and process group (``processes.ProcessGroup``). A
  container image cannot run without Docker, so there a stand-in process holds the lease's ports in its place.
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
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from providers.community.containers import SSH_PORT_IN_CONTAINER, ContainerRuntime, LeaseWalls, Limits
from providers.community.devices import FakeDevices, NvidiaDevices, visible_devices
from providers.community.executor_base import LOG_TAIL_BYTES, ExecutorError, GpuSeen, SshSeen, _tail, text_tail
from providers.community.lease_plan import (
    AUTHORIZED_KEYS_IN_CONTAINER,
    LeasePlan,
    authorized_keys_text,
    container_name,
    docker_run_argv,
)
from providers.community.processes import _STAND_IN, ProcessGroup, disk_usage

DISK_QUOTA_EXCEEDED = "disk quota exceeded"
PULL_LOGIN_S = 120
PULL_S = 3600  # a large image over a slow uplink; the broker's boot deadline ends the lease sooner anyway
RUN_S = 300


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
        self.paused = False  # stopped by its buyer (``pause``), until ``unpause``
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
        if self.paused:
            return {"state": "stopped"}
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

    # ------------------------------------------------------------------ stop, start, restart, logs (issue 36)

    def pause(self) -> None:
        """Stop the lease's container, keeping it (its disk), its GPUs and ports for ``unpause``. A simulated lease
        without walls only records it. ``ExecutorError`` where the workload runs as processes (nothing to keep)."""
        if self.walls is not None:
            stopped = self.walls.docker("stop", "-t", str(int(self.grace_s)), self.walls.container, timeout=120)
            if stopped.returncode != 0:
                raise ExecutorError(f"docker stop failed: {_tail(stopped.stderr)}")
        elif not self.simulate and self.runner != "none":
            raise ExecutorError("this host runs leases as processes, not containers: a stop would lose the workload")
        self.paused = True

    def unpause(self) -> None:
        """Start the stopped container again (never a second one)."""
        if self.walls is not None:
            self.walls.restart()
        self.paused = False

    def restart(self) -> None:
        """Restart the lease's container in place (``docker restart``)."""
        if self.walls is not None:
            restarted = self.walls.docker("restart", "-t", str(int(self.grace_s)), self.walls.container, timeout=180)
            if restarted.returncode != 0:
                raise ExecutorError(f"docker restart failed: {_tail(restarted.stderr)}")
        elif not self.simulate and self.runner != "none":
            raise ExecutorError("this host runs leases as processes, not containers: nothing to restart in place")
        self.paused = False

    def logs(self, lines: int) -> str:
        """The workload's last ``lines`` lines (within ``LOG_TAIL_BYTES``): a buyer's image's container output
        (``docker logs --tail``), else the log the lease's script writes (in its home when walled)."""
        if self.walls is not None and self.kind == "container":
            out = self.walls.docker("logs", "--tail", str(int(lines)), self.walls.container, timeout=30)
            return text_tail(out.stdout + out.stderr, lines, LOG_TAIL_BYTES)
        folder = self.walls.home if self.walls is not None else self.plan.work_dir
        return text_tail(_file_tail(folder / "workload.log", LOG_TAIL_BYTES), lines, LOG_TAIL_BYTES)

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


def _file_tail(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of the regular file ``path``, nothing when it is absent or anything else. The
    lease writes this file: opened without following a link (the agent runs as root, and a tenant's
    ``ln -s /etc/shadow workload.log`` must send nothing of the host's) and without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd)
        if not stat.S_ISREG(size.st_mode):
            return b""
        handle.seek(max(0, size.st_size - limit))
        return handle.read(limit)
