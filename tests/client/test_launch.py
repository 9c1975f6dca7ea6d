"""``broker keys``, ``broker launch`` and ``broker ssh`` against a live broker whose independent hosts boot the
ordered machine by themselves: the lease agent phones home to the live server, so "running" is reached the
way it is in production, with no step driven by the test."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
from django.conf import settings

from marketplace.catalog.services import offers_sync
from marketplace.models import Order, SshKey
from providers.services import provider_account_connect
from tests.client.conftest import CLIENT_DIR
from tests.hosts import start_hosts, stop_hosts
from tests.sshkeys import ed25519_pair, rsa_public

ALL = ["offers:read", "orders:place", "instances:manage", "ledger:read", "keys:manage"]


@pytest.fixture
def booting_hosts(live_server, transactional_db, acme, alice):
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.models import GpuModel

    if not GpuModel.objects.exists():  # a transactional test before this one flushed the seeded rows
        gpu_models_upsert(GpuModel)
    settings.PUBLIC_URL = live_server.url  # the boot script's broker: the machines phone home here
    fleet = provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )
    agents = start_hosts(fleet, ["fra-h100-1"], lease_threads=True)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


@pytest.fixture
def cli_env(live_server, acme, alice):
    from marketplace.api.tokens import api_token_create

    raw = api_token_create(organization=acme, user=alice, name="cli", scopes=ALL).raw
    return {"BROKER_URL": live_server.url, "BROKER_TOKEN": raw}


def broker(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerclient", *args],
        env={**os.environ, "PYTHONPATH": str(CLIENT_DIR), **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_keys_add_refuses_a_private_key_before_sending_it(cli_env, tmp_path, acme):
    public, private = ed25519_pair("bob@ci")
    (tmp_path / "id_ed25519").write_text(private)
    (tmp_path / "id_ed25519.pub").write_text(public + "\n")
    (tmp_path / "old.pub").write_text(rsa_public(2048) + "\n")

    refused = broker(cli_env, "keys", "add", str(tmp_path / "id_ed25519"))
    weak = broker(cli_env, "keys", "add", str(tmp_path / "old.pub"))
    added = broker(cli_env, "keys", "add", str(tmp_path / "id_ed25519.pub"))
    listed = broker(cli_env, "keys", "list")

    assert refused.returncode == 2 and "is a private key: nothing was sent" in refused.stderr
    assert weak.returncode == 1 and "at least 3072 bits, this one has 2048" in weak.stderr
    assert added.returncode == 0, added.stderr
    key = SshKey.objects.get(organization=acme, name="bob@ci")
    assert key.fingerprint in added.stdout and key.fingerprint in listed.stdout
    assert "PRIVATE" not in "".join(SshKey.objects.values_list("public_key", flat=True))


def test_launch_waits_for_ready_and_ssh_pins_the_reported_host_key(cli_env, booting_hosts, acme):
    launched = broker(
        cli_env, "launch", "--gpu", "H100:8", "--profile", "inference", "--image", "vllm/vllm-openai:v0.6.3",
        "--run", "python -m vllm.entrypoints.openai.api_server", "--port", "8000",
        "--secret-env", "HF_TOKEN=hf_do-not-print-me", "--hours", "2", "--wait", "240", "--interval", "0.5",
    )  # fmt: skip

    assert launched.returncode == 0, launched.stdout + launched.stderr
    order = Order.objects.get(organization=acme)
    assert order.state == "running"
    # Not an interruptible bid unless asked for (--pricing spot), and the line before ordering says which.
    assert order.pricing_model == "on_demand" and "USD/h on-demand" in launched.stdout
    assert "connect   ssh -p " in launched.stdout and "lease@127.0.0.1" in launched.stdout
    lease = order.leases.get()
    url = f"http://127.0.0.1:{lease.ports['8000']}"
    assert f"port 8000 {url}" in launched.stdout
    # The exposed port leads somewhere: the simulated machine answers on it.
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read().startswith(b"simulated workload (container) on the machine's port 8000")
    assert "hf_do-not-print-me" not in launched.stdout + launched.stderr
    printed = broker(cli_env, "ssh", str(order.public_id), "--print")
    assert printed.returncode == 0, printed.stderr
    command, known = printed.stdout.splitlines()[0], printed.stdout.splitlines()[1]
    assert "StrictHostKeyChecking=yes" in command and command.endswith(" lease@127.0.0.1")
    assert known == f"[127.0.0.1]:{lease.ssh_port} {lease.host_keys[0]['public_key']}"


def test_launch_of_a_card_its_profile_refuses_says_which_option_to_change(cli_env, booting_hosts, acme):
    # H100s have no hardware video encoder, which the transcoding profile asks of every GPU.
    refused = broker(cli_env, "launch", "--gpu", "H100:8", "--profile", "transcoding", "--wait", "5")

    assert refused.returncode != 0 and not Order.objects.filter(organization=acme).exists()
    assert "broker: no offer fits: no H100:8 on sale meets the transcoding profile" in refused.stderr
    assert "the transcoding profile asks that of every GPU" in refused.stderr
    assert "--profile inference" in refused.stderr


def test_ssh_to_an_order_without_a_ready_machine_says_why(cli_env, acme, alice, booting_hosts):
    from marketplace.orders.services import order_terminate

    launched = broker(cli_env, "launch", "--gpu", "H100:8", "--profile", "inference", "--wait", "240",
                   "--interval", "0.5")  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    order = Order.objects.get(organization=acme)
    order_terminate(order=order)

    answer = broker(cli_env, "ssh", str(order.public_id), "--print")

    assert answer.returncode == 1
    assert "has no ready machine to connect to" in answer.stderr


def test_the_launch_options_become_a_launch_configuration():
    from brokerclient.cli import launch_config_from, parser

    args = parser().parse_args(
        ["launch", "--gpu", "T4", "--run", "nvidia-smi", "--port", "8888,6006", "--allow", "203.0.113.0/24",
         "--env", "A=1", "--secret-env", "B=2", "--disk", "100", "--spend-cap", "20"]
    )  # fmt: skip
    config = launch_config_from(args)

    assert config == {
        "workload": {"kind": "script", "script": "#!/bin/bash\nnvidia-smi\n",
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2", "secret": True}]},
        "ports": [8888, 6006], "disk_gb": 100, "allowed_cidrs": ["203.0.113.0/24"], "spend_cap_usd": "20",
    }  # fmt: skip
