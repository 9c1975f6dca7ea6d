"""Every object the Stripe sandbox answers with, as data: each field its API reference page lists as always
returned (nullable fields included, as null), with the value a new object starts from.

A handler builds an object with ``new_object(kind, ...)``, which refuses a field the shape does not name, so an
object can neither miss a field Stripe always sends nor carry one it never does. Fields Stripe returns only when
asked (``expand``/"includable" ones such as ``Charge.refunds``) are left out.
"""

from __future__ import annotations

import copy
from typing import Any

_ADDRESS = {"city": None, "country": None, "line1": None, "line2": None, "postal_code": None, "state": None}
_REQUIREMENTS: dict[str, Any] = {
    "alternatives": [],
    "current_deadline": None,
    "currently_due": [],
    "disabled_reason": None,
    "errors": [],
    "eventually_due": [],
    "past_due": [],
    "pending_verification": [],
}


def _list(url: str) -> dict[str, Any]:
    return {"object": "list", "data": [], "has_more": False, "total_count": 0, "url": url}


# kind -> (its reference page, field -> starting value). A starting value of a list object's url names "{id}".
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "customer": (
        "https://docs.stripe.com/api/customers/object",
        {
            "id": None,
            "object": "customer",
            "address": None,
            "balance": 0,
            "created": 0,
            "currency": None,
            "default_source": None,
            "delinquent": False,
            "description": None,
            "discount": None,
            "email": None,
            "invoice_prefix": None,
            "invoice_settings": {
                "custom_fields": None,
                "default_payment_method": None,
                "footer": None,
                "rendering_options": None,
            },
            "livemode": False,
            "metadata": {},
            "name": None,
            "next_invoice_sequence": 1,
            "phone": None,
            "preferred_locales": [],
            "shipping": None,
            "tax_exempt": "none",
            "test_clock": None,
        },
    ),
    "payment_intent": (
        "https://docs.stripe.com/api/payment_intents/object",
        {
            "id": None,
            "object": "payment_intent",
            "amount": 0,
            "amount_capturable": 0,
            "amount_details": {"tip": {}},
            "amount_received": 0,
            "application": None,
            "application_fee_amount": None,
            "automatic_payment_methods": None,
            "canceled_at": None,
            "cancellation_reason": None,
            "capture_method": "automatic",
            "client_secret": None,
            "confirmation_method": "automatic",
            "created": 0,
            "currency": None,
            "customer": None,
            "description": None,
            "last_payment_error": None,
            "latest_charge": None,
            "livemode": False,
            "metadata": {},
            "next_action": None,
            "on_behalf_of": None,
            "payment_method": None,
            "payment_method_configuration_details": None,
            "payment_method_options": {"card": {"request_three_d_secure": "automatic"}},
            "payment_method_types": ["card"],
            "processing": None,
            "receipt_email": None,
            "review": None,
            "setup_future_usage": None,
            "shipping": None,
            "statement_descriptor": None,
            "statement_descriptor_suffix": None,
            "status": "requires_payment_method",
            "transfer_data": None,
            "transfer_group": None,
        },
    ),
    "charge": (
        "https://docs.stripe.com/api/charges/object",
        {
            "id": None,
            "object": "charge",
            "amount": 0,
            "amount_captured": 0,
            "amount_refunded": 0,
            "application": None,
            "application_fee": None,
            "application_fee_amount": None,
            "balance_transaction": None,
            "billing_details": {"address": _ADDRESS, "email": None, "name": None, "phone": None, "tax_id": None},
            "calculated_statement_descriptor": None,
            "captured": False,
            "created": 0,
            "currency": None,
            "customer": None,
            "description": None,
            "disputed": False,
            "failure_balance_transaction": None,
            "failure_code": None,
            "failure_message": None,
            "fraud_details": {},
            "livemode": False,
            "metadata": {},
            "on_behalf_of": None,
            "outcome": None,
            "paid": False,
            "payment_intent": None,
            "payment_method": None,
            "payment_method_details": None,
            "receipt_email": None,
            "receipt_number": None,
            "receipt_url": None,
            "refunded": False,
            "review": None,
            "shipping": None,
            "source_transfer": None,
            "statement_descriptor": None,
            "statement_descriptor_suffix": None,
            "status": "pending",
            "transfer_data": None,
            "transfer_group": None,
        },
    ),
    "refund": (
        "https://docs.stripe.com/api/refunds/object",
        {
            "id": None,
            "object": "refund",
            "amount": 0,
            "balance_transaction": None,
            "charge": None,
            "created": 0,
            "currency": None,
            "destination_details": {"card": {"type": "refund"}, "type": "card"},
            "metadata": {},
            "payment_intent": None,
            "reason": None,
            "receipt_number": None,
            "source_transfer_reversal": None,
            "status": "pending",
            "transfer_reversal": None,
        },
    ),
    "account": (
        "https://docs.stripe.com/api/accounts/object",
        {
            "id": None,
            "object": "account",
            "business_profile": {
                "mcc": None,
                "name": None,
                "product_description": None,
                "support_address": None,
                "support_email": None,
                "support_phone": None,
                "support_url": None,
                "url": None,
            },
            "business_type": None,
            "capabilities": {},
            "charges_enabled": False,
            "controller": {"type": "application", "is_controller": True},
            "country": None,
            "created": 0,
            "default_currency": "usd",
            "details_submitted": False,
            "email": None,
            "external_accounts": _list("/v1/accounts/{id}/external_accounts"),
            "future_requirements": _REQUIREMENTS,
            "metadata": {},
            "payouts_enabled": False,
            "requirements": _REQUIREMENTS,
            "settings": {
                "payouts": {
                    "debit_negative_balances": True,
                    "schedule": {"delay_days": 2, "interval": "daily"},
                    "statement_descriptor": None,
                },
            },
            "tos_acceptance": {"date": None, "ip": None, "user_agent": None},
            "type": "express",
        },
    ),
    "account_link": (
        "https://docs.stripe.com/api/account_links/object",
        {"object": "account_link", "created": 0, "expires_at": 0, "url": None},
    ),
    "transfer": (
        "https://docs.stripe.com/api/transfers/object",
        {
            "id": None,
            "object": "transfer",
            "amount": 0,
            "amount_reversed": 0,
            "balance_transaction": None,
            "created": 0,
            "currency": None,
            "description": None,
            "destination": None,
            "destination_payment": None,
            "livemode": False,
            "metadata": {},
            "reversals": _list("/v1/transfers/{id}/reversals"),
            "reversed": False,
            "source_transaction": None,
            "source_type": "card",
            "transfer_group": None,
        },
    ),
    "payout": (
        "https://docs.stripe.com/api/payouts/object",
        {
            "id": None,
            "object": "payout",
            "amount": 0,
            "application_fee": None,
            "application_fee_amount": None,
            "arrival_date": 0,
            "automatic": False,
            "balance_transaction": None,
            "created": 0,
            "currency": None,
            "description": None,
            "destination": None,
            "failure_balance_transaction": None,
            "failure_code": None,
            "failure_message": None,
            "livemode": False,
            "metadata": {},
            "method": "standard",
            "original_payout": None,
            # Manual payouts are not reconciled against balance transactions (https://docs.stripe.com/api/payouts/object).
            "reconciliation_status": "not_applicable",
            "reversed_by": None,
            "source_type": "card",
            "statement_descriptor": None,
            "status": "pending",
            "trace_id": None,
            "type": "bank_account",
        },
    ),
    "balance_transaction": (
        "https://docs.stripe.com/api/balance_transactions/object",
        {
            "id": None,
            "object": "balance_transaction",
            "amount": 0,
            "available_on": 0,
            "balance_type": "payments",
            "created": 0,
            "currency": None,
            "description": None,
            "exchange_rate": None,
            "fee": 0,
            "fee_details": [],
            "net": 0,
            "reporting_category": None,
            "source": None,
            "status": "available",
            "type": None,
        },
    ),
    "event": (
        "https://docs.stripe.com/api/events/object",
        {
            "id": None,
            "object": "event",
            "api_version": None,
            "created": 0,
            "data": None,
            "livemode": False,
            "pending_webhooks": 0,
            "request": {"id": None, "idempotency_key": None},
            "type": None,
        },
    ),
}
# Fields Stripe adds only in some cases: an event's ``account`` names the connected account it happened on
# (https://docs.stripe.com/connect/webhooks).
OPTIONAL = {"event": frozenset({"account"})}


def new_object(kind: str, **fields: Any) -> dict[str, Any]:
    """A ``kind`` object: the shape's starting values with ``fields`` over them; a field the shape does not list is
    a ``KeyError`` (a sandbox bug, never the caller's)."""
    _, defaults = SHAPES[kind]
    unknown = set(fields) - set(defaults) - OPTIONAL.get(kind, frozenset())
    if unknown:
        raise KeyError(f"{kind} has no field {sorted(unknown)}")
    obj = copy.deepcopy(defaults)
    obj.update(fields)
    for value in obj.values():
        if isinstance(value, dict) and value.get("object") == "list" and obj.get("id"):
            value["url"] = value["url"].replace("{id}", obj["id"])
    return obj
