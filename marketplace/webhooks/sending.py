"""One HTTP POST of a webhook: to the checked address, with a timeout, never following a redirect."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from marketplace.webhooks.destinations import Destination

TIMEOUT_S = 5.0
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


class _PinnedTls(HTTPAdapter):
    """Connects to the checked address while TLS (SNI and the certificate check) uses the URL's host name."""

    def __init__(self, host: str) -> None:
        self._host = host
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self._host
        kwargs["assert_hostname"] = self._host
        super().init_poolmanager(*args, **kwargs)


def http_post(destination: Destination, body: bytes, headers: dict[str, str]) -> SendResult:
    """POST ``body`` to ``destination``; never raises for a network failure (it is the result's ``error``)."""
    session = requests.Session()
    # No proxy from the environment: the address that was checked must be the one connected to.
    session.trust_env = False
    session.mount("http://", HTTPAdapter(max_retries=0))
    session.mount("https://", _PinnedTls(destination.host))
    all_headers = {
        **headers,
        "Host": destination.netloc,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }
    started = time.monotonic()
    try:
        with session.post(
            destination.pinned_url,
            data=body,
            headers=all_headers,
            timeout=TIMEOUT_S,
            allow_redirects=False,
            stream=True,
            verify=CA_BUNDLE,
        ) as response:
            try:
                excerpt = response.raw.read(EXCERPT_BYTES, decode_content=True) or b""
            except Exception:  # the answer's body is only kept for the log; never fail the attempt on it
                excerpt = b""
            return SendResult(
                status_code=response.status_code,
                excerpt=excerpt.decode("utf-8", "replace")[:EXCERPT_BYTES],
                duration_ms=_ms(started),
            )
    except requests.Timeout:
        error = f"timeout: no answer within {TIMEOUT_S:g} s"
    except requests.exceptions.SSLError as exc:
        error = f"TLS error: {exc}"
    except requests.ConnectionError as exc:
        error = f"connection failed: {exc}"
    except requests.RequestException as exc:
        error = f"request failed: {exc}"
    finally:
        session.close()
    return SendResult(status_code=None, error=error[:500], duration_ms=_ms(started))


def _ms(started: float) -> int:
    return max(0, round((time.monotonic() - started) * 1000))
