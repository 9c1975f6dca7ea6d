"""What a node's kubelet reports of a bound pod: its containers waiting (``ContainerCreating``, ``ErrImagePull``,
``ImagePullBackOff``, ``InvalidImageName``), then running, and the events it records on the way.

Container states and reasons as "Pod Lifecycle" (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/)
and "Images" (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff) give them; the event reasons
(``Pulling``, ``Pulled``, ``Failed``, ``BackOff``, ``Created``, ``Started``, ``FailedMount``, ``InspectFailed``)
are the kubelet's (``pkg/kubelet/events``). An image reference is checked against the distribution reference grammar
(https://github.com/distribution/reference/blob/main/reference.go).
"""

from __future__ import annotations

import base64
import re
import uuid
from typing import Any

from sandboxes.kubernetes.wire import now_rfc3339

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
    rf"(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$"
)
MAX_IMAGE = 512


def image_valid(image: str) -> bool:
    return len(image) <= MAX_IMAGE and bool(IMAGE_REFERENCE.match(image))


def full_image(image: str) -> str:
    """The image as containerd names it: registry ``docker.io`` and ``library/`` for a bare name, tag ``latest``."""
    first, _, rest = image.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        image = "docker.io/" + (image if rest else "library/" + image)
    tail = image.rsplit("/", 1)[-1]
    if "@" not in tail and ":" not in tail:
        image += ":latest"
    return image


def invalid_image_message(image: str) -> str:
    return (
        f'Failed to apply default image tag "{image}": couldn\'t parse image reference "{image}": invalid reference '
        "format"
    )


def pull_failure_message(image: str) -> str:
    name = full_image(image)
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{name}": failed to resolve reference '
        f'"{name}": {name}: not found'
    )


def waiting_status(pod: dict[str, Any], reason: str, message: str) -> None:
    """Every container of the pod waits for ``reason``; the pod stays Pending, scheduled but not ready."""
    status = pod.setdefault("status", {})
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}},
            "lastState": {},
        }
        for c in pod["spec"]["containers"]
    ]
    status["conditions"] = _conditions(pod, ready=False, reason="ContainersNotReady", waiting=True)


def _conditions(pod: dict[str, Any], *, ready: bool, reason: str = "", waiting: bool = False) -> list[dict[str, Any]]:
    stamp = now_rfc3339()
    names = ", ".join(f"{c['name']}" for c in pod["spec"]["containers"])
    not_ready = {"reason": reason, "message": f"containers with unready status: [{names}]"} if not ready else {}
    return [
        {
            "type": "PodReadyToStartContainers",
            "status": "True" if not waiting or ready else "False",
            "lastProbeTime": None,
            "lastTransitionTime": stamp,
        },
        {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastProbeTime": None,
            "lastTransitionTime": stamp,
            **not_ready,
        },
        {
            "type": "ContainersReady",
            "status": "True" if ready else "False",
            "lastProbeTime": None,
            "lastTransitionTime": stamp,
            **not_ready,
        },
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
    ]


def running_status(pod: dict[str, Any], host_ip: str, pod_ip: str) -> None:
    """The pod runs: phase Running, every container running and ready, its IPs."""
    stamp = now_rfc3339()
    status = pod.setdefault("status", {})
    status.update(
        phase="Running",
        hostIP=host_ip,
        hostIPs=[{"ip": host_ip}],
        podIP=pod_ip,
        podIPs=[{"ip": pod_ip}],
        startTime=status.get("startTime") or stamp,
        conditions=_conditions(pod, ready=True),
    )
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": full_image(c["image"]),
            "imageID": full_image(c["image"]).rsplit(":", 1)[0]
            + "@sha256:"
            + uuid.uuid5(uuid.NAMESPACE_URL, c["image"]).hex * 2,
            "containerID": "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex,
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": stamp}},
            "lastState": {},
        }
        for c in pod["spec"]["containers"]
    ]


def terminated_status(pod: dict[str, Any], exit_code: int) -> None:
    """Every container ended with ``exit_code``: the pod Succeeded (0) or Failed."""
    stamp = now_rfc3339()
    status = pod.setdefault("status", {})
    status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    reason = "Completed" if exit_code == 0 else "Error"
    for container in status.get("containerStatuses") or []:
        started = ((container.get("state") or {}).get("running") or {}).get("startedAt") or stamp
        container.update(ready=False, started=False)
        container["state"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason,
                "startedAt": started,
                "finishedAt": stamp,
                "containerID": container.get("containerID", ""),
            }
        }
    status["conditions"] = [
        {**c, "status": "False", "reason": "PodCompleted"} if c["type"] in ("Ready", "ContainersReady") else c
        for c in status.get("conditions") or []
    ]


def boot_script(pod: dict[str, Any], secrets: dict[str, dict[str, Any]]) -> tuple[bytes | None, str]:
    """The script the pod's first container runs from a Secret volume (``command``/``args`` naming a file under a
    secret volume's mountPath): (its bytes, "") or (None, why not). ``secrets`` are the namespace's by name."""
    spec = pod["spec"]
    container = spec["containers"][0]
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount.get("name")) or {}
        source = volume.get("secret")
        if not source:
            continue
        root = str(mount.get("mountPath") or "").rstrip("/") + "/"
        for word in words:
            if not word.startswith(root):
                continue
            path = word[len(root) :]
            key = path
            for item in source.get("items") or []:
                if item.get("path") == path:
                    key = str(item.get("key"))
            secret = secrets.get(str(source.get("secretName")))
            if secret is None:
                return None, f'secret "{source.get("secretName")}" not found'
            encoded = (secret.get("data") or {}).get(key)
            if encoded is None:
                return None, f"no key {key!r} in secret {source.get('secretName')!r}"
            return base64.b64decode(encoded), ""
    return None, "the container runs no script from a secret volume"
