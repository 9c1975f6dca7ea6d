"""Creating an object as the API server does: check the body, default it, validate it (422 ``Invalid`` with the
field errors), and fill in what the server owns.

Shapes and defaults from the API reference pages: Namespace
(https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/namespace-v1/), Pod
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/), Service
(https://kubernetes.io/docs/reference/kubernetes-api/service-resources/service-v1/), Secret
(https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/), ResourceQuota
(https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/resource-quota-v1/) and NetworkPolicy
(https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Callable
from typing import Any

from sandboxes.kubernetes.scheduler import container_requests, is_gpu_resource
from sandboxes.kubernetes.wire import (
    PODS,
    SERVICES,
    Cause,
    Resource,
    bad_request,
    duplicate,
    invalid,
    invalid_value,
    name_causes,
    not_found_value,
    parse_quantity,
    required,
)

NODE_PORT_RANGE = (30000, 32767)
MAX_OBJECT_BYTES = 1_572_864  # etcd's default request limit, which the API server's own limit (3 MiB) stays under
NAME_RULES = {"namespaces": "label", "services": "dns1035"}  # every other kind: a DNS-1123 subdomain


def alphanumeric_suffix() -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName alphabet, no vowels or 0/1/3
    return "".join(secrets.choice(alphabet) for _ in range(5))


def check_body(body: Any, resource: Resource, namespace: str) -> dict[str, Any]:
    """The parsed create body with its name settled (``generateName`` expanded) and namespace set; 400 for a body
    that is not the resource's object, 422 for a missing or malformed name."""
    if not isinstance(body, dict):
        raise bad_request("the object provided is unrecognized (must be of type " + resource.kind + ")")
    kind = body.get("kind")
    if kind not in (None, "", resource.kind):
        raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})")
    api_version = body.get("apiVersion")
    if api_version not in (None, "", resource.api_version):
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({resource.api_version})"
        )
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    given_namespace = metadata.get("namespace")
    if resource.namespaced and given_namespace and given_namespace != namespace:
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    name = metadata.get("name")
    if not name and metadata.get("generateName"):
        name = str(metadata["generateName"]) + alphanumeric_suffix()
    if not name:
        raise invalid(resource, "", [required("metadata.name", "name or generateName is required")])
    name = str(name)
    causes = name_causes(name, NAME_RULES.get(resource.plural, "subdomain"))
    for key, value in (metadata.get("labels") or {}).items():
        causes += _label_causes(str(key), value)
    if causes:
        raise invalid(resource, name, causes)
    stored: dict[str, Any] = {
        "kind": resource.kind,
        "apiVersion": resource.api_version,
        **{k: v for k, v in body.items() if k not in ("kind", "apiVersion", "metadata", "status")},
    }
    kept = {k: metadata[k] for k in ("labels", "annotations", "generateName", "finalizers") if metadata.get(k)}
    stored["metadata"] = {"name": name, **({"namespace": namespace} if resource.namespaced else {}), **kept}
    return stored


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _label_causes(key: str, value: Any) -> list[Cause]:
    text = value if isinstance(value, str) else None
    if text is None:
        return [invalid_value("metadata.labels", str(value), "label values must be strings")]
    name = key.rsplit("/", 1)[-1]
    if not name or len(name) > 63 or not _LABEL_VALUE.match(name):
        return [
            invalid_value(
                "metadata.labels",
                key,
                "name part must consist of alphanumeric characters, '-', '_' "
                "or '.', and must start and end with an alphanumeric character",
            )
        ]
    if len(text) > 63 or not _LABEL_VALUE.match(text):
        return [
            invalid_value(
                "metadata.labels",
                text,
                "a valid label must be an empty string or consist of "
                "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                "character",
            )
        ]
    return []


# ------------------------------------------------------------------------------------------------ namespaces


def prepare_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    # The API server labels every namespace with its own name (NamespaceDefaultLabelName, 1.22+).
    obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    obj["spec"] = {"finalizers": ["kubernetes"]}
    obj["status"] = {"phase": "Active"}
    return obj


