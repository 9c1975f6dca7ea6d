"""Providers get paid: their Stripe Connect accounts, and payouts of what the book says they are owed.

A provider organisation earns when orders end: its PROVIDER_PAYABLE account is credited with the net (the
buyer's amount less the commission). ``payout_run`` pays that balance out in three steps, each safe to repeat:

1. One transaction makes the ``Payout`` row (``created``) and moves the amount from the payable to the house's
   PAYOUTS account (entry ``payout:<id>:transfer``). The row exists before Stripe hears of it, so a webhook that
   overtakes our own call's answer finds it (by the ``payout`` id in the metadata we send).
2. A Stripe transfer from the platform to the provider's Connect account, then a payout from that account to
   its bank. Both carry idempotency keys derived from the payout id: a run that stopped half way (Stripe
   unavailable, a crash) repeats the same calls and Stripe answers with the first result, never a second
   transfer.
3. The payout is ``in_transit``; Stripe's ``payout.paid`` or ``payout.failed`` event ends it
   (``payout_event_handle``). A failed payout puts the amount back on the payable, with Stripe's reason.
   Stripe keeps a failed payout's money in the provider's Stripe balance, so the next run pays that amount
   out again from there, naming the same transfer, and makes no second one.

A refusal (no Connect account, payouts not enabled) raises ``PayoutRefused`` before anything is written.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from marketplace.billing.book import Line, book_account, book_account_balance, book_post
from marketplace.billing.stripe_gateway import (
    MAX_AMOUNT_MINOR,
    AccountView,
    EventView,
    PaymentError,
    PaymentUnavailable,
    stripe_gateway,
)
from marketplace.models import (
    BookAccountKind,
    BookLine,
    ConnectAccount,
    Organization,
    OrganizationKind,
    Payout,
    PayoutState,
)

log = logging.getLogger(__name__)

CURRENCY = "USD"  # what the book's payables are kept in
METADATA_PAYOUT = "payout"  # the metadata key naming our Payout (public id) on Stripe's transfer and payout
MAX_REQUIREMENTS = 50  # requirement names kept from Stripe (they are field paths, a handful in practice)
MAX_REQUIREMENT_LEN = 100


class PayoutRefused(Exception):
    """A payout that cannot be made now; nothing moved. ``requirements`` are what Stripe still needs."""

    def __init__(self, reason: str, requirements: tuple[str, ...] = ()):
        super().__init__(reason)
        self.reason = reason
        self.requirements = requirements


# --- Connect accounts ------------------------------------------------------------------------------------------


def connect_onboard(*, organization: Organization, email: str, country: str, refresh_url: str, return_url: str) -> str:
    """The URL of Stripe's onboarding for the organisation's Express account, made on the first call (the
    idempotency key is the organisation's, so two concurrent first calls make one account). Raises
    ``PaymentError`` (``PaymentUnavailable`` when a retry may work)."""
    gateway = stripe_gateway()
    connect = ConnectAccount.objects.filter(organization=organization).first()
    if connect is None:
        view = gateway.account_create(
            email=email,
            country=country,
            idempotency_key=f"connect-account:organization:{organization.pk}",
            metadata={"organization": str(organization.pk)},
        )
        try:
            with transaction.atomic():
                connect = ConnectAccount.objects.create(
                    organization=organization,
                    stripe_account=view.id,
                    country=country,
                    payouts_enabled=view.payouts_enabled,
                    details_submitted=view.details_submitted,
                    requirements_due=_requirements(view.requirements_due),
                )
        except IntegrityError:  # a concurrent first call stored the same account first
            connect = ConnectAccount.objects.get(organization=organization)
    link = gateway.account_link_create(account=connect.stripe_account, refresh_url=refresh_url, return_url=return_url)
    return link.url


def connect_refresh(organization: Organization) -> ConnectAccount:
    """Re-read the organisation's Connect account from Stripe and store what it says. Raises
    ``ConnectAccount.DoesNotExist`` when there is none, ``PaymentError`` when Stripe does not answer."""
    connect = ConnectAccount.objects.get(organization=organization)
    _connect_store(connect, stripe_gateway().account_retrieve(connect.stripe_account))
    return connect


def _connect_store(connect: ConnectAccount, view: AccountView) -> None:
    connect.payouts_enabled = bool(view.payouts_enabled)
    connect.details_submitted = bool(view.details_submitted)
    connect.requirements_due = _requirements(view.requirements_due)
    connect.save(update_fields=["payouts_enabled", "details_submitted", "requirements_due", "updated_at"])


def _requirements(items: Any) -> list[str]:
    """Stripe's ``requirements.currently_due``, bounded: it is shown on a page and stored."""
    if not isinstance(items, list | tuple):
        return []
    return [str(item)[:MAX_REQUIREMENT_LEN] for item in items[:MAX_REQUIREMENTS] if isinstance(item, str)]


# --- Paying out ------------------------------------------------------------------------------------------------


def payable_minor(organization: Organization, currency: str = CURRENCY) -> int:
    """What the book owes the organisation in ``currency`` (minor units; the payable is credited, so negated)."""
    return -book_account_balance(kind=BookAccountKind.PROVIDER_PAYABLE, currency=currency, organization=organization)


def payout_run(*, organization: Organization, now: dt.datetime | None = None) -> Payout | None:
    """Pay the organisation's payable out to its Connect account; None when it is below
    ``PAYOUT_MINIMUM_MINOR``. A payout an earlier run left ``created`` (Stripe was unavailable) is sent again
    first, with the same idempotency keys, and returned instead of a new one.

    After a payout failed once its transfer was made, Stripe holds its amount in the provider's balance: the
    next run pays that amount out again from there, without a second transfer, and the rest of the payable on
    the run after.

    Raises ``PayoutRefused`` (nothing moved) without a Connect account or when Stripe says payouts are not
    enabled (re-read first). Returns the payout: ``in_transit`` when Stripe took it, ``failed`` (and the
    amount payable again) when Stripe refused it, still ``created`` when Stripe was unavailable."""
    connect = ConnectAccount.objects.filter(organization=organization).first()
    if connect is None:
        raise PayoutRefused("no Stripe account to pay into: start the payout onboarding first")
    try:
        connect = connect_refresh(organization)
    except PaymentError as exc:
        raise PayoutRefused(f"Stripe could not confirm the account: {exc.message}") from exc
    if not connect.payouts_enabled:
        due = tuple(connect.requirements_due)
        said = ", ".join(due) if due else "Stripe's verification of the account"
        raise PayoutRefused(f"payouts are not enabled on the Stripe account yet; still due: {said}", due)
    pending = Payout.objects.filter(organization=organization, state=PayoutState.CREATED).order_by("pk").first()
    if pending is not None:
        return _payout_send(pending, connect)
    payout = _payout_create(organization, now=now)
    if payout is None:
        return None
    return _payout_send(payout, connect)


def _payout_create(organization: Organization, *, now: dt.datetime | None) -> Payout | None:
    with transaction.atomic():
        # The organisation's row is the lock: two runs at once (the beat and the button) make one payout.
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        if Payout.objects.filter(organization=organization, state=PayoutState.CREATED).exists():
            return None  # the other run made it and is sending it
        payable = payable_minor(organization)
        stranded = _stranded(organization)
        if stranded is not None and payable >= stranded.amount_minor:
            # Already at Stripe, in the provider's balance: paid out again without a second transfer.
            amount, transfer = stranded.amount_minor, stranded.stripe_transfer
        else:
            # Above Stripe's largest single amount, the rest goes in the next payout.
            amount, transfer = min(payable, MAX_AMOUNT_MINOR), ""
        if amount < settings.PAYOUT_MINIMUM_MINOR:
            return None
        payout = Payout.objects.create(
            organization=organization, amount_minor=amount, currency=CURRENCY, stripe_transfer=transfer
        )
        book_post(
            kind="payout.transfer",
            key=f"payout:{payout.public_id}:transfer",
            lines=[
                Line(_payable(organization), amount),
                Line(book_account(kind=BookAccountKind.PAYOUTS, currency=CURRENCY), -amount),
            ],
            memo=f"payout {payout.public_id} to {organization.name}",
            now=now,
        )
    return payout


def _stranded(organization: Organization) -> Payout | None:
    """A failed payout whose transfer went through: its amount waits in the provider's Stripe balance (Stripe
    returns a failed payout's money there). It is stranded while it is the newest payout naming that transfer;
    the payout that pays it out again names the same transfer (and, failing too, strands it again)."""
    newest = (
        Payout.objects.filter(organization=organization)
        .exclude(stripe_transfer="")
        .values("stripe_transfer")
        .annotate(newest=Max("pk"))
        .values_list("newest", flat=True)
    )
    return Payout.objects.filter(pk__in=list(newest), state=PayoutState.FAILED).order_by("pk").first()


def _payout_send(payout: Payout, connect: ConnectAccount) -> Payout:
    """Stripe's transfer, then its payout, for a ``created`` payout; each call is keyed by the payout id."""
    gateway = stripe_gateway()
    metadata = {METADATA_PAYOUT: str(payout.public_id), "organization": str(payout.organization_id)}
    if not payout.stripe_transfer:
        try:
            transfer = gateway.transfer_create(
                destination=connect.stripe_account,
                amount_minor=payout.amount_minor,
                currency=payout.currency,
                idempotency_key=f"payout:{payout.public_id}:transfer",
                metadata=metadata,
            )
        except PaymentUnavailable as exc:
            log.warning("payout %s: Stripe unavailable at the transfer, the next run retries: %s", payout, exc)
            return payout
        except PaymentError as exc:
            if exc.http_status == 409:  # another run is making this very call (same key): it carries on
                return payout
            _payout_fail(payout, code=exc.code or "transfer_refused", message=exc.message, at_stripe=False)
            payout.refresh_from_db()
            return payout
        Payout.objects.filter(pk=payout.pk, stripe_transfer="").update(
            stripe_transfer=transfer.id, updated_at=timezone.now()
        )
        payout.refresh_from_db()
    try:
        sent = gateway.payout_create(
            account=connect.stripe_account,
            amount_minor=payout.amount_minor,
            currency=payout.currency,
            idempotency_key=f"payout:{payout.public_id}:payout",
            metadata=metadata,
        )
    except PaymentUnavailable as exc:
        log.warning("payout %s: Stripe unavailable at the payout, the next run retries: %s", payout, exc)
        return payout
    except PaymentError as exc:
        if exc.http_status == 409:
            return payout
        # The transfer went through: the money waits in the provider's Stripe balance (``_stranded``).
        _payout_fail(payout, code=exc.code or "payout_refused", message=exc.message, at_stripe=True, ours=True)
        payout.refresh_from_db()
        return payout
    # Conditional: a payout.failed or payout.paid event may have overtaken this answer and ended the payout.
    Payout.objects.filter(pk=payout.pk, state=PayoutState.CREATED).update(
        state=PayoutState.IN_TRANSIT, stripe_payout=sent.id, updated_at=timezone.now()
    )
    Payout.objects.filter(pk=payout.pk, stripe_payout__isnull=True).update(stripe_payout=sent.id)
    payout.refresh_from_db()
    return payout


def _payable(organization: Organization, currency: str = CURRENCY) -> Any:
    return book_account(kind=BookAccountKind.PROVIDER_PAYABLE, currency=currency, organization=organization)


def _payout_fail(payout: Payout, *, code: str, message: str, at_stripe: bool, ours: bool = False) -> bool:
    """Claim the payout ``failed`` and put its amount back on the payable, in one transaction; False when it had
    moved on (nothing changes). Stripe's event may end an ``in_transit`` payout; our own call's refusal only a
    ``created`` one (a concurrent run's success wins), and a refused transfer only one that has none."""
    claim = Payout.objects.filter(pk=payout.pk)
    if not at_stripe:
        claim = claim.filter(state=PayoutState.CREATED, stripe_transfer="")
    elif ours:
        claim = claim.filter(state=PayoutState.CREATED)
    else:
        claim = claim.filter(state__in=[PayoutState.CREATED, PayoutState.IN_TRANSIT])
    with transaction.atomic():
        claimed = claim.update(
            state=PayoutState.FAILED,
            failure_code=code[:64],
            failure_message=message[:255],
            updated_at=timezone.now(),
        )
        if not claimed:
            return False
        kind = "payout.failed" if at_stripe else "payout.reversed"
        book_post(
            kind=kind,
            key=f"payout:{payout.public_id}:{'failed' if at_stripe else 'reversed'}",
            lines=[
                Line(book_account(kind=BookAccountKind.PAYOUTS, currency=payout.currency), payout.amount_minor),
                Line(_payable(payout.organization, payout.currency), -payout.amount_minor),
            ],
            memo=f"payout {payout.public_id} failed ({code[:40]})",
        )
    return True


# --- Stripe's events -------------------------------------------------------------------------------------------


def payout_event_handle(event: EventView) -> str:
    """Apply one Stripe event about payouts or Connect accounts; returns a short outcome. Idempotent: each
    entry's key derives from the payout and the event type and each state change is a conditional update, so
    the same event twice, or an event before our own call's answer, changes nothing twice. An event about a
    payout or account we do not know is answered, not raised."""
    obj = event.object if isinstance(event.object, dict) else {}
    if event.type in ("payout.paid", "payout.failed"):
        payout = _payout_for(obj)
        if payout is None:
            return f"{event.type}: unknown payout {str(obj.get('id'))[:64]}, ignored"
        connect = ConnectAccount.objects.filter(organization_id=payout.organization_id).first()
        if connect is None or (event.account and event.account != connect.stripe_account):
            return f"{event.type}: payout {payout.public_id} belongs to another account, ignored"
        amount = obj.get("amount")
        if type(amount) is not int or amount != payout.amount_minor:
            return f"{event.type}: amount {str(amount)[:20]} is not payout {payout.public_id}'s, ignored"
        stripe_id = obj.get("id")
        if isinstance(stripe_id, str) and stripe_id:
            Payout.objects.filter(pk=payout.pk, stripe_payout__isnull=True).update(stripe_payout=stripe_id[:64])
        if event.type == "payout.paid":
            return _payout_paid(payout)
        return _payout_failed(payout, obj)
    if event.type == "account.updated":
        account = obj.get("id")
        connect = ConnectAccount.objects.filter(stripe_account=account).first() if isinstance(account, str) else None
        if connect is None:
            return f"account.updated: unknown account {str(account)[:64]}, ignored"
        requirements = obj.get("requirements")
        due = requirements.get("currently_due") if isinstance(requirements, dict) else []
        _connect_store(
            connect,
            AccountView(
                id=connect.stripe_account,
                payouts_enabled=obj.get("payouts_enabled") is True,
                charges_enabled=obj.get("charges_enabled") is True,
                details_submitted=obj.get("details_submitted") is True,
                requirements_due=tuple(_requirements(due)),
            ),
        )
        return f"account {connect.stripe_account}: payouts {'enabled' if connect.payouts_enabled else 'disabled'}"
    return f"{event.type}: not a payout event, ignored"


def _payout_for(obj: dict[str, Any]) -> Payout | None:
    """Our payout by Stripe's id, else by the public id we put in its metadata (the event overtook our answer)."""
    stripe_id = obj.get("id")
    if isinstance(stripe_id, str) and stripe_id:
        found = Payout.objects.select_related("organization").filter(stripe_payout=stripe_id).first()
        if found is not None:
            return found
    metadata = obj.get("metadata")
    named = metadata.get(METADATA_PAYOUT) if isinstance(metadata, dict) else None
    if not isinstance(named, str) or len(named) > 64:
        return None
    try:
        public_id = uuid.UUID(named)
    except ValueError:
        return None
    return Payout.objects.select_related("organization").filter(public_id=public_id).first()


def _payout_paid(payout: Payout) -> str:
    with transaction.atomic():
        claimed = Payout.objects.filter(pk=payout.pk, state__in=[PayoutState.CREATED, PayoutState.IN_TRANSIT]).update(
            state=PayoutState.PAID, updated_at=timezone.now()
        )
        if not claimed:
            payout.refresh_from_db()
            return f"payout {payout.public_id} already {payout.state}: unchanged"
        book_post(
            kind="payout.paid",
            key=f"payout:{payout.public_id}:paid",
            lines=[
                Line(book_account(kind=BookAccountKind.PAYOUTS, currency=payout.currency), payout.amount_minor),
                Line(book_account(kind=BookAccountKind.CASH, currency=payout.currency), -payout.amount_minor),
            ],
            memo=f"payout {payout.public_id} paid",
        )
    return f"payout {payout.public_id} paid"


def _payout_failed(payout: Payout, obj: dict[str, Any]) -> str:
    code = obj.get("failure_code")
    message = obj.get("failure_message")
    code = code if isinstance(code, str) and code else "payout_failed"
    message = message if isinstance(message, str) and message else "Stripe could not pay this out to the bank."
    if not _payout_fail(payout, code=code, message=message, at_stripe=True):
        payout.refresh_from_db()
        if payout.state == PayoutState.PAID and _payout_fail_after_paid(payout, code=code, message=message):
            return f"payout {payout.public_id} failed after it was paid ({code[:40]}): payable again"
        return f"payout {payout.public_id} already {payout.state}: unchanged"
    return f"payout {payout.public_id} failed: {code[:40]}"


def _payout_fail_after_paid(payout: Payout, *, code: str, message: str) -> bool:
    """A payout Stripe reported paid and then failed: the bank sent it back (a payout "can show paid and then fail",
    https://docs.stripe.com/payouts#payout-failures), and Stripe returns the money to the provider's balance. One
    transaction claims it failed and reverses its ``paid`` entry onto the payable, so the next run pays it out
    again from that balance without a second transfer (``_stranded``). False when it was not ``paid``."""
    with transaction.atomic():
        claimed = Payout.objects.filter(pk=payout.pk, state=PayoutState.PAID).update(
            state=PayoutState.FAILED, failure_code=code[:64], failure_message=message[:255], updated_at=timezone.now()
        )
        if not claimed:
            return False
        book_post(
            kind="payout.failed",
            key=f"payout:{payout.public_id}:failed-after-paid",
            lines=[
                Line(book_account(kind=BookAccountKind.CASH, currency=payout.currency), payout.amount_minor),
                Line(_payable(payout.organization, payout.currency), -payout.amount_minor),
            ],
            memo=f"payout {payout.public_id} failed after it was paid ({code[:40]})",
        )
    log.warning("payout %s failed after it was paid (%s): payable again", payout.public_id, code)
    return True


# --- The schedule ----------------------------------------------------------------------------------------------


def payouts_due(now: dt.datetime | None = None, *, before_each: Callable[[], None] | None = None) -> dict[str, int]:
    """Run ``payout_run`` for every provider organisation with payouts enabled that is owed at least the
    minimum or has a payout waiting to be sent again. One organisation's failure is logged and the others
    go on. ``before_each`` (the task's time check) may raise to stop the sweep between organisations."""
    now = now or timezone.now()
    owed = (
        BookLine.objects.filter(
            account__kind=BookAccountKind.PROVIDER_PAYABLE,
            account__currency=CURRENCY,
            account__organization__kind=OrganizationKind.PROVIDER,
        )
        .values("account__organization")
        .annotate(total=Sum("amount_minor"))
        .filter(total__lte=-settings.PAYOUT_MINIMUM_MINOR)
        .values_list("account__organization", flat=True)
    )
    waiting = Payout.objects.filter(state=PayoutState.CREATED).values_list("organization_id", flat=True)
    ids = sorted(
        set(
            ConnectAccount.objects.filter(
                payouts_enabled=True, organization_id__in=set(owed) | set(waiting)
            ).values_list("organization_id", flat=True)
        )
    )
    totals = {"organizations": len(ids), "sent": 0, "failed": 0, "waiting": 0, "refused": 0, "errors": 0}
    for organization in Organization.objects.filter(pk__in=ids).order_by("pk"):
        if before_each is not None:
            before_each()
        try:
            payout = payout_run(organization=organization, now=now)
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not this organisation's failure
        except PayoutRefused as exc:  # Stripe disabled payouts since the account was last read
            log.warning("paying out to organization %s refused: %s", organization.pk, exc.reason)
            totals["refused"] += 1
            continue
        except Exception:  # one organisation's surprise must not stop everyone else's payout
            log.exception("paying out to organization %s failed", organization.pk)
            totals["errors"] += 1
            continue
        if payout is None:
            continue
        key = {PayoutState.IN_TRANSIT: "sent", PayoutState.FAILED: "failed", PayoutState.CREATED: "waiting"}
        totals[key.get(PayoutState(payout.state), "sent")] += 1
    return totals
