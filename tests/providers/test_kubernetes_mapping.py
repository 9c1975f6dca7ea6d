"""The Kubernetes adapter's pure parts: offers from nodes, prices, kubeconfigs, permissions, DCGM text, states and
errors. No cluster: JSON shaped as the references give it.

References:
- Node, Pod, Status objects: https://kubernetes.io/docs/reference/kubernetes-api/ (cluster-resources/node-v1,
  workload-resources/pod-v1, common-definitions/status/), quantities: common-definitions/quantity/.
- NVIDIA device plugin (https://github.com/NVIDIA/k8s-device-plugin, README "Configuration Option Details":
  MIG_STRATEGY mixed exposes ``nvidia.com/mig-<slice_count>g.<memory_size>gb``; "With CUDA Time-Slicing":
  ``renameByDefault`` advertises ``nvidia.com/gpu.shared``, and the product label gains ``-SHARED`` when a shared
  resource is not renamed, internal/lm/resource.go ``productLabel``).
- GPU Feature Discovery labels (docs/gpu-feature-discovery/README.md, "Generated Labels"): ``nvidia.com/gpu.product``
  ("Tesla-T4"), ``nvidia.com/gpu.memory`` (MiB), ``nvidia.com/gpu.count``, ``nvidia.com/gpu.replicas``,
  ``nvidia.com/mig.strategy``; single strategy product "A100-SXM4-40GB-MIG-1g.5gb".
- MIG profiles: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/ ("Supported MIG Profiles": A100 40GB
  1g.5gb to 7g.40gb; N of 7 compute slices).
- kubeconfig: https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/
- SelfSubjectRulesReview: https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-rules-review-v1/
- dcgm-exporter text: https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/dcgm-exporter.html and
  https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
"""

from __future__ import annotations

import base64
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.kubernetes import catalog, dcgm, launching, mapping, permissions
from providers.kubernetes.kubeconfig import KubeconfigRefused, kubeconfig_credentials
from providers.kubernetes.pricing import PriceRule, parse_gpu_prices, price_for
from providers.launch import IngressRule
from providers.types import GPU_FRACTION, InstanceState

PRICES = "A100-80GB-SXM4 1.90\nA100-40GB-SXM4 1.40\nT4 0.35\nT4 0.30 broker.example/pool=spot-t4\nL4 0.70\n"


def node(
    name: str,
    labels: dict[str, str],
    gpus: dict[str, str],
    *,
    ready: str = "True",
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node as ``GET /api/v1/nodes`` lists it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"unschedulable": unschedulable, **({"taints": taints} if taints else {})},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1056Gi", "ephemeral-storage": "1800Gi", "pods": "110", **gpus},
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.5"},
                {"type": "ExternalIP", "address": "198.51.100.7"},
            ],
        },
    }


def gfd(product: str, memory_mib: int, count: int, **extra: str) -> dict[str, str]:
    return {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(count),
        **{k.replace("nvidia_com_", "nvidia.com/").replace("_", "."): v for k, v in extra.items()},
    }


def pod(node_name: str, resource: str, amount: str, *, phase: str = "Running", broker: bool = False) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "broker"} if broker else {"app": "train"}
    return {
        "metadata": {"name": "p", "namespace": "team", "labels": labels},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": {resource: amount}}}]},
        "status": {"phase": phase},
    }


def settings(**kwargs: Any) -> catalog.OfferSettings:
    return catalog.OfferSettings(region="eu-central", rules=parse_gpu_prices(PRICES), **kwargs)


A100 = node("gpu-a100-0", gfd("NVIDIA-A100-SXM4-80GB", 81920, 8), {"nvidia.com/gpu": "8"})


def by_type(offers: list[Any]) -> dict[str, Any]:
    return {o.instance_type: o for o in offers}


# ------------------------------------------------------------------------------------------------ offers


