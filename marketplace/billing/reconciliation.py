"""Daily reconciliation: Stripe's money movements of one UTC day matched against the book, each way.

Stripe's side is its balance transactions (https://docs.stripe.com/api/balance_transactions/list) on the platform,
read page after page with each charge's PaymentIntent expanded, and each connected account's payouts
(https://docs.stripe.com/api/payouts/list). The book's side is the entries it keys by a Stripe object: a top-up
(``stripe:<pi>:succeeded``), a top-up refund (``stripe:<re>:refund``), a payout's transfer
(``payout:<id>:transfer``), and the ``Payout`` rows themselves.

Each Stripe movement must have its entry with the same amount; each entry of the day must have its Stripe
movement, which is read back by id when the day's list lacks it (it may have landed just across midnight).
Anything else is a ``ReconciliationMismatch``: counted in ``broker_reconciliation_mismatches`` (``/metrics``) and
listed for staff in the admin. Nothing is corrected here: a mismatch means a person must look.

Not matched, by design: the platform's own payouts to the broker's bank (the book tracks what is owed, not which
bank holds the cash) and Stripe's fees (a charge is matched on its gross amount).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from marketplace.billing.stripe_gateway import (
    BalanceTransactionView,
    PaymentError,
    PaymentUnavailable,
    PayoutView,
    StripeGateway,
    stripe_gateway,
)
from marketplace.models import (
    BookAccountKind,
    BookEntry,
    BookLine,
    ConnectAccount,
    MismatchKind,
    Payout,
    PayoutState,
    ReconciliationMismatch,
    ReconciliationRun,
)

log = logging.getLogger(__name__)

CHARGE_TYPES = frozenset({"charge", "payment"})
NOT_BOOKED = frozenset({"payout"})  # the platform's payouts to the broker's own bank
# Stripe's payout status -> the state our Payout row should be in (https://docs.stripe.com/api/payouts/object).
PAYOUT_STATES = {
    "paid": {PayoutState.PAID},
    "failed": {PayoutState.FAILED},
    "canceled": {PayoutState.FAILED},
    "pending": {PayoutState.CREATED, PayoutState.IN_TRANSIT},
    "in_transit": {PayoutState.CREATED, PayoutState.IN_TRANSIT},
}


@dataclass(frozen=True)
class Found:
    """One disagreement, before it is stored."""

    kind: str
    detail: str
    currency: str
    stripe_object: str = ""
    account: str = ""
    book_key: str = ""
    stripe_minor: int | None = None
    book_minor: int | None = None


@dataclass
class _Tally:
    stripe_items: int = 0
    book_items: int = 0
    matched: int = 0
    found: list[Found] = field(default_factory=list)


def day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def reconcile_day(day: dt.date, *, gateway: StripeGateway | None = None) -> ReconciliationRun:
    """Match ``day``'s movements and store the run and what disagrees. Raises ``PaymentUnavailable`` when Stripe
    cannot be read (the run then records the error and nothing else changes), so the next attempt starts over."""
    gateway = gateway or stripe_gateway()
    start, end = day_bounds(day)
    run, _ = ReconciliationRun.objects.get_or_create(day=day, defaults={"started_at": timezone.now()})
    try:
        tally = _Tally()
        _platform(gateway, start, end, tally)
        _connected_payouts(gateway, start, end, tally)
    except PaymentError as exc:
        ReconciliationRun.objects.filter(pk=run.pk).update(error=f"{exc.code}: {exc.message}"[:255])
        raise
    return _store(run, tally)


def _store(run: ReconciliationRun, tally: _Tally) -> ReconciliationRun:
    now = timezone.now()
    with transaction.atomic():
        locked = ReconciliationRun.objects.select_for_update().get(pk=run.pk)
        kept = locked.found.filter(reviewed_at__isnull=False)
        reviewed = {(m.kind, m.stripe_object, m.book_key) for m in kept}
        locked.found.filter(reviewed_at__isnull=True).delete()
        ReconciliationMismatch.objects.bulk_create(
            ReconciliationMismatch(run=locked, found_at=now, **found.__dict__)
            for found in tally.found
            if (found.kind, found.stripe_object, found.book_key) not in reviewed
        )
        locked.started_at, locked.finished_at, locked.error = run.started_at, now, ""
        locked.stripe_items, locked.book_items, locked.matched = tally.stripe_items, tally.book_items, tally.matched
        locked.mismatches = len(tally.found)
        locked.save()
    if tally.found:
        log.warning("reconciliation %s: %d mismatch(es) between Stripe and the book", run.day, len(tally.found))
    return locked


# --------------------------------------------------------------------------------------- the platform


def _book_amount(key: str, account_kind: str) -> tuple[int, str] | None:
    """The entry's line on ``account_kind`` (amount, currency), or None when there is no such entry."""
    line = (
        BookLine.objects.filter(entry__key=key, account__kind=account_kind)
        .values_list("amount_minor", "account__currency")
        .first()
    )
    return None if line is None else (int(line[0]), str(line[1]))


