"""Money in: card top-ups into prepaid credit (Stripe PaymentIntents), refunds, and Stripe's webhook events.

A person types a card only on Stripe's hosted Checkout page (``topup_checkout_start``): the broker never sees the
card number, which keeps it in PCI DSS's smallest questionnaire (SAQ A), and Stripe runs 3-D Secure and wallets
there. A saved card and auto top-up charge a PaymentMethod id directly (``topup_start``).

A top-up is stored (committed) before Stripe is called, keyed by the buyer's Idempotency-Key, and the
PaymentIntent is created with an idempotency key derived from it, so a retry after a lost answer never charges
twice. Whatever tells us first that a PaymentIntent succeeded, the call's answer, the 3-D Secure return or the
webhook, credits the book under one key per PaymentIntent, so it is credited once. Webhook events
(``stripe_events``) apply a PaymentIntent as Stripe has it now (read back), so events arriving in any order cannot
undo a success.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from marketplace.billing.book import BookError, Line, book_account, book_post, credit_available
from marketplace.billing.credit import CURRENCY, money
from marketplace.billing.stripe_gateway import (
    CheckoutSessionView,
    PaymentError,
    PaymentIntentView,
    PaymentUnavailable,
    stripe_gateway,
)
from marketplace.models import BookAccountKind, BookLine, Order, Organization
from marketplace.models.billing import BillingProfile, EmailVerification, TopUp, TopUpState

log = logging.getLogger(__name__)

MIN_TOPUP_MINOR = 500  # $5: below it the card fee eats the top-up
MAX_TOPUP_MINOR = 1_000_000  # $10,000 per payment; larger accounts are invoiced
_PAYMENT_METHOD = re.compile(r"^pm_[A-Za-z0-9_]{1,60}$")
CHECKOUT_PRODUCT = "Prepaid credit"
# How long the hosted page takes a card; Stripe allows 30 minutes to 24 hours
# (https://docs.stripe.com/api/checkout/sessions/create#create_checkout_session-expires_at). An hour is long enough
# to fetch a card and pass 3-D Secure, and short enough that an abandoned top-up soon reads as failed.
CHECKOUT_LIFETIME = dt.timedelta(hours=1)


class TopUpRefused(ValueError):
    """A top-up not attempted, or declined; ``code`` says which (the API's error code)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TopUpRequest:
    amount_minor: int
    payment_method: str
    return_url: str
    idempotency_key: str


@dataclass(frozen=True)
class CheckoutRequest:
    """A top-up paid on Stripe's hosted page: Stripe sends the buyer to ``success_url`` (its
    ``{CHECKOUT_SESSION_ID}`` replaced by the session's id) or back to ``cancel_url``."""

    amount_minor: int
    success_url: str
    cancel_url: str
    save_card: bool
    idempotency_key: str


def email_verified(user: AbstractBaseUser) -> bool:
    """Whether the user has proved they read their current address."""
    email = getattr(user, "email", "")
    return bool(email) and EmailVerification.objects.filter(user=user, email=email.lower()).exists()


def billing_profile(organization: Organization) -> BillingProfile:
    """The organisation's billing profile, made on first use (a write: for reading, ``billing_profile_read``)."""
    profile, _ = BillingProfile.objects.get_or_create(organization=organization)
    return profile


def billing_profile_read(organization: Organization) -> BillingProfile:
    """The organisation's billing profile as stored, or an unsaved empty one: reading writes nothing."""
    return BillingProfile.objects.filter(organization=organization).first() or BillingProfile(organization=organization)


def topup_start(*, organization: Organization, user: AbstractBaseUser | None, request: TopUpRequest) -> TopUp:
    """Charge a card into the organisation's credit. Returns the top-up as the payment left it: succeeded
    (credited), requires_action (the card holder must pass 3-D Secure at ``next_action_url``), pending (Stripe
    could not be reached: retry with the same key, or it is settled by its webhook). Raises ``TopUpRefused`` for
    a request not attempted (bad amount or card, email not verified, a key reused with another body) and for a
    declined card (the top-up is stored as failed, with the reason)."""
    _validate(request)
    automatic = user is None
    profile = _may_top_up(organization, user)
    topup = _topup_row(organization, user, request.amount_minor, request.idempotency_key, automatic=automatic)
    if topup.state != TopUpState.PENDING or topup.payment_intent:
        return topup_refresh(topup) if topup.state == TopUpState.REQUIRES_ACTION else topup
    gateway = stripe_gateway()
    try:
        customer = _customer(organization, profile)
        intent = gateway.payment_intent_create(
            customer=customer,
            amount_minor=topup.amount_minor,
            currency=topup.currency,
            payment_method=request.payment_method,
            return_url=request.return_url,
            idempotency_key=f"topup:{topup.public_id}",
            metadata={"topup": str(topup.public_id), "organization": str(organization.pk)},
            off_session=automatic,
        )
    except PaymentUnavailable as exc:
        TopUp.objects.filter(pk=topup.pk, state=TopUpState.PENDING).update(
            failure=f"the payment platform did not answer ({exc.code}); retry with the same Idempotency-Key"
        )
        topup.refresh_from_db()
        return topup
    except PaymentError as exc:
        with transaction.atomic():
            locked = TopUp.objects.select_for_update().get(pk=topup.pk)
            if locked.state != TopUpState.SUCCEEDED:  # a webhook may have settled it meanwhile
                locked.state, locked.failure = TopUpState.FAILED, _decline_message(exc)
                locked.save(update_fields=["state", "failure", "updated_at"])
        raise TopUpRefused(exc.code or "card_error", _decline_message(exc)) from None
    return topup_apply(topup, intent)


def topup_checkout_start(*, organization: Organization, user: AbstractBaseUser, request: CheckoutRequest) -> TopUp:
    """Open Stripe's hosted Checkout page for a top-up. The top-up is committed first (keyed by
    ``request.idempotency_key``), then the session is made with a key derived from it, so a repeated request
    answers the same top-up and page. Returns it ``requires_action`` with the page in ``next_action_url`` (send
    the buyer there), or ``pending`` when Stripe did not answer (repeat with the same key). Whatever reports the
    payment first, the buyer's return (``topup_refresh``) or the PaymentIntent's webhook, credits it, once.
    Raises ``TopUpRefused`` as ``topup_start`` does, and when Stripe refuses the session."""
    _validate_amount_and_key(request.amount_minor, request.idempotency_key)
    for url in (request.success_url, request.cancel_url):
        if not url.startswith(("https://", "http://")) or len(url) > 2000:
            raise TopUpRefused("invalid_url", "the return addresses must be http(s) URLs")
    profile = _may_top_up(organization, user)
    topup = _topup_row(organization, user, request.amount_minor, request.idempotency_key, automatic=False)
    if topup.checkout_session or topup.payment_intent or topup.state != TopUpState.PENDING:
        return topup  # a repeat: the page made the first time, or the payment's outcome
    metadata = {"topup": str(topup.public_id), "organization": str(organization.pk)}
    try:
        session = stripe_gateway().checkout_session_create(
            customer=_customer(organization, profile),
            amount_minor=topup.amount_minor,
            currency=topup.currency,
            product_name=CHECKOUT_PRODUCT,
            success_url=request.success_url,
            cancel_url=request.cancel_url,
            metadata=metadata,
            save_card=request.save_card,
            # From the row, not the clock: a retry under the same key must send the same parameters.
            expires_at=int((topup.created_at + CHECKOUT_LIFETIME).timestamp()),
            idempotency_key=f"topup:{topup.public_id}:checkout",
        )
    except PaymentUnavailable as exc:
        TopUp.objects.filter(pk=topup.pk, state=TopUpState.PENDING).update(
            failure=f"the payment platform did not answer ({exc.code}); retry with the same Idempotency-Key"
        )
        topup.refresh_from_db()
        return topup
    except PaymentError as exc:
        TopUp.objects.filter(pk=topup.pk, state=TopUpState.PENDING).update(
            state=TopUpState.FAILED, failure=f"the payment platform refused the payment page: {exc.message}"[:255]
        )
        raise TopUpRefused(exc.code or "payment_error", exc.message) from None
    TopUp.objects.filter(pk=topup.pk, state=TopUpState.PENDING).update(
        state=TopUpState.REQUIRES_ACTION,
        checkout_session=session.id,
        next_action_url=session.url or "",
        failure="",
    )
    topup.refresh_from_db()
    return topup


def _may_top_up(organization: Organization, user: AbstractBaseUser | None) -> BillingProfile:
    """The organisation's billing profile, once a person (not auto top-up) has a verified email and the
    organisation a billing country; ``TopUpRefused`` otherwise."""
    if user is not None and not email_verified(user):
        raise TopUpRefused(
            "email_unverified", "verify your email address before the first top-up (we sent a link; send it again)"
        )
    profile = billing_profile(organization)
    if not profile.country:
        raise TopUpRefused("country_required", "set the organisation's billing country first (it decides the tax)")
    return profile


def _validate(request: TopUpRequest) -> None:
    _validate_amount_and_key(request.amount_minor, request.idempotency_key)
    if not _PAYMENT_METHOD.match(request.payment_method or ""):
        raise TopUpRefused("invalid_payment_method", "payment_method must be a Stripe PaymentMethod id (pm_...)")


def _validate_amount_and_key(amount: int, idempotency_key: str) -> None:
    if type(amount) is not int or not MIN_TOPUP_MINOR <= amount <= MAX_TOPUP_MINOR:
        raise TopUpRefused(
            "invalid_amount", f"a top-up is between {money(MIN_TOPUP_MINOR)} and {money(MAX_TOPUP_MINOR)}"
        )
    if not idempotency_key or len(idempotency_key) > 128:
        raise TopUpRefused("idempotency_key_required", "a top-up needs an Idempotency-Key of 1 to 128 characters")


def _topup_row(
    organization: Organization,
    user: AbstractBaseUser | None,
    amount_minor: int,
    idempotency_key: str,
    *,
    automatic: bool,
) -> TopUp:
    try:
        with transaction.atomic():
            return TopUp.objects.create(
                organization=organization,
                created_by=user,
                amount_minor=amount_minor,
                currency=CURRENCY,
                automatic=automatic,
                idempotency_key=idempotency_key,
            )
    except IntegrityError:
        existing = TopUp.objects.get(organization=organization, idempotency_key=idempotency_key)
        if existing.amount_minor != amount_minor:
            raise TopUpRefused(
                "idempotency_conflict", "this Idempotency-Key was already used for a top-up of another amount"
            ) from None
        return existing


def _customer(organization: Organization, profile: BillingProfile) -> str:
    if profile.stripe_customer:
        return profile.stripe_customer
    owner = organization.memberships.filter(role="owner").select_related("user").order_by("pk").first()
    customer = stripe_gateway().customer_create(
        email=owner.user.email if owner else "",
        name=organization.name,
        idempotency_key=f"customer:{organization.pk}",
    )
    BillingProfile.objects.filter(pk=profile.pk, stripe_customer="").update(stripe_customer=customer.id)
    profile.refresh_from_db()
    return profile.stripe_customer


def _decline_message(exc: PaymentError) -> str:
    reason = exc.decline_code or exc.code
    return f"the card was declined ({reason}): {exc.message}"[:255]


def topup_apply(topup: TopUp, intent: PaymentIntentView) -> TopUp:
    """Bring the top-up to the PaymentIntent's state. Credits the book once when it succeeded (and saves the card
    for auto top-up when the buyer asked Checkout to keep it); a succeeded top-up never goes back. A Checkout
    top-up waits for success or the session's end: its page takes another card after a decline. A PaymentIntent
    that is not this top-up's (amount, currency, metadata) is refused."""
    if intent.metadata.get("topup") != str(topup.public_id) or intent.amount_minor != topup.amount_minor:
        raise BookError(f"PaymentIntent {intent.id} does not match top-up {topup.public_id}")
    if intent.currency != topup.currency:
        raise BookError(f"PaymentIntent {intent.id} is in {intent.currency}, the top-up in {topup.currency}")
    with transaction.atomic():
        locked = TopUp.objects.select_for_update().select_related("organization").get(pk=topup.pk)
        if locked.payment_intent is None:
            locked.payment_intent = intent.id
        if locked.state == TopUpState.SUCCEEDED:
            return locked
        if locked.checkout_session and intent.status != "succeeded":
            locked.save()  # the buyer may still try another card on the page; its session's end settles it
            return locked
        if intent.status == "succeeded":
            cash = book_account(kind=BookAccountKind.CASH, currency=locked.currency)
            credit = book_account(
                kind=BookAccountKind.BUYER_CREDIT, currency=locked.currency, organization=locked.organization
            )
            book_post(
                kind="topup",
                key=f"stripe:{intent.id}:succeeded",
                lines=[Line(cash, locked.amount_minor), Line(credit, -locked.amount_minor)],
                memo=f"top-up {locked.public_id}",
            )
            locked.state, locked.failure, locked.next_action_url = TopUpState.SUCCEEDED, "", ""
            if intent.setup_future_usage == "off_session" and intent.payment_method:
                # The buyer ticked "save this card" on our page; Stripe attached it for charges without them.
                BillingProfile.objects.filter(organization=locked.organization).update(
                    payment_method=intent.payment_method
                )
        elif intent.status == "requires_action":
            locked.state, locked.next_action_url = TopUpState.REQUIRES_ACTION, intent.next_action_url or ""
        elif intent.status in ("requires_payment_method", "canceled"):
            locked.state = TopUpState.FAILED
            locked.failure = (intent.error_message or f"the payment ended {intent.status}")[:255]
            locked.next_action_url = ""
        locked.save()
    return locked


def topup_refresh(topup: TopUp) -> TopUp:
    """Read the top-up's payment back from Stripe and apply it (after 3-D Secure or the Checkout page, or a lost
    answer): a Checkout top-up through its session (``topup_checkout_settle``), others through the PaymentIntent."""
    if topup.checkout_session and topup.state != TopUpState.SUCCEEDED:
        return topup_checkout_settle(topup)
    if not topup.payment_intent:
        return topup
    return topup_apply(topup, stripe_gateway().payment_intent_retrieve(topup.payment_intent))


def topup_checkout_settle(topup: TopUp) -> TopUp:
    """Read a Checkout top-up's session back: its PaymentIntent, once a card was submitted, is applied (credited
    once if it succeeded); a session that expired unpaid fails the top-up. A session that is not this top-up's
    is refused (``BookError``). Safe to repeat, and in any order with the webhook."""
    gateway = stripe_gateway()
    session: CheckoutSessionView = gateway.checkout_session_retrieve(topup.checkout_session)
    if session.metadata.get("topup") != str(topup.public_id):
        raise BookError(f"Checkout Session {session.id} does not belong to top-up {topup.public_id}")
    if session.payment_intent:
        topup = topup_apply(topup, gateway.payment_intent_retrieve(session.payment_intent))
    if session.status == "expired" and topup.state != TopUpState.SUCCEEDED:
        TopUp.objects.filter(pk=topup.pk).exclude(state=TopUpState.SUCCEEDED).update(
            state=TopUpState.FAILED, failure="the card page expired before a payment was made", next_action_url=""
        )
        topup.refresh_from_db()
    return topup


def topup_refund(*, topup: TopUp, amount_minor: int, by: AbstractBaseUser) -> int:
    """Refund part of a succeeded top-up to its card: at most what is left of it and what the organisation has
    not spent or held. The book moves after Stripe confirms; the refund's key is the top-up's refunded total,
    so a retry after a lost answer is the same refund."""
    if topup.state != TopUpState.SUCCEEDED or not topup.payment_intent:
        raise TopUpRefused("not_refundable", f"top-up {topup.public_id} is {topup.state}; only a paid one is refunded")
    with transaction.atomic():
        locked = TopUp.objects.select_for_update().get(pk=topup.pk)
        organization = Organization.objects.select_for_update().get(pk=locked.organization_id)
        left = min(locked.amount_minor - locked.refunded_minor, credit_available(organization, locked.currency))
        if type(amount_minor) is not int or not 0 < amount_minor <= left:
            raise TopUpRefused(
                "invalid_amount", f"a refund of this top-up is between {money(1)} and {money(max(left, 0))}"
            )
        key = f"topup:{locked.public_id}:refund:{locked.refunded_minor}"
        refund = stripe_gateway().refund_create(
            payment_intent=locked.payment_intent,
            amount_minor=amount_minor,
            idempotency_key=key,
            metadata={"topup": str(locked.public_id)},
        )
        credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency=locked.currency, organization=organization)
        cash = book_account(kind=BookAccountKind.CASH, currency=locked.currency)
        book_post(
            kind="topup.refund",
            key=f"stripe:{refund.id}:refund",
            lines=[Line(credit, amount_minor), Line(cash, -amount_minor)],
            memo=f"refund of top-up {locked.public_id}",
        )
        TopUp.objects.filter(pk=locked.pk).update(refunded_minor=locked.refunded_minor + amount_minor)
    return amount_minor


