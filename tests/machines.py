"""Cloud machines as real containers, for running the boot script the broker renders as a cloud would.

A ``Machine`` is a container of the lease image (``tests/containers.py``) on the host's network, so it reaches
the test's live broker on 127.0.0.1, with its disks (``/opt/gpu-broker`` and ``/home``) bind-mounted from the
test's directory. Booting runs the user data with bash as root, as cloud-init does; rebooting removes the
container (every process dies) and starts a new one on the same disks, then runs the user data again, as GCP
does at every boot. No systemd runs inside, so the script takes its path for machines without one.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.containers import TEST_IMAGE, docker_unavailable

# Simulated GPUs for the agent, passed the way the boot script reads them (a machine here has none).
SIMULATE = "Tesla T4:16x1"


def docker_or_skip() -> str:
    """The ``docker`` program, once the lease image is built; skips the test, saying why, where it cannot be."""
    why = docker_unavailable()
    if why:
        pytest.skip(why)
    return shutil.which("docker") or "docker"


class Machine:
    """One rented machine: its disks live in ``disk``; its processes live as long as its container."""

    def __init__(self, disk: Path, *, login_user: str, image: str = TEST_IMAGE):
        self.docker = docker_or_skip()
        self.disk = disk
        self.login_user = login_user
        self.image = image
        self.name = ""
        (disk / "opt").mkdir(parents=True, exist_ok=True)
        (disk / "home").mkdir(parents=True, exist_ok=True)

    def _docker(self, *args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.docker, *args], input=stdin, capture_output=True, timeout=timeout, check=False)

    def exec(self, script: str, *, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout=180):
        """``script`` run by bash as root inside the machine."""
        flags = [f"--env={name}={value}" for name, value in (env or {}).items()]
        return self._docker("exec", "-i", *flags, self.name, "bash", "-c", script, stdin=stdin, timeout=timeout)

    def power_on(self, *, prepare: str = "") -> None:
        """A fresh container on the machine's disks, with the login account the image of a cloud has, then
        ``prepare`` (e.g. to take Python away from the image)."""
        self.name = f"gpu-broker-machine-{uuid.uuid4().hex[:12]}"
        started = self._docker(
            "run", "-d", "--name", self.name, "--network", "host", "--entrypoint", "sleep",
            "-v", f"{self.disk / 'opt'}:/opt/gpu-broker", "-v", f"{self.disk / 'home'}:/home",
            self.image, "infinity",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr.decode(errors="replace")
        user = self.login_user
        account = f"{user}:x:1000:1000::/home/{user}:/bin/bash"
        made = self.exec(
            f"echo '{account}' >>/etc/passwd && echo '{user}:x:1000:' >>/etc/group"
            f" && install -d -o 1000 -g 1000 /home/{user}\n{prepare}"
        )
        assert made.returncode == 0, made.stderr.decode(errors="replace")

    def boot(self, user_data: bytes) -> subprocess.CompletedProcess:
        """The user data run as cloud-init runs it: saved, then run by bash as root."""
        return self.exec(
            "cat >/var/lib/user-data && exec bash /var/lib/user-data",
            stdin=user_data,
            env={"GPU_BROKER_SIMULATE": SIMULATE},
        )

    def power_off(self) -> None:
        """Every process stops at once, as in a power cut; the disks stay."""
        if self.name:
            self._docker("rm", "-f", self.name)

    def agents(self) -> list[str]:
        """The command lines of the lease agents running on the machine (not the ``flock`` holding its lock)."""
        listed = self.exec('for p in /proc/[0-9]*; do tr "\\0" " " <"$p/cmdline" 2>/dev/null; echo; done')
        lines = listed.stdout.decode(errors="replace").splitlines()
        return [line for line in lines if "agent.pyz lease" in line and not line.startswith("flock")]

    def log(self) -> str:
        """The agent's log on the machine (the path the boot script starts it with)."""
        return self.exec("cat /var/log/gpu-broker-agent.log").stdout.decode(errors="replace")
