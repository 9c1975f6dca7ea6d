"""The Kubernetes sandbox on the wire, driven by the official ``kubernetes`` client configured explicitly (host, CA,
bearer token, no retries), as the adapter drives it: shapes and refusals as the Kubernetes API reference gives them,
its scheduler's placements and FailedScheduling messages, quota admission, namespace deletion, faults, the lease
agent's boot from the pod's Secret volume and the DCGM exporter's page.

Each test names the reference page for the wire shape it checks.
"""

from __future__ import annotations

import base64
import json
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from providers.boot import render_boot_script
from providers.launch import BootSpec, IngressRule
from sandboxes.boot import BootMode
from sandboxes.kubernetes.app import KubernetesSandbox, start_kubernetes_sandbox
from sandboxes.kubernetes.auth import DEMO_TOKEN
from tests.sshkeys import ed25519_public, parsed

TIMEOUT = 5
GPU = "nvidia.com/gpu"
CUDA = "nvidia/cuda:12.4.1-base-ubuntu22.04"


@pytest.fixture(scope="module")
def server() -> Iterator[KubernetesSandbox]:
    sandbox = start_kubernetes_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(server: KubernetesSandbox) -> Iterator[KubernetesSandbox]:
    server.reset()
    yield server
    server.reset()


@pytest.fixture(scope="module")
def ca_file(server: KubernetesSandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kubernetes-ca") / "ca.pem"
    path.write_text(server.ca_pem)
    return path


def _api(sandbox: KubernetesSandbox, ca_file: Path, token: str = DEMO_TOKEN) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = sandbox.url
    configuration.ssl_ca_cert = str(ca_file)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.retries = 0
    return client.ApiClient(configuration)


@pytest.fixture
def core(sandbox: KubernetesSandbox, ca_file: Path) -> client.CoreV1Api:
    return client.CoreV1Api(_api(sandbox, ca_file))


@pytest.fixture
def net(sandbox: KubernetesSandbox, ca_file: Path) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(_api(sandbox, ca_file))


def _status(caught: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(caught.value.body)
    assert body["code"] == caught.value.status
    return body


def _namespace(core: client.CoreV1Api, name: str = "brk-one", **labels: str) -> client.V1Namespace:
    meta = client.V1ObjectMeta(name=name, labels=labels or None)
    return core.create_namespace(client.V1Namespace(metadata=meta), _request_timeout=TIMEOUT)


def _pod(
    name: str = "lease",
    *,
    limits: dict[str, str] | None = None,
    node: str | None = "gpu-a100-0",
    image: str = CUDA,
    boot_secret: str | None = None,
    affinity: client.V1Affinity | None = None,
) -> client.V1Pod:
    mounts, volumes = None, None
    if boot_secret:
        mounts = [client.V1VolumeMount(name="boot", mount_path="/broker/boot", read_only=True)]
        volumes = [client.V1Volume(name="boot", secret=client.V1SecretVolumeSource(secret_name=boot_secret))]
    container = client.V1Container(
        name="lease",
        image=image,
        command=["/bin/sh", "/broker/boot/boot.sh"],
        resources=client.V1ResourceRequirements(limits=limits if limits is not None else {GPU: "1"}),
        volume_mounts=mounts,
    )
    spec = client.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        node_selector={"kubernetes.io/hostname": node} if node else None,
        volumes=volumes,
        affinity=affinity,
    )
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"app": "lease"}), spec=spec)


def _events(core: client.CoreV1Api, namespace: str, pod: str) -> list[tuple[str, str, str]]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}", _request_timeout=TIMEOUT)
    return [(e.type, e.reason, e.message) for e in found.items]


def _boot_script() -> bytes:
    boot = BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_kube-token-0123456789abcdefghijklmnopqrstuvwx",
        agent_sha256="ab" * 32,
        ssh_keys=parsed(ed25519_public()),
        ingress=(IngressRule(port=22, cidrs=("203.0.113.0/24",)),),
    )
    return render_boot_script(boot, login_user="ubuntu")


# ------------------------------------------------------------------------------------------------- nodes


def test_nodes_list_with_gfd_labels_device_plugin_resources_and_their_states(core: client.CoreV1Api) -> None:
    # NodeList and Node: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/ ; labels
    # from GPU Feature Discovery and resources from the device plugin, https://github.com/NVIDIA/k8s-device-plugin.
    raw = core.list_node(_request_timeout=TIMEOUT, _preload_content=False)
    listed = json.loads(raw.data)
    nodes = {n.metadata.name: n for n in core.list_node(_request_timeout=TIMEOUT).items}

    assert (listed["kind"], listed["apiVersion"]) == ("NodeList", "v1")
    assert int(listed["metadata"]["resourceVersion"]) > 0
    assert sorted(nodes) == ["cpu-0", "gpu-a100-0", "gpu-a100-mig-0", "gpu-a100-notready-0", "gpu-l4-shared-0",
                             "gpu-t4-0", "gpu-t4-cordoned-0"]  # fmt: skip
    a100 = nodes["gpu-a100-0"]
    assert {k: a100.metadata.labels[k] for k in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory",
            "nvidia.com/gpu.count", "nvidia.com/mig.strategy", "kubernetes.io/hostname", "broker.example/pool")} == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "8", "nvidia.com/mig.strategy": "none", "kubernetes.io/hostname": "gpu-a100-0",
        "broker.example/pool": "a100"}  # fmt: skip
    assert a100.status.allocatable[GPU] == "8" and a100.status.capacity[GPU] == "8"
    assert {(a.type, a.address) for a in a100.status.addresses} >= {("InternalIP", "127.0.0.1"),
                                                                     ("ExternalIP", "127.0.0.1")}  # fmt: skip
    mig = nodes["gpu-a100-mig-0"]
    assert {k: v for k, v in mig.status.allocatable.items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-1g.5gb": "14",
        "nvidia.com/mig-3g.20gb": "2",
    }
    assert mig.metadata.labels["nvidia.com/mig.strategy"] == "mixed"
    shared = nodes["gpu-l4-shared-0"]
    assert shared.status.allocatable["nvidia.com/gpu.shared"] == "8"
    assert shared.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert shared.metadata.labels["nvidia.com/gpu.replicas"] == "4"
    assert nodes["gpu-t4-cordoned-0"].spec.unschedulable is True
    ready = {c.type: c.status for c in nodes["gpu-a100-notready-0"].status.conditions}
    assert ready["Ready"] == "False"
    assert "nvidia.com/gpu" not in nodes["cpu-0"].status.allocatable


