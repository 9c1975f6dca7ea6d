"""batch/v1 Jobs as the Job controller runs them, for a script workload: one pod at a time from the template, a
failed pod replaced until ``backoffLimit`` failures, the Job ``Complete`` when a pod succeeds or ``Failed`` with
``BackoffLimitExceeded``.

Shapes, defaults and labels from the Job reference
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/) and "Jobs"
(https://kubernetes.io/docs/concepts/workloads/controllers/job/): the controller labels its pods
``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name`` (and the legacy ``controller-uid``,
``job-name``), names them ``<job>-<5 characters>`` and owns them through ``ownerReferences``; the pod template's
``restartPolicy`` must be ``Never`` or ``OnFailure``. Only ``parallelism`` and ``completions`` of 1 are run.
"""

from __future__ import annotations

import copy
from typing import Any

from sandboxes.kubernetes.wire import Cause, Resource, invalid, now_rfc3339, required

JOB_LABELS = ("batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "controller-uid", "job-name")


def prepare_job(obj: dict[str, Any], resource: Resource) -> dict[str, Any]:
    """Validate and default a Job; 422 naming the field for a missing template or a restart policy a Job refuses."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise invalid(resource, name, [required("spec.template.spec.containers")])
    policy = template["spec"].get("restartPolicy")
    if policy not in ("Never", "OnFailure"):
        shown = f'"{policy}"' if policy else '""'
        raise invalid(resource, name, [Cause("spec.template.spec.restartPolicy", "FieldValueNotSupported",
                      f'Unsupported value: {shown}: supported values: "OnFailure", "Never"')])  # fmt: skip
    for key in ("parallelism", "completions"):
        if spec.get(key, 1) != 1:
            raise invalid(resource, name, [Cause(f"spec.{key}", "FieldValueNotSupported",
                          f"Unsupported value: {spec[key]}: the sandbox runs Jobs of one pod")])  # fmt: skip
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    obj["status"] = {}
    return obj


def label_job(job: dict[str, Any]) -> None:
    """Once the Job has its uid: its selector and its template's labels, as the API server sets them."""
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    labels = dict(zip(JOB_LABELS, (uid, name, uid, name), strict=True))
    job["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template_meta = job["spec"]["template"].setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}


def pod_for(job: dict[str, Any], name: str) -> dict[str, Any]:
    """The controller's pod for the Job: the template, named ``name``, owned by the Job."""
    template = copy.deepcopy(job["spec"]["template"])
    metadata = template.get("metadata") or {}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": job["metadata"]["name"] + "-",
            "labels": metadata.get("labels") or {},
            **({"annotations": metadata["annotations"]} if metadata.get("annotations") else {}),
        },
        "spec": template["spec"],
    }


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def job_status(job: dict[str, Any], phases: list[str]) -> tuple[dict[str, Any], bool]:
    """The Job's status from its pods' phases, and whether another pod is due (none active, not finished)."""
    status = dict(job.get("status") or {})
    active = sum(1 for p in phases if p not in ("Succeeded", "Failed"))
    succeeded = sum(1 for p in phases if p == "Succeeded")
    failed = sum(1 for p in phases if p == "Failed")
    stamp = now_rfc3339()
    status.setdefault("startTime", stamp)
    status.update(active=active, succeeded=succeeded, failed=failed, ready=active, terminating=0)
    finished = any(c["type"] in ("Complete", "Failed") for c in status.get("conditions") or [])
    if not finished and succeeded >= 1:
        status["completionTime"] = stamp
        status["conditions"] = [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods", "lastProbeTime": stamp,
             "lastTransitionTime": stamp},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods", "lastProbeTime": stamp,
             "lastTransitionTime": stamp},
        ]  # fmt: skip
        finished = True
    elif not finished and failed > int(job["spec"].get("backoffLimit", 6)):
        status["conditions"] = [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit", "lastProbeTime": stamp,
             "lastTransitionTime": stamp},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit", "lastProbeTime": stamp,
             "lastTransitionTime": stamp},
        ]  # fmt: skip
        finished = True
    return status, not finished and active == 0
