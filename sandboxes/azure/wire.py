"""What every Azure sandbox resource provider answers alike: ARM's error body and its asynchronous operations.

ARM reports a failed request as ``{"error": {"code", "message", "target"?}}`` with the HTTP status of the
failure, and a long-running PUT or DELETE with an ``Azure-AsyncOperation`` URL whose GET answers ``status``
(``InProgress``, ``Succeeded``, ``Failed`` with its ``error``). The Compute and Network parts of the sandbox
share one ``Operations`` store, so their operation URLs differ only in the provider namespace.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.server import json_response


def arm_error(
    code: str,
    message: str,
    status: int,
    headers: dict[str, str] | None = None,
    *,
    target: str | None = None,
    details: list[dict[str, Any]] | None = None,
) -> Response:
    """ARM's error answer; ``target`` names the offending field where ARM names it (``osProfile.customData``),
    ``details`` the inner errors where ARM lists them."""
    error: dict[str, Any] = {"code": code, "message": message}
    if target is not None:
        error["target"] = target
    if details is not None:
        error["details"] = details
    response = json_response({"error": error}, status=status)
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class Operation:
    """One asynchronous operation: done at ``done_at`` (monotonic seconds), failed with ``error`` if set."""

    id: str
    location: str
    started: str
    done_at: float
    error: tuple[str, str] | None = None


class Operations:
    """The sandbox's asynchronous operations by id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._operations: dict[str, Operation] = {}

    def new(self, location: str, seconds: float, error: tuple[str, str] | None = None) -> Operation:
        operation = Operation(str(uuid.uuid4()), location, now_iso(), time.monotonic() + seconds, error)
        with self._lock:
            self._operations[operation.id] = operation
        return operation

    def response(self, op_id: str) -> Response:
        """The operation-status GET: ``InProgress`` until done, then ``Succeeded`` or ``Failed`` with the error."""
        with self._lock:
            operation = self._operations.get(op_id)
        if operation is None:
            return arm_error("NotFound", f"The operation '{op_id}' was not found.", 404)
        result: dict[str, Any] = {"startTime": operation.started, "name": op_id}
        if time.monotonic() < operation.done_at:
            result["status"] = "InProgress"
        elif operation.error:
            code, message = operation.error
            result.update(status="Failed", endTime=now_iso(), error={"code": code, "message": message})
        else:
            result.update(status="Succeeded", endTime=now_iso())
        return json_response(result)

    def url(self, host_url: str, subscription: str, namespace: str, operation: Operation, api_version: str) -> str:
        """Where ARM points ``Azure-AsyncOperation``: the provider's location-scoped operations collection."""
        return (
            f"{host_url.rstrip('/')}/subscriptions/{subscription}/providers/{namespace}/locations/"
            f"{operation.location}/operations/{operation.id}?api-version={api_version}"
        )

    def clear(self) -> None:
        with self._lock:
            self._operations.clear()
