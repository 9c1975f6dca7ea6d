"""The broker's one door to Stripe: payments, refunds, Connect payouts and webhook checks, through the official SDK.

Every call goes through ``stripe.StripeClient`` configured from Django settings (``STRIPE_API_KEY``,
``STRIPE_API_BASE`` where "" is Stripe itself, ``STRIPE_WEBHOOK_SECRET``, ``STRIPE_TIMEOUT_SECONDS``,
``STRIPE_MAX_NETWORK_RETRIES``). Answers are checked field by field into frozen DTOs; nothing from the SDK leaks
out: its errors become ``PaymentError`` (final: a decline, a refused parameter, a bad key) or ``PaymentUnavailable``
(the call may or may not have happened: retry it with the same idempotency key, which makes the retry safe).

Money is in minor units (``amount_minor``); currencies are upper-case ISO codes here and lower-case on Stripe's wire.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import stripe
from django.conf import settings

MAX_AMOUNT_MINOR = (
    99_999_999  # Stripe's largest USD charge (https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts)
)
MAX_WEBHOOK_BYTES = 256 * 1024
MAX_SIGNATURE_HEADER = 4096
WEBHOOK_TOLERANCE_SECONDS = 300  # Stripe's default (https://docs.stripe.com/webhooks#verify-manually)
MAX_METADATA_KEYS = 50
MAX_LISTED = 100_000  # items one list call may page through (a day's movements, with room)
_CURRENCY = re.compile(r"^[A-Za-z]{3}$")
_COUNTRY = re.compile(r"^[A-Za-z]{2}$")
_CHECKOUT_SESSION = re.compile(r"^cs_[A-Za-z0-9_]{1,250}$")
CHECKOUT_STATUSES = frozenset({"open", "complete", "expired"})
CHECKOUT_PAYMENT_STATUSES = frozenset({"paid", "unpaid", "no_payment_required"})
T = TypeVar("T")


# ------------------------------------------------------------------------------------------- errors


class PaymentError(Exception):
    """Stripe refused or could not do the call. ``code`` is Stripe's error code (or the error type when Stripe gave
    none); ``retryable`` is False: repeating the same call gives the same answer."""

    retryable: bool = False

    def __init__(
        self,
        code: str,
        message: str,
        *,
        decline_code: str | None = None,
        http_status: int | None = None,
        payment_intent: str | None = None,
    ):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.decline_code = decline_code
        self.http_status = http_status
        self.payment_intent = payment_intent  # a declined PaymentIntent's id, kept by Stripe in that state


class PaymentUnavailable(PaymentError):
    """Network error, timeout, 5xx or 429: the call may or may not have happened; retry with the same idempotency
    key, which Stripe answers with the first outcome (https://docs.stripe.com/api/idempotent_requests)."""

    retryable = True


class WebhookRejected(Exception):
    """A webhook delivery that is not provably Stripe's: bad or missing signature, too old, malformed, too big."""


# --------------------------------------------------------------------------------------------- DTOs


@dataclass(frozen=True)
class CustomerView:
    id: str
    email: str | None


@dataclass(frozen=True)
class PaymentIntentView:
    id: str
    status: str
    amount_minor: int
    currency: str
    customer: str | None
    next_action_url: str | None
    error_code: str | None
    error_message: str | None
    metadata: dict[str, str]
    payment_method: str | None = None
    setup_future_usage: str | None = None  # "off_session": the card was saved for charges without the holder


@dataclass(frozen=True)
class CheckoutSessionView:
    """A Checkout Session (https://docs.stripe.com/api/checkout/sessions/object): ``url`` is the hosted page while
    it is ``open`` (null once ``complete`` or ``expired``); ``payment_intent`` exists once a card was submitted."""

    id: str
    url: str | None
    status: str
    payment_status: str
    payment_intent: str | None
    customer: str | None
    amount_minor: int
    currency: str
    metadata: dict[str, str]
    expires_at: int


@dataclass(frozen=True)
class RefundView:
    id: str
    amount_minor: int
    currency: str
    payment_intent: str
    status: str


@dataclass(frozen=True)
class AccountView:
    id: str
    payouts_enabled: bool
    charges_enabled: bool
    details_submitted: bool
    requirements_due: tuple[str, ...]


@dataclass(frozen=True)
class AccountLinkView:
    url: str


@dataclass(frozen=True)
class TransferView:
    id: str
    amount_minor: int
    currency: str
    destination: str


@dataclass(frozen=True)
class PayoutView:
    id: str
    account: str
    amount_minor: int
    currency: str
    status: str
    failure_code: str | None
    failure_message: str | None
    created: int = 0


@dataclass(frozen=True)
class BalanceTransactionView:
    """One movement of an account's Stripe balance (https://docs.stripe.com/api/balance_transactions/object):
    ``amount`` gross and ``net`` after Stripe's ``fee``; ``source`` the object that moved it, and for a charge
    the PaymentIntent it belongs to."""

    id: str
    type: str
    amount_minor: int
    fee_minor: int
    net_minor: int
    currency: str
    created: int
    source: str | None
    payment_intent: str | None


@dataclass(frozen=True)
class EventView:
    id: str
    type: str
    account: str | None
    object_type: str
    object: dict[str, Any]
    created: int


# ------------------------------------------------------------------------------------- validation


class _Answer:
    """Typed reads of one Stripe object; a missing or mistyped field is a ``PaymentError("malformed_response")``."""

    def __init__(self, data: Any, what: str):
        if not isinstance(data, dict):
            raise PaymentError("malformed_response", f"Stripe answered a non-object for {what}")
        self.data: dict[str, Any] = data
        self.what = what

    def _bad(self, key: str, kind: str) -> PaymentError:
        return PaymentError("malformed_response", f"Stripe's {self.what} has no {kind} {key!r}")

    def text(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str) or not value:
            raise self._bad(key, "string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "string")
        return value

    def integer(self, key: str) -> int:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "integer")
        return value

    def flag(self, key: str) -> bool:
        value = self.data.get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "boolean")
        return value

    def obj(self, key: str) -> _Answer:
        return _Answer(self.data.get(key), f"{self.what}.{key}")

    def opt_obj(self, key: str) -> _Answer | None:
        return None if self.data.get(key) is None else self.obj(key)

    def currency(self) -> str:
        value = self.text("currency")
        if not _CURRENCY.match(value):
            raise self._bad("currency", "ISO currency")
        return value.upper()

    def metadata(self) -> dict[str, str]:
        value = self.data.get("metadata") or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self._bad("metadata", "string map")
        return {str(k): v for k, v in value.items()}

    def str_tuple(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "list of strings")
        return tuple(value)


