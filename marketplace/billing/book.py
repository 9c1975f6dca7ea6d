"""Posting to the double-entry book and reading it (models in ``marketplace/models/billing.py``).

``book_post`` is the only way money moves: it checks the lines balance per currency, writes the entry and its
lines, and ledgers the entry (its lines' hash) in the same transaction, so the book and the ledger agree.
Balances are derived (``book_balance``); ``book_check`` proves the whole book sums to zero per currency.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from ledger.canonical import canonical_bytes, sha256_hex
from ledger.services import ledger_append
from marketplace.models import BookAccount, BookAccountKind, BookEntry, BookLine, Order, Organization

# Ten trillion minor units (a hundred billion dollars): above any real movement, far inside a 64-bit column.
MAX_MINOR = 10**13


class BookError(ValueError):
    """An entry the book refuses; nothing of it is written."""


@dataclass(frozen=True)
class Line:
    account: BookAccount
    amount_minor: int  # positive: debit the account; negative: credit it


def book_account(*, kind: str, currency: str, organization: Organization | None = None) -> BookAccount:
    """The account of ``kind`` in ``currency`` for ``organization`` (None: the house's), made on first use."""
    if not (len(currency) == 3 and currency.isascii() and currency.isalpha() and currency.isupper()):
        raise BookError(f"currency must be three upper-case letters (ISO 4217), not {currency!r}")
    try:
        with transaction.atomic():
            account, _ = BookAccount.objects.get_or_create(kind=kind, organization=organization, currency=currency)
    except IntegrityError:  # made by a concurrent first use
        account = BookAccount.objects.get(kind=kind, organization=organization, currency=currency)
    return account


def book_post(
    *,
    kind: str,
    key: str,
    lines: Sequence[Line],
    memo: str = "",
    now: dt.datetime | None = None,
    order: Order | None = None,
) -> BookEntry:
    """Post one entry. ``key`` makes it idempotent: posting the same key again returns the first entry (and
    refuses different lines under it). Raises ``BookError`` naming what is wrong (fewer than two lines, an
    amount that is not a whole non-zero number of minor units or is out of range, lines that do not sum to zero
    in each currency) before anything is written."""
    if not key or len(key) > 128:
        raise BookError("an entry needs a key of 1 to 128 characters (what makes posting it twice harmless)")
    if len(lines) < 2:
        raise BookError(f"an entry has at least two lines, not {len(lines)}")
    sums: dict[str, int] = defaultdict(int)
    for number, line in enumerate(lines, start=1):
        amount = line.amount_minor
        if type(amount) is not int:
            raise BookError(f"line {number}: amount_minor must be a whole number of minor units, not {amount!r}")
        if amount == 0 or abs(amount) > MAX_MINOR:
            raise BookError(
                f"line {number}: amount_minor must be non-zero and at most {MAX_MINOR} in size, not {amount}"
            )
        sums[line.account.currency] += amount
    unbalanced = {currency: total for currency, total in sums.items() if total}
    if unbalanced:
        said = ", ".join(f"{total:+d} {currency}" for currency, total in sorted(unbalanced.items()))
        raise BookError(f"the lines do not balance: they sum to {said} (minor units)")
    existing = BookEntry.objects.filter(key=key).first()
    if existing is not None:
        return _same(existing, lines)
    now = now or timezone.now()
    digest = _lines_digest(lines)
    try:
        with transaction.atomic():
            entry = BookEntry.objects.create(kind=kind, key=key, memo=memo[:255], created_at=now, order=order)
            BookLine.objects.bulk_create(
                [BookLine(entry=entry, account=line.account, amount_minor=line.amount_minor) for line in lines]
            )
            ledger_append(
                kind="book.entry",
                subject=f"book:{entry.public_id}",
                payload={"entry": str(entry.public_id), "kind": kind, "lines_sha256": digest, "lines": len(lines)},
            )
    except IntegrityError:
        # The same key posted concurrently won the insert: answer as its replay.
        return _same(BookEntry.objects.get(key=key), lines)
    return entry


def _lines_digest(lines: Sequence[Line]) -> str:
    rows = sorted([line.account.pk, line.account.currency, line.amount_minor] for line in lines)
    return sha256_hex(canonical_bytes({"lines": rows}))


def _same(entry: BookEntry, lines: Sequence[Line]) -> BookEntry:
    stored = [
        Line(account=line.account, amount_minor=line.amount_minor) for line in entry.lines.select_related("account")
    ]
    if _lines_digest(stored) != _lines_digest(lines):
        raise BookError(f"key {entry.key!r} was already posted with other lines")
    return entry


def book_balance(account: BookAccount) -> int:
    """The account's balance in minor units: the sum of its lines (debits positive)."""
    return int(BookLine.objects.filter(account=account).aggregate(total=Sum("amount_minor"))["total"] or 0)


def book_account_balance(*, kind: str, currency: str, organization: Organization | None = None) -> int:
    """``book_balance`` of the account, 0 when it was never used (without making it)."""
    return int(
        BookLine.objects.filter(
            account__kind=kind, account__currency=currency, account__organization=organization
        ).aggregate(total=Sum("amount_minor"))["total"]
        or 0
    )


def credit_available(organization: Organization, currency: str = "USD") -> int:
    """The organisation's prepaid credit not held by running orders, in minor units (the buyer-credit account
    is a liability: credits make it negative, so what the buyer has is its negation)."""
    return -book_account_balance(kind=BookAccountKind.BUYER_CREDIT, currency=currency, organization=organization)


def book_check() -> dict[str, int]:
    """The whole book's sum per currency; every value is 0 in a sound book (each entry balances)."""
    totals = BookLine.objects.values("account__currency").annotate(total=Sum("amount_minor"))
    return {row["account__currency"]: int(row["total"]) for row in totals}
