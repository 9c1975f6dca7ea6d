"""Errors the client raises. API errors carry the broker's one error shape:
``{"error": {"code", "message", "fields"?}}``."""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """The broker answered with an error (or could not be reached). ``status`` is the HTTP status (0 when no
    answer came), ``code`` the broker's error code, ``fields`` the per-field problems of an invalid request."""

    def __init__(self, status: int, code: str, message: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or {}

    def describe(self) -> str:
        """One line for a person: status, code, message, and the field errors if any."""
        text = f"{self.code} ({self.status}): {self.message}" if self.status else f"{self.code}: {self.message}"
        for name, problems in self.fields.items():
            text += f"\n  {name}: {_flatten(problems)}"
        return text


def _flatten(problems: Any) -> str:
    if isinstance(problems, list):
        return "; ".join(_flatten(p) for p in problems)
    if isinstance(problems, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in problems.items())
    return str(problems)


class InvalidRequest(BrokerError):
    """400: the request's fields (see ``fields``) or query were refused."""


class AuthenticationFailed(BrokerError):
    """401: no token, or a malformed, unknown or revoked one (``code`` says which: token_missing, token_malformed,
    token_unknown, token_revoked)."""


class PaymentRequired(BrokerError):
    """402: the organisation's budget would be exceeded."""


class PermissionDenied(BrokerError):
    """403: the token lacks the scope, or the user may not do this."""


class NotFound(BrokerError):
    """404: no such order, offer or quote (or it belongs to someone else)."""


class Conflict(BrokerError):
    """409: the offer is not orderable, the quote was used, the Idempotency-Key was used with another body."""


class Gone(BrokerError):
    """410: the quote expired."""


class RateLimited(BrokerError):
    """429 after the client's retries ran out."""


class ServerError(BrokerError):
    """5xx after the client's retries ran out."""


class Unreachable(BrokerError):
    """No answer: the connection failed or timed out on every try (status 0)."""


class WatchTimeout(BrokerError):
    """``watch`` gave up before the order reached a state it waited for (status 0)."""


_BY_STATUS: dict[int, type[BrokerError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    402: PaymentRequired,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: RateLimited,
}


def error_for(status: int, body: Any, text: str = "") -> BrokerError:
    """The ``BrokerError`` subclass for an error answer, from its JSON body when it has the broker's shape."""
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else BrokerError)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        fields = error.get("fields")
        return cls(status, error["code"], str(error.get("message", "")), fields if isinstance(fields, dict) else None)
    snippet = " ".join(text.split())[:200] or "no error body"
    return cls(status, f"http_{status}", snippet)