def _amount(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_AMOUNT_MINOR:
        raise ValueError(f"amount_minor must be an integer from 1 to {MAX_AMOUNT_MINOR}")
    return value


def _currency(value: str) -> str:
    if not isinstance(value, str) or not _CURRENCY.match(value):
        raise ValueError("currency must be a three-letter ISO code")
    return value.lower()


def _metadata(value: Mapping[str, str]) -> dict[str, str]:
    # Stripe's limits: 50 keys, keys up to 40 characters, values up to 500 (https://docs.stripe.com/api/metadata).
    if len(value) > MAX_METADATA_KEYS:
        raise ValueError(f"metadata takes at most {MAX_METADATA_KEYS} keys")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str) or len(key) > 40 or len(item) > 500 or "[" in key:
            raise ValueError(f"metadata entry {str(key)[:40]!r} is not a short string pair")
    return dict(value)


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


# --------------------------------------------------------------------------------------- gateway


class StripeGateway:
    """Typed calls to Stripe. Every create takes an ``idempotency_key`` the caller derives from its own record (an
    order, a payout row), so repeating the call after ``PaymentUnavailable`` never charges or pays twice."""

    def __init__(self, client: stripe.StripeClient, webhook_secret: str):
        self._client = client
        self._webhook_secret = webhook_secret

    # -- customers and payments

    def customer_create(self, *, email: str, name: str, idempotency_key: str) -> CustomerView:
        """Create a Customer. Idempotent on ``idempotency_key``."""
        params: Any = {"email": email, "name": name}
        answer = self._call(lambda: self._client.v1.customers.create(params, {"idempotency_key": idempotency_key}))
        data = _Answer(answer, "customer")
        return CustomerView(id=data.text("id"), email=data.opt_text("email"))

    def payment_intent_create(
        self,
        *,
        customer: str,
        amount_minor: int,
        currency: str,
        payment_method: str,
        return_url: str,
        idempotency_key: str,
        metadata: dict[str, str],
        off_session: bool = False,
    ) -> PaymentIntentView:
        """Create and confirm a PaymentIntent at once. Answers ``succeeded`` or ``requires_action`` (send the buyer to
        ``next_action_url``); a decline raises ``PaymentError(code="card_declined", decline_code=...)`` with the
        PaymentIntent's id. Idempotent on ``idempotency_key``."""
        params: Any = {
            "amount": _amount(amount_minor),
            "currency": _currency(currency),
            "customer": customer,
            "payment_method": payment_method,
            "confirm": True,
            "metadata": _metadata(metadata),
        }
        if off_session:
            params["off_session"] = True
        else:
            params["return_url"] = return_url
        options: Any = {"idempotency_key": idempotency_key}
        return self._payment_intent(self._call(lambda: self._client.v1.payment_intents.create(params, options)))

    def payment_intent_retrieve(self, payment_intent: str, *, account: str | None = None) -> PaymentIntentView:
        """The PaymentIntent as Stripe holds it now (after 3-D Secure, for instance), on the platform or, with
        ``account``, on that connected account (https://docs.stripe.com/connect/authentication). Safe to repeat."""
        options: Any = {"stripe_account": account} if account else {}
        return self._payment_intent(
            self._call(lambda: self._client.v1.payment_intents.retrieve(payment_intent, options=options))
        )

    def payment_intent_cancel(self, payment_intent: str, *, reason: str) -> PaymentIntentView:
        """Cancel a PaymentIntent still waiting (for 3-D Secure, say): it can no longer be completed, and nothing is
        charged. ``reason`` is one of Stripe's cancellation reasons (``abandoned``, ``requested_by_customer``).
        Stripe refuses one that succeeded meanwhile with ``payment_intent_unexpected_state``
        (https://docs.stripe.com/api/payment_intents/cancel). Idempotent on the intent."""
        params: Any = {"cancellation_reason": reason}
        options: Any = {"idempotency_key": f"cancel:{payment_intent}"}
        return self._payment_intent(
            self._call(lambda: self._client.v1.payment_intents.cancel(payment_intent, params, options))
        )

    def refund_create(
        self, *, payment_intent: str, amount_minor: int, idempotency_key: str, metadata: dict[str, str]
    ) -> RefundView:
        """Refund part or the rest of a succeeded payment; more than remains is ``PaymentError`` (``amount_too_large``
        or ``charge_already_refunded``). Idempotent on ``idempotency_key``."""
        params: Any = {
            "payment_intent": payment_intent,
            "amount": _amount(amount_minor),
            "metadata": _metadata(metadata),
        }
        answer = self._call(lambda: self._client.v1.refunds.create(params, {"idempotency_key": idempotency_key}))
        return self._refund(_Answer(answer, "refund"))

    # -- Checkout

    def checkout_session_create(
        self,
        *,
        customer: str,
        amount_minor: int,
        currency: str,
        product_name: str,
        success_url: str,
        cancel_url: str,
        metadata: dict[str, str],
        save_card: bool,
        expires_at: int,
        idempotency_key: str,
    ) -> CheckoutSessionView:
        """A hosted Checkout page for one payment of ``amount_minor`` (https://docs.stripe.com/api/checkout/sessions
        /create): one line item, the buyer sent to ``success_url`` (its ``{CHECKOUT_SESSION_ID}`` replaced by
        Stripe) or back to ``cancel_url``. ``metadata`` goes on the session and on its PaymentIntent, so the
        PaymentIntent's own events name it too; ``save_card`` sets the PaymentIntent's ``setup_future_usage`` to
        ``off_session``. Idempotent on ``idempotency_key``."""
        for name, url in (("success_url", success_url), ("cancel_url", cancel_url)):
            if not url.startswith(("https://", "http://")) or len(url) > 2000:
                raise ValueError(f"{name} must be an http(s) URL of at most 2000 characters")
        if not product_name or len(product_name) > 250:
            raise ValueError("product_name must be 1 to 250 characters")
        intent_data: dict[str, Any] = {"metadata": _metadata(metadata)}
        if save_card:
            intent_data["setup_future_usage"] = "off_session"
        params: Any = {
            "mode": "payment",
            "customer": customer,
            "line_items": [
                {
                    "quantity": 1,
                    "price_data": {
                        "currency": _currency(currency),
                        "unit_amount": _amount(amount_minor),
                        "product_data": {"name": product_name},
                    },
                }
            ],
            "success_url": success_url,
            "cancel_url": cancel_url,
            "expires_at": expires_at,
            "metadata": _metadata(metadata),
            "payment_intent_data": intent_data,
        }
        options: Any = {"idempotency_key": idempotency_key}
        return self._checkout_session(self._call(lambda: self._client.v1.checkout.sessions.create(params, options)))

    def checkout_session_retrieve(self, session: str) -> CheckoutSessionView:
        """The Checkout Session as Stripe holds it now. Safe to repeat."""
        if not _CHECKOUT_SESSION.match(session):
            raise ValueError("not a Checkout Session id (cs_...)")
        return self._checkout_session(self._call(lambda: self._client.v1.checkout.sessions.retrieve(session)))

    # -- Connect

    def account_create(
        self, *, email: str, country: str, idempotency_key: str, metadata: dict[str, str]
    ) -> AccountView:
        """Create an Express connected account asking for the transfers capability; it stays disabled until the
        seller finishes onboarding (``account_link_create``). Idempotent on ``idempotency_key``."""
        if not _COUNTRY.match(country):
            raise ValueError("country must be a two-letter ISO code")
        params: Any = {
            "type": "express",
            "country": country.upper(),
            "email": email,
            "capabilities": {"transfers": {"requested": True}},
            "metadata": _metadata(metadata),
        }
        answer = self._call(lambda: self._client.v1.accounts.create(params, {"idempotency_key": idempotency_key}))
        return self._account(answer)

    def account_retrieve(self, account: str) -> AccountView:
        """The connected account's state now. Safe to repeat."""
        return self._account(self._call(lambda: self._client.v1.accounts.retrieve(account)))

    def account_link_create(self, *, account: str, refresh_url: str, return_url: str) -> AccountLinkView:
        """A single-use onboarding url for the seller (a new one is needed once it expires)."""
        params: Any = {
            "account": account,
            "refresh_url": refresh_url,
            "return_url": return_url,
            "type": "account_onboarding",
        }
        data = _Answer(self._call(lambda: self._client.v1.account_links.create(params)), "account_link")
        return AccountLinkView(url=data.text("url"))

    def transfer_create(
        self, *, destination: str, amount_minor: int, currency: str, idempotency_key: str, metadata: dict[str, str]
    ) -> TransferView:
        """Move money from the platform to a connected account's balance; refused (``PaymentError``) while its
        transfers capability is inactive. Idempotent on ``idempotency_key``."""
        params: Any = {
            "destination": destination,
            "amount": _amount(amount_minor),
            "currency": _currency(currency),
            "metadata": _metadata(metadata),
        }
        answer = self._call(lambda: self._client.v1.transfers.create(params, {"idempotency_key": idempotency_key}))
        return self._transfer(_Answer(answer, "transfer"))

    def payout_create(
        self, *, account: str, amount_minor: int, currency: str, idempotency_key: str, metadata: dict[str, str]
    ) -> PayoutView:
        """Pay out of a connected account's available balance to its bank (``pending`` until Stripe reports
        ``payout.paid`` or ``payout.failed``); more than the balance is ``PaymentError("balance_insufficient")``.
        Idempotent on ``idempotency_key`` (per account)."""
        params: Any = {
            "amount": _amount(amount_minor),
            "currency": _currency(currency),
            "metadata": _metadata(metadata),
        }
        options: Any = {"idempotency_key": idempotency_key, "stripe_account": account}
        data = _Answer(self._call(lambda: self._client.v1.payouts.create(params, options)), "payout")
        return self._payout(data, account)

    def payout_retrieve(self, payout: str, *, account: str) -> PayoutView:
        """A connected account's payout as Stripe holds it now. Safe to repeat."""
        options: Any = {"stripe_account": account}
        data = _Answer(self._call(lambda: self._client.v1.payouts.retrieve(payout, options=options)), "payout")
        return self._payout(data, account)

    def transfer_retrieve(self, transfer: str) -> TransferView:
        """A transfer to a connected account as Stripe holds it. Safe to repeat."""
        data = _Answer(self._call(lambda: self._client.v1.transfers.retrieve(transfer)), "transfer")
        return self._transfer(data)

    def refund_retrieve(self, refund: str) -> RefundView:
        """A refund as Stripe holds it. Safe to repeat."""
        return self._refund(_Answer(self._call(lambda: self._client.v1.refunds.retrieve(refund)), "refund"))

    # -- lists, for reconciliation

    def balance_transactions(
        self,
        *,
        created_from: int,
        created_before: int,
        account: str | None = None,
        max_items: int = MAX_LISTED,
        page_size: int = 100,
    ) -> list[BalanceTransactionView]:
        """Every balance transaction created in [``created_from``, ``created_before``) (unix seconds), on the platform
        or on ``account``, page after page (https://docs.stripe.com/api/pagination), each charge's PaymentIntent
        read through ``expand[]=data.source``. More than ``max_items`` is ``PaymentError("too_many")``."""
        params: Any = {
            "created": {"gte": created_from, "lt": created_before},
            "limit": page_size,
            "expand": ["data.source"],
        }
        options: Any = {"stripe_account": account} if account else {}
        items = self._list(lambda: self._client.v1.balance_transactions.list(params, options), max_items)
        return [self._balance_transaction(_Answer(item, "balance_transaction")) for item in items]

    def payouts(
        self, *, account: str, created_from: int, created_before: int, max_items: int = MAX_LISTED, page_size: int = 100
    ) -> list[PayoutView]:
        """Every payout of connected ``account`` created in [``created_from``, ``created_before``), page after page."""
        params: Any = {"created": {"gte": created_from, "lt": created_before}, "limit": page_size}
        options: Any = {"stripe_account": account}
        items = self._list(lambda: self._client.v1.payouts.list(params, options), max_items)
        return [self._payout(_Answer(item, "payout"), account) for item in items]

    # -- webhooks

    def event_verify(self, payload: bytes, signature_header: str) -> EventView:
        """The event in a webhook delivery, once the SDK has checked its ``Stripe-Signature`` against
        ``STRIPE_WEBHOOK_SECRET`` and its timestamp is within 300 s. Raises ``WebhookRejected`` otherwise."""
        if len(payload) > MAX_WEBHOOK_BYTES:
            raise WebhookRejected(f"payload over {MAX_WEBHOOK_BYTES} bytes")
        if not signature_header or len(signature_header) > MAX_SIGNATURE_HEADER:
            raise WebhookRejected("missing or oversized Stripe-Signature header")
        if not self._webhook_secret:
            raise WebhookRejected("no webhook secret configured")
        try:
            self._client.construct_event(payload, signature_header, self._webhook_secret, WEBHOOK_TOLERANCE_SECONDS)
            # The verified bytes themselves, not the SDK's object, become the view.
            event = _Answer(json.loads(payload), "event")
            obj = event.obj("data").obj("object")
            if event.text("object") != "event":
                raise WebhookRejected("not an event")
            return EventView(
                id=event.text("id"),
                type=event.text("type"),
                account=event.opt_text("account"),
                object_type=obj.text("object"),
                object=obj.data,
                created=event.integer("created"),
            )
        except stripe.SignatureVerificationError as exc:
            raise WebhookRejected(str(exc.user_message or "bad signature")) from None
        except (ValueError, RecursionError, PaymentError) as exc:
            raise WebhookRejected(f"malformed event: {str(exc)[:200]}") from None

    # -- plumbing

    def _payment_intent(self, answer: Any) -> PaymentIntentView:
        data = _Answer(answer, "payment_intent")
        next_action = data.opt_obj("next_action")
        url = None
        if next_action is not None and next_action.opt_text("type") == "redirect_to_url":
            url = next_action.obj("redirect_to_url").text("url")
        error = data.opt_obj("last_payment_error")
        return PaymentIntentView(
            id=data.text("id"),
            status=data.text("status"),
            amount_minor=data.integer("amount"),
            currency=data.currency(),
            customer=data.opt_text("customer"),
            next_action_url=url,
            error_code=error.opt_text("code") if error is not None else None,
            error_message=error.opt_text("message") if error is not None else None,
            metadata=data.metadata(),
            payment_method=_id_of(data, "payment_method"),
            setup_future_usage=data.opt_text("setup_future_usage"),
        )

    @staticmethod
    def _checkout_session(answer: Any) -> CheckoutSessionView:
        data = _Answer(answer, "checkout.session")
        if data.text("object") != "checkout.session":
            raise PaymentError("malformed_response", "Stripe answered another object for a Checkout Session")
        status, payment_status = data.text("status"), data.text("payment_status")
        if status not in CHECKOUT_STATUSES or payment_status not in CHECKOUT_PAYMENT_STATUSES:
            raise PaymentError("malformed_response", f"Checkout Session in an unknown state {status[:20]!r}")
        url = data.opt_text("url")
        if url is not None and not url.startswith(("https://", "http://")):
            raise PaymentError("malformed_response", "the Checkout Session's url is not an http(s) URL")
        return CheckoutSessionView(
            id=data.text("id"),
            url=url,
            status=status,
            payment_status=payment_status,
            payment_intent=_id_of(data, "payment_intent"),
            customer=_id_of(data, "customer"),
            amount_minor=data.integer("amount_total"),
            currency=data.currency(),
            metadata=data.metadata(),
            expires_at=data.integer("expires_at"),
        )

    @staticmethod
    def _payout(data: _Answer, account: str) -> PayoutView:
        return PayoutView(
            id=data.text("id"),
            account=account,
            amount_minor=data.integer("amount"),
            currency=data.currency(),
            status=data.text("status"),
            failure_code=data.opt_text("failure_code"),
            failure_message=data.opt_text("failure_message"),
            created=data.integer("created"),
        )

    @staticmethod
    def _transfer(data: _Answer) -> TransferView:
        return TransferView(
            id=data.text("id"),
            amount_minor=data.integer("amount"),
            currency=data.currency(),
            destination=data.text("destination"),
        )

    @staticmethod
    def _refund(data: _Answer) -> RefundView:
        return RefundView(
            id=data.text("id"),
            amount_minor=data.integer("amount"),
            currency=data.currency(),
            payment_intent=data.text("payment_intent"),
            status=data.text("status"),
        )

    @staticmethod
    def _balance_transaction(data: _Answer) -> BalanceTransactionView:
        raw_source = data.data.get("source")
        source: str | None = None
        payment_intent: str | None = None
        if isinstance(raw_source, str):
            source = raw_source
        elif isinstance(raw_source, dict):  # expanded
            expanded = _Answer(raw_source, f"{data.what}.source")
            source = expanded.text("id")
            if expanded.opt_text("object") == "charge":
                payment_intent = expanded.opt_text("payment_intent")
        elif raw_source is not None:
            raise data._bad("source", "id or object")
        return BalanceTransactionView(
            id=data.text("id"),
            type=data.text("type"),
            amount_minor=data.integer("amount"),
            fee_minor=data.integer("fee"),
            net_minor=data.integer("net"),
            currency=data.currency(),
            created=data.integer("created"),
            source=source,
            payment_intent=payment_intent,
        )

    @staticmethod
    def _list(call: Callable[[], Any], max_items: int) -> list[dict[str, Any]]:
        """Every item of a Stripe list, following its cursor; its errors as ours, and a bound on its length."""
        items: list[dict[str, Any]] = []
        try:
            for item in call().auto_paging_iter():
                if len(items) >= max_items:
                    raise PaymentError("too_many", f"Stripe listed more than {max_items} items")
                data = item.to_dict() if hasattr(item, "to_dict") else item
                if not isinstance(data, dict):
                    raise PaymentError("malformed_response", "Stripe listed a non-object")
                items.append(data)
        except stripe.StripeError as exc:
            raise _translate(exc) from exc
        return items

    @staticmethod
    def _account(answer: Any) -> AccountView:
        data = _Answer(answer, "account")
        requirements = data.obj("requirements")
        return AccountView(
            id=data.text("id"),
            payouts_enabled=data.flag("payouts_enabled"),
            charges_enabled=data.flag("charges_enabled"),
            details_submitted=data.flag("details_submitted"),
            requirements_due=requirements.str_tuple("currently_due"),
        )

    @staticmethod
    def _call(call: Callable[[], Any]) -> dict[str, Any]:
        """Run one SDK call; its answer as plain data, its errors as ours."""
        try:
            answer = call()
        except stripe.StripeError as exc:
            raise _translate(exc) from exc
        result = answer.to_dict() if hasattr(answer, "to_dict") else answer
        if not isinstance(result, dict):
            raise PaymentError("malformed_response", "Stripe answered a non-object")
        return result