def test_a_whole_gpu_node_is_sold_in_sizes_of_one_two_four_and_eight():
    offers = by_type(catalog.offers([A100], [], settings()))

    assert sorted(offers) == ["k8s-gpu-1", "k8s-gpu-2", "k8s-gpu-4", "k8s-gpu-8"]
    four = offers["k8s-gpu-4"]
    assert (four.region, four.zone, four.gpu_model, four.gpu_count, four.gpu_memory_gb) == (
        "eu-central", "gpu-a100-0", gpu_names.A100_80_SXM, 4, 80
    )  # fmt: skip
    assert (four.price, four.currency, four.capacity) == (Decimal("7.600000"), "USD", 2)
    assert (four.vcpus, four.memory_gib) == (48, Decimal("528.00"))
    assert four.extra == {
        "node": "gpu-a100-0",
        "resource": "nvidia.com/gpu",
        "units_free": 8,
        "units_allocatable": 8,
        "pool": "",
        "node_selector": {"kubernetes.io/hostname": "gpu-a100-0"},
        "ephemeral_storage_gb": 1800,
    }


def test_foreign_pods_requests_are_subtracted_and_the_brokers_own_are_not():
    pods = [
        pod("gpu-a100-0", "nvidia.com/gpu", "3"),
        pod("gpu-a100-0", "nvidia.com/gpu", "2", broker=True),  # counted by the broker's own holds
        pod("gpu-a100-0", "nvidia.com/gpu", "1", phase="Succeeded"),  # ended: frees its GPU
        {**pod("", "nvidia.com/gpu", "1")},  # not bound to a node yet
    ]

    offers = by_type(catalog.offers([A100], pods, settings()))

    assert {t: o.capacity for t, o in offers.items()} == {"k8s-gpu-1": 5, "k8s-gpu-2": 2, "k8s-gpu-4": 1}
    assert offers["k8s-gpu-1"].extra["units_free"] == 5


