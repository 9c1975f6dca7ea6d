"""The lease agent's executors on a machine of its own: ``HostExecutor`` does the work for real (``nvidia-smi``,
Docker with the NVIDIA runtime, bash, the machine's sshd); ``SimulatedExecutor`` stands in for it where there
are no GPUs (the sandboxes, tests, ``--simulate``). The contract they keep is ``executor_base.Executor``.

Standard library only: it travels in the lease agent's bundle (``bundle.py``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from providers.community.executor_base import (
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    ExecutorError,
    GpuSeen,
    SshSeen,
    _banner,
    _run,
    _tail,
    telemetry_sample,
    text_tail,
    workload_env,
)

CONTAINER_NAME = "gpu-broker-workload"
WORK_DIR = Path("/opt/gpu-broker")
# A workload script's PATH unless the buyer's env sets one (Debian's default for a login shell).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HostExecutor:
    """The real machine: ``nvidia-smi``, Docker with the NVIDIA runtime, bash, and the machine's sshd."""

    name = "host"

    def __init__(self, *, gpu_wait_s: float = 900.0, work_dir: Path = WORK_DIR):
        self.gpu_wait_s = gpu_wait_s  # a driver installed at boot (Alibaba, Tencent) takes minutes
        self.work_dir = work_dir
        self._script: subprocess.Popen[bytes] | None = None
        self._kind = "none"

    def _smi(self, query: str) -> list[list[str]]:
        binary = shutil.which("nvidia-smi")
        if binary is None:
            raise ExecutorError("nvidia-smi not found: the NVIDIA driver is not installed")
        out = _run([binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"], timeout=30)
        if out.returncode != 0:
            raise ExecutorError(f"nvidia-smi failed: {_tail(out.stderr, 200)}")
        return [[part.strip() for part in line.split(",")] for line in out.stdout.decode().strip().splitlines()]

    def gpus(self) -> list[GpuSeen]:
        deadline = time.monotonic() + self.gpu_wait_s
        while True:
            try:
                rows = self._smi("index,name,memory.total")
                return [GpuSeen(int(i), name, round(float(mib) / 1024)) for i, name, mib in rows]
            except ExecutorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(10)

    def telemetry(self) -> list[dict[str, Any]]:
        rows = self._smi("index,utilization.gpu,temperature.gpu,power.draw,memory.used")
        return [telemetry_sample(int(i), float(u), float(t), float(p), float(m) / 1024) for i, u, t, p, m in rows]

    def start(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        self._kind = str(workload.get("kind") or "none")
        env = workload_env(workload, secrets)
        if self._kind == "container":
            return self._start_container(workload, env, str(secrets.get("registry_password") or ""))
        if self._kind == "script":
            return self._start_script(str(workload.get("script") or ""), env, login_user)
        return "no workload: the machine is yours over SSH"

    def resume(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        """The workload again after a reboot, for an agent re-attaching to its lease. A container is started
        again with ``docker start`` (Docker's own ``--restart unless-stopped`` may have done it already), never
        run a second time; a script is started again from the top, since the reboot killed it and nothing else
        would. Raises ``ExecutorError`` when it cannot."""
        self._kind = str(workload.get("kind") or "none")
        if self._kind == "container":
            docker = shutil.which("docker")
            if docker is None:
                raise ExecutorError("docker is not installed on this image")
            state = _run([docker, "inspect", "-f", "{{.State.Running}}", CONTAINER_NAME], timeout=30)
            if state.returncode != 0:
                raise ExecutorError(f"the workload's container {CONTAINER_NAME} is gone: {_tail(state.stderr, 200)}")
            if not state.stdout.decode().startswith("true"):
                started = _run([docker, "start", CONTAINER_NAME], timeout=300)
                if started.returncode != 0:
                    raise ExecutorError(f"docker start failed: {_tail(started.stderr)}")
            return f"container {CONTAINER_NAME} started again"
        if self._kind == "script":
            return self._start_script(str(workload.get("script") or ""), workload_env(workload, secrets), login_user)
        return "no workload: the machine is yours over SSH"

    def _env_file(self, env: dict[str, str]) -> Path:
        path = self.work_dir / "workload.env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            for name, value in env.items():
                handle.write(f"{name}={value}\n")
        return path

    def _start_container(self, workload: dict[str, Any], env: dict[str, str], registry_password: str) -> str:
        docker = shutil.which("docker")
        if docker is None:
            raise ExecutorError("docker is not installed on this image")
        image = str(workload["image"])
        registry = workload.get("registry") or {}
        if registry.get("username"):
            login = _run(
                [docker, "login", str(registry.get("server") or ""), "-u", str(registry["username"]),
                 "--password-stdin"],
                timeout=120, stdin=registry_password.encode(),
            )  # fmt: skip
            if login.returncode != 0:
                raise ExecutorError(f"registry login failed: {_tail(login.stderr)}")
        pulled = _run([docker, "pull", image], timeout=3600)
        if pulled.returncode != 0:
            raise ExecutorError(f"could not pull {image}: {_tail(pulled.stderr)}")
        args = [docker, "run", "-d", "--name", CONTAINER_NAME, "--restart", "unless-stopped", "--gpus", "all"]
        if workload.get("shm_size_gb"):
            args += ["--shm-size", f"{int(workload['shm_size_gb'])}g"]
        for port in workload.get("ports") or []:
            args += ["-p", f"{int(port)}:{int(port)}"]
        env_file = self._env_file(env)
        args += ["--env-file", str(env_file)]  # a file, not argv: secret values stay out of the process list
        command = [str(c) for c in workload.get("command") or []]
        if command:
            args += ["--entrypoint", command[0]]
        args += [image, *command[1:], *(str(a) for a in workload.get("args") or [])]
        started = _run(args, timeout=300)
        env_file.unlink(missing_ok=True)
        if started.returncode != 0:
            raise ExecutorError(f"docker run failed: {_tail(started.stderr)}")
        container = started.stdout.decode().strip()[:12]
        time.sleep(3)
        state = _run([docker, "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", container], timeout=30)
        if not state.stdout.decode().startswith("true"):
            logs = _run([docker, "logs", "--tail", "20", container], timeout=30)
            raise ExecutorError(f"the container exited at once: {_tail(logs.stdout + logs.stderr)}")
        return f"container {container} running {image}"

    def _start_script(self, script: str, env: dict[str, str], login_user: str) -> str:
        """``bash workload.sh`` as the login user, its environment exactly the buyer's values: they are handed
        to the process as data (``execve``'s environment), never read by a shell, so quotes, ``$``, backticks,
        spaces and non-ASCII arrive byte for byte and nothing in them runs."""
        try:
            account = pwd.getpwnam(login_user)
        except KeyError:
            raise ExecutorError(f"the login user {login_user!r} does not exist on this image") from None
        switch = os.geteuid() == 0
        if not switch and account.pw_uid != os.geteuid():
            raise ExecutorError(f"the agent must run as root to start the script as {login_user}")
        bash = shutil.which("bash")
        if bash is None:
            raise ExecutorError("bash is not installed on this image")
        path = self.work_dir / "workload.sh"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(script)
        if switch:
            os.chown(path, account.pw_uid, account.pw_gid)
        home = account.pw_dir if os.path.isdir(account.pw_dir) else "/"
        base = {"HOME": account.pw_dir, "USER": login_user, "LOGNAME": login_user, "PATH": DEFAULT_PATH,
                "SHELL": account.pw_shell or bash}  # fmt: skip
        log_path = self.work_dir / "workload.log"
        # The work directory is root's (it holds the lease's key), so the user gets no path into it: the script
        # is handed over as an open descriptor that bash reads through /dev/fd.
        script_fd = os.open(path, os.O_RDONLY)
        try:
            with open(log_path, "ab") as out:
                self._script = subprocess.Popen(  # noqa: S603
                    [bash, f"/dev/fd/{script_fd}"],
                    env={**base, **env}, cwd=home, pass_fds=(script_fd,), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    user=account.pw_uid if switch else None, group=account.pw_gid if switch else None,
                    extra_groups=[] if switch else None,
                )  # fmt: skip
        finally:
            os.close(script_fd)
        time.sleep(1)
        code = self._script.poll()
        if code not in (None, 0):
            raise ExecutorError(f"the script exited with {code}: {_tail(log_path.read_bytes())}")
        return f"script started (pid {self._script.pid}, output in {log_path})"

    def workload_state(self) -> dict[str, Any]:
        if self._kind == "container":
            docker = shutil.which("docker") or "docker"
            out = _run([docker, "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", CONTAINER_NAME], timeout=30)
            running, _, exit_code = out.stdout.decode().strip().partition(" ")
            return {"state": "running" if running == "true" else "exited", "exit_code": int(exit_code or 0)}
        if self._kind == "script" and self._script is not None:
            returned = self._script.poll()
            return {"state": "running"} if returned is None else {"state": "exited", "exit_code": returned}
        return {"state": "none"}

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        """The workload's last lines: its container's (``docker logs --tail``), else the script's log file."""
        if self._kind == "container":
            docker = shutil.which("docker") or "docker"
            out = _run([docker, "logs", "--tail", str(int(lines)), CONTAINER_NAME], timeout=30)
            return text_tail(out.stdout + out.stderr, lines)
        path = self.work_dir / "workload.log"
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                return text_tail(handle.read(), lines)
        except OSError:
            return ""

    def ssh(self) -> SshSeen:
        for _ in range(30):
            if _banner("127.0.0.1", 22):
                return SshSeen(True, 22)
            time.sleep(2)
        return SshSeen(False, 22)

    def expose(self, ports: list[int]) -> list[dict[str, int]]:
        """The machine's own ports: a container publishes each on the same number (``docker run -p P:P``)."""
        return [{"port": port, "host_port": port} for port in ports]

    def host_keys(self) -> list[str]:
        keys = []
        for kind in ("ed25519", "ecdsa", "rsa"):
            path = Path(f"/etc/ssh/ssh_host_{kind}_key.pub")
            if path.exists():
                keys.append(" ".join(path.read_text().split()[:2]))
        return keys

    def stop(self) -> None:
        if self._kind == "container" and shutil.which("docker"):
            _run([shutil.which("docker") or "docker", "rm", "-f", CONTAINER_NAME], timeout=120)
        if self._script is not None and self._script.poll() is None:
            os.killpg(self._script.pid, 15)


class SimulatedExecutor:
    """A machine without GPUs, Docker or sshd, for the sandboxes and tests: reports the GPUs it was given,
    "starts" the workload (or fails it with ``fail_workload``), and answers SSH's identification string on a
    port of its own, so "SSH listening" is still checked over a real socket."""

    name = "simulated"

    def __init__(self, gpus: list[GpuSeen], *, fail_workload: str | None = None, ssh_host: str = "127.0.0.1"):
        self._gpus = gpus
        self.fail_workload = fail_workload
        self.ssh_host = ssh_host
        self._kind = "none"
        self._listener: socket.socket | None = None
        self._services: list[socket.socket] = []
        self._closed = threading.Event()
        blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + os.urandom(32)
        self._host_key = "ssh-ed25519 " + base64.b64encode(blob).decode()

    def gpus(self) -> list[GpuSeen]:
        return list(self._gpus)

    def telemetry(self) -> list[dict[str, Any]]:
        busy = self._kind != "none"
        samples = []
        for gpu in self._gpus:
            util = random.uniform(88, 99) if busy else random.uniform(0, 4)  # noqa: S311 - a simulation
            # Idle near a tenth of the rating, busy up to nine tenths: within what the board can draw.
            power = gpu.power_limit_w * (0.1 + 0.8 * util / 100)
            samples.append(telemetry_sample(gpu.index, util, 36 + util * 0.4, power, gpu.memory_gb * (0.7 * busy)))
        return samples

    def start(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        self._kind = str(workload.get("kind") or "none")
        if self.fail_workload:
            raise ExecutorError(self.fail_workload)
        if self._kind == "container":
            return f"container running {workload.get('image')} (simulated)"
        if self._kind == "script":
            return "script started (simulated)"
        return "no workload: the machine is yours over SSH"

    def resume(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str:
        """After a (simulated) reboot: the workload "starts" again, as ``start`` does."""
        return self.start(workload, secrets, login_user)

    def workload_state(self) -> dict[str, Any]:
        return {"state": "running" if self._kind != "none" else "none"}

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        """What a simulated workload "prints": one line saying what it is."""
        return "" if self._kind == "none" else f"simulated {self._kind} workload running"

    def ssh(self) -> SshSeen:
        if self._listener is None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind((self.ssh_host, 0))
            self._listener.listen(8)
            threading.Thread(target=self._answer, daemon=True).start()
        port = int(self._listener.getsockname()[1])
        return SshSeen(_banner(self.ssh_host, port), port, self.ssh_host)

    def _answer(self) -> None:
        listener = self._listener
        while listener is not None and not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"SSH-2.0-gpu-broker-sandbox\r\n")
                except OSError:
                    pass

    def host_keys(self) -> list[str]:
        return [self._host_key]

    def expose(self, ports: list[int]) -> list[dict[str, int]]:
        """A port of its own for each exposed one, answering HTTP with a line that says what runs there, so the
        URLs an order shows lead somewhere in the sandbox too."""
        exposed = []
        for port in ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((self.ssh_host, 0))
            listener.listen(8)
            self._services.append(listener)
            body = f"simulated workload ({self._kind}) on the machine's port {port}\n".encode()
            threading.Thread(target=self._serve_http, args=(listener, body), daemon=True).start()
            exposed.append({"port": port, "host_port": int(listener.getsockname()[1])})
        return exposed

    def _serve_http(self, listener: socket.socket, body: bytes) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        while not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(head.encode() + body)
                except OSError:
                    pass

    def stop(self) -> None:
        self._closed.set()
        for listener in [self._listener, *self._services]:
            if listener is not None:
                # close() alone leaves a socket that a thread blocks in accept() on still listening (Linux):
                # shutdown wakes that thread, so nothing answers once the machine is stopped.
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()


def parse_simulated(spec: str) -> list[GpuSeen]:
    """``"NVIDIA H100 80GB HBM3:80x8"`` -> eight 80 GB GPUs with that name."""
    name_memory, _, count = spec.rpartition("x")
    name, _, memory = name_memory.rpartition(":")
    if not name or not memory.isdigit() or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--simulate wants NAME:GBxCOUNT, e.g. 'NVIDIA H100 80GB HBM3:80x8', not {spec!r}")
    return [GpuSeen(i, name, int(memory)) for i in range(int(count))]
