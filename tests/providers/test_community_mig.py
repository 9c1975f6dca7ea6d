"""MIG slices on the reference host agent: a slice lease gets a MIG device made for it alone and sees only that,
two slices never over-fill a GPU, a whole lease never gets a sliced GPU, and a terminate destroys the device.

Facts from NVIDIA's Multi-Instance GPU User Guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/):
"Supported MIG Profiles" gives each profile's fraction of SMs (N/7 for ``Ng``), its memory and its "Number of
Instances Available" (H100 80GB: 1g.10gb 7, 1g.20gb 4, 2g.20gb 3, 3g.40gb 2, 4g.40gb 1, 7g.80gb 1; A100 40GB
the same counts for 1g.5gb to 7g.40gb); ``nvidia-smi mig -lgipp`` lists where each may start in the GPU's 8
memory slices (``{0,1,2,3,4,5,6}:1``, ``{0,2,4,6}:2``, ``{0,2,4}:2``, ``{0,4}:4``, ``{0}:4``, ``{0}:8``);
"Creating GPU Instances" makes one with ``nvidia-smi mig -cgi <profile> -C`` ("Successfully created GPU
instance ID  N on GPU  0 using profile ..." then the compute instance), and "Destroying GPU Instances" removes
the compute instances (``-dci``) before the GPU instance (``-dgi``)."""

from __future__ import annotations

import json
import stat
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from werkzeug.test import Client

from providers.boot import render_boot_script
from providers.community import protocol
from providers.community.agent import Agent
from providers.community.devices import MigDevice, NvidiaDevices, visible_devices
from providers.community.executor_base import ExecutorError
from providers.community.host_gpus import parse_simulated
from providers.community.mig import MIG_TABLES, mig_place, mig_table_for_memory
from providers.launch import BootSpec

KEY_ID, SECRET = "mk_h100host", "s3cret-of-the-machine"
SOLD = ("1g.10gb", "2g.20gb", "3g.40gb")  # what this host's listing sells as slices


# --- NVIDIA's table -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, expected",
    [
        (
            "H100-SXM5",
            [("1g.10gb", Fraction(1, 7), 10, 7), ("1g.20gb", Fraction(1, 7), 20, 4), ("2g.20gb", Fraction(2, 7), 20, 3),
             ("3g.40gb", Fraction(3, 7), 40, 2), ("4g.40gb", Fraction(4, 7), 40, 1), ("7g.80gb", Fraction(1), 80, 1)],
        ),
        (
            "A100-40GB-SXM4",
            [("1g.5gb", Fraction(1, 7), 5, 7), ("1g.10gb", Fraction(1, 7), 10, 4), ("2g.10gb", Fraction(2, 7), 10, 3),
             ("3g.20gb", Fraction(3, 7), 20, 2), ("4g.20gb", Fraction(4, 7), 20, 1), ("7g.40gb", Fraction(1), 40, 1)],
        ),
    ],
)  # fmt: skip
def test_each_profile_is_its_share_of_compute_its_memory_and_nvidias_count_per_gpu(model, expected):
    table = MIG_TABLES[model]
    assert [(p.name, p.share, p.memory_gb, p.per_gpu) for p in table.values()] == expected
    # The count per GPU is what fits in the placements ``nvidia-smi mig -lgipp`` lists, and 7 // N at most.
    assert all(p.fits(set()) == p.per_gpu <= 7 // p.compute_slices for p in table.values())


def test_slices_that_share_no_memory_slice_never_hold_more_than_seven_compute_slices():
    """Every way of filling one GPU, profile by profile, at NVIDIA's placements."""
    profiles = list(MIG_TABLES["H100-SXM5"].values())
    worst = 0
    stack: list[tuple[set[int], int]] = [(set(), 0)]
    while stack:
        taken, compute = stack.pop()
        worst = max(worst, compute)
        for profile in profiles:
            start = profile.place(taken)
            if start is not None:
                stack.append((taken | set(profile.slots(start)), compute + profile.compute_slices))
    assert worst == 7


def test_a_slice_packs_onto_the_fullest_gpu_it_fits_before_a_fresh_one():
    three = MIG_TABLES["H100-SXM5"]["3g.40gb"]
    one = MIG_TABLES["H100-SXM5"]["1g.10gb"]
    # GPU 0 leased whole, GPU 1 has a 3g at slice 0, GPU 2 a 1g at slice 0, GPU 3 nothing.
    taken = {0: set(range(8)), 1: {0, 1, 2, 3}, 2: {0}}
    assert mig_place(taken, three, 4) == (1, 4)
    assert mig_place(taken, one, 4) == (1, 4)
    assert mig_place({0: set(range(8)), 1: set(range(8))}, one, 3) == (2, 0)
    assert mig_place({0: set(range(8))}, one, 1) is None


# --- The agent -----------------------------------------------------------------------------------------------------


@pytest.fixture
def host() -> Iterator[Agent]:
    with tempfile.TemporaryDirectory(prefix="agent-data-") as data_dir:
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET,
                      simulated=parse_simulated("H100:80x2"), launch_seconds=0, lease_threads=False,
                      data_dir=Path(data_dir), grace_s=30, disk_poll_s=None, mig_profiles=SOLD)  # fmt: skip
        agent.public_url = "http://127.0.0.1:7070"
        yield agent
        for instance in list(agent.instances.values()):
            agent._end_lease(instance)