def test_an_init_containers_request_counts_when_it_is_the_largest():
    item = pod("gpu-a100-0", "nvidia.com/gpu", "1")
    item["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]

    assert mapping.pod_requests(item, "nvidia.com/gpu") == 4


def test_mig_slices_under_the_mixed_strategy_are_sold_one_slice_each():
    mig = node(
        "gpu-a100-mig-0",
        gfd("NVIDIA-A100-SXM4-40GB", 40960, 2, nvidia_com_mig_strategy="mixed"),
        {"nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-3g.20gb": "2"},
    )

    offers = by_type(catalog.offers([mig], [pod("gpu-a100-mig-0", "nvidia.com/mig-1g.5gb", "2")], settings()))

    assert sorted(offers) == ["k8s-mig-1g.5gb", "k8s-mig-3g.20gb"]
    small, large = offers["k8s-mig-1g.5gb"], offers["k8s-mig-3g.20gb"]
    assert (small.gpu_model, small.gpu_count, small.gpu_memory_gb, small.capacity) == (gpu_names.A100_40_SXM, 1, 5, 5)
    assert small.extra[GPU_FRACTION] == pytest.approx(1 / 7)
    assert small.extra["mig_profile"] == "1g.5gb"
    assert small.price == (Decimal("1.40") / 7).quantize(Decimal("0.000001"))
    assert (large.gpu_memory_gb, large.capacity, large.extra["resource"]) == (20, 2, "nvidia.com/mig-3g.20gb")
    assert large.extra[GPU_FRACTION] == pytest.approx(3 / 7)


def test_the_single_mig_strategy_sells_nvidia_com_gpu_as_slices_of_its_profile():
    single = node(
        "gpu-single-0",
        gfd("A100-SXM4-40GB-MIG-1g.5gb", 5120, 14, nvidia_com_mig_strategy="single"),
        {"nvidia.com/gpu": "14"},
    )

    offers = by_type(catalog.offers([single], [], settings()))

    assert sorted(offers) == ["k8s-mig-1g.5gb"]
    assert offers["k8s-mig-1g.5gb"].extra["resource"] == "nvidia.com/gpu"
    assert offers["k8s-mig-1g.5gb"].gpu_model == gpu_names.A100_40_SXM


def test_time_sliced_gpus_are_sold_only_when_the_seller_allows_and_the_replicas_are_known():
    shared = node(
        "gpu-l4-shared-0", gfd("NVIDIA-L4", 23034, 2, nvidia_com_gpu_replicas="4"), {"nvidia.com/gpu.shared": "8"}
    )
    unknown = node("gpu-l4-shared-1", gfd("NVIDIA-L4", 23034, 2), {"nvidia.com/gpu.shared": "8"})

    assert catalog.offers([shared, unknown], [], settings()) == []
    offers = catalog.offers([shared, unknown], [], settings(shared_gpus=True))

    assert [(o.zone, o.instance_type) for o in offers] == [("gpu-l4-shared-0", "k8s-shared-1")]
    assert offers[0].extra[GPU_FRACTION] == 0.25
    assert (offers[0].price, offers[0].capacity, offers[0].gpu_model) == (Decimal("0.175000"), 8, gpu_names.L4)


def test_a_gpu_time_sliced_without_renaming_is_never_sold_as_a_whole_gpu():
    # NVIDIA's e2e check: replicas 10 on nvidia.com/gpu and the product "Tesla-T4-SHARED".
    sliced = node(
        "gpu-t4-ts-0", gfd("Tesla-T4-SHARED", 15360, 4, nvidia_com_gpu_replicas="10"), {"nvidia.com/gpu": "40"}
    )

    assert catalog.offers([sliced], [], settings()) == []
    offers = catalog.offers([sliced], [], settings(shared_gpus=True))

    assert [(o.instance_type, o.extra["resource"], o.extra[GPU_FRACTION]) for o in offers] == [
        ("k8s-shared-1", "nvidia.com/gpu", 0.1)
    ]


def test_cordoned_not_ready_tainted_cpu_only_and_unpriced_nodes_are_not_on_sale():
    nodes = [
        node("cordoned", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"}, unschedulable=True),
        node("not-ready", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"}, ready="False"),
        node("tainted", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"},
             taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
        node("cpu-0", {}, {}),
        node("h100", gfd("NVIDIA-H100-80GB-HBM3", 81559, 8), {"nvidia.com/gpu": "8"}),  # no price rule
        node("gpu-t4-0", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"},
             taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    ]  # fmt: skip

    offers = catalog.offers(nodes, [], settings())

    assert {o.zone for o in offers} == {"gpu-t4-0"}


def test_a_node_described_nonsensically_is_skipped_and_the_others_still_sold():
    nameless = node("x", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"})
    nameless["metadata"]["name"] = "Not A Name/" + "x" * 300
    odd_pool = node(
        "gpu-t4-1", {**gfd("Tesla-T4", 15360, 4), "broker.example/pool": "x" * 500}, {"nvidia.com/gpu": "4"}
    )

    offers = catalog.offers([nameless, odd_pool, A100], [], settings())

    assert {o.zone for o in offers} == {"gpu-t4-1", "gpu-a100-0"}
    assert {o.extra["pool"] for o in offers} == {""}


def test_a_price_rule_naming_the_nodes_pool_label_wins_over_the_models_rule():
    spot = node("gpu-t4-spot", {**gfd("Tesla-T4", 15360, 4), "broker.example/pool": "spot-t4"}, {"nvidia.com/gpu": "4"})
    plain = node("gpu-t4-0", gfd("Tesla-T4", 15360, 4), {"nvidia.com/gpu": "4"})

    offers = {(o.zone, o.instance_type): o for o in catalog.offers([spot, plain], [], settings())}

    assert offers[("gpu-t4-spot", "k8s-gpu-1")].price == Decimal("0.300000")
    assert offers[("gpu-t4-spot", "k8s-gpu-1")].extra["pool"] == "spot-t4"
    assert offers[("gpu-t4-0", "k8s-gpu-1")].price == Decimal("0.350000")


@pytest.mark.parametrize(
    ("product", "memory_mib", "key"),
    [
        ("NVIDIA-A100-SXM4-80GB", 81920, gpu_names.A100_80_SXM),
        ("NVIDIA-A100-SXM4-40GB", 40960, gpu_names.A100_40_SXM),
        ("A100-SXM4-40GB", 39538, gpu_names.A100_40_SXM),  # GFD's README example
        ("NVIDIA-A100-80GB-PCIe", 81920, gpu_names.A100_80_PCIE),
        ("NVIDIA-H100-80GB-HBM3", 81559, gpu_names.H100_SXM),
        ("NVIDIA-H100-NVL", 95830, gpu_names.H100_NVL),
        ("Tesla-T4", 15360, gpu_names.T4),
        ("Tesla-T4-SHARED", 15360, gpu_names.T4),
        ("NVIDIA-L4", 23034, gpu_names.L4),
        ("NVIDIA-L40S", 46068, gpu_names.L40S),
        ("NVIDIA-A10G", 23028, gpu_names.A10G),
        ("Tesla-V100-SXM2-16GB", 16160, gpu_names.V100_16_SXM2),
        ("NVIDIA-GeForce-RTX-4090", 24564, gpu_names.RTX_4090),
        ("A100-SXM4-40GB-MIG-1g.5gb", None, gpu_names.A100_40_SXM),
        ("GeForce-GT-710", 2048, None),
    ],
)
def test_gfd_product_labels_map_to_the_brokers_model_keys(product, memory_mib, key):
    assert mapping.gpu_model_key(product, memory_mib) == key


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8), ("500m", Decimal("0.5")), ("64Gi", 64 * 2**30), ("202051056Ki", 202051056 * 1024), ("1e3", 1000),
     ("1.5", Decimal("1.5")), ("2k", 2000)],
)  # fmt: skip
def test_resource_quantities_are_read_as_the_api_writes_them(text, value):
    assert mapping.quantity(text) == value


# ------------------------------------------------------------------------------------------------ prices


def test_gpu_prices_parse_and_refuse_naming_the_line():
    assert parse_gpu_prices("# comment\n\nT4 0.30 broker.example/pool=spot-t4\n") == [
        PriceRule("T4", Decimal("0.30"), ("broker.example/pool", "spot-t4"))
    ]
    for text, message in [
        ("T4 0.30\nA100 1.9", "line 2: 'A100' is not a GPU model"),
        ("T4 -1", "line 1: the price '-1'"),
        ("T4 0", "line 1: the price 0 is not above 0"),
        ("T4 1e3", "line 1: the price '1e3'"),
        ("T4 0.3 pool", "line 1: 'pool' is not <label>=<value>"),
        ("T4 0.3 -bad/x=y", "line 1: the label prefix"),
        ("T4 0.3\nT4 0.4", "line 2: 'T4 0.4' repeats"),
        ("T4 0.3 a b c", "line 1: 'T4 0.3 a b c' is not"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            parse_gpu_prices(text)


def test_the_first_label_rule_a_node_matches_wins_and_a_model_without_rule_has_no_price():
    rules = parse_gpu_prices("T4 0.35\nT4 0.30 pool=a\nT4 0.20 zone=b\n")

    assert price_for(rules, "T4", {"pool": "a", "zone": "b"}) == Decimal("0.30")
    assert price_for(rules, "T4", {"zone": "b"}) == Decimal("0.20")
    assert price_for(rules, "T4", {}) == Decimal("0.35")
    assert price_for(rules, "L4", {}) is None


# --------------------------------------------------------------------------------------------- kubeconfig

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"


def kubeconfig(user: dict[str, Any], cluster: dict[str, Any] | None = None, current: str | None = "ctx") -> str:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpu",
                "cluster": cluster
                or {
                    "server": "https://203.0.113.10:6443",
                    "certificate-authority-data": base64.b64encode(CA_PEM.encode()).decode(),
                },
            }
        ],
        "users": [{"name": "broker", "user": user}],
        "contexts": [
            {"name": "ctx", "context": {"cluster": "gpu", "user": "broker"}},
            {"name": "other", "context": {}},
        ],
    }
    if current:
        config["current-context"] = current
    return yaml.safe_dump(config)


def test_a_kubeconfig_gives_the_server_the_token_and_the_ca_bundle():
    server, values = kubeconfig_credentials(kubeconfig({"token": "eyJhbGciOi.abc.def"}))

    assert server == "https://203.0.113.10:6443"
    assert values == {"token": "eyJhbGciOi.abc.def", "ca_bundle": CA_PEM}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (kubeconfig({"client-certificate-data": "AAAA", "client-key-data": "AAAA"}), "client certificate"),
        (kubeconfig({"exec": {"command": "aws"}}), "exec credential plugin"),
        (kubeconfig({}), "has no token"),
        (kubeconfig({"token": "t"}, current=None), "no current-context"),
        (kubeconfig({"token": "t"}, current="missing"), "not among the contexts"),
        (kubeconfig({"token": "t"}, {"server": "http://203.0.113.10"}), "must be https"),
        (kubeconfig({"token": "t"}, {"server": "https://h", "certificate-authority": "/home/x/ca.crt"}), "CA file"),
        (kubeconfig({"token": "t"}, {"server": "https://h", "insecure-skip-tls-verify": True}), "skips TLS"),
        (kubeconfig({"token": "t"}, {"server": "https://h", "certificate-authority-data": "bm90IGEgcGVt"}), "no PEM"),
        ("- just\n- a list\n", "not a mapping"),
        ("a: [unclosed", "not YAML"),
        ("x: " + "a" * 70_000, "larger than 64 KiB"),
    ],
)
def test_a_kubeconfig_the_broker_cannot_use_is_refused_saying_why(text, message):
    with pytest.raises(KubeconfigRefused, match=message):
        kubeconfig_credentials(text)


