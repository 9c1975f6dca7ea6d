"""What the Kubernetes sandbox holds between requests: every object by resource, namespace and name, one
resourceVersion counter (as etcd's revision, shared by all kinds), and what the scheduler and kubelet know of each
pod that the API object does not show (its devices, when it was bound, its image pulls)."""

from __future__ import annotations

import copy
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sandboxes.kubernetes.wire import now_rfc3339

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


@dataclass(frozen=True, slots=True)
class Call:
    """One request the sandbox received, before faults: its action (``createPod``, ``listNodes``, ...), namespace
    and the extended resources or node it named, for fault matching."""

    action: str
    namespace: str = ""
    resources: tuple[str, ...] = ()
    node: str | None = None


@dataclass(slots=True)
class Device:
    """One schedulable unit a pod holds on its node: a whole GPU (``index``), a MIG device (``mig_instance``) or one
    time-sliced replica of a GPU."""

    resource: str
    index: int
    mig_instance: int | None = None
    mig_profile: str = ""


@dataclass(slots=True)
class PodRuntime:
    """The scheduler's and kubelet's side of one pod."""

    node: str | None = None
    devices: list[Device] = field(default_factory=list)
    bound_at: float | None = None
    waiting: str = ""  # ContainerCreating, ErrImagePull, ImagePullBackOff, InvalidImageName
    waiting_message: str = ""
    next_pull_at: float = 0.0
    capacity_fault: bool = False
    failed_message: str = ""
    booted: bool = False
    cluster_generation: int = -1  # the cluster state it was last found unschedulable in


WATCHED = frozenset({"pods", "namespaces", "events"})
HISTORY = 2000  # changes a watch can resume from; an older resourceVersion is 410 Gone, as etcd's compaction makes it


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a watched object, as a watch event: ADDED, MODIFIED or DELETED, with the object after it."""

    revision: int
    plural: str
    type: str
    obj: dict[str, Any]


class Store:
    """Objects by resource plural, then (namespace, name), and the recent changes of watched kinds. Not locked itself:
    the sandbox holds ``lock``; ``changed`` (on the same lock) wakes watchers."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[Key, dict[str, Any]]] = {}
        self.revision = 1
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.history: deque[Change] = deque(maxlen=HISTORY)
        self.epoch = 0  # bumped by clear(): a watch of the old state ends

    def count(self) -> int:
        return sum(len(kind) for kind in self.objects.values())

    def _record(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if plural in WATCHED:
            with self.lock:
                self.history.append(Change(self.revision, plural, kind, copy.deepcopy(obj)))
                self.changed.notify_all()

    def next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

    def of(self, plural: str) -> dict[Key, dict[str, Any]]:
        return self.objects.setdefault(plural, {})

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.of(plural).get((namespace, name))

    def put_new(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object, stamping uid, creationTimestamp and resourceVersion as the API server does."""
        metadata = obj.setdefault("metadata", {})
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        metadata["resourceVersion"] = self.next_version()
        self.of(plural)[(str(metadata.get("namespace") or ""), str(metadata["name"]))] = obj
        self._record(plural, "ADDED", obj)
        return obj

    def touch(self, plural: str, obj: dict[str, Any]) -> None:
        """A stored object changed: give it a new resourceVersion."""
        obj["metadata"]["resourceVersion"] = self.next_version()
        self._record(plural, "MODIFIED", obj)

    def remove(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.revision += 1
        obj = self.of(plural).pop((namespace, name), None)
        if obj is not None:
            # A deleted object's last state carries the revision of its deletion, as the API server sends it.
            obj["metadata"]["resourceVersion"] = str(self.revision)
            self._record(plural, "DELETED", obj)
        return obj

    def items(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of a kind (in one namespace, or all), in name order as etcd's key order gives them."""
        found = [(k, v) for k, v in self.of(plural).items() if namespace is None or k[0] == namespace]
        return [v for _, v in sorted(found, key=lambda item: item[0])]

    def clear(self) -> None:
        with self.lock:
            self.objects.clear()
            self.history.clear()
            self.end_watches()

    def end_watches(self) -> None:
        """Every open watch ends at its next wake-up (a reset, or the server stopping)."""
        with self.lock:
            self.epoch += 1
            self.changed.notify_all()


def snapshot(obj: dict[str, Any]) -> dict[str, Any]:
    """A deep copy to answer with, so later changes do not reach an answer being serialised."""
    return copy.deepcopy(obj)
