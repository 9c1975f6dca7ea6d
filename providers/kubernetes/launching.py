"""The objects one launch creates (interface point 4), as the API's JSON. Pure.

One namespace per attempt, named from the client token, so a repeated launch meets ``AlreadyExists`` and finds
what the first one made. Inside it: the Secret ``boot`` holding the boot script, the Pod ``lease`` that runs it
with exactly the order's GPUs as resource limits on the node the offer names, a NodePort Service for SSH and the
buyer's ports, a NetworkPolicy that lets only the buyer's CIDRs in and no traffic out to other pods of the
cluster, and a ResourceQuota capping the namespace at the order's GPUs and one pod. Everything carries the
order's labels. Field names: https://kubernetes.io/docs/reference/kubernetes-api/ (Namespace, Secret, Pod,
Service, NetworkPolicy, ResourceQuota).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import shlex
from collections.abc import Sequence
from typing import Any

from providers.kubernetes import mapping
from providers.launch import IngressRule

DEFAULT_IMAGE = "nvidia/cuda:12.4.1-base-ubuntu22.04"
BOOT_OBJECT = "boot"
BOOT_KEY = "boot.sh"
BOOT_MOUNT = "/broker/boot"
SERVICE_NAME = "lease"
POLICY_NAME = "lease"
QUOTA_NAME = "lease"
NAMESPACE_PREFIX = "brk-"
# A Secret's data may hold at most 1 MiB ("Individual Secrets are limited to 1MiB in size",
# https://kubernetes.io/docs/concepts/configuration/secret/#restriction-data-size); the limit counts the decoded
# bytes (the API server's validation sums len(value) of data).
BOOT_DATA_MAX_BYTES = 1024 * 1024
DATA_LIMIT_SOURCE = (
    "Kubernetes Secrets, restriction on data size: https://kubernetes.io/docs/concepts/configuration/secret/"
)
# A label value: at most 63 characters, alphanumeric at both ends, '-', '_' and '.' between.
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")


def attempt_hex(client_token: str) -> str:
    """The first 20 hex digits of the token's SHA-256: the namespace's suffix and its ``broker.attempt`` label."""
    return hashlib.sha256(client_token.encode()).hexdigest()[:20]


def namespace_name(client_token: str) -> str:
    return NAMESPACE_PREFIX + attempt_hex(client_token)


def label_value_ok(value: str) -> bool:
    return _LABEL_VALUE.fullmatch(value) is not None


def image_ok(image: str) -> bool:
    """A container image reference as the API takes it (registry/name:tag or @digest), no spaces or controls."""
    return _IMAGE.fullmatch(image) is not None


def labels(order_ref: str, client_token: str, instance_type: str = "") -> dict[str, str]:
    found = {
        mapping.MANAGED_BY: mapping.MANAGED_BY_VALUE,
        mapping.ORDER_LABEL: order_ref,
        mapping.ATTEMPT_LABEL: attempt_hex(client_token),
    }
    if instance_type:
        found[mapping.INSTANCE_TYPE_LABEL] = instance_type
    return found


def _meta(name: str, object_labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": dict(object_labels)}


def namespace_body(name: str, object_labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name, object_labels)}


def secret_body(script: bytes, object_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(BOOT_OBJECT, object_labels),
        "type": "Opaque",
        "data": {BOOT_KEY: base64.b64encode(script).decode("ascii")},
    }


def pod_body(
    *,
    image: str,
    resource: str,
    count: int,
    node_selector: dict[str, str],
    disk_gb: int | None,
    with_boot: bool,
    object_labels: dict[str, str],
) -> dict[str, Any]:
    """The lease pod: one container ``lease`` running the boot script from the Secret (when the launch carries a
    boot), exactly ``count`` of ``resource`` as its limit (extended resources are requested by their limit), the
    disk as an ephemeral-storage request, pinned to the offer's node. It tolerates the ``nvidia.com/gpu`` taint
    GPU nodes carry (NVIDIA's device plugin README, "Running GPU Jobs"), and gets no service account token."""
    container: dict[str, Any] = {
        "name": mapping.POD_NAME,
        "image": image,
        "resources": {"limits": {resource: str(count)}},
    }
    if disk_gb is not None:
        container["resources"]["requests"] = {"ephemeral-storage": f"{disk_gb}Gi"}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "nodeSelector": dict(node_selector),
        "tolerations": [{"key": mapping.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if with_boot:
        container["command"] = ["/bin/bash", f"{BOOT_MOUNT}/{BOOT_KEY}"]
        container["volumeMounts"] = [{"name": BOOT_OBJECT, "mountPath": BOOT_MOUNT, "readOnly": True}]
        spec["volumes"] = [{"name": BOOT_OBJECT, "secret": {"secretName": BOOT_OBJECT, "defaultMode": 0o500}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(mapping.POD_NAME, object_labels), "spec": spec}


def service_body(ports: Sequence[tuple[int, str]], object_labels: dict[str, str]) -> dict[str, Any]:
    """A NodePort Service selecting the lease pod by its order labels, one port per (port, protocol). Its external
    traffic stays on the pod's own node (``externalTrafficPolicy: Local``), which keeps the client's source
    address, so the NetworkPolicy's ipBlock rules judge the buyer's address and not a node's
    (https://kubernetes.io/docs/tutorials/services/source-ip/#source-ip-for-services-with-type-nodeport)."""
    selector = {k: object_labels[k] for k in (mapping.ORDER_LABEL, mapping.ATTEMPT_LABEL)}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(SERVICE_NAME, object_labels),
        "spec": {
            "type": "NodePort",
            "externalTrafficPolicy": "Local",
            "selector": selector,
            "ports": [
                {"name": f"{protocol.lower()}-{port}", "port": port, "targetPort": port, "protocol": protocol.upper()}
                for port, protocol in ports
            ],
        },
    }


def service_ports(ingress: Sequence[IngressRule]) -> list[tuple[int, str]]:
    """SSH and every port the buyer opened, once each, sorted."""
    found = {(22, "tcp")} | {(rule.port, rule.protocol) for rule in ingress}
    return sorted(found)


# Never reachable from a lease, whatever the seller's pod networks: link-local addresses, where clouds serve their
# instance metadata (169.254.169.254, with the node's credentials) and nodes their local services.
ALWAYS_EXCEPTED = ("169.254.0.0/16", "fe80::/10")
# The cluster's DNS, the one thing inside the cluster a lease must reach: the pods labelled ``k8s-app: kube-dns``
# (CoreDNS keeps kube-dns's label) in the namespace the API server labels ``kubernetes.io/metadata.name:
# kube-system`` (https://kubernetes.io/docs/reference/labels-annotations-taints/#kubernetes-io-metadata-name).
CLUSTER_DNS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}


def network_policy_body(
    ingress: Sequence[IngressRule], pod_cidrs: Sequence[str], object_labels: dict[str, str]
) -> dict[str, Any]:
    """Ingress only from the buyer's CIDRs on their ports; egress to the cluster's DNS on port 53, and anywhere
    but the cluster's pod networks (``pod_cidrs``) and link-local addresses, so the lease reaches the internet
    and the broker but no other order's pod and no metadata service. Without ingress rules nothing may come in
    (the policy type Ingress with no rule denies all)."""
    rules = []
    for rule in ingress:
        rules.append(
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in rule.cidrs],
                "ports": [{"port": rule.port, "protocol": rule.protocol.upper()}],
            }
        )
    egress: list[dict[str, Any]] = [
        {"to": [CLUSTER_DNS], "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    ]
    for world, version in (("0.0.0.0/0", 4), ("::/0", 6)):
        excepted = [
            c for c in (*pod_cidrs, *ALWAYS_EXCEPTED) if ipaddress.ip_network(c, strict=False).version == version
        ]
        block: dict[str, Any] = {"cidr": world}
        if excepted:
            block["except"] = excepted
        egress.append({"to": [{"ipBlock": block}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(POLICY_NAME, object_labels),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": rules, "egress": egress},
    }


def resource_quota_body(resource: str, count: int, object_labels: dict[str, str]) -> dict[str, Any]:
    """At most the order's GPUs (``requests.<resource>``: extended resources are quota'd by request,
    https://kubernetes.io/docs/concepts/policy/resource-quotas/#resource-quota-for-extended-resources) and one pod."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta(QUOTA_NAME, object_labels),
        "spec": {"hard": {f"requests.{resource}": str(count), "pods": "1"}},
    }


def policy_ingress(policy: dict[str, Any]) -> set[tuple[int, str]]:
    """What a NetworkPolicy this module wrote lets in: each (port, CIDR)."""
    found: set[tuple[int, str]] = set()
    for rule in (policy.get("spec") or {}).get("ingress") or []:
        cidrs = [str((peer.get("ipBlock") or {}).get("cidr")) for peer in rule.get("from") or []]
        for port in rule.get("ports") or []:
            found.update((int(port.get("port")), cidr) for cidr in cidrs)
    return found


# What the lease agent needs, installed where the pod's image lacks it (Debian and Ubuntu images, which the CUDA
# and most ML images are, through apt; RHEL-like through dnf; Alpine through apk), then the login user and an SSH
# server on port 22 with its host keys: a pod has no init system to start one. Idempotent, like the whole script.
POD_PRELUDE = """\
need=
for tool in python3 curl sshd useradd; do command -v "$tool" >/dev/null 2>&1 || need=1; done
[ -x /usr/sbin/sshd ] || need=1
if [ -n "$need" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends python3 curl openssh-server ca-certificates
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3 curl openssh-server shadow-utils
  elif command -v apk >/dev/null 2>&1; then
    apk add -q python3 curl openssh shadow bash
  fi
fi
id "$BROKER_LOGIN_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$BROKER_LOGIN_USER"
mkdir -p /run/sshd && ssh-keygen -A >/dev/null 2>&1
pgrep -x sshd >/dev/null 2>&1 || /usr/sbin/sshd -o PermitRootLogin=no -o PasswordAuthentication=no"""

# A pod lives as long as its first process: the script, started as that process, waits for the agent it started
# in the background, so the pod ends (Succeeded) when the lease agent does.
POD_KEEPALIVE = b"# a pod lives as long as its first process: wait for the lease agent\nwait\n"


def in_place_workload(workload: dict[str, Any]) -> dict[str, Any]:
    """A container workload as the lease agent runs it inside the pod Kubernetes already made of the buyer's
    image: its command and arguments as a script (``exec``, each word quoted), with its env; ports are the
    pod's own. The image itself is the pod's (``pod_body``)."""
    words = [str(w) for w in (workload.get("command") or [])] + [str(a) for a in (workload.get("args") or [])]
    script = "#!/bin/bash\nexec " + " ".join(shlex.quote(w) for w in words) + "\n"
    return {"kind": "script", "script": script, "env": list(workload.get("env") or [])}
