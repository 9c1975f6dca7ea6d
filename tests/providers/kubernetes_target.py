"""The Kubernetes adapter under the contract suite: the official ``kubernetes`` client against the Kubernetes
sandbox over HTTPS with its own CA, the demo service account's token, and the demo account's prices."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from providers.boot import lease_file_from_script
from providers.kubernetes import catalog, launching
from providers.kubernetes.adapter import KubernetesAdapter
from providers.types import Credentials, InstanceHandle
from sandboxes.kubernetes.app import KubernetesSandbox, start_kubernetes_sandbox
from tests.providers.contract import ContractTarget, LaunchedView

KIND = "kubernetes"
ORDER_LABEL = "broker.order"


def start_sandbox() -> KubernetesSandbox:
    return start_kubernetes_sandbox()


class _Faults:
    """The sandbox's fault registry as the contract names things. The sandbox matches a fault's ``instance_type``
    on the extended resource a pod asks for (Kubernetes has no instance types); the contract names the broker's
    instance type (``k8s-gpu-1``), which this translates to its resource (``nvidia.com/gpu``)."""

    def __init__(self, sandbox: KubernetesSandbox):
        self._faults = sandbox.faults

    def inject(self, kind: Any, *, instance_type: str | None = None, **kwargs: Any) -> Any:
        named = catalog.instance_resource(instance_type) if instance_type else None
        return self._faults.inject(kind, instance_type=named[0] if named else instance_type, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._faults, name)


class _Sandbox:
    """The sandbox with ``faults`` speaking the contract's names; everything else is the sandbox's own."""

    def __init__(self, sandbox: KubernetesSandbox):
        self._sandbox = sandbox
        self.faults = _Faults(sandbox)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)


@dataclass(frozen=True)
class Held:
    """A pod holding a node's resources, as the contract counts instances."""

    instance_id: str
    state: str


def instances(sandbox: KubernetesSandbox) -> list[Held]:
    """The pods bound to a node (a pod the scheduler could not place holds nothing and costs nothing), with
    Succeeded and Failed ones as terminated."""
    return [
        Held(f"{p.namespace}/{p.name}", "terminated" if p.phase in ("Succeeded", "Failed") else p.phase.lower())
        for p in sandbox.pods()
        if p.node is not None
    ]


def _stored(sandbox: KubernetesSandbox, plural: str, namespace: str, name: str) -> dict[str, Any]:
    with sandbox.store.lock:
        found = sandbox.store.get(plural, namespace, name)
    assert found is not None, f"the sandbox holds no {plural} {namespace}/{name}"
    return found


def _gib(quantity: str | None) -> int | None:
    if quantity is None:
        return None
    assert quantity.endswith("Gi"), quantity
    return int(quantity.removesuffix("Gi"))


def launched_view(sandbox: KubernetesSandbox, handle: InstanceHandle) -> LaunchedView:
    """What the sandbox keeps of the launch in the API's own objects: the pod's container image and
    ephemeral-storage request, the boot Secret's ``boot.sh`` decoded, the keys the boot script installs (it is
    this cluster's only key mechanism), what the NetworkPolicy's ingress rules let in, and the ``broker.order``
    label of the namespace and of every object the launch made in it besides the pod."""
    namespace, name = handle.instance_id.split("/", 1)
    pod = _stored(sandbox, "pods", namespace, name)
    container = pod["spec"]["containers"][0]
    secret = _stored(sandbox, "secrets", namespace, "boot")
    script = base64.b64decode(secret["data"]["boot.sh"])
    policy = _stored(sandbox, "networkpolicies", namespace, "lease")
    ingress = {
        (int(port["port"]), str(peer["ipBlock"]["cidr"]))
        for rule in policy["spec"].get("ingress") or []
        for peer in rule.get("from") or []
        for port in rule.get("ports") or []
    }
    created = [
        _stored(sandbox, "namespaces", "", namespace),
        secret,
        policy,
        _stored(sandbox, "services", namespace, "lease"),
        _stored(sandbox, "resourcequotas", namespace, "lease"),
    ]
    return LaunchedView(
        image=container["image"],
        disk_gb=_gib((container.get("resources") or {}).get("requests", {}).get("ephemeral-storage")),
        user_data=script,
        public_keys=list(lease_file_from_script(script)["ssh_keys"]),
        ingress=ingress,
        resource_tags=[obj["metadata"].get("labels", {}).get(ORDER_LABEL, "") for obj in created],
    )


def target(sandbox: KubernetesSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> KubernetesAdapter:
        values = sandbox.account_credentials()
        if not valid:
            values["token"] = "not-a-token-the-cluster-knows"
        credentials = Credentials(kind=KIND, values=values, endpoint_url=sandbox.url)
        return KubernetesAdapter(credentials, [sandbox.region], {**sandbox.account_options(), **options})

    return ContractTarget(
        kind=KIND,
        sandbox=_Sandbox(sandbox),
        make_adapter=make_adapter,
        regions=[sandbox.region],
        launch_action="createPod",
        read_action="listNodes",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=lambda: list(instances(sandbox)),
        launched=lambda handle: launched_view(sandbox, handle),
        # The Kubernetes API has no image catalogue: an image that cannot be pulled shows on the pod (describe's
        # FAILED, ErrImagePull), after the launch.
        # No image catalogue to ask before a launch; a container workload is its command run in the pod itself.
        extra={"images_checked_before_launch": False, "workload_in_place": launching.in_place_workload},
    )
