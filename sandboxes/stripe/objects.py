"""What the Stripe sandbox holds: every object by id on the account it lives on, found, stored and built in
Stripe's shape (``shapes.py``), listed a page at a time, expanded on request, the balance transactions money
movements leave, and the events each change records for the webhook endpoint, signed as Stripe signs them.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from typing import Any

from sandboxes.stripe import wire
from sandboxes.stripe.params import EXPANDABLE
from sandboxes.stripe.shapes import new_object
from sandboxes.stripe.state import API_VERSION, MAX_PENDING_EVENTS, _Ctx, _now
from sandboxes.stripe.wire import invalid, missing


class ObjectStore:
    """The sandbox's objects and events; the handlers' mixins build on it."""

    _card_methods: dict[str, tuple[str, str]]  # a PaymentMethod made from a typed card -> (behaviour, brand)
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

    def _store(self, ctx: _Ctx, obj: dict[str, Any], scope: str | None = None) -> dict[str, Any]:
        """Keep ``obj`` on the acting account, or on ``scope`` ("" is the platform); lock held."""
        self._objects[obj["id"]] = obj
        self._scope[obj["id"]] = (ctx.account or "") if scope is None else scope
        return obj

    def _base(self, prefix: str, kind: str, params: dict[str, Any], **fields: Any) -> dict[str, Any]:
        meta = wire.metadata(params)
        return new_object(kind, id=wire.new_id(prefix), created=_now(), metadata=meta, **fields)

    def _page(
        self, ctx: _Ctx, kind: str, params: dict[str, Any], url: str, keep: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """One page of the ``kind`` objects on the acting account that ``keep`` accepts, newest first, with
        Stripe's cursors (https://docs.stripe.com/api/pagination): ``starting_after`` an id gives the ones older
        than it, ``ending_before`` the ones newer; ``has_more`` says whether more lie in that direction."""
        limit = wire.page_limit(params)
        after = wire.string(params, "starting_after", max_len=255)
        before = wire.string(params, "ending_before", max_len=255)
        if after and before:
            raise invalid("You may only specify one of these parameters: ending_before, starting_after.")
        low, high = wire.timestamp_filter(params, "created")
        scope = ctx.account or ""
        # The store keeps objects in the order they were made, so newest first is its reverse.
        ordered = [o for i, o in reversed(self._objects.items()) if o["object"] == kind and self._scope[i] == scope]
        cursor = after or before
        position = next((n for n, o in enumerate(ordered) if o["id"] == cursor), None)
        if cursor and position is None:
            raise missing(kind, cursor, "starting_after" if after else "ending_before")
        chosen = [
            (n, o)
            for n, o in enumerate(ordered)
            if keep(o) and (low is None or o["created"] >= low) and (high is None or o["created"] <= high)
        ]
        if after:
            older = [o for n, o in chosen if position is not None and n > position]
            data, has_more = older[:limit], len(older) > limit
        elif before:
            newer = [o for n, o in chosen if position is not None and n < position]
            data, has_more = newer[-limit:], len(newer) > limit
        else:
            data, has_more = [o for _, o in chosen[:limit]], len(chosen) > limit
        return {"object": "list", "data": copy.deepcopy(data), "has_more": has_more, "url": url}

    def _expand(self, answer: dict[str, Any], paths: list[str]) -> None:
        """Replace the id at each dotted path with a copy of the object it names, in place; a list's objects are
        reached through ``data.``; a path that is not expandable is refused as Stripe refuses it; lock held."""
        for path in paths:
            self._expand_one(answer, path.split("."), path)

    def _expand_one(self, node: dict[str, Any], steps: list[str], path: str) -> None:
        head, rest = steps[0], steps[1:]
        if node.get("object") == "list":
            if head != "data" or not rest:
                raise invalid(f"This property cannot be expanded ({path}).", param="expand")
            for item in node["data"]:
                self._expand_one(item, rest, path)
            return
        fields = EXPANDABLE.get(str(node.get("object")), {})
        if head not in fields:
            raise invalid(f"This property cannot be expanded ({path}).", param="expand")
        value = node.get(head)
        if isinstance(value, str):
            target = self._objects.get(value)
            wanted = fields[head]
            if target is not None and (wanted is None or target["object"] == wanted):
                node[head] = copy.deepcopy(target)
        if rest and isinstance(node.get(head), dict):
            self._expand_one(node[head], rest, path)

    def _balance_transaction(
        self,
        scope: str,
        type_: str,
        amount: int,
        currency: str,
        source: str,
        *,
        fee: int = 0,
        category: str | None = None,
        description: str | None = None,
    ) -> str:
        """Record how a money movement changed ``scope``'s balance (https://docs.stripe.com/api/balance_transactions
        /object): ``amount`` signed, ``net`` after ``fee``; answer its id; lock held."""
        created = _now()
        details = []
        if fee:
            details = [
                {
                    "amount": fee,
                    "application": None,
                    "currency": currency,
                    "description": "Stripe processing fees",
                    "type": "stripe_fee",
                }
            ]
        txn = new_object(
            "balance_transaction",
            id=wire.new_id("txn_"),
            amount=amount,
            available_on=created,
            created=created,
            currency=currency,
            description=description,
            fee=fee,
            fee_details=details,
            net=amount - fee,
            reporting_category=category or type_,
            source=source,
            type=type_,
        )
        self._objects[txn["id"]] = txn
        self._scope[txn["id"]] = scope
        return str(txn["id"])

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
        event = new_object(
            "event",
            id=wire.new_id("evt_"),
            api_version=ctx.api_version,
            created=_now(),
            data=data,
            pending_webhooks=1 if self._endpoint is not None else 0,
            request={"id": ctx.request_id, "idempotency_key": ctx.idempotency_key},
            type=type_,
        )
        account = account or ctx.account
        if account:
            event["account"] = account  # Connect events name the connected account
        self._objects[event["id"]] = event
        self._scope[event["id"]] = account or ""  # listed and retrieved on the account it happened on
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
