"""GcpAdapter against the GCP sandbox: the real google-cloud-compute and google-cloud-billing over HTTP."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from providers import gpu_names
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderRequestRejected,
    QuotaExceeded,
    TransientProviderError,
)
from providers.gcp import catalog, mapping
from providers.gcp.adapter import GcpAdapter
from providers.types import Credentials, InstanceState, LaunchSpec, PricingModel
from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox
from sandboxes.gcp.seed import REGION_ZONES

PROJECT = "alice-gpus"
ALL_REGIONS = sorted(REGION_ZONES)
AdapterFactory = Callable[..., GcpAdapter]


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[GcpSandbox]:
    sandbox = start_gcp_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture(scope="module")
def alice_key(sandbox_server) -> str:
    return json.dumps(sandbox_server.new_service_account(f"alice@{PROJECT}.iam.gserviceaccount.com", PROJECT))


@pytest.fixture
def sandbox(sandbox_server) -> Iterator[GcpSandbox]:
    sandbox_server.reset()
    yield sandbox_server
    sandbox_server.reset()


@pytest.fixture
def gcp_adapter(sandbox, alice_key) -> AdapterFactory:
    """``gcp_adapter(regions=[...], key=..., project=..., **options)`` -> a ``GcpAdapter`` on the sandbox."""

    def build(regions: list[str] | None = None, key: str | None = None, project: str = PROJECT, **options: str):
        values = {"service_account_json": key or alice_key, "project_id": project}
        return GcpAdapter(
            Credentials(kind="gcp", values=values, endpoint_url=sandbox.url), regions or ALL_REGIONS, options
        )

    return build


def _spec(
    attempt: str = "ord-1-a1",
    *,
    order_ref: str = "ord-1",
    zone: str = "us-central1-a",
    instance_type: str = "n1-standard-4+1xT4",
    pricing_model: PricingModel = PricingModel.ON_DEMAND,
    tags: dict[str, str] | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        instance_type=instance_type,
        pricing_model=pricing_model,
        client_token=attempt,
        order_ref=order_ref,
        tags=tags or {},
    )


def _settle(adapter: GcpAdapter, handle, polls: int = 20):
    for _ in range(polls):
        if handle.state is not InstanceState.PENDING:
            return handle
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


# ------------------------------------------------------------------------------------------------ offers


def test_offers_reproduce_every_seeded_price_in_both_zones(sandbox, gcp_adapter):
    offers = gcp_adapter().list_offers()

    by_key = {(q.region, q.zone, q.instance_type, q.pricing_model): q for q in offers}
    expected = {}
    for m in sandbox.machines:
        for zone in m.zones:
            expected[(m.region, zone, m.name, PricingModel.ON_DEMAND)] = m.on_demand
            if m.spot is not None:
                expected[(m.region, zone, m.name, PricingModel.SPOT)] = m.spot
    assert {k: q.price for k, q in by_key.items()} == expected
    assert len(offers) == len(by_key) == 92
    assert {q.currency for q in offers} == {"USD"}
    assert all(q.gpu_model in gpu_names.ALL for q in offers)


def test_offers_map_gpus_and_shapes(gcp_adapter):
    offers = {(q.zone, q.instance_type, q.pricing_model): q for q in gcp_adapter(["us-central1"]).list_offers()}

    a2 = offers[("us-central1-a", "a2-highgpu-8g", PricingModel.ON_DEMAND)]
    assert (a2.gpu_model, a2.gpu_count, a2.gpu_memory_gb, a2.vcpus, a2.memory_gib, a2.interconnect) == (
        gpu_names.A100_40_SXM,
        8,
        40,
        96,
        680,
        "nvlink",
    )
    assert a2.extra["sku_ids"].keys() == {"gpu", "core", "ram"}
    n1 = offers[("us-central1-a", "n1-standard-4+1xT4", PricingModel.SPOT)]
    assert (n1.gpu_model, n1.gpu_count, n1.vcpus, n1.memory_gib, str(n1.price)) == (gpu_names.T4, 1, 4, 15, "0.22723")
    assert offers[("us-central1-b", "a3-ultragpu-8g", PricingModel.ON_DEMAND)].gpu_model == gpu_names.H200_SXM
    assert {q.region for q in offers.values()} == {"us-central1"}


def test_small_pages_give_the_same_offers(sandbox, gcp_adapter):
    paged = gcp_adapter(["us-central1"], page_size="40").list_offers()
    pages = Counter(c.action for c in sandbox.calls())

    assert paged == gcp_adapter(["us-central1"]).list_offers()
    # 154 SKUs and 130 zone-level machine types (seeded plus non-GPU decoys), 40 per page.
    assert (pages["cloudbilling.services.skus.list"], pages["compute.machineTypes.aggregatedList"]) == (4, 4)


def test_n1_bundles_option_picks_the_pairings(gcp_adapter):
    offers = gcp_adapter(["europe-west4"], n1_bundles="n1-standard-8+1xV100").list_offers()

    assert sorted({q.instance_type for q in offers if q.instance_type.startswith("n1-")}) == ["n1-standard-8+1xV100"]


def test_a_read_is_retried_but_gives_up_after_max_attempts(sandbox, gcp_adapter):
    sandbox.faults.inject("throttle", action="compute.acceleratorTypes.aggregatedList", times=2)
    assert gcp_adapter(["us-east1"], retry_backoff="0.01").list_offers()
    assert len(sandbox.calls("compute.acceleratorTypes.aggregatedList")) == 3

    sandbox.reset()
    sandbox.faults.inject("throttle", action="cloudbilling.services.skus.list", times=3)
    with pytest.raises(TransientProviderError) as raised:
        gcp_adapter(["us-east1"], retry_backoff="0.01").list_offers()
    assert raised.value.code == "RATE_LIMIT_EXCEEDED"
    assert len(sandbox.calls("cloudbilling.services.skus.list")) == 3


# -------------------------------------------------------------------------------------------- credentials


def test_check_credentials_accepts_a_key_the_sandbox_never_issued(sandbox, gcp_adapter):
    # A real user's key: generated here, unknown to the sandbox, which can then only check the JWT's shape.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0123456789abcdef",
        "private_key": pem.decode(),
        "client_email": "bob@alice-gpus.iam.gserviceaccount.com",
        "token_uri": f"{sandbox.url}/token",
    }

    gcp_adapter(key=json.dumps(info)).check_credentials()


@pytest.mark.parametrize("email", ["bad-bob@alice-gpus.iam.gserviceaccount.com"])
def test_a_refused_account_is_credentials_rejected(sandbox, gcp_adapter, email):
    key = json.dumps(sandbox.new_service_account(email, PROJECT))

    with pytest.raises(CredentialsRejected) as raised:
        gcp_adapter(key=key).check_credentials()
    assert raised.value.code in ("authError", "UNAUTHENTICATED")


def test_an_allow_list_rejects_other_accounts(sandbox, gcp_adapter):
    sandbox.accept_service_accounts(["someone@else.iam.gserviceaccount.com"])

    with pytest.raises(CredentialsRejected):
        gcp_adapter().list_offers()


def test_a_project_without_access_is_credentials_rejected(gcp_adapter):
    with pytest.raises(CredentialsRejected) as raised:
        gcp_adapter(project="bad-project").check_credentials()
    assert raised.value.code == "forbidden"


@pytest.mark.parametrize("key", ["", "not json", json.dumps({"type": "authorized_user"}), json.dumps({"x": 1})])
def test_an_unusable_key_is_rejected_before_any_call(sandbox, gcp_adapter, key):
    with pytest.raises(CredentialsRejected):
        GcpAdapter(
            Credentials(
                kind="gcp", values={"service_account_json": key, "project_id": PROJECT}, endpoint_url=sandbox.url
            ),
            ["us-central1"],
        )
    assert sandbox.calls() == []


def test_a_credentials_fault_on_a_launch(sandbox, gcp_adapter):
    sandbox.faults.inject("credentials", times=1)

    with pytest.raises(CredentialsRejected):
        gcp_adapter().launch(_spec())
    assert sandbox.instances() == []


# ------------------------------------------------------------------------------------------------ launch


def test_launch_creates_a_labelled_instance_that_becomes_running(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    spec = _spec(tags={"Team": "vision"})

    handle = adapter.launch(spec)

    assert handle.state is InstanceState.PENDING
    assert handle.instance_id == f"us-central1-a/{mapping.instance_name('ord-1-a1')}"
    [held] = sandbox.instances()
    assert (held.instance_type, held.labels, held.request_id) == (
        "n1-standard-4+1xT4",
        {"broker-order": "ord-1", "team": "vision"},
        mapping.request_id("insert", "ord-1-a1"),
    )
    running = _settle(adapter, handle)
    assert (running.state, running.instance_type, running.zone) == (
        InstanceState.RUNNING,
        "n1-standard-4+1xT4",
        "us-central1-a",
    )
    assert running.public_ip and running.private_ip
    assert running.extra["client_token"] == "ord-1-a1"


def test_a_spot_launch_asks_for_spot_and_deletion_on_preemption(sandbox, gcp_adapter):
    gcp_adapter().launch(_spec(zone="us-central1-b", instance_type="a2-highgpu-1g", pricing_model=PricingModel.SPOT))

    [held] = sandbox.instances()
    assert held.provisioning_model == "SPOT"
    operations = sandbox.operations()
    assert [o["operationType"] for o in operations] == ["insert"]


def test_relaunch_after_gcp_forgot_the_request_id_returns_the_existing_instance(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    first = _settle(adapter, adapter.launch(_spec()))
    sandbox.forget_request_ids()

    again = adapter.launch(_spec())

    assert again.instance_id == first.instance_id
    assert len(sandbox.instances()) == 1
    assert len(sandbox.calls("compute.instances.insert")) == 2


def test_a_name_taken_by_another_order_is_not_adopted(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    adapter.launch(_spec())
    sandbox.forget_request_ids()

    with pytest.raises(ProviderRequestRejected) as raised:
        adapter.launch(_spec(order_ref="ord-2"))
    assert raised.value.code == "alreadyExists"


def test_the_launch_is_never_retried(sandbox, gcp_adapter):
    sandbox.faults.inject("throttle", times=1)

    with pytest.raises(TransientProviderError) as raised:
        gcp_adapter().launch(_spec())

    assert raised.value.code == "RATE_LIMIT_EXCEEDED"
    assert len(sandbox.calls("compute.instances.insert")) == 1
    assert sandbox.instances() == []


def test_a_slow_launch_times_out_once(sandbox, gcp_adapter):
    sandbox.faults.inject("slow", seconds=3, times=1)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as raised:
        gcp_adapter(read_timeout="0.3").launch(_spec())

    assert time.monotonic() - started < 2
    assert raised.value.code == "ReadTimeout"
    assert len(sandbox.calls("compute.instances.insert")) == 1


@pytest.mark.parametrize(
    ("kind", "code", "error", "expected_code"),
    [
        ("capacity", None, CapacityUnavailable, "ZONE_RESOURCE_POOL_EXHAUSTED"),
        (
            "capacity",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            CapacityUnavailable,
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        ),
        ("quota", "operation:QUOTA_EXCEEDED", QuotaExceeded, "QUOTA_EXCEEDED"),
        ("throttle", "RESOURCE_OPERATION_RATE_EXCEEDED", TransientProviderError, "RESOURCE_OPERATION_RATE_EXCEEDED"),
    ],
)
def test_failures_on_the_operation_show_in_describe(sandbox, gcp_adapter, kind, code, error, expected_code):
    adapter = gcp_adapter()
    sandbox.faults.inject(kind, code=code, zone="us-central1-a")

    handle = adapter.launch(_spec())
    failed = _settle(adapter, handle)

    assert failed.state is InstanceState.FAILED
    assert (failed.extra["error_class"], failed.extra["error_code"]) == (error.error_class, expected_code)
    assert failed.extra["error_message"]
    assert sandbox.instances() == []
    # The same token again: GCP answers with the failed operation, which now raises at once.
    with pytest.raises(error):
        adapter.launch(_spec())


def test_a_synchronous_quota_error_raises_and_creates_nothing(sandbox, gcp_adapter):
    sandbox.faults.inject("quota", instance_type="n1-standard-4+1xT4")

    with pytest.raises(QuotaExceeded) as raised:
        gcp_adapter().launch(_spec())

    assert raised.value.code == "QUOTA_EXCEEDED"
    assert raised.value.http_status == 403
    assert sandbox.instances() == []


@pytest.mark.parametrize(
    "spec",
    [
        _spec(pricing_model=PricingModel.RESERVED),
        _spec(zone="europe-west4-a", instance_type="n1-standard-4+1xK80"),
        LaunchSpec("us-central1", "europe-west4-a", "a2-highgpu-1g", PricingModel.ON_DEMAND, "t", "o"),
        _spec(attempt=""),
    ],
)
def test_invalid_launches_are_rejected_without_a_call(sandbox, gcp_adapter, spec):
    with pytest.raises(ProviderRequestRejected):
        gcp_adapter().launch(spec)
    assert sandbox.calls("compute.instances.insert") == []


def test_gcp_refusing_the_request_is_final(sandbox, gcp_adapter):
    # n1-standard-8 is not offered in us-central1-a: GCP's 400 "invalid".
    with pytest.raises(ProviderRequestRejected) as raised:
        gcp_adapter().launch(_spec(instance_type="n1-standard-8+1xT4"))
    assert (raised.value.code, raised.value.http_status) == ("invalid", 400)


# ------------------------------------------------------------------------------------- describe / find


def test_describe_of_an_unknown_instance_is_rejected(gcp_adapter):
    with pytest.raises(ProviderRequestRejected) as raised:
        gcp_adapter().describe("us-central1", "us-central1-a/gb-nobody")
    assert raised.value.code == "notFound"


def test_find_by_order_searches_every_region_of_the_account_only(gcp_adapter):
    adapter = gcp_adapter()
    adapter.launch(_spec("ord-7-a1", order_ref="ORD-7"))
    adapter.launch(_spec("ord-7-a2", order_ref="ORD-7", zone="europe-west4-a", instance_type="n1-standard-8+1xT4"))
    adapter.launch(_spec("ord-8-a1", order_ref="ORD-8"))

    found = adapter.find_by_order("ORD-7")

    assert [(h.region, h.instance_type) for h in found] == [
        ("europe-west4", "n1-standard-8+1xT4"),
        ("us-central1", "n1-standard-4+1xT4"),
    ]
    assert {h.extra["order_ref"] for h in found} == {"ORD-7"}
    assert [h.region for h in gcp_adapter(["europe-west4"]).find_by_order("ORD-7")] == ["europe-west4"]
    assert gcp_adapter().find_by_order("ORD-9") == []


# ----------------------------------------------------------------------------------------------- terminate


def test_terminate_deletes_and_is_idempotent(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    handle = _settle(adapter, adapter.launch(_spec()))

    stopping = adapter.terminate(handle.region, handle.instance_id)
    gone = _settle_terminated(adapter, stopping)
    again = adapter.terminate(handle.region, handle.instance_id)

    assert stopping.state is InstanceState.STOPPING
    assert (gone.state, again.state) == (InstanceState.TERMINATED, InstanceState.TERMINATED)
    assert sandbox.instances() == []
    assert Counter(o["operationType"] for o in sandbox.operations()) == {"insert": 1, "delete": 1}
    assert len(sandbox.calls("compute.instances.delete")) == 1


def _settle_terminated(adapter, handle, polls: int = 10):
    for _ in range(polls):
        if handle.state is InstanceState.TERMINATED:
            return handle
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


def test_terminating_a_pending_instance_finishes_its_insert_first(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    handle = adapter.launch(_spec())

    stopping = adapter.terminate(handle.region, handle.instance_id)

    assert stopping.state is InstanceState.STOPPING
    assert _settle_terminated(adapter, stopping).state is InstanceState.TERMINATED


def test_terminating_an_instance_gcp_never_had_writes_nothing(sandbox, gcp_adapter):
    result = gcp_adapter().terminate("us-central1", "us-central1-a/gb-ghost")

    assert result.state is InstanceState.TERMINATED
    assert sandbox.calls("compute.instances.delete") == []


# ------------------------------------------------------------------------------------------------ quotas


def _quoted_spec(adapter: GcpAdapter, attempt: str, *, pricing_model: PricingModel = PricingModel.ON_DEMAND):
    """A launch spec carrying what the adapter's own offer said (GPUs, vCPUs, accelerator type)."""
    [quote] = [
        q
        for q in adapter.list_offers()
        if (q.zone, q.instance_type, q.pricing_model) == ("us-central1-a", "n1-standard-4+1xT4", pricing_model)
    ]
    spec = _spec(attempt, pricing_model=pricing_model)
    return LaunchSpec(
        **{f: getattr(spec, f) for f in ("region", "zone", "instance_type", "pricing_model", "client_token")},
        order_ref=spec.order_ref,
        gpu_count=quote.gpu_count,
        vcpus=quote.vcpus,
        offer_extra=quote.extra,
    )


