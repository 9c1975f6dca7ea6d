"""Environment values are data (issue 33, point 6): what the agent could not hand to the workload unchanged is
refused at the API with the field named, and so is a name the agent or the GPU runtime sets itself. Nothing is
stored, nothing is ordered."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from marketplace.models import LaunchConfiguration

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _order(api: APIClient, offer_id: int, env: object) -> dict:
    """POST an order whose script workload has ``env``; the raw JSON text is sent, so escapes such as a lone
    surrogate reach the parser as a client would send them."""
    body = json.dumps({"offer": offer_id, "launch": {"workload": {"kind": "script", "script": "true", "env": env}}})
    response = api.generic("POST", "/api/v1/orders", body, content_type="application/json")
    assert response.status_code == 400, response.content
    return response.json()["error"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a\x00b", "no NUL characters"),
        ("a\rb", "no line breaks"),
        ("a\nb", "no line breaks"),
        ("a\ud800b", "not valid Unicode"),
    ],
)
@pytest.mark.parametrize("secret", [False, True])
def test_a_value_no_environment_can_carry_is_refused_naming_its_field(api, aws_account, value, says, secret):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()

    error = _order(api, offer.pk, [{"name": "OK", "value": "fine"}, {"name": "BAD", "value": value, "secret": secret}])

    assert error["code"] == "invalid_launch"
    (message,) = error["fields"]["launch.workload.env[1].value"]
    assert says in message and list(error["fields"]) == ["launch.workload.env[1].value"]
    assert not LaunchConfiguration.objects.exists() and offer.orders.count() == 0


@pytest.mark.parametrize(
    "name",
    ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "LEASE_PORTS", "LEASE_PORT_8000",
     "lease_port_22", "BROKER_AUTHORIZED_KEYS", "GPU_BROKER_SIMULATE"],
)  # fmt: skip
def test_a_name_the_agent_or_the_gpu_runtime_sets_is_refused_naming_its_field(api, aws_account, name):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()

    error = _order(api, offer.pk, {name: "0"})

    assert error["fields"] == {
        "launch.workload.env[0].name": [f"{name} is set by the machine's agent or GPU runtime, not by the buyer"]
    }
    assert not LaunchConfiguration.objects.exists() and offer.orders.count() == 0


def test_quotes_dollars_backticks_spaces_and_non_ascii_are_accepted_as_given(
    api, aws_account, django_capture_on_commit_callbacks
):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge").first()
    value = 'it\'s "$(touch x)" `id` $HOME naïve 東京 \t end '
    workload = {"kind": "script", "script": "true", "env": [{"name": "LD_LIBRARY_PATH", "value": value}]}

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/orders", {"offer": offer.pk, "launch": {"workload": workload}}, format="json")

    assert response.status_code == 201, response.json()
    stored = LaunchConfiguration.objects.get().spec["workload"]["env"]
    assert stored == [{"name": "LD_LIBRARY_PATH", "value": value}]
