"""The template gallery: every entry is a launch configuration the broker accepts, says what it needs, and is
served read-only over the API; filling its variables refuses unknown and empty required ones."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.launch.config import LaunchConfigInvalid, launch_parse
from marketplace.launch.gallery import gallery_get, gallery_launch, gallery_list
from marketplace.models import LaunchConfiguration, LaunchTemplate

pytestmark = pytest.mark.django_db

CALLER = "203.0.113.7"


def _filled(entry) -> dict[str, str]:
    return {v.name: v.default or "s3cret-value-for-the-test" for v in entry.variables if v.required}


@pytest.mark.parametrize("entry", gallery_list(), ids=lambda e: e.slug)
def test_every_gallery_entry_validates_as_a_launch_configuration(entry):
    spec, secrets = launch_parse(gallery_launch(entry, _filled(entry)), keys=[], caller_address=CALLER)

    workload = spec["workload"]
    assert workload["kind"] == entry.kind
    assert {e["name"] for e in workload["env"]} == {v.name for v in entry.variables if v.required}
    assert set(secrets.get("env") or {}) == {v.name for v in entry.variables if v.required and v.secret}
    assert entry.description and entry.min_gpu_memory_gb >= 8 and entry.memory_note and entry.usage


def test_the_gallery_has_pytorch_vllm_jupyter_and_a_batch_script():
    assert [e.slug for e in gallery_list()] == ["pytorch", "vllm", "jupyter", "batch"]
    vllm, jupyter, batch = gallery_get("vllm"), gallery_get("gallery:jupyter"), gallery_get("batch")
    assert vllm.image.startswith("vllm/vllm-openai:v") and vllm.launch["workload"]["ports"] == [8000]
    assert "--gpu-memory-utilization 0.90" in vllm.launch["workload"]["args"][0]
    assert vllm.min_gpu_memory_gb >= 16 and [v.name for v in vllm.required] == ["MODEL", "MAX_MODEL_LEN"]
    assert jupyter.launch["workload"]["ports"] == [8888]
    assert [(v.name, v.secret, v.default) for v in jupyter.required] == [("JUPYTER_TOKEN", True, "")]
    assert batch.kind == "script" and "summary.json" in batch.launch["workload"]["script"]
    assert gallery_get("nope") is None


def test_no_secret_variable_has_a_default():
    assert [v.name for e in gallery_list() for v in e.variables if v.secret and v.default] == []


def test_filling_refuses_an_unknown_variable_and_an_empty_required_one():
    jupyter = gallery_get("jupyter")

    with pytest.raises(LaunchConfigInvalid) as refused:
        gallery_launch(jupyter, {"JUPYTER_TOKEN": "", "JUPYTR_TOKEN": "typo"})

    assert set(refused.value.fields) == {"env.JUPYTER_TOKEN", "env.JUPYTR_TOKEN"}
    assert "not a variable of Jupyter Lab" in refused.value.fields["env.JUPYTR_TOKEN"]


def test_filling_adds_an_optional_secret_only_when_given_and_leaves_the_entry_unchanged():
    vllm = gallery_get("vllm")

    plain = gallery_launch(vllm, {"MODEL": "Qwen/Qwen2.5-1.5B-Instruct"})
    gated = gallery_launch(vllm, {"HF_TOKEN": "hf_x"})

    assert [e["name"] for e in plain["workload"]["env"]] == ["MODEL", "MAX_MODEL_LEN"]
    assert plain["workload"]["env"][0]["value"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert gated["workload"]["env"][-1] == {"name": "HF_TOKEN", "value": "hf_x", "secret": True}
    assert vllm.launch["workload"]["env"][0]["value"] == "Qwen/Qwen2.5-7B-Instruct"  # the entry is not edited


# --------------------------------------------------------------------------------------------- the API


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def test_the_api_lists_the_gallery_and_shows_one_entry(api):
    listed = api.get("/api/v1/templates/gallery")
    one = api.get("/api/v1/templates/gallery/vllm")

    assert listed.status_code == 200 and one.status_code == 200
    assert [e["slug"] for e in listed.json()["results"]] == ["pytorch", "vllm", "jupyter", "batch"]
    body = one.json()
    assert body == listed.json()["results"][1]
    assert (body["kind"], body["min_gpu_memory_gb"], body["launch"]["workload"]["ports"]) == ("container", 24, [8000])
    assert body["variables"][0] == {
        "name": "MODEL",
        "purpose": "the Hugging Face model to serve, e.g. Qwen/Qwen2.5-7B-Instruct",
        "required": True,
        "secret": False,
        "default": "Qwen/Qwen2.5-7B-Instruct",
    }


def test_an_unknown_gallery_entry_is_404_in_the_api_error_shape(api):
    missing = api.get("/api/v1/templates/gallery/nope")

    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_a_token_that_reads_offers_reads_the_gallery_and_one_for_webhooks_does_not(acme, alice):
    def bearer(scopes):
        client = APIClient()
        raw = api_token_create(organization=acme, user=alice, name="t", scopes=scopes).raw
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    assert bearer(["offers:read"]).get("/api/v1/templates/gallery").status_code == 200
    assert bearer(["webhooks:manage"]).get("/api/v1/templates/gallery").status_code == 403


def test_the_gallery_is_read_only_and_writes_nothing(api):
    assert api.post("/api/v1/templates/gallery", {}, format="json").status_code == 405
    assert api.delete("/api/v1/templates/gallery/vllm").status_code == 405
    assert (LaunchTemplate.objects.count(), LaunchConfiguration.objects.count()) == (0, 0)
