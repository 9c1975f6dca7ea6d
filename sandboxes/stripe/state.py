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
# What a test card does when charged (https://docs.stripe.com/testing): it succeeds, asks for 3-D Secure, or is
# declined with an error code, a decline code and Stripe's message (https://docs.stripe.com/declines/codes).
SUCCEEDS = "succeeds"
AUTHENTICATION_REQUIRED = "authentication_required"
DECLINES: dict[str, tuple[str, str, str]] = {
    "generic_decline": ("card_declined", "generic_decline", "Your card was declined."),
    "insufficient_funds": ("card_declined", "insufficient_funds", "Your card has insufficient funds."),
    "lost_card": ("card_declined", "lost_card", "Your card was declined."),
    "stolen_card": ("card_declined", "stolen_card", "Your card was declined."),
    "expired_card": ("expired_card", "expired_card", "Your card has expired."),
    "incorrect_cvc": ("incorrect_cvc", "incorrect_cvc", "Your card's security code is incorrect."),
    "processing_error": (
        "processing_error",
        "processing_error",
        "An error occurred while processing your card. Try again in a little bit.",
    ),
    "incorrect_number": ("incorrect_number", "incorrect_number", "Your card number is incorrect."),
    "test_mode_live_card": (
        "card_declined",
        "test_mode_live_card",
        "Your card was declined. Your request was in test mode, but used a non test (live) card. "
        "For a list of valid test cards, visit: https://docs.stripe.com/testing.",
    ),
}
# Stripe's test PaymentMethods and what each does (https://docs.stripe.com/testing#cards,
# https://docs.stripe.com/testing#declined-payments, https://docs.stripe.com/testing#regulatory-cards).
TEST_METHODS: dict[str, str] = {
    **dict.fromkeys(
        (
            "pm_card_visa",
            "pm_card_visa_debit",
            "pm_card_mastercard",
            "pm_card_mastercard_debit",
            "pm_card_mastercard_prepaid",
            "pm_card_amex",
            "pm_card_discover",
            "pm_card_diners",
            "pm_card_jcb",
            "pm_card_unionpay",
        ),
        SUCCEEDS,
    ),
    "pm_card_authenticationRequired": AUTHENTICATION_REQUIRED,
    "pm_card_threeDSecure2Required": AUTHENTICATION_REQUIRED,
    "pm_card_chargeDeclined": "generic_decline",
    "pm_card_visa_chargeDeclined": "generic_decline",
    "pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
    "pm_card_visa_chargeDeclinedInsufficientFunds": "insufficient_funds",
    "pm_card_chargeDeclinedLostCard": "lost_card",
    "pm_card_visa_chargeDeclinedLostCard": "lost_card",
    "pm_card_chargeDeclinedStolenCard": "stolen_card",
    "pm_card_visa_chargeDeclinedStolenCard": "stolen_card",
    "pm_card_chargeDeclinedExpiredCard": "expired_card",
    "pm_card_visa_chargeDeclinedExpiredCard": "expired_card",
    "pm_card_chargeDeclinedIncorrectCvc": "incorrect_cvc",
    "pm_card_visa_chargeDeclinedIncorrectCvc": "incorrect_cvc",
    "pm_card_chargeDeclinedProcessingError": "processing_error",
    "pm_card_visa_chargeDeclinedProcessingError": "processing_error",
}
# Stripe's test card numbers, with the same behaviours (https://docs.stripe.com/testing#cards and the sections after).
TEST_CARDS: dict[str, str] = {
    "4242424242424242": SUCCEEDS,  # Visa
    "4000056655665556": SUCCEEDS,  # Visa (debit)
    "5555555555554444": SUCCEEDS,  # Mastercard
    "2223003122003222": SUCCEEDS,  # Mastercard (2-series)
    "5200828282828210": SUCCEEDS,  # Mastercard (debit)
    "5105105105105100": SUCCEEDS,  # Mastercard (prepaid)
    "378282246310005": SUCCEEDS,  # American Express
    "371449635398431": SUCCEEDS,  # American Express
    "6011111111111117": SUCCEEDS,  # Discover
    "3056930009020004": SUCCEEDS,  # Diners Club
    "3566002020360505": SUCCEEDS,  # JCB
    "6200000000000005": SUCCEEDS,  # UnionPay
    "4000002500003155": AUTHENTICATION_REQUIRED,  # 3-D Secure required unless set up for off-session use
    "4000002760003184": AUTHENTICATION_REQUIRED,  # 3-D Secure always required
    "4000000000003220": AUTHENTICATION_REQUIRED,  # 3-D Secure 2 required
    "4000000000003063": AUTHENTICATION_REQUIRED,  # 3-D Secure required
    "4000000000000002": "generic_decline",
    "4000000000009995": "insufficient_funds",
    "4000000000009987": "lost_card",
    "4000000000009979": "stolen_card",
    "4000000000000069": "expired_card",
    "4000000000000127": "incorrect_cvc",
    "4000000000000119": "processing_error",
    "4242424242424241": "incorrect_number",  # fails the Luhn check on purpose
}
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


def _luhn_ok(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char) * (2 if index % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def test_card_behaviour(number: str) -> str:
    """What charging the card ``number`` does in test mode, as https://docs.stripe.com/testing lists it.

    ``number`` may hold spaces or dashes between digits. The answer is ``SUCCEEDS`` ("succeeds"),
    ``AUTHENTICATION_REQUIRED`` ("authentication_required": a 3-D Secure challenge before the charge), or a key of
    ``DECLINES`` naming the decline, whose value is the error ``code``, ``decline_code`` and message Stripe answers:
    a listed decline card gives its own; a number that is not 12 to 19 digits or fails the Luhn check gives
    ``"incorrect_number"``; any other well-formed number gives ``"test_mode_live_card"``, because Stripe's test mode
    refuses real cards. Test PaymentMethods (``pm_card_visa``, ...) map to the same values in ``TEST_METHODS``.
    """
    digits = number.replace(" ", "").replace("-", "")
    if digits in TEST_CARDS:
        return TEST_CARDS[digits]
    if not (digits.isascii() and digits.isdigit() and 12 <= len(digits) <= 19) or not _luhn_ok(digits):
        return "incorrect_number"
    return "test_mode_live_card"


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