def test_a_node_can_be_cordoned_marked_not_ready_and_shrunk(sandbox: KubernetesSandbox, core: client.CoreV1Api) -> None:
    # Node spec.unschedulable and status.conditions: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/
    before = core.read_node("gpu-t4-0", _request_timeout=TIMEOUT)

    sandbox.set_node("gpu-t4-0", unschedulable=True, ready=False, allocatable={GPU: "2"})
    after = core.read_node("gpu-t4-0", _request_timeout=TIMEOUT)

    assert after.spec.unschedulable is True
    assert {c.type: c.status for c in after.status.conditions}["Ready"] == "False"
    assert after.status.allocatable[GPU] == "2"
    assert {t.key for t in after.spec.taints} == {"node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready"}
    assert int(after.metadata.resource_version) > int(before.metadata.resource_version)
    cordoned = core.list_node(field_selector="spec.unschedulable=true", _request_timeout=TIMEOUT)
    assert sorted(n.metadata.name for n in cordoned.items) == ["gpu-t4-0", "gpu-t4-cordoned-0"]


# ---------------------------------------------------------------------------------------- authentication


def test_an_unknown_token_gets_the_api_server_s_401_status(sandbox: KubernetesSandbox, ca_file: Path) -> None:
    # Authentication failure: 401 with a Status whose reason is Unauthorized,
    # https://kubernetes.io/docs/reference/access-authn-authz/authentication/ and the Status kind,
    # https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/.
    stranger = client.CoreV1Api(_api(sandbox, ca_file, token="not-a-token"))

    with pytest.raises(ApiException) as caught:
        stranger.list_node(_request_timeout=TIMEOUT)

    assert caught.value.status == 401
    assert _status(caught) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": "Unauthorized", "reason": "Unauthorized", "code": 401}  # fmt: skip


def test_a_token_without_a_verb_gets_the_rbac_403_and_its_rules_review_shows_why(
    sandbox: KubernetesSandbox, ca_file: Path
) -> None:
    # RBAC denial message ("User ... cannot create resource ... in API group ... in the namespace ..."),
    # https://kubernetes.io/docs/reference/access-authn-authz/rbac/ ; SelfSubjectRulesReview,
    # https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-rules-review-v1/.
    token = sandbox.register_token(user="system:serviceaccount:ns:sa", deny=[("create", "networkpolicies")])
    api = _api(sandbox, ca_file, token)
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="x")))

    with pytest.raises(ApiException) as caught:
        client.NetworkingV1Api(api).create_namespaced_network_policy(
            "x", client.V1NetworkPolicy(metadata=client.V1ObjectMeta(name="lease"), spec=client.V1NetworkPolicySpec(
                pod_selector=client.V1LabelSelector())), _request_timeout=TIMEOUT)  # fmt: skip
    review = client.AuthorizationV1Api(api).create_self_subject_rules_review(
        client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace="x")),
        _request_timeout=TIMEOUT,
    )

    assert caught.value.status == 403
    assert _status(caught) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:ns:sa" cannot '
                   'create resource "networkpolicies" in API group "networking.k8s.io" in the namespace "x"',
        "details": {"group": "networking.k8s.io", "kind": "networkpolicies"},
    }  # fmt: skip
    rules = {(r.api_groups[0], r.resources[0]): set(r.verbs) for r in review.status.resource_rules}
    assert "create" not in rules[("networking.k8s.io", "networkpolicies")]
    assert {"get", "list", "delete"} <= rules[("networking.k8s.io", "networkpolicies")]
    assert "create" in rules[("", "pods")]
    assert review.status.incomplete is False
    assert sandbox.namespaces().count("x") == 1


def test_a_cluster_scoped_denial_says_at_the_cluster_scope(sandbox: KubernetesSandbox, ca_file: Path) -> None:
    # The authorization filter's message for a request without a namespace,
    # https://kubernetes.io/docs/reference/access-authn-authz/authorization/ (request attributes).
    token = sandbox.register_token(user="system:serviceaccount:ns:reader", deny=[("list", "nodes")])

    with pytest.raises(ApiException) as caught:
        client.CoreV1Api(_api(sandbox, ca_file, token)).list_node(_request_timeout=TIMEOUT)

    assert caught.value.status == 403
    assert _status(caught)["message"] == (
        'nodes is forbidden: User "system:serviceaccount:ns:reader" cannot list resource "nodes" in API group "" at '
        "the cluster scope"
    )


def test_the_demo_token_s_rules_review_grants_everything(sandbox: KubernetesSandbox, ca_file: Path) -> None:
    # SelfSubjectRulesReview status.resourceRules,
    # https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-rules-review-v1/.
    review = client.AuthorizationV1Api(_api(sandbox, ca_file)).create_self_subject_rules_review(
        client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace="default")),
        _request_timeout=TIMEOUT,
    )

    assert any(
        r.verbs == ["*"] and r.api_groups == ["*"] and r.resources == ["*"] for r in review.status.resource_rules
    )
    assert review.status.non_resource_rules[0].verbs == ["get"]


# ------------------------------------------------------------------------------------------- namespaces


def test_create_answers_201_with_the_stored_object_and_refuses_duplicates_and_bad_names(core: client.CoreV1Api) -> None:
    # Namespace, https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/namespace-v1/ ; AlreadyExists
    # (409) and Invalid (422) Status bodies, https://kubernetes.io/docs/reference/using-api/api-concepts/ and object
    # names, https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-label-names.
    raw = core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name="brk-one", labels={"broker.order": "ord-1"})),
        _request_timeout=TIMEOUT,
        _preload_content=False,
    )
    body = json.loads(raw.data)

    with pytest.raises(ApiException) as duplicate:
        _namespace(core, "brk-one")
    with pytest.raises(ApiException) as bad:
        _namespace(core, "Brk_One")

    assert raw.status == 201
    assert (body["kind"], body["apiVersion"], body["status"]["phase"]) == ("Namespace", "v1", "Active")
    assert body["metadata"]["uid"] and body["metadata"]["creationTimestamp"].endswith("Z")
    assert int(body["metadata"]["resourceVersion"]) > 0
    assert body["metadata"]["labels"] == {"broker.order": "ord-1", "kubernetes.io/metadata.name": "brk-one"}
    assert _status(duplicate) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "AlreadyExists",
        "message": 'namespaces "brk-one" already exists', "details": {"name": "brk-one", "kind": "namespaces"},
        "code": 409,
    }  # fmt: skip
    invalid = _status(bad)
    assert (invalid["code"], invalid["reason"]) == (422, "Invalid")
    assert invalid["message"].startswith('Namespace "Brk_One" is invalid: metadata.name: Invalid value: "Brk_One": '
                                         "a lowercase RFC 1123 label must consist of")  # fmt: skip
    assert invalid["details"]["causes"][0]["field"] == "metadata.name"
    assert invalid["details"]["causes"][0]["reason"] == "FieldValueInvalid"