def _call(agent: Agent, method: str, path: str, payload: dict | None = None):
    body = json.dumps(payload).encode() if payload is not None else b""
    answer = Client(agent).open(
        path, method=method, data=body, headers=protocol.sign(KEY_ID, SECRET, method, path, body)
    )
    return answer.status_code, answer.get_json()


def _launch(agent: Agent, token: str, profile: object, indexes: object = None, *, gpus: int = 1, boot: str = ""):
    payload: dict = {"client_token": token, "order_ref": "ord-1", "gpus": gpus, "mig_profile": profile}
    if indexes is not None:
        payload["gpu_indexes"] = indexes
    if boot:
        payload["boot"] = boot
    return _call(agent, "POST", "/v1/instances", payload)


def _boot(script: str) -> str:
    spec = BootSpec(broker_url="http://127.0.0.1:9", boot_token="bt", agent_sha256="0" * 64, ssh_keys=(), ingress=(),
                    workload={"kind": "script", "script": script})  # fmt: skip
    return render_boot_script(spec, login_user="lease").decode()


def _wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def test_each_slice_lease_gets_a_mig_device_of_its_own_and_its_workload_sees_only_that(host):
    script = 'echo "$CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES" > seen\nexec sleep 300\n'
    first_status, first = _launch(host, "ord-1-a1", "3g.40gb", [0], boot=_boot(script))
    second_status, second = _launch(host, "ord-2-a1", "3g.40gb", [0], boot=_boot(script))

    assert (first_status, second_status) == (201, 201)
    assert (first["gpu_indexes"], first["mig_profile"], second["gpu_indexes"]) == ([0], "3g.40gb", [0])
    leases = [host.instances[first["id"]], host.instances[second["id"]]]
    assert [(i.mig_slots, i.mig_device.gpu_index) for i in leases] == [((0, 1, 2, 3), 0), ((4, 5, 6, 7), 0)]
    uuids = [i.mig_device.uuid for i in leases]
    assert host.devices.mig_instances() == {0: uuids}
    for lease, uuid in zip(leases, uuids, strict=True):
        executor = lease.executor
        assert executor.visible() == [uuid]
        # The lease agent starts the workload once the broker answers its claim: the buyer's own variable
        # cannot widen it to the other slice.
        executor.start({"kind": "script", "script": script, "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]},
                       {}, "lease")  # fmt: skip
        assert _wait_for(executor.plan.work_dir / "seen") == f"{uuid} {uuid}\n"


def test_a_slice_that_would_overfill_a_gpu_is_refused_and_an_unnamed_one_packs(host):
    assert _launch(host, "ord-1-a1", "3g.40gb", [0])[0] == 201
    assert _launch(host, "ord-2-a1", "3g.40gb", [0])[0] == 201

    status, refused = _launch(host, "ord-3-a1", "1g.10gb", [0])

    assert (status, refused["code"]) == (409, "gpus_busy")
    assert refused["message"] == "GPU 0 has no room for a 1g.10gb: its memory slices [0, 1, 2, 3, 4, 5, 6, 7] are held"
    # Unnamed, a slice goes where it fits: GPU 1, then beside it there, not on a fresh GPU.
    placed = [_launch(host, f"ord-{n}-a1", "1g.10gb")[1] for n in (4, 5)]
    assert [(p["gpu_indexes"], host.instances[p["id"]].mig_slots) for p in placed] == [([1], (0,)), ([1], (1,))]
    assert _launch(host, "ord-6-a1", "2g.20gb", [1])[1]["id"] in host.instances
    assert sorted(s for i in host.instances.values() if i.gpu_indexes == (1,) for s in i.mig_slots) == [0, 1, 2, 3]
    assert len(host.devices.created) == 5


def test_a_whole_gpu_lease_never_gets_a_sliced_gpu_nor_a_slice_a_gpu_leased_whole(host):
    assert _launch(host, "ord-1-a1", "1g.10gb", [0])[0] == 201
    status, whole = _call(host, "POST", "/v1/instances", {"client_token": "ord-2-a1", "gpus": 1, "gpu_indexes": [0]})
    assert (status, whole["code"], whole["message"]) == (409, "gpus_busy", "GPUs [0] are held by another lease")
    status, whole = _call(host, "POST", "/v1/instances", {"client_token": "ord-3-a1", "gpus": 2})
    assert (status, whole["code"]) == (409, "no_capacity")

    assert _call(host, "POST", "/v1/instances", {"client_token": "ord-4-a1", "gpus": 1})[1]["gpu_indexes"] == [1]
    status, refused = _launch(host, "ord-5-a1", "1g.10gb", [1])
    assert (status, refused["code"]) == (409, "gpus_busy")
    status, packed = _launch(host, "ord-6-a1", "3g.40gb")  # beside the 1g on GPU 0, at memory slice 4
    assert (status, packed["gpu_indexes"], host.instances[packed["id"]].mig_slots) == (201, [0], (4, 5, 6, 7))
    status, refused = _launch(host, "ord-7-a1", "3g.40gb")
    assert (status, refused["code"], refused["message"]) == (409, "gpus_busy", "no GPU has room for a 3g.40gb")
    assert len(host.devices.created) == 2


@pytest.mark.parametrize(
    "profile, extra, message",
    [
        ("4g.40gb", {}, "mig_profile: this machine offers 1g.10gb, 2g.20gb, 3g.40gb; not '4g.40gb'"),
        ("1g.5gb", {}, "mig_profile: this machine offers 1g.10gb, 2g.20gb, 3g.40gb; not '1g.5gb'"),
        (["3g.40gb"], {}, "mig_profile: this machine offers 1g.10gb, 2g.20gb, 3g.40gb; not \"['3g.40gb']\""),
        ("3g.40gb", {"gpus": 2}, "mig_profile: a MIG slice is one GPU's; gpus is 2"),
        ("3g.40gb", {"gpu_indexes": [0, 1]}, "gpu_indexes: one GPU from 0 to 1 for a MIG slice"),
        ("3g.40gb", {"gpu_indexes": [2]}, "gpu_indexes: one GPU from 0 to 1 for a MIG slice"),
    ],
)
def test_a_profile_the_machine_does_not_sell_or_a_slice_out_of_shape_is_refused_by_name(host, profile, extra, message):
    payload = {"client_token": "ord-1-a1", "gpus": 1, "mig_profile": profile, **extra}

    status, refused = _call(host, "POST", "/v1/instances", payload)

    assert (status, refused) == (400, {"code": "invalid", "message": message})
    assert host.instances == {} and host.devices.created == [] and host.devices.mig_instances() == {}


def test_terminating_a_slice_destroys_its_mig_device_and_frees_its_memory_slices(host):
    _, first = _launch(host, "ord-1-a1", "3g.40gb", [0], boot=_boot("exec sleep 300\n"))
    _, second = _launch(host, "ord-2-a1", "3g.40gb", [0])
    kept = host.instances[second["id"]].mig_device.uuid

    status, ended = _call(host, "DELETE", f"/v1/instances/{first['id']}")

    assert (status, ended["state"], ended["cleanup"]["mig_device_destroyed"]) == (200, "terminated", True)
    assert host.devices.mig_instances() == {0: [kept]}
    status, again = _launch(host, "ord-3-a1", "2g.20gb", [0])  # the freed slices take another profile
    assert (status, host.instances[again["id"]].mig_slots) == (201, (0, 1))
    # A repeat of a launch answers the same instance and makes no second device.
    status, repeat = _launch(host, "ord-3-a1", "2g.20gb", [0])
    assert (status, repeat["id"]) == (200, again["id"])
    assert len(host.devices.created) == 2


def test_an_agent_left_to_its_gpus_sells_every_profile_nvidia_lists_for_them():
    with tempfile.TemporaryDirectory(prefix="agent-data-") as data_dir:
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET,
                      simulated=parse_simulated("A100:40x1"), launch_seconds=0, lease_threads=False,
                      data_dir=Path(data_dir))  # fmt: skip
        assert mig_table_for_memory(40) is MIG_TABLES["A100-40GB-SXM4"]
        # "1g.10gb" on a 40 GB A100 is the 1g with two memory slices: four fit, at 0, 2, 4 and 6.
        placed = [_launch(agent, f"ord-{n}-a1", "1g.10gb") for n in range(5)]
        assert [(s, a.get("code")) for s, a in placed] == [(201, None)] * 4 + [(409, "gpus_busy")]
        assert [agent.instances[a["id"]].mig_slots for _, a in placed[:4]] == [(0, 1), (2, 3), (4, 5), (6, 7)]
        status, refused = _launch(agent, "ord-9-a1", "1g.20gb")
        assert (status, refused["message"]) == (
            400,
            "mig_profile: this machine offers 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; not '1g.20gb'",
        )
        agent.stop()


