"""The Stripe sandbox's payments: customers, PaymentIntents confirmed with Stripe's test payment methods (declines,
3-D Secure) and cancelled, the charges and refunds they make, their balance transactions, and events.
"""

from __future__ import annotations

import copy
from typing import Any

from sandboxes.stripe import wire
from sandboxes.stripe.objects import ObjectStore
from sandboxes.stripe.shapes import new_object
from sandboxes.stripe.state import AUTHENTICATION_REQUIRED, DECLINES, SUCCEEDS, TEST_METHODS, _Ctx, _now
from sandboxes.stripe.wire import StripeError, invalid, missing

# Stripe's standard fee for a domestic card in the US: 2.9% + 30¢ (https://stripe.com/pricing), applied here to
# every currency's minor units alike.
CARD_FEE_PER_MILLE = 29
CARD_FEE_FIXED = 30
# A PaymentIntent may be cancelled only from these (https://docs.stripe.com/api/payment_intents/cancel).
CANCELLABLE = ("requires_payment_method", "requires_capture", "requires_confirmation", "requires_action", "processing")
CANCELLATION_REASONS = ("duplicate", "fraudulent", "requested_by_customer", "abandoned")


def card_fee(amount: int) -> int:
    """Stripe's fee on a card charge of ``amount`` minor units, rounded half up."""
    return (amount * CARD_FEE_PER_MILLE + 500) // 1000 + CARD_FEE_FIXED


def _brand(method: str) -> str:
    """The card brand a test PaymentMethod names (``pm_card_amex`` -> amex); the declining ones are Visa cards."""
    name = method.removeprefix("pm_card_").split("_")[0]
    return name if name in ("mastercard", "amex", "discover", "diners", "jcb", "unionpay") else "visa"


