"""A hostile HTTP peer for tests: it reads one request, then answers a byte at a time until released."""

from __future__ import annotations

import socket
import threading

TRICKLE_EVERY_S = 0.05  # the pace of the trickle, well inside any per-read timeout


class Trickler:
    """A receiver on 127.0.0.1 that reads one request, sends ``head`` at once, then ``tail`` a byte at a time
    until it has sent it all, the sender hangs up, or the test releases it (``stop``). ``finished`` says it
    sent it all; ``got_request`` that a request arrived."""

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail
        self.released = threading.Event()
        self.got_request = threading.Event()
        self.hung_up = threading.Event()
        self.finished = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return  # stopped before anyone connected
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            self.got_request.set()
            try:
                conn.sendall(self.head)
                for byte in self.tail:
                    if self.released.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    self.released.wait(TRICKLE_EVERY_S)
            except OSError:
                self.hung_up.set()
                return
            self.finished = True

    def url(self, path: str = "/hooks") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.released.set()
        self.listener.close()
        self.thread.join(timeout=10)