def test_the_quota_precheck_predicts_what_the_launch_would_answer(sandbox, gcp_adapter):
    adapter = gcp_adapter(regions=["us-central1"])
    sandbox.set_quota("NVIDIA_T4_GPUS", 1)
    first = _quoted_spec(adapter, "ord-1-a1")
    adapter.quota_check(first)  # room for one
    adapter.launch(first)

    second = _quoted_spec(adapter, "ord-2-a1")
    with pytest.raises(QuotaExceeded) as precheck:
        adapter.quota_check(second)
    assert precheck.value.code == "precheck"
    assert (
        str(precheck.value) == "gcp: precheck: quota NVIDIA_T4_GPUS in us-central1: 1 of 1 in use, the launch needs 1"
    )
    # Had the broker launched anyway, GCP would have refused it for the same quota.
    with pytest.raises(QuotaExceeded) as launch:
        adapter.launch(second)
    assert "NVIDIA_T4_GPUS" in str(launch.value)
    assert len(sandbox.instances()) == 1


def test_spot_counts_against_the_preemptible_quota_where_the_project_has_one(sandbox, gcp_adapter):
    adapter = gcp_adapter(regions=["us-central1"])
    sandbox.set_quota("NVIDIA_T4_GPUS", 0)
    spot = _quoted_spec(adapter, "ord-1-a1", pricing_model=PricingModel.SPOT)
    adapter.quota_check(spot)  # PREEMPTIBLE_NVIDIA_T4_GPUS still has room

    sandbox.set_quota("PREEMPTIBLE_NVIDIA_T4_GPUS", 0)  # no preemptible quota: spot uses the standard one
    with pytest.raises(QuotaExceeded, match="quota NVIDIA_T4_GPUS in us-central1: 0 of 0 in use"):
        adapter.quota_check(spot)


def test_quota_needs_skip_what_the_provider_does_not_report():
    quotas = catalog.quota_uses({"quotas": [{"metric": "CPUS", "limit": 24, "usage": 20}, {"metric": "bad"}]})
    assert set(quotas) == {"CPUS"}
    assert catalog.quota_needs(quotas, "nvidia-unknown", 1, 8, spot=False) == {"CPUS": 8}
    assert catalog.quota_needs(quotas, "nvidia-l4", 2, 0, spot=True) == {"NVIDIA_L4_GPUS": 2}