class PaymentHandlers(ObjectStore):
    """Customers, PaymentIntents, refunds and events, mixed into ``StripeSandbox``."""

    def _customer_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        customer = self._base("cus_", "customer", params)
        customer.update(email=wire.string(params, "email", max_len=512), name=wire.string(params, "name", max_len=256))
        customer.update(description=wire.string(params, "description"), phone=wire.string(params, "phone", max_len=20))
        customer["invoice_prefix"] = customer["id"][4:12].upper()
        return copy.deepcopy(self._store(ctx, customer))

    def _customer_get(self, ctx: _Ctx, params: dict[str, Any], customer: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "customer", customer))

    def _pi_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payment_intents/create; ``confirm=true`` confirms in the same call."""
        currency = wire.currency(params)
        pi = self._base("pi_", "payment_intent", params, amount=wire.charge_amount(params, currency), currency=currency)
        customer = wire.string(params, "customer", max_len=255)
        if customer is not None:
            self._lookup(ctx, "customer", customer, "customer")
        pi.update(
            customer=customer,
            client_secret=f"{pi['id']}_secret_{wire.new_id('', 24)}",
            description=wire.string(params, "description"),
            receipt_email=wire.string(params, "receipt_email", max_len=512),
        )
        self._attach_method(pi, params)
        confirm = wire.boolean(params, "confirm")
        if wire.boolean(params, "off_session") and not confirm:
            raise invalid("off_session can only be used when confirm=true.", param="off_session")
        if confirm and pi["payment_method"] is None:
            raise invalid("confirm=true needs a payment_method.", param="payment_method", code="parameter_missing")
        self._store(ctx, pi)
        if confirm:
            self._confirm(ctx, pi, params)
        return copy.deepcopy(pi)

    def _pi_get(self, ctx: _Ctx, params: dict[str, Any], pi_id: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "payment_intent", pi_id))

    def _pi_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payment_intents/list, filtered by ``customer``."""
        customer = wire.string(params, "customer", max_len=255)
        return self._page(
            ctx, "payment_intent", params, "/v1/payment_intents", lambda pi: customer in (None, pi["customer"])
        )

    def _pi_confirm(self, ctx: _Ctx, params: dict[str, Any], pi_id: str) -> dict[str, Any]:
        pi = self._lookup(ctx, "payment_intent", pi_id)
        if pi["status"] not in ("requires_payment_method", "requires_confirmation", "requires_action"):
            raise invalid(
                f"This PaymentIntent's status is {pi['status']}; it cannot be confirmed.",
                code="payment_intent_unexpected_state",
            )
        self._attach_method(pi, params)
        self._confirm(ctx, pi, params)
        return copy.deepcopy(pi)

    def _pi_cancel(self, ctx: _Ctx, params: dict[str, Any], pi_id: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payment_intents/cancel: only from ``CANCELLABLE``; emits
        payment_intent.canceled."""
        pi = self._lookup(ctx, "payment_intent", pi_id)
        reason = wire.string(params, "cancellation_reason", max_len=40)
        if reason is not None and reason not in CANCELLATION_REASONS:
            raise invalid(
                f"Invalid cancellation_reason: must be one of {', '.join(CANCELLATION_REASONS)}",
                param="cancellation_reason",
            )
        if pi["status"] not in CANCELLABLE:
            raise invalid(
                f"You cannot cancel this PaymentIntent because it has a status of {pi['status']}. Only a "
                f"PaymentIntent with one of the following statuses may be canceled: {', '.join(CANCELLABLE)}.",
                code="payment_intent_unexpected_state",
            )
        pi.update(status="canceled", canceled_at=_now(), cancellation_reason=reason, next_action=None)
        self._emit(ctx, "payment_intent.canceled", pi, account=self._scope[pi["id"]] or None)
        return copy.deepcopy(pi)

    def _attach_method(self, pi: dict[str, Any], params: dict[str, Any]) -> None:
        method = wire.string(params, "payment_method", max_len=255)
        if method is None:
            return
        if method not in TEST_METHODS and method not in self._card_methods:
            raise missing("PaymentMethod", method, "payment_method")
        pi.update(payment_method=method, status="requires_confirmation")

    def _method_behaviour(self, method: str) -> str:
        """What charging ``method`` does: a test PaymentMethod's behaviour, or that of the card number typed on the
        hosted Checkout page that made it."""
        typed = self._card_methods.get(method)
        return typed[0] if typed is not None else TEST_METHODS[method]

    def _confirm(self, ctx: _Ctx, pi: dict[str, Any], params: dict[str, Any]) -> None:
        """The outcome the test PaymentMethod stands for (https://docs.stripe.com/testing)."""
        method = pi["payment_method"]
        if method is None:
            raise invalid(
                "You cannot confirm this PaymentIntent because it's missing a payment method.",
                param="payment_method",
                code="payment_intent_unexpected_state",
            )
        pi["last_payment_error"] = None
        behaviour = self._method_behaviour(method)
        if behaviour == SUCCEEDS:
            self._succeed(ctx, pi)
        elif behaviour in DECLINES:
            self._decline(ctx, pi, *DECLINES[behaviour])
        elif behaviour == AUTHENTICATION_REQUIRED and wire.boolean(params, "off_session"):
            # Off-session there is nobody to authenticate: Stripe declines (https://docs.stripe.com/declines/codes).
            message = "Your card was declined. This transaction requires authentication."
            self._decline(ctx, pi, "authentication_required", "authentication_required", message)
        else:
            return_url = wire.string(params, "return_url", max_len=2048)
            url = f"{ctx.host_url}_sandbox/stripe/authenticate/{pi['id']}"
            redirect = {"url": url, "return_url": return_url}
            pi.update(status="requires_action", next_action={"type": "redirect_to_url", "redirect_to_url": redirect})
            self._emit(ctx, "payment_intent.requires_action", pi)

    def _method_brand(self, method: str) -> str:
        typed = self._card_methods.get(method)
        return typed[1] if typed is not None else _brand(method)

    def _charge(self, ctx: _Ctx, pi: dict[str, Any], status: str, failure: tuple[str, str] | None = None) -> None:
        paid = status == "succeeded"
        charge = new_object(
            "charge",
            id=wire.new_id("ch_"),
            created=_now(),
            amount=pi["amount"],
            amount_captured=pi["amount"] if paid else 0,
            captured=paid,
            currency=pi["currency"],
            customer=pi["customer"],
            description=pi["description"],
            failure_code=failure[0] if failure else None,
            failure_message=failure[1] if failure else None,
            outcome={
                "network_status": "approved_by_network" if paid else "declined_by_network",
                "reason": None if paid else failure and failure[0],
                "risk_level": "normal",
                "seller_message": "Payment complete." if paid else "The bank did not return any further details.",
                "type": "authorized" if paid else "issuer_declined",
            },
            paid=paid,
            payment_intent=pi["id"],
            payment_method=pi["payment_method"],
            payment_method_details={"card": {"brand": self._method_brand(pi["payment_method"])}, "type": "card"},
            receipt_email=pi["receipt_email"],
            status=status,
        )
        scope = self._scope[pi["id"]]
        if paid:
            fee = card_fee(pi["amount"])
            charge["balance_transaction"] = self._balance_transaction(
                scope, "charge", pi["amount"], pi["currency"], charge["id"], fee=fee, description=pi["description"]
            )
        self._store(ctx, charge, scope)
        pi["latest_charge"] = charge["id"]

    def _succeed(self, ctx: _Ctx, pi: dict[str, Any]) -> None:
        self._charge(ctx, pi, "succeeded")
        pi.update(status="succeeded", amount_received=pi["amount"], next_action=None, last_payment_error=None)
        self._emit(ctx, "payment_intent.succeeded", pi, account=self._scope[pi["id"]] or None)

    def _fail(self, ctx: _Ctx, pi: dict[str, Any], error: dict[str, Any]) -> None:
        pi.update(status="requires_payment_method", last_payment_error=error, next_action=None)
        self._emit(ctx, "payment_intent.payment_failed", pi, account=self._scope[pi["id"]] or None)

    def _decline(self, ctx: _Ctx, pi: dict[str, Any], code: str, decline_code: str, message: str) -> None:
        """A card error: the PI keeps the error in ``last_payment_error`` and the call answers 402 with it and
        the PI (https://docs.stripe.com/api/errors)."""
        self._charge(ctx, pi, "failed", (code, message))
        method = {"id": pi["payment_method"], "object": "payment_method", "type": "card"}
        error = StripeError(402, "card_error", message, code=code, decline_code=decline_code)
        error.error.update(charge=pi["latest_charge"], payment_method=method)
        self._fail(ctx, pi, copy.deepcopy(error.error))
        error.error["payment_intent"] = copy.deepcopy(pi)
        raise error

    def _refund_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/refunds/create: ``amount`` defaults to what remains refundable."""
        pi_id = wire.string(params, "payment_intent", required=True, max_len=255) or ""
        pi = self._lookup(ctx, "payment_intent", pi_id, "payment_intent")
        if pi["status"] != "succeeded":
            raise invalid(
                f"This PaymentIntent ({pi_id}) does not have a successful charge to refund.",
                param="payment_intent",
                code="charge_not_refundable",
            )
        charge = self._objects[pi["latest_charge"]]
        remaining = charge["amount"] - charge["amount_refunded"]
        if remaining <= 0:
            raise invalid(f"Charge {charge['id']} has already been refunded.", code="charge_already_refunded")
        amount = wire.amount(params, required=False) or remaining
        if amount > remaining:
            raise invalid(
                f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})",
                param="amount",
                code="amount_too_large",
            )
        reason = wire.string(params, "reason", max_len=40)
        if reason is not None and reason not in ("duplicate", "fraudulent", "requested_by_customer"):
            raise invalid("Invalid reason: must be one of duplicate, fraudulent, requested_by_customer", param="reason")
        refund = self._base("re_", "refund", params, amount=amount, currency=pi["currency"], charge=charge["id"])
        refund.update(payment_intent=pi_id, status="succeeded", reason=reason)
        refund["balance_transaction"] = self._balance_transaction(
            self._scope[pi_id], "refund", -amount, pi["currency"], refund["id"], description="REFUND FOR CHARGE"
        )
        self._store(ctx, refund)
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] == charge["amount"]
        self._emit(ctx, "refund.created", refund)
        self._emit(ctx, "charge.refunded", charge)
        return copy.deepcopy(refund)

    def _refund_get(self, ctx: _Ctx, params: dict[str, Any], refund: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "refund", refund))

    def _refund_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/refunds/list, filtered by ``charge`` or ``payment_intent``."""
        charge = wire.string(params, "charge", max_len=255)
        pi = wire.string(params, "payment_intent", max_len=255)
        return self._page(
            ctx,
            "refund",
            params,
            "/v1/refunds",
            lambda r: charge in (None, r["charge"]) and pi in (None, r["payment_intent"]),
        )

    def _event_get(self, ctx: _Ctx, params: dict[str, Any], event_id: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "event", event_id))

    def _event_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/events/list, filtered by ``type`` (``*`` as a wildcard suffix, as in
        ``payment_intent.*``) or ``types`` (a list of exact types)."""
        type_ = wire.string(params, "type", max_len=100)
        types = params.get("types")
        if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
            raise invalid("Invalid array: types", param="types")
        if type_ is not None and types is not None:
            raise invalid("You may only specify one of these parameters: type, types.", param="types")

        def keep(event: dict[str, Any]) -> bool:
            if types is not None:
                return bool(event["type"] in types)
            if type_ is None:
                return True
            if type_.endswith("*"):
                return bool(event["type"].startswith(type_[:-1]))
            return bool(event["type"] == type_)

        return self._page(ctx, "event", params, "/v1/events", keep)
