"""Threading and HTTP plumbing shared by the provider sandboxes.

``SandboxApp`` is a WSGI app with the control API every sandbox answers on its own port:

- ``GET /_sandbox/health`` -> ``{"status": "ok", "sandbox": kind}``
- ``POST /_sandbox/reset`` -> forget all state (instances, faults, tokens, call log)
- ``GET /_sandbox/faults`` -> active faults; ``POST`` one fault (JSON object) or a list; ``DELETE`` clears all
- ``DELETE /_sandbox/faults/<id>`` -> remove one fault
- ``GET /_sandbox/boots`` -> what each instance did when it booted (``sandboxes/boot.py``)

A subclass answers the provider's own API in ``handle`` and may add control routes in ``control_extra``.
"""

from __future__ import annotations

import abc
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from sandboxes.boot import Booter, BootMode
from sandboxes.faults import FaultRegistry

logger = logging.getLogger("sandboxes")

CONTROL_PREFIX = "/_sandbox/"
WSGIEnviron = dict[str, Any]
StartResponse = Any


class QuietRequestHandler(WSGIRequestHandler):
    """No per-request line on stdout/stderr: werkzeug's access log goes to the ``sandboxes`` logger."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        logger.debug("%s %s %s", self.command, self.path, code)

    def log(self, type: str, message: str, *args: Any) -> None:
        logger.debug("%s: " + message, type, *args)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, sort_keys=True), status=status, mimetype="application/json")


CALL_LOG_SIZE = 10_000  # a standalone sandbox runs for days; keep the newest calls only


class ServerThread:
    """A threaded werkzeug server for one WSGI app on a daemon thread; HTTPS when given an SSL context."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, ssl_context: Any = None):
        self._server: BaseWSGIServer = make_server(
            host, port, app, threaded=True, request_handler=QuietRequestHandler, ssl_context=ssl_context
        )
        self._scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"sandbox:{port}", daemon=True)

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self._server.host}:{self._server.port}"

    def start(self) -> str:
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class SandboxApp(abc.ABC):
    """Base of every provider sandbox: the control API, and start/stop on a free local port."""

    kind: str = ""

    def __init__(self, faults: FaultRegistry):
        self.faults = faults
        # Instances boot by starting the lease agent their user data names; a subclass calls
        # ``self.booter.boot`` when an instance first runs, ``halt`` when it ends and ``reset`` in ``reset``.
        self.booter = Booter(faults)
        self._server: ServerThread | None = None
        self._call_log: deque[Any] = deque(maxlen=CALL_LOG_SIZE)
        self._call_lock = threading.Lock()

    # -- the call log (what tests assert was, or was not, requested)

    def record_call(self, call: Any) -> None:
        """Log one request; each sandbox defines its own call record, with at least an ``action``."""
        with self._call_lock:
            self._call_log.append(call)

    def calls(self, action: str | None = None) -> list[Any]:
        """Requests received since the last reset (the newest 10,000), oldest first, optionally one action."""
        with self._call_lock:
            return [c for c in self._call_log if action is None or c.action == action]

    def clear_calls(self) -> None:
        with self._call_lock:
            self._call_log.clear()

    # -- lifecycle

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 = a free port) in a daemon thread; returns the base URL."""
        if self._server is not None:
            raise RuntimeError(f"{self.kind} sandbox already running at {self._server.url}")
        self._server = ServerThread(self, host=host, port=port, ssl_context=self.ssl_context())
        return self._server.start()

    def ssl_context(self) -> Any:
        """An ``ssl.SSLContext`` to serve HTTPS with (a cloud whose SDK refuses plain http); None for http."""
        return None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{self.kind} sandbox is not running; call start()")
        return self._server.url

    def stop(self) -> None:
        if self._server is not None:
            self.faults.clear()
            self.booter.reset()
            self._server.stop()
            self._server = None

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every instance, fault, idempotency token and logged call."""

    # -- WSGI

    def __call__(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if path.startswith(CONTROL_PREFIX):
            response = self._control(Request(environ), path[len(CONTROL_PREFIX) :].strip("/"))
            return response(environ, start_response)
        return self.handle(environ, start_response)

    @abc.abstractmethod
    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        """Answer the provider's own API."""

    def control_extra(self, request: Request, route: str) -> Response | None:
        """Provider-specific control routes; None when ``route`` is not one of them."""
        return None

    def _control(self, request: Request, route: str) -> Response:
        try:
            if route == "health" and request.method == "GET":
                return json_response({"status": "ok", "sandbox": self.kind})
            if route == "reset" and request.method == "POST":
                self.reset()
                return json_response({"reset": True})
            if route == "faults":
                return self._faults_route(request)
            if route == "boots" and request.method == "GET":
                records = [vars(r) for r in self.booter.records]
                return json_response({"mode": self.booter.mode.value, "boots": records})
            if route.startswith("faults/") and request.method == "DELETE":
                removed = self.faults.remove(int(route.split("/", 1)[1]))
                return json_response({"removed": removed}, status=200 if removed else 404)
            extra = self.control_extra(request, route)
            if extra is not None:
                return extra
        except (ValueError, TypeError, KeyError) as exc:
            return json_response({"error": str(exc)}, status=400)
        return json_response({"error": f"no control route {request.method} /_sandbox/{route}"}, status=404)

    def _faults_route(self, request: Request) -> Response:
        if request.method == "GET":
            return json_response({"faults": [f.to_json() for f in self.faults.active()]})
        if request.method == "DELETE":
            return json_response({"cleared": self.faults.clear()})
        if request.method == "POST":
            body = request.get_json(force=True, silent=True)
            items: Sequence[Any] = body if isinstance(body, list) else [body]
            if not all(isinstance(item, dict) for item in items):
                raise ValueError("POST /_sandbox/faults takes a JSON object or a list of objects")
            created = [self.faults.inject_json(item) for item in items]
            return json_response({"faults": [f.to_json() for f in created]}, status=201)
        return json_response({"error": f"method {request.method} not allowed"}, status=405)


def serve_forever(
    apps: Sequence[tuple[SandboxApp, str, int]],
    on_started: Callable[[list[SandboxApp]], None] | None = None,
    boot: BootMode = BootMode.THREAD,
) -> None:
    """Start each (app, host, port), call ``on_started`` with them, and block until interrupted (Ctrl-C or
    SIGTERM), then stop them all. ``boot``: what the sandboxes' launched machines do (by default they phone
    home like real ones)."""
    stop = threading.Event()
    started: list[SandboxApp] = []
    try:
        for app, host, port in apps:
            app.booter.mode = boot
            url = app.start(host, port)
            started.append(app)
            print(f"{app.kind} sandbox listening on {url}", flush=True)
        if on_started is not None:
            on_started(started)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for app in started:
            app.stop()
