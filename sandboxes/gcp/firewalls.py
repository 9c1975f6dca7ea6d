"""The GCP sandbox's VPC firewall rules: insert, get, list and delete as global operations (with ``requestId``
repeats), and which ports and sources the rules let reach an instance."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.gcp import boot as gcp_boot
from sandboxes.gcp import filters as gcp_filter
from sandboxes.gcp.auth import Principal
from sandboxes.gcp.state import _UUID, _GlobalOperation, _Request
from sandboxes.gcp.wire import (
    API_BASE,
    ApiError,
    list_page,
    now_iso,
    numeric_id,
)
from sandboxes.server import json_response


class FirewallHandlers:
    """Firewall rules and global operations, mixed into ``GcpSandbox``."""

    _lock: threading.Lock
    _counter: itertools.count[int]
    _firewalls: dict[tuple[str, str], dict[str, Any]]
    _global_ops: dict[tuple[str, str], _GlobalOperation]
    _global_request_ids: dict[tuple[str, str], str]
    instance_resource: Callable[[str], dict[str, Any]]

    def add_firewall(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a firewall rule at once (a seller's own, say), checked as ``firewalls.insert`` checks it."""
        firewall = gcp_boot.firewall_json(project, body)
        with self._lock:
            self._firewalls[(project, firewall["name"])] = firewall
        return dict(firewall)

    def firewall_rules(self, project: str | None = None) -> list[dict[str, Any]]:
        """Every VPC firewall rule (as ``firewalls.get`` answers it), optionally of one project, by name."""
        with self._lock:
            rules = [dict(f) for (p, _), f in self._firewalls.items() if project is None or p == project]
        return sorted(rules, key=lambda f: f["name"])

    def lets_in(self, instance_id: str) -> set[tuple[int, str]]:
        """Each (tcp port, source range) the project's firewall rules let reach the instance, deny rules applied."""
        body = self.instance_resource(instance_id)
        project = body["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
        network = body["networkInterfaces"][0]["network"]
        tags = list((body.get("tags") or {}).get("items") or [])
        return gcp_boot.lets_in(self.firewall_rules(project), network, tags)

    def _firewall_or_404(self, request: _Request) -> dict[str, Any]:
        firewall = self._firewalls.get((request.project, request.route["firewall"]))
        if firewall is None:
            path = f"projects/{request.project}/global/firewalls/{request.route['firewall']}"
            raise ApiError(404, f"The resource '{path}' was not found", "notFound")
        return firewall

    def _firewalls_get(self, request: _Request) -> Response:
        with self._lock:
            return json_response(self._firewall_or_404(request))

    def _firewalls_list(self, request: _Request) -> Response:
        try:
            matches = gcp_filter.parse(request.query.get("filter"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid") from None
        with self._lock:
            found = [dict(f) for (p, _), f in sorted(self._firewalls.items()) if p == request.project]
        found = [f for f in found if matches(f)]
        query = json.dumps(["firewalls", request.project, request.query.get("filter", "")])
        return json_response(
            list_page(
                request.query,
                query,
                found,
                kind="compute#firewallList",
                path=f"projects/{request.project}/global/firewalls",
            )
        )

    def _repeated_global(self, request: _Request) -> Response | None:
        """A repeated request id answers with the first operation, as it is now. Caller holds the lock."""
        request_id = request.query.get("requestId", "")
        if request_id and not _UUID.match(request_id):
            raise ApiError(400, f"Invalid value for field 'requestId': '{request_id}'. Must be a UUID.", "invalid")
        name = self._global_request_ids.get((request.project, request_id)) if request_id else None
        op = self._global_ops.get((request.project, name)) if name else None
        return json_response(op.body) if op is not None else None

    def _firewalls_insert(self, request: _Request, principal: Principal) -> Response:
        body = request.json()
        with self._lock:
            repeated = self._repeated_global(request)
            if repeated is not None:
                return repeated
            firewall = gcp_boot.firewall_json(request.project, body)
            name = firewall["name"]
            pending = any(
                o.kind == "insert" and o.target == name and o.project == request.project and o.body["status"] != "DONE"
                for o in self._global_ops.values()
            )
            if (request.project, name) in self._firewalls or pending:
                path = f"projects/{request.project}/global/firewalls/{name}"
                raise ApiError(409, f"The resource '{path}' already exists", "alreadyExists")
            op = self._new_global_operation(request, principal, "insert", name, firewall)
            return json_response(op.body)

    def _firewalls_delete(self, request: _Request, principal: Principal) -> Response:
        with self._lock:
            repeated = self._repeated_global(request)
            if repeated is not None:
                return repeated
            firewall = self._firewall_or_404(request)
            op = self._new_global_operation(request, principal, "delete", firewall["name"], None)
            return json_response(op.body)

    def _new_global_operation(
        self, request: _Request, principal: Principal, kind: str, target: str, firewall: dict[str, Any] | None
    ) -> _GlobalOperation:
        """A RUNNING global operation on a firewall rule. Caller holds the lock."""
        now = now_iso()
        name = gcp_boot.operation_name(target, next(self._counter), int(time.time() * 1000))
        base = f"{API_BASE}projects/{request.project}/global"
        body = {
            "kind": "compute#operation",
            "id": numeric_id("operation", name),
            "name": name,
            "operationType": kind,
            "targetLink": f"{base}/firewalls/{target}",
            "targetId": numeric_id("firewall", request.project, target),
            "status": "RUNNING",
            "user": principal.email,
            "progress": 0,
            "insertTime": now,
            "startTime": now,
            "selfLink": f"{base}/operations/{name}",
        }
        op = _GlobalOperation(request.project, body, kind, target, firewall)
        self._global_ops[(request.project, name)] = op
        request_id = request.query.get("requestId", "")
        if request_id:
            self._global_request_ids[(request.project, request_id)] = name
        return op

    def _complete_global(self, op: _GlobalOperation) -> None:
        """Finish a firewall operation and apply it. Caller holds the lock."""
        if op.body["status"] == "DONE":
            return
        op.body.update(status="DONE", progress=100, endTime=now_iso())
        if op.kind == "insert" and op.firewall is not None:
            self._firewalls[(op.project, op.target)] = op.firewall
        elif op.kind == "delete":
            self._firewalls.pop((op.project, op.target), None)

    def _global_operations_get(self, request: _Request) -> Response:
        with self._lock:
            op = self._global_ops.get((request.project, request.route["operation"]))
            if op is None:
                path = f"projects/{request.project}/global/operations/{request.route['operation']}"
                raise ApiError(404, f"The resource '{path}' was not found", "notFound")
            self._complete_global(op)  # observing an operation is what moves it on in the sandbox
            return json_response(op.body)
