"""``KubernetesAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over a seller's Kubernetes
cluster whose GPU nodes run NVIDIA's device plugin (and GPU Feature Discovery for the model labels)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from providers import ratelimit
from providers.base import ProviderAdapter
from providers.boot import render_boot_script
from providers.endpoints import EndpointRefused, endpoint_check
from providers.errors import CredentialsRejected, ProviderError, ProviderRequestRejected
from providers.kubernetes import catalog, dcgm, launching, mapping, permissions
from providers.kubernetes.client import (
    BACKOFF_SECONDS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_READ_TIMEOUT,
    ClientSettings,
    KubernetesClient,
    fetch_metrics,
)
from providers.kubernetes.kubeconfig import api_server_url_problem, ca_bundle_problem, token_problem
from providers.kubernetes.pricing import parse_gpu_prices
from providers.launch import LaunchLimits, LaunchProblem, OrderResource, UserDataMeasure, WorkloadKind
from providers.options import option_number
from providers.sshkeys import KEY_TYPES
from providers.types import NODE_RESOURCE, Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote

PROVIDER = mapping.PROVIDER
_INSTANCE_ID = re.compile(rf"({launching.NAMESPACE_PREFIX}[0-9a-f]{{20}})/{mapping.POD_NAME}")
# The private ranges pod networks are drawn from (RFC 1918, RFC 6598's shared space, IPv6 unique local): the
# lease's egress excludes them unless the seller names the cluster's own pod CIDRs (option ``pod_cidrs``).
DEFAULT_POD_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
_ALREADY_EXISTS = "AlreadyExists"


class KubernetesAdapter(ProviderAdapter):
    """One cluster, sold per node under the account's first region.

    Credentials: ``endpoint_url`` the API server (https), ``values`` ``token`` (a service account's bearer token)
    and ``ca_bundle`` (the cluster CA's PEM; empty for a server a public CA signed). Options (all strings):
    ``gpu_prices`` (``providers.kubernetes.pricing``; required to offer anything), ``shared_gpus`` (``allow`` to
    sell time-sliced GPUs), ``image`` (default ``launching.DEFAULT_IMAGE``), ``pool_label`` (the node label whose
    value prices may name and offers report, default ``broker.example/pool``), ``pod_cidrs`` (comma-separated;
    what the lease may not reach), ``dcgm_url`` (a dcgm-exporter's ``/metrics``), ``connect_timeout`` /
    ``read_timeout`` seconds (5/30), ``max_attempts`` for reads (3), ``retry_backoff`` (0.25 s, doubling),
    ``rate_limit.api`` (the cluster's request bucket, ``providers.ratelimit.KUBERNETES_LIMITS``).

    Instance ids are ``<namespace>/lease``; the namespace is derived from the client token, so a repeated launch
    finds the first one's objects. Terminating deletes the namespace. Not stoppable: a pod has no stop that keeps
    its disk.
    """

    kind = "kubernetes"
    launch_limits = LaunchLimits(
        user_data_max_bytes=launching.BOOT_DATA_MAX_BYTES,
        user_data_measure=UserDataMeasure.RAW,
        user_data_field="the boot Secret's data",
        source=launching.DATA_LIMIT_SOURCE,
        native_key_types=KEY_TYPES,  # the boot script (the Secret) is this cluster's own key mechanism
    )
    # The buyer logs in as a user of the lease's own, never as root: the lease agent makes it in the pod (the CUDA
    # base images have only root), and sshd refuses root. The pod, its namespace, NetworkPolicy and ResourceQuota
    # are the lease's walls.
    login_user: ClassVar[str] = "lease"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: a Kubernetes account needs a region to list its nodes under")
        endpoint = credentials.endpoint_url or ""
        problem = api_server_url_problem(endpoint) if endpoint else "give the API server's URL"
        if problem:
            raise ValueError(f"endpoint_url: {problem}")
        token = credentials.values.get("token", "").strip()
        ca_bundle = credentials.values.get("ca_bundle", "")
        if not token or token_problem(token):
            raise CredentialsRejected(
                f"token: {token_problem(token) if token else 'give a service account token'}",
                code="invalid_token",
                provider=PROVIDER,
            )
        if ca_bundle and (ca_problem := ca_bundle_problem(ca_bundle)):
            raise CredentialsRejected(f"ca_bundle: {ca_problem}", code="invalid_ca_bundle", provider=PROVIDER)
        try:
            self._rules = parse_gpu_prices(self.options.get("gpu_prices", ""))
        except ValueError as exc:
            raise ValueError(f"options.gpu_prices: {exc}") from None
        shared = self.options.get("shared_gpus", "")
        if shared not in ("", "allow", "deny"):
            raise ValueError("options.shared_gpus: give allow or deny")
        self._shared = shared == "allow"
        self._pod_cidrs = _cidrs(self.options.get("pod_cidrs", ""))
        self._ca_bundle = ca_bundle
        self._image = self.options.get("image") or launching.DEFAULT_IMAGE
        if not launching.image_ok(self._image):
            raise ValueError("options.image: not a container image reference")
        self._connect = option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        self._read_timeout = option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT)
        self._client = KubernetesClient(
            ClientSettings(
                endpoint_url=endpoint,
                token=token,
                ca_bundle=ca_bundle,
                connect_timeout=self._connect,
                read_timeout=self._read_timeout,
                max_attempts=int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
                retry_backoff=option_number(self.options, "retry_backoff", BACKOFF_SECONDS),
                rate_limits=ratelimit.limits_from_options(self.options, self.kind),
            )
        )

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """A SelfSubjectRulesReview: proves the token (401 -> ``CredentialsRejected``) and that it holds every
        permission of ``permissions.PERMISSIONS``, naming the first it lacks. ``TransientProviderError`` when the
        API server cannot be reached."""
        permissions.check_review(self._client.rules_review(permissions.REVIEW_NAMESPACE))

    def list_offers(self) -> list[OfferQuote]:
        """The cluster's offers (``catalog.offers``) from one list of nodes and one of pods (paged). Read-only."""
        nodes = self._client.list_nodes()
        pods = self._client.list_pods()
        settings = catalog.OfferSettings(
            region=self.regions[0],
            rules=self._rules,
            shared_gpus=self._shared,
            pool_label=self.options.get("pool_label") or catalog.DEFAULT_POOL_LABEL,
        )
        return catalog.offers(nodes, pods, settings)

    # ------------------------------------------------------------------------------------------ launch

    def _resource(self, spec: LaunchSpec) -> tuple[str, int]:
        named = catalog.instance_resource(spec.instance_type)
        if named is None:
            raise ProviderRequestRejected(
                f"{spec.instance_type[:64]!r} is not an instance type of this cluster",
                code="Invalid",
                provider=PROVIDER,
            )
        resource, count = named
        offered = spec.offer_extra.get(NODE_RESOURCE)
        # The offer may sell slices or shares under nvidia.com/gpu itself (MIG single strategy, time-slicing
        # without renaming): its own resource name wins.
        if isinstance(offered, str) and (
            offered in (mapping.GPU_RESOURCE, mapping.SHARED_RESOURCE)
            or (
                offered.startswith(mapping.MIG_RESOURCE_PREFIX)
                and mapping.MIG_PROFILE_NAME.fullmatch(offered.removeprefix(mapping.MIG_RESOURCE_PREFIX))
            )
        ):
            resource = offered
        return resource, count

    def _node_selector(self, spec: LaunchSpec) -> dict[str, str]:
        offered = spec.offer_extra.get("node_selector")
        if (
            isinstance(offered, dict)
            and offered
            and all(
                isinstance(k, str) and isinstance(v, str) and launching.label_value_ok(v) for k, v in offered.items()
            )
        ):
            return dict(offered)
        return {mapping.HOSTNAME_LABEL: spec.zone}

    def _image_for(self, spec: LaunchSpec) -> str:
        boot = spec.boot
        if boot is not None and boot.workload_kind is WorkloadKind.CONTAINER and boot.workload.get("image"):
            return str(boot.workload["image"])
        return (boot.image if boot is not None else None) or spec.image or self._image

    # ------------------------------------------------------------------------- the boot inside the pod

    def boot_prelude(self, spec: LaunchSpec) -> str:
        """What the lease agent needs in the pod's image, added where missing (``launching.POD_PRELUDE``): bash,
        Python 3, curl and an SSH server, the login user, and sshd listening on port 22."""
        return launching.POD_PRELUDE

    def user_data(self, spec: LaunchSpec) -> bytes | None:
        """The boot script, run by the pod's container itself. Kubernetes runs the buyer's image, so a container
        workload is its command run in place (``launching.in_place_workload``), not a container started inside
        the pod; and the script ends by waiting on the agent it started, so the pod lives as long as the lease."""
        boot = spec.boot
        if boot is None:
            return None
        if boot.workload_kind is WorkloadKind.CONTAINER:
            boot = dataclasses.replace(boot, workload=launching.in_place_workload(boot.workload))
        script = render_boot_script(boot, login_user=self.login_user, prelude=self.boot_prelude(spec))
        return script + launching.POD_KEEPALIVE

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """Create the namespace, then (each tolerating ``AlreadyExists`` on a repeat) the boot Secret, the
        ResourceQuota, the NetworkPolicy, the Service and last the Pod, so the pod never runs unwalled. A repeat
        with the same client token returns the pod the first made. A final refusal of any of them (quota,
        permissions, an invalid spec) deletes the namespace again, so nothing is left; a transient one keeps it
        for the retry. Raises ``QuotaExceeded``, ``CredentialsRejected``, ``TransientProviderError`` or
        ``ProviderRequestRejected``; no node fitting shows later, as ``describe``'s FAILED (capacity)."""
        if spec.region not in self.regions:
            raise ProviderRequestRejected(
                f"region {spec.region!r} is not this account's", code="Invalid", provider=PROVIDER
            )
        if not launching.label_value_ok(spec.order_ref):
            raise ProviderRequestRejected("the order reference is not a label value", code="Invalid", provider=PROVIDER)
        resource, count = self._resource(spec)
        image = self._image_for(spec)
        if not launching.image_ok(image):
            raise ProviderRequestRejected(
                f"{image[:100]!r} is not a container image", code="Invalid", provider=PROVIDER
            )
        namespace = launching.namespace_name(spec.client_token)
        labels = launching.labels(spec.order_ref, spec.client_token, spec.instance_type)
        try:
            self._client.create_namespace(launching.namespace_body(namespace, labels))
        except ProviderRequestRejected as exc:
            if exc.code != _ALREADY_EXISTS:
                raise
            existing = self._client.read_namespace(namespace) or {}
            if (existing.get("metadata") or {}).get("labels", {}).get(mapping.ORDER_LABEL) != spec.order_ref:
                raise
            if (existing.get("status") or {}).get("phase") == "Terminating":
                return mapping.terminated_handle(f"{namespace}/{mapping.POD_NAME}", spec.region)
        try:
            pod, service = self._fill(namespace, spec, labels, resource, count, image)
        except ProviderError as exc:
            if not exc.retryable:  # a retry would fail alike: leave nothing in the cluster
                self._discard(namespace)
            raise
        if pod is None:
            raise ProviderRequestRejected("the pod vanished while being launched", code="NotFound", provider=PROVIDER)
        return self._handle(pod, spec.region, service)

    def _fill(
        self, namespace: str, spec: LaunchSpec, labels: dict[str, str], resource: str, count: int, image: str
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The namespace's objects, the pod last; each one already there (a repeated launch) is taken as is."""
        boot = spec.boot
        script = self.user_data(spec)
        ingress = boot.ingress if boot is not None else ()
        bodies: list[tuple[Any, dict[str, Any]]] = []
        if script is not None:
            bodies.append((self._client.create_secret, launching.secret_body(script, labels)))
        bodies += [
            (self._client.create_resource_quota, launching.resource_quota_body(resource, count, labels)),
            (self._client.create_network_policy, launching.network_policy_body(ingress, self._pod_cidrs, labels)),
        ]
        for create, body in bodies:
            self._create(create, namespace, body)
        service = self._create(
            self._client.create_service, namespace, launching.service_body(launching.service_ports(ingress), labels)
        ) or self._client.read_service(namespace, launching.SERVICE_NAME)
        pod_spec = launching.pod_body(
            image=image,
            resource=resource,
            count=count,
            node_selector=self._node_selector(spec),
            disk_gb=boot.disk_gb if boot is not None else None,
            with_boot=script is not None,
            object_labels=labels,
        )
        pod = self._create(self._client.create_pod, namespace, pod_spec) or self._client.read_pod(
            namespace, mapping.POD_NAME
        )
        return pod, service

    def _create(self, create: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The object created, or None when it was already there (a repeated launch)."""
        try:
            created: dict[str, Any] = create(namespace, body)
        except ProviderRequestRejected as exc:
            if exc.code == _ALREADY_EXISTS:
                return None
            raise
        return created

    def _discard(self, namespace: str) -> None:
        try:
            self._client.delete_namespace(namespace)
        except ProviderError:
            pass  # the reconciler finds it by its order label

    def _handle(self, pod: dict[str, Any], region: str, service: dict[str, Any] | None = None) -> InstanceHandle:
        spec = pod.get("spec") or {}
        node_name = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get(mapping.HOSTNAME_LABEL)
        node_item = self._client.read_node(str(node_name)) if node_name else None
        node = mapping.node_view(node_item) if node_item else None
        if service is None:
            namespace = str((pod.get("metadata") or {}).get("namespace") or "")
            service = self._client.read_service(namespace, launching.SERVICE_NAME) if namespace else None
        return mapping.instance_handle(pod, region, node=node, service=service)

    # ----------------------------------------------------------------------------------- state and end

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The pod's state (``mapping.pod_state``): an unschedulable pod is FAILED with ``error_class``
        capacity and ``error_code`` FailedScheduling; an image that cannot be pulled FAILED with the buyer's
        error. A namespace being deleted, or gone, is TERMINATED; one whose pod was never made is PENDING.
        Raises ``ProviderRequestRejected`` (NotFound) for an id that is not one of this adapter's."""
        namespace = self._namespace_of(instance_id)
        pod = self._client.read_pod(namespace, mapping.POD_NAME)
        if pod is not None:
            return self._handle(pod, region)
        return self._without_pod(region, namespace, instance_id)

    def _without_pod(self, region: str, namespace: str, instance_id: str) -> InstanceHandle:
        """An instance whose pod the cluster does not have: TERMINATED when its namespace is gone or going, else
        PENDING (a launch that made the namespace and not yet the pod)."""
        ns = self._client.read_namespace(namespace)
        if ns is None or (ns.get("status") or {}).get("phase") == "Terminating":
            return mapping.terminated_handle(instance_id, region)
        labels = (ns.get("metadata") or {}).get("labels") or {}
        return InstanceHandle(
            instance_id=instance_id,
            region=region,
            zone="",
            instance_type=str(labels.get(mapping.INSTANCE_TYPE_LABEL, "")),
            state=InstanceState.PENDING,
            tags={str(k): str(v) for k, v in labels.items()},
            extra={"namespace": namespace, "phase": "NoPod"},
        )

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """One list of the broker's pods and one of its Services across all namespaces (by label, paged), and
        one of the nodes for their addresses, whatever the number of ids. An id whose pod is not listed is read on
        its own namespace: PENDING while the namespace waits for its pod, absent once it is gone or going (the
        cluster forgot it) or when it never was."""
        wanted: dict[str, str] = {}
        for instance_id in dict.fromkeys(instance_ids):
            match = _INSTANCE_ID.fullmatch(instance_id)
            if match is not None:
                wanted[match.group(1)] = instance_id
        if not wanted:
            return {}
        selector = f"{mapping.MANAGED_BY}={mapping.MANAGED_BY_VALUE}"
        pods = {
            str((p.get("metadata") or {}).get("namespace")): p
            for p in self._client.list_labelled_pods(selector)
            if (p.get("metadata") or {}).get("name") == mapping.POD_NAME
        }
        found: dict[str, InstanceHandle] = {}
        if any(namespace in pods for namespace in wanted):
            services = {
                str((s.get("metadata") or {}).get("namespace")): s
                for s in self._client.list_labelled_services(selector)
                if (s.get("metadata") or {}).get("name") == launching.SERVICE_NAME
            }
            nodes = {view.name: view for view in map(mapping.node_view, self._client.list_nodes())}
            for namespace, instance_id in wanted.items():
                pod = pods.get(namespace)
                if pod is None:
                    continue
                spec = pod.get("spec") or {}
                node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get(mapping.HOSTNAME_LABEL)
                found[instance_id] = mapping.instance_handle(
                    pod, region, node=nodes.get(str(node)), service=services.get(namespace)
                )
        for namespace, instance_id in wanted.items():
            if instance_id not in found:
                handle = self._without_pod(region, namespace, instance_id)
                if handle.state is not InstanceState.TERMINATED:
                    found[instance_id] = handle
        return found

    def _namespace_of(self, instance_id: str) -> str:
        match = _INSTANCE_ID.fullmatch(instance_id)
        if match is None:
            raise ProviderRequestRejected(
                f"{instance_id[:100]!r} is not an instance of this cluster", code="NotFound", provider=PROVIDER
            )
        return match.group(1)

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Delete the instance's namespace and everything in it. Idempotent: a namespace already gone (404) or
        being deleted is success. Returns TERMINATED: the API server has taken the delete."""
        self._client.delete_namespace(self._namespace_of(instance_id))
        return mapping.terminated_handle(instance_id, region)

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """The pods of the namespaces labelled with the order, sorted by id."""
        if not launching.label_value_ok(order_ref) or not order_ref:
            return []
        handles: list[InstanceHandle] = []
        for ns in self._client.list_namespaces(f"{mapping.ORDER_LABEL}={order_ref}"):
            name = str((ns.get("metadata") or {}).get("name") or "")
            pod = self._client.read_pod(name, mapping.POD_NAME) if name else None
            if pod is not None:
                handles.append(self._handle(pod, self.regions[0]))
        return sorted(handles, key=lambda h: h.instance_id)

    def list_order_resources(self) -> list[OrderResource]:
        """Every namespace the broker made (labelled with an order), but those already being deleted."""
        found = []
        for ns in self._client.list_namespaces(
            f"{mapping.MANAGED_BY}={mapping.MANAGED_BY_VALUE},{mapping.ORDER_LABEL}"
        ):
            metadata = ns.get("metadata") or {}
            if (ns.get("status") or {}).get("phase") == "Terminating" or metadata.get("deletionTimestamp"):
                continue
            found.append(
                OrderResource(
                    kind="namespace",
                    resource_id=str(metadata.get("name") or ""),
                    region=self.regions[0],
                    order_ref=str((metadata.get("labels") or {}).get(mapping.ORDER_LABEL) or ""),
                )
            )
        return sorted(found, key=lambda r: (r.order_ref, r.resource_id))

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete every namespace of the order. Idempotent (404 and Terminating are done); returns none left,
        since the API server deletes a namespace's contents itself once it took the delete."""
        if not launching.label_value_ok(order_ref) or not order_ref:
            return []
        for ns in self._client.list_namespaces(f"{mapping.ORDER_LABEL}={order_ref}"):
            name = str((ns.get("metadata") or {}).get("name") or "")
            if name.startswith(launching.NAMESPACE_PREFIX) and (ns.get("status") or {}).get("phase") != "Terminating":
                self._client.delete_namespace(name)
        return []

    # ------------------------------------------------------------------------- boot limits, telemetry

    def launch_problems(self, spec: LaunchSpec) -> list[LaunchProblem]:
        """The shared checks, a disk larger than the node's allocatable ephemeral storage (from the offer), and
        a container image the API would refuse. Pure."""
        problems = super().launch_problems(spec)
        boot = spec.boot
        if boot is None:
            return problems
        node_gb = spec.offer_extra.get("ephemeral_storage_gb")
        if (
            boot.disk_gb is not None
            and isinstance(node_gb, int)
            and node_gb > 0
            and boot.disk_gb > node_gb
            and not any(p.field == "launch.disk_gb" for p in problems)
        ):
            problems.append(
                LaunchProblem(
                    "launch.disk_gb",
                    f"{boot.disk_gb} GB is more than node {spec.zone}'s {node_gb} GB of ephemeral storage",
                )
            )
        if not launching.image_ok(self._image_for(spec)):
            problems.append(LaunchProblem("launch.image", "not a container image reference"))
        if boot.workload_kind is WorkloadKind.CONTAINER and not boot.workload.get("command"):
            # The pod runs the boot script in the buyer's image, so the image's own entrypoint does not run: the
            # command must be given. A cluster cannot read an image's entrypoint before pulling it.
            problems.append(
                LaunchProblem(
                    "launch.workload.command",
                    "a Kubernetes cluster runs the container's command in its pod: give the command "
                    "(the image's entrypoint is not run)",
                )
            )
        return problems

    def gpu_telemetry(self) -> dict[str, list[dcgm.GpuSample]]:
        """Per-GPU samples from the seller's DCGM exporter (option ``dcgm_url``; none set: empty), keyed by the
        broker order whose namespace holds the GPU: one read of the exporter for every order on the cluster. The
        URL is held to the same address rules as every seller endpoint. Raises ``TransientProviderError`` when
        the exporter cannot be read, ``ProviderRequestRejected`` for a refused URL or an answer that is not the
        exposition format."""
        url = self.options.get("dcgm_url", "")
        if not url:
            return {}
        try:
            endpoint_check("options.dcgm_url", url)
        except EndpointRefused as exc:
            raise ProviderRequestRejected(str(exc), code="Invalid", provider=PROVIDER) from None
        orders: dict[str, str] = {}
        for ns in self._client.list_namespaces(f"{mapping.MANAGED_BY}={mapping.MANAGED_BY_VALUE}"):
            metadata = ns.get("metadata") or {}
            order_ref = str((metadata.get("labels") or {}).get(mapping.ORDER_LABEL) or "")
            if order_ref:
                orders[str(metadata.get("name") or "")] = order_ref
        try:
            samples = dcgm.gpu_utilization(fetch_metrics(url, self._connect, self._read_timeout, self._ca_bundle))
        except dcgm.DcgmUnreadable as exc:
            raise ProviderRequestRejected(
                f"the DCGM exporter's answer: {exc}", code="Malformed", provider=PROVIDER
            ) from None
        found: dict[str, list[dcgm.GpuSample]] = {}
        for sample in samples:
            if sample.namespace in orders:
                found.setdefault(orders[sample.namespace], []).append(sample)
        return found


def _cidrs(text: str) -> tuple[str, ...]:
    if not text.strip():
        return DEFAULT_POD_CIDRS
    found = []
    for part in text.split(","):
        try:
            found.append(str(ipaddress.ip_network(part.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"options.pod_cidrs: {part.strip()[:60]!r} is not a CIDR") from None
    return tuple(found)