def order_refund(*, order: Order, amount_minor: int, key: str, reason: str) -> int:
    """Give back part of a finished order's charge as credit. The refund takes back its share of what the charge
    paid out: the provider's part from its payable (clawed back from its next payouts once it was paid, so the
    payable may go below zero), the commission and the tax, each in proportion (``_refund_shares``). Refused for
    an order that has not ended or was not charged, and beyond what it was charged less earlier refunds. ``key``
    makes a retry harmless: the same key returns the refund it made."""
    if order.state not in Order.FINAL_STATES:
        raise TopUpRefused("order_not_finished", f"order {order.public_id} is {order.state}: end it before a refund")
    entry_key = f"order:{order.pk}:refund:{key}"[:128]
    with transaction.atomic():
        organization = Organization.objects.select_for_update().get(pk=order.organization_id)
        done = BookLine.objects.filter(
            entry__key=entry_key, account__kind=BookAccountKind.BUYER_CREDIT, account__organization=organization
        ).first()
        if done is not None:
            return -done.amount_minor
        charged, refunded = _order_charged_refunded(order)
        if charged <= 0:
            raise TopUpRefused("not_charged", f"order {order.public_id} was not charged: there is nothing to refund")
        if type(amount_minor) is not int or not 0 < amount_minor <= charged - refunded:
            raise TopUpRefused(
                "invalid_amount",
                f"order {order.public_id} was charged {money(charged)} and refunded {money(refunded)}: "
                f"a refund is at most {money(charged - refunded)}",
            )
        credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency=CURRENCY, organization=organization)
        lines = [Line(credit, -amount_minor)]
        lines += _refund_shares(order, charged=charged, refunded_after=refunded + amount_minor, amount=amount_minor)
        book_post(kind="order.refund", key=entry_key, lines=lines, memo=reason[:255], order=order)
    return amount_minor


