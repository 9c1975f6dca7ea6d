"""One HTTP POST of a webhook: to the checked address, within a total deadline, never following a redirect.

A slow receiver must not hold a worker: per-read timeouts alone do not bound a send (a receiver that trickles a
byte every few seconds never trips one), so every send also has a total deadline
(``settings.WEBHOOK_SEND_DEADLINE_S``) for connecting, sending and reading the status, headers and at most
``EXCERPT_BYTES`` of the answer. When it passes, a watchdog shuts the send's socket down, which wakes any read
blocked on it; the attempt is then a timeout, retried on the usual schedule. A status already read stands
(the receiver took the event); only its excerpt is cut short.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from marketplace.webhooks.destinations import Destination

TIMEOUT_S = 5.0  # per step: the connect, and each wait for the next bytes (the total is the deadline's)
# At most this much of an answer's body is read (kept for the delivery log). Python's http.client bounds the
# status line and headers itself (at most 100 header lines of 64 KiB: http.client._MAXHEADERS, _MAXLINE).
EXCERPT_BYTES = 500
USER_AGENT = "GPU-Broker-Webhooks/1"
CA_BUNDLE: str | bool = True  # requests' own CA bundle; tests point it at their own certificate authority


@dataclass(frozen=True)
class SendResult:
    """What one try got: the status code, or the error when no answer came."""

    status_code: int | None
    error: str = ""
    excerpt: str = ""
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class _Watchdog:
    """Shuts down every socket of one send once its deadline passes (a socket watched later, at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shutdown(sock)

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    # shutdown(), unlike close(), wakes a recv() blocked on the socket in another thread (it sees end of stream).
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class _Watched:
    """Hands each new TCP socket to the send's watchdog. For HTTPS it is watched before the TLS handshake, so a
    handshake that trickles is cut off too."""

    def __init__(self, *args: Any, watchdog: _Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]  # a mixin: the connection class comes after it
        self._watchdog.watch(sock)
        return sock


class _WatchedHTTPConnection(_Watched, HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    pass


class _WatchedAdapter(HTTPAdapter):
    """No retries; every connection's socket is handed to the send's watchdog. With ``host``, connects to the
    checked address while TLS (SNI and the certificate check) uses the URL's host name."""

    def __init__(self, watchdog: _Watchdog, host: str | None = None) -> None:
        self._watchdog = watchdog
        self._host = host
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        if self._host is not None:
            kwargs["server_hostname"] = self._host
            kwargs["assert_hostname"] = self._host
        super().init_poolmanager(*args, **kwargs)

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> HTTPConnectionPool:
        pool = super().get_connection_with_tls_context(*args, **kwargs)
        # A session lives for one send, so its pools are new and have made no connection yet.
        pool.ConnectionCls = (
            _WatchedHTTPSConnection if isinstance(pool, HTTPSConnectionPool) else _WatchedHTTPConnection
        )
        pool.conn_kw["watchdog"] = self._watchdog
        return pool


def http_post(destination: Destination, body: bytes, headers: dict[str, str]) -> SendResult:
    """POST ``body`` to ``destination``; never raises for a network failure (it is the result's ``error``).

    Returns within about ``settings.WEBHOOK_SEND_DEADLINE_S`` whatever the receiver does."""
    deadline_s = float(settings.WEBHOOK_SEND_DEADLINE_S)
    step_s = min(TIMEOUT_S, deadline_s)
    watchdog = _Watchdog(deadline_s)
    session = requests.Session()
    # No proxy from the environment: the address that was checked must be the one connected to.
    session.trust_env = False
    session.mount("http://", _WatchedAdapter(watchdog))
    session.mount("https://", _WatchedAdapter(watchdog, destination.host))
    all_headers = {
        **headers,
        "Host": destination.netloc,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        # The excerpt is counted in bytes on the wire: a compressed answer could expand without bound.
        "Accept-Encoding": "identity",
    }
    started = time.monotonic()
    watchdog.start()
    try:
        with session.post(
            destination.pinned_url,
            data=body,
            headers=all_headers,
            timeout=(step_s, step_s),
            allow_redirects=False,
            stream=True,
            verify=CA_BUNDLE,
        ) as response:
            return SendResult(
                status_code=response.status_code,
                excerpt=_excerpt(response).decode("utf-8", "replace")[:EXCERPT_BYTES],
                duration_ms=_ms(started),
            )
    except requests.RequestException as exc:
        expired = watchdog.expired
        error = f"timeout: no complete answer within the {deadline_s:g} s deadline" if expired else _why(exc, step_s)
    finally:
        watchdog.cancel()
        session.close()
    return SendResult(status_code=None, error=error[:500], duration_ms=_ms(started))


def _excerpt(response: requests.Response) -> bytes:
    """Up to ``EXCERPT_BYTES`` of the body, or what came of it before an error or the deadline."""
    excerpt = b""
    try:
        while len(excerpt) < EXCERPT_BYTES:
            chunk = response.raw.read1(EXCERPT_BYTES - len(excerpt), decode_content=False)
            if not chunk:
                break
            excerpt += chunk
    except Exception:  # noqa: S110 - the body is only kept for the log; never fail the attempt on it
        pass
    return excerpt


def _why(exc: requests.RequestException, step_s: float) -> str:
    if isinstance(exc, requests.Timeout):
        return f"timeout: no answer within {step_s:g} s"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS error: {exc}"
    if isinstance(exc, requests.ConnectionError):
        return f"connection failed: {exc}"
    return f"request failed: {exc}"


def _ms(started: float) -> int:
    return max(0, round((time.monotonic() - started) * 1000))
