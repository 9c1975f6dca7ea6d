"""The refusals an order's life can raise, each with the machine-readable ``code`` the API answers with. At the
bottom of the orders package so that every module above may raise or catch them without importing the others."""

from __future__ import annotations


class OrderError(Exception):
    """Base for refusals a buyer should see; ``code`` is machine-readable."""

    code = "order_error"


class OfferNotFound(OrderError):
    code = "offer_not_found"


class OfferNotOrderable(OrderError):
    code = "offer_not_orderable"


class QuoteNotFound(OrderError):
    code = "quote_not_found"


class QuoteExpired(OrderError):
    code = "quote_expired"


class QuoteUsed(OrderError):
    code = "quote_used"


class IdempotencyConflict(OrderError):
    code = "idempotency_conflict"


class BidRefused(OrderError):
    """A bid below the machine's minimum, or on an offer that takes no bid."""

    code = "bid_below_minimum"


class TransitionRefused(OrderError):
    """The order is not in a state that allows the move (someone else moved it first, or it is final)."""

    code = "invalid_state"


class ActionUnsupported(OrderError):
    """The order's provider cannot do this to a machine (stop it keeping its disk, start it, reboot it)."""

    code = "action_unsupported"
