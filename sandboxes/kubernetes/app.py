"""The Kubernetes sandbox: an API server, a scheduler and the nodes' kubelets in one HTTPS server, so the official
``kubernetes`` Python client and the adapter run unchanged against it.

- **TLS and tokens**: a throwaway CA (``sandbox.cert_path``, ``sandbox.ca_pem``); bearer tokens with RBAC rules
  (``auth``): ``DEMO_TOKEN`` may do everything, ``sandbox.register_token(deny=[("create", "networkpolicies")])``
  makes one that may not. 401 and 403 ``Status`` bodies as the API server words them; SelfSubjectRulesReview.
- **core/v1**: nodes (list, get), namespaces (create, get, list, delete: Terminating, its objects removed, gone
  after ``namespace_finalize_seconds``), pods, services (NodePorts from 30000-32767), secrets, events,
  resourcequotas (enforced at pod create: 403 ``exceeded quota``); **networking.k8s.io/v1** networkpolicies (kept as
  given). Create answers 201 with the stored object, 409 AlreadyExists, 422 Invalid, 404 NotFound; lists are
  ``<Kind>List`` with ``metadata.resourceVersion`` and take ``labelSelector`` and ``fieldSelector``; pods,
  namespaces and events can be watched (``watch=true``); **batch/v1** jobs run one pod at a time (``jobs``). No
  update or patch.
- **Scheduler** (``scheduler``): a pending pod is bound to the first node (in name order) its nodeSelector and
  required node affinity allow that is Ready, not cordoned and has the extended resources free; else it stays
  Pending with ``PodScheduled=False/Unschedulable`` and a ``FailedScheduling`` event in the scheduler's words.
  Unschedulable pods are tried again when the cluster changes (a pod deleted, a node changed).
- **Kubelet** (``kubelet``): ``start_seconds`` after binding the pod pulls its image and runs (Pulling, Pulled,
  Created, Started events), then boots the lease agent from the script its container runs out of a Secret volume
  (``self.booter``, instance id ``<namespace>/<pod>``; halted on delete). An invalid image reference waits with
  ``InvalidImageName``; an ``image_missing`` fault with ``ErrImagePull`` then ``ImagePullBackOff``.
- **DCGM exporter**: ``GET /dcgm/metrics`` (no token, as the exporter's own port), per GPU of each node (``dcgm``).
- **Faults** (``sandbox.faults``), matched on the action (the request's verb and kind: ``createPod``, ``listNodes``,
  ``getPod``, ``deleteNamespace``, ``createSelfSubjectRulesReview``, ``dcgmMetrics``...; default ``createPod``),
  ``instance_type`` = an extended resource the pod asks for, ``zone`` = the node its nodeSelector names:
  ``capacity`` (createPod) leaves the pod unschedulable with ``Insufficient <resource>``; ``quota`` (createPod) is a
  403 ``exceeded quota``; ``throttle`` a 429 ``TooManyRequests`` with ``Retry-After`` (with code
  ``ServiceUnavailable``: a 503); ``credentials`` a 401 (with code ``Forbidden``: a 403 naming verb and resource);
  ``slow`` sleeps first; ``image_missing`` (action ``image``, instance_type = the image, zone = the node) fails the
  pull; boot faults act when the pod's agent boots (action ``boot``, instance_type = the GPU resource, zone = node).

Use in-process: ``sandbox = start_kubernetes_sandbox()``; ``sandbox.url``, ``sandbox.ca_pem``, ``DEMO_TOKEN``,
``sandbox.reset()``, ``sandbox.set_node(name, ready=False)``, ``sandbox.finish_pod(ns, name, exit_code)``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import ssl
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from providers import gpu_names
from providers.community.executor_base import GpuSeen
from sandboxes.boot import simulated_gpus
from sandboxes.faults import IMAGE_ACTION, TRANSPORT_KINDS, FaultKind, FaultRegistry
from sandboxes.kubernetes import jobs, kubelet, objects
from sandboxes.kubernetes.auth import (
    DEMO_TOKEN,
    Identity,
    PolicyRule,
    TokenRegistry,
    authorize,
    forbidden_message,
    rules_review,
)
from sandboxes.kubernetes.dcgm import GpuUse, render
from sandboxes.kubernetes.scheduler import (
    TERMINAL_PHASES,
    allocate_devices,
    failure_message,
    is_gpu_resource,
    node_rejections,
    pod_requests,
)
from sandboxes.kubernetes.seed import (
    A100_40_PROFILES,
    NOT_READY_TAINT,
    REGION,
    SEED,
    UNSCHEDULABLE_TAINT,
    NodeSeed,
)
from sandboxes.kubernetes.selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from sandboxes.kubernetes.state import WATCHED, Call, Key, PodRuntime, Store, snapshot
from sandboxes.kubernetes.wire import (
    JOBS,
    NAMESPACES,
    NETWORK_POLICIES,
    PODS,
    RESOURCE_QUOTAS,
    RESOURCES,
    SECRETS,
    SERVICES,
    SSRR,
    ApiError,
    Resource,
    already_exists,
    bad_request,
    forbidden,
    format_quantity,
    invalid,
    invalid_value,
    method_not_allowed,
    not_found,
    now_rfc3339,
    object_response,
    parse_quantity,
    service_unavailable,
    too_many_requests,
    unauthorized,
)
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response
from sandboxes.tls import server_context, write_tls

log = logging.getLogger("sandboxes.kubernetes")
ROUTE = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)
DCGM_PATH = "/dcgm/metrics"
WATCH_MAX_S = 600  # a watch ends after at most this long; clients watch again from the last resourceVersion
WATCH_TICK_S = 0.1
MAX_OBJECTS = 50_000  # past this the store answers as a full etcd does
MAX_BODY = 3 * 1024 * 1024  # the API server's request body limit
CREATABLE = frozenset(
    {"namespaces", "pods", "services", "secrets", "resourcequotas", "networkpolicies", "events", "jobs"}
)
DELETABLE = CREATABLE
SCHEDULER = "default-scheduler"
HOST_IP = "127.0.0.1"
VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.1",
    "gitCommit": "sandbox",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _action(verb: str, resource: Resource) -> str:
    kind = resource.kind
    if verb in ("list", "watch", "deletecollection"):
        kind = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    return verb + kind


@dataclass(frozen=True, slots=True)
class SandboxPod:
    """A pod as the sandbox holds it, for tests: where it runs and in what phase."""

    namespace: str
    name: str
    phase: str
    node: str | None
    waiting: str
    devices: tuple[str, ...]
    image: str = ""  # the first container's


class KubernetesSandbox(SandboxApp):
    """The Kubernetes sandbox WSGI app. ``start()`` serves it over HTTPS; ``faults`` injects failures; ``reset()``
    forgets every namespace, pod, registered token, fault and logged call and restores the seeded nodes."""

    kind = "kubernetes"

    def __init__(self, seed: Iterable[NodeSeed] = SEED, cert_dir: Path | None = None):
        super().__init__(FaultRegistry(default_action="createPod"))
        self.seed = tuple(seed)
        self._owns_tls_dir = cert_dir is None
        self._tls_dir = Path(cert_dir) if cert_dir else Path(tempfile.mkdtemp(prefix="kubernetes-sandbox-tls-"))
        self._tls_dir.mkdir(parents=True, exist_ok=True)
        self._write_tls()
        self.tokens = TokenRegistry()
        self.store = Store()
        self._lock = self.store.lock
        self._runtimes: dict[Key, PodRuntime] = {}
        self._generation = 0  # bumped whenever a pod might fit where it did not (a pod gone, a node changed)
        self._namespace_deadlines: dict[str, float] = {}
        self._pod_ips = 0
        self._utilization: dict[tuple[str, int], int] = {}
        self.start_seconds = 0.0  # bound -> running
        self.image_backoff_seconds = 0.0
        self.namespace_finalize_seconds = 0.0
        self.retry_after_s = 1
        self._seed_nodes()

    # ------------------------------------------------------------------------------------------ TLS

    def _write_tls(self) -> None:
        self.cert_path, self._chain_path, self._key_path = write_tls(
            self._tls_dir, ca_common_name="gpu-broker Kubernetes sandbox CA"
        )

    def ssl_context(self) -> ssl.SSLContext:
        if not self._key_path.exists():  # started again after stop() removed the throwaway certificates
            self._tls_dir.mkdir(parents=True, exist_ok=True)
            self._write_tls()
        return server_context(self._chain_path, self._key_path)

    @property
    def ca_pem(self) -> str:
        """The cluster CA in PEM, as a kubeconfig's certificate-authority-data decodes to."""
        return self.cert_path.read_text()

    def stop(self) -> None:
        self.store.end_watches()
        super().stop()
        if self._owns_tls_dir:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------- public helpers

    demo_token = DEMO_TOKEN
    region = REGION

    def account_credentials(self) -> dict[str, str]:
        return {"token": DEMO_TOKEN, "ca_bundle": self.ca_pem}

    def account_options(self) -> dict[str, str]:
        """Adapter options for the demo account: prices per GPU model and the DCGM exporter's URL."""
        return {
            "gpu_prices": "\n".join(
                f"{key} {price}"
                for key, price in (
                    (gpu_names.A100_80_SXM, "1.90"),
                    (gpu_names.A100_40_SXM, "1.40"),
                    (gpu_names.T4, "0.30"),
                    (gpu_names.L4, "0.55"),
                )
            ),
            "shared_gpus": "allow",
            "dcgm_url": self.url + DCGM_PATH,
        }

    def register_token(
        self,
        *,
        user: str = "system:serviceaccount:broker-system:limited",
        deny: Iterable[tuple[str, str]] = (),
        rules: Iterable[PolicyRule] | None = None,
    ) -> str:
        """A new bearer token for ``user`` with ``rules``, else every served verb and resource less ``deny``
        ((verb, resource) pairs such as ``("create", "networkpolicies")``)."""
        return self.tokens.register(user=user, deny=deny, rules=rules)

    def set_node(
        self,
        name: str,
        *,
        ready: bool | None = None,
        unschedulable: bool | None = None,
        allocatable: dict[str, str] | None = None,
    ) -> None:
        """Change a node as an operator or the node lifecycle controller would: mark it NotReady (``ready=False``,
        with the not-ready taint), cordon it (``unschedulable=True``), or change its allocatable resources (merged
        into the current ones). KeyError for an unknown node."""
        with self._lock:
            node = self.store.get("nodes", "", name)
            if node is None:
                raise KeyError(f"no node {name!r}")
            spec, status = node["spec"], node["status"]
            if unschedulable is not None:
                spec["unschedulable"] = unschedulable
                self._set_taint(node, UNSCHEDULABLE_TAINT, unschedulable)
                if not unschedulable:
                    spec.pop("unschedulable", None)
            if ready is not None:
                for condition in status["conditions"]:
                    if condition["type"] == "Ready":
                        condition.update(
                            status="True" if ready else "False",
                            reason="KubeletReady" if ready else "KubeletNotReady",
                            message="kubelet is posting ready status" if ready else "container runtime is down",
                            lastTransitionTime=now_rfc3339(),
                        )
                self._set_taint(node, NOT_READY_TAINT, not ready)
            if allocatable is not None:
                for key, value in allocatable.items():
                    parse_quantity(value)
                    status["allocatable"][key] = str(value)
            self.store.touch("nodes", node)
            self._generation += 1

    def finish_pod(self, namespace: str, name: str, exit_code: int = 0) -> None:
        """The pod's containers exit with ``exit_code``: Succeeded (0) or Failed; its agent stops and its GPUs are
        free again. KeyError for an unknown pod."""
        with self._lock:
            pod = self.store.get("pods", namespace, name)
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            kubelet.terminated_status(pod, exit_code)
            self.store.touch("pods", pod)
            self._generation += 1
        self.booter.halt(f"{namespace}/{name}")

    def set_gpu_utilization(self, node: str, gpu: int, percent: int) -> None:
        """What the DCGM exporter reports as ``DCGM_FI_DEV_GPU_UTIL`` for one GPU."""
        with self._lock:
            self._utilization[(node, gpu)] = percent

    def pods(self, namespace: str | None = None) -> list[SandboxPod]:
        """Every pod the sandbox holds (deleted ones are gone), optionally in one namespace."""
        self.tick()
        with self._lock:
            found = []
            for pod in self.store.items("pods", namespace):
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                runtime = self._runtimes.get(key) or PodRuntime()
                found.append(
                    SandboxPod(
                        key[0],
                        key[1],
                        pod["status"]["phase"],
                        runtime.node,
                        runtime.waiting,
                        tuple(f"{d.resource}:{d.index}" for d in runtime.devices),
                        str(pod["spec"]["containers"][0].get("image") or ""),
                    )
                )
            return found

    def namespaces(self) -> list[str]:
        with self._lock:
            return [ns["metadata"]["name"] for ns in self.store.items("namespaces")]

    def reset(self) -> None:
        self.faults.clear()
        self.booter.reset()
        self.tokens.reset()
        with self._lock:
            self.store.clear()
            self._runtimes.clear()
            self._namespace_deadlines.clear()
            self._utilization.clear()
            self._generation += 1
            self._pod_ips = 0
            self.start_seconds = 0.0
            self.image_backoff_seconds = 0.0
            self.namespace_finalize_seconds = 0.0
            self._seed_nodes()
        self.clear_calls()

    # --------------------------------------------------------------------------------------- seed

    def _seed_nodes(self) -> None:
        for index, seed in enumerate(self.seed):
            self.store.put_new("nodes", self._node_object(seed, index))
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.store.put_new(
                "namespaces",
                objects.prepare_namespace({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}}),
            )

    def _node_object(self, seed: NodeSeed, index: int) -> dict[str, Any]:
        capacity = {
            "cpu": str(seed.cpu),
            "memory": f"{seed.memory_gi * 1024 * 1024}Ki",
            "ephemeral-storage": f"{seed.storage_gi * 1024 * 1024}Ki",
            "pods": "110",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            **{k: str(v) for k, v in seed.extended().items()},
        }
        # The kubelet reserves some CPU and memory for the system (kube-reserved and system-reserved).
        allocatable = dict(
            capacity, cpu=f"{seed.cpu * 1000 - 500}m", memory=f"{seed.memory_gi * 1024 * 1024 - 2 * 1024 * 1024}Ki"
        )
        stamp = now_rfc3339()
        ready = {
            "type": "Ready",
            "status": "True",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
        }
        conditions = [
            {
                "type": kind,
                "status": "False",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
                "reason": reason,
                "message": message,
            }
            for kind, reason, message in (
                ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            )
        ] + [ready]
        node: dict[str, Any] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": seed.name,
                "labels": seed.labels(),
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {
                "podCIDR": f"10.244.{index}.0/24",
                "podCIDRs": [f"10.244.{index}.0/24"],
                "providerID": f"sandbox://{REGION}/{seed.name}",
            },
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": HOST_IP},
                    {"type": "ExternalIP", "address": HOST_IP},
                    {"type": "Hostname", "address": seed.name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": f"{index:032x}",
                    "systemUUID": f"{index:032x}",
                    "bootID": f"{index:032x}",
                    "kernelVersion": "6.8.0-1015-nvidia",
                    "osImage": "Ubuntu 22.04.4 LTS",
                    "containerRuntimeVersion": "containerd://1.7.22",
                    "kubeletVersion": VERSION["gitVersion"],
                    "kubeProxyVersion": VERSION["gitVersion"],
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        if seed.unschedulable:
            node["spec"]["unschedulable"] = True
            self._set_taint(node, UNSCHEDULABLE_TAINT, True)
        if not seed.ready:
            ready.update(status="False", reason="KubeletNotReady", message="container runtime is down")
            self._set_taint(node, NOT_READY_TAINT, True)
        return node

    @staticmethod
    def _set_taint(node: dict[str, Any], key: str, present: bool) -> None:
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != key]
        if present:
            taints.append({"key": key, "effect": "NoSchedule", "timeAdded": now_rfc3339()})
        if taints:
            node["spec"]["taints"] = taints
        else:
            node["spec"].pop("taints", None)

    def _seed_of(self, node_name: str) -> NodeSeed | None:
        return next((s for s in self.seed if s.name == node_name), None)

    # --------------------------------------------------------------------------------------- control

    def control_extra(self, request: Request, route: str) -> Response | None:
        if route == "tokens" and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            deny = [(str(v), str(r)) for v, r in body.get("deny") or []]
            token = self.register_token(
                user=str(body.get("user") or "system:serviceaccount:broker-system:limited"), deny=deny
            )
            return json_response({"token": token}, status=201)
        if route.startswith("nodes/") and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            name = route.split("/", 1)[1]
            self.set_node(
                name,
                ready=body.get("ready"),
                unschedulable=body.get("unschedulable"),
                allocatable=body.get("allocatable"),
            )
            return json_response({"node": name})
        if route == "tick" and request.method == "POST":
            self.tick()
            return json_response({"ticked": True})
        if route.startswith("pods/") and request.method == "POST":
            parts = route.split("/")
            if len(parts) == 4 and parts[3] == "finish":
                body = request.get_json(force=True, silent=True) or {}
                self.finish_pod(parts[1], parts[2], int(body.get("exit_code", 0)))
                return json_response({"finished": f"{parts[1]}/{parts[2]}"})
        return None

    # -------------------------------------------------------------------------------------------- WSGI

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        # The cluster moves on between requests, one scheduler and kubelet step each: a pod created by one request
        # is bound (and running) when the next one looks.
        self.tick()
        try:
            response = self._dispatch(request)
        except ApiError as error:
            response = error.response()
        except Exception as exc:  # an API server answers a bug with a 500 Status, not an HTML page
            log.exception("kubernetes sandbox: %s %s failed", request.method, request.path)
            response = ApiError(500, "InternalError", f"Internal error occurred: {exc}").response()
        return response(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path == DCGM_PATH and request.method == "GET":
            self.record_call(Call("dcgmMetrics"))
            self._transport(Call("dcgmMetrics"))
            return Response(self._dcgm(), mimetype="text/plain", content_type="text/plain; version=0.0.4")
        if path == "/version" and request.method == "GET":
            return json_response(VERSION)
        match = ROUTE.match(path)
        if match is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        group = match.group("group") or ""
        version = match.group("core") or match.group("version")
        resource = RESOURCES.get((group, match.group("plural")))
        if resource is None or resource.version != version:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        namespace = match.group("namespace") or ""
        name = match.group("name")
        if resource is NAMESPACES and namespace:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if not resource.namespaced and resource is not NAMESPACES and namespace:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        verb = self._verb(request, name)
        action = _action(verb, resource)
        try:
            # Authentication comes first, as in the API server's filter chain: a stranger's body is never read.
            identity = self.tokens.identify(request.headers.get("Authorization"))
        except ApiError:
            self.record_call(Call(action, namespace))
            raise
        body = self._body(request) if request.method in ("POST", "PUT", "PATCH", "DELETE") else None
        call = self._call(action, namespace, body)
        self.record_call(call)
        self._transport(call, identity, resource, verb, namespace if resource.namespaced else "", name)
        authorize(identity, verb, resource, namespace if resource.namespaced else "", name)
        if resource is SSRR:
            if verb != "create":
                raise method_not_allowed()
            return object_response(rules_review(identity, body or {}), 201)
        if match.group("sub"):
            if verb != "get" or resource is not PODS or name is None:
                raise method_not_allowed()
            verb = "get"
        if verb in ("list", "watch"):
            if verb == "watch":
                return self._watch(request, resource, namespace or None)
            return self._list(request, resource, namespace or None)
        if verb == "get":
            assert name is not None
            return object_response(self._get(resource, namespace, name))
        if verb == "create":
            if resource.plural not in CREATABLE:
                raise method_not_allowed()
            if resource.namespaced and not namespace:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            return object_response(self._create(resource, namespace, body, call), 201)
        if verb == "delete":
            if resource.plural not in DELETABLE:
                raise method_not_allowed()
            assert name is not None
            return self._delete(resource, namespace, name, body if isinstance(body, dict) else {})
        raise method_not_allowed()

    @staticmethod
    def _verb(request: Request, name: str | None) -> str:
        method = request.method
        if method == "GET":
            if name is not None:
                return "get"
            return "watch" if request.args.get("watch") in ("true", "1") else "list"
        if method == "POST" and name is None:
            return "create"
        if method == "DELETE":
            return "delete" if name is not None else "deletecollection"
        if method == "PUT" and name is not None:
            return "update"
        if method == "PATCH" and name is not None:
            return "patch"
        raise method_not_allowed()

    @staticmethod
    def _body(request: Request) -> Any:
        if (request.content_length or 0) > MAX_BODY:
            raise ApiError(413, "RequestEntityTooLarge", "the request body is too large")
        raw = request.get_data(cache=True)
        if len(raw) > MAX_BODY:
            raise ApiError(413, "RequestEntityTooLarge", "the request body is too large")
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            raise bad_request(f"the object provided is unrecognized: {exc}") from exc

    @staticmethod
    def _call(action: str, namespace: str, body: Any) -> Call:
        resources: tuple[str, ...] = ()
        node = None
        if isinstance(body, dict) and isinstance(body.get("spec"), dict):
            spec = body["spec"]
            template = spec.get("template")
            if isinstance(template, dict) and isinstance(template.get("spec"), dict):
                spec = template["spec"]  # a Job's pod template
            names = set()
            for container in spec.get("containers") or []:
                if isinstance(container, dict):
                    names |= set((container.get("resources") or {}).get("limits") or {})
            resources = tuple(sorted(n for n in names if is_gpu_resource(n)))
            selector = spec.get("nodeSelector") or {}
            node = selector.get("kubernetes.io/hostname") if isinstance(selector, dict) else None
        return Call(action, namespace, resources, node)

    def _transport(
        self,
        call: Call,
        identity: Identity | None = None,
        resource: Resource | None = None,
        verb: str = "",
        namespace: str = "",
        name: str | None = None,
    ) -> None:
        """Faults acting before the request is served: ``slow`` waits, ``throttle`` answers 429 (503 with code
        ``ServiceUnavailable``), ``credentials`` 401 (403 naming the caller, verb and resource with code
        ``Forbidden``)."""
        fault = self.faults.take(call.action, call.resources, call.node, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(
                call.action, call.resources, call.node, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        if fault is None:
            return
        if fault.kind is FaultKind.THROTTLE:
            raise service_unavailable() if fault.code == "ServiceUnavailable" else too_many_requests(self.retry_after_s)
        if fault.code == "Forbidden" and resource is not None and identity is not None:
            raise forbidden(resource, name, forbidden_message(identity, verb, resource, namespace))
        raise unauthorized()

    # ---------------------------------------------------------------------------------------- verbs

    def _list(self, request: Request, resource: Resource, namespace: str | None) -> Response:
        label_requirements = parse_label_selector(request.args.get("labelSelector"))
        field_requirements = parse_field_selector(request.args.get("fieldSelector"), resource)
        limit = request.args.get("limit")
        with self._lock:
            items = []
            for obj in self.store.items(resource.plural, namespace):
                if resource is RESOURCE_QUOTAS:
                    self._refresh_quota(obj)
                if labels_match(label_requirements, obj["metadata"].get("labels")) and fields_match(
                    field_requirements, obj
                ):
                    item = snapshot(obj)
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                    items.append(item)
            revision = str(self.store.revision)
        if limit and limit.isdigit() and int(limit) > 0:
            items = items[: int(limit)]  # no continue token: the sandbox's lists are small
        return object_response(
            {
                "kind": resource.kind + "List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": revision},
                "items": items,
            }
        )

    def _watch(self, request: Request, resource: Resource, namespace: str | None) -> Response:
        """A watch ("Efficient detection of changes", https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
        newline-delimited ``{"type": ADDED|MODIFIED|DELETED, "object": ...}`` events after ``resourceVersion`` (from
        now, after an ADDED event for each object there is, without one), until ``timeoutSeconds``; an object leaving
        or entering the selectors is DELETED or ADDED. A resourceVersion older than the kept history is a 410 Gone
        ``ERROR`` event, as after etcd's compaction."""
        if resource.plural not in WATCHED:
            raise method_not_allowed()
        label_requirements = parse_label_selector(request.args.get("labelSelector"))
        field_requirements = parse_field_selector(request.args.get("fieldSelector"), resource)
        try:
            timeout = min(max(int(request.args.get("timeoutSeconds") or WATCH_MAX_S), 1), WATCH_MAX_S)
        except ValueError as exc:
            raise bad_request("timeoutSeconds must be an integer") from exc

        def matches(obj: dict[str, Any]) -> bool:
            in_scope = namespace is None or obj["metadata"].get("namespace", "") == namespace
            return (
                in_scope
                and labels_match(label_requirements, obj["metadata"].get("labels"))
                and fields_match(field_requirements, obj)
            )

        since_text = request.args.get("resourceVersion") or ""
        initial: list[dict[str, Any]] = []
        with self._lock:
            epoch = self.store.epoch
            current = [o for o in self.store.items(resource.plural, namespace) if matches(o)]
            visible = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in current}
            if since_text in ("", "0"):
                since = self.store.revision
                initial = [snapshot(o) for o in current]
            else:
                try:
                    since = int(since_text)
                except ValueError as exc:
                    raise bad_request(f'invalid resource version "{since_text}"') from exc
                oldest = self.store.history[0].revision if self.store.history else self.store.revision
                if since < oldest - 1:
                    gone = ApiError(410, "Expired", f"too old resource version: {since} ({oldest})")
                    line = json.dumps({"type": "ERROR", "object": json.loads(gone.response().get_data())})
                    return Response(line + "\n", mimetype="application/json")

        def events() -> Iterator[str]:
            for obj in initial:
                yield json.dumps({"type": "ADDED", "object": obj}) + "\n"
            last, deadline = since, time.monotonic() + timeout
            while True:
                self.tick()  # the cluster moves on while a watcher waits, as it does between requests
                with self._lock:
                    if self.store.epoch != epoch:
                        return
                    pending = [c for c in self.store.history if c.revision > last and c.plural == resource.plural]
                    if not pending:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return
                        self.store.changed.wait(min(remaining, WATCH_TICK_S))
                        continue
                for change in pending:
                    last = change.revision
                    key = (change.obj["metadata"].get("namespace", ""), change.obj["metadata"]["name"])
                    now_visible = change.type != "DELETED" and matches(change.obj)
                    kind = change.type
                    if now_visible and key not in visible:
                        kind = "ADDED"
                    elif not now_visible and key in visible:
                        kind = "DELETED"
                    elif not now_visible:
                        continue
                    visible.discard(key)
                    if now_visible:
                        visible.add(key)
                    yield json.dumps({"type": kind, "object": change.obj}) + "\n"

        return Response(events(), mimetype="application/json")

    def _get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self.store.get(resource.plural, namespace if resource.namespaced else "", name)
            if obj is None:
                raise not_found(resource, name)
            if resource is RESOURCE_QUOTAS:
                self._refresh_quota(obj)
            return snapshot(obj)

    def _create(self, resource: Resource, namespace: str, body: Any, call: Call) -> dict[str, Any]:
        obj = objects.check_body(body, resource, namespace)
        name = obj["metadata"]["name"]
        with self._lock:
            if resource.namespaced:
                owner = self.store.get("namespaces", "", namespace)
                if owner is None:
                    raise not_found(NAMESPACES, namespace)
                if owner["status"]["phase"] == "Terminating":
                    raise forbidden(
                        resource,
                        name,
                        f"unable to create new content in namespace {namespace} because it is being terminated",
                        [
                            {
                                "reason": "NamespaceTerminating",
                                "message": f"namespace {namespace} is being terminated",
                                "field": "metadata.namespace",
                            }
                        ],
                    )
            if self.store.count() >= MAX_OBJECTS:
                raise ApiError(500, "InternalError", "etcdserver: mvcc: database space exceeded")
            existing = self.store.get(resource.plural, namespace, name)
            if existing is not None:
                raise already_exists(resource, name, being_deleted="deletionTimestamp" in existing["metadata"])
            if resource is NAMESPACES:
                objects.prepare_namespace(obj)
            elif resource is PODS:
                objects.prepare_pod(obj)
                self._admit_quota(obj, call)
            elif resource is SERVICES:
                objects.prepare_service(obj, self._node_port, self._cluster_ip())
            elif resource is SECRETS:
                objects.prepare_secret(obj, resource)
            elif resource is RESOURCE_QUOTAS:
                objects.prepare_quota(obj, resource)
            elif resource is NETWORK_POLICIES:
                objects.prepare_network_policy(obj, resource)
            elif resource is JOBS:
                jobs.prepare_job(obj, resource)
            stored = self.store.put_new(resource.plural, obj)
            if resource is JOBS:
                jobs.label_job(stored)
            if resource is RESOURCE_QUOTAS:
                self._refresh_quota(stored)
            answer = snapshot(stored)
            if resource is PODS:
                runtime = PodRuntime()
                if self.faults.take(call.action, call.resources, call.node, kinds={FaultKind.CAPACITY}):
                    runtime.capacity_fault = True
                self._runtimes[(namespace, name)] = runtime
        return answer

    def _delete(self, resource: Resource, namespace: str, name: str, options: dict[str, Any]) -> Response:
        """Delete one object. ``options`` is the DeleteOptions body: a Job's pods go with it under the propagation
        policies ``Background`` and ``Foreground``, and stay (orphaned) under ``Orphan``, batch/v1's default
        ("Garbage Collection", https://kubernetes.io/docs/concepts/architecture/garbage-collection/)."""
        halted: list[str] = []
        with self._lock:
            scope = namespace if resource.namespaced else ""
            obj = self.store.get(resource.plural, scope, name)
            if obj is None:
                raise not_found(resource, name)
            if resource is NAMESPACES:
                if name in ("default", "kube-system", "kube-public"):
                    raise forbidden(resource, name, "this namespace may not be deleted")
                if obj["status"]["phase"] != "Terminating":
                    obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                    obj["status"] = {"phase": "Terminating"}
                    self.store.touch("namespaces", obj)
                    halted = self._empty_namespace(name)
                    self._namespace_deadlines[name] = time.monotonic() + self.namespace_finalize_seconds
                answer = object_response(snapshot(obj))
            elif resource is PODS:
                obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                obj["metadata"]["deletionGracePeriodSeconds"] = 30
                answer = object_response(snapshot(obj))
                self._remove_pod(namespace, name)
                halted = [f"{namespace}/{name}"]
            else:
                if resource is JOBS:
                    halted = self._release_job_pods(obj, options)
                self.store.remove(resource.plural, scope, name)
                answer = object_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": {
                            "name": name,
                            **({"group": resource.group} if resource.group else {}),
                            "kind": resource.plural,
                            "uid": obj["metadata"]["uid"],
                        },
                    }
                )
        for instance_id in halted:
            self.booter.halt(instance_id)
        return answer

    def _job_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return [p for p in self.store.items("pods", job["metadata"]["namespace"])
                if (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/controller-uid") == uid]  # fmt: skip

    def _release_job_pods(self, job: dict[str, Any], options: dict[str, Any]) -> list[str]:
        policy = options.get("propagationPolicy") or (
            "Orphan" if options.get("orphanDependents", True) else "Background"
        )
        halted = []
        for pod in self._job_pods(job):
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            if policy in ("Background", "Foreground"):
                self._remove_pod(namespace, name)
                halted.append(f"{namespace}/{name}")
            else:
                pod["metadata"].pop("ownerReferences", None)
                self.store.touch("pods", pod)
        return halted

    def _run_jobs(self) -> None:
        """The Job controller's pass: each Job's status from its pods, and a new pod where one is due."""
        for job in self.store.items("jobs"):
            pods = self._job_pods(job)
            status, due = jobs.job_status(job, [p["status"].get("phase", "Pending") for p in pods])
            if status != job.get("status"):
                job["status"] = status
                self.store.touch("jobs", job)
            if not due:
                continue
            namespace = job["metadata"]["namespace"]
            pod = objects.check_body(jobs.pod_for(job, f"{job['metadata']['name']}-{objects.alphanumeric_suffix()}"),
                                     PODS, namespace)  # fmt: skip
            try:
                objects.prepare_pod(pod)
                self._admit_quota(pod, Call("createPod", namespace))
            except ApiError as refused:
                self._event(job, "Warning", "FailedCreate", f"Error creating: {refused.message}", "job-controller")
                continue
            pod["metadata"]["ownerReferences"] = [jobs.owner_reference(job)]
            self.store.put_new("pods", pod)
            self._runtimes[(namespace, pod["metadata"]["name"])] = PodRuntime()
            self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", "job-controller")

    def _remove_pod(self, namespace: str, name: str) -> None:
        self.store.remove("pods", namespace, name)
        self._runtimes.pop((namespace, name), None)
        self._generation += 1

    def _empty_namespace(self, namespace: str) -> list[str]:
        """Remove everything in a terminating namespace; returns the pods whose agents must stop."""
        halted = []
        for plural in list(self.store.objects):
            if plural in ("nodes", "namespaces"):
                continue
            for obj in self.store.items(plural, namespace):
                if plural == "pods":
                    self._remove_pod(namespace, obj["metadata"]["name"])
                    halted.append(f"{namespace}/{obj['metadata']['name']}")
                else:
                    self.store.remove(plural, namespace, obj["metadata"]["name"])
        return halted

    # ----------------------------------------------------------------------------- services and quotas

    def _node_port(self, wanted: int | None, field: str, chosen: set[int]) -> int:
        """A NodePort for one port of a new Service (``chosen``: those its earlier ports took)."""
        low, high = objects.NODE_PORT_RANGE
        taken = {p.get("nodePort") for s in self.store.items("services") for p in s["spec"].get("ports") or []}
        taken |= chosen
        if wanted:
            if not isinstance(wanted, int) or not low <= wanted <= high:
                raise invalid(
                    SERVICES,
                    "",
                    [
                        invalid_value(
                            field,
                            wanted,
                            f"provided port is not in the valid range. The range of valid ports is {low}-{high}",
                        )
                    ],
                )
            if wanted in taken:
                raise invalid(SERVICES, "", [invalid_value(field, wanted, "provided port is already allocated")])
            return wanted
        for port in range(low, high + 1):
            if port not in taken:
                return port
        raise ApiError(500, "InternalError", "Internal error occurred: failed to allocate a nodePort: range is full")

    def _cluster_ip(self) -> str:
        count = len(self.store.items("services")) + 10
        return f"10.96.{count // 250}.{count % 250 + 1}"

    def _namespace_usage(self, namespace: str) -> dict[str, Decimal]:
        used: dict[str, Decimal] = {"pods": Decimal(0)}
        for pod in self.store.items("pods", namespace):
            if pod["status"].get("phase") in TERMINAL_PHASES:
                continue
            used["pods"] += 1
            for key, value in self._quota_view(pod).items():
                used[key] = used.get(key, Decimal(0)) + value
        return used

    @staticmethod
    def _quota_view(pod: dict[str, Any]) -> dict[str, Decimal]:
        """What a pod counts against a ResourceQuota's keys (``requests.X``, bare ``cpu``/``memory``, ``limits.X``)."""
        view: dict[str, Decimal] = {}
        for name, value in pod_requests(pod).items():
            view[f"requests.{name}"] = view.get(f"requests.{name}", Decimal(0)) + value
            if name in ("cpu", "memory", "ephemeral-storage"):
                view[name] = view.get(name, Decimal(0)) + value
        for container in pod["spec"].get("containers") or []:
            for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
                view[f"limits.{name}"] = view.get(f"limits.{name}", Decimal(0)) + parse_quantity(value)
        return view

    def _refresh_quota(self, quota: dict[str, Any]) -> None:
        used = self._namespace_usage(quota["metadata"]["namespace"])
        hard = quota["spec"].get("hard") or {}
        quota["status"] = {"hard": dict(hard), "used": {k: format_quantity(used.get(k, Decimal(0))) for k in hard}}

    def _admit_quota(self, pod: dict[str, Any], call: Call) -> None:
        """The ResourceQuota admission: refuse a pod that takes any quota of its namespace past its hard limit, in
        the quota admission's words ("Resource Quotas", https://kubernetes.io/docs/concepts/policy/resource-quotas/)."""
        name = pod["metadata"]["name"]
        namespace = pod["metadata"]["namespace"]
        requested = {"pods": Decimal(1), **self._quota_view(pod)}
        fault = self.faults.take(call.action, call.resources, call.node, kinds={FaultKind.QUOTA})
        if fault is not None:
            keys = [f"requests.{r}" for r in call.resources] or ["pods"]
            shown = ",".join(f"{k}={format_quantity(requested.get(k, Decimal(1)))}" for k in sorted(keys))
            zero = ",".join(f"{k}=0" for k in sorted(keys))
            raise forbidden(
                PODS,
                name,
                f"exceeded quota: {fault.code or 'gpu-quota'}, requested: {shown}, used: {zero}, limited: {zero}",
            )
        used = self._namespace_usage(namespace)
        for quota in self.store.items("resourcequotas", namespace):
            hard = {k: parse_quantity(v) for k, v in (quota["spec"].get("hard") or {}).items()}
            over = sorted(
                k
                for k, limit in hard.items()
                if requested.get(k, Decimal(0)) > 0 and used.get(k, Decimal(0)) + requested[k] > limit
            )
            if over:
                requested_text = ",".join(f"{k}={format_quantity(requested[k])}" for k in over)
                used_text = ",".join(f"{k}={format_quantity(used.get(k, Decimal(0)))}" for k in over)
                limited_text = ",".join(f"{k}={format_quantity(hard[k])}" for k in over)
                raise forbidden(
                    PODS,
                    name,
                    f"exceeded quota: {quota['metadata']['name']}, requested: "
                    f"{requested_text}, used: {used_text}, limited: {limited_text}",
                )

    # ------------------------------------------------------------------------------------ events

    def _event(self, pod: dict[str, Any], kind: str, reason: str, message: str, component: str, host: str = "") -> None:
        """Record an event about an object (a pod, a Job), counting a repeat of the same reason and message as the
        event recorder does."""
        namespace = pod["metadata"]["namespace"]
        name = pod["metadata"]["name"]
        stamp = now_rfc3339()
        for event in self.store.items("events", namespace):
            involved = event["involvedObject"]
            if (
                involved.get("uid") == pod["metadata"]["uid"]
                and event["reason"] == reason
                and event["message"] == message
            ):
                event["count"] += 1
                event["lastTimestamp"] = stamp
                self.store.touch("events", event)
                return
        source = {"component": component, **({"host": host} if host else {})}
        self.store.put_new(
            "events",
            {
                "kind": "Event",
                "apiVersion": "v1",
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
                "involvedObject": {
                    "kind": pod["kind"],
                    "namespace": namespace,
                    "name": name,
                    "uid": pod["metadata"]["uid"],
                    "apiVersion": pod["apiVersion"],
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    **(
                        {"fieldPath": "spec.containers{" + pod["spec"]["containers"][0]["name"] + "}"}
                        if component == "kubelet"
                        else {}
                    ),
                },
                "reason": reason,
                "message": message,
                "source": source,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "type": kind,
                "eventTime": None,
                "reportingComponent": component,
                "reportingInstance": host or component,
            },
        )

    # ------------------------------------------------------------------------------ scheduler and kubelets

    def tick(self) -> None:
        """Advance the cluster: finalize deleted namespaces, schedule pending pods, move bound pods along in their
        kubelet, and boot the lease agent of each pod that has come to run (outside the lock)."""
        boots: list[tuple[str, bytes | None, list[GpuSeen], str, str]] = []
        now = time.monotonic()
        with self._lock:
            for namespace, deadline in list(self._namespace_deadlines.items()):
                if now >= deadline:
                    self._empty_namespace(namespace)
                    self.store.remove("namespaces", "", namespace)
                    del self._namespace_deadlines[namespace]
            self._run_jobs()
            for pod in self.store.items("pods"):
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                runtime = self._runtimes.setdefault(key, PodRuntime())
                if pod["status"].get("phase") in TERMINAL_PHASES:
                    continue
                if runtime.node is None:
                    self._schedule(pod, runtime, now)
                if runtime.node is not None and pod["status"].get("phase") == "Pending":
                    boot = self._kubelet(pod, runtime, now)
                    if boot is not None:
                        boots.append(boot)
        for instance_id, script, gpus, instance_type, zone in boots:
            self.booter.boot(
                instance_id=instance_id,
                user_data=script,
                gpus=gpus,
                instance_type=instance_type,
                zone=zone,
                ssh_host=HOST_IP,
            )

    def _used_on(self, node_name: str) -> tuple[dict[str, Decimal], list[Any]]:
        used: dict[str, Decimal] = {"pods": Decimal(0)}
        devices = []
        for pod in self.store.items("pods"):
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            runtime = self._runtimes.get(key)
            if runtime is None or runtime.node != node_name or pod["status"].get("phase") in TERMINAL_PHASES:
                continue
            used["pods"] += 1
            for name, value in pod_requests(pod).items():
                used[name] = used.get(name, Decimal(0)) + value
            devices += runtime.devices
        return used, devices

    def _schedule(self, pod: dict[str, Any], runtime: PodRuntime, now: float) -> None:
        if runtime.cluster_generation == self._generation:
            return  # nothing changed since it last did not fit
        rejections: dict[str, list[str]] = {}
        for node in self.store.items("nodes"):
            used, held = self._used_on(node["metadata"]["name"])
            reasons = node_rejections(pod, node, used, capacity_fault=runtime.capacity_fault)
            if reasons:
                rejections[node["metadata"]["name"]] = reasons
                continue
            seed = self._seed_of(node["metadata"]["name"])
            runtime.node = node["metadata"]["name"]
            runtime.devices = allocate_devices(seed, pod_requests(pod), held) if seed else []
            runtime.bound_at = now
            pod["spec"]["nodeName"] = runtime.node
            conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != "PodScheduled"]
            pod["status"]["conditions"] = [
                *conditions,
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()},
            ]
            kubelet.waiting_status(pod, "ContainerCreating", "")
            self.store.touch("pods", pod)
            self._event(
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} to {runtime.node}",
                SCHEDULER,
            )
            return
        runtime.cluster_generation = self._generation
        message = failure_message(rejections)
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
                "reason": "Unschedulable",
                "message": message,
            }
        ]
        self.store.touch("pods", pod)
        self._event(pod, "Warning", "FailedScheduling", message, SCHEDULER)

    def _kubelet(
        self, pod: dict[str, Any], runtime: PodRuntime, now: float
    ) -> tuple[str, bytes | None, list[GpuSeen], str, str] | None:
        """One step of the pod's kubelet; the boot to do when the pod has just come to run."""
        assert runtime.bound_at is not None and runtime.node is not None
        node = runtime.node
        if now < runtime.bound_at + self.start_seconds:
            return None
        container = pod["spec"]["containers"][0]
        image = str(container["image"])
        namespace = pod["metadata"]["namespace"]
        secrets = {s["metadata"]["name"]: s for s in self.store.items("secrets", namespace)}
        for volume in pod["spec"].get("volumes") or []:
            source = volume.get("secret")
            if source and source.get("secretName") not in secrets and not source.get("optional"):
                self._wait(pod, runtime, "ContainerCreating", "")
                self._event(
                    pod,
                    "Warning",
                    "FailedMount",
                    f'MountVolume.SetUp failed for volume "{volume["name"]}" : '
                    f'secret "{source.get("secretName")}" not found',
                    "kubelet",
                    node,
                )
                return None
        if not kubelet.image_valid(image):
            message = kubelet.invalid_image_message(image)
            if runtime.waiting != "InvalidImageName":
                self._wait(pod, runtime, "InvalidImageName", message)
                self._event(pod, "Warning", "InspectFailed", message, "kubelet", node)
                self._event(pod, "Warning", "Failed", "Error: InvalidImageName", "kubelet", node)
            return None
        if now < runtime.next_pull_at:
            return None
        if runtime.waiting == "ErrImagePull":
            runtime.next_pull_at = now + self.image_backoff_seconds
            self._wait(pod, runtime, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            self._event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet", node)
            self._event(pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", node)
            return None
        self._event(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
        fault = self.faults.take(IMAGE_ACTION, [image], node, kinds={FaultKind.IMAGE_MISSING})
        if fault is not None:
            message = fault.message or kubelet.pull_failure_message(image)
            runtime.next_pull_at = now + self.image_backoff_seconds
            self._wait(pod, runtime, "ErrImagePull", message)
            self._event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {message}', "kubelet", node)
            self._event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
            return None
        self._event(
            pod,
            "Normal",
            "Pulled",
            f'Successfully pulled image "{image}" in 1.2s (1.2s including waiting)',
            "kubelet",
            node,
        )
        self._pod_ips += 1
        node_index = next((i for i, s in enumerate(self.seed) if s.name == node), 0)
        kubelet.running_status(pod, HOST_IP, f"10.244.{node_index}.{self._pod_ips % 250 + 2}")
        runtime.waiting = ""
        self.store.touch("pods", pod)
        self._event(pod, "Normal", "Created", f"Created container: {container['name']}", "kubelet", node)
        self._event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet", node)
        if runtime.booted:
            return None
        runtime.booted = True
        script, _why = kubelet.boot_script(pod, secrets)
        return (
            f"{namespace}/{pod['metadata']['name']}",
            script,
            self._gpus_of(node, runtime),
            next((d.resource for d in runtime.devices), ""),
            node,
        )

    def _wait(self, pod: dict[str, Any], runtime: PodRuntime, reason: str, message: str) -> None:
        runtime.waiting, runtime.waiting_message = reason, message
        kubelet.waiting_status(pod, reason, message)
        self.store.touch("pods", pod)

    def _gpus_of(self, node_name: str, runtime: PodRuntime) -> list[GpuSeen]:
        """The GPUs the pod's container sees: its whole GPUs, one GPU for a MIG device (its slice's memory) or a
        time-sliced replica (the whole board, shared)."""
        seed = self._seed_of(node_name)
        if seed is None or not runtime.devices:
            return []
        indexes = sorted({d.index for d in runtime.devices})
        mig = next((d for d in runtime.devices if d.mig_profile), None)
        # Rounded to the nearest GB, as the lease agent reads nvidia-smi's MiB (a 1g.5gb's 4864 MiB is 5 GB).
        memory_gb = round(seed.memory_mib / 1024)
        if mig is not None:
            memory_gb = max(1, round(A100_40_PROFILES[mig.mig_profile].memory_mib / 1024))
        return simulated_gpus(seed.model, len(indexes), memory_gb)

    # ------------------------------------------------------------------------------------------ DCGM

    def _dcgm(self) -> str:
        with self._lock:
            uses: dict[tuple[str, int], list[GpuUse]] = {}
            for pod in self.store.items("pods"):
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                runtime = self._runtimes.get(key)
                if runtime is None or runtime.node is None or pod["status"].get("phase") != "Running":
                    continue
                container = pod["spec"]["containers"][0]["name"]
                for device in runtime.devices:
                    use = GpuUse(
                        key[0],
                        key[1],
                        container,
                        device.mig_profile,
                        device.mig_instance if device.mig_profile else None,
                    )
                    if use not in uses.setdefault((runtime.node, device.index), []):
                        uses[(runtime.node, device.index)].append(use)
            utilization = dict(self._utilization)
        return render([s for s in self.seed if s.gpus], uses, utilization)


def start_kubernetes_sandbox(host: str = "127.0.0.1", port: int = 0) -> KubernetesSandbox:
    """Build a ``KubernetesSandbox`` and serve it over HTTPS on a daemon thread; ``sandbox.url`` is the API server
    URL and ``sandbox.ca_pem`` the CA to trust."""
    sandbox = KubernetesSandbox()
    sandbox.start(host, port)
    return sandbox
