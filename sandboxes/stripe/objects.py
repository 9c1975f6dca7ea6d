"""What the Stripe sandbox holds: every object by id on the account it lives on, found, stored and built in
Stripe's shape, and the events each change records for the webhook endpoint, signed as Stripe signs them.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

from sandboxes.stripe import wire
from sandboxes.stripe.state import API_VERSION, MAX_PENDING_EVENTS, _Ctx, _now
from sandboxes.stripe.wire import missing


class ObjectStore:
    """The sandbox's objects and events; the handlers' mixins build on it."""

    _endpoint: dict[str, str] | None
    _objects: dict[str, dict[str, Any]]
    _payloads: dict[str, str]
    _pending: list[str]
    _scope: dict[str, str]
    _wake: threading.Event

    def _control_ctx(self) -> _Ctx:
        return _Ctx("control", None, None, None, "", API_VERSION)

    def _find(self, kind: str, object_id: str) -> dict[str, Any]:
        """An object of ``kind`` for a control route (KeyError, answered 404, when there is none); lock held."""
        found = self._objects.get(object_id)
        if found is None or found["object"] != kind:
            raise KeyError(object_id[:40])
        return found

    def _lookup(self, ctx: _Ctx, kind: str, object_id: str, param: str = "id") -> dict[str, Any]:
        """An object of ``kind`` on the account the request acts for, or Stripe's 404 resource_missing."""
        found = self._objects.get(object_id)
        if found is None or found["object"] != kind or self._scope[object_id] != (ctx.account or ""):
            raise missing(kind, object_id, param)
        return found

    def _store(self, ctx: _Ctx, obj: dict[str, Any]) -> dict[str, Any]:
        self._objects[obj["id"]] = obj
        self._scope[obj["id"]] = ctx.account or ""
        return obj

    def _base(self, prefix: str, kind: str, params: dict[str, Any]) -> dict[str, Any]:
        meta = wire.metadata(params)
        return {"id": wire.new_id(prefix), "object": kind, "created": _now(), "livemode": False, "metadata": meta}

    def _emit(
        self,
        ctx: _Ctx,
        type_: str,
        obj: dict[str, Any],
        *,
        account: str | None = None,
        previous: dict[str, Any] | None = None,
    ) -> None:
        """Record an event in Stripe's shape (https://docs.stripe.com/api/events/object); lock held."""
        data: dict[str, Any] = {"object": copy.deepcopy(obj)}
        if previous is not None:
            data["previous_attributes"] = previous
        event: dict[str, Any] = {
            "id": wire.new_id("evt_"),
            "object": "event",
            "api_version": ctx.api_version,
            "created": _now(),
            "data": data,
            "livemode": False,
            "pending_webhooks": 1 if self._endpoint is not None else 0,
            "request": {"id": ctx.request_id, "idempotency_key": ctx.idempotency_key},
            "type": type_,
        }
        account = account or ctx.account
        if account:
            event["account"] = account  # Connect events name the connected account
        self._objects[event["id"]] = event
        self._scope[event["id"]] = ""
        self._payloads[event["id"]] = json.dumps(event, indent=2)
        if len(self._pending) < MAX_PENDING_EVENTS:
            self._pending.append(event["id"])
        ctx.events.append(event["id"])
        if self._endpoint is not None and self._endpoint["deliver"] == "auto":
            self._wake.set()

    def _signed(self, event_id: str, secret: str) -> dict[str, Any]:
        payload = self._payloads[event_id]
        event_type = self._objects[event_id]["type"]
        return {"id": event_id, "type": event_type, "payload": payload, "signature": wire.sign(payload, secret)}