def _refund_shares(order: Order, *, charged: int, refunded_after: int, amount: int) -> list[Line]:
    """The refund's lines taking back from each account the charge credited (provider payable, commission,
    tax), in proportion to the share of the charge refunded so far, half up, less what earlier refunds took.
    Figured on the running total, so refunds in parts add up to exactly the charge; the cent or two that
    proportional rounding leaves over is the marketplace's (the refunds account)."""
    charge_lines = BookLine.objects.filter(entry__order=order, entry__kind="order.charge").exclude(
        account__kind=BookAccountKind.BUYER_CREDIT
    )
    credited: dict[int, tuple[Any, int]] = {}
    for line in charge_lines.select_related("account"):
        account, total = credited.get(line.account_id, (line.account, 0))
        credited[line.account_id] = (account, total - line.amount_minor)
    taken = dict(
        BookLine.objects.filter(entry__order=order, entry__kind="order.refund", account_id__in=list(credited))
        .values_list("account_id")
        .annotate(total=Sum("amount_minor"))
    )
    lines: list[Line] = []
    for account_id, (account, total) in sorted(credited.items()):
        target = int((Decimal(total) * refunded_after / charged).quantize(Decimal(1), rounding=ROUND_HALF_UP))
        share = target - int(taken.get(account_id) or 0)
        if share:
            lines.append(Line(account, share))
    rest = amount - sum(line.amount_minor for line in lines)
    if rest:
        lines.append(Line(book_account(kind=BookAccountKind.REFUNDS, currency=CURRENCY), rest))
    return lines


