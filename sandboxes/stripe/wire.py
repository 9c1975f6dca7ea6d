"""Stripe's wire format for the Stripe sandbox: form bodies with bracket nesting, error answers, checks, signatures.

Requests are ``application/x-www-form-urlencoded`` with nesting written as ``metadata[k]=v`` and lists as
``expand[0]=x`` (what stripe-python sends) or ``expand[]=x``. Errors are ``{"error": {"type", "code", "message",
...}}`` with the HTTP status Stripe uses for the type (https://docs.stripe.com/api/errors).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from typing import Any
from urllib.parse import parse_qsl

from sandboxes.stripe import currencies

MAX_BODY_BYTES = 64 * 1024
MAX_FIELDS = 500
MAX_DEPTH = 5
MAX_AMOUNT = 99_999_999  # Stripe's largest charge in USD minor units ($999,999.99)
MAX_METADATA_KEYS = 50  # "up to 50 keys" (https://docs.stripe.com/api/metadata)
MAX_METADATA_KEY = 40
MAX_METADATA_VALUE = 500
_KEY = re.compile(r"^([A-Za-z0-9_.\-]+)((?:\[[^\[\]]*\])*)$")
_CURRENCY = re.compile(r"^[a-z]{3}$")
MAX_LIMIT = 100  # a list page holds 1 to 100 objects, 10 unless asked (https://docs.stripe.com/api/pagination)
DEFAULT_LIMIT = 10
MAX_EXPAND = 20
_TIMESTAMP_BOUNDS = ("gt", "gte", "lt", "lte")
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class StripeError(Exception):
    """One Stripe error answer: the HTTP status and the ``error`` object's fields."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        decline_code: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.error: dict[str, Any] = {"type": type_, "message": message}
        for key, value in (("code", code), ("param", param), ("decline_code", decline_code)):
            if value is not None:
                self.error[key] = value
        if code is not None:
            self.error["doc_url"] = f"https://docs.stripe.com/error-codes/{code.replace('_', '-')}"
        self.error.update(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.error}


def invalid(message: str, *, param: str | None = None, code: str | None = None, status: int = 400) -> StripeError:
    return StripeError(status, "invalid_request_error", message, code=code, param=param)


def missing(kind: str, ident: str, param: str = "id") -> StripeError:
    return invalid(f"No such {kind}: '{ident}'", param=param, code="resource_missing", status=404)


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def parse_form(body: bytes) -> dict[str, Any]:
    """Decode a form body into nested dicts and lists; refuses oversize, too many fields and deep nesting."""
    if len(body) > MAX_BODY_BYTES:
        raise invalid(f"The request body exceeds {MAX_BODY_BYTES} bytes.")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FIELDS, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise invalid("The request body is not a valid form encoding.") from None
    root: dict[str, Any] = {}
    for key, value in pairs:
        match = _KEY.match(key)
        if match is None:
            raise invalid(f"Invalid parameter name: {key[:80]}", param=key[:80], code="parameter_unknown")
        parts = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        if len(parts) > MAX_DEPTH:
            raise invalid(f"Parameter {match.group(1)} is nested too deeply.", param=match.group(1))
        node = root
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            # A list element is "[]" or "[<digits>]"; keep them as dict keys in order and turn them into lists below.
            name = str(len(node)) if part == "" else part
            if last:
                node[name] = value
            else:
                child = node.setdefault(name, {})
                if not isinstance(child, dict):
                    raise invalid(f"Parameter {parts[0]} mixes a value and a hash.", param=parts[0])
                node = child
    return _lists(root)


def _lists(node: dict[str, Any]) -> dict[str, Any]:
    for key, value in node.items():
        if isinstance(value, dict):
            value = _lists(value)
            node[key] = (
                [value[k] for k in sorted(value, key=int)] if value and all(k.isdigit() for k in value) else value
            )
    return node


# ------------------------------------------------------------------------------------ field checks


def string(params: dict[str, Any], name: str, *, required: bool = False, max_len: int = 5000) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise invalid(f"Missing required param: {name}.", param=name, code="parameter_missing")
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise invalid(f"Invalid string: {name}", param=name, code="parameter_invalid_string")
    return value


def boolean(params: dict[str, Any], name: str) -> bool:
    value = params.get(name)
    if value is None or value == "":
        return False
    if value not in ("true", "false"):
        raise invalid(f"Invalid boolean: {value!r}", param=name)
    return bool(value == "true")


def amount(params: dict[str, Any], name: str = "amount", *, required: bool = True) -> int | None:
    """A positive integer of minor units up to ``MAX_AMOUNT``, checked as text before conversion."""
    value = string(params, name, required=required, max_len=12)
    if value is None:
        return None
    if not value.isdigit():
        raise invalid(f"Invalid integer: {value}", param=name, code="parameter_invalid_integer")
    number = int(value)
    if number < 1:
        raise invalid("Amount must be at least 1 minor unit.", param=name, code="amount_too_small")
    if number > MAX_AMOUNT:
        raise invalid(f"Amount must be no more than {MAX_AMOUNT}.", param=name, code="amount_too_large")
    return number


