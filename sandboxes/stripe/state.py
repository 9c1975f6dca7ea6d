"""The Stripe sandbox's fixed world: its default keys, the API version events carry, Stripe's test payment methods
and payout failure codes, and the records of calls and of the request being answered that its handlers share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SECRET_KEY = "sk_test_sandbox"  # noqa: S105 (a test-mode key)
# The endpoint secret events are signed with until a test sets another (the broker's default STRIPE_WEBHOOK_SECRET).
DEFAULT_WEBHOOK_SECRET = "whsec_sandbox"  # noqa: S105
API_VERSION = "2026-10-28.endive"  # what events carry when the request named no Stripe-Version
DELIVERY_TIMEOUT = 5.0
COURIER_RETRY_S = 5.0  # how soon ``auto`` delivery tries an event the endpoint did not take again
MAX_PENDING_EVENTS = 10_000
# Stripe's test PaymentMethods (https://docs.stripe.com/testing#declined-payments): decline code and message.
DECLINES = {
    "pm_card_chargeDeclined": ("generic_decline", "Your card was declined."),
    "pm_card_chargeDeclinedInsufficientFunds": ("insufficient_funds", "Your card has insufficient funds."),
}
SUCCEEDS = frozenset({"pm_card_visa", "pm_card_mastercard", "pm_card_amex"})
THREE_D_SECURE = "pm_card_authenticationRequired"
TEST_METHODS = SUCCEEDS | set(DECLINES) | {THREE_D_SECURE}
# What an unverified Express account still owes (https://docs.stripe.com/api/accounts/object#account_object-requirements).
ONBOARDING_DUE = ["business_type", "external_account", "tos_acceptance.date", "tos_acceptance.ip"]
# Payout failure codes (https://docs.stripe.com/api/payouts/failures) and the message each carries.
PAYOUT_FAILURES = {
    "account_closed": "The bank account has been closed.",
    "account_frozen": "The bank account has been frozen.",
    "bank_account_restricted": "The bank account has restrictions on either the type or number of payouts allowed.",
    "could_not_process": "The bank could not process this payout.",
    "insufficient_funds": "Your Stripe account has insufficient funds to cover the payout.",
    "invalid_account_number": "The routing number seems correct, but the account number is invalid.",
    "no_account": "The bank account details on file are probably incorrect.",
}


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received (before auth and faults), for tests asserting what was asked."""

    action: str
    account: str | None
    idempotency_key: str | None


@dataclass(slots=True)
class _Ctx:
    operation: str
    account: str | None
    idempotency_key: str | None
    request_id: str | None
    host_url: str
    api_version: str
    events: list[str] = field(default_factory=list)


Handler = Callable[[_Ctx, dict[str, Any], str], dict[str, Any]]


def _now() -> int:
    return int(time.time())
