"""A host that cannot wall its leases off is sold whole only (issue 33, point 1): its agent says why in its
self-test and refuses a launch of part of the machine, and the adapter offers only the whole machine, however the
seller listed it. A stand-in ``nvidia-smi`` program stands for the driver (its CSV columns as ``nvidia-smi
--query-gpu=... --format=csv,noheader,nounits`` prints them: NVIDIA's nvidia-smi documentation, "Query options")."""

from __future__ import annotations

import json
import sys
from decimal import Decimal

import pytest
from werkzeug.test import Client

from providers.community import protocol
from providers.community.agent import Agent
from providers.community.services import machine_list
from providers.models import Machine, MachineState
from providers.services import adapter_for_account
from tests.hosts import LISTING

SMI = """import sys
query = next(a for a in sys.argv if a.startswith("--query-gpu="))
for index in range(8):
    row = {"index": str(index), "name": "NVIDIA H100 80GB HBM3", "memory.total": "81559", "utilization.gpu": "0",
           "temperature.gpu": "35", "power.draw": "70", "memory.used": "0"}
    print(", ".join(row[field] for field in query.split("=", 1)[1].split(",")))
"""


@pytest.fixture
def real_host(fleet, tmp_path, monkeypatch):
    """A machine listed per GPU whose (non-simulated) agent has no container runtime."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!{sys.executable}\n{SMI}")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    listed = machine_list(account=fleet, name="fra-h100-1", listing={**LISTING, "min_gpus_per_lease": 1})
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                  launch_seconds=0, lease_threads=False, data_dir=tmp_path / "data",
                  containers="no container runtime: the docker command is not installed")  # fmt: skip
    url = agent.serve("127.0.0.1", 0, report=False)
    Machine.objects.filter(pk=listed.machine.pk).update(agent_url=url, state=MachineState.VERIFIED, online=True)
    yield agent, listed
    agent.stop()


def test_a_host_without_walls_says_why_and_refuses_part_of_the_machine(real_host):
    agent, listed = real_host
    assert agent.self_test()["isolation"] == {
        "containers": False, "simulated": False, "reason": "no container runtime: the docker command is not installed",
    }  # fmt: skip
    body = json.dumps({"client_token": "ord-1-a1", "order_ref": "ord-1", "gpus": 2}).encode()
    answer = Client(agent).post("/v1/instances", data=body, headers=protocol.sign(listed.machine.key_id,
                                                                                  listed.secret, "POST",
                                                                                  "/v1/instances", body))  # fmt: skip
    assert answer.status_code == 409 and answer.get_json()["code"] == "whole_only"
    assert "no container runtime" in answer.get_json()["message"] and agent.instances == {}


def test_the_adapter_offers_a_host_without_walls_whole_only(real_host, fleet):
    offers = adapter_for_account(fleet).list_offers()
    assert sorted((o.gpu_count, o.pricing_model.value, o.price) for o in offers) == [
        (8, "on_demand", Decimal("15.2000")),
    ]