def test_namespaces_list_by_label_selector(core: client.CoreV1Api) -> None:
    # Label selectors (equality- and set-based),
    # https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors.
    _namespace(core, "brk-a", **{"broker.order": "ord-a", "app.kubernetes.io/managed-by": "broker"})
    _namespace(core, "brk-b", **{"broker.order": "ord-b", "app.kubernetes.io/managed-by": "broker"})
    _namespace(core, "other", team="ml")

    def names(selector: str) -> list[str]:
        found = core.list_namespace(label_selector=selector, _request_timeout=TIMEOUT)
        return sorted(n.metadata.name for n in found.items)

    assert names("broker.order=ord-a") == ["brk-a"]
    assert names("broker.order==ord-b") == ["brk-b"]
    assert names("broker.order in (ord-a,ord-b)") == ["brk-a", "brk-b"]
    assert names("broker.order,broker.order notin (ord-a)") == ["brk-b"]
    assert names("app.kubernetes.io/managed-by=broker,broker.order!=ord-a") == ["brk-b"]
    assert names("!broker.order,team") == ["other"]
    with pytest.raises(ApiException) as bad:
        names("broker.order in ()")
    assert (bad.value.status, _status(bad)["reason"]) == (400, "BadRequest")


def test_a_missing_object_is_a_404_status(core: client.CoreV1Api) -> None:
    # NotFound Status, https://kubernetes.io/docs/reference/using-api/api-concepts/ (responses).
    _namespace(core)

    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("nope", "brk-one", _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as no_namespace:
        core.create_namespaced_pod("brk-none", _pod(), _request_timeout=TIMEOUT)

    assert _status(caught) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound",
        "message": 'pods "nope" not found', "details": {"name": "nope", "kind": "pods"}, "code": 404,
    }  # fmt: skip
    assert _status(no_namespace)["message"] == 'namespaces "brk-none" not found'


# ------------------------------------------------------------------------- services, secrets, policies


def test_services_get_node_ports_from_the_node_port_range(core: client.CoreV1Api) -> None:
    # Service type NodePort (30000-32767), https://kubernetes.io/docs/concepts/services-networking/service/#type-nodeport
    # and https://kubernetes.io/docs/reference/kubernetes-api/service-resources/service-v1/.
    _namespace(core)

    def service(name: str, *ports: tuple[str, int, int | None]) -> client.V1Service:
        spec = client.V1ServiceSpec(
            type="NodePort",
            selector={"app": "lease"},
            ports=[client.V1ServicePort(name=n, port=p, node_port=np) for n, p, np in ports],
        )
        return core.create_namespaced_service(
            "brk-one", client.V1Service(metadata=client.V1ObjectMeta(name=name), spec=spec), _request_timeout=TIMEOUT
        )

    first = service("lease", ("ssh", 22, None), ("web", 8888, None))
    second = service("other", ("ssh", 22, 31000))
    with pytest.raises(ApiException) as taken:
        service("third", ("ssh", 22, 31000))

    ports = [p.node_port for p in first.spec.ports]
    assert all(30000 <= p <= 32767 for p in ports) and len(set(ports)) == 2
    assert [p.node_port for p in second.spec.ports] == [31000]
    assert [(p.protocol, p.target_port) for p in first.spec.ports] == [("TCP", 22), ("TCP", 8888)]
    assert first.spec.cluster_ip and first.metadata.uid
    assert _status(taken)["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "message": "Invalid value: 31000: provided port is already allocated",
        "field": "spec.ports[0].nodePort",
    }
    read = core.read_namespaced_service("lease", "brk-one", _request_timeout=TIMEOUT)
    assert [p.node_port for p in read.spec.ports] == ports


def test_secrets_keep_their_data_and_network_policies_are_kept_as_given(
    core: client.CoreV1Api, net: client.NetworkingV1Api
) -> None:
    # Secret, https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/ ;
    # NetworkPolicy, https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/.
    _namespace(core)
    script = base64.b64encode(b"#!/bin/sh\nexit 0\n").decode()
    core.create_namespaced_secret(
        "brk-one",
        client.V1Secret(metadata=client.V1ObjectMeta(name="boot"), data={"boot.sh": script}, string_data={"k": "v"}),
        _request_timeout=TIMEOUT,
    )
    policy = client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="lease", labels={"broker.order": "ord-1"}),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(match_labels={"app": "lease"}),
            policy_types=["Ingress", "Egress"],
            ingress=[client.V1NetworkPolicyIngressRule(
                _from=[client.V1NetworkPolicyPeer(ip_block=client.V1IPBlock(cidr="203.0.113.0/24"))],
                ports=[client.V1NetworkPolicyPort(port=22, protocol="TCP")])],
            egress=[client.V1NetworkPolicyEgressRule(to=[client.V1NetworkPolicyPeer(
                ip_block=client.V1IPBlock(cidr="0.0.0.0/0", _except=["10.244.0.0/16"]))])],
        ),
    )  # fmt: skip
    net.create_namespaced_network_policy("brk-one", policy, _request_timeout=TIMEOUT)

    secret = core.read_namespaced_secret("boot", "brk-one", _request_timeout=TIMEOUT)
    kept = net.read_namespaced_network_policy("lease", "brk-one", _request_timeout=TIMEOUT)
    listed = net.list_namespaced_network_policy(
        "brk-one", label_selector="broker.order=ord-1", _request_timeout=TIMEOUT
    )
    gone = net.delete_namespaced_network_policy("lease", "brk-one", _request_timeout=TIMEOUT)

    assert secret.type == "Opaque"
    assert secret.data == {"boot.sh": script, "k": base64.b64encode(b"v").decode()}
    assert kept.spec.ingress[0]._from[0].ip_block.cidr == "203.0.113.0/24"
    assert kept.spec.egress[0].to[0].ip_block._except == ["10.244.0.0/16"]
    assert kept.spec.policy_types == ["Ingress", "Egress"]
    assert [p.metadata.name for p in listed.items] == ["lease"]
    assert gone["status"] == "Success"
    assert net.list_namespaced_network_policy("brk-one", _request_timeout=TIMEOUT).items == []


# ------------------------------------------------------------------------------------------ scheduling