def _transfer_payouts() -> dict[str, Payout]:
    """Each Stripe transfer's first payout: a payout paid out again after a failure names the same transfer."""
    first = Payout.objects.exclude(stripe_transfer="").values("stripe_transfer").annotate(first=Min("pk"))
    rows = Payout.objects.filter(pk__in=[row["first"] for row in first])
    return {payout.stripe_transfer: payout for payout in rows}


def _expected(bt: BalanceTransactionView, transfers: dict[str, Payout]) -> tuple[str, str] | None:
    """The book entry key and the account kind whose line must equal the balance transaction's amount."""
    if bt.type in CHARGE_TYPES and bt.payment_intent:
        return f"stripe:{bt.payment_intent}:succeeded", BookAccountKind.CASH
    if bt.type == "refund" and bt.source:
        return f"stripe:{bt.source}:refund", BookAccountKind.CASH
    if bt.type == "transfer" and bt.source:
        payout = transfers.get(bt.source)
        return (f"payout:{payout.public_id}:transfer" if payout else "", BookAccountKind.PAYOUTS)
    return None


def _platform(gateway: StripeGateway, start: dt.datetime, end: dt.datetime, tally: _Tally) -> None:
    listed = gateway.balance_transactions(created_from=int(start.timestamp()), created_before=int(end.timestamp()))
    transfers = _transfer_payouts()  # read once per run: both sides look payouts up in it
    seen_keys: set[str] = set()
    for bt in listed:
        if bt.type in NOT_BOOKED:
            continue
        tally.stripe_items += 1
        expected = _expected(bt, transfers)
        what = f"{bt.type} {bt.source or bt.id}"
        if expected is None:
            tally.found.append(
                Found(
                    MismatchKind.MISSING_IN_BOOK,
                    f"Stripe {what}: a kind of movement the broker never makes, so none is booked",
                    bt.currency,
                    stripe_object=bt.source or bt.id,
                    stripe_minor=bt.amount_minor,
                )
            )
            continue
        key, account_kind = expected
        seen_keys.add(key)
        booked = _book_amount(key, account_kind) if key else None
        _compare(tally, what, bt.source or bt.id, bt.amount_minor, bt.currency, key, booked)
    _book_side(gateway, start, end, seen_keys, tally, transfers)


def _compare(
    tally: _Tally,
    what: str,
    stripe_object: str,
    stripe_minor: int,
    currency: str,
    key: str,
    booked: tuple[int, str] | None,
) -> None:
    if booked is None:
        tally.found.append(
            Found(
                MismatchKind.MISSING_IN_BOOK,
                f"Stripe {what} has no book entry{f' {key}' if key else ''}",
                currency,
                stripe_object=stripe_object,
                book_key=key,
                stripe_minor=stripe_minor,
            )
        )
    elif booked != (stripe_minor, currency):
        tally.found.append(
            Found(
                MismatchKind.AMOUNT_DIFFERS,
                f"Stripe {what} is {stripe_minor} {currency}, the book {booked[0]} {booked[1]}",
                currency,
                stripe_object=stripe_object,
                book_key=key,
                stripe_minor=stripe_minor,
                book_minor=booked[0],
            )
        )
    else:
        tally.matched += 1


