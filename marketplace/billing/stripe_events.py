"""Stripe's webhook events: verified by signature, taken once by event id, applied, or recorded as ignored.

Stripe retries a delivery that is not answered 2xx for days (https://docs.stripe.com/webhooks#retries), so only two
answers are not 2xx: a delivery that is not provably Stripe's (``WebhookRejected``) and Stripe being unreachable
while we read an object back (``PaymentUnavailable``: nothing is recorded, and the retry applies it). Everything else
is answered 2xx and recorded: an event of a type we do not handle, about an object we do not have, or from a
connected account, is recorded with ``ignored`` set and the reason in ``outcome``.

An event's object is read back as Stripe has it now, on the account the event came from (the event's ``account``,
https://docs.stripe.com/connect/webhooks), so events arriving in any order cannot undo what a later one did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from marketplace.billing.book import BookError
from marketplace.billing.payments import topup_apply
from marketplace.billing.payouts import payout_event_handle
from marketplace.billing.stripe_gateway import (
    EventView,
    PaymentError,
    PaymentIntentView,
    PaymentUnavailable,
    StripeGateway,
    stripe_gateway,
)
from marketplace.models.billing import StripeEvent, TopUp

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_OBJECT_ID = re.compile(r"^[A-Za-z0-9_]{1,255}$")
# checkout.session.* events are recorded as ignored on purpose: a Checkout top-up's PaymentIntent carries the
# top-up in its own metadata (payment_intent_data.metadata), so payment_intent.succeeded credits it like any other
# top-up, and for cards (the only method its sessions offer) checkout.session.completed says nothing more; the
# async_payment_* events concern delayed methods (bank debits) it never offers. An expired session is found by
# ``topups_settle_stale``, which reads the session back.
HANDLED_PREFIXES = ("payment_intent.", "payout.", "transfer.")
HANDLED_TYPES = frozenset({"account.updated"})


@dataclass(frozen=True)
class _Outcome:
    text: str
    ignored: bool = False


def _ignored(reason: str) -> _Outcome:
    return _Outcome(f"ignored: {reason}", ignored=True)


def stripe_event_receive(payload: bytes, signature_header: str) -> str:
    """Take one webhook delivery and return what was done (``"ignored: <reason>"`` when nothing was).

    Raises ``WebhookRejected`` for a delivery that is not provably Stripe's and ``PaymentUnavailable`` when Stripe
    could not be read back; in both cases nothing is recorded."""
    gateway = stripe_gateway()
    event = gateway.event_verify(payload, signature_header)
    if StripeEvent.objects.filter(event_id=event.id).exists():
        return "duplicate: already taken"
    early = _screen(event)
    intent: PaymentIntentView | None = None
    if early is None:
        try:
            intent = _read_back(gateway, event)
        except PaymentUnavailable:
            raise
        except PaymentError as exc:  # final: Stripe has no such object on that account, or refuses to show it
            where = f"connected account {event.account}" if event.account else "the platform"
            early = _ignored(f"{_object_id(event)} could not be read back from {where} ({exc.code})")
    try:
        with transaction.atomic():
            record = StripeEvent.objects.create(event_id=event.id, type=event.type[:64], account=event.account or "")
            outcome = early or _apply(event, intent)
            StripeEvent.objects.filter(pk=record.pk).update(outcome=outcome.text[:255], ignored=outcome.ignored)
    except IntegrityError:
        return "duplicate: already taken"
    return outcome.text


def _object_id(event: EventView) -> str:
    value = event.object.get("id")
    return value if isinstance(value, str) and _OBJECT_ID.match(value) else ""


def _screen(event: EventView) -> _Outcome | None:
    """Why this event can be recorded as ignored without asking Stripe anything, or None."""
    if not (event.type.startswith(HANDLED_PREFIXES) or event.type in HANDLED_TYPES):
        return _ignored(f"the broker does not handle {event.type[:64]} events")
    if not _object_id(event):
        return _ignored(f"the {event.object_type[:40]} has no readable id")
    if event.type.startswith("payment_intent."):
        if event.object_type != "payment_intent":
            return _ignored(f"a {event.type[:64]} event about a {event.object_type[:40]}")
        metadata = event.object.get("metadata")
        topup_id = metadata.get("topup") if isinstance(metadata, dict) else None
        if not isinstance(topup_id, str) or not _UUID.match(topup_id):
            return _ignored(f"PaymentIntent {_object_id(event)} is no top-up of ours")
        if event.account:
            # Top-ups are paid to the platform; the same metadata on a connected account's payment is not ours.
            return _ignored(f"PaymentIntent {_object_id(event)} is on connected account {event.account}")
    return None


def _read_back(gateway: StripeGateway, event: EventView) -> PaymentIntentView | None:
    """The event's object as Stripe has it now, on the event's account; a payout is read back to prove it is there
    (its handler goes by the event), a PaymentIntent to be applied as it is now."""
    object_id = _object_id(event)
    if event.type.startswith("payment_intent."):
        return gateway.payment_intent_retrieve(object_id, account=event.account)
    if event.type.startswith("payout.") and event.object_type == "payout":
        gateway.payout_retrieve(object_id, account=event.account)
    return None


def _apply(event: EventView, intent: PaymentIntentView | None) -> _Outcome:
    if intent is not None:
        topup_id = intent.metadata.get("topup", "")
        topup = TopUp.objects.filter(public_id=topup_id).first() if _UUID.match(topup_id) else None
        if topup is None:
            return _ignored(f"PaymentIntent {intent.id} is no top-up of ours")
        try:
            return _Outcome(f"top-up {topup.public_id}: {topup_apply(topup, intent).state}")
        except BookError as exc:
            return _ignored(str(exc))
    text = payout_event_handle(event)
    return _Outcome(text, ignored=text.endswith("ignored"))