def test_the_scheduler_binds_a_gpu_pod_to_its_node_and_the_kubelet_runs_it(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # Pod status (phase, conditions, containerStatuses, podIP, hostIP),
    # https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/ and
    # https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/ ; GPUs requested as limits,
    # https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/.
    _namespace(core)

    created = core.create_namespaced_pod("brk-one", _pod(limits={GPU: "2"}), _request_timeout=TIMEOUT)
    pod = core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    assert created.status.phase == "Pending" and created.spec.node_name is None
    assert created.spec.containers[0].resources.requests == {GPU: "2"}
    assert (pod.status.phase, pod.spec.node_name, pod.status.host_ip) == ("Running", "gpu-a100-0", "127.0.0.1")
    assert pod.status.pod_ip.startswith("10.244.")
    [container] = pod.status.container_statuses
    assert container.ready is True and container.state.running.started_at is not None
    assert {c.type: c.status for c in pod.status.conditions}["PodScheduled"] == "True"
    assert [reason for _, reason, _ in _events(core, "brk-one", "lease")] == [
        "Scheduled", "Pulling", "Pulled", "Created", "Started"]  # fmt: skip
    assert _events(core, "brk-one", "lease")[0][2] == "Successfully assigned brk-one/lease to gpu-a100-0"
    on_node = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a100-0", _request_timeout=TIMEOUT)
    assert [(p.metadata.namespace, p.metadata.name) for p in on_node.items] == [("brk-one", "lease")]
    assert core.list_pod_for_all_namespaces(label_selector="app=lease,app!=x", _request_timeout=TIMEOUT).items
    assert sandbox.pods()[0].devices == ("nvidia.com/gpu:0", "nvidia.com/gpu:1")


def test_a_pod_that_fits_nowhere_stays_pending_with_the_scheduler_s_message(core: client.CoreV1Api) -> None:
    # PodScheduled=False reason Unschedulable and a FailedScheduling event; the message as kube-scheduler's FitError
    # prints it (e.g. NVIDIA/k8s-device-plugin issue 430, "0/1 nodes are available: 1 Insufficient
    # nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod..").
    _namespace(core)

    core.create_namespaced_pod("brk-one", _pod("big", limits={GPU: "9"}, node=None), _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod("fenced", node="gpu-t4-cordoned-0"), _request_timeout=TIMEOUT)
    big = core.read_namespaced_pod("big", "brk-one", _request_timeout=TIMEOUT)

    expected = (
        "0/7 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were "
        "unschedulable, 5 Insufficient nvidia.com/gpu. preemption: 0/7 nodes are available: 2 Preemption is not "
        "helpful for scheduling, 5 No preemption victims found for incoming pod.."
    )
    [scheduled] = big.status.conditions
    assert (big.status.phase, big.spec.node_name) == ("Pending", None)
    assert (scheduled.type, scheduled.status, scheduled.reason, scheduled.message) == (
        "PodScheduled", "False", "Unschedulable", expected)  # fmt: skip
    assert _events(core, "brk-one", "big") == [("Warning", "FailedScheduling", expected)]
    assert _events(core, "brk-one", "fenced")[0][2] == (
        "0/7 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) were "
        "unschedulable, 5 node(s) didn't match Pod's node affinity/selector. preemption: 0/7 nodes are available: 7 "
        "Preemption is not helpful for scheduling.."
    )


def test_gpus_are_accounted_by_limits_and_a_freed_gpu_schedules_the_waiting_pod(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # Extended resources are never overcommitted; allocatable minus the requests of non-terminated pods,
    # https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources.
    _namespace(core)
    for name in ("one", "two"):
        core.create_namespaced_pod("brk-one", _pod(name, limits={GPU: "4"}), _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod("three", limits={GPU: "1"}), _request_timeout=TIMEOUT)

    waiting = core.read_namespaced_pod("three", "brk-one", _request_timeout=TIMEOUT)
    core.delete_namespaced_pod("one", "brk-one", _request_timeout=TIMEOUT)
    placed = core.read_namespaced_pod("three", "brk-one", _request_timeout=TIMEOUT)

    assert waiting.status.phase == "Pending"
    assert waiting.status.conditions[0].message == (
        "0/7 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
        "{node.kubernetes.io/not-ready: }, 1 node(s) were unschedulable, 4 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/7 nodes are available: 1 No preemption victims found for incoming pod, 6 "
        "Preemption is not helpful for scheduling.."
    )
    assert (placed.status.phase, placed.spec.node_name) == ("Running", "gpu-a100-0")
    devices = {p.name: p.devices for p in sandbox.pods()}
    assert devices["three"] == ("nvidia.com/gpu:0",)
    assert devices["two"] == tuple(f"nvidia.com/gpu:{i}" for i in (4, 5, 6, 7))
    sandbox.finish_pod("brk-one", "two", 0)
    assert core.read_namespaced_pod("two", "brk-one", _request_timeout=TIMEOUT).status.phase == "Succeeded"
    core.create_namespaced_pod("brk-one", _pod("four", limits={GPU: "7"}), _request_timeout=TIMEOUT)
    assert core.read_namespaced_pod("four", "brk-one", _request_timeout=TIMEOUT).status.phase == "Running"


def test_mig_devices_and_shared_gpus_schedule_under_their_own_resource_names(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # MIG mixed strategy resources and time-sliced nvidia.com/gpu.shared, https://github.com/NVIDIA/k8s-device-plugin ;
    # required nodeAffinity matchExpressions, https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/.
    _namespace(core)
    affinity = client.V1Affinity(node_affinity=client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(node_selector_terms=[
            client.V1NodeSelectorTerm(match_expressions=[client.V1NodeSelectorRequirement(
                key="nvidia.com/mig.strategy", operator="In", values=["mixed"])])])))  # fmt: skip
    for name in ("mig-a", "mig-b", "mig-c"):
        pod = _pod(name, limits={"nvidia.com/mig-3g.20gb": "1"}, node=None, affinity=affinity)
        core.create_namespaced_pod("brk-one", pod, _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod("slice", limits={"nvidia.com/gpu.shared": "1"}, node=None))

    phases = {p.name: (p.phase, p.node) for p in sandbox.pods()}

    assert phases["mig-a"] == phases["mig-b"] == ("Running", "gpu-a100-mig-0")
    assert phases["mig-c"] == ("Pending", None)
    assert phases["slice"] == ("Running", "gpu-l4-shared-0")
    message = core.read_namespaced_pod("mig-c", "brk-one", _request_timeout=TIMEOUT).status.conditions[0].message
    assert message.startswith("0/7 nodes are available: 1 Insufficient nvidia.com/mig-3g.20gb, ")
    assert "4 node(s) didn't match Pod's node affinity/selector" in message


def test_concurrent_pods_never_take_more_gpus_than_the_node_has(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # Extended resources are not overcommitted,
    # https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources ; twelve
    # clients create one-GPU pods for the eight-GPU node at once.
    for index in range(12):
        _namespace(core, f"brk-{index}")
    start = threading.Barrier(12)

    def create(index: int) -> None:
        api = client.CoreV1Api(_api(sandbox, ca_file))
        start.wait(timeout=TIMEOUT)
        api.create_namespaced_pod(f"brk-{index}", _pod(limits={GPU: "1"}), _request_timeout=TIMEOUT)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    phases = [p.phase for p in sandbox.pods()]

    assert sorted(phases) == ["Pending"] * 4 + ["Running"] * 8
    devices = [d for p in sandbox.pods() for d in p.devices]
    assert sorted(devices) == [f"nvidia.com/gpu:{i}" for i in range(8)]


# ---------------------------------------------------------------------------------------------- quotas


def test_a_pod_past_the_namespace_quota_is_refused_as_quota_admission_words_it(core: client.CoreV1Api) -> None:
    # ResourceQuota admission, https://kubernetes.io/docs/concepts/policy/resource-quotas/ (extended resources are
    # quota'd as requests.<name>) and https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/resource-quota-v1/.
    _namespace(core)
    core.create_namespaced_resource_quota(
        "brk-one",
        client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="lease"),
                               spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "1", "pods": "1"})),
        _request_timeout=TIMEOUT,
    )  # fmt: skip

    with pytest.raises(ApiException) as too_many_gpus:
        core.create_namespaced_pod("brk-one", _pod("greedy", limits={GPU: "2"}), _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod("lease", limits={GPU: "1"}), _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as second:
        core.create_namespaced_pod("brk-one", _pod("again", limits={}), _request_timeout=TIMEOUT)
    quota = core.read_namespaced_resource_quota("lease", "brk-one", _request_timeout=TIMEOUT)

    assert _status(too_many_gpus) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'pods "greedy" is forbidden: exceeded quota: lease, requested: requests.nvidia.com/gpu=2, used: '
                   "requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=1",
        "details": {"name": "greedy", "kind": "pods"},
    }  # fmt: skip
    assert _status(second)["message"] == (
        'pods "again" is forbidden: exceeded quota: lease, requested: pods=1, used: pods=1, limited: pods=1'
    )
    assert quota.status.used == {"requests.nvidia.com/gpu": "1", "pods": "1"}
    assert [p.metadata.name for p in core.list_namespaced_pod("brk-one", _request_timeout=TIMEOUT).items] == ["lease"]