# -------------------------------------------------------------------------------------------- permissions


def everything_but(*lacking: permissions.Permission) -> dict[str, Any]:
    rules = [
        {"verbs": [p.verb], "apiGroups": [p.group], "resources": [p.resource]}
        for p in permissions.PERMISSIONS
        if p not in lacking
    ]
    return {"resourceRules": rules, "nonResourceRules": [], "incomplete": False}


def test_a_token_lacking_a_permission_is_refused_naming_the_first_verb_and_resource():
    lacking = permissions.Permission("create", "networking.k8s.io", "networkpolicies")

    with pytest.raises(CredentialsRejected) as raised:
        permissions.check_review(everything_but(lacking))

    assert raised.value.message.startswith("the service account may not create networkpolicies (networking.k8s.io)")
    permissions.check_review(everything_but())


def test_wildcards_grant_and_rules_limited_to_names_do_not():
    assert permissions.missing({"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}) == []
    named = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "resourceNames": ["only-this"]}
    assert permissions.missing({"resourceRules": [named]}) == list(permissions.PERMISSIONS)


def test_an_incomplete_review_refuses_nothing():
    permissions.check_review({"resourceRules": [], "incomplete": True, "evaluationError": "webhook"})


def test_the_cluster_role_manifest_grants_exactly_what_the_adapter_checks():
    manifest = yaml.safe_load((Path(permissions.__file__).parent / "clusterrole.yaml").read_text())

    assert manifest["kind"] == "ClusterRole"
    granted = {(g, r, v) for rule in manifest["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    assert granted == {(p.group, p.resource, p.verb) for p in permissions.PERMISSIONS}
    assert manifest["rules"] == permissions.cluster_role_rules()


# --------------------------------------------------------------------------------------------------- DCGM

GPU0 = 'gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"'
POD = 'Hostname="gpu-a100-0", container="lease", namespace="brk-0123", pod="lease"'
# As dcgm-exporter writes it: HELP and TYPE comments, one sample a line, an optional timestamp, the sentinel
# 9223372036854775794 for a blank field, and metrics the broker does not read (SM clock).
DCGM_TEXT = "\n".join(
    [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f'DCGM_FI_DEV_GPU_UTIL{{{GPU0}, device="nvidia0", modelName="NVIDIA A100-SXM4-80GB", {POD}}} 87',
        'DCGM_FI_DEV_GPU_UTIL{gpu="1", UUID="GPU-1111", modelName="NVIDIA A100-SXM4-80GB", Hostname="gpu-a100-0"} 0',
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        f"DCGM_FI_DEV_GPU_TEMP{{{GPU0}, {POD}}} 61",
        f"DCGM_FI_DEV_POWER_USAGE{{{GPU0.replace(', ', ',')},{POD.replace(', ', ',')}}} 312.5 1700000000000",
        f"DCGM_FI_DEV_FB_USED{{{GPU0},{POD}}} 9223372036854775794",
        f"DCGM_FI_DEV_SM_CLOCK{{{GPU0}}} 1410",
        "",
    ]
)


def test_dcgm_samples_are_grouped_per_gpu_with_their_pod():
    samples = dcgm.gpu_utilization(DCGM_TEXT)

    assert samples == [
        dcgm.GpuSample(
            hostname="gpu-a100-0",
            gpu="0",
            uuid="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",
            model_name="NVIDIA A100-SXM4-80GB",
            namespace="brk-0123",
            pod="lease",
            container="lease",
            utilization_pct=87.0,
            temperature_c=61.0,
            power_w=312.5,
            memory_used_mib=None,  # the exporter's sentinel for a blank field
        ),
        dcgm.GpuSample(
            hostname="gpu-a100-0", gpu="1", uuid="GPU-1111", model_name="NVIDIA A100-SXM4-80GB", utilization_pct=0.0
        ),
    ]
    assert [s.gpu for s in dcgm.samples_of_namespace(samples, "brk-0123")] == ["0"]


def test_dcgm_label_escapes_and_bounds():
    assert dcgm.parse_labels(r'{a="x\"y", b="c\\d", c="e\nf"}') == {"a": 'x"y', "b": "c\\d", "c": "e\nf"}
    with pytest.raises(dcgm.DcgmUnreadable):
        dcgm.gpu_utilization('DCGM_FI_DEV_GPU_UTIL{gpu="0" UUID="x"} 1\n')
    with pytest.raises(dcgm.DcgmUnreadable, match="larger than"):
        dcgm.gpu_utilization("#" * (dcgm.MAX_TEXT_BYTES + 1))
    many = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}"}} 1\n' for i in range(dcgm.MAX_SAMPLES + 1))
    with pytest.raises(dcgm.DcgmUnreadable, match="more than 4096 GPUs"):
        dcgm.gpu_utilization(many)


# --------------------------------------------------------------------------------------- states and errors


def lease_pod(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "lease",
            "namespace": "brk-00000000000000000000",
            "labels": {"broker.instance-type": "k8s-gpu-1"},
        },
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-t4-0"}},
        "status": status,
    }


def test_an_unschedulable_pod_is_a_capacity_failure_with_the_schedulers_message():
    message = (
        "0/6 nodes are available: 1 Insufficient nvidia.com/gpu, 5 node(s) didn't match Pod's node affinity/selector."
    )
    handle = mapping.instance_handle(
        lease_pod({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}),
        "eu-central",
    )  # fmt: skip

    assert handle.state is InstanceState.FAILED
    assert (handle.extra["error_class"], handle.extra["error_code"], handle.extra["error_message"]) == (
        CapacityUnavailable.error_class, "FailedScheduling", message
    )  # fmt: skip
    assert (handle.instance_id, handle.zone, handle.instance_type) == (
        "brk-00000000000000000000/lease", "gpu-t4-0", "k8s-gpu-1"
    )  # fmt: skip


def test_an_image_that_cannot_be_pulled_is_the_buyers_error_naming_the_image():
    state = mapping.pod_state(
        lease_pod({"phase": "Pending", "containerStatuses": [{"name": "lease", "image": "nope/missing:1", "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope/missing:1\""}}}]})
    )  # fmt: skip

    assert state.state is InstanceState.FAILED
    assert state.extra["error_class"] == ProviderRequestRejected.error_class
    assert state.extra["error_code"] == "ImagePullBackOff"
    assert state.extra["error_message"].startswith("the image nope/missing:1 cannot be pulled: Back-off")