def _book_side(
    gateway: StripeGateway,
    start: dt.datetime,
    end: dt.datetime,
    seen: set[str],
    tally: _Tally,
    transfer_payouts: dict[str, Payout],
) -> None:
    """The day's entries that name a Stripe object; each missing from the day's list is read back by id."""
    entries = BookEntry.objects.filter(
        created_at__gte=start, created_at__lt=end, kind__in=["topup", "topup.refund", "payout.transfer"]
    ).order_by("pk")
    transfers = {f"payout:{p.public_id}:transfer": p for p in transfer_payouts.values()}
    for entry in entries:
        tally.book_items += 1
        if entry.key in seen:
            continue
        if entry.kind == "payout.transfer":
            _book_transfer(gateway, entry, transfers.get(entry.key), tally)
            continue
        account_kind = BookAccountKind.CASH
        booked = _book_amount(entry.key, account_kind)
        stripe_id = entry.key.split(":")[1] if entry.key.count(":") == 2 else ""
        if booked is None or not stripe_id:
            continue  # not an entry naming a Stripe object (a test's or a hand-made key)
        try:
            if entry.kind == "topup":
                intent = gateway.payment_intent_retrieve(stripe_id)
                at_stripe = intent.amount_minor if intent.status == "succeeded" else None
                currency = intent.currency
            else:
                refund = gateway.refund_retrieve(stripe_id)
                at_stripe = -refund.amount_minor if refund.status in ("succeeded", "pending") else None
                currency = refund.currency
        except PaymentUnavailable:
            raise
        except PaymentError as exc:
            at_stripe, currency = None, booked[1]
            log.info("reconciliation: %s not at Stripe (%s)", stripe_id, exc.code)
        _compare_book(tally, entry.key, stripe_id, booked, at_stripe, currency)


def _book_transfer(gateway: StripeGateway, entry: BookEntry, first: Payout | None, tally: _Tally) -> None:
    """A payout's transfer entry: a payout paid out again reuses its first transfer (matched with that one); a
    transfer Stripe refused was reversed in the book; any other must be at Stripe."""
    payout = _payout_of_entry(entry.key)
    if payout is None:
        return
    booked = _book_amount(entry.key, BookAccountKind.PAYOUTS)
    if booked is None:
        return
    if first is None and payout.stripe_transfer:
        tally.matched += 1  # a re-payout of a stranded transfer: no new movement at Stripe
        return
    if not payout.stripe_transfer:
        if BookEntry.objects.filter(key=f"payout:{payout.public_id}:reversed").exists():
            tally.matched += 1  # Stripe refused the transfer and the book put it back
            return
        _compare_book(tally, entry.key, "", booked, None, booked[1])
        return
    try:
        transfer = gateway.transfer_retrieve(payout.stripe_transfer)
        at_stripe: int | None = -transfer.amount_minor
        currency = transfer.currency
    except PaymentUnavailable:
        raise
    except PaymentError:
        at_stripe, currency = None, booked[1]
    _compare_book(tally, entry.key, payout.stripe_transfer, booked, at_stripe, currency)


def _payout_of_entry(key: str) -> Payout | None:
    parts = key.split(":")
    if len(parts) != 3:
        return None
    try:
        public_id = uuid.UUID(parts[1])
    except ValueError:
        return None
    return Payout.objects.filter(public_id=public_id).first()


