"""Signed HTTP calls from the broker to one machine's host agent; the only place agent HTTP is spoken.

A seller chooses the agent's URL, so every call is held to the rules of ``providers.endpoints`` at the moment
it connects: the host is resolved once, every address it resolves to must be allowed
(``settings.PROVIDER_ENDPOINTS``), and the connection goes to one of those checked addresses, so a name
that answers differently the second time (DNS rebinding) cannot lead the broker into its own network.
Redirects are never followed. Each call has one total deadline (connect, send, every read of the answer):
a watchdog cuts the socket when it passes, so an agent that never answers, or trickles, costs at most that.

Errors become the broker's classes, worded by the broker (an agent's own text goes to the log, never to a
buyer): unreachable -> ``AgentUnreachable``, past the deadline -> ``AgentTimeout`` (both transient); an
address the rules refuse, a redirect, 404 and other 4xx -> ``ProviderRequestRejected``; 401 ->
``CredentialsRejected``; 409 ``no_capacity`` -> ``CapacityUnavailable``; 5xx and 429 ->
``TransientProviderError``; an answer that is not the protocol's bounded JSON object ->
``MalformedProviderResponse``.

A machine whose agent is outbound-only (behind NAT; registered without a URL) is called through
``OutboundAgentClient`` instead: the same signed request is queued for the agent's poll
(``commands.py``) and its answer awaited within the same deadline, read by the same rules; a command not
answered in time is expired (the agent will not run it) and raises ``AgentTimeout``, as a silent HTTP agent
does.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone

from providers.community import commands, protocol
from providers.endpoints import address_allowed
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
    TransientProviderError,
)
from untrusted import jsonbody

PROVIDER = "community"
DEFAULT_DEADLINE_S = 15.0
MAX_ANSWER_BYTES = jsonbody.MAX_JSON_BYTES
# What an agent's refusal of a stop, start or reboot means, in the broker's words: the agent's own text is
# untrusted and never shown to a buyer (issue 36).
ACTION_REFUSALS = {
    "not_running": "the lease is not running on its host (still starting, or ending)",
    "unsupported": "the host runs leases as processes, not containers: it cannot stop or restart one",
}
# The error codes the protocol defines; any other code an agent names is reported as ``agent_error``.
KNOWN_CODES = frozenset(
    {"no_capacity", "not_found", "invalid", "bad_signature", "stale", "replayed", "unknown_key", "expired"}
    | set(ACTION_REFUSALS)
)

log = logging.getLogger("providers.community.client")


class AgentUnreachable(TransientProviderError):
    """The agent's address could not be connected to (refused, reset, no route, a name that does not resolve)."""


class AgentTimeout(TransientProviderError):
    """The agent did not finish answering within the call's deadline."""


class _Refused(Exception):
    """The agent's address is one the broker may not connect to."""