def order_refundable_minor(order: Order) -> int:
    """What is left of the order's charge to refund (0 when it was not charged)."""
    charged, refunded = _order_charged_refunded(order)
    return max(0, charged - refunded)


def _order_charged_refunded(order: Order) -> tuple[int, int]:
    """What the order's charge took from the buyer's credit, and what refunds gave back, in minor units."""
    return (
        _order_lines_total(order, "order.charge", BookAccountKind.BUYER_CREDIT),
        -_order_lines_total(order, "order.refund", BookAccountKind.BUYER_CREDIT),
    )


def _order_lines_total(order: Order, kind: str, account_kind: str) -> int:
    total = BookLine.objects.filter(entry__order=order, entry__kind=kind, account__kind=account_kind).aggregate(
        total=Sum("amount_minor")
    )["total"]
    return int(total or 0)


def auto_topups_due(*, before_each: Callable[[], None] | None = None) -> int:
    """Charge the saved card of every prepaid organisation whose credit fell below its auto top-up threshold;
    one organisation's decline is logged and the others go on. Keyed by the credit entries so far, so one dip
    makes one payment."""
    started = 0
    profiles = BillingProfile.objects.filter(
        auto_topup_below_minor__isnull=False,
        auto_topup_amount_minor__isnull=False,
        organization__payment_terms="prepaid",
    ).exclude(payment_method="")
    for profile in profiles.select_related("organization"):
        if before_each is not None:
            before_each()  # the sweep's time check: stops between organisations, never inside a payment
        organization = profile.organization
        try:
            if credit_available(organization, CURRENCY) >= (profile.auto_topup_below_minor or 0):
                continue
            if TopUp.objects.filter(
                organization=organization, automatic=True, state__in=[TopUpState.PENDING, TopUpState.REQUIRES_ACTION]
            ).exists():
                continue
            last = TopUp.objects.filter(organization=organization, automatic=True).order_by("-pk").first()
            if last is not None and last.state == TopUpState.FAILED:
                # A declined saved card is not charged again every minute: a top-up by hand re-arms it.
                if not TopUp.objects.filter(organization=organization, state=TopUpState.SUCCEEDED, pk__gt=last.pk):
                    continue
            dips = TopUp.objects.filter(organization=organization, automatic=True).count()
            topup_start(
                organization=organization,
                user=None,
                request=TopUpRequest(
                    amount_minor=int(profile.auto_topup_amount_minor or 0),
                    payment_method=profile.payment_method,
                    return_url="",
                    idempotency_key=f"auto:{dips + 1}",
                ),
            )
            started += 1
        except (TopUpRefused, PaymentError, BookError) as exc:
            log.warning("auto top-up of organisation %s failed: %s", organization.pk, exc)
        except Exception:
            log.exception("auto top-up of organisation %s failed", organization.pk)
    return started


