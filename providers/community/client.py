"""Signed HTTP calls from the broker to one machine's host agent; the only place agent HTTP is spoken.

Errors become the broker's classes: unreachable or 5xx -> ``TransientProviderError``; 401 ->
``CredentialsRejected``; 409 ``no_capacity`` -> ``CapacityUnavailable``; 404 and other 4xx ->
``ProviderRequestRejected``; a body that is not the protocol's JSON -> ``MalformedProviderResponse``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from providers.community import protocol
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    TransientProviderError,
)

PROVIDER = "community"


class AgentClient:
    def __init__(self, url: str, key_id: str, secret: str, *, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.key_id = key_id
        self.secret = secret
        self.timeout = timeout

    def call(self, method: str, target: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """One signed request; ``target`` is the path and query. Returns the JSON answer."""
        if not self.url:
            raise TransientProviderError("the machine's agent has not registered yet", provider=PROVIDER)
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **protocol.sign(self.key_id, self.secret, method, target, body)}
        request = urllib.request.Request(  # noqa: S310 - the agent URL the machine registered
            self.url + target, data=body if payload is not None else None, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _error(exc.code, exc.read()) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise TransientProviderError(f"agent at {self.url} unreachable: {exc}", provider=PROVIDER) from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise MalformedProviderResponse(
                "the agent answered something that is not JSON", provider=PROVIDER
            ) from None
        if not isinstance(data, dict):
            raise MalformedProviderResponse("the agent answered JSON that is not an object", provider=PROVIDER)
        return data


def _error(status: int, raw: bytes) -> ProviderError:
    try:
        body = json.loads(raw)
        code, message = str(body.get("code", "")), str(body.get("message", ""))
    except (ValueError, AttributeError):
        code, message = "", raw[:200].decode("utf-8", "replace")
    if status == 401:
        return CredentialsRejected(message or "the agent refused the signature", code=code, provider=PROVIDER)
    if status == 409 and code == "no_capacity":
        return CapacityUnavailable(message, code=code, provider=PROVIDER, http_status=status)
    if status >= 500 or status == 429:
        return TransientProviderError(message, code=code, provider=PROVIDER, http_status=status)
    return ProviderRequestRejected(message or f"HTTP {status}", code=code, provider=PROVIDER, http_status=status)