class AgentClient:
    """Calls to one agent. ``deadline`` bounds each call from the first connect to the last byte read."""

    def __init__(self, url: str, key_id: str, secret: str, *, deadline: float = DEFAULT_DEADLINE_S):
        self.url = url.rstrip("/")
        self.key_id = key_id
        self.secret = secret
        self.deadline = deadline

    def call(self, method: str, target: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """One signed request; ``target`` is the path and query. Returns the answer's JSON object."""
        body = None if payload is None else json.dumps(payload).encode()
        status, raw = self._send(method, target, body)
        if 300 <= status < 400:
            raise ProviderRequestRejected(
                f"the machine's agent answered a redirect (HTTP {status}), which the broker does not follow",
                code="agent_redirect",
                provider=PROVIDER,
                http_status=status,
            )
        if status >= 400:
            raise self._error(status, raw)
        data = _parse(raw)
        if not isinstance(data, dict):
            raise MalformedProviderResponse(
                "the machine's agent answered JSON that is not an object", code="agent_malformed", provider=PROVIDER
            )
        return data

    def _send(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
        """The agent's (HTTP status, raw answer) to one signed request, or a ``ProviderError``."""
        if not self.url:
            raise AgentUnreachable("the machine's agent has not registered yet", code="agent_unregistered",
                                   provider=PROVIDER)  # fmt: skip
        headers = {
            "Content-Type": "application/json",
            **protocol.sign(self.key_id, self.secret, method, target, body or b""),
        }
        deadline = time.monotonic() + self.deadline
        try:
            status, raw = self._exchange(method, target, body, headers, deadline)
        except _Refused as exc:
            log.warning("agent %s refused: %s", self.key_id, exc)
            raise ProviderRequestRejected(
                "the machine's agent address is not one the broker connects to",
                code="agent_address_refused",
                provider=PROVIDER,
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            log.info("agent %s: %s %s failed: %r", self.key_id, method, target, exc)
            if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                raise AgentTimeout(
                    f"the machine's agent did not answer within {self.deadline:g} s",
                    code="agent_timeout",
                    provider=PROVIDER,
                ) from None
            if isinstance(exc, OSError):
                raise AgentUnreachable(
                    "the machine's agent could not be reached", code="agent_unreachable", provider=PROVIDER
                ) from None
            raise MalformedProviderResponse(
                "the machine's agent answered something that is not HTTP", code="agent_malformed", provider=PROVIDER
            ) from None
        return status, raw

    def _exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], deadline: float
    ) -> tuple[int, bytes]:
        """Connect to a checked address, send, and read at most ``MAX_ANSWER_BYTES + 1`` of the answer, all
        before ``deadline`` (``time.monotonic``). Raises ``_Refused``, ``OSError`` or ``HTTPException``."""
        try:
            parts = urlsplit(self.url)
            https = parts.scheme == "https"
            host, port = parts.hostname or "", parts.port or (443 if https else 80)
        except ValueError as exc:
            raise _Refused(f"the agent URL is malformed: {exc}") from None
        sock = _connect(host, port, deadline)
        live = [sock]  # the socket in use: TLS wraps it into a new one
        # The watchdog ends a call that is still reading at the deadline, however slowly the bytes come.
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, (live,))
        watchdog.daemon = True
        watchdog.start()
        connection: http.client.HTTPConnection | None = None
        try:
            if https:
                context = ssl.create_default_context()
                connection = http.client.HTTPSConnection(host, port, context=context)
                connection.sock = live[0] = context.wrap_socket(sock, server_hostname=host)
            else:
                connection = http.client.HTTPConnection(host, port)
                connection.sock = sock
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read(MAX_ANSWER_BYTES + 1)
            if time.monotonic() >= deadline:
                raise TimeoutError("the deadline passed while reading")
            return response.status, raw
        finally:
            watchdog.cancel()
            if connection is not None:
                connection.close()
            sock.close()

    def _error(self, status: int, raw: bytes) -> ProviderError:
        try:
            answer = _parse(raw)
            code, message = str(answer.get("code", ""))[:64], str(answer.get("message", ""))[:200]
        except (MalformedProviderResponse, AttributeError):
            code, message = "", ""
        log.info("agent %s answered HTTP %s: code=%r message=%r", self.key_id, status, code, message)
        code = code if code in KNOWN_CODES else "agent_error"
        if code == "expired":
            # The agent's clock put the command past its expiry: not run, as if never answered.
            return AgentTimeout("the machine's agent found the command expired", code=code, provider=PROVIDER)
        if status == 401:
            return CredentialsRejected(
                "the machine's agent refused the broker's signature", code=code, provider=PROVIDER, http_status=status
            )
        if status == 409 and code == "no_capacity":
            return CapacityUnavailable("the machine's GPUs are taken", code=code, provider=PROVIDER, http_status=status)
        if status >= 500 or status == 429:
            return TransientProviderError(
                f"the machine's agent failed (HTTP {status})", code=code, provider=PROVIDER, http_status=status
            )
        why = ACTION_REFUSALS.get(code, f"the machine's agent refused the request (HTTP {status})")
        return ProviderRequestRejected(why, code=code, provider=PROVIDER, http_status=status)


