"""The Kubernetes adapter through the official ``kubernetes`` client against the Kubernetes sandbox (HTTPS with its
own CA, RBAC tokens, a scheduler that accounts NVIDIA's extended resources, kubelets that pull images and boot the
lease agent). Status bodies, reasons and codes as https://kubernetes.io/docs/reference/kubernetes-api/ gives them;
SelfSubjectRulesReview as https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access.
"""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal

import pytest
import requests
import yaml

from providers.endpoints import EndpointRefused, account_endpoints_check
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.kubernetes.adapter import KubernetesAdapter
from providers.kubernetes.kubeconfig import kubeconfig_credentials
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, PricingModel
from sandboxes.kubernetes.app import KubernetesSandbox, start_kubernetes_sandbox
from sandboxes.tls import server_context, write_tls
from tests.providers.contract import contract_boot, settle


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


def adapter(sandbox: KubernetesSandbox, token: str | None = None, **options: str) -> KubernetesAdapter:
    values = sandbox.account_credentials()
    if token is not None:
        values["token"] = token
    credentials = Credentials(kind="kubernetes", values=values, endpoint_url=sandbox.url)
    return KubernetesAdapter(credentials, [sandbox.region], {**sandbox.account_options(), **options})


def spec(instance_type: str, zone: str, order: str, token: str | None = None) -> LaunchSpec:
    return LaunchSpec(
        region="eu-central",
        zone=zone,
        instance_type=instance_type,
        pricing_model=PricingModel.ON_DEMAND,
        client_token=token or f"{order}-a1",
        order_ref=order,
    )


def until(a: KubernetesAdapter, handle: InstanceHandle, *states: InstanceState) -> InstanceHandle:
    for _ in range(100):
        if handle.state in states:
            return handle
        time.sleep(0.02)
        handle = a.describe(handle.region, handle.instance_id)
    return handle


def order_namespaces(sandbox: KubernetesSandbox) -> list[str]:
    """The broker's namespaces the sandbox still holds, once it has finished deleting those it was asked to."""
    sandbox.tick()
    return [n for n in sandbox.namespaces() if n.startswith("brk-")]


