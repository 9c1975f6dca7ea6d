"""The broker's end of the host agent protocol: ``/agent/v1/register`` and ``/agent/v1/heartbeat``.

Plain Django views (no session, no CSRF: every request is HMAC-signed by the machine's agent instead).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from providers.community import protocol
from providers.community.services import authenticate, machine_heartbeat, machine_register


def _signed_json(request: HttpRequest) -> tuple[Any, dict[str, Any]] | JsonResponse:
    body = request.body
    try:
        machine = authenticate(request.headers, request.method or "POST", request.get_full_path(), body)
    except protocol.Rejected as exc:
        return JsonResponse({"code": exc.code, "message": exc.message}, status=401)
    try:
        payload = protocol.bounded_json(body)
    except ValueError as exc:
        return JsonResponse({"code": "invalid", "message": f"the body is not acceptable JSON: {exc}"}, status=400)
    if not isinstance(payload, dict):
        return JsonResponse({"code": "invalid", "message": "the body is not a JSON object"}, status=400)
    return machine, payload


@csrf_exempt
@require_POST
def register(request: HttpRequest) -> JsonResponse:
    checked = _signed_json(request)
    if isinstance(checked, JsonResponse):
        return checked
    machine, payload = checked
    url = str(payload.get("agent_url") or "")
    if not url.startswith(("http://", "https://")):
        return JsonResponse({"code": "invalid", "message": "agent_url: an http(s) URL is required"}, status=400)
    hardware, self_test = payload.get("hardware"), payload.get("self_test")
    hardware = hardware if isinstance(hardware, dict) else {}
    self_test = self_test if isinstance(self_test, dict) else {}
    machine = machine_register(machine=machine, agent_url=url, hardware=hardware, self_test=self_test)
    return JsonResponse(
        {"machine": machine.name, "state": machine.state, "self_test_ok": machine.self_test_ok,
         "problem": machine.self_test.get("problem", ""), "heartbeat_s": protocol.HEARTBEAT_S}
    )  # fmt: skip


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    checked = _signed_json(request)
    if isinstance(checked, JsonResponse):
        return checked
    machine, payload = checked
    gpus = payload.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        return JsonResponse({"code": "invalid", "message": "gpus: a list of per-GPU objects is required"}, status=400)
    instances = payload.get("instances", 0)
    beat = machine_heartbeat(machine=machine, gpus=gpus, instances=instances if isinstance(instances, int) else 0)
    return JsonResponse({"machine": machine.name, "at": beat.at.isoformat()})


urlpatterns = [
    path("register", register, name="agent-register"),
    path("heartbeat", heartbeat, name="agent-heartbeat"),
]
