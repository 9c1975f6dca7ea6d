"""Entra ID's client-credentials token endpoint as the Azure sandbox answers it: HMAC-signed bearer tokens, the
error bodies Entra ID gives, and the check ARM routes make on a token."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable

from werkzeug.wrappers import Request, Response

from sandboxes.azure.state import Call
from sandboxes.azure.wire import arm_error
from sandboxes.faults import Fault, FaultKind
from sandboxes.server import json_response

TOKEN_LIFETIME_S = 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenHandlers:
    """The token endpoint and the bearer check, mixed into ``AzureSandbox``."""

    _token_key: bytes
    _transport_fault: Callable[[Call], Fault | None]
    client_accepted: Callable[[str], bool]

    def _token(self, request: Request, tenant: str) -> Response:
        form = request.form
        client_id = form.get("client_id", "")
        fault = self._transport_fault(Call("OAuth2_Token"))
        if fault is not None and fault.kind is FaultKind.THROTTLE:
            return self._aad_error("temporarily_unavailable", 90055, "Too many requests. Retry later.", 429)
        if form.get("grant_type") != "client_credentials":
            return self._aad_error("unsupported_grant_type", 70003, "The app requested an unsupported grant type.", 400)
        if not form.get("scope"):
            return self._aad_error("invalid_request", 90014, "The required field 'scope' is missing.", 400)
        if not self.client_accepted(client_id):
            return self._aad_error(
                "unauthorized_client",
                700016,
                f"Application with identifier '{client_id}' was not found in the directory '{tenant}'. This can "
                "happen if the application has not been installed by the administrator of the tenant or consented "
                "to by any user in the tenant.",
                400,
            )
        if not form.get("client_secret") or (fault is not None and fault.kind is FaultKind.CREDENTIALS):
            return self._aad_error(
                "invalid_client",
                7000215,
                "Invalid client secret provided. Ensure the secret being sent in the request is the client secret "
                f"value, not the client secret ID, for a secret added to app '{client_id}'.",
                401,
            )
        expires = int(time.time()) + TOKEN_LIFETIME_S
        payload = _b64(json.dumps({"tid": tenant, "cid": client_id, "exp": expires}).encode())
        signature = _b64(hmac.new(self._token_key, payload.encode(), hashlib.sha256).digest())
        return json_response(
            {
                "token_type": "Bearer",
                "expires_in": TOKEN_LIFETIME_S,
                "ext_expires_in": TOKEN_LIFETIME_S,
                "access_token": f"sbx1.{payload}.{signature}",
            }
        )

    @staticmethod
    def _aad_error(error: str, code: int, description: str, status: int) -> Response:
        trace, correlation = str(uuid.uuid4()), str(uuid.uuid4())
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        return json_response(
            {
                "error": error,
                "error_description": f"AADSTS{code}: {description}\r\nTrace ID: {trace}\r\nCorrelation ID: "
                f"{correlation}\r\nTimestamp: {stamp}",
                "error_codes": [code],
                "timestamp": stamp,
                "trace_id": trace,
                "correlation_id": correlation,
                "error_uri": f"https://login.microsoftonline.com/error?code={code}",
            },
            status=status,
        )

    def _token_problem(self, request: Request) -> Response | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return arm_error(
                "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.", 401
            )
        parts = header[len("Bearer ") :].split(".")
        if len(parts) != 3 or parts[0] != "sbx1":
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        expected = _b64(hmac.new(self._token_key, parts[1].encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[2]):
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        try:
            claims = json.loads(_unb64(parts[1]))
            expires = int(claims["exp"])
        except (ValueError, KeyError, TypeError):
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        if expires < time.time():
            return arm_error("ExpiredAuthenticationToken", "The access token expiry UTC time is earlier than now.", 401)
        return None