def _compare_book(
    tally: _Tally, key: str, stripe_id: str, booked: tuple[int, str], at_stripe: int | None, currency: str
) -> None:
    if at_stripe is None:
        tally.found.append(
            Found(
                MismatchKind.MISSING_AT_STRIPE,
                f"book entry {key} has no movement at Stripe{f' ({stripe_id})' if stripe_id else ''}",
                booked[1],
                stripe_object=stripe_id,
                book_key=key,
                book_minor=booked[0],
            )
        )
    elif (at_stripe, currency) != booked:
        tally.found.append(
            Found(
                MismatchKind.AMOUNT_DIFFERS,
                f"book entry {key} is {booked[0]} {booked[1]}, Stripe {stripe_id} {at_stripe} {currency}",
                booked[1],
                stripe_object=stripe_id,
                book_key=key,
                stripe_minor=at_stripe,
                book_minor=booked[0],
            )
        )
    else:
        tally.matched += 1


# ------------------------------------------------------------------------------------ connected payouts


def _connected_payouts(gateway: StripeGateway, start: dt.datetime, end: dt.datetime, tally: _Tally) -> None:
    """Each connected account's payouts of the day against our Payout rows, by Stripe id: amount and state."""
    ours_of_day = Payout.objects.filter(created_at__gte=start, created_at__lt=end).exclude(stripe_payout=None)
    expected = {payout.stripe_payout: payout for payout in ours_of_day.select_related("organization")}
    accounts = dict(ConnectAccount.objects.values_list("organization_id", "stripe_account"))
    for account in sorted(accounts.values()):
        listed = gateway.payouts(
            account=account, created_from=int(start.timestamp()), created_before=int(end.timestamp())
        )
        for at_stripe in listed:
            tally.stripe_items += 1
            payout = expected.pop(at_stripe.id, None) or Payout.objects.filter(stripe_payout=at_stripe.id).first()
            _payout_compare(tally, at_stripe, payout)
    for stripe_id, payout in expected.items():  # ours, not in the day's list: read back by id
        tally.book_items += 1
        account = accounts.get(payout.organization_id, "")
        try:
            at_stripe = gateway.payout_retrieve(str(stripe_id), account=account)
        except PaymentUnavailable:
            raise
        except PaymentError:
            tally.found.append(
                Found(
                    MismatchKind.MISSING_AT_STRIPE,
                    f"payout {payout.public_id} names Stripe payout {stripe_id}, which Stripe does not have",
                    payout.currency,
                    stripe_object=str(stripe_id),
                    account=account,
                    book_key=f"payout:{payout.public_id}",
                    book_minor=payout.amount_minor,
                )
            )
            continue
        _payout_compare(tally, at_stripe, payout)


def _payout_compare(tally: _Tally, seen: PayoutView, payout: Payout | None) -> None:
    account, stripe_id, amount, currency, status = seen.account, seen.id, seen.amount_minor, seen.currency, seen.status
    if payout is None:
        kind = MismatchKind.MISSING_IN_BOOK
        detail = f"Stripe payout {stripe_id} on {account} ({amount} {currency}, {status}) is no payout of ours"
    elif (amount, currency) != (payout.amount_minor, payout.currency):
        kind = MismatchKind.AMOUNT_DIFFERS
        detail = f"Stripe payout {stripe_id} is {amount} {currency}, ours {payout.amount_minor} {payout.currency}"
    elif payout.state not in PAYOUT_STATES.get(status, set()):
        kind = MismatchKind.STATUS_DIFFERS
        detail = f"Stripe payout {stripe_id} is {status}, ours {payout.state}"
    else:
        tally.matched += 1
        return
    tally.found.append(
        Found(
            kind,
            detail,
            currency,
            stripe_object=stripe_id,
            account=account,
            book_key=f"payout:{payout.public_id}" if payout else "",
            stripe_minor=amount,
            book_minor=payout.amount_minor if payout else None,
        )
    )


def reconcile_days(days: Iterable[dt.date]) -> list[ReconciliationRun]:
    """Several days in order; one day's failure to read Stripe is logged and the others go on."""
    runs = []
    for day in days:
        try:
            runs.append(reconcile_day(day))
        except PaymentError as exc:
            log.warning("reconciliation %s could not read Stripe: %s", day, exc)
    return runs