def currency(params: dict[str, Any]) -> str:
    """A currency Stripe supports (https://docs.stripe.com/currencies), lower-cased."""
    value = string(params, "currency", required=True, max_len=3) or ""
    if not _CURRENCY.match(value.lower()) or value.lower() not in currencies.SUPPORTED:
        raise invalid(
            f"Invalid currency: {value.lower()}. Stripe currently supports these currencies: "
            + ", ".join(sorted(currencies.SUPPORTED)),
            param="currency",
        )
    return value.lower()


def charge_amount(params: dict[str, Any], currency_code: str) -> int:
    """The ``amount`` of a charge: at least Stripe's minimum for the currency
    (https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts), a multiple of 10 in a three-decimal
    currency (https://docs.stripe.com/currencies#three-decimal)."""
    number = amount(params) or 0
    floor = currencies.MINIMUM_CHARGE.get(currency_code, 1)
    if number < floor:
        raise invalid(
            f"Amount must be at least {currencies.display(floor, currency_code)}",
            param="amount",
            code="amount_too_small",
        )
    if currency_code in currencies.THREE_DECIMAL and number % 10:
        raise invalid(
            f"Amounts in {currency_code} must be rounded to the nearest ten (the last digit must be 0).",
            param="amount",
            code="invalid_amount",
        )
    return number


def known_params(params: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse a parameter the endpoint does not take, as Stripe does: 400 ``parameter_unknown`` naming it
    (https://docs.stripe.com/error-codes/parameter-unknown). A misspelt parameter is an error, never ignored."""
    for name in params:
        if name not in allowed:
            raise invalid(f"Received unknown parameter: {name[:80]}", param=name[:80], code="parameter_unknown")


def expand_paths(params: dict[str, Any]) -> list[str]:
    """The ``expand`` list (https://docs.stripe.com/api/expanding_objects): dotted paths, at most four levels."""
    value = params.get("expand")
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_EXPAND or not all(isinstance(v, str) for v in value):
        raise invalid("Invalid array: expand must be a list of strings.", param="expand")
    for path in value:
        if not path or len(path) > 200 or path.count(".") > 3:
            raise invalid(f"This property cannot be expanded ({path[:200]}).", param="expand")
    return list(value)


def timestamp_filter(params: dict[str, Any], name: str) -> tuple[int | None, int | None]:
    """A list's ``created`` (or other time) filter, an exact time or a hash of ``gt``/``gte``/``lt``/``lte``
    (https://docs.stripe.com/api/payment_intents/list), as the inclusive range ``(lowest, highest)``."""
    value = params.get(name)
    if value is None or value == "":
        return None, None
    if isinstance(value, str):
        value = {"gte": value, "lte": value}
    if not isinstance(value, dict):
        raise invalid(f"Invalid {name}: an integer or a hash of gt, gte, lt, lte.", param=name)
    low: int | None = None
    high: int | None = None
    for bound, text in value.items():
        if bound not in _TIMESTAMP_BOUNDS:
            raise invalid(
                f"Received unknown parameter: {name}[{bound[:20]}]",
                param=f"{name}[{bound[:20]}]",
                code="parameter_unknown",
            )
        if not isinstance(text, str) or not text.isdigit() or len(text) > 12:
            raise invalid(
                f"Invalid integer: {str(text)[:20]}", param=f"{name}[{bound}]", code="parameter_invalid_integer"
            )
        number = int(text) + (1 if bound == "gt" else -1 if bound == "lt" else 0)
        if bound in ("gt", "gte"):
            low = number if low is None else max(low, number)
        else:
            high = number if high is None else min(high, number)
    return low, high


def page_limit(params: dict[str, Any]) -> int:
    """``limit``: 1 to 100, 10 when not given (https://docs.stripe.com/api/pagination)."""
    text = string(params, "limit", max_len=6)
    if text is None:
        return DEFAULT_LIMIT
    if not text.isdigit():
        raise invalid(f"Invalid integer: {text}", param="limit", code="parameter_invalid_integer")
    number = int(text)
    if not 1 <= number <= MAX_LIMIT:
        raise invalid(f"This value must be between 1 and {MAX_LIMIT} (inclusive).", param="limit")
    return number


def metadata(params: dict[str, Any]) -> dict[str, str]:
    value = params.get("metadata")
    if value is None or value == "":
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS:
        raise invalid(f"Invalid metadata: a hash of at most {MAX_METADATA_KEYS} keys.", param="metadata")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > MAX_METADATA_KEY or len(item) > MAX_METADATA_VALUE:
            raise invalid(f"Invalid metadata entry {key[:40]!r}.", param=f"metadata[{key[:40]}]")
    return dict(value)


# ---------------------------------------------------------------------------------------- webhooks


def sign(payload: str, secret: str, timestamp: int | None = None) -> str:
    """The ``Stripe-Signature`` header: ``t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<payload>" with the secret>``
    (https://docs.stripe.com/webhooks#verify-manually)."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"
