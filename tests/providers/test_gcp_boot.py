"""What a booted GCP launch carries, through the real google-cloud-compute against the GCP sandbox: metadata
``ssh-keys`` and ``startup-script``, a network tag and the order's VPC firewall rules, the boot disk size, and a
Deep Learning VM image resolved in the launch's zone; refused before launch when over GCP's documented limits,
and refused by the sandbox the way Compute Engine refuses them when sent anyway.

References (Compute Engine API v1 unless noted):
- Metadata: https://cloud.google.com/compute/docs/reference/rest/v1/instances (``items[].value`` at most 262144
  bytes; all keys and values under 512 KB)
- ssh-keys lines ``USERNAME:KEY_VALUE``: "Add SSH keys to VMs", https://cloud.google.com/compute/docs/connect/add-ssh-keys
- key types: "Create SSH keys", https://cloud.google.com/compute/docs/connect/create-ssh-keys
- Firewall: https://cloud.google.com/compute/docs/reference/rest/v1/firewalls; IPv4 or IPv6 per rule: "Use VPC
  firewall rules", https://cloud.google.com/firewall/docs/using-firewalls
- Deep Learning VM families: https://cloud.google.com/deep-learning-vm/docs/images; ``install-nvidia-driver``:
  https://cloud.google.com/deep-learning-vm/docs/cli
- Disk sizes: AttachedDiskInitializeParams.diskSizeGb (at least 10 GB); "Storage options" (64 TB),
  https://cloud.google.com/compute/docs/disks
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from providers.errors import ImageUnavailable, ProviderRequestRejected
from providers.gcp import launching, mapping
from providers.gcp.adapter import GcpAdapter
from providers.gcp.client import ClientSettings, GcpClient
from providers.launch import BootSpec, IngressRule
from providers.sshkeys import SshPublicKey
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, PricingModel
from sandboxes.boot import BootMode
from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox
from sandboxes.gcp.seed import REGION_ZONES
from tests.sshkeys import ecdsa_public, ed25519_public, parsed, rsa_public

PROJECT = "alice-gpus"
AdapterFactory = Callable[..., GcpAdapter]
DLVM_NEWEST = "common-cu129-ubuntu-2204-nvidia-580-v20260416"
DLVM_LINK = f"https://www.googleapis.com/compute/v1/projects/deeplearning-platform-release/global/images/{DLVM_NEWEST}"


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
    sandbox_server.booter.mode = BootMode.HOLD
    yield sandbox_server
    sandbox_server.reset()


@pytest.fixture
def gcp_adapter(sandbox, alice_key) -> AdapterFactory:
    def build(**options: str) -> GcpAdapter:
        values = {"service_account_json": alice_key, "project_id": PROJECT}
        credentials = Credentials(kind="gcp", values=values, endpoint_url=sandbox.url)
        return GcpAdapter(credentials, sorted(REGION_ZONES), options)

    return build


def _boot(**changes) -> BootSpec:
    boot = BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_gcp-boot-test-0123456789abcdefghijklmnopqrstuv",
        agent_sha256="cd" * 32,
        ssh_keys=parsed(ed25519_public(), rsa_public(), ecdsa_public()),
        ingress=(IngressRule(22, ("198.51.100.0/24",)), IngressRule(8000, ("198.51.100.0/24",))),
        disk_gb=200,
        workload={"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "env": [], "ports": [8000]},
    )
    return replace(boot, **changes)


def _spec(boot: BootSpec | None = None, *, attempt: str = "ord-alice1-a1", zone: str = "us-central1-a") -> LaunchSpec:
    # The sandbox seeds a T4 on an N1 host in both regions these tests use, on hosts of different sizes.
    host = "n1-standard-4" if zone.startswith("us-central1") else "n1-standard-8"
    return LaunchSpec(
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        instance_type=f"{host}+1xT4",
        pricing_model=PricingModel.ON_DEMAND,
        client_token=attempt,
        order_ref="ord-alice1",
        boot=boot,
    )


def _running(adapter: GcpAdapter, handle: InstanceHandle) -> InstanceHandle:
    for _ in range(20):
        if handle.state is InstanceState.RUNNING:
            break
        handle = adapter.describe(handle.region, handle.instance_id)
    return handle


def _metadata(sandbox: GcpSandbox, handle: InstanceHandle) -> dict[str, str]:
    body = sandbox.instance_resource(handle.instance_id)
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def _fake_keys(count: int) -> tuple[SshPublicKey, ...]:
    """Ed25519-shaped keys without generating them: only their size matters to the limits under test."""
    keys = []
    for _ in range(count):
        blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + os.urandom(32)
        line = "ssh-ed25519 " + base64.b64encode(blob).decode()
        keys.append(SshPublicKey("ssh-ed25519", line, "SHA256:test", 256))
    return tuple(keys)


# ----------------------------------------------------------------------------------------------- metadata


def test_the_keys_and_the_boot_script_travel_as_instance_metadata(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    spec = _spec(_boot())

    handle = adapter.launch(spec)
    metadata = _metadata(sandbox, handle)

    # startup-script: the raw script, a plain metadata string (no base64), run by the guest agent at boot.
    assert metadata["startup-script"].encode() == adapter.user_data(spec)
    # ssh-keys: one USERNAME:KEY_VALUE line per key ("Add SSH keys to VMs"), every OpenSSH type included.
    assert metadata["ssh-keys"].splitlines() == [f"gpu:{key.public_key}" for key in spec.boot.ssh_keys]
    assert adapter.launch_limits.native_key_types >= {"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256"}
    # The Deep Learning VM reads install-nvidia-driver=True (Deep Learning VM "command line" page).
    assert metadata["install-nvidia-driver"] == "True"
    assert metadata[mapping.ORDER_METADATA] == "ord-alice1"


def test_a_script_over_256_kib_is_refused_before_launch_with_a_field_error(gcp_adapter):
    adapter = gcp_adapter()
    script = "#!/bin/bash\n" + "echo 0123456789abcdef\n" * (262144 // 21 + 1)

    problems = adapter.launch_problems(_spec(_boot(workload={"kind": "script", "script": script, "env": []})))

    assert [p.field for p in problems] == ["launch.workload"]
    assert "262144" in problems[0].message and launching.METADATA_SOURCE in problems[0].message


def test_the_sandbox_refuses_a_startup_script_over_256_kib_as_compute_engine_does(sandbox, gcp_adapter):
    script = "#!/bin/bash\n" + "echo 0123456789abcdef\n" * (262144 // 21 + 1)

    with pytest.raises(ProviderRequestRejected) as raised:
        gcp_adapter().launch(_spec(_boot(workload={"kind": "script", "script": script, "env": []})))

    # Compute Engine's 400 for a long value: "Value for field 'resource.metadata.items[N].value' is too large".
    assert (raised.value.http_status, raised.value.code) == (400, "invalid")
    assert "is too large: maximum size 262144" in raised.value.message
    assert sandbox.instances() == []


def test_many_keys_overflow_the_startup_script_first(gcp_adapter):
    """The script carries every key twice (authorized_keys and the lease file), so it reaches 256 KiB long before
    the ssh-keys value or the 512 KB metadata total could."""
    adapter = gcp_adapter()
    spec = _spec(_boot(ssh_keys=_fake_keys(1_700)))

    problems = adapter.launch_problems(spec)

    assert [p.field for p in problems] == ["launch.workload"]
    assert len(launching.ssh_keys_value("gpu", spec.boot.ssh_keys).encode()) < launching.METADATA_VALUE_MAX_BYTES


# ------------------------------------------------------------------------------------------- image, disk


def test_the_default_image_is_the_newest_deep_learning_vm_image_of_the_family_in_the_zone(sandbox, gcp_adapter):
    handle = gcp_adapter().launch(_spec(_boot()))

    disk = sandbox.disk_resource(handle.zone, handle.instance_id.split("/")[1])
    assert disk["sourceImage"] == DLVM_LINK
    assert disk["sizeGb"] == "200"  # initializeParams.diskSizeGb, base-2 GB
    views = sandbox.calls("compute.imageFamilyViews.get")
    assert [(c.project, c.zone) for c in views] == [("deeplearning-platform-release", "us-central1-a")]


def test_the_account_image_option_still_overrides_the_default(sandbox, gcp_adapter):
    handle = gcp_adapter(image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts").launch(_spec(_boot()))

    assert sandbox.disk_resource(handle.zone, handle.instance_id.split("/")[1])["sourceImage"].endswith(
        "/projects/ubuntu-os-cloud/global/images/ubuntu-2204-jammy-v20260401"
    )
    assert "install-nvidia-driver" not in _metadata(sandbox, handle)  # only Deep Learning VM images read it


@pytest.mark.parametrize("form", ["alice-images/my-cuda", "projects/alice-images/global/images/family/my-cuda"])
def test_a_buyers_image_family_is_resolved_in_the_zone_and_booted(sandbox, gcp_adapter, form):
    image = sandbox.add_image("alice-images", "my-cuda-v2", family="my-cuda", disk_size_gb=80)

    handle = gcp_adapter().launch(_spec(_boot(image=form)))

    assert sandbox.disk_resource(handle.zone, handle.instance_id.split("/")[1])["sourceImage"] == image["selfLink"]


def test_a_buyers_image_missing_from_the_region_fails_before_anything_is_created(sandbox, gcp_adapter):
    sandbox.add_image("alice-images", "my-cuda-v2", family="my-cuda", zones=["europe-west4-a"])

    with pytest.raises(ImageUnavailable) as raised:
        gcp_adapter().launch(_spec(_boot(image="alice-images/my-cuda")))

    assert "us-central1" in str(raised.value)
    assert sandbox.instances() == [] and sandbox.firewall_rules() == []
    assert sandbox.calls("compute.firewalls.insert") == sandbox.calls("compute.instances.insert") == []


def test_a_missing_image_by_name_is_image_unavailable(sandbox, gcp_adapter):
    with pytest.raises(ImageUnavailable):
        gcp_adapter().launch(_spec(_boot(image="projects/alice-images/global/images/gone-v1")))

    assert sandbox.calls("compute.instances.insert") == []


def test_an_image_fault_answers_404_like_a_missing_family(sandbox, gcp_adapter):
    sandbox.faults.inject("image_missing", region="us-central1")

    with pytest.raises(ImageUnavailable) as raised:
        gcp_adapter().launch(_spec(_boot()))
    other_region = gcp_adapter().launch(_spec(_boot(), attempt="ord-alice1-a2", zone="europe-west4-a"))

    assert raised.value.code == "notFound"
    assert other_region.state is InstanceState.PENDING


def test_a_disk_smaller_than_the_image_is_refused_before_the_insert(sandbox, gcp_adapter):
    sandbox.add_image("alice-images", "big-v1", family="big", disk_size_gb=300)

    with pytest.raises(ProviderRequestRejected) as raised:
        gcp_adapter().launch(_spec(_boot(image="alice-images/big", disk_gb=200)))

    assert "300 GB" in raised.value.message
    assert sandbox.calls("compute.instances.insert") == []


def test_a_disk_outside_10_to_65536_gb_is_refused_before_launch(gcp_adapter):
    adapter = gcp_adapter()

    assert [p.field for p in adapter.launch_problems(_spec(_boot(disk_gb=9)))] == ["launch.disk_gb"]
    assert [p.field for p in adapter.launch_problems(_spec(_boot(disk_gb=65537)))] == ["launch.disk_gb"]
    assert adapter.launch_problems(_spec(_boot(disk_gb=65536))) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://www.googleapis.com/compute/v1/projects/p-1/global/images/img-1", ("p-1", "img-1", "")),
        ("projects/p-1/global/images/family/fam", ("p-1", "", "fam")),
        ("global/images/img-2", (PROJECT, "img-2", "")),
        ("p-1/fam", ("p-1", "", "fam")),
        ("img-3", (PROJECT, "img-3", "")),
    ],
)
def test_image_references_in_every_documented_form(value, expected):
    ref = launching.image_ref(value, PROJECT)

    assert (ref.project, ref.name, ref.family) == expected


def test_an_unreadable_image_reference_is_a_field_error(gcp_adapter):
    problems = gcp_adapter().launch_problems(_spec(_boot(image="ami-0123456789abcdef0/x/y")))

    assert [p.field for p in problems] == ["launch.image"]


# ------------------------------------------------------------------------------------------------ firewall


def test_the_orders_firewall_lets_only_the_buyers_ranges_reach_its_tagged_instance(sandbox, gcp_adapter):
    handle = gcp_adapter().launch(_spec(_boot()))
    body = sandbox.instance_resource(handle.instance_id)
    rules = {rule["name"]: rule for rule in sandbox.firewall_rules(PROJECT)}

    assert body["tags"]["items"] == ["gb-ord-alice1"]
    allow = rules[next(name for name in rules if not name.endswith("-deny"))]
    deny = rules["gbfw-ord-alice1-deny"]
    assert allow["name"].startswith("gbfw-ord-alice1-") and len(allow["name"]) <= 63  # RFC 1035, 1-63 characters
    assert (allow["direction"], allow["priority"], allow["targetTags"]) == ("INGRESS", 1000, ["gb-ord-alice1"])
    assert allow["sourceRanges"] == ["198.51.100.0/24"]
    assert allow["allowed"] == [{"IPProtocol": "tcp", "ports": ["22", "8000"]}]
    assert "broker-order=ord-alice1" in allow["description"]  # firewall rules have no labels
    # Everyone else is kept out ahead of the default network's default-allow-ssh (priority 65534).
    assert (deny["priority"], deny["sourceRanges"], deny["denied"]) == (1001, ["0.0.0.0/0"], [{"IPProtocol": "all"}])
    assert sandbox.lets_in(handle.instance_id) == {(22, "198.51.100.0/24"), (8000, "198.51.100.0/24")}


def test_ports_open_to_different_ranges_get_their_own_rules_and_ip_versions_are_split(sandbox, gcp_adapter):
    ingress = (
        IngressRule(22, ("198.51.100.7/32", "2001:db8::/48")),
        IngressRule(8000, ("203.0.113.0/24",)),
    )
    handle = gcp_adapter().launch(_spec(_boot(ingress=ingress)))

    allows = [r for r in sandbox.firewall_rules(PROJECT) if r.get("allowed")]
    assert sorted((r["sourceRanges"], r["allowed"][0]["ports"]) for r in allows) == [
        (["198.51.100.7/32"], ["22"]),
        (["2001:db8::/48"], ["22"]),
        (["203.0.113.0/24"], ["8000"]),
    ]
    assert (8000, "198.51.100.7/32") not in sandbox.lets_in(handle.instance_id)


def test_a_repeated_launch_and_a_failover_reuse_the_orders_rules(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    first = adapter.launch(_spec(_boot()))
    again = adapter.launch(_spec(_boot()))
    elsewhere = adapter.launch(_spec(_boot(), attempt="ord-alice1-a2", zone="europe-west4-a"))

    assert again.instance_id == first.instance_id != elsewhere.instance_id
    assert len(sandbox.calls("compute.firewalls.insert")) == 2  # one allow rule, one deny rule: rules are global
    assert len(sandbox.firewall_rules(PROJECT)) == 2
    assert [(r.kind, r.region) for r in adapter.list_order_resources()] == [
        ("firewall", "global"),
        ("firewall_deny", "global"),
    ]


def test_release_deletes_only_the_orders_rules_and_is_idempotent(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    adapter.launch(_spec(_boot()))
    other = replace(_spec(_boot(), attempt="ord-bob1-a1"), order_ref="ord-bob1")
    adapter.launch(other)

    remaining = adapter.release_order_resources("ord-alice1")
    again = adapter.release_order_resources("ord-alice1")

    assert remaining == again == []
    assert {r.order_ref for r in adapter.list_order_resources()} == {"ord-bob1"}
    assert len(sandbox.calls("compute.firewalls.delete")) == 2


def test_a_bare_launch_is_unchanged(sandbox, gcp_adapter):
    handle = gcp_adapter().launch(_spec(None))

    body = sandbox.instance_resource(handle.instance_id)
    assert set(_metadata(sandbox, handle)) == {mapping.IDEMPOTENCY_METADATA, mapping.ORDER_METADATA}
    assert "items" not in body["tags"]
    disk = sandbox.disk_resource(handle.zone, body["name"])
    assert disk["sizeGb"] == "100"
    assert disk["sourceImage"].endswith("/projects/ubuntu-os-cloud/global/images/ubuntu-2204-jammy-v20260401")
    assert [c.action for c in sandbox.calls()] == ["compute.instances.insert"]


# ---------------------------------------------------------------------------------------------- booting


def test_the_running_instance_boots_the_lease_agent_with_its_gpus(sandbox, gcp_adapter):
    adapter = gcp_adapter()
    spec = _spec(_boot())

    handle = _running(adapter, adapter.launch(spec))
    machine = sandbox.booter.machine(handle.instance_id)
    adapter.terminate(handle.region, handle.instance_id)
    for _ in range(20):
        if adapter.describe(handle.region, handle.instance_id).state is InstanceState.TERMINATED:
            break

    assert machine.lease["login_user"] == "gpu"
    assert [(g.name, g.memory_gb) for g in machine.executor.gpus()] == [("Tesla T4", 16)]
    assert sandbox.booter.machines() == []  # halted with its instance


def test_the_deny_rule_closes_the_default_networks_ssh_to_everyone_else(sandbox, gcp_adapter):
    """A project's default network allows SSH from anywhere (default-allow-ssh, priority 65534); the order's deny
    rule (1001) sits between it and the buyer's allow rule (1000)."""
    sandbox.add_firewall(
        PROJECT,
        {
            "name": "default-allow-ssh",
            "network": "global/networks/default",
            "priority": 65534,
            "sourceRanges": ["0.0.0.0/0"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        },
    )

    bare = gcp_adapter().launch(_spec(None, attempt="ord-alice1-bare"))
    booted = gcp_adapter().launch(_spec(_boot()))

    assert sandbox.lets_in(bare.instance_id) == {(22, "0.0.0.0/0")}
    assert sandbox.lets_in(booted.instance_id) == {(22, "198.51.100.0/24"), (8000, "198.51.100.0/24")}


def test_a_rule_a_concurrent_twin_is_still_creating_counts_as_created(sandbox, gcp_adapter, alice_key):
    adapter = gcp_adapter()
    group = launching.firewall_groups(_boot().ingress)[0]
    twin = launching.firewall_allow_resource("ord-alice1", group, launching.DEFAULT_NETWORK)
    other_worker = GcpClient(ClientSettings(PROJECT, json.loads(alice_key), endpoint_url=sandbox.url))
    # Another worker's insert of the same rule, under its own request id, not done yet: GET still answers 404.
    other_worker.firewall_insert(twin, "8a1d2b3c-4e5f-4a6b-8c7d-9e0f1a2b3c4d")

    handle = adapter.launch(_spec(_boot()))

    assert handle.state is InstanceState.PENDING
    assert len(sandbox.calls("compute.firewalls.insert")) == 3  # the twin's, ours (409 alreadyExists), the deny rule
    sandbox.settle()
    assert {r["name"] for r in sandbox.firewall_rules(PROJECT)} == {twin["name"], "gbfw-ord-alice1-deny"}
