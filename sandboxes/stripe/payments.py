"""The Stripe sandbox's payments: customers, PaymentIntents confirmed with Stripe's test payment methods (declines,
3-D Secure), refunds and events.
"""

from __future__ import annotations

import copy
from typing import Any

from sandboxes.stripe import wire
from sandboxes.stripe.objects import ObjectStore
from sandboxes.stripe.state import DECLINES, SUCCEEDS, TEST_METHODS, _Ctx, _now
from sandboxes.stripe.wire import StripeError, invalid, missing


class PaymentHandlers(ObjectStore):
    """Customers, PaymentIntents, refunds and events, mixed into ``StripeSandbox``."""

    def _customer_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        customer = self._base("cus_", "customer", params)
        customer.update(email=wire.string(params, "email", max_len=512), name=wire.string(params, "name", max_len=256))
        customer.update(description=wire.string(params, "description"), balance=0, currency=None, delinquent=False)
        return copy.deepcopy(self._store(ctx, customer))

    def _customer_get(self, ctx: _Ctx, params: dict[str, Any], customer: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "customer", customer))

    def _pi_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payment_intents/create; ``confirm=true`` confirms in the same call."""
        pi = self._base("pi_", "payment_intent", params)
        pi.update(amount=wire.amount(params), currency=wire.currency(params))
        customer = wire.string(params, "customer", max_len=255)
        if customer is not None:
            self._lookup(ctx, "customer", customer, "customer")
        pi.update(
            customer=customer,
            payment_method=None,
            status="requires_payment_method",
            amount_received=0,
            amount_capturable=0,
            capture_method="automatic",
            confirmation_method="automatic",
            client_secret=f"{pi['id']}_secret_{wire.new_id('', 24)}",
            description=wire.string(params, "description"),
            latest_charge=None,
            last_payment_error=None,
            next_action=None,
            payment_method_types=["card"],
            canceled_at=None,
            cancellation_reason=None,
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

    @staticmethod
    def _attach_method(pi: dict[str, Any], params: dict[str, Any]) -> None:
        method = wire.string(params, "payment_method", max_len=255)
        if method is None:
            return
        if method not in TEST_METHODS:
            raise missing("PaymentMethod", method, "payment_method")
        pi.update(payment_method=method, status="requires_confirmation")

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
        if method in SUCCEEDS:
            self._succeed(ctx, pi)
        elif method in DECLINES:
            decline_code, message = DECLINES[method]
            self._decline(ctx, pi, "card_declined", decline_code, message)
        elif wire.boolean(params, "off_session"):
            # Off-session there is nobody to authenticate: Stripe declines (https://docs.stripe.com/declines/codes).
            message = "Your card was declined. This transaction requires authentication."
            self._decline(ctx, pi, "authentication_required", "authentication_required", message)
        else:
            return_url = wire.string(params, "return_url", max_len=2048)
            url = f"{ctx.host_url}_sandbox/stripe/authenticate/{pi['id']}"
            redirect = {"url": url, "return_url": return_url}
            pi.update(status="requires_action", next_action={"type": "redirect_to_url", "redirect_to_url": redirect})
            self._emit(ctx, "payment_intent.requires_action", pi)

    def _charge(self, ctx: _Ctx, pi: dict[str, Any], status: str) -> dict[str, Any]:
        charge: dict[str, Any] = {"id": wire.new_id("ch_"), "object": "charge", "created": _now(), "livemode": False}
        charge.update(amount=pi["amount"], currency=pi["currency"], customer=pi["customer"], payment_intent=pi["id"])
        paid = status == "succeeded"
        charge.update(status=status, paid=paid, captured=paid, amount_captured=pi["amount"] if paid else 0)
        charge.update(amount_refunded=0, refunded=False, payment_method=pi["payment_method"], metadata={})
        charge["balance_transaction"] = wire.new_id("txn_") if paid else None
        self._store(ctx, charge)
        self._scope[charge["id"]] = self._scope[pi["id"]]
        pi["latest_charge"] = charge["id"]
        return charge

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
        charge = self._charge(ctx, pi, "failed")
        method = {"id": pi["payment_method"], "object": "payment_method", "type": "card"}
        error = StripeError(402, "card_error", message, code=code, decline_code=decline_code)
        error.error.update(charge=charge["id"], payment_method=method)
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
        refund = self._base("re_", "refund", params)
        refund.update(amount=amount, currency=pi["currency"], charge=charge["id"], payment_intent=pi_id)
        refund.update(status="succeeded", reason=None, balance_transaction=wire.new_id("txn_"))
        self._store(ctx, refund)
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] == charge["amount"]
        self._emit(ctx, "refund.created", refund)
        self._emit(ctx, "charge.refunded", charge)
        return copy.deepcopy(refund)

    def _event_get(self, ctx: _Ctx, params: dict[str, Any], event_id: str) -> dict[str, Any]:
        event = self._objects.get(event_id)
        if event is None or event["object"] != "event":
            raise missing("event", event_id)
        return copy.deepcopy(event)
