"""The broker's end of the lease protocol (``providers/community/lease.py``), under ``/agent/v1/lease/``.

Plain Django views: no session and no CSRF. ``claim`` and ``boot-failed`` are authenticated by the one-time
boot token in their body; every other call is HMAC-signed with the lease's own key (``protocol.py``),
replay-checked. Bodies are bounded in size and depth before they are parsed, and every report is validated into a DTO.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from marketplace.launch.leases import (
    LeaseRefused,
    lease_authenticate,
    lease_boot_failed,
    lease_claim,
    lease_failed,
    lease_heartbeat,
    lease_ready,
    lease_secrets,
    ready_report_parse,
    telemetry_parse,
    workload_log_parse,
)
from marketplace.models import Lease
from providers.community import protocol
from providers.community.bundle import agent_bundle, agent_bundle_sha256
from untrusted import jsonbody

MAX_BODY = 64 * 1024


def _refusal(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"code": code, "message": message}, status=status)


def _body(request: HttpRequest) -> Any:
    """The request's JSON, bounded; raises ``LeaseRefused``."""
    declared = request.headers.get("Content-Length") or "0"
    if not declared.isdigit() or len(declared) > 9 or int(declared) > MAX_BODY:
        raise LeaseRefused("too_large", f"the body is larger than {MAX_BODY} bytes", status=413)
    try:
        return jsonbody.bounded_json(request.body, max_bytes=MAX_BODY)
    except ValueError as exc:
        raise LeaseRefused("invalid", f"the body is not acceptable JSON: {exc}") from None


def _signed(handler: Callable[[Lease, Any], dict[str, Any]]) -> Callable[[HttpRequest], JsonResponse]:
    """A lease call signed with the lease's key: authenticated (401 for a forged, stale or replayed one), its
    body bounded and parsed, then ``handler(lease, body)``'s answer, or its refusal in the protocol's shape."""

    @csrf_exempt
    @require_POST
    @never_cache
    @functools.wraps(handler)
    def view(request: HttpRequest) -> JsonResponse:
        declared = request.headers.get("Content-Length") or "0"
        if not declared.isdigit() or len(declared) > 9 or int(declared) > MAX_BODY:
            # Refused before anything reads or hashes it.
            return _refusal("too_large", f"the body is larger than {MAX_BODY} bytes", 413)
        try:
            lease = lease_authenticate(request.headers, request.method or "POST", request.get_full_path(), request.body)
        except protocol.Rejected as exc:
            return _refusal(exc.code, exc.message, 401)
        try:
            return JsonResponse(handler(lease, _body(request)))
        except LeaseRefused as exc:
            return _refusal(exc.code, exc.message, exc.status)

    return view


@csrf_exempt
@require_POST
@never_cache
def claim(request: HttpRequest) -> JsonResponse:
    """Not signed: the one-time boot token in the body is the credential."""
    try:
        body = _body(request)
        token = body.get("boot_token") if isinstance(body, dict) else None
        lease, secret = lease_claim(token=token)
    except LeaseRefused as exc:
        return _refusal(exc.code, exc.message, exc.status)
    return JsonResponse(
        {"key_id": lease.key_id, "secret": secret, "heartbeat_s": settings.LEASE_HEARTBEAT_S,
         "order": lease.order.ref}
    )  # fmt: skip


@csrf_exempt
@require_POST
@never_cache
def boot_failed(request: HttpRequest) -> JsonResponse:
    """The boot script's report that the machine cannot run the agent (``{"boot_token", "reason", "version"}``:
    a reason code and a version number, nothing else). Not signed: the token is the credential, and spends."""
    try:
        body = _body(request)
        if not isinstance(body, dict) or set(body) - {"boot_token", "reason", "version"}:
            raise LeaseRefused("invalid", "an object with boot_token, reason and version")
        lease_boot_failed(token=body.get("boot_token"), reason=body.get("reason"), version=body.get("version"))
    except LeaseRefused as exc:
        return _refusal(exc.code, exc.message, exc.status)
    return JsonResponse({"state": "failed"})


@_signed
def secrets(lease: Lease, body: Any) -> dict[str, Any]:
    return lease_secrets(lease=lease)


@_signed
def ready(lease: Lease, body: Any) -> dict[str, Any]:
    outcome = lease_ready(lease=lease, report=ready_report_parse(body))
    return {"state": outcome.state, "problem": outcome.problem}


@_signed
def failed(lease: Lease, body: Any) -> dict[str, Any]:
    body = body if isinstance(body, dict) else {}
    lease_failed(lease=lease, stage=body.get("stage"), reason=body.get("reason"))
    return {"state": "failed"}


@_signed
def heartbeat(lease: Lease, body: Any) -> dict[str, Any]:
    gpus, workload_state = telemetry_parse(body)
    logs = workload_log_parse(body)
    return {"state": lease_heartbeat(lease=lease, gpus=gpus, workload_state=workload_state, logs=logs)}


@require_GET
def agent(request: HttpRequest) -> HttpResponse:
    """The lease agent as a zipapp; the boot script checks its SHA-256 before running it."""
    response = HttpResponse(agent_bundle(), content_type="application/zip")
    response["Content-Disposition"] = 'attachment; filename="agent.pyz"'
    response["X-Content-SHA256"] = agent_bundle_sha256()
    return response


urlpatterns = [
    path("claim", claim, name="lease-claim"),
    path("boot-failed", boot_failed, name="lease-boot-failed"),
    path("secrets", secrets, name="lease-secrets"),
    path("ready", ready, name="lease-ready"),
    path("failed", failed, name="lease-failed"),
    path("heartbeat", heartbeat, name="lease-heartbeat"),
    path("agent.pyz", agent, name="lease-agent"),
]