def test_a_lease_of_a_slice_sees_its_own_device_whatever_else_the_gpu_holds():
    mig = {0: ["MIG-host-made"], 1: ["MIG-other"]}
    assert visible_devices((0,), mig, ("MIG-mine",)) == ["MIG-mine"]
    assert visible_devices((0, 2), mig) == ["MIG-host-made", "2"]


# --- nvidia-smi ---------------------------------------------------------------------------------------------------

# Stands in for the driver's nvidia-smi: the commands NvidiaDevices sends, answered in the wording of NVIDIA's
# guide, with the host's MIG devices kept in a JSON file beside it.
_FAKE_SMI = """\
import json, sys, uuid
state_path = {state!r}
state = json.load(open(state_path))
args = sys.argv[1:]
state["calls"].append(args)
out = ""
if args == ["-L"]:
    for gpu in range(state["gpus"]):
        out += "GPU %d: NVIDIA H100 80GB HBM3 (UUID: GPU-%08d)\\n" % (gpu, gpu)
        for n, d in enumerate(d for d in state["devices"] if d["gpu"] == gpu):
            out += "  MIG %s     Device  %d: (UUID: %s)\\n" % (d["profile"], n, d["uuid"])
elif args[:1] == ["mig"] and "-cgi" in args:
    gpu, profile = int(args[args.index("-i") + 1]), args[args.index("-cgi") + 1]
    if state.get("refuse"):
        json.dump(state, open(state_path, "w"))
        sys.stderr.write("Unable to create a GPU instance on GPU  %d using profile %s: Insufficient Resources\\n"
                         % (gpu, profile))
        sys.exit(2)
    gi = 1 + max([d["gi"] for d in state["devices"]] or [0])
    state["devices"].append({{"gpu": gpu, "gi": gi, "profile": profile, "uuid": "MIG-" + str(uuid.uuid4())}})
    out = ("Successfully created GPU instance ID  %d on GPU  %d using profile MIG %s (ID  9)\\n"
           "Successfully created compute instance ID  0 on GPU  %d GPU instance ID  %d using profile MIG %s (ID  2)\\n"
           % (gi, gpu, profile, gpu, gi, profile))
elif args[:1] == ["mig"] and "-dci" in args:
    out = "Successfully destroyed compute instance ID  0 from GPU  %s GPU instance ID  %s\\n" % (args[2], args[4])
elif args[:1] == ["mig"] and "-dgi" in args:
    gpu, gi = int(args[2]), int(args[4])
    state["devices"] = [d for d in state["devices"] if not (d["gpu"] == gpu and d["gi"] == gi)]
    out = "Successfully destroyed GPU instance ID  %d from GPU  %d\\n" % (gi, gpu)
json.dump(state, open(state_path, "w"))
sys.stdout.write(out)
"""


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch) -> Path:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"gpus": 2, "devices": [], "calls": []}))
    binary = tmp_path / "nvidia-smi"
    binary.write_text(f"#!{sys.executable}\n" + textwrap.dedent(_FAKE_SMI.format(state=str(state))))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return state


def test_on_a_real_host_the_mig_device_is_made_and_destroyed_with_nvidia_smi(nvidia_smi):
    devices = NvidiaDevices()

    device = devices.mig_create(1, "3g.40gb")

    assert device == MigDevice(1, devices.mig_instances()[1][0], gpu_instance=1, compute_instance=0)
    devices.mig_destroy(device)
    assert devices.mig_instances() == {}
    calls = json.loads(nvidia_smi.read_text())["calls"]
    assert [c for c in calls if c != ["-L"]] == [
        ["mig", "-i", "1", "-cgi", "3g.40gb", "-C"],
        ["mig", "-i", "1", "-gi", "1", "-dci"],
        ["mig", "-i", "1", "-gi", "1", "-dgi"],
    ]


def test_a_mig_device_the_driver_refuses_is_an_error_naming_why_and_leaves_nothing(nvidia_smi):
    state = json.loads(nvidia_smi.read_text())
    nvidia_smi.write_text(json.dumps({**state, "refuse": True}))

    with pytest.raises(ExecutorError, match="Insufficient Resources"):
        NvidiaDevices().mig_create(0, "7g.80gb")

    assert NvidiaDevices().mig_instances() == {}