# ------------------------------------------------------------------------------------------------------ pods


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    tag = tail.split(":", 1)[1] if ":" in tail else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def prepare_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """Validate and default a pod; 422 listing every field error found."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise invalid(PODS, name, [required("spec.containers")])
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(required("spec.containers"))
        containers = []
    volumes = spec.get("volumes") or []
    volume_names = set()
    for index, volume in enumerate(volumes):
        vname = str((volume or {}).get("name") or "")
        if not vname:
            causes.append(required(f"spec.volumes[{index}].name"))
        elif vname in volume_names:
            causes.append(duplicate(f"spec.volumes[{index}].name", vname))
        volume_names.add(vname)
    seen = set()
    for index, container in enumerate(containers):
        where = f"spec.containers[{index}]"
        if not isinstance(container, dict):
            causes.append(required(where))
            continue
        cname = str(container.get("name") or "")
        if not cname:
            causes.append(required(f"{where}.name"))
        else:
            causes += name_causes(cname, "label", f"{where}.name")
            if cname in seen:
                causes.append(duplicate(f"{where}.name", cname))
            seen.add(cname)
        if not container.get("image"):
            causes.append(required(f"{where}.image"))
        for mount_index, mount in enumerate(container.get("volumeMounts") or []):
            mname = str((mount or {}).get("name") or "")
            if mname not in volume_names:
                causes.append(not_found_value(f"{where}.volumeMounts[{mount_index}].name", mname))
            if not (mount or {}).get("mountPath"):
                causes.append(required(f"{where}.volumeMounts[{mount_index}].mountPath"))
        causes += _resource_causes(container, where)
    if spec.get("restartPolicy") not in (None, "Always", "OnFailure", "Never"):
        causes.append(
            Cause(
                "spec.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec["restartPolicy"]}": supported values: "Always", "OnFailure", "Never"',
            )
        )
    if causes:
        raise invalid(PODS, name, causes)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    # DefaultTolerationSeconds admission: tolerate not-ready and unreachable NoExecute taints for 300 s.
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") == "NoExecute" for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    for container in containers:
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container["image"])))
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        if limits:
            requests = resources.setdefault("requests", {})
            for resource_name, value in limits.items():
                requests.setdefault(resource_name, value)
    obj["status"] = {"phase": "Pending", "qosClass": _qos_class(containers)}
    return obj


def _resource_causes(container: dict[str, Any], where: str) -> list[Cause]:
    resources = container.get("resources") or {}
    causes = []
    for kind in ("limits", "requests"):
        for rname, value in (resources.get(kind) or {}).items():
            field = f"{where}.resources.{kind}[{rname}]"
            try:
                amount = parse_quantity(value)
            except ValueError as exc:
                causes.append(invalid_value(field, str(value), str(exc)))
                continue
            if amount < 0:
                causes.append(invalid_value(field, str(value), "must be greater than or equal to 0"))
            if is_gpu_resource(rname) and amount != amount.to_integral_value():
                causes.append(invalid_value(field, str(value), "must be an integer"))
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for rname, value in requests.items():
        if not is_gpu_resource(rname):
            continue
        if rname not in limits:
            causes.append(
                Cause(
                    f"{where}.resources.limits",
                    "FieldValueRequired",
                    "Required value: Limit must be set for non overcommitable resources",
                )
            )
        elif _safe(value) != _safe(limits[rname]):
            causes.append(
                invalid_value(
                    f"{where}.resources.requests", str(value), f"must be equal to {rname} limit of {limits[rname]}"
                )
            )
    return causes


def _safe(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except ValueError:
        return value


def _qos_class(containers: list[dict[str, Any]]) -> str:
    """The pod's QoS class ("Pod Quality of Service Classes", https://kubernetes.io/docs/concepts/workloads/pods/pod-qos/)."""
    any_set, all_guaranteed = False, True
    for container in containers:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = container_requests(container)
        if requests or limits:
            any_set = True
        for rname in ("cpu", "memory"):
            if rname not in limits or requests.get(rname) != _safe(limits[rname]):
                all_guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if all_guaranteed else "Burstable"


# -------------------------------------------------------------------------------------------------- services


