"""The GCP sandbox's zone operations: each insert or delete is one, finishing after the settle time, and
``zoneOperations.get``/``list`` answer for them."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.boot import Booter
from sandboxes.gcp import filters as gcp_filter
from sandboxes.gcp.auth import Principal
from sandboxes.gcp.state import _GlobalOperation, _Instance, _Operation, _Request
from sandboxes.gcp.wire import (
    API_BASE,
    ApiError,
    list_page,
    now_iso,
    numeric_id,
)
from sandboxes.server import json_response


class OperationHandlers:
    """Zone operations, mixed into ``GcpSandbox``."""

    booter: Booter
    settle_seconds: float
    _lock: threading.Lock
    _counter: itertools.count[int]
    _instances: dict[tuple[str, str, str], _Instance]
    _operations: dict[tuple[str, str, str], _Operation]
    _global_ops: dict[tuple[str, str], _GlobalOperation]
    _disks: dict[tuple[str, str, str], dict[str, Any]]
    _complete_global: Callable[[_GlobalOperation], None]
    _set_running: Callable[[_Instance], None]
    _powered: Callable[[str, _Instance], None]
    _zone_or_404: Callable[[_Request], str]

    def _new_operation(
        self,
        project: str,
        zone: str,
        kind: str,
        inst: _Instance,
        principal: Principal,
        failure: tuple[str, int, str, str] | None,
    ) -> _Operation:
        now = now_iso()
        stamp = int(time.time() * 1000)
        n = next(self._counter)
        name = f"operation-{stamp}-{hashlib.sha256(f'{n}{inst.name}'.encode()).hexdigest()[:13]}-{n:08x}-sandbox"
        zone_url = f"{API_BASE}projects/{project}/zones/{zone}"
        body = {
            "kind": "compute#operation",
            "id": numeric_id("operation", name),
            "name": name,
            "zone": zone_url,
            "operationType": kind,
            "targetLink": f"{zone_url}/instances/{inst.name}",
            "targetId": inst.body["id"],
            "status": "RUNNING",
            "user": principal.email,
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": f"{zone_url}/operations/{name}",
        }
        op = _Operation(project, zone, body, kind, inst.name, failure)
        self._operations[(project, zone, name)] = op
        return op

    def _complete(self, op: _Operation) -> None:
        """Finish a running operation and apply its effect. Caller holds the lock."""
        if op.body["status"] == "DONE":
            return
        op.body.update(status="DONE", progress=100, endTime=now_iso())
        key = (op.project, op.zone, op.target)
        inst = self._instances.get(key)
        if op.failure is not None:
            code, status, status_message, message = op.failure
            op.body["error"] = {"errors": [{"code": code, "message": message}]}
            op.body["httpErrorStatusCode"] = status
            op.body["httpErrorMessage"] = status_message
            if op.kind == "insert":
                self._instances.pop(key, None)
                self._disks.pop(key, None)
            return
        if op.kind == "insert" and inst is not None and inst.body["status"] == "PROVISIONING":
            inst.body["status"] = "STAGING"
            inst.since = time.monotonic()
        elif op.kind == "delete":
            self._instances.pop(key, None)
            self._disks.pop(key, None)  # the boot disk is created with autoDelete
            self.booter.halt(f"{op.zone}/{op.target}")
        elif inst is not None and op.kind in ("stop", "start", "reset"):
            self._powered(op.kind, inst)

    def _sweep(self) -> None:
        """Operations (and STAGING instances) older than ``settle_seconds`` finish on their own, as in GCP."""
        deadline = time.monotonic() - self.settle_seconds
        with self._lock:
            for op in list(self._operations.values()):
                if op.body["status"] != "DONE" and op.created <= deadline:
                    self._complete(op)
            for inst in self._instances.values():
                if inst.body["status"] == "STAGING" and inst.since <= deadline:
                    self._set_running(inst)
            for global_op in list(self._global_ops.values()):
                if global_op.body["status"] != "DONE" and global_op.created <= deadline:
                    self._complete_global(global_op)

    def _operation_or_404(self, request: _Request) -> _Operation:
        zone = self._zone_or_404(request)
        op = self._operations.get((request.project, zone, request.route["operation"]))
        if op is None:
            raise ApiError(
                404,
                f"The resource 'projects/{request.project}/zones/{zone}/operations/{request.route['operation']}' "
                "was not found",
                "notFound",
            )
        return op

    def _operations_get(self, request: _Request) -> Response:
        with self._lock:
            op = self._operation_or_404(request)
            self._complete(op)  # observing an operation is what moves it on in the sandbox
            return json_response(op.body)

    def _operations_list(self, request: _Request) -> Response:
        zone = self._zone_or_404(request)
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        with self._lock:
            ops = sorted(
                (o for o in self._operations.values() if o.project == request.project and o.zone == zone),
                key=lambda o: (o.body["insertTime"], o.body["name"]),
            )
            listed = [o for o in ops if matches(o.body)]
            for op in listed:
                self._complete(op)
            items = [dict(o.body) for o in listed]
        query = json.dumps(["operations", request.project, zone, request.query.get("filter", "")])
        return json_response(
            list_page(
                request.query,
                query,
                items,
                kind="compute#operationList",
                path=f"projects/{request.project}/zones/{zone}/operations",
            )
        )
