"""``broker templates``, ``broker launch --template``, ``broker clusters`` and ``broker billing`` against a live
broker: the gallery and the organisation's templates listed and shown, a gallery entry launched to ready with
the buyer's values, a cluster shown and terminated, credit and top-ups read."""

from __future__ import annotations

import json

import pytest

from marketplace.api.tokens import api_token_create
from marketplace.launch.config import LaunchChoice, launch_secrets
from marketplace.models import Cluster, ClusterState, LaunchTemplate, Order, Quote, TopUp, TopUpState
from marketplace.orders.clusters import ClusterRequest, cluster_place
from tests.client.test_launch import booting_hosts, broker  # noqa: F401 - booting_hosts is a fixture
from tests.marketplace.test_clusters import _offers

ALL = ["offers:read", "orders:place", "instances:manage", "keys:manage", "billing:manage"]


@pytest.fixture
def cli_env(live_server, acme, alice):
    raw = api_token_create(organization=acme, user=alice, name="cli", scopes=ALL).raw
    return {"BROKER_URL": live_server.url, "BROKER_TOKEN": raw}


def test_templates_gallery_lists_every_entry_and_show_gives_its_variables(cli_env):
    listed = broker(cli_env, "templates", "gallery")
    shown = broker(cli_env, "templates", "show", "gallery:vllm")
    as_json = broker(cli_env, "templates", "show", "gallery:jupyter", "--json")
    missing = broker(cli_env, "templates", "show", "gallery:nope")

    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:5]] == [
        "gallery:pytorch", "gallery:vllm", "gallery:jupyter", "gallery:batch"
    ]  # fmt: skip
    assert "JUPYTER_TOKEN (secret)" in listed.stdout and ">= 24 GB" in listed.stdout
    assert shown.returncode == 0, shown.stderr
    assert "needs     >= 24 GB GPU memory" in shown.stdout
    assert "MODEL          required: the Hugging Face model to serve" in shown.stdout
    assert "HF_TOKEN       optional, secret" in shown.stdout
    assert json.loads(as_json.stdout)["launch"]["workload"]["ports"] == [8888]
    assert missing.returncode == 1 and "no such gallery template" in missing.stderr


def test_templates_lists_and_shows_the_organisations_own(cli_env, acme, alice):
    empty = broker(cli_env, "templates")
    from brokerclient import BrokerClient

    with BrokerClient(cli_env["BROKER_URL"], cli_env["BROKER_TOKEN"]) as client:
        saved = client.launch_template_save(
            "my vllm", {"workload": {"kind": "container", "image": "vllm/vllm-openai:v0.11.0", "ports": [8000]},
                        "allowed_cidrs": ["203.0.113.0/24"]}, description="serves Qwen"
        )  # fmt: skip

    listed = broker(cli_env, "templates", "list")
    shown = broker(cli_env, "templates", "show", "my vllm")
    unknown = broker(cli_env, "templates", "show", "nobody's")

    assert empty.returncode == 0 and "no templates yet; the gallery has ready ones" in empty.stdout
    row = next(line for line in listed.stdout.splitlines() if saved["id"] in line)
    assert "my vllm" in row and "container vllm/vllm-openai:v0.11.0" in row and "22,8000" in row
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"my vllm ({saved['id']})\nserves Qwen\n")
    assert unknown.returncode == 1 and "no such launch template" in unknown.stderr


def test_launch_from_the_gallery_refuses_a_missing_secret_and_an_unknown_variable_before_quoting(cli_env, acme):
    no_token = broker(cli_env, "launch", "--gpu", "H100", "--template", "gallery:jupyter")
    in_the_open = broker(cli_env, "launch", "--gpu", "H100", "--template", "gallery:jupyter",
                         "--env", "JUPYTER_TOKEN=visible")  # fmt: skip
    typo = broker(cli_env, "launch", "--gpu", "H100", "--template", "gallery:vllm", "--env", "MODLE=x")
    both = broker(cli_env, "launch", "--gpu", "H100", "--template", "gallery:vllm", "--image", "x/y:1")
    saved_changed = broker(cli_env, "launch", "--gpu", "H100", "--template", "mine", "--disk", "50")

    assert no_token.returncode == 2
    assert "gallery:jupyter needs JUPYTER_TOKEN: give --secret-env JUPYTER_TOKEN=..." in no_token.stderr
    assert in_the_open.returncode == 2 and "give JUPYTER_TOKEN with --secret-env" in in_the_open.stderr
    assert typo.returncode == 2 and "gallery:vllm has no variable MODLE (it has MODEL, MAX_MODEL_LEN" in typo.stderr
    assert both.returncode == 2 and "--template sets what runs: drop --image" in both.stderr
    assert saved_changed.returncode == 2 and "a saved template is taken whole: drop --disk" in saved_changed.stderr
    assert (Quote.objects.count(), Order.objects.count()) == (0, 0)


