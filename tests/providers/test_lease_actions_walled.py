"""Stop, start and restart of a walled lease, in a real container (issue 36): the container is stopped and kept
(its home, the lease's disk, survives), started again as the same container, restarted in place; and the logs
the agent sends are the buyer's image's container output, or the script's log in the lease's home."""

from __future__ import annotations

import subprocess
import time

from providers.community.executor import LeaseExecutor
from tests.providers.test_lease_walls import _lease, host

__all__ = ["host"]


def _container(lease: LeaseExecutor, template: str) -> str:
    assert lease.walls is not None
    return subprocess.run(["docker", "inspect", "-f", template, lease.walls.container],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()  # fmt: skip


def _until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_walled_lease_stops_keeping_its_disk_starts_as_the_same_container_and_restarts(host):
    lease = _lease(host, "i-333333333333", gpu=3, slot=0)
    lease.start({"kind": "script", "script": "echo kept > ~/marker\nfor i in 1 2 3; do echo line-$i; done\n"
                 "exec sleep 600\n"}, {}, "lease")  # fmt: skip
    _until(lambda: "line-3" in lease.logs(10), "the script's output")
    container = _container(lease, "{{.Id}}")

    lease.pause()
    assert _container(lease, "{{.State.Running}}") == "false"
    assert lease.workload_state() == {"state": "stopped"}
    assert (lease.walls.home / "marker").read_text() == "kept\n"

    lease.unpause()
    assert (_container(lease, "{{.Id}}"), _container(lease, "{{.State.Running}}")) == (container, "true")
    started = _container(lease, "{{.State.StartedAt}}")

    lease.restart()
    assert _container(lease, "{{.Id}}") == container
    assert _container(lease, "{{.State.StartedAt}}") != started
    assert lease.logs(2).splitlines()[-1].startswith("line-")