def _id_of(data: _Answer, key: str) -> str | None:
    """An expandable field's id, whether Stripe sent the id or the object (https://docs.stripe.com/api/expanding_objects)."""
    value = data.data.get(key)
    if isinstance(value, dict):
        return data.obj(key).text("id")
    return data.opt_text(key)


def _translate(exc: stripe.StripeError) -> PaymentError:
    """SDK error -> ours: card, parameter, key and idempotency errors are final; connection errors, timeouts, 429
    and 5xx (``APIError``) leave the outcome unknown (https://docs.stripe.com/error-handling)."""
    body = exc.json_body if isinstance(exc.json_body, dict) else {}
    raw_error = body.get("error")
    error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
    message = str(error.get("message") or exc.user_message or type(exc).__name__)[:500]
    decline = error.get("decline_code")
    intent = error.get("payment_intent")
    intent_id = intent.get("id") if isinstance(intent, dict) else None
    common: dict[str, Any] = {
        "http_status": exc.http_status,
        "decline_code": decline if isinstance(decline, str) else None,
        "payment_intent": intent_id if isinstance(intent_id, str) else None,
    }
    if isinstance(exc, stripe.RateLimitError):
        return PaymentUnavailable("rate_limit", message, **common)
    if isinstance(exc, stripe.APIConnectionError):  # refused, dropped or timed out: nothing was read back
        return PaymentUnavailable("network_error", message, **common)
    if isinstance(exc, stripe.APIError):
        return PaymentUnavailable(exc.code or "api_error", message, **common)
    fallback = {
        stripe.CardError: "card_error",
        stripe.IdempotencyError: "idempotency_error",
        stripe.AuthenticationError: "authentication_error",
        stripe.PermissionError: "permission_error",
    }.get(type(exc), "invalid_request_error")
    code = exc.code or error.get("code") or fallback
    return PaymentError(str(code)[:100], message, **common)


def stripe_gateway() -> StripeGateway:
    """A gateway built from the current settings; cheap, so build one per unit of work (settings may change in
    tests). Every call is bounded by ``STRIPE_TIMEOUT_SECONDS``."""
    api_key = str(_setting("STRIPE_API_KEY", ""))
    base = str(_setting("STRIPE_API_BASE", "") or "")
    timeout = float(_setting("STRIPE_TIMEOUT_SECONDS", 10.0))
    retries = int(_setting("STRIPE_MAX_NETWORK_RETRIES", 0))
    if not 0 < timeout <= 120:
        raise ValueError("STRIPE_TIMEOUT_SECONDS must be in (0, 120]")
    if base and not base.startswith(("https://", "http://")):
        raise ValueError("STRIPE_API_BASE must be an http(s) URL or empty")
    # The SDK's own retries reuse the idempotency key; the default 0 leaves retrying (with backoff) to our tasks.
    client = stripe.StripeClient(
        api_key,
        base_addresses={"api": base.rstrip("/")} if base else None,
        http_client=stripe.RequestsClient(timeout=timeout),
        max_network_retries=retries,
    )
    return StripeGateway(client, str(_setting("STRIPE_WEBHOOK_SECRET", "")))
