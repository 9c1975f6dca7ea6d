"""Injectable faults, shared by every provider sandbox.

A fault matches on action, instance type and zone (None = any) and fires at most ``times`` times (None =
until cleared). Each sandbox decides what a kind looks like on its wire (AWS: ``capacity`` is an
``InsufficientInstanceCapacity`` HTTP 500). Thread-safe: the sandbox's request threads and the test thread
use one registry.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


class FaultKind(enum.StrEnum):
    CAPACITY = "capacity"
    QUOTA = "quota"
    THROTTLE = "throttle"
    CREDENTIALS = "credentials"
    SLOW = "slow"
    # What a booting machine does (sandboxes/boot.py): matched on the action "boot".
    BOOT_SILENT = "boot_silent"  # the machine never phones home
    GPU_MISMATCH = "gpu_mismatch"  # the machine reports fewer GPUs than its type has
    WORKLOAD_FAIL = "workload_fail"  # the container or script does not start (``message`` says why)
    # The region has no such image (the cloud's GPU-ready default or the buyer's own): matched on "image".
    IMAGE_MISSING = "image_missing"


# Faults that act before the provider looks at the request (transport, authentication, rate limiting).
TRANSPORT_KINDS = frozenset({FaultKind.THROTTLE, FaultKind.CREDENTIALS, FaultKind.SLOW})
# Faults that are the outcome of a provisioning request.
OUTCOME_KINDS = frozenset({FaultKind.CAPACITY, FaultKind.QUOTA})
BOOT_KINDS = frozenset({FaultKind.BOOT_SILENT, FaultKind.GPU_MISMATCH, FaultKind.WORKLOAD_FAIL})
BOOT_ACTION = "boot"
IMAGE_ACTION = "image"


class _Default(enum.Enum):
    ACTION = "default"


DEFAULT_ACTION = _Default.ACTION


@dataclass(slots=True)
class Fault:
    """One injected fault. ``remaining`` counts down from ``times``; ``fired`` counts how often it acted."""

    id: int
    kind: FaultKind
    action: str | None
    instance_type: str | None = None
    zone: str | None = None
    times: int | None = None
    seconds: float = 0.0
    code: str | None = None
    remaining: int | None = None
    fired: int = 0
    region: str | None = None
    message: str | None = None

    def matches(
        self, action: str, instance_types: Collection[str], zone: str | None, region: str | None = None
    ) -> bool:
        if self.action is not None and self.action != action:
            return False
        if self.instance_type is not None and self.instance_type not in instance_types:
            return False
        if self.region is not None and self.region != region:
            return False
        return self.zone is None or self.zone == zone

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


class FaultRegistry:
    """The faults of one sandbox. ``default_action`` is what ``inject`` matches when no action is named."""

    def __init__(self, default_action: str | None = None):
        self.default_action = default_action
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def inject(
        self,
        kind: FaultKind | str,
        *,
        action: str | _Default | None = DEFAULT_ACTION,
        instance_type: str | None = None,
        zone: str | None = None,
        times: int | None = None,
        seconds: float = 0.0,
        code: str | None = None,
        region: str | None = None,
        message: str | None = None,
    ) -> Fault:
        """Add a fault; ``action=None`` matches every action. ``code`` overrides the kind's default error code.
        Boot faults default to the action ``boot`` and ``image_missing`` to ``image``, whatever the sandbox's
        default action is."""
        kind = FaultKind(kind)
        if action is DEFAULT_ACTION and kind in BOOT_KINDS:
            action = BOOT_ACTION
        elif action is DEFAULT_ACTION and kind is FaultKind.IMAGE_MISSING:
            action = IMAGE_ACTION
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None for until cleared)")
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        with self._lock:
            fault = Fault(
                id=next(self._ids),
                kind=kind,
                action=self.default_action if action is DEFAULT_ACTION else action,
                instance_type=instance_type,
                zone=zone,
                times=times,
                seconds=seconds,
                code=code,
                remaining=times,
                region=region,
                message=message,
            )
            self._faults.append(fault)
            return fault

    def inject_json(self, data: Mapping[str, Any]) -> Fault:
        """``inject`` from a JSON object; a missing ``action`` means the default, ``null`` means any."""
        allowed = {"kind", "action", "instance_type", "zone", "times", "seconds", "code", "region", "message"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        if "kind" not in data:
            raise ValueError("kind is required")
        times = data.get("times")
        return self.inject(
            str(data["kind"]),
            action=data["action"] if "action" in data else DEFAULT_ACTION,
            instance_type=data.get("instance_type"),
            zone=data.get("zone"),
            times=int(times) if times is not None else None,
            seconds=float(data.get("seconds") or 0.0),
            code=data.get("code"),
            region=data.get("region"),
            message=data.get("message"),
        )

    def clear(self) -> int:
        """Remove every fault and wake requests sleeping in a ``slow`` fault. Returns how many were removed."""
        with self._lock:
            removed = len(self._faults)
            self._faults.clear()
            wake, self._wake = self._wake, threading.Event()
        wake.set()
        return removed

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._faults)
            self._faults = [f for f in self._faults if f.id != fault_id]
            return len(self._faults) != before

    def active(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def take(
        self,
        action: str,
        instance_types: Iterable[str] = (),
        zone: str | None = None,
        kinds: Collection[FaultKind] | None = None,
        region: str | None = None,
    ) -> Fault | None:
        """The first fault (in injection order) matching the request, counted as fired; None if none matches."""
        types = frozenset(instance_types)
        with self._lock:
            for fault in self._faults:
                if kinds is not None and fault.kind not in kinds:
                    continue
                if not fault.matches(action, types, zone, region):
                    continue
                fault.fired += 1
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def sleep(self, seconds: float) -> None:
        """Sleep for a ``slow`` fault; returns early when the faults are cleared (e.g. by a test's reset)."""
        with self._lock:
            wake = self._wake
        wake.wait(seconds)
