"""A Kubernetes cluster joins as a seller (issue 37): the connect form and `manage.py provider connect --kind
kubernetes` take an API server URL, CA and token or a kubeconfig pasted once, check them with a real
SelfSubjectRulesReview against the cluster sandbox, show the ClusterRole the service account needs, and refuse
a token that lacks any of it, naming the verb and resource, with nothing saved."""

from __future__ import annotations

import base64
import json
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from marketplace.catalog.services import offers_sync
from providers.kubernetes.permissions import CLUSTER_ROLE_FILE
from providers.models import ProviderAccount
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

PRICES = "A100-80GB-SXM4 1.90\nT4 0.30\nT4 0.22 broker.example/pool=spot-t4"


def _form(sandbox, **changes):
    credentials = sandbox.account_credentials()
    return {
        "name": "fra-1",
        "regions": "eu-central",
        "endpoint_url": sandbox.url,
        "token": credentials["token"],
        "ca_bundle": credentials["ca_bundle"],
        "gpu_prices": PRICES,
        **changes,
    }


def _kubeconfig(sandbox, token: str) -> str:
    """A kubeconfig as ``kubectl config view --raw`` writes one for a service account's token
    (https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "neocloud",
                    "cluster": {
                        "server": sandbox.url,
                        "certificate-authority-data": base64.b64encode(sandbox.ca_pem.encode()).decode(),
                    },
                }
            ],
            "users": [{"name": "gpu-broker", "user": {"token": token}}],
            "contexts": [{"name": "broker", "context": {"cluster": "neocloud", "user": "gpu-broker"}}],
            "current-context": "broker",
        }
    )


def test_a_cluster_connects_with_its_api_server_ca_and_token(petra, kubernetes_sandbox):
    response = client_for(petra).post("/provider/accounts/connect/kubernetes", _form(kubernetes_sandbox))

    assert response.status_code == 302, response.context["form"].errors
    account = ProviderAccount.objects.get()
    assert (account.kind, account.endpoint_url, account.regions) == (
        "kubernetes",
        kubernetes_sandbox.url,
        ["eu-central"],
    )
    given = kubernetes_sandbox.account_credentials()
    assert account.credentials().values == {"token": given["token"], "ca_bundle": given["ca_bundle"].strip()}
    assert account.options["gpu_prices"] == PRICES
    assert kubernetes_sandbox.account_credentials()["token"] not in account.credentials_encrypted


def test_a_kubeconfig_pasted_once_fills_the_server_ca_and_token_and_is_not_kept(petra, kubernetes_sandbox):
    token = kubernetes_sandbox.account_credentials()["token"]
    form = _form(kubernetes_sandbox, endpoint_url="", token="", ca_bundle="")
    form["kubeconfig"] = _kubeconfig(kubernetes_sandbox, token)

    response = client_for(petra).post("/provider/accounts/connect/kubernetes", form)

    assert response.status_code == 302, response.context["form"].errors
    account = ProviderAccount.objects.get()
    assert account.endpoint_url == kubernetes_sandbox.url
    values = account.credentials().values
    assert values["token"] == token
    assert values["ca_bundle"].strip() == kubernetes_sandbox.ca_pem.strip()
    assert "kubeconfig" not in values


def test_a_token_without_a_permission_is_refused_naming_the_verb_and_resource(petra, kubernetes_sandbox):
    limited = kubernetes_sandbox.register_token(deny=[("create", "networkpolicies")])

    response = client_for(petra).post("/provider/accounts/connect/kubernetes", _form(kubernetes_sandbox, token=limited))

    assert response.status_code == 200
    errors = " ".join(response.context["form"].non_field_errors())
    assert "create networkpolicies" in errors, errors
    assert "nothing was saved" in errors
    assert not ProviderAccount.objects.exists()


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"gpu_prices": "A100-80GB-SXM4 1.90\nH100-SXM 0"}, "gpu_prices", "line 2"),
        ({"endpoint_url": ""}, "endpoint_url", "give the API server URL, or paste a kubeconfig"),
        ({"kubeconfig": "apiVersion: v1\nkind: Config\nusers: []\n"}, "kubeconfig", ""),
        ({"token": ""}, "token", "give the service account's token"),
    ],
)
def test_bad_cluster_input_is_a_field_error(petra, kubernetes_sandbox, changes, field, message):
    response = client_for(petra).post("/provider/accounts/connect/kubernetes", _form(kubernetes_sandbox, **changes))

    assert response.status_code == 200
    errors = response.context["form"].errors.get(field)
    assert errors, response.context["form"].errors
    assert message in " ".join(errors)
    assert not ProviderAccount.objects.exists()


def test_the_connect_form_shows_the_clusterrole_the_service_account_needs(petra):
    page = client_for(petra).get("/provider/accounts/connect/kubernetes").content.decode()

    assert "What the cluster must allow" in page
    assert "kind: ClusterRole" in page and "networkpolicies" in page
    assert 'name="kubeconfig"' in page and 'name="gpu_prices"' in page
    assert "API server URL" in page


def test_the_command_connects_a_cluster_from_a_kubeconfig_file(kubernetes_sandbox, tmp_path):
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(_kubeconfig(kubernetes_sandbox, kubernetes_sandbox.account_credentials()["token"]))
    prices = tmp_path / "prices.txt"
    prices.write_text(PRICES)
    out = StringIO()

    call_command(
        "provider", "connect", "--provider", "Kai's Neocloud", "--kind", "kubernetes", "--name", "fra-1",
        "--regions", "eu-central", "--kubeconfig", str(path), "--option", f"gpu_prices=@{prices}", stdout=out,
    )  # fmt: skip

    account = ProviderAccount.objects.get(pk=json.loads(out.getvalue())["account"])
    assert account.endpoint_url == kubernetes_sandbox.url
    assert account.options["gpu_prices"] == PRICES
    assert "kubeconfig" not in account.credentials().values


def test_the_command_refuses_a_token_lacking_a_permission_and_saves_nothing(kubernetes_sandbox, tmp_path):
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(_kubeconfig(kubernetes_sandbox, kubernetes_sandbox.register_token(deny=[("delete", "namespaces")])))

    with pytest.raises(
        CommandError, match=r"delete namespaces.*nothing was saved|nothing was saved.*delete namespaces"
    ):
        call_command(
            "provider", "connect", "--provider", "Kai's Neocloud", "--kind", "kubernetes", "--name", "fra-1",
            "--regions", "eu-central", "--kubeconfig", str(path),
        )  # fmt: skip
    assert not ProviderAccount.objects.exists()


def test_the_command_prints_the_clusterrole(capsys):
    out = StringIO()
    call_command("provider", "clusterrole", stdout=out)

    role = yaml.safe_load(out.getvalue())
    assert role == yaml.safe_load(CLUSTER_ROLE_FILE.read_text())
    assert role["kind"] == "ClusterRole"


def test_the_readme_gives_the_clusterrole_the_code_checks():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Selling a Kubernetes cluster", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]

    assert yaml.safe_load(block) == yaml.safe_load(CLUSTER_ROLE_FILE.read_text())


def test_the_accounts_page_shows_each_node_on_sale_with_its_free_and_held_units(petra, kubernetes_sandbox):
    client = client_for(petra)
    assert client.post("/provider/accounts/connect/kubernetes", _form(kubernetes_sandbox)).status_code == 302
    account = ProviderAccount.objects.get()
    ProviderAccount.objects.filter(pk=account.pk).update(enabled=True)
    assert offers_sync(account_id=account.pk).ok

    page = client.get("/provider/accounts").content.decode()

    assert 'aria-label="Nodes of fra-1"' in page
    # The A100 and T4 nodes are priced; the MIG node's A100-40GB and the L4s are not, so they are not on sale.
    assert "<code>gpu-a100-0</code>" in page and "<code>nvidia.com/gpu</code> 8 / 0" in page
    assert "<code>gpu-t4-0</code>" in page and "<code>nvidia.com/gpu</code> 4 / 0" in page
    assert "gpu-t4-cordoned-0" not in page
