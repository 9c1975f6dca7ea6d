"""Real containers for tests: the lease image built from Debian's packages (``deploy/lease-image/build.sh``) on
the machine's own Docker daemon, and stand-in GPU device nodes made with ``mknod``.

``.ci/run`` installs Debian's ``docker.io`` and starts ``dockerd`` where it can; where no daemon answers (or the
tests do not run as root, which a lease's own uid and firewall rule need), the tests that need one are skipped
with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from providers.community.containers import ContainerRuntime, runtime_probe

BUILD = Path(__file__).resolve().parent.parent / "deploy" / "lease-image" / "build.sh"
TEST_IMAGE = "gpu-broker-lease:1"
NVIDIA_MAJOR = 195  # the character device major of /dev/nvidiaN and /dev/nvidiactl (devices.txt)


@functools.cache
def docker_unavailable() -> str:
    """Why real containers cannot run here, or "" when they can (the lease image is then built)."""
    if os.geteuid() != 0:
        return "real lease containers need root (a uid of their own per lease, a firewall rule)"
    docker = shutil.which("docker")
    if docker is None:
        return "docker is not installed (.ci/run installs Debian's docker.io)"
    info = subprocess.run([docker, "info"], capture_output=True, timeout=60, check=False)
    if info.returncode != 0:
        return "no Docker daemon answers (.ci/run starts dockerd)"
    built = subprocess.run([str(BUILD), TEST_IMAGE], capture_output=True, timeout=900, check=False)
    if built.returncode != 0:
        return f"the lease image could not be built: {built.stderr.decode(errors='replace')[-300:]}"
    return ""


def stand_in_gpus(directory: Path, count: int) -> Path:
    """``count`` GPU device nodes and the control node, as the NVIDIA driver names them, in ``directory``:
    character devices of the driver's major that open nothing on a machine without the driver."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        os.mknod(directory / f"nvidia{index}", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
    os.mknod(directory / "nvidiactl", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, 255))
    return directory


def lease_runtime(dev_root: Path) -> ContainerRuntime:
    """The host's runtime for walled leases, publishing on loopback; skips the test where there is none."""
    why = docker_unavailable()
    if why:
        pytest.skip(why)
    runtime = runtime_probe(image=TEST_IMAGE, dev_root=dev_root, publish_address="127.0.0.1")
    if isinstance(runtime, str):
        pytest.skip(runtime)
    return runtime