def test_launch_from_the_gallery_runs_it_with_the_buyers_values(cli_env, booting_hosts, acme):  # noqa: F811
    launched = broker(
        cli_env, "launch", "--gpu", "H100:8", "--profile", "inference", "--template", "gallery:vllm",
        "--env", "MODEL=Qwen/Qwen2.5-1.5B-Instruct", "--secret-env", "HF_TOKEN=hf_gallery-do-not-print",
        "--hours", "1", "--wait", "240", "--interval", "0.5",
    )  # fmt: skip

    assert launched.returncode == 0, launched.stdout + launched.stderr
    order = Order.objects.get(organization=acme)
    assert order.state == "running"
    workload = order.launch_config.spec["workload"]
    assert (workload["image"], workload["ports"]) == ("vllm/vllm-openai:v0.11.0", [8000])
    assert workload["env"] == [
        {"name": "MODEL", "value": "Qwen/Qwen2.5-1.5B-Instruct"},
        {"name": "MAX_MODEL_LEN", "value": "8192"},
        {"name": "HF_TOKEN", "secret": True},
    ]
    assert launch_secrets(order.launch_config)["env"] == {"HF_TOKEN": "hf_gallery-do-not-print"}
    assert Quote.objects.get().demand["min_gpu_memory_gb"] == 24
    assert "hf_gallery-do-not-print" not in launched.stdout + launched.stderr
    assert "port 8000 http://127.0.0.1:" in launched.stdout


def test_launch_with_a_saved_template_names_it_to_the_quote(cli_env, booting_hosts, acme, alice):  # noqa: F811
    from marketplace.launch.config import launch_template_save

    launch_template_save(
        organization=acme, user=alice, name="shell", choice=LaunchChoice(
            data={"workload": {"kind": "script", "script": "#!/bin/bash\necho hi\n"}, "disk_gb": 60},
            caller_address="127.0.0.1")
    )  # fmt: skip

    launched = broker(cli_env, "launch", "--gpu", "H100:8", "--template", "shell", "--hours", "1",
                      "--wait", "240", "--interval", "0.5")  # fmt: skip

    assert launched.returncode == 0, launched.stdout + launched.stderr
    order = Order.objects.get(organization=acme)
    assert order.launch_config_id == LaunchTemplate.objects.get(name="shell").configuration_id


def test_clusters_lists_shows_and_terminates_one(cli_env, acme, alice, aws_account, aws_sandbox):
    offer = _offers(aws_account)[0]
    launch = LaunchChoice(data={"allowed_cidrs": ["127.0.0.1/32"]})
    request = ClusterRequest(offer_id=offer.pk, nodes=2, launch=launch)
    cluster = cluster_place(organization=acme, user=alice, request=request).cluster
    cid = str(cluster.public_id)

    listed = broker(cli_env, "clusters")
    shown = broker(cli_env, "clusters", "show", cid)
    no_id = broker(cli_env, "clusters", "terminate")
    ended = broker(cli_env, "clusters", "terminate", cid)

    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if cid in line)
    assert " 2 " in row and "4 x A10G" in row and offer.instance_type in row
    assert shown.returncode == 0, shown.stderr
    assert f"cluster   {cid}" in shown.stdout and "machines  2 x 4 A10G" in shown.stdout
    assert no_id.returncode == 2 and "clusters terminate needs a cluster id" in no_id.stderr
    assert ended.returncode == 0, ended.stderr
    cluster.refresh_from_db()
    assert cluster.state in (ClusterState.TERMINATING, ClusterState.TERMINATED)
    assert f"state     {cluster.state}" in ended.stdout
    assert Cluster.objects.count() == 1


def test_billing_shows_credit_and_recent_top_ups(cli_env, acme, alice):
    paid = TopUp.objects.create(organization=acme, created_by=alice, amount_minor=2500, currency="USD",
                                idempotency_key="k1", state=TopUpState.SUCCEEDED)  # fmt: skip
    declined = TopUp.objects.create(organization=acme, created_by=alice, amount_minor=900, currency="USD",
                                    idempotency_key="k2", state=TopUpState.FAILED, failure="card declined")  # fmt: skip

    summary = broker(cli_env, "billing")
    topups = broker(cli_env, "billing", "topups", "--json")
    invoices = broker(cli_env, "billing", "invoices")

    assert summary.returncode == 0, summary.stderr
    assert "credit    " in summary.stdout and " USD available" in summary.stdout
    lines = summary.stdout.splitlines()
    assert lines.index("recent top-ups:") < next(i for i, line in enumerate(lines) if str(declined.public_id) in line)
    assert "card declined" in summary.stdout and "25.00" in summary.stdout
    assert [t["id"] for t in json.loads(topups.stdout)] == [str(declined.public_id), str(paid.public_id)]
    assert invoices.returncode == 0 and invoices.stdout.splitlines()[0].split() == [
        "number", "month", "total", "tax", "currency", "issued"
    ]  # fmt: skip