class OutboundAgentClient(AgentClient):
    """Calls to an outbound-only agent, through its machine's command queue (``commands.py``). Same contract
    as ``AgentClient``: one signed request, answered within ``deadline`` or ``AgentTimeout``. Call it outside
    a database transaction (as provisioning calls providers): the agent's poll must see the queued command."""

    # How often the waiting caller reads the command's row: quick at first, then at most this.
    FIRST_PAUSE_S = 0.02
    LONGEST_PAUSE_S = 0.25

    def __init__(self, key_id: str, secret: str, *, deadline: float = DEFAULT_DEADLINE_S):
        super().__init__("", key_id, secret, deadline=deadline)

    def _send(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
        deadline = time.monotonic() + self.deadline
        # The agent runs the command only before this: past it the broker has stopped waiting (below).
        expires_at = timezone.now() + dt.timedelta(seconds=self.deadline)
        command_id = commands.command_enqueue(
            key_id=self.key_id, secret=self.secret, method=method, target=target, body=body or b"",
            expires_at=expires_at,
        )  # fmt: skip
        if command_id is None:
            raise AgentUnreachable("the machine is not listed", code="agent_unregistered", provider=PROVIDER)
        pause = self.FIRST_PAUSE_S
        while True:
            answered = commands.command_answer_get(command_id=command_id)
            if answered is not None:
                return answered.status, json.dumps(answered.answer).encode()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Expired by a conditional update: an answer that landed just now wins, a later one is refused.
                if commands.command_expire(command_id=command_id):
                    log.info("agent %s: command %s %s not answered in time", self.key_id, method, target)
                    raise AgentTimeout(
                        f"the machine's agent did not answer within {self.deadline:g} s",
                        code="agent_timeout",
                        provider=PROVIDER,
                    )
                continue
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, self.LONGEST_PAUSE_S)


def _parse(raw: bytes) -> Any:
    if len(raw) > MAX_ANSWER_BYTES:
        raise MalformedProviderResponse(
            f"the machine's agent answered more than {MAX_ANSWER_BYTES} bytes",
            code="agent_malformed",
            provider=PROVIDER,
        )
    try:
        return jsonbody.bounded_json(raw, max_bytes=MAX_ANSWER_BYTES)
    except (ValueError, RecursionError):
        raise MalformedProviderResponse(
            "the machine's agent answered something that is not the protocol's JSON",
            code="agent_malformed",
            provider=PROVIDER,
        ) from None


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """A socket connected to one of ``host``'s addresses, every one of which the endpoint rules allow."""
    if not host:
        raise _Refused("the agent URL has no host")
    infos = _resolve(host, port, deadline)
    addresses = sorted({str(info[4][0]) for info in infos})
    refused = [a for a in addresses if not address_allowed(a)]
    if refused or not addresses:
        raise _Refused(f"{host} resolves to {', '.join(refused) or 'nothing'}")
    failure: OSError = OSError(f"no address of {host} answered")
    for family, kind, proto, _, address in infos:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the deadline passed while connecting")
        sock = socket.socket(family, kind, proto)
        sock.settimeout(remaining)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        # Judged again by the peer the kernel connected to, not by the name.
        if not address_allowed(str(sock.getpeername()[0])):
            sock.close()
            raise _Refused(f"{host} connected to a refused address")
        return sock
    raise failure


def _resolve(host: str, port: int, deadline: float) -> list[Any]:
    """``getaddrinfo`` within the deadline: the seller may run the name's DNS server, and the resolver's own
    timeouts are the system's. A lookup still running at the deadline is left to finish in its thread."""
    found: list[Any] = []
    failure: list[BaseException] = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:
            failure.append(exc)

    resolver = threading.Thread(target=lookup, name="agent-dns", daemon=True)
    resolver.start()
    resolver.join(max(0.0, deadline - time.monotonic()))
    if resolver.is_alive():
        raise TimeoutError(f"resolving {host[:64]} took past the deadline")
    if failure and isinstance(failure[0], UnicodeError):
        raise _Refused(f"the host name {host[:64]!r} cannot be encoded")
    if failure:
        raise failure[0]
    return found


def _cut(live: list[socket.socket]) -> None:
    """Shut the socket down under a blocked read or write, which then returns at once."""
    try:
        socket.socket.shutdown(live[0], socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: the call ended by itself