def foreign_pod(sandbox: KubernetesSandbox, node: str, gpus: int) -> None:
    """Someone else's training pod, created straight through the API as the cluster's own users would."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "default", "labels": {"app": "train"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "t", "image": "pytorch/pytorch:2.4.0", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }  # fmt: skip
    answer = requests.post(
        f"{sandbox.url}/api/v1/namespaces/default/pods",
        json=body,
        headers={"Authorization": f"Bearer {sandbox.demo_token}"},
        verify=str(sandbox.cert_path),
        timeout=5,
    )
    assert answer.status_code == 201, answer.text


# ------------------------------------------------------------------------------------------------ offers


def test_offers_come_from_schedulable_gpu_nodes_only(sandbox):
    offers = adapter(sandbox).list_offers()

    assert {o.zone for o in offers} == {"gpu-a100-0", "gpu-a100-mig-0", "gpu-t4-0", "gpu-l4-shared-0"}
    assert {(o.zone, o.instance_type) for o in offers if o.zone != "gpu-a100-0"} == {
        ("gpu-a100-mig-0", "k8s-mig-1g.5gb"),
        ("gpu-a100-mig-0", "k8s-mig-3g.20gb"),
        ("gpu-t4-0", "k8s-gpu-1"),
        ("gpu-t4-0", "k8s-gpu-2"),
        ("gpu-t4-0", "k8s-gpu-4"),
        ("gpu-l4-shared-0", "k8s-shared-1"),
    }
    sandbox.set_node("gpu-t4-0", unschedulable=True)
    assert "gpu-t4-0" not in {o.zone for o in adapter(sandbox).list_offers()}


def test_a_foreign_pod_takes_gpus_from_the_offers_and_the_brokers_own_pod_does_not(sandbox):
    a = adapter(sandbox)
    foreign_pod(sandbox, "gpu-a100-0", 3)
    until(a, a.launch(spec("k8s-gpu-2", "gpu-a100-0", "ord-own")), InstanceState.RUNNING)

    offers = {o.instance_type: o for o in a.list_offers() if o.zone == "gpu-a100-0"}

    assert {t: o.capacity for t, o in offers.items()} == {"k8s-gpu-1": 5, "k8s-gpu-2": 2, "k8s-gpu-4": 1}
    assert offers["k8s-gpu-2"].price == Decimal("3.800000")


# ------------------------------------------------------------------------------------------------ launch


def test_a_launch_runs_one_pod_on_the_offers_node_with_its_ports_and_address(sandbox):
    a = adapter(sandbox)
    launch = replace(spec("k8s-gpu-1", "gpu-t4-0", "ord-run"), boot=contract_boot())

    handle = until(a, a.launch(launch), InstanceState.RUNNING)

    assert handle.state is InstanceState.RUNNING
    assert (handle.zone, handle.instance_type, handle.public_ip) == ("gpu-t4-0", "k8s-gpu-1", "127.0.0.1")
    assert set(handle.extra["ports"]) == {"22", "8000"}
    assert all(30000 <= port <= 32767 for port in handle.extra["ports"].values())
    assert [p.devices for p in sandbox.pods()] == [("nvidia.com/gpu:0",)]


def test_a_repeated_launch_returns_the_same_pod_and_makes_nothing_twice(sandbox):
    a = adapter(sandbox)
    launch = replace(spec("k8s-mig-3g.20gb", "gpu-a100-mig-0", "ord-twice"), boot=contract_boot())

    first = a.launch(launch)
    again = a.launch(launch)

    assert again.instance_id == first.instance_id
    assert len(order_namespaces(sandbox)) == 1
    assert [(p.namespace, p.name) for p in sandbox.pods()] == [tuple(first.instance_id.split("/"))]
    assert [r.order_ref for r in a.list_order_resources()] == ["ord-twice"]


def test_no_node_with_room_is_a_capacity_failure_with_the_schedulers_message(sandbox):
    a = adapter(sandbox)
    until(a, a.launch(spec("k8s-gpu-8", "gpu-a100-0", "ord-first")), InstanceState.RUNNING)

    result = settle(a, spec("k8s-gpu-8", "gpu-a100-0", "ord-second"))

    assert isinstance(result, CapacityUnavailable), result
    assert result.code == "FailedScheduling"
    assert "Insufficient nvidia.com/gpu" in result.message
    [second] = a.find_by_order("ord-second")
    assert second.state is InstanceState.FAILED
    assert a.terminate(second.region, second.instance_id).state is InstanceState.TERMINATED


def test_an_image_that_cannot_be_pulled_is_the_buyers_error_naming_it(sandbox):
    a = adapter(sandbox)
    sandbox.faults.inject("image_missing", action="image")
    launch = replace(spec("k8s-gpu-1", "gpu-t4-0", "ord-image"), boot=contract_boot())

    handle = until(a, a.launch(launch), InstanceState.FAILED)

    assert handle.state is InstanceState.FAILED
    assert handle.extra["error_class"] == ProviderRequestRejected.error_class
    assert handle.extra["error_code"] in ("ErrImagePull", "ImagePullBackOff")
    assert handle.extra["error_message"].startswith("the image ")
    assert "vllm/vllm-openai:v0.6.3" in handle.extra["error_message"]


def test_a_quota_refusal_is_quota_exceeded_and_leaves_nothing(sandbox):
    sandbox.faults.inject("quota", action="createPod", times=1)

    with pytest.raises(QuotaExceeded) as raised:
        adapter(sandbox).launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-quota"))

    assert raised.value.code == "ExceededQuota"
    assert "exceeded quota" in raised.value.message
    assert order_namespaces(sandbox) == []


def test_terminate_leaves_nothing_in_the_cluster_and_is_idempotent(sandbox):
    a = adapter(sandbox)
    launch = replace(spec("k8s-gpu-2", "gpu-t4-0", "ord-end"), boot=contract_boot())
    handle = until(a, a.launch(launch), InstanceState.RUNNING)

    ended = a.terminate(handle.region, handle.instance_id)
    again = a.terminate(handle.region, handle.instance_id)

    assert (ended.state, again.state) == (InstanceState.TERMINATED, InstanceState.TERMINATED)
    assert a.describe(handle.region, handle.instance_id).state is InstanceState.TERMINATED
    assert order_namespaces(sandbox) == []
    assert sandbox.pods() == []
    assert a.find_by_order("ord-end") == []
    assert a.release_order_resources("ord-end") == []
    assert a.list_order_resources() == []


def test_describe_many_reads_the_brokers_pods_in_one_list_and_leaves_out_what_the_cluster_forgot(sandbox):
    a = adapter(sandbox)
    running = until(a, a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-many-1")), InstanceState.RUNNING)
    pending = a.launch(spec("k8s-gpu-8", "gpu-t4-0", "ord-many-2"))  # a T4 node has 4: never scheduled
    ended = a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-many-3"))
    a.terminate(ended.region, ended.instance_id)
    order_namespaces(sandbox)  # the sandbox finishes deleting it
    never = "brk-" + "0" * 20 + "/lease"
    sandbox.clear_calls()

    answer = a.describe_many("eu-central", [running.instance_id, pending.instance_id, ended.instance_id, never])

    assert {i: h.state for i, h in answer.items()} == {
        running.instance_id: InstanceState.RUNNING,
        pending.instance_id: InstanceState.FAILED,
    }
    assert answer[running.instance_id].extra["ports"] == running.extra["ports"]
    assert answer[running.instance_id].public_ip == "127.0.0.1"
    assert len(sandbox.calls("listPods")) == 1
    assert sandbox.calls("getPod") == []


def test_an_id_that_is_not_the_adapters_is_not_found(sandbox):
    with pytest.raises(ProviderRequestRejected) as raised:
        adapter(sandbox).describe("eu-central", "default/train")

    assert raised.value.code == "NotFound"


# -------------------------------------------------------------------------------------- credentials


def test_a_token_lacking_a_permission_is_refused_naming_the_verb_and_resource(sandbox):
    token = sandbox.register_token(deny=[("create", "networkpolicies")])

    with pytest.raises(CredentialsRejected) as raised:
        adapter(sandbox, token).check_credentials()

    assert raised.value.message.startswith("the service account may not create networkpolicies (networking.k8s.io)")
    adapter(sandbox).check_credentials()


def test_a_launch_the_api_server_forbids_names_the_verb_and_leaves_nothing(sandbox):
    token = sandbox.register_token(deny=[("create", "networkpolicies")])

    with pytest.raises(CredentialsRejected) as raised:
        adapter(sandbox, token).launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-forbidden"))

    assert raised.value.http_status == 403
    assert raised.value.message.startswith("the service account may not create networkpolicies (networking.k8s.io)")
    assert order_namespaces(sandbox) == []


def test_an_unknown_token_and_a_foreign_ca_are_credentials_refused(sandbox, tmp_path):
    with pytest.raises(CredentialsRejected) as unknown:
        adapter(sandbox, "no-such-token").list_offers()
    assert unknown.value.code == "Unauthorized"

    other = start_kubernetes_sandbox()  # its own throwaway CA
    try:
        values = {"token": sandbox.demo_token, "ca_bundle": other.ca_pem}
        a = KubernetesAdapter(Credentials("kubernetes", values, sandbox.url), ["eu-central"], {})
        with pytest.raises(CredentialsRejected) as foreign:
            a.check_credentials()
    finally:
        other.stop()
    assert foreign.value.code == "TLSVerifyFailed"


def test_a_pasted_kubeconfig_connects(sandbox):
    text = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "sandbox",
            "clusters": [{"name": "c", "cluster": {"server": sandbox.url, "certificate-authority-data":
                                                   base64.b64encode(sandbox.ca_pem.encode()).decode()}}],
            "users": [{"name": "u", "user": {"token": sandbox.demo_token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "c", "user": "u"}}],
        }
    )  # fmt: skip

    server, values = kubeconfig_credentials(text)

    KubernetesAdapter(Credentials("kubernetes", values, server), ["eu-central"], {}).check_credentials()


# ---------------------------------------------------------------------------------------- faults, time


def test_a_throttled_read_is_retried_after_the_servers_retry_after_and_a_throttled_write_is_not(sandbox):
    a = adapter(sandbox)
    sandbox.retry_after_s = 1
    sandbox.faults.inject("throttle", action="listNodes", times=1)
    started = time.monotonic()
    assert a.list_offers()
    assert time.monotonic() - started >= 1  # it waited the Retry-After, not its own 0.25 s backoff
    assert len(sandbox.calls("listNodes")) == 2

    sandbox.faults.inject("throttle", action="createPod", times=1)
    with pytest.raises(TransientProviderError) as raised:
        a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-throttle"))
    assert raised.value.code == "TooManyRequests"
    handle = a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-throttle"))
    assert [f"{p.namespace}/{p.name}" for p in sandbox.pods()] == [handle.instance_id]


def test_every_call_is_bounded_by_its_timeouts(sandbox):
    a = adapter(sandbox, read_timeout="0.3", max_attempts="2", retry_backoff="0.1")
    sandbox.faults.inject("slow", action="listNodes", seconds=3)
    sandbox.faults.inject("slow", action="createPod", seconds=3)

    started = time.monotonic()
    with pytest.raises(TransientProviderError):
        a.list_offers()
    read = time.monotonic() - started
    started = time.monotonic()
    with pytest.raises(TransientProviderError):
        a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-slow"))
    write = time.monotonic() - started

    assert read < 1.5  # two attempts of 0.3 s and one pause of 0.1 s, with room for a slow machine
    assert write < 1.5  # one attempt: writes are not retried


# ------------------------------------------------------------------------------------------- telemetry


def test_gpu_telemetry_reads_the_dcgm_exporter_once_for_each_orders_pods(sandbox):
    a = adapter(sandbox)
    mine = until(a, a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-tele")), InstanceState.RUNNING)
    until(a, a.launch(spec("k8s-gpu-1", "gpu-t4-0", "ord-other")), InstanceState.RUNNING)
    [device] = [p.devices for p in sandbox.pods() if f"{p.namespace}/{p.name}" == mine.instance_id]
    sandbox.set_gpu_utilization("gpu-t4-0", int(device[0].rsplit(":", 1)[1]), 73)

    samples = a.gpu_telemetry()

    assert sorted(samples) == ["ord-other", "ord-tele"]  # one read of the exporter, split by order
    assert [(s.hostname, s.namespace, s.pod, s.utilization_pct) for s in samples["ord-tele"]] == [
        ("gpu-t4-0", mine.extra["namespace"], "lease", 73.0)
    ]
    assert adapter(sandbox, dcgm_url="").gpu_telemetry() == {}


# ------------------------------------------------------------------------------------ addresses, limits


def test_the_api_server_and_the_dcgm_exporter_are_held_to_the_seller_endpoint_rules(settings):
    settings.PROVIDER_ENDPOINTS = "public"
    inside = Credentials("kubernetes", {"token": "t"}, "https://10.0.0.1:6443")

    with pytest.raises(EndpointRefused) as api_server:
        account_endpoints_check(inside, {})
    with pytest.raises(EndpointRefused) as exporter:
        account_endpoints_check(
            Credentials("kubernetes", {"token": "t"}, "https://8.8.8.8:6443"),  # public: passes
            {"dcgm_url": "http://169.254.169.254/metrics"},  # the cloud metadata service: refused
        )

    assert api_server.value.field == "endpoint_url"
    assert exporter.value.field == "dcgm_url"
    settings.PROVIDER_ENDPOINTS = "public+loopback"  # where the sandboxes listen
    account_endpoints_check(Credentials("kubernetes", {"token": "t"}, "https://127.0.0.1:6443"), {})


def test_an_api_server_url_without_tls_is_refused_before_any_token_is_sent():
    with pytest.raises(ValueError, match="endpoint_url: the server URL must be https"):
        KubernetesAdapter(Credentials("kubernetes", {"token": "t"}, "http://203.0.113.10:6443"), ["eu-central"], {})


def test_a_disk_larger_than_the_nodes_ephemeral_storage_is_refused_before_launch(sandbox):
    a = adapter(sandbox)
    offer = next(o for o in a.list_offers() if o.zone == "gpu-t4-0" and o.instance_type == "k8s-gpu-1")
    launch = replace(spec("k8s-gpu-1", "gpu-t4-0", "ord-disk"), offer_extra=offer.extra)

    fits = a.launch_problems(replace(launch, boot=contract_boot(disk_gb=offer.extra["ephemeral_storage_gb"])))
    too_big = a.launch_problems(replace(launch, boot=contract_boot(disk_gb=offer.extra["ephemeral_storage_gb"] + 1)))

    assert fits == []
    assert [(p.field, p.message) for p in too_big] == [
        ("launch.disk_gb", f"{offer.extra['ephemeral_storage_gb'] + 1} GB is more than node gpu-t4-0's 900 GB of "
                           "ephemeral storage")
    ]  # fmt: skip


# ------------------------------------------------------------------------------ a hostile API server


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An "API server" whose every answer is ``self.server.body`` (200, application/json)."""

    def do_GET(self) -> None:
        body: bytes = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[http.server.HTTPServer, str]]:
    ca, chain, key = write_tls(tmp_path_factory.mktemp("hostile-tls"), ca_common_name="hostile CA")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.socket = server_context(chain, key).wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, ca.read_text()
    httpd.shutdown()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper than 64 levels"),
        (b'{"items": [], "pad": "' + b"x" * (32 * 1024 * 1024) + b'"}', "larger than 33554432 bytes"),
        (b"<html>not json</html>", "not JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'{"kind": "NodeList"}', "a list without items"),
    ],
)
def test_an_api_server_answer_out_of_bounds_or_shape_is_malformed_naming_why(hostile, body, message):
    httpd, ca = hostile
    httpd.body = body  # type: ignore[attr-defined]
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    a = KubernetesAdapter(Credentials("kubernetes", {"token": "t", "ca_bundle": ca}, url), ["eu-central"], {})

    with pytest.raises(MalformedProviderResponse, match=message):
        a.list_offers()
