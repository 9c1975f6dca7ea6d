"""The boot script and the lease agent a machine fetches: what the script carries (and does not), that bash
reads it, that a sandbox reads the lease back from the bytes a cloud stores, and that the zipapp runs on a
bare Python."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys

import pytest

from providers.boot import (
    AGENT_UNIT,
    AGENT_UNIT_FILE,
    BootScriptUnreadable,
    lease_file,
    lease_file_from_script,
    render_boot_script,
    user_data_problems,
)
from providers.community.bundle import agent_bundle, agent_bundle_sha256
from providers.community.executor_base import host_key_fingerprint
from providers.community.lease import EXIT_OVER
from providers.community.lease_executors import parse_simulated
from providers.launch import BootSpec, IngressRule, LaunchLimits, UserDataMeasure
from tests.machines import Machine
from tests.sshkeys import ed25519_public, parsed

SHA = hashlib.sha256(b"agent").hexdigest()


def _boot(**overrides) -> BootSpec:
    fields = {
        "broker_url": "https://broker.example",
        "boot_token": "bt_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG",
        "agent_sha256": SHA,
        "ssh_keys": parsed(ed25519_public()),
        "ingress": (IngressRule(22, ("198.51.100.7/32",)),),
        "workload": {"kind": "script", "script": "#!/bin/bash\necho 'it works' > /tmp/x\n", "env": []},
    }
    return BootSpec(**{**fields, **overrides})


def test_bash_reads_the_script_and_the_lease_comes_back_out_of_it_raw_or_base64():
    script = render_boot_script(_boot(), login_user="ubuntu", prelude="nvidia-smi || true")

    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True)

    assert checked.returncode == 0, checked.stderr
    lease = lease_file(_boot(), login_user="ubuntu")
    assert lease_file_from_script(script) == lease
    assert lease_file_from_script(base64.b64encode(script)) == lease
    assert script.startswith(b"#!/bin/bash\n") and b"nvidia-smi || true" in script
    assert f'echo "{SHA}  $BROKER_DIR/agent.pyz" | sha256sum -c --status -'.encode() in script


def test_the_same_attempt_renders_the_same_bytes():
    assert render_boot_script(_boot(), login_user="ubuntu") == render_boot_script(_boot(), login_user="ubuntu")


def test_a_container_workload_brings_a_container_runtime_and_a_script_does_not():
    container = render_boot_script(_boot(workload={"kind": "container", "image": "x/y:1"}), login_user="ubuntu")
    script = render_boot_script(_boot(), login_user="ubuntu")

    assert b"nvidia-container-toolkit" in container and b"nvidia-container-toolkit" not in script


@pytest.mark.parametrize(
    ("measure", "limit", "size_of"),
    [(UserDataMeasure.RAW, 500, len), (UserDataMeasure.BASE64, 500, lambda s: len(base64.b64encode(s)))],
)
def test_the_limit_is_measured_as_the_cloud_counts_it(measure, limit, size_of):
    limits = LaunchLimits(user_data_max_bytes=limit, user_data_measure=measure, user_data_field="UserData",
                          source="the cloud's reference")  # fmt: skip
    script = render_boot_script(_boot(), login_user="ubuntu")

    (problem,) = user_data_problems(script, limits)

    assert problem.field == "launch.workload"
    assert f"is {size_of(script)} bytes" in problem.message and "takes at most 500" in problem.message


@pytest.mark.parametrize("bad", [b"#!/bin/bash\necho hi\n", b"not base64 at all", base64.b64encode(b"echo hi")])
def test_user_data_the_broker_did_not_write_is_named_unreadable(bad):
    with pytest.raises(BootScriptUnreadable):
        lease_file_from_script(bad)


def test_nothing_the_script_carries_can_break_out_of_its_quoting():
    with pytest.raises(ValueError, match="plain user name"):
        render_boot_script(_boot(), login_user="root; rm -rf /")
    with pytest.raises(ValueError, match="plain http"):
        render_boot_script(_boot(broker_url="https://x'; curl evil'"), login_user="ubuntu")
    with pytest.raises(ValueError, match="boot token"):
        render_boot_script(_boot(boot_token="bt_x'; reboot; '"), login_user="ubuntu")
    hostile = _boot(workload={"kind": "script", "script": "BROKER_LEASE_JSON\n'; reboot; '\n", "env": []})
    script = render_boot_script(hostile, login_user="ubuntu")
    # The workload travels inside one line of JSON: no line of it can end the heredoc early.
    assert lease_file_from_script(script)["workload"]["script"] == "BROKER_LEASE_JSON\n'; reboot; '\n"


def test_the_agent_zipapp_runs_on_python_alone_and_its_hash_is_stable(tmp_path):
    path = tmp_path / "agent.pyz"
    path.write_bytes(agent_bundle())

    result = subprocess.run([sys.executable, "-I", str(path), "--help"], capture_output=True, text=True, cwd=tmp_path)

    assert result.returncode == 0 and "lease" in result.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == agent_bundle_sha256()


def test_host_key_fingerprints_and_simulated_gpus():
    line = ed25519_public()

    assert host_key_fingerprint(line) == parsed(line)[0].fingerprint
    assert [(g.index, g.name, g.memory_gb) for g in parse_simulated("NVIDIA H100 80GB HBM3:80x2")] == [
        (0, "NVIDIA H100 80GB HBM3", 80),
        (1, "NVIDIA H100 80GB HBM3", 80),
    ]
    with pytest.raises(ValueError, match="NAME:GBxCOUNT"):
        parse_simulated("H100")
    assert json.loads(json.dumps(lease_file(_boot(), login_user="gpu")))["login_user"] == "gpu"


def test_a_simulated_machine_draws_no_more_power_than_its_gpus_are_rated_for():
    from providers.community.lease_executors import SimulatedExecutor
    from sandboxes.boot import RATED_POWER_W, simulated_gpus

    executor = SimulatedExecutor(simulated_gpus("T4", 2, 16))
    executor.start({"kind": "container", "image": "x"}, {}, "ubuntu")

    samples = executor.telemetry()

    assert all(7 <= s["power_w"] <= 70 for s in samples)
    assert RATED_POWER_W["T4"] == 70  # the T4's datasheet rating, as the spec table has it


@pytest.mark.parametrize(
    ("name", "memory", "key", "spec_memory", "expected"),
    [
        ("NVIDIA A10G", 24, "A10G", 24, True),
        ("NVIDIA A10G", 24, "A10", 24, False),
        ("NVIDIA A10", 24, "A10G", 24, False),
        ("NVIDIA L40S", 48, "L40S", 48, True),
        ("NVIDIA H100 80GB HBM3", 80, "H100-SXM5", 80, True),
        ("NVIDIA H100 PCIe", 80, "H100-SXM5", 80, False),
        ("NVIDIA H100 PCIe", 80, "H100-PCIE", 80, True),
        ("NVIDIA H100 NVL", 94, "H100-NVL", 94, True),
        ("NVIDIA A100-SXM4-40GB", 40, "A100-80GB-SXM4", 80, False),
        ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB-SXM4", 80, True),
        ("Tesla T4", 15, "T4", 16, True),
    ],
)
def test_a_reported_gpu_is_the_ordered_model_only_when_family_form_and_memory_agree(
    name, memory, key, spec_memory, expected
):
    from providers.gpu_names import reported_gpu_matches

    assert reported_gpu_matches(name, memory, key, spec_memory) is expected


def test_the_agents_unit_restarts_it_after_a_crash_but_not_once_its_lease_is_over():
    """systemd.service(5): ``Restart=always`` restarts the service whatever way it exits, except for the exit
    statuses ``RestartPreventExitStatus=`` lists; ``WantedBy=multi-user.target`` starts it at every boot
    (https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html)."""
    unit = dict(line.split("=", 1) for line in AGENT_UNIT_FILE.splitlines() if "=" in line)

    assert unit["Restart"] == "always" and unit["WantedBy"] == "multi-user.target"
    assert unit["RestartPreventExitStatus"].split() == ["0", str(EXIT_OVER)]
    assert unit["ExecStart"].endswith("/opt/gpu-broker/agent.pyz lease --spec /opt/gpu-broker/lease.json")


def test_on_a_machine_run_by_systemd_the_script_installs_and_enables_the_unit_and_starts_nothing_itself(tmp_path):
    """The script's systemd path, run for real in a container with a stand-in ``systemctl`` that records its
    arguments (no systemd runs in a container). The agent is in place already with the right hash, so nothing is
    fetched: no broker is needed."""
    boot = _boot(broker_url="http://127.0.0.1:9", agent_sha256=agent_bundle_sha256())
    script = render_boot_script(boot, login_user="ubuntu")
    machine = Machine(tmp_path, login_user="ubuntu")
    (tmp_path / "opt" / "agent.pyz").write_bytes(agent_bundle())
    stand_in = '#!/bin/sh\necho "$*" >>/var/log/systemctl-calls\n'
    try:
        machine.power_on(prepare=f"mkdir -p /run/systemd/system && printf '{stand_in}' >/usr/local/bin/systemctl "
                         "&& chmod 755 /usr/local/bin/systemctl")  # fmt: skip
        first, second = machine.boot(script), machine.boot(script)
        calls = machine.exec("cat /var/log/systemctl-calls").stdout.decode()
        unit = machine.exec(f"cat /etc/systemd/system/{AGENT_UNIT}").stdout.decode()
        agents = machine.agents()
    finally:
        machine.power_off()

    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert unit == AGENT_UNIT_FILE + "\n"
    assert calls.splitlines() == ["daemon-reload", f"enable --now --no-block {AGENT_UNIT}"] * 2
    assert agents == []
