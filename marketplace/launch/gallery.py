"""The template gallery: ready launch configurations the broker maintains for every buyer (PyTorch, vLLM
serving, Jupyter Lab, a batch script), versioned here with the code rather than seeded into a table.

An entry is a launch configuration (``marketplace/launch/config.py``'s shape) plus what a buyer needs to know
before starting from it: what it does, the GPU memory it needs, and the variables to fill. A variable with a
default is filled with it; a secret variable never has one (``tests/marketplace/test_gallery.py`` holds every
entry to ``launch_parse``). Images are public ones, pinned by tag; inside the sandbox nothing can be pulled,
and the lease image stands in for them (the order says so).

Each workload checks its own required variables and exits at once, naming the one missing, so a configuration
copied without them fails its order with that reason instead of serving without a password.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marketplace.launch.config import LaunchConfigInvalid

# The public tags each entry pins (checked against the registries' listings when chosen).
PYTORCH_IMAGE = "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
JUPYTER_IMAGE = "quay.io/jupyter/pytorch-notebook:cuda12-2025-08-18"


@dataclass(frozen=True)
class GalleryVariable:
    """An environment variable the entry's workload reads. ``required``: it must have a value when ordering;
    ``default``: the value it starts with ("" for none; a secret never has one)."""

    name: str
    purpose: str
    required: bool = True
    secret: bool = False
    default: str = ""


@dataclass(frozen=True)
class GalleryEntry:
    """One ready configuration. ``launch`` is a launch configuration as the API takes it, its variables'
    defaults filled in; ``min_gpu_memory_gb`` is per GPU, and ``memory_note`` says what it assumes."""

    slug: str
    name: str
    description: str
    min_gpu_memory_gb: int
    memory_note: str
    variables: tuple[GalleryVariable, ...]
    launch: Mapping[str, Any]
    usage: str  # what to do once the machine is ready

    @property
    def kind(self) -> str:
        return str((self.launch.get("workload") or {}).get("kind", "none"))

    @property
    def image(self) -> str:
        return str((self.launch.get("workload") or {}).get("image", ""))

    @property
    def required(self) -> tuple[GalleryVariable, ...]:
        return tuple(v for v in self.variables if v.required)


def _env(variables: tuple[GalleryVariable, ...]) -> list[dict[str, Any]]:
    """The launch's env for ``variables``: the optional ones are left out (the buyer adds them when wanted)."""
    env: list[dict[str, Any]] = []
    for variable in variables:
        if not variable.required:
            continue
        if variable.secret:
            env.append({"name": variable.name, "value": "", "secret": True})
        else:
            env.append({"name": variable.name, "value": variable.default})
    return env


# Each shell line below refuses to start without its variable, naming it: the agent reports the container's
# last lines as the failure reason, which is what the buyer then reads on the order page.
_PYTORCH_VARS = (
    GalleryVariable("WORKDIR", "where the shell starts and your files go inside the container", default="/workspace"),
)
_PYTORCH = GalleryEntry(
    slug="pytorch",
    name="PyTorch (CUDA 12.6)",
    description="The official PyTorch image with CUDA 12.6 and cuDNN 9, kept running for you to SSH in and work: "
    "it checks the GPUs are visible to torch at start.",
    min_gpu_memory_gb=8,
    memory_note="any CUDA GPU; size it by your own model",
    variables=_PYTORCH_VARS,
    launch={
        "workload": {
            "kind": "container",
            "image": PYTORCH_IMAGE,
            "command": ["bash", "-c"],
            "args": [
                'mkdir -p "${WORKDIR:?set WORKDIR}" && cd "$WORKDIR" && '
                'python -c \'import torch; assert torch.cuda.is_available(), "no CUDA device visible"; '
                "print(torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' "
                "&& exec sleep infinity"
            ],
            "env": _env(_PYTORCH_VARS),
            "shm_size_gb": 8,
        },
        "disk_gb": 100,
    },
    usage="broker ssh ORDER, then: docker exec -it gpu-broker-workload bash",
)

_VLLM_VARS = (
    GalleryVariable(
        "MODEL", "the Hugging Face model to serve, e.g. Qwen/Qwen2.5-7B-Instruct", default="Qwen/Qwen2.5-7B-Instruct"
    ),
    GalleryVariable(
        "MAX_MODEL_LEN", "the longest context served, in tokens (smaller uses less memory)", default="8192"
    ),
    GalleryVariable("HF_TOKEN", "a Hugging Face token, for gated models only", required=False, secret=True),
)
_VLLM = GalleryEntry(
    slug="vllm",
    name="vLLM OpenAI-compatible server",
    description="Serves a Hugging Face model with vLLM's OpenAI-compatible API on port 8000 "
    "(/v1/chat/completions, /v1/completions, /v1/models). Set MODEL to the model you want.",
    min_gpu_memory_gb=24,
    memory_note="a 7-8B model in 16-bit weights with an 8k context; a 1-3B model fits 16 GB, a 70B one needs "
    "several 80 GB GPUs",
    variables=_VLLM_VARS,
    launch={
        "workload": {
            "kind": "container",
            "image": VLLM_IMAGE,
            "command": ["bash", "-c"],
            "args": [
                'exec vllm serve "${MODEL:?set MODEL to a Hugging Face model id}" --host 0.0.0.0 --port 8000 '
                '--max-model-len "${MAX_MODEL_LEN:-8192}" --gpu-memory-utilization 0.90 '
                '--tensor-parallel-size "$(nvidia-smi -L | wc -l)"'
            ],
            "env": _env(_VLLM_VARS),
            "ports": [8000],
            "shm_size_gb": 16,
        },
        "disk_gb": 200,
    },
    usage="curl http://HOST:8000/v1/models; point an OpenAI client's base_url at http://HOST:8000/v1",
)