def topup_cancel(topup: TopUp, *, abandoned: bool = False) -> TopUp:
    """End a top-up that waits for its card holder at 3-D Secure: its PaymentIntent is cancelled at Stripe, so
    the challenge can no longer be passed and nothing is charged, and the top-up fails saying why (the buyer
    cancelled, or ``abandoned``: not completed within ``TOPUP_ACTION_TIMEOUT_S``). One that succeeded
    meanwhile is credited instead (Stripe refuses the cancel; the intent is read back). Raises
    ``TopUpRefused("not_waiting")`` for a top-up that waits for nothing, or that a Checkout page holds (its
    session expires by itself), and ``PaymentError`` when Stripe cannot be asked."""
    if topup.state != TopUpState.REQUIRES_ACTION or not topup.payment_intent or topup.checkout_session:
        raise TopUpRefused("not_waiting", f"top-up {topup.public_id} is {topup.state}: there is nothing to cancel")
    gateway = stripe_gateway()
    try:
        intent = gateway.payment_intent_cancel(
            topup.payment_intent, reason="abandoned" if abandoned else "requested_by_customer"
        )
    except PaymentError as exc:
        if exc.code != "payment_intent_unexpected_state":
            raise
        return topup_apply(topup, gateway.payment_intent_retrieve(topup.payment_intent))
    minutes = round(settings.TOPUP_ACTION_TIMEOUT_S / 60)
    why = (
        f"3-D Secure was not completed within {minutes} minutes; cancelled, nothing was charged"
        if abandoned
        else "cancelled before 3-D Secure was completed; nothing was charged"
    )
    TopUp.objects.filter(pk=topup.pk, state=TopUpState.REQUIRES_ACTION).update(
        state=TopUpState.FAILED, failure=why, next_action_url=""
    )
    topup.refresh_from_db()
    log.info("top-up %s cancelled at Stripe (%s): %s", topup.public_id, intent.status, why)
    return topup


