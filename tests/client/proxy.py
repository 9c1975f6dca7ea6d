"""A tiny HTTP proxy on 127.0.0.1 for the client's retry tests: real sockets, one request per connection.

It forwards each request to the upstream server and relays the answer, except that it can *drop* the answer to
chosen requests (read it from upstream, so the server did the work, then close the client's connection without
a byte) or *refuse* chosen requests itself with a status and headers, without forwarding them. Everything it
saw is in ``log``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

Rule = Callable[[str, str], bool]  # (method, path) -> whether this request is the one


@dataclass
class Seen:
    method: str
    path: str
    idempotency_key: str | None
    status: int | None  # upstream's status, or the proxy's own for a refused request
    replayed: bool
    dropped: bool = False
    refused: bool = False


@dataclass
class _Plan:
    rule: Rule
    times: int
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


def _read_until_headers_end(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


def _closing(answer: bytes) -> bytes:
    """``answer`` saying ``Connection: close``: this proxy closes after one answer, and a client that thought
    the connection would stay open could send its next request into the closed socket."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


class Proxy:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.log: list[Seen] = []
        self._drops: list[_Plan] = []
        self._refusals: list[_Plan] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def drop(self, rule: Rule, times: int = 1) -> None:
        """Forward the next ``times`` matching requests but never send their answers back."""
        self._drops.append(_Plan(rule, times))

    def refuse(self, rule: Rule, status: int, headers: dict[str, str] | None = None, times: int = 1) -> None:
        """Answer the next ``times`` matching requests with ``status`` without forwarding them."""
        self._refusals.append(_Plan(rule, times, status, headers or {}))

    def close(self) -> None:
        self._server.close()

    def _take(self, plans: list[_Plan], method: str, path: str) -> _Plan | None:
        with self._lock:
            for plan in plans:
                if plan.times > 0 and plan.rule(method, path):
                    plan.times -= 1
                    return plan
        return None

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = _read_until_headers_end(conn)
            head, _, body = data.partition(b"\r\n\r\n")
            request_line, fields = _headers(head)
            if not request_line:
                return
            length = int(fields.get("content-length", "0"))
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            method, target, _ = request_line.split(" ", 2)
            path = target.split("?", 1)[0]
            key = fields.get("idempotency-key")
            refusal = self._take(self._refusals, method, path)
            if refusal is not None:
                extra = "".join(f"{k}: {v}\r\n" for k, v in refusal.headers.items())
                reply = (
                    f"HTTP/1.1 {refusal.status} Refused\r\n{extra}Content-Type: application/json\r\n"
                    f"Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
                )
                self.log.append(Seen(method, path, key, refusal.status, False, refused=True))
                conn.sendall(reply.encode())
                return
            # One request per connection both ways, so the answer ends where the upstream closes.
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            forwarded = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
            with socket.create_connection(self.upstream, timeout=30) as up:
                up.sendall(forwarded)
                answer = b""
                while chunk := up.recv(65536):
                    answer += chunk
            status_line, answer_fields = _headers(answer.partition(b"\r\n\r\n")[0])
            status = int(status_line.split(" ")[1]) if status_line else None
            replayed = answer_fields.get("idempotent-replayed") == "true"
            if self._take(self._drops, method, path) is not None:
                self.log.append(Seen(method, path, key, status, replayed, dropped=True))
                conn.shutdown(socket.SHUT_RDWR)
                return
            self.log.append(Seen(method, path, key, status, replayed))  # before the client can see the answer
            conn.sendall(_closing(answer))