@pytest.mark.parametrize(
    ("status", "state"),
    [({"phase": "Running"}, InstanceState.RUNNING), ({"phase": "Succeeded"}, InstanceState.TERMINATED),
     ({"phase": "Failed"}, InstanceState.TERMINATED), ({"phase": "Pending"}, InstanceState.PENDING)],
)  # fmt: skip
def test_pod_phases_map_to_the_brokers_states(status, state):
    assert mapping.pod_state(lease_pod(status)).state is state


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def test_api_errors_map_to_the_brokers_error_classes():
    forbidden = (
        'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:kube-system:gpu-broker" cannot '
        'create resource "networkpolicies" in API group "networking.k8s.io" in the namespace "brk-1"'
    )
    quota = 'pods "lease" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, used: 0, limited: 1'
    cases = {
        401: (status_body(401, "Unauthorized", "Unauthorized"), CredentialsRejected, "Unauthorized"),
        403: (status_body(403, "Forbidden", forbidden), CredentialsRejected, "Forbidden"),
        404: (status_body(404, "NotFound", 'pods "lease" not found'), ProviderRequestRejected, "NotFound"),
        409: (status_body(409, "AlreadyExists", 'namespaces "brk-1" already exists'), ProviderRequestRejected,
              "AlreadyExists"),
        422: (status_body(422, "Invalid", "Pod is invalid"), ProviderRequestRejected, "Invalid"),
        429: (status_body(429, "TooManyRequests", "slow down"), TransientProviderError, "TooManyRequests"),
        500: (status_body(500, "InternalError", "etcd"), TransientProviderError, "InternalError"),
    }  # fmt: skip
    for code, (body, cls, error_code) in cases.items():
        error = mapping.status_error(code, body)
        assert (type(error), error.code, error.http_status) == (cls, error_code, code)
    assert mapping.status_error(403, status_body(403, "Forbidden", forbidden)).message.startswith(
        "the service account may not create networkpolicies (networking.k8s.io)"
    )
    over = mapping.status_error(403, status_body(403, "Forbidden", quota))
    assert (type(over), over.code) == (QuotaExceeded, "ExceededQuota")
    assert type(mapping.status_error(503, None, "Service Unavailable")) is TransientProviderError


