"""What each Stripe sandbox endpoint accepts: its parameters (any other is refused as unknown, as Stripe refuses
it), the kind of object it answers, and the fields ``expand`` may reach from each kind.

Each endpoint lists the parameters the sandbox emulates, taken from the endpoint's page in the API reference (the
URL beside each); parameters Stripe documents but the sandbox does not emulate are refused too, so a test never
passes on a parameter the sandbox silently ignored.
"""

from __future__ import annotations

from sandboxes.stripe.wire import invalid

# Taken everywhere (https://docs.stripe.com/api/expanding_objects).
COMMON_PARAMS = frozenset({"expand"})
_PAGES = ("limit", "starting_after", "ending_before", "created")  # https://docs.stripe.com/api/pagination

# operation -> (the kind it answers, "list:<kind>" for a list; the parameters it takes)
ENDPOINTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # https://docs.stripe.com/api/customers/create
    "customers.create": ("customer", ("email", "name", "description", "phone", "metadata")),
    "customers.retrieve": ("customer", ()),
    # https://docs.stripe.com/api/payment_intents/list
    "payment_intents.list": ("list:payment_intent", ("customer", *_PAGES)),
    # https://docs.stripe.com/api/payment_intents/create
    "payment_intents.create": (
        "payment_intent",
        (
            "amount",
            "currency",
            "customer",
            "payment_method",
            "confirm",
            "off_session",
            "return_url",
            "description",
            "receipt_email",
            "metadata",
        ),
    ),
    "payment_intents.retrieve": ("payment_intent", ()),
    # https://docs.stripe.com/api/payment_intents/confirm
    "payment_intents.confirm": ("payment_intent", ("payment_method", "return_url", "off_session")),
    # https://docs.stripe.com/api/payment_intents/cancel
    "payment_intents.cancel": ("payment_intent", ("cancellation_reason",)),
    # https://docs.stripe.com/api/refunds/list
    "refunds.list": ("list:refund", ("charge", "payment_intent", *_PAGES)),
    # https://docs.stripe.com/api/refunds/create
    "refunds.create": ("refund", ("payment_intent", "amount", "reason", "metadata")),
    "refunds.retrieve": ("refund", ()),
    # https://docs.stripe.com/api/accounts/create
    "accounts.create": ("account", ("type", "country", "email", "capabilities", "metadata")),
    "accounts.retrieve": ("account", ()),
    # https://docs.stripe.com/api/account_links/create
    "account_links.create": ("account_link", ("account", "refresh_url", "return_url", "type")),
    # https://docs.stripe.com/api/transfers/list
    "transfers.list": ("list:transfer", ("destination", "transfer_group", *_PAGES)),
    # https://docs.stripe.com/api/transfers/create
    "transfers.create": (
        "transfer",
        ("amount", "currency", "destination", "description", "transfer_group", "metadata"),
    ),
    "transfers.retrieve": ("transfer", ()),
    # https://docs.stripe.com/api/balance/balance_retrieve
    "balance.retrieve": ("balance", ()),
    # https://docs.stripe.com/api/balance_transactions/list
    "balance_transactions.list": ("list:balance_transaction", ("type", "source", "currency", *_PAGES)),
    "balance_transactions.retrieve": ("balance_transaction", ()),
    # https://docs.stripe.com/api/payouts/list
    "payouts.list": ("list:payout", ("status", *_PAGES)),
    # https://docs.stripe.com/api/payouts/create
    "payouts.create": ("payout", ("amount", "currency", "description", "statement_descriptor", "metadata")),
    "payouts.retrieve": ("payout", ()),
    # https://docs.stripe.com/api/checkout/sessions/create
    "checkout.sessions.create": (
        "checkout.session",
        (
            "mode",
            "line_items",
            "customer",
            "success_url",
            "cancel_url",
            "client_reference_id",
            "expires_at",
            "payment_intent_data",
            "payment_method_types",
            "metadata",
        ),
    ),
    "checkout.sessions.retrieve": ("checkout.session", ()),
    # https://docs.stripe.com/api/checkout/sessions/list
    "checkout.sessions.list": ("list:checkout.session", ("customer", "payment_intent", "status", *_PAGES)),
    # https://docs.stripe.com/api/checkout/sessions/expire
    "checkout.sessions.expire": ("checkout.session", ()),
    # https://docs.stripe.com/api/events/list
    "events.list": ("list:event", ("type", "types", *_PAGES)),
    "events.retrieve": ("event", ()),
}

# The id fields each kind can expand into the object they name, and that object's kind (None: any), from the
# fields each reference page marks "Expandable" (https://docs.stripe.com/api/expanding_objects).
EXPANDABLE: dict[str, dict[str, str | None]] = {
    "payment_intent": {"customer": "customer", "latest_charge": "charge"},
    "charge": {
        "balance_transaction": "balance_transaction",
        "customer": "customer",
        "failure_balance_transaction": "balance_transaction",
        "payment_intent": "payment_intent",
        "source_transfer": "transfer",
    },
    "refund": {"balance_transaction": "balance_transaction", "charge": "charge", "payment_intent": "payment_intent"},
    "transfer": {
        "balance_transaction": "balance_transaction",
        "destination": "account",
        "destination_payment": "charge",
        "source_transaction": "charge",
    },
    "payout": {"balance_transaction": "balance_transaction", "failure_balance_transaction": "balance_transaction"},
    "balance_transaction": {"source": None},
    "checkout.session": {"customer": "customer", "payment_intent": "payment_intent"},
}


def allowed_params(operation: str) -> frozenset[str]:
    return frozenset(ENDPOINTS[operation][1]) | COMMON_PARAMS


def check_expand(operation: str, paths: list[str]) -> None:
    """Refuse, before anything is done, a path the endpoint's answer cannot expand, with Stripe's message
    ("This property cannot be expanded (x)."); a list's objects are reached through ``data.``."""
    answer = ENDPOINTS[operation][0]
    for path in paths:
        steps = path.split(".")
        kinds: set[str] = {answer}
        if answer.startswith("list:"):
            if steps[0] != "data" or len(steps) < 2:
                raise invalid(f"This property cannot be expanded ({path}).", param="expand")
            kinds, steps = {answer.removeprefix("list:")}, steps[1:]
        for step in steps:
            targets = [EXPANDABLE[k][step] for k in kinds if step in EXPANDABLE.get(k, {})]
            if not targets:
                raise invalid(f"This property cannot be expanded ({path}).", param="expand")
            kinds = set(EXPANDABLE) if None in targets else {t for t in targets if t is not None}