def topup_action_deadline(topup: TopUp) -> dt.datetime:
    """When a top-up waiting for 3-D Secure is cancelled as abandoned."""
    return topup.created_at + dt.timedelta(seconds=settings.TOPUP_ACTION_TIMEOUT_S)


# A top-up Stripe never answered for (no PaymentIntent id) after this long was not charged, or its webhook
# credits it still: a failed top-up is credited when a success is reported for it.
STALE_PENDING = dt.timedelta(hours=1)


def topups_settle_stale(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Read back top-ups still waiting: those with a PaymentIntent from Stripe (a lost webhook), cancelling the
    ones abandoned at 3-D Secure (``topup_cancel``); those without one are failed after ``STALE_PENDING``. One
    top-up's error is logged and the others go on."""
    now = now or timezone.now()
    counts = {"refreshed": 0, "expired": 0}
    waiting = TopUp.objects.filter(
        state__in=[TopUpState.PENDING, TopUpState.REQUIRES_ACTION], updated_at__lt=now - dt.timedelta(minutes=2)
    ).order_by("pk")[:200]
    for topup in waiting:
        try:
            if topup.checkout_session:
                topup_refresh(topup)  # the session's own expiry (``CHECKOUT_LIFETIME``) ends an abandoned one
                counts["refreshed"] += 1
            elif topup.payment_intent:
                topup = topup_refresh(topup)
                counts["refreshed"] += 1
                if topup.state == TopUpState.REQUIRES_ACTION and topup_action_deadline(topup) <= now:
                    if topup_cancel(topup, abandoned=True).state == TopUpState.FAILED:
                        counts["expired"] += 1
            elif topup.created_at < now - STALE_PENDING:
                TopUp.objects.filter(pk=topup.pk, state=TopUpState.PENDING, payment_intent__isnull=True).update(
                    state=TopUpState.FAILED, failure="the payment platform never confirmed this payment"
                )
                counts["expired"] += 1
        except PaymentError as exc:
            log.warning("top-up %s could not be read back: %s", topup.public_id, exc)
        except Exception:
            log.exception("settling top-up %s failed", topup.public_id)
    return counts
