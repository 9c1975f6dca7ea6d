"""What one lease owns on a shared host, decided before anything runs: its GPUs, ports, directory, disk quota,
account and login (``LeasePlan``), the buyer's keys as its ``authorized_keys``, and the ``docker run`` that
starts its container when the host has Docker but no walls (``docker_run_argv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PIDS_LIMIT = 4096


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
