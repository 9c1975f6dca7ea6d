"""What each payout pays for: the orders (and claw-backs) behind its amount, read from the provider's payable.

The payable is a queue, oldest first: an order's earning joins it when the order is charged; a payout takes from
its front until its amount is covered; a refund after the order was paid out joins the front as a claw-back the
next payout covers first; a payout that fails puts what it took back at the front, for the payout that pays it
again. Replaying the payable's book lines in order gives each payout its share of each order, and their sum is
the payout's amount. Read-only: nothing here changes the book.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass

from marketplace.models import BookAccountKind, BookLine, InvoiceLine, Organization

TAKES = "payout.transfer"
GIVES_BACK = frozenset({"payout.failed", "payout.reversed"})


@dataclass
class PaidItem:
    """One order's part of a payout (negative for a claw-back of an order refunded after it was paid out)."""

    order: str  # the order's public id, "" for an earning without an order
    description: str
    amount_minor: int


def _payout_id(key: str) -> uuid.UUID | None:
    parts = key.split(":")
    if len(parts) != 3 or parts[0] != "payout":
        return None
    try:
        return uuid.UUID(parts[1])
    except ValueError:
        return None


def payout_contents(organization: Organization, currency: str = "USD") -> dict[uuid.UUID, list[PaidItem]]:
    """Each payout's items by the payout's public id, in the order they were taken."""
    lines = (
        BookLine.objects.filter(
            account__kind=BookAccountKind.PROVIDER_PAYABLE,
            account__organization=organization,
            account__currency=currency,
        )
        .select_related("entry", "entry__order")
        .order_by("entry__created_at", "entry_id", "pk")
    )
    rows = list(lines)
    order_ids = {row.entry.order_id for row in rows if row.entry.order_id}
    described = dict(
        InvoiceLine.objects.filter(order_id__in=order_ids).values_list("order_id", "description").order_by("pk")
    )
    queue: deque[PaidItem] = deque()
    contents: dict[uuid.UUID, list[PaidItem]] = {}
    for row in rows:
        entry, amount = row.entry, row.amount_minor
        payout = _payout_id(entry.key)
        if entry.kind == TAKES and payout is not None:
            contents[payout] = _take(queue, amount)
        elif entry.kind in GIVES_BACK and payout is not None:
            for item in reversed(contents.get(payout, [])):
                queue.appendleft(PaidItem(item.order, item.description, item.amount_minor))
        elif amount < 0:  # earned
            order = entry.order
            label = str(order.public_id) if order else ""
            text = described.get(entry.order_id, "") if order else entry.memo
            queue.append(PaidItem(label, text or (f"order {label[:8]}" if label else "earnings"), -amount))
        else:  # taken back: from what is still unpaid of the same order first, the rest from the next payout
            _claw_back(queue, entry.order.public_id if entry.order else None, amount, described.get(entry.order_id, ""))
    return contents


def _take(queue: deque[PaidItem], amount: int) -> list[PaidItem]:
    taken: list[PaidItem] = []
    need = amount
    while queue and need > 0:
        item = queue[0]
        share = item.amount_minor if item.amount_minor < 0 else min(item.amount_minor, need)
        taken.append(PaidItem(item.order, item.description, share))
        need -= share
        item.amount_minor -= share
        if item.amount_minor == 0:
            queue.popleft()
    return taken


def _claw_back(queue: deque[PaidItem], order: uuid.UUID | None, amount: int, description: str) -> None:
    left = amount
    if order is not None:
        for item in queue:
            if item.order == str(order) and item.amount_minor > 0 and left:
                cut = min(item.amount_minor, left)
                item.amount_minor -= cut
                left -= cut
        for item in [i for i in queue if i.amount_minor == 0]:
            queue.remove(item)
    if not left:
        return
    label = str(order) if order else ""
    for item in queue:  # one claw-back line per order, however many refunds made it
        if item.amount_minor < 0 and item.order == label and label:
            item.amount_minor -= left
            return
    # Behind the claw-backs already waiting, ahead of every earning: the next payout covers it first.
    at = next((index for index, item in enumerate(queue) if item.amount_minor > 0), len(queue))
    queue.insert(at, PaidItem(label, f"refund of {description or 'an order'} after it was paid out", -left))
