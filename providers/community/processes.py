"""A lease's processes on a host without walls: each workload in its own session and process group
(``ProcessGroup``), ended as a group (SIGTERM, then SIGKILL after a grace period); the disk a lease's directory
holds (``disk_usage``); and the stand-in process that answers on a lease's ports where a container image cannot
run for want of Docker.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