# ------------------------------------------------------------------------------------------ launch objects


def test_the_namespace_is_named_from_the_client_token_and_everything_carries_the_order():
    name = launching.namespace_name("ord-1-a1")
    labels = launching.labels("ord-1", "ord-1-a1", "k8s-gpu-2")

    assert name == "brk-" + __import__("hashlib").sha256(b"ord-1-a1").hexdigest()[:20]
    assert labels == {
        "app.kubernetes.io/managed-by": "broker",
        "broker.order": "ord-1",
        "broker.attempt": name.removeprefix("brk-"),
        "broker.instance-type": "k8s-gpu-2",
    }


def test_the_network_policy_lets_in_only_the_buyers_ranges_and_keeps_out_of_pods_and_metadata_but_dns():
    ingress = (IngressRule(22, ("203.0.113.0/24",)), IngressRule(8000, ("198.51.100.0/24", "2001:db8::/32")))

    policy = launching.network_policy_body(ingress, ("10.0.0.0/8", "fd00::/8"), {})

    assert launching.policy_ingress(policy) == {(22, "203.0.113.0/24"), (8000, "198.51.100.0/24"),
                                                 (8000, "2001:db8::/32")}  # fmt: skip
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    assert policy["spec"]["egress"] == [
        {"to": [dns], "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}]},
        {"to": [{"ipBlock": {"cidr": "::/0", "except": ["fd00::/8", "fe80::/10"]}}]},
    ]


def test_the_pod_asks_exactly_the_orders_gpus_on_the_offers_node():
    body = launching.pod_body(
        image="nvidia/cuda:12.4.1-base-ubuntu22.04",
        resource="nvidia.com/mig-3g.20gb",
        count=1,
        node_selector={"kubernetes.io/hostname": "gpu-a100-mig-0"},
        disk_gb=120,
        with_boot=True,
        object_labels={},
    )
    container = body["spec"]["containers"][0]

    assert container["resources"] == {"limits": {"nvidia.com/mig-3g.20gb": "1"},
                                      "requests": {"ephemeral-storage": "120Gi"}}  # fmt: skip
    assert container["command"] == ["/bin/bash", "/broker/boot/boot.sh"]
    assert body["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a100-mig-0"}
    assert body["spec"]["volumes"] == [{"name": "boot", "secret": {"secretName": "boot", "defaultMode": 0o500}}]
    assert launching.resource_quota_body("nvidia.com/mig-3g.20gb", 1, {})["spec"]["hard"] == {
        "requests.nvidia.com/mig-3g.20gb": "1", "pods": "1"
    }  # fmt: skip


def test_the_service_opens_ssh_and_the_buyers_ports_on_the_pods_node_keeping_the_source_address():
    ingress = (IngressRule(8000, ("203.0.113.0/24",)), IngressRule(9000, ("203.0.113.0/24",), protocol="udp"))

    body = launching.service_body(launching.service_ports(ingress), launching.labels("ord-1", "ord-1-a1"))

    assert body["spec"]["type"] == "NodePort"
    assert body["spec"]["externalTrafficPolicy"] == "Local"
    assert body["spec"]["selector"] == {"broker.order": "ord-1", "broker.attempt": launching.attempt_hex("ord-1-a1")}
    assert [(p["port"], p["protocol"]) for p in body["spec"]["ports"]] == [(22, "TCP"), (8000, "TCP"), (9000, "UDP")]


def test_instance_types_name_their_resource():
    assert catalog.instance_resource("k8s-gpu-4") == ("nvidia.com/gpu", 4)
    assert catalog.instance_resource("k8s-mig-3g.40gb") == ("nvidia.com/mig-3g.40gb", 1)
    assert catalog.instance_resource("k8s-shared-1") == ("nvidia.com/gpu.shared", 1)
    assert catalog.instance_resource("k8s-gpu-3") is None
    assert catalog.instance_resource("p4d.24xlarge") is None
