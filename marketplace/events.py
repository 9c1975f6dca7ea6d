"""The market's message bus: what happened to an order or a lease, as typed events, and the one function that
hands each to its handlers.

Modules low in the order's life (the state machine in ``orders/transitions.py``, leases in ``launch/leases.py``)
publish an event and know nothing of who reacts. Who reacts, and in which order, is one table:
``marketplace/reactions.py``, installed by ``MarketplaceConfig.ready``. Handlers run synchronously, in the
publisher's transaction and in the table's order, so a failing handler rolls the change back with it, as a direct
call would. Work that must not hold the transaction is queued by the handler (``taskkit.enqueue_on_commit``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marketplace.models import InvoiceLine, Order


@dataclass(frozen=True)
class OrderLeaving:
    """The order's row has moved from ``previous`` to ``to``; nothing else is written yet."""

    order: Order
    previous: str
    to: str
    now: dt.datetime


@dataclass(frozen=True)
class OrderEnded:
    """The order reached a final state; ``line`` is what its machines ran, or None if they never ran."""

    order: Order
    previous: str
    to: str
    line: InvoiceLine | None
    now: dt.datetime


@dataclass(frozen=True)
class OrderMoved:
    """The order's move and its ledger entry are written (the last step of a transition)."""

    order: Order
    previous: str
    to: str
    now: dt.datetime


@dataclass(frozen=True)
class LeaseReady:
    """The lease agent on one of the order's machines reported the machine usable."""

    order_id: int


Event = OrderLeaving | OrderEnded | OrderMoved | LeaseReady
Handler = Callable[[Any], None]

_handlers: dict[type, tuple[Handler, ...]] | None = None


class ReactionsMissing(RuntimeError):
    """An event was published before the reactions table was installed: reacting to nothing would lose work
    (a settlement, a webhook), so the change is refused instead."""


def handlers_install(table: Mapping[type, Sequence[Handler]]) -> None:
    """Make ``table`` the bus's handlers (``MarketplaceConfig.ready`` does, once per process)."""
    global _handlers
    _handlers = {kind: tuple(handlers) for kind, handlers in table.items()}


def publish(event: Event) -> None:
    """Run every handler of ``event``'s type, in the table's order, in the caller's transaction."""
    if _handlers is None:
        raise ReactionsMissing(f"{type(event).__name__} published before marketplace.reactions was installed")
    for handler in _handlers.get(type(event), ()):
        handler(event)
