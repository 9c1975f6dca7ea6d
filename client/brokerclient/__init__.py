"""A client of the GPU broker's REST procurement API, and an independent verifier of its ledger receipts::

    from brokerclient import BrokerClient

    with BrokerClient("https://broker.example", token="brk_...") as broker:
        offer = next(broker.offers("gpu=H100 count>=8", sort="gpuprice"))
        order = broker.order(offer=offer["id"], max_price_per_hour="40")
        for seen in broker.watch(order["id"], until=["running"]):
            print(seen["state"])

The ``broker`` command (``brokerclient.cli``) does the same from a shell; see README.md.
"""

from brokerclient.api import ORDER_STATES, TERMINAL_STATES, ApiResponse, BrokerClient
from brokerclient.errors import (
    AuthenticationFailed,
    BrokerError,
    Conflict,
    Gone,
    InvalidRequest,
    NotFound,
    PaymentRequired,
    PermissionDenied,
    RateLimited,
    ServerError,
    Unreachable,
    WatchTimeout,
)
from brokerclient.verify import Check, ReceiptInvalid, ReceiptPending, VerificationResult, verify_receipt

__version__ = "0.1.0"

__all__ = [
    "ORDER_STATES",
    "TERMINAL_STATES",
    "ApiResponse",
    "AuthenticationFailed",
    "BrokerClient",
    "BrokerError",
    "Check",
    "Conflict",
    "Gone",
    "InvalidRequest",
    "NotFound",
    "PaymentRequired",
    "PermissionDenied",
    "RateLimited",
    "ReceiptInvalid",
    "ReceiptPending",
    "ServerError",
    "Unreachable",
    "VerificationResult",
    "WatchTimeout",
    "verify_receipt",
]
