"""The lease agent: the broker's agent on a machine rented for one order, started by the boot script.

    python3 agent.pyz lease --spec /opt/gpu-broker/lease.json                  # what the boot script runs
    python3 agent.pyz lease --spec lease.json --simulate "NVIDIA H100 80GB HBM3:80x8"   # no GPUs needed

The same code runs inside an independent host's agent for each lease it starts (``agent.py``), and in the
sandboxes, which "boot" an instance by starting it from the instance's user data (``sandboxes/boot.py``).

A lease's life, every step but the first signed with the lease's own key (``protocol.py``):

1. ``POST /agent/v1/lease/claim`` ``{"boot_token"}`` -> ``{"key_id", "secret", "heartbeat_s"}``. The token from
   the user data works once and expires; whoever reads the user data later holds nothing.
2. ``POST /agent/v1/lease/secrets`` -> ``{"env": {...}, "registry_password"}``: the buyer's secret values,
   which never appear in user data, logs or the broker's answers.
3. The executor checks the GPUs, starts the workload (a container, a script, or nothing), finds SSH listening
   and reads the host keys.
4. ``POST /agent/v1/lease/ready`` ``{"gpus", "workload", "ssh", "host_keys", "ports"}`` -> ``{"state": "running"}``, or
   ``{"state": "refused", "problem"}`` when the machine is not what the order bought (the broker terminates it
   and fails over). A step that fails posts ``/agent/v1/lease/failed`` ``{"stage", "reason"}`` instead.
5. ``POST /agent/v1/lease/heartbeat`` ``{"gpus": [...telemetry], "workload": {"state"}}`` every ``heartbeat_s``;
   an answer ``{"state": "ended"}`` stops the workload and the agent.

Surviving a reboot (``main``): the claimed key, and the secret values a script needs again, are kept in a
root-only key file (0600, replaced atomically) beside the lease file. An agent that finds it never spends the
token again: it re-attaches, asking the broker with a heartbeat signed by the kept key whether the lease still
runs, starts the workload again (a reboot killed it) and goes on heartbeating. An exclusive lock beside the
lease file makes a second agent exit at once, so a boot script run twice (GCP runs it at every boot) never
starts two.

Standard library only: the file runs on any image with Python 3.9+, fetched from the broker as a zipapp.
"""

from __future__ import annotations

import argparse
import base64
import errno
import fcntl
import hashlib
import json
import logging
import os
import pwd
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from providers.community import protocol
from untrusted import jsonbody

log = logging.getLogger("gpu-broker.lease")

AGENT_VERSION = "1"
MAX_ANSWER = 1024 * 1024
MAX_REASON = 2000
CONTAINER_NAME = "gpu-broker-workload"
WORK_DIR = Path("/opt/gpu-broker")
KEY_FILE_NAME = "agent.key"  # beside the lease file: the lease's key and its secrets, root-only
LOCK_FILE_NAME = "agent.lock"  # beside the lease file: held by the one agent of this machine
# A workload script's PATH unless the buyer's env sets one (Debian's default for a login shell).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# main's exit status when the lease is over for good (ended, refused, failed, its token or key refused): the
# systemd unit's RestartPreventExitStatus lists it with 0, so only a crash is restarted.
EXIT_OVER = 3
EXIT_BUSY = 4  # another agent holds the lock

# (method, path with query, body, headers) -> (HTTP status, body); raises OSError when the broker is unreachable.
Transport = Callable[[str, str, bytes, dict[str, str]], tuple[int, bytes]]


class ExecutorError(Exception):
    """A step of the lease failed on the machine; the message is what the buyer reads on the order page."""


