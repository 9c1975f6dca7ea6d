"""Reading a broker's public ledger endpoints over HTTP into an audit bundle (``bundle_from_api``): every request
bounded in time, size and depth, redirects kept to the same host, and nothing read trusted (``audit`` checks the
bundle as it checks an exported one). Standard library only."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import re
import socket
import threading
import time
import urllib.parse
from typing import Any

from ledger.audit.inputs import BUNDLE_FORMAT, MAX_INPUT_BYTES, _kind, _short
from untrusted.jsonbody import bounded_json  # standard library only, as this tool is

# Bounds on what the tool reads from a broker: each answer (a page of 10,000 leaf hashes is about 700 KB), how
# deep it nests (the API's answers nest four levels), all answers together, and time: one request, and the audit.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_ANSWER_DEPTH = 16
REQUEST_TIMEOUT_S = 30.0
DEADLINE_S = 600.0
_MAX_REDIRECTS = 3
_MAX_THROTTLED = 5  # answers of 429 waited out (within the deadline) before giving up
_CHECKPOINT_PAGE = 1000
_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)
_LEAF_PAGE = 10_000  # the API's most per page


class FetchError(Exception):
    """The broker's API could not be read: what failed, naming the URL. ``status`` is the HTTP status of an
    answer that was not 200, else None (the broker could not be reached, or its answer broke a bound)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Api:
    """GETs to one broker's API (``<base>/api/v1/``): each with a total deadline (a watchdog shuts the socket when
    it passes, so a peer that trickles bytes cannot stretch it), an answer at most ``max_answer_bytes`` and
    ``MAX_ANSWER_DEPTH`` deep, redirects followed only within the same scheme, host and port."""

    def __init__(self, url: str, *, request_timeout_s: float, deadline_s: float, max_answer_bytes: int) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(f"the broker URL {url!r} is not an http:// or https:// URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise FetchError(f"the broker URL {url!r} has a query, fragment or credentials: give its site root")
        path = parts.path.rstrip("/")
        if not path.endswith("/api/v1"):
            path += "/api/v1"
        self.origin = (parts.scheme, parts.netloc.lower())
        self.root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/", "", ""))
        self.request_timeout_s = request_timeout_s
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.max_answer_bytes = max_answer_bytes
        self.total_bytes = 0

    def get(self, path: str, **query: int) -> dict[str, Any]:
        """The JSON object at ``path`` (relative to the API root) with ``query``. Raises ``FetchError``."""
        url = self.root + path + ("?" + urllib.parse.urlencode(query) if query else "")
        redirects = throttled = 0
        while True:
            status, headers, body = self._get_once(url)
            if status in (301, 302, 303, 307, 308):
                target = urllib.parse.urljoin(url, headers.get("location") or "")
                moved = urllib.parse.urlsplit(target)
                if (moved.scheme, moved.netloc.lower()) != self.origin:
                    raise FetchError(f"{url} redirects to {_short(target, 80)}, another host: not followed", status)
                redirects += 1
                if redirects > _MAX_REDIRECTS:
                    raise FetchError(f"{url} redirects more than {_MAX_REDIRECTS} times", status)
                url = target
                continue
            if status == 429 and throttled < _MAX_THROTTLED:
                wait = headers.get("retry-after", "")
                seconds = float(wait) if _DIGITS.fullmatch(wait) else 1.0
                if time.monotonic() + seconds < self.deadline:
                    throttled += 1
                    time.sleep(seconds)  # the broker's rate limit: it says when to come back
                    continue
            if status != 200:
                raise FetchError(f"{url} answered HTTP {status}{_error_detail(body)}", status)
            try:
                value = bounded_json(body, max_bytes=self.max_answer_bytes, max_depth=MAX_ANSWER_DEPTH)
            except ValueError as exc:
                raise FetchError(f"{url}: the answer is not JSON within the tool's bounds: {exc}") from None
            if not isinstance(value, dict):
                raise FetchError(f"{url}: the answer is {_kind(value)}, not a JSON object")
            return value

    def _get_once(self, url: str) -> tuple[int, dict[str, str], bytes]:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"{url}: not asked, the audit's deadline of {self.deadline_s:g} s has passed")
        budget = min(self.request_timeout_s, remaining)
        parts = urllib.parse.urlsplit(url)
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = connection_class(parts.hostname or "", parts.port, timeout=budget)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(budget, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            target = urllib.parse.urlunsplit(("", "", parts.path, parts.query, ""))
            connection.request("GET", target, headers={"Accept": "application/json", "User-Agent": "ledger-audit/1"})
            response = connection.getresponse()
            length = response.getheader("Content-Length") or ""
            if _DIGITS.fullmatch(length) and int(length) > self.max_answer_bytes:
                raise FetchError(
                    f"{url}: the answer is {length} bytes, over the {self.max_answer_bytes} this tool reads"
                )
            chunks, size = [], 0
            while chunk := response.read1(64 * 1024):
                size += len(chunk)
                if size > self.max_answer_bytes:
                    raise FetchError(f"{url}: the answer is over the {self.max_answer_bytes} bytes this tool reads")
                chunks.append(chunk)
            if expired.is_set():  # the watchdog's shutdown reads as the end of the answer: a cut one
                raise TimeoutError
            self.total_bytes += size
            if self.total_bytes > MAX_INPUT_BYTES:
                raise FetchError(f"{url}: the broker's answers add up to over {MAX_INPUT_BYTES} bytes")
            headers = {name.lower(): value for name, value in response.getheaders()}
            return response.status, headers, b"".join(chunks)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                if budget < self.request_timeout_s:
                    raise FetchError(
                        f"{url}: no whole answer before the audit's deadline of {self.deadline_s:g} s"
                    ) from None
                raise FetchError(f"{url}: no whole answer within {budget:g} s") from None
            raise FetchError(f"cannot read {url}: {type(exc).__name__}: {exc}") from None
        finally:
            watchdog.cancel()
            connection.close()


def _error_detail(body: bytes) -> str:
    """The API's error message (``{"error": {"code", "message"}}``), shortened, for the line naming a failure."""
    try:
        error = bounded_json(body, max_bytes=64 * 1024, max_depth=MAX_ANSWER_DEPTH).get("error", {})
        return f": {_short(str(error.get('code')), 40)}: {_short(str(error.get('message')), 200)}"
    except (ValueError, AttributeError):
        return ""


def _size_of(row: Any) -> int | None:
    size = row.get("size") if isinstance(row, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def bundle_from_api(
    url: str,
    *,
    state: Any = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    deadline_s: float = DEADLINE_S,
    max_answer_bytes: int = MAX_ANSWER_BYTES,
) -> dict[str, Any]:
    """The audit bundle of the broker at ``url`` (its site root, or its ``/api/v1``), assembled from the public
    ledger endpoints alone: ``ledger/key`` (origin, key and key history), every page of ``ledger/checkpoints``
    (with their anchors), ``ledger/consistency`` between successive checkpoints and from the checkpoint ``state``
    remembers when the broker no longer lists it, and ``ledger/leaves`` up to the newest checkpoint. ``audit``
    checks it as it checks an exported one; nothing here is trusted.

    A proof the broker refuses (HTTP 400 or 404) is left out, for the audit to fail the check that needed it.
    Raises ``FetchError`` naming the URL when the broker cannot be read: unreachable, an answer not 200, over
    ``max_answer_bytes`` or too deep, a redirect to another host, ``request_timeout_s`` per request or
    ``deadline_s`` for all of them passed.
    """
    api = _Api(url, request_timeout_s=request_timeout_s, deadline_s=deadline_s, max_answer_bytes=max_answer_bytes)
    key = api.get("ledger/key")
    rows: list[Any] = []
    after = 0
    while True:
        page = api.get("ledger/checkpoints", after=after, limit=_CHECKPOINT_PAGE)
        if not isinstance(page.get("checkpoints"), list):
            raise FetchError(f"{api.root}ledger/checkpoints: the answer's checkpoints is not a list")
        rows.extend(page["checkpoints"])
        following = page.get("next_after")
        if following is None:
            break
        if not isinstance(following, int) or isinstance(following, bool) or following <= after:
            raise FetchError(f"{api.root}ledger/checkpoints: next_after {_short(repr(following))} does not advance")
        after = following
    sizes = [size for size in map(_size_of, rows) if size is not None]
    pairs = [(old, new) for old, new in itertools.pairwise(sizes) if old < new]
    remembered = _size_of(state)
    if remembered is not None and remembered not in sizes and sizes and remembered < sizes[-1]:
        pairs.append((remembered, min(size for size in sizes if size > remembered)))
    consistency = []
    for old, new in pairs:
        try:
            consistency.append(api.get("ledger/consistency", old=old, new=new))
        except FetchError as exc:
            if exc.status not in (400, 404):
                raise
    leaves: list[Any] = []
    newest = max(sizes, default=0)
    while len(leaves) < newest:
        start = len(leaves) + 1
        page = api.get("ledger/leaves", start=start, limit=min(_LEAF_PAGE, newest - len(leaves)))
        hashes = page.get("leaf_hashes")
        if page.get("start") != start or not isinstance(hashes, list):
            raise FetchError(f"{api.root}ledger/leaves?start={start}: not a page of leaf hashes from #{start}")
        if not hashes:
            break  # fewer leaves than the newest checkpoint covers: the roots check says so
        leaves.extend(hashes)
    return {
        "format": BUNDLE_FORMAT,
        "origin": key.get("origin"),
        "verifier_key": key.get("verifier_key"),
        "key_history": key.get("key_history"),
        "checkpoints": rows,
        "consistency": consistency,
        "leaf_hashes": leaves[:newest],
    }