_JUPYTER_VARS = (
    GalleryVariable("JUPYTER_TOKEN", "the password Jupyter Lab asks for: a long random string", secret=True),
)
_JUPYTER = GalleryEntry(
    slug="jupyter",
    name="Jupyter Lab with PyTorch",
    description="Jupyter Lab from the Jupyter project's CUDA 12 PyTorch notebook image, on port 8888, behind the "
    "token you set.",
    min_gpu_memory_gb=8,
    memory_note="any CUDA GPU; size it by your notebooks' models",
    variables=_JUPYTER_VARS,
    launch={
        "workload": {
            "kind": "container",
            "image": JUPYTER_IMAGE,
            "command": ["bash", "-c"],
            # Jupyter Server reads JUPYTER_TOKEN itself: the token never appears in the process list.
            "args": [
                'test -n "$JUPYTER_TOKEN" || { echo "JUPYTER_TOKEN is empty: set it to a long random secret" >&2; '
                "exit 64; }; exec start-notebook.py --ServerApp.ip=0.0.0.0 --ServerApp.port=8888"
            ],
            "env": _env(_JUPYTER_VARS),
            "ports": [8888],
            "shm_size_gb": 8,
        },
        "disk_gb": 100,
    },
    usage="open http://HOST:8888/lab and give JUPYTER_TOKEN",
)

_BATCH_SCRIPT = r"""#!/bin/bash
# Runs JOB_COMMAND once and keeps what it printed, its exit status and the GPUs it ran on in RESULTS_DIR.
set -uo pipefail
: "${JOB_COMMAND:?set JOB_COMMAND to the command your job runs}"
results="${RESULTS_DIR:-$HOME/results}"
mkdir -p "$results" || exit 1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$results/gpus.csv" 2>&1
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
bash -c "$JOB_COMMAND" > "$results/stdout.log" 2> "$results/stderr.log"
status=$?
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)
python3 - "$results/summary.json" "$started" "$finished" "$status" <<'EOF'
import json, os, sys
path, started, finished, status = sys.argv[1:]
summary = {"command": os.environ["JOB_COMMAND"], "started": started, "finished": finished, "exit_status": int(status)}
with open(path, "w") as out:
    json.dump(summary, out, indent=2)
EOF
echo "job finished with status $status; results in $results"
exit "$status"
"""
_BATCH_VARS = (
    GalleryVariable(
        "JOB_COMMAND",
        "the command the job runs, e.g. python3 train.py --epochs 3",
        default="nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv",
    ),
    GalleryVariable("RESULTS_DIR", "where the results are written on the machine (default ~/results)", required=False),
)
_BATCH = GalleryEntry(
    slug="batch",
    name="Batch job",
    description="Runs one command on the machine at boot and writes its output, exit status and the GPUs it "
    "ran on to a results folder, to fetch with scp or rsync. Set a spend cap or a run time so the "
    "machine stops after the job.",
    min_gpu_memory_gb=8,
    memory_note="whatever your job needs",
    variables=_BATCH_VARS,
    launch={"workload": {"kind": "script", "script": _BATCH_SCRIPT, "env": _env(_BATCH_VARS)}, "disk_gb": 100},
    usage="broker ssh ORDER -- cat results/summary.json; copy the folder with scp",
)

GALLERY: tuple[GalleryEntry, ...] = (_PYTORCH, _VLLM, _JUPYTER, _BATCH)
GALLERY_PREFIX = "gallery:"


def gallery_list() -> tuple[GalleryEntry, ...]:
    """Every gallery entry, in the order the storefront shows them."""
    return GALLERY


def gallery_get(slug: str) -> GalleryEntry | None:
    """The entry called ``slug`` (a ``gallery:`` prefix is allowed), or None."""
    slug = (slug or "").removeprefix(GALLERY_PREFIX)
    return next((entry for entry in GALLERY if entry.slug == slug), None)


def gallery_launch(entry: GalleryEntry, values: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The entry's launch configuration with ``values`` for its variables (optional ones added when given).
    Raises ``LaunchConfigInvalid`` naming a variable the entry does not have, or a required one left empty."""
    values = dict(values or {})
    known = {v.name: v for v in entry.variables}
    errors: dict[str, str] = {}
    for name in sorted(set(values) - set(known)):
        errors[f"env.{name}"] = f"not a variable of {entry.name} (it has {', '.join(known)})"
    launch = copy.deepcopy(dict(entry.launch))
    workload = launch["workload"]
    env = {e["name"]: e for e in workload.get("env") or []}
    for variable in entry.variables:
        value = values.get(variable.name)
        if value is None and variable.name not in env:
            continue
        item = env.setdefault(variable.name, {"name": variable.name, "value": ""})
        if value is not None:
            item["value"] = value
        if variable.secret:
            item["secret"] = True
        if variable.required and not item["value"]:
            errors[f"env.{variable.name}"] = f"{variable.purpose}: required"
    if errors:
        raise LaunchConfigInvalid(errors)
    workload["env"] = list(env.values())
    return launch
