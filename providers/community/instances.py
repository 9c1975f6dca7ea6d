"""A host agent's record of one launch (``Instance``): its GPUs, its lease and what ending it cleaned, as the
broker's describe and list read it; and the checks a launch's GPU request passes before it gets any.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from providers.community.devices import MigDevice
from providers.community.executor import LeaseExecutor
from providers.community.lease import LeaseAgent
from providers.community.mig import MigProfile

Answer = tuple[int, dict[str, Any]]  # an HTTP status and the JSON object answered with it
# Ended instances an agent remembers (a repeated terminate or launch answers from them), at most this many and
# this long; well over what a listing holds (protocol.MAX_LISTED) and any broker retry's horizon.
KEEP_ENDED = 1024
KEEP_ENDED_S = 7 * 86400.0


@dataclass
class Instance:
    id: str
    client_token: str
    order_ref: str
    gpus: int
    tags: dict[str, str]
    gpu_indexes: tuple[int, ...] = ()
    state: str = "pending"
    started: float = field(default_factory=time.monotonic)
    lease: LeaseAgent | None = None
    lease_stop: threading.Event = field(default_factory=threading.Event)
    ending: bool = False  # a terminate is cleaning up; the GPUs stay held until it is done
    ended: float | None = None  # time.monotonic() when it was terminated
    cleanup: dict[str, Any] | None = None
    # A MIG slice: its profile, the memory slices of its GPU it occupies, and the MIG device made for it.
    mig_profile: str = ""
    mig_slots: tuple[int, ...] = ()
    mig_device: MigDevice | None = None
    uid_slot: int = -1  # a walled lease's slot in the host's lease uids (containers.lease_uid)
    lease_file: dict[str, Any] | None = None  # what its boot script carried, kept to resume it after a restart

    @property
    def executor(self) -> LeaseExecutor | None:
        executor = self.lease.executor if self.lease is not None else None
        return executor if isinstance(executor, LeaseExecutor) else None

    def holds_gpus(self) -> bool:
        # A lease its buyer stopped keeps its GPUs: starting it again must never find them taken.
        return self.state in ("pending", "running", "stopped")

    def json(self, ssh: str) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "client_token": self.client_token,
            "order_ref": self.order_ref,
            "gpus": self.gpus,
            "gpu_indexes": list(self.gpu_indexes),
            "tags": self.tags,
            "ssh": ssh,
        }
        if self.mig_profile:
            answer["mig_profile"] = self.mig_profile
        if self.executor is not None and self.executor.problem:
            answer["problem"] = self.executor.problem
        if self.cleanup is not None:
            answer["cleanup"] = self.cleanup
        return answer


@dataclass(frozen=True)
class _Slice:
    """Where a MIG slice lease goes: its GPU, its profile, its first memory slice."""

    index: int
    profile: MigProfile
    start: int


def _check_indexes(asked: Any, gpus: int, total: int, held: dict[int, str]) -> Answer | None:
    """The refusal for a launch's ``gpu_indexes``, or None when the lease may have them."""
    if (
        not isinstance(asked, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in asked)
        or len(set(asked)) != len(asked)
    ):
        return _answer({"code": "invalid", "message": "gpu_indexes: distinct whole numbers"}, 400)
    if len(asked) != gpus:
        return _answer({"code": "invalid", "message": f"gpu_indexes names {len(asked)} GPUs; gpus is {gpus}"}, 400)
    if any(not 0 <= i < total for i in asked):
        return _answer({"code": "invalid", "message": f"gpu_indexes: this machine has GPUs 0 to {total - 1}"}, 400)
    busy = sorted(i for i in asked if i in held)
    if busy:
        return _answer({"code": "gpus_busy", "message": f"GPUs {busy} are held by another lease"}, 409)
    return None


def _answer(data: dict[str, Any], status: int = 200) -> Answer:
    return status, data