# ------------------------------------------------------------------------------------ namespace deletion


def test_deleting_a_namespace_terminates_it_and_removes_everything_in_it(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, net: client.NetworkingV1Api
) -> None:
    # Namespace deletion (phase Terminating, then gone with its contents),
    # https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/ and
    # https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/namespace-v1/.
    sandbox.namespace_finalize_seconds = 3600.0  # held Terminating until the test lets it go
    _namespace(core, "brk-one", **{"broker.order": "ord-1"})
    core.create_namespaced_secret("brk-one", client.V1Secret(metadata=client.V1ObjectMeta(name="boot")))
    core.create_namespaced_pod("brk-one", _pod(), _request_timeout=TIMEOUT)
    everything = client.V1NetworkPolicySpec(pod_selector=client.V1LabelSelector())
    net.create_namespaced_network_policy(
        "brk-one", client.V1NetworkPolicy(metadata=client.V1ObjectMeta(name="lease"), spec=everything)
    )

    answer = core.delete_namespace("brk-one", _request_timeout=TIMEOUT)
    terminating = core.read_namespace("brk-one", _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("brk-one", _pod("late"), _request_timeout=TIMEOUT)
    sandbox.namespace_finalize_seconds = 0.0
    sandbox._namespace_deadlines["brk-one"] = 0.0  # the namespace controller's finalizer is done
    with pytest.raises(ApiException) as gone:
        core.read_namespace("brk-one", _request_timeout=TIMEOUT)

    assert answer["status"] == {"phase": "Terminating"}
    assert terminating.status.phase == "Terminating" and terminating.metadata.deletion_timestamp is not None
    assert _status(refused)["message"] == (
        'pods "late" is forbidden: unable to create new content in namespace brk-one because it is being terminated'
    )
    assert gone.value.status == 404
    assert core.list_pod_for_all_namespaces(_request_timeout=TIMEOUT).items == []
    assert core.list_secret_for_all_namespaces(_request_timeout=TIMEOUT).items == []
    assert net.list_network_policy_for_all_namespaces(_request_timeout=TIMEOUT).items == []
    assert core.list_namespace(label_selector="broker.order=ord-1", _request_timeout=TIMEOUT).items == []


# --------------------------------------------------------------------------------------------- faults


def test_a_throttle_fault_is_a_429_with_retry_after_and_unavailable_a_503(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # 429 TooManyRequests with Retry-After and details.retryAfterSeconds,
    # https://kubernetes.io/docs/reference/using-api/api-concepts/ and API Priority and Fairness,
    # https://kubernetes.io/docs/concepts/cluster-administration/flow-control/.
    sandbox.faults.inject("throttle", action="listNodes", times=1)
    sandbox.faults.inject("throttle", action="listNodes", times=1, code="ServiceUnavailable")

    with pytest.raises(ApiException) as throttled:
        core.list_node(_request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as unavailable:
        core.list_node(_request_timeout=TIMEOUT)
    after = core.list_node(_request_timeout=TIMEOUT)

    assert throttled.value.status == 429 and throttled.value.headers["Retry-After"] == "1"
    assert _status(throttled) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "TooManyRequests",
        "message": "Too many requests, please try again later.", "details": {"retryAfterSeconds": 1}, "code": 429,
    }  # fmt: skip
    assert (unavailable.value.status, _status(unavailable)["reason"]) == (503, "ServiceUnavailable")
    assert len(after.items) == 7


def test_capacity_and_quota_faults_on_create_pod(sandbox: KubernetesSandbox, core: client.CoreV1Api) -> None:
    # The fault kinds as the scheduler (Unschedulable, FailedScheduling) and quota admission (403) report them,
    # https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/ and
    # https://kubernetes.io/docs/concepts/policy/resource-quotas/.
    _namespace(core)
    sandbox.faults.inject("capacity", instance_type=GPU, zone="gpu-a100-0", times=1)

    core.create_namespaced_pod("brk-one", _pod("starved"), _request_timeout=TIMEOUT)
    sandbox.faults.inject("quota", times=1, code="gpu-quota")
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("brk-one", _pod("capped"), _request_timeout=TIMEOUT)

    starved = core.read_namespaced_pod("starved", "brk-one", _request_timeout=TIMEOUT)
    assert starved.status.conditions[0].reason == "Unschedulable"
    assert "1 Insufficient nvidia.com/gpu" in starved.status.conditions[0].message
    assert _status(refused)["message"] == (
        'pods "capped" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: '
        "requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0"
    )
    assert [p.name for p in sandbox.pods()] == ["starved"]


def test_credentials_faults_are_a_401_or_a_named_403(sandbox: KubernetesSandbox, core: client.CoreV1Api) -> None:
    # 401 Unauthorized and 403 Forbidden Status bodies,
    # https://kubernetes.io/docs/reference/access-authn-authz/authentication/ and
    # https://kubernetes.io/docs/reference/access-authn-authz/rbac/.
    sandbox.faults.inject("credentials", action="listNamespaces", times=1)
    sandbox.faults.inject("credentials", action="listNamespaces", times=1, code="Forbidden")

    with pytest.raises(ApiException) as unauthorized:
        core.list_namespace(_request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as forbidden:
        core.list_namespace(_request_timeout=TIMEOUT)

    assert (unauthorized.value.status, _status(unauthorized)["reason"]) == (401, "Unauthorized")
    assert _status(forbidden)["message"] == (
        'namespaces is forbidden: User "system:serviceaccount:broker-system:broker" cannot list resource '
        '"namespaces" in API group "" at the cluster scope'
    )


def test_an_image_that_cannot_be_pulled_waits_as_the_kubelet_reports_it(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # Container waiting reasons ErrImagePull, ImagePullBackOff, InvalidImageName,
    # https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff and
    # https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting.
    _namespace(core)
    sandbox.faults.inject("image_missing", instance_type="example/nope:1")

    core.create_namespaced_pod("brk-one", _pod("missing", image="example/nope:1"), _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod("bad", image="Example/UPPER:tag", node="gpu-t4-0"))
    seen = set()
    for _ in range(3):
        pod = core.read_namespaced_pod("missing", "brk-one", _request_timeout=TIMEOUT)
        seen.add(pod.status.container_statuses[0].state.waiting.reason)
    bad = core.read_namespaced_pod("bad", "brk-one", _request_timeout=TIMEOUT)

    assert seen == {"ErrImagePull", "ImagePullBackOff"}
    assert pod.status.phase == "Pending" and pod.spec.node_name == "gpu-a100-0"
    failed = [m for kind, reason, m in _events(core, "brk-one", "missing") if reason == "Failed"]
    assert failed[0] == (
        'Failed to pull image "example/nope:1": rpc error: code = NotFound desc = failed to pull and unpack image '
        '"docker.io/example/nope:1": failed to resolve reference "docker.io/example/nope:1": '
        "docker.io/example/nope:1: not found"
    )
    waiting = bad.status.container_statuses[0].state.waiting
    assert waiting.reason == "InvalidImageName"
    assert waiting.message == (
        'Failed to apply default image tag "Example/UPPER:tag": couldn\'t parse image reference "Example/UPPER:tag": '
        "invalid reference format"
    )


# ------------------------------------------------------------------------------------------------ boot


def test_a_running_pod_boots_the_lease_agent_from_its_secret_and_its_delete_halts_it(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # Secret volumes mounted as files,
    # https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod.
    sandbox.booter.mode = BootMode.HOLD
    _namespace(core)
    core.create_namespaced_secret(
        "brk-one",
        client.V1Secret(metadata=client.V1ObjectMeta(name="boot"),
                        data={"boot.sh": base64.b64encode(_boot_script()).decode()}),
        _request_timeout=TIMEOUT,
    )  # fmt: skip

    core.create_namespaced_pod("brk-one", _pod(limits={GPU: "2"}, boot_secret="boot"), _request_timeout=TIMEOUT)
    core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)
    machine = sandbox.booter.machine("brk-one/lease")
    core.delete_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    assert machine.lease["broker_url"] == "https://broker.example"
    assert [g.name for g in machine.gpus] == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"]
    assert [(r.instance_id, r.outcome) for r in sandbox.booter.records] == [("brk-one/lease", "booted")]
    assert sandbox.booter.machines() == []


def test_a_boot_fault_on_the_pod_s_node_keeps_its_agent_silent(
    sandbox: KubernetesSandbox, core: client.CoreV1Api
) -> None:
    # The sandboxes' boot faults (sandboxes/boot.py), matched on the GPU resource and the node: the pod runs, as
    # Kubernetes sees it, but its lease agent never phones home.
    sandbox.booter.mode = BootMode.HOLD
    _namespace(core)
    data = {"boot.sh": base64.b64encode(_boot_script()).decode()}
    core.create_namespaced_secret("brk-one", client.V1Secret(metadata=client.V1ObjectMeta(name="boot"), data=data))
    sandbox.faults.inject("boot_silent", instance_type=GPU, zone="gpu-t4-0")

    core.create_namespaced_pod("brk-one", _pod(node="gpu-t4-0", boot_secret="boot"), _request_timeout=TIMEOUT)
    pod = core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    assert pod.status.phase == "Running"
    assert [(r.instance_id, r.outcome) for r in sandbox.booter.records] == [("brk-one/lease", "silent")]
    assert sandbox.booter.machines() == []


def test_the_control_api_registers_tokens_and_changes_nodes(sandbox: KubernetesSandbox, ca_file: Path) -> None:
    # The sandboxes' control API (sandboxes/server.py), for a process that did not start the sandbox.
    control = f"{sandbox.url}/_sandbox"
    made = requests.post(f"{control}/tokens", json={"user": "system:serviceaccount:a:b",
                         "deny": [["list", "nodes"]]}, verify=str(ca_file), timeout=TIMEOUT)  # fmt: skip
    changed = requests.post(f"{control}/nodes/gpu-t4-0", json={"ready": False}, verify=str(ca_file), timeout=TIMEOUT)
    unknown = requests.post(f"{control}/nodes/nope", json={"ready": False}, verify=str(ca_file), timeout=TIMEOUT)
    api = client.CoreV1Api(_api(sandbox, ca_file, made.json()["token"]))

    with pytest.raises(ApiException) as denied:
        api.list_node(_request_timeout=TIMEOUT)
    node = api.read_node("gpu-t4-0", _request_timeout=TIMEOUT)

    assert (made.status_code, changed.status_code, unknown.status_code) == (201, 200, 400)
    assert denied.value.status == 403
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "False"


def test_a_pod_whose_secret_is_missing_waits_in_container_creating(core: client.CoreV1Api) -> None:
    # FailedMount for a missing Secret volume, https://kubernetes.io/docs/concepts/configuration/secret/.
    _namespace(core)

    core.create_namespaced_pod("brk-one", _pod(boot_secret="boot"), _request_timeout=TIMEOUT)
    pod = core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    assert pod.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    assert ("Warning", "FailedMount", 'MountVolume.SetUp failed for volume "boot" : secret "boot" not found') in (
        _events(core, "brk-one", "lease")
    )


# ------------------------------------------------------------------------------------------------ DCGM


def test_the_dcgm_exporter_reports_each_gpu_with_its_pod(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # dcgm-exporter's default counters, https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv,
    # its pod labels, https://github.com/NVIDIA/dcgm-exporter#kubernetes, and the Prometheus text format,
    # https://prometheus.io/docs/instrumenting/exposition_formats/.
    _namespace(core)
    core.create_namespaced_pod("brk-one", _pod(limits={GPU: "2"}), _request_timeout=TIMEOUT)
    sandbox.set_gpu_utilization("gpu-a100-0", 1, 42)

    page = requests.get(sandbox.url + "/dcgm/metrics", verify=str(ca_file), timeout=TIMEOUT)
    families = {f.name: f for f in text_string_to_metric_families(page.text)}

    assert page.headers["Content-Type"].startswith("text/plain")
    assert set(families) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                             "DCGM_FI_DEV_FB_USED"}  # fmt: skip
    assert all(f.type == "gauge" for f in families.values())
    util = {(s.labels["Hostname"], s.labels["gpu"]): s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert len(util) == 8 + 3 + 4 + 2 + 4 + 8  # every GPU of every GPU node
    busy = util[("gpu-a100-0", "1")]
    assert (busy.value, busy.labels["namespace"], busy.labels["pod"], busy.labels["container"]) == (
        42, "brk-one", "lease", "lease")  # fmt: skip
    assert busy.labels["modelName"] == "NVIDIA A100-SXM4-80GB"
    assert busy.labels["UUID"].startswith("GPU-") and busy.labels["device"] == "nvidia1"
    idle = util[("gpu-a100-0", "2")]
    assert idle.value == 0 and "pod" not in idle.labels


def test_the_dcgm_exporter_labels_a_mig_device_with_its_profile_and_instance(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # dcgm-exporter's MIG labels GPU_I_PROFILE and GPU_I_ID, https://github.com/NVIDIA/dcgm-exporter#kubernetes
    # and NVIDIA's "GPU Operator with MIG", https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html.
    _namespace(core)
    core.create_namespaced_pod(
        "brk-one", _pod(limits={"nvidia.com/mig-3g.20gb": "1"}, node="gpu-a100-mig-0"), _request_timeout=TIMEOUT
    )
    core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    page = requests.get(sandbox.url + "/dcgm/metrics", verify=str(ca_file), timeout=TIMEOUT).text
    [family] = [f for f in text_string_to_metric_families(page) if f.name == "DCGM_FI_DEV_FB_USED"]
    mine = [s.labels for s in family.samples if s.labels.get("pod") == "lease"]

    assert [(m["Hostname"], m["gpu"], m["GPU_I_PROFILE"], m["GPU_I_ID"], m["namespace"]) for m in mine] == [
        ("gpu-a100-mig-0", "2", "3g.20gb", "1", "brk-one")
    ]


# ------------------------------------------------------------------------------------------------- jobs


def _job(name: str = "lease", restart_policy: str = "Never", backoff_limit: int = 1) -> client.V1Job:
    template = _pod(limits={GPU: "1"})
    template.spec.restart_policy = restart_policy
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=backoff_limit,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "lease"}), spec=template.spec
            ),
        ),
    )


def test_a_job_runs_its_pod_replaces_a_failed_one_and_completes(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # Job, https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/ and "Jobs"
    # (pod labels, backoffLimit, the Complete condition), https://kubernetes.io/docs/concepts/workloads/controllers/job/.
    batch = client.BatchV1Api(_api(sandbox, ca_file))
    _namespace(core)

    created = batch.create_namespaced_job("brk-one", _job(), _request_timeout=TIMEOUT)
    [first] = core.list_namespaced_pod("brk-one", label_selector="job-name=lease", _request_timeout=TIMEOUT).items
    sandbox.finish_pod("brk-one", first.metadata.name, 1)
    pods = core.list_namespaced_pod("brk-one", label_selector="job-name=lease", _request_timeout=TIMEOUT).items
    [second] = [p for p in pods if p.metadata.name != first.metadata.name]
    core.read_namespaced_pod(second.metadata.name, "brk-one", _request_timeout=TIMEOUT)
    sandbox.finish_pod("brk-one", second.metadata.name, 0)
    job = batch.read_namespaced_job("lease", "brk-one", _request_timeout=TIMEOUT)

    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert first.metadata.name.startswith("lease-") and len(first.metadata.name) == len("lease-") + 5
    assert first.metadata.labels["batch.kubernetes.io/job-name"] == "lease"
    assert first.metadata.labels["batch.kubernetes.io/controller-uid"] == uid
    assert [(o.kind, o.name, o.uid, o.controller) for o in first.metadata.owner_references] == [
        ("Job", "lease", uid, True)
    ]
    assert (job.status.succeeded, job.status.failed, job.status.active) == (1, 1, 0)
    assert {c.type: c.status for c in job.status.conditions}["Complete"] == "True"
    created_events = [m for _, reason, m in _events(core, "brk-one", "lease") if reason == "SuccessfulCreate"]
    assert created_events == [f"Created pod: {first.metadata.name}", f"Created pod: {second.metadata.name}"]


def test_a_job_deleted_in_the_background_takes_its_pods_and_an_orphaning_delete_leaves_them(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # Propagation policies (batch/v1 defaults to orphaning),
    # https://kubernetes.io/docs/concepts/architecture/garbage-collection/ ; a Job's restartPolicy must be Never or
    # OnFailure, https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-template.
    batch = client.BatchV1Api(_api(sandbox, ca_file))
    _namespace(core)
    batch.create_namespaced_job("brk-one", _job("gone"), _request_timeout=TIMEOUT)
    batch.create_namespaced_job("brk-one", _job("kept"), _request_timeout=TIMEOUT)
    core.list_namespaced_pod("brk-one", _request_timeout=TIMEOUT)  # the controller has made both pods

    batch.delete_namespaced_job(
        "gone", "brk-one", body=client.V1DeleteOptions(propagation_policy="Background"), _request_timeout=TIMEOUT
    )
    batch.delete_namespaced_job("kept", "brk-one", _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as always:
        batch.create_namespaced_job("brk-one", _job("bad", restart_policy="Always"), _request_timeout=TIMEOUT)

    left = core.list_namespaced_pod("brk-one", _request_timeout=TIMEOUT).items
    assert [p.metadata.labels["job-name"] for p in left] == ["kept"]
    assert left[0].metadata.owner_references is None
    assert _status(always)["message"] == (
        'Job.batch "bad" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: '
        '"OnFailure", "Never"'
    )


# ----------------------------------------------------------------------------------------------- watch


def test_a_pod_watch_replays_its_changes_from_a_resource_version(core: client.CoreV1Api) -> None:
    # Watch events (ADDED, MODIFIED, DELETED) after a resourceVersion, and 410 Gone for one too old,
    # https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes.
    _namespace(core)
    since = core.list_namespaced_pod("brk-one", _request_timeout=TIMEOUT).metadata.resource_version
    core.create_namespaced_pod("brk-one", _pod(limits={GPU: "1"}), _request_timeout=TIMEOUT)
    core.read_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)  # the scheduler and kubelet move on
    core.delete_namespaced_pod("lease", "brk-one", _request_timeout=TIMEOUT)

    seen = []
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, "brk-one", resource_version=since, timeout_seconds=5,
                               _request_timeout=TIMEOUT):  # fmt: skip
        seen.append((event["type"], event["object"].status.phase, event["object"].spec.node_name))
        if event["type"] == "DELETED":
            stream.stop()
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(core.list_namespaced_pod, "brk-one", resource_version="1", timeout_seconds=1):
            pass

    assert seen[0] == ("ADDED", "Pending", None)
    assert ("MODIFIED", "Running", "gpu-a100-0") in seen
    assert seen[-1][0] == "DELETED"
    assert gone.value.status == 410


def test_a_watch_with_a_selector_sees_only_matching_pods(core: client.CoreV1Api) -> None:
    # Watch with labelSelector, https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes.
    _namespace(core)
    since = core.list_namespaced_pod("brk-one", _request_timeout=TIMEOUT).metadata.resource_version
    other = _pod("other", limits={})
    other.metadata.labels = {"app": "other"}
    core.create_namespaced_pod("brk-one", other, _request_timeout=TIMEOUT)
    core.create_namespaced_pod("brk-one", _pod(limits={}), _request_timeout=TIMEOUT)

    names = set()
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, "brk-one", resource_version=since, label_selector="app=lease",
                               timeout_seconds=1, _request_timeout=TIMEOUT):  # fmt: skip
        names.add(event["object"].metadata.name)

    assert names == {"lease"}


# ---------------------------------------------------------------------------------------- hostile input


def test_malformed_requests_are_refused_with_400_and_422_naming_the_field(
    sandbox: KubernetesSandbox, core: client.CoreV1Api, ca_file: Path
) -> None:
    # Invalid (422) with details.causes per field, and BadRequest (400) for a body or selector that does not parse,
    # https://kubernetes.io/docs/reference/using-api/api-concepts/ and
    # https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/.
    _namespace(core)
    unequal = _pod("unequal", limits={GPU: "2"})
    unequal.spec.containers[0].resources.requests = {GPU: "1"}
    dangling = _pod("dangling")
    dangling.spec.containers[0].volume_mounts = [client.V1VolumeMount(name="boot", mount_path="/broker/boot")]
    headers = {"Authorization": f"Bearer {DEMO_TOKEN}", "Content-Type": "application/json"}

    with pytest.raises(ApiException) as not_equal:
        core.create_namespaced_pod("brk-one", unequal, _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as no_volume:
        core.create_namespaced_pod("brk-one", dangling, _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as selector:
        core.list_namespaced_pod("brk-one", field_selector="spec.secret=x", _request_timeout=TIMEOUT)
    garbage = requests.post(f"{sandbox.url}/api/v1/namespaces/brk-one/pods", data=b"{not json", headers=headers,
                            verify=str(ca_file), timeout=TIMEOUT)  # fmt: skip
    huge = requests.post(f"{sandbox.url}/api/v1/namespaces/brk-one/secrets", data=b"x" * (4 * 1024 * 1024),
                         headers=headers, verify=str(ca_file), timeout=TIMEOUT)  # fmt: skip

    assert _status(not_equal)["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec.containers[0].resources.requests",
        "message": 'Invalid value: "1": must be equal to nvidia.com/gpu limit of 2'}]  # fmt: skip
    assert _status(no_volume)["message"] == (
        'Pod "dangling" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "boot"'
    )
    assert (selector.value.status, _status(selector)["message"]) == (400, "field label not supported: spec.secret")
    assert (garbage.status_code, garbage.json()["reason"]) == (400, "BadRequest")
    assert (huge.status_code, huge.json()["reason"]) == (413, "RequestEntityTooLarge")
    assert sandbox.pods() == []


# ------------------------------------------------------------------------------------------- standalone


def test_the_standalone_sandbox_writes_the_cluster_account_to_its_manifest(tmp_path: Path) -> None:
    # What the run command reads (sandboxes/demo.py): the API server URL, a token and the CA bundle in PEM, the
    # account's options; the served API answers that token over TLS verified with that CA.
    manifest = tmp_path / "sandbox.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandboxes",
            "serve",
            "--only",
            "kubernetes",
            "--port",
            "0",
            "--manifest",
            str(manifest),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "the sandbox did not start within 30 s"
        line = process.stdout.readline().strip()
        # The manifest is written (atomically) once every sandbox listens, just after the line above.
        deadline = time.monotonic() + 30
        while not manifest.exists() and time.monotonic() < deadline and process.poll() is None:
            select.select([], [], [], 0.02)
        account = json.loads(manifest.read_text())["kubernetes"]
        ca = tmp_path / "ca.pem"
        ca.write_text(account["credentials"]["ca_bundle"])
        nodes = requests.get(
            account["endpoint_url"] + "/api/v1/nodes",
            headers={"Authorization": f"Bearer {account['credentials']['token']}"},
            verify=str(ca),
            timeout=TIMEOUT,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)

    assert line == f"kubernetes sandbox listening on {account['endpoint_url']}"
    assert account["endpoint_url"].startswith("https://127.0.0.1:")
    assert (account["kind"], account["demo_regions"], account["all_regions"]) == (
        "kubernetes", ["eu-central"], ["eu-central"])  # fmt: skip
    assert sorted(account["credentials"]) == ["ca_bundle", "token"]
    assert account["credentials"]["ca_bundle"].startswith("-----BEGIN CERTIFICATE-----")
    assert account["options"]["dcgm_url"] == account["endpoint_url"] + "/dcgm/metrics"
    assert nodes.json()["kind"] == "NodeList" and len(nodes.json()["items"]) == 7