class BrokerRefused(Exception):
    """The broker answered a lease call with an error (a spent token, a forged signature, ...)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


@dataclass(frozen=True)
class GpuSeen:
    index: int
    name: str
    memory_gb: int
    power_limit_w: int = 300  # the board's rated power (nvidia-smi's power.limit); a simulation draws within it


@dataclass(frozen=True)
class SshSeen:
    listening: bool
    port: int
    host: str | None = None  # only when the machine knows the address buyers reach it at (a sandbox, a host)


class Executor(Protocol):
    """What runs on the machine. ``HostExecutor`` does it for real; ``SimulatedExecutor`` stands in."""

    name: str

    def gpus(self) -> list[GpuSeen]: ...

    def telemetry(self) -> list[dict[str, Any]]: ...

    def start(self, workload: dict[str, Any], secrets: dict[str, Any], login_user: str) -> str: ...

    def workload_state(self) -> dict[str, Any]: ...

    def ssh(self) -> SshSeen: ...

    def host_keys(self) -> list[str]: ...

    def expose(self, ports: list[int]) -> list[dict[str, int]]: ...

    def stop(self) -> None: ...


def host_key_fingerprint(line: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line (``ssh-keygen -lf``)."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def telemetry_sample(index: int, util: float, temp: float, power: float, used_gb: float) -> dict[str, Any]:
    return {
        "index": index,
        "utilization_pct": round(util, 1),
        "temperature_c": round(temp, 1),
        "power_w": round(power, 1),
        "memory_used_gb": round(used_gb, 2),
    }


# ------------------------------------------------------------------------------------------- executors


def _run(args: list[str], *, timeout: float, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, input=stdin, capture_output=True, timeout=timeout, check=False)  # noqa: S603


def _tail(data: bytes, limit: int = 600) -> str:
    return data.decode("utf-8", "replace").strip()[-limit:]


def workload_env(workload: dict[str, Any], secrets: dict[str, Any]) -> dict[str, str]:
    """The workload's environment: the lease file's plain values, then the secret ones fetched from the broker."""
    env = {str(e["name"]): str(e.get("value") or "") for e in workload.get("env") or []}
    env.update({str(k): str(v) for k, v in (secrets.get("env") or {}).items()})
    return env


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


def _banner(host: str, port: int) -> bool:
    """Does an SSH server answer on host:port? (its identification string starts with ``SSH-``)"""
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


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
                listener.close()


def parse_simulated(spec: str) -> list[GpuSeen]:
    """``"NVIDIA H100 80GB HBM3:80x8"`` -> eight 80 GB GPUs with that name."""
    name_memory, _, count = spec.rpartition("x")
    name, _, memory = name_memory.rpartition(":")
    if not name or not memory.isdigit() or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--simulate wants NAME:GBxCOUNT, e.g. 'NVIDIA H100 80GB HBM3:80x8', not {spec!r}")
    return [GpuSeen(i, name, int(memory)) for i in range(int(count))]


# ------------------------------------------------------------------------------------------------ the agent


def http_transport(broker_url: str, *, timeout: float = 15.0) -> Transport:
    """Requests to the broker over HTTP(S), each bounded by ``timeout``."""
    base = broker_url.rstrip("/")

    def send(method: str, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(base + target, data=body, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the lease's broker
                return int(response.status), response.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read(MAX_ANSWER + 1)

    return send


def write_private(path: Path, data: bytes) -> None:
    """``data`` as ``path``, readable by its owner alone, replaced atomically: a reader (or a reboot) finds the
    old file or the new one, never a torn one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class LeaseAgent:
    """One lease: claim, secrets, checks, ready, heartbeats. ``boot``, ``reattach`` and ``heartbeat`` are single
    steps (tests drive them one at a time); ``run`` loops until the broker ends the lease or ``stop`` is set.

    With a ``key_file`` (a machine's own agent; not the host agent's leases, nor the sandboxes'), the claimed
    key is kept there once the token is spent, with the secret env a script needs to start again, and ``run``
    re-attaches with it instead of booting when it exists."""

    def __init__(
        self,
        lease: dict[str, Any],
        executor: Executor,
        *,
        transport: Transport | None = None,
        claim_wait_s: float = 900.0,
        key_file: Path | None = None,
    ):
        self.lease = lease
        self.executor = executor
        self.transport = transport or http_transport(str(lease["broker_url"]))
        self.claim_wait_s = claim_wait_s
        self.key_file = key_file
        self.key_id = ""
        self._secret = ""
        self.heartbeat_s: float = protocol.HEARTBEAT_S
        # booting -> running | refused | failed | ended | claim_refused | key_refused
        self.state = "booting"

    def _post(self, path: str, payload: dict[str, Any], *, signed: bool = True, tries: int = 6) -> dict[str, Any]:
        """One call, tried again (with a fresh signature and nonce) while the broker cannot be reached or answers
        5xx or 429, waiting 1, 2, 4... seconds; other refusals raise ``BrokerRefused`` at once."""
        body = json.dumps(payload).encode()
        for attempt in range(tries):
            headers = {"Content-Type": "application/json"}
            if signed:
                headers.update(protocol.sign(self.key_id, self._secret, "POST", path, body))
            try:
                status, raw = self.transport("POST", path, body, headers)
            except OSError:
                if attempt + 1 >= tries:
                    raise
                time.sleep(2.0**attempt)
                continue
            if (status >= 500 or status == 429) and attempt + 1 < tries:
                log.warning("%s answered %s; trying again", path, status)
                time.sleep(2.0**attempt)
                continue
            return self._answer(status, raw)
        raise BrokerRefused(0, "unreachable", f"{path}: no answer")

    def _answer(self, status: int, raw: bytes) -> dict[str, Any]:
        try:
            answer = jsonbody.bounded_json(raw, max_bytes=MAX_ANSWER)
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if status >= 400:
            raise BrokerRefused(status, str(answer.get("code", "")), str(answer.get("message", ""))[:300])
        return answer

    def claim(self) -> None:
        """Spend the boot token for the lease's key; retried while the broker cannot be reached."""
        deadline = time.monotonic() + self.claim_wait_s
        delay = 2.0
        while True:
            try:
                answer = self._post(
                    "/agent/v1/lease/claim",
                    {"boot_token": self.lease["boot_token"], "agent": {"version": AGENT_VERSION,
                                                                       "executor": self.executor.name}},
                    signed=False,
                    tries=1,
                )  # fmt: skip
                break
            except BrokerRefused as exc:
                # A token refused (401) is final; a broker in trouble (5xx, 429) is waited for, like no answer.
                if (exc.status < 500 and exc.status != 429) or time.monotonic() > deadline:
                    raise
                log.warning("the broker answered %s to the claim; retrying in %.0f s", exc.status, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("broker unreachable (%s); retrying in %.0f s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
        self.key_id, self._secret = str(answer["key_id"]), str(answer["secret"])
        self.heartbeat_s = float(answer.get("heartbeat_s") or protocol.HEARTBEAT_S)
        # The token is spent: from here on, only the kept key lets this machine's agent speak for the lease.
        self._keep({})

    def _keep(self, secrets: dict[str, Any]) -> None:
        if self.key_file is None:
            return
        kept = {"key_id": self.key_id, "secret": self._secret, "heartbeat_s": self.heartbeat_s, "secrets": secrets}
        write_private(self.key_file, json.dumps(kept).encode())

    def kept_key(self) -> dict[str, Any] | None:
        """What ``claim`` kept in the key file; None when there is no key file or nothing in it."""
        if self.key_file is None or not self.key_file.exists():
            return None
        try:
            kept = jsonbody.bounded_json(self.key_file.read_bytes(), max_bytes=MAX_ANSWER)
        except ValueError as exc:
            log.error("the key file %s is unreadable (%s); booting as if it were not there", self.key_file, exc)
            return None
        if not isinstance(kept, dict) or not isinstance(kept.get("key_id"), str) or not kept.get("secret"):
            log.error("the key file %s holds no key; booting as if it were not there", self.key_file)
            return None
        return kept

    def fail(self, stage: str, reason: str) -> None:
        self.state = "failed"
        log.error("lease failed at %s: %s", stage, reason)
        try:
            self._post("/agent/v1/lease/failed", {"stage": stage, "reason": reason[:MAX_REASON]})
        except (OSError, BrokerRefused) as exc:
            log.error("could not report the failure: %s", exc)

    def boot(self) -> str:
        """Claim, fetch the secrets, check the machine, start the workload and report ready. Returns the
        lease's state: ``running``, ``refused`` (the broker found the machine wrong), ``failed`` or
        ``claim_refused`` (the token was spent or expired)."""
        try:
            self.claim()
        except BrokerRefused as exc:
            log.error("the broker refused the boot token: %s", exc)
            self.state = "claim_refused"
            return self.state
        secrets = self._post("/agent/v1/lease/secrets", {})
        workload = dict(self.lease.get("workload") or {})
        if workload.get("kind") == "script":
            # A script started again after a reboot needs them, and the broker hands them out once, before ready.
            # (A container keeps its env in its own configuration; ``docker start`` reuses it.)
            self._keep({"env": secrets.get("env") or {}})
        try:
            gpus = self.executor.gpus()
        except ExecutorError as exc:
            self.fail("gpus", str(exc))
            return self.state
        login_user = str(self.lease.get("login_user") or "root")
        try:
            detail = self.executor.start(workload, secrets, login_user)
        except ExecutorError as exc:
            self.fail("workload", str(exc))
            return self.state
        ssh = self.executor.ssh()
        if not ssh.listening:
            self.fail("ssh", f"nothing answers SSH on port {ssh.port}")
            return self.state
        exposed = self.executor.expose([int(p) for p in self.lease.get("ports") or [] if int(p) != 22])
        answer = self._post(
            "/agent/v1/lease/ready",
            {
                "ports": exposed,
                "gpus": [{"index": g.index, "name": g.name, "memory_gb": g.memory_gb} for g in gpus],
                "workload": {"kind": str(workload.get("kind") or "none"), "detail": detail[:MAX_REASON]},
                "ssh": {"listening": True, "port": ssh.port, "user": login_user, "host": ssh.host},
                "host_keys": self.executor.host_keys(),
                "agent": {"version": AGENT_VERSION, "executor": self.executor.name},
            },
        )
        self.state = "running" if answer.get("state") == "running" else "refused"
        if self.state == "refused":
            log.error("the broker refused this machine: %s", answer.get("problem"))
            self.executor.stop()
        return self.state

    def reattach(self) -> str:
        """An agent started again on a machine whose lease it had claimed (a reboot, a crash): no token is spent.
        It asks the broker with a heartbeat signed by the kept key whether the lease still runs, and stops if not
        (``ended``, or ``key_refused`` for a key the broker no longer knows); otherwise it starts the workload
        again (``resume``) and returns ``running``. A broker it cannot reach yet is no reason to stop: the workload
        is resumed and the heartbeats that follow keep trying. A lease claimed but never ready answers ``ended``
        too (its secrets are handed out once): the attempt's boot deadline fails that machine over."""
        kept = self.kept_key()
        if kept is None:
            raise ValueError("reattach needs a kept key")
        self.key_id, self._secret = str(kept["key_id"]), str(kept["secret"])
        self.heartbeat_s = float(kept.get("heartbeat_s") or protocol.HEARTBEAT_S)
        try:
            if self.heartbeat() == "ended":
                log.info("the broker says this lease has ended")
                return self.state
        except BrokerRefused as exc:
            if exc.status in (401, 403):
                log.error("the broker refused the kept key: %s", exc)
                self.state = "key_refused"
                return self.state
            log.warning("the broker did not take the first heartbeat (%s); resuming the workload anyway", exc)
        except (OSError, ExecutorError) as exc:
            # The broker unreachable yet, or nvidia-smi not answering while the driver loads after the boot.
            log.warning("no first heartbeat (%s); resuming the workload anyway", exc)
        workload = dict(self.lease.get("workload") or {})
        saved = kept.get("secrets")
        secrets: dict[str, Any] = saved if isinstance(saved, dict) else {}
        login_user = str(self.lease.get("login_user") or "root")
        # Executors without ``resume`` (the host agent's per-lease one) never re-attach; ``start`` is their resume.
        start_again = getattr(self.executor, "resume", None) or self.executor.start
        try:
            detail = start_again(workload, secrets, login_user)
            log.info("re-attached: %s", detail)
        except ExecutorError as exc:
            # The lease is past ready, so there is no failure to report: the heartbeats carry the workload's
            # state, which the order shows.
            log.error("the workload did not start again: %s", exc)
        self.state = "running"
        return self.state

    def heartbeat(self) -> str:
        """One telemetry report; returns the broker's view of the lease (``running`` or ``ended``)."""
        answer = self._post(
            "/agent/v1/lease/heartbeat",
            {"gpus": self.executor.telemetry(), "workload": self.executor.workload_state()},
        )
        if answer.get("state") == "ended":
            self.state = "ended"
            self.executor.stop()
        return self.state

    def run(self, stop: threading.Event | None = None) -> str:
        stop = stop or threading.Event()
        try:
            first = self.reattach() if self.kept_key() is not None else self.boot()
            if first != "running":
                return self.state
            while not stop.wait(self.heartbeat_s):
                try:
                    if self.heartbeat() == "ended":
                        break
                except (OSError, BrokerRefused, ExecutorError) as exc:
                    log.warning("heartbeat not delivered: %s", exc)
        except (OSError, BrokerRefused, KeyError, ValueError) as exc:
            log.error("lease agent stopped: %s", exc)
            self.state = "failed"
        finally:
            if stop.is_set():
                self.executor.stop()
        return self.state


def hold_lock(path: Path) -> int | None:
    """An exclusive ``flock`` on ``path``, held for the life of the process (the descriptor stays open); None
    when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 once the broker ended the lease, ``EXIT_OVER`` when the lease is over otherwise (refused,
    failed, its token or key refused), ``EXIT_BUSY`` when another agent runs here, 1 for anything unforeseen (the
    systemd unit restarts only that)."""
    parser = argparse.ArgumentParser(prog="agent.pyz", description="the broker's agent on a rented machine")
    commands = parser.add_subparsers(dest="command", required=True)
    lease = commands.add_parser("lease", help="run one lease from the file the boot script wrote")
    lease.add_argument("--spec", required=True, help="the lease file (/opt/gpu-broker/lease.json)")
    lease.add_argument("--simulate", help="simulated GPUs, NAME:GBxCOUNT (no nvidia-smi, docker or sshd needed)")
    lease.add_argument("--key-file", help=f"where the lease's key is kept (default: {KEY_FILE_NAME} beside --spec)")
    lease.add_argument("--lock-file", help=f"held while this agent runs (default: {LOCK_FILE_NAME} beside --spec)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spec_path = Path(args.spec)
    lock = hold_lock(Path(args.lock_file) if args.lock_file else spec_path.with_name(LOCK_FILE_NAME))
    if lock is None:
        print("another lease agent runs on this machine; this one stops", flush=True)
        return EXIT_BUSY
    spec = json.loads(spec_path.read_text())
    executor: Executor = SimulatedExecutor(parse_simulated(args.simulate)) if args.simulate else HostExecutor()
    key_file = Path(args.key_file) if args.key_file else spec_path.with_name(KEY_FILE_NAME)
    state = LeaseAgent(spec, executor, key_file=key_file).run()
    print(f"lease ended: {state}", flush=True)
    if state in ("ended", "running"):
        return 0
    return EXIT_OVER if state in ("refused", "failed", "claim_refused", "key_refused") else 1


if __name__ == "__main__":
    raise SystemExit(main())