def prepare_service(
    obj: dict[str, Any], node_port: Callable[[int | None, str, set[int]], int], cluster_ip: str
) -> dict[str, Any]:
    """Validate and default a Service; ``node_port(wanted, field, chosen)`` allocates a NodePort (raising
    ``ApiError`` 422 for one taken or out of range)."""
    name = obj["metadata"]["name"]
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise invalid(SERVICES, name, [required("spec")])
    service_type = spec.setdefault("type", "ClusterIP")
    if service_type not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        raise invalid(
            SERVICES,
            name,
            [
                Cause(
                    "spec.type",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{service_type}": supported values: "ClusterIP", "ExternalName", '
                    '"LoadBalancer", "NodePort"',
                )
            ],
        )
    ports = spec.get("ports") or []
    causes: list[Cause] = []
    if not ports and spec.get("clusterIP") != "None":
        causes.append(required("spec.ports"))
    names = set()
    for index, port in enumerate(ports):
        number = port.get("port")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            causes.append(invalid_value(f"spec.ports[{index}].port", number, "must be between 1 and 65535, inclusive"))
        pname = port.get("name") or ""
        if len(ports) > 1 and not pname:
            causes.append(required(f"spec.ports[{index}].name"))
        if pname and pname in names:
            causes.append(duplicate(f"spec.ports[{index}].name", pname))
        names.add(pname)
        if port.get("nodePort") and service_type == "ClusterIP":
            causes.append(
                Cause(
                    f"spec.ports[{index}].nodePort",
                    "FieldValueForbidden",
                    "Forbidden: may not be used when `type` is 'ClusterIP'",
                )
            )
    if causes:
        raise invalid(SERVICES, name, causes)
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    if spec.get("clusterIP") != "None":
        spec["clusterIP"] = cluster_ip
        spec["clusterIPs"] = [cluster_ip]
    if service_type in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    chosen: set[int] = set()
    # Ports naming their NodePort first, so an automatic choice does not take one a later port asks for.
    for index, port in sorted(enumerate(ports), key=lambda item: not item[1].get("nodePort")):
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port["port"])
        if service_type in ("NodePort", "LoadBalancer"):
            port["nodePort"] = node_port(port.get("nodePort"), f"spec.ports[{index}].nodePort", chosen)
            chosen.add(port["nodePort"])
    obj["status"] = {"loadBalancer": {}}
    return obj


# --------------------------------------------------------------------------------------------------- secrets


def prepare_secret(obj: dict[str, Any], resource: Resource) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        raise bad_request('Secret in version "v1" cannot be handled as a Secret: data must be an object')
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad_request(
                f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data in data[{key!r}]'
            ) from exc
    for key, value in (obj.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    causes = [
        invalid_value(
            f"data[{key}]", key, "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
        )
        for key in data
        if not re.fullmatch(r"[-._a-zA-Z0-9]+", key)
    ]
    if causes:
        raise invalid(resource, name, causes)
    obj["data"] = data
    obj.setdefault("type", "Opaque")
    return obj


# ------------------------------------------------------------------------------------- quotas and policies


def prepare_quota(obj: dict[str, Any], resource: Resource) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    hard = ((obj.get("spec") or {}).get("hard")) or {}
    causes = []
    for key, value in hard.items():
        try:
            parse_quantity(value)
        except ValueError as exc:
            causes.append(invalid_value(f"spec.hard[{key}]", str(value), str(exc)))
        bare = key.removeprefix("requests.").removeprefix("limits.")
        if is_gpu_resource(bare) and not key.startswith("requests."):
            # Extended resources are quota'd by requests only ("Resource Quotas", extended resources).
            causes.append(invalid_value(f"spec.hard[{key}]", key, "must be a standard resource for quota"))
    if causes:
        raise invalid(resource, name, causes)
    obj.setdefault("spec", {})["hard"] = hard
    obj["status"] = {"hard": dict(hard), "used": {}}
    return obj


def prepare_network_policy(obj: dict[str, Any], resource: Resource) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise invalid(resource, name, [required("spec")])
    if "podSelector" not in spec:
        spec["podSelector"] = {}
    for kind in ("ingress", "egress"):
        for index, rule in enumerate(spec.get(kind) or []):
            for peer_index, peer in enumerate(rule.get("from" if kind == "ingress" else "to") or []):
                block = (peer or {}).get("ipBlock")
                if block is not None and not re.fullmatch(r"[0-9a-fA-F:.]+/[0-9]+", str(block.get("cidr") or "")):
                    direction = "from" if kind == "ingress" else "to"
                    raise invalid(
                        resource,
                        name,
                        [
                            invalid_value(
                                f"spec.{kind}[{index}].{direction}[{peer_index}].ipBlock.cidr",
                                str(block.get("cidr") or ""),
                                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                            )
                        ],
                    )
    spec.setdefault("policyTypes", ["Ingress", *(["Egress"] if spec.get("egress") else [])])
    return obj
