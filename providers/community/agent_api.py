"""The broker's end of the host agent protocol: ``/agent/v1/register``, ``/agent/v1/heartbeat`` and, for
outbound-only agents, ``/agent/v1/commands`` and ``/agent/v1/commands/<id>/answer``.

Plain Django views (no session, no CSRF: every request is HMAC-signed by the machine's agent instead). A body
over the endpoint's bound is refused (413 ``too_large``) before it is read or hashed; heartbeats and polls
beyond the per-machine rate are refused (429 ``too_many_heartbeats``, ``too_many_polls``); all in the
protocol's ``{"code", "message"}``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from providers.community import protocol
from providers.community.commands import POLL_S, CommandRefused, command_answer, commands_deliver
from providers.community.services import (
    HeartbeatRefused,
    MachineInvalid,
    authenticate,
    machine_heartbeat,
    machine_register,
)
from untrusted import jsonbody

# A heartbeat of 64 GPUs' samples is under 10 KiB; a registration carries the hardware and the self-test.
MAX_HEARTBEAT_BODY = 16 * 1024
MAX_REGISTER_BODY = 64 * 1024
MAX_GPUS = 64
MAX_POLL_BODY = 1024
# An answer carries what the agent would have answered over HTTP (the client reads at most this), and a wrapper.
MAX_ANSWER_BODY = jsonbody.MAX_JSON_BYTES + 1024
SAMPLE_KEYS = ("index", "utilization_pct", "temperature_c", "power_w", "memory_used_gb")


def _signed_json(request: HttpRequest, max_bytes: int) -> tuple[Any, dict[str, Any]] | JsonResponse:
    declared = request.headers.get("Content-Length") or "0"
    if not declared.isdigit() or len(declared) > 9 or int(declared) > max_bytes:
        # Refused before anything reads or hashes it.
        return JsonResponse({"code": "too_large", "message": f"the body is larger than {max_bytes} bytes"}, status=413)
    body = request.body
    try:
        machine = authenticate(request.headers, request.method or "POST", request.get_full_path(), body)
    except protocol.Rejected as exc:
        return JsonResponse({"code": exc.code, "message": exc.message}, status=401)
    try:
        payload = jsonbody.bounded_json(body, max_bytes=max_bytes)
    except ValueError as exc:
        return JsonResponse({"code": "invalid", "message": f"the body is not acceptable JSON: {exc}"}, status=400)
    if not isinstance(payload, dict):
        return JsonResponse({"code": "invalid", "message": "the body is not a JSON object"}, status=400)
    return machine, payload


@csrf_exempt
@require_POST
def register(request: HttpRequest) -> JsonResponse:
    checked = _signed_json(request, MAX_REGISTER_BODY)
    if isinstance(checked, JsonResponse):
        return checked
    machine, payload = checked
    url = payload.get("agent_url")
    # Empty: an outbound-only agent (behind NAT), which polls for the broker's commands instead.
    if not isinstance(url, str) or (url and not url.startswith(("http://", "https://"))):
        return JsonResponse({"code": "invalid", "message": "agent_url: an http(s) URL or empty"}, status=400)
    hardware, self_test = payload.get("hardware"), payload.get("self_test")
    hardware = hardware if isinstance(hardware, dict) else {}
    self_test = self_test if isinstance(self_test, dict) else {}
    try:
        machine = machine_register(machine=machine, agent_url=url, hardware=hardware, self_test=self_test)
    except MachineInvalid as exc:
        return JsonResponse({"code": "invalid", "message": str(exc)}, status=400)
    return JsonResponse(
        {"machine": machine.name, "state": machine.state, "self_test_ok": machine.self_test_ok,
         "problem": machine.self_test.get("problem", ""), "heartbeat_s": protocol.HEARTBEAT_S}
    )  # fmt: skip


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    checked = _signed_json(request, MAX_HEARTBEAT_BODY)
    if isinstance(checked, JsonResponse):
        return checked
    machine, payload = checked
    gpus = payload.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS or not all(isinstance(g, dict) for g in gpus):
        return JsonResponse(
            {"code": "invalid", "message": f"gpus: a list of at most {MAX_GPUS} per-GPU objects is required"},
            status=400,
        )
    # Only the sample's own fields are kept: anything else an agent adds would only take room.
    gpus = [{key: g[key] for key in SAMPLE_KEYS if key in g} for g in gpus]
    instances = payload.get("instances", 0)
    if not isinstance(instances, int) or isinstance(instances, bool) or not 0 <= instances <= 1024:
        instances = 0
    try:
        beat = machine_heartbeat(machine=machine, gpus=gpus, instances=instances)
    except HeartbeatRefused as exc:
        return JsonResponse({"code": exc.code, "message": exc.message}, status=exc.status)
    # Kept either way; the agent's operator learns which figures the broker shows as unverified, and why.
    return JsonResponse({"machine": machine.name, "at": beat.at.isoformat(), "unverified": beat.unverified_reason})


@csrf_exempt
@require_POST
def commands(request: HttpRequest) -> JsonResponse:
    """An outbound-only agent's poll: the broker's commands for its machine, each handed out once."""
    checked = _signed_json(request, MAX_POLL_BODY)
    if isinstance(checked, JsonResponse):
        return checked
    machine, _ = checked
    try:
        pending = commands_deliver(machine=machine)
    except CommandRefused as exc:
        return JsonResponse({"code": exc.code, "message": exc.message}, status=exc.status)
    return JsonResponse({"commands": pending, "poll_s": POLL_S})


@csrf_exempt
@require_POST
def command_answered(request: HttpRequest, command_id: uuid.UUID) -> JsonResponse:
    """An outbound-only agent's answer to one command: the HTTP status and JSON object it would have sent."""
    checked = _signed_json(request, MAX_ANSWER_BODY)
    if isinstance(checked, JsonResponse):
        return checked
    machine, payload = checked
    status, answer = payload.get("status"), payload.get("answer")
    if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
        return JsonResponse({"code": "invalid", "message": "status: an HTTP status from 200 to 599"}, status=400)
    if not isinstance(answer, dict):
        return JsonResponse({"code": "invalid", "message": "answer: a JSON object"}, status=400)
    try:
        command_answer(machine=machine, command_id=command_id, status=status, answer=answer)
    except CommandRefused as exc:
        return JsonResponse({"code": exc.code, "message": exc.message}, status=exc.status)
    return JsonResponse({"id": str(command_id), "state": "answered"})


urlpatterns = [
    path("register", register, name="agent-register"),
    path("heartbeat", heartbeat, name="agent-heartbeat"),
    path("commands", commands, name="agent-commands"),
    path("commands/<uuid:command_id>/answer", command_answered, name="agent-command-answer"),
]
