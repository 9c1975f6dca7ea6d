"""``BrokerClient``: the broker's REST procurement API (``/api/v1/``) over ``requests``.

Retries. A request that gets no answer (connection refused or dropped, a timeout) or a 429 or 5xx answer is
sent again, up to ``retries`` more times, after an exponential backoff with jitter, and never sooner than the
answer's ``Retry-After``. Every POST carries an ``Idempotency-Key`` (a fresh uuid4 per call unless the caller
gives one) that stays the same across those retries, so an order whose response was lost is answered, on
the retry, with the order the first try created (``Idempotent-Replayed: true``) rather than a second one.
Other errors are not retried: they raise a ``BrokerError`` subclass with the broker's code and message.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote as quote_path

import requests

from brokerclient import bounds, errors
from brokerclient.verify import VerificationResult, verify_receipt

__all__ = ["ORDER_STATES", "TERMINAL_STATES", "ApiResponse", "BrokerClient"]

log = logging.getLogger("brokerclient")

ORDER_STATES = frozenset(
    {
        "placed", "provisioning", "running", "stopping", "stopped", "starting", "terminating", "terminated",
        "failed", "cancelled",
    }
)  # fmt: skip
# The most lines ``logs`` asks for (the broker's own cap).
MAX_LOG_LINES = 1000
TERMINAL_STATES = frozenset({"terminated", "failed", "cancelled"})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Everything that means "no (whole) answer came back": the request may or may not have been acted on.
_TRANSIENT = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
_jitter = secrets.SystemRandom()

Money = Decimal | str | int


@dataclass(frozen=True)
class ApiResponse:
    """One answered request: status, headers, decoded JSON body, how many tries it took, and the
    Idempotency-Key it was sent with (POSTs)."""

    status: int
    headers: Mapping[str, str]
    body: Any
    attempts: int
    idempotency_key: str | None = None

    @property
    def replayed(self) -> bool:
        """The broker answered a retry with what the first try with this Idempotency-Key created."""
        return self.headers.get("Idempotent-Replayed", "").lower() == "true"


def _money(value: Money) -> str:
    return format(Decimal(value), "f") if not isinstance(value, str) else value


class BrokerClient:
    """A client of one broker, authenticated by a scoped API token (``brk_...``).

    ``timeout`` is seconds per try (connect and read); ``retries`` how many more tries a transient failure
    gets; ``backoff`` the first wait in seconds, doubling per try up to ``max_backoff``. A ``Retry-After`` longer
    than ``max_retry_after`` is not waited for: the error is raised instead.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 120.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if retries < 0 or timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        root = base_url.rstrip("/")
        if root.endswith("/api/v1"):
            root = root[: -len("/api/v1")]
        self.base_url = root
        self.api_url = f"{root}/api/v1"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self._session = session or requests.Session()
        self._session.headers["Accept"] = "application/json"
        self._session.headers["User-Agent"] = "gpu-broker-client/0.1"
        if token:
            # The broker takes one kind of token, brk_…, as a Bearer token; anything else is sent the same way so
            # that the broker's 401 says what is wrong with it.
            self._session.headers["Authorization"] = f"Bearer {token.strip()}"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- Transport -----------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        idempotency_key: str | None = None,
    ) -> ApiResponse:
        """Send one API request with retries; return the answer or raise a ``BrokerError``.

        A POST gets an ``Idempotency-Key`` (``idempotency_key`` or a new uuid4), the same on every try.
        """
        method = method.upper()
        url = path if path.startswith(("http://", "https://")) else f"{self.api_url}/{path.lstrip('/')}"
        headers: dict[str, str] = {}
        if method == "POST":
            idempotency_key = idempotency_key or str(uuid.uuid4())
            headers["Idempotency-Key"] = idempotency_key
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._session.request(
                    method, url, params=params, json=json_body, headers=headers, timeout=self.timeout
                )
            except _TRANSIENT as exc:
                if attempt > self.retries:
                    raise errors.Unreachable(
                        0, "unreachable", f"{method} {url}: no answer after {attempt} tries ({exc})"
                    ) from exc
                self._wait(attempt, None, f"{method} {url}: {type(exc).__name__}")
                continue
            if response.status_code in RETRY_STATUSES and attempt <= self.retries:
                retry_after = _retry_after(response.headers.get("Retry-After"))
                if retry_after is None or retry_after <= self.max_retry_after:
                    self._wait(attempt, retry_after, f"{method} {url}: HTTP {response.status_code}")
                    continue
            return self._answer(response, attempt, idempotency_key)

    def _wait(self, attempt: int, retry_after: float | None, why: str) -> None:
        delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        delay = delay / 2 + _jitter.uniform(0, delay / 2)  # spread clients that failed together
        if retry_after is not None:
            delay = max(delay, retry_after)
        log.warning("%s; retry %d of %d in %.2fs", why, attempt, self.retries, delay)
        self._sleep(delay)

    def _answer(self, response: requests.Response, attempts: int, idempotency_key: str | None) -> ApiResponse:
        try:
            body = bounds.loads(response.content, what="the answer") if response.content else None
        except ValueError as exc:
            body = None
            if response.ok:
                raise errors.BrokerError(
                    response.status_code, "bad_response", f"the answer is not JSON ({exc}): {response.text[:200]!r}"
                ) from None
        if not response.ok:
            raise errors.error_for(response.status_code, body, response.text)
        return ApiResponse(response.status_code, response.headers, body, attempts, idempotency_key)

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params).body

    def post(self, path: str, body: Any = None, *, idempotency_key: str | None = None) -> ApiResponse:
        return self.request("POST", path, json_body=body, idempotency_key=idempotency_key)

    def _pages(self, path: str, params: dict[str, Any], limit: int | None, page_size: int) -> Iterator[dict[str, Any]]:
        """Follow ``next_cursor`` until the listing ends or ``limit`` rows were given."""
        if limit is not None and limit <= 0:
            return
        given = 0
        params = {**params, "limit": min(page_size, limit) if limit is not None else page_size}
        while True:
            page = self.get(path, params)
            for row in page["results"]:
                yield row
                given += 1
                if limit is not None and given >= limit:
                    return
            cursor = page.get("next_cursor")
            if not cursor:
                return
            params["cursor"] = cursor

    # --- Offers, quotes, orders ----------------------------------------------------------------------------

    def offers(
        self,
        query: str = "",
        sort: str = "price",
        *,
        limit: int | None = None,
        page_size: int = 100,
        filters: Mapping[str, str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Offers for sale matching ``query`` (the search language: ``gpu=H100 count>=8 price<40``), cheapest
        first by ``sort`` (``price``, ``gpuprice`` or ``tflops``), fetched a page at a time as the iterator is
        consumed; at most ``limit`` of them. ``filters`` are the older parameters (gpu, count, region, ...)."""
        params: dict[str, Any] = {**(filters or {}), "sort": sort}
        if query:
            params["q"] = query
        return self._pages("offers", params, limit, page_size)

    def offer(self, offer_id: int) -> dict[str, Any]:
        """One offer, on sale now or not (its ``status`` says)."""
        body: dict[str, Any] = self.get(f"offers/{offer_id}")
        return body

    def offer_prices(self, offer_id: int, *, days: int = 30) -> list[dict[str, Any]]:
        """The offer's prices over the last ``days`` (1-365): ``{"from", "price_usd"}``, oldest first."""
        prices: list[dict[str, Any]] = self.get(f"offers/{offer_id}/prices", {"days": days})["prices"]
        return prices

    def orders(self, *, limit: int | None = None, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """The organisation's orders, newest first."""
        return self._pages("orders", {}, limit, page_size)

    def quote(self, workload: Mapping[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Ranked quotes for one workload (``profile`` and optional requirements, see the API's
        QuoteCreateInput); each quote's price holds until ``expires_at``."""
        body: dict[str, Any] = self.post("quotes", dict(workload), idempotency_key=idempotency_key).body
        return body

    def procure(
        self,
        demands: Iterable[Mapping[str, Any]],
        *,
        time_limit: float | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Many workloads assigned jointly against finite capacity; one quote per placed demand."""
        payload: dict[str, Any] = {"demands": [dict(d) for d in demands]}
        if time_limit is not None:
            payload["time_limit"] = time_limit
        body: dict[str, Any] = self.post("procurements", payload, idempotency_key=idempotency_key).body
        return body

    def order(
        self,
        *,
        offer: int | None = None,
        quote: str | None = None,
        max_price_per_hour: Money | None = None,
        allow_failover: bool | None = None,
        regions: Iterable[str] | None = None,
        duration_hours: Money | None = None,
        idempotency_key: str | None = None,
        launch: Mapping[str, Any] | None = None,
        launch_template: str | None = None,
        bid_per_gpu_hour: Money | None = None,
    ) -> dict[str, Any]:
        """Place an order for an ``offer`` id (at its price now) or a ``quote`` id (at the price it locked).

        ``launch`` is what the machine runs and who may reach it (image, workload, disk_gb, ports,
        allowed_cidrs, ssh_keys, spend_cap_usd; the broker's README describes it), or ``launch_template`` a
        saved template's id or name; neither: a quote's configuration, else just the machine with the
        organisation's keys, SSH open to this client's address. ``bid_per_gpu_hour``: for an independent
        host's interruptible offer, the bid (at least the machine's minimum; a higher one outbids lower bids
        when GPUs are short). Safe to retry: give the same
        ``idempotency_key`` to be answered with the same order (the client already reuses one across its own
        retries). The same key with a different body raises ``Conflict`` (``idempotency_conflict``).
        """
        if (offer is None) == (quote is None):
            raise ValueError("give exactly one of offer or quote")
        payload: dict[str, Any] = {"offer": offer} if offer is not None else {"quote": str(quote)}
        if max_price_per_hour is not None:
            payload["max_price_per_hour"] = _money(max_price_per_hour)
        if allow_failover is not None:
            payload["allow_failover"] = allow_failover
        if bid_per_gpu_hour is not None:
            payload["bid_per_gpu_hour"] = _money(bid_per_gpu_hour)
        if regions is not None:
            payload["regions"] = list(regions)
        if duration_hours is not None:
            payload["duration_hours"] = _money(duration_hours)
        if launch is not None:
            payload["launch"] = dict(launch)
        if launch_template is not None:
            payload["launch_template"] = launch_template
        body: dict[str, Any] = self.post("orders", payload, idempotency_key=idempotency_key).body
        return body

    def order_get(self, order_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.get(f"orders/{order_id}")
        return body

    def watch(
        self,
        order_id: str,
        *,
        until: Iterable[str] = ("running",),
        timeout: float = 600.0,
        interval: float = 2.0,
    ) -> Iterator[dict[str, Any]]:
        """Poll the order every ``interval`` seconds and yield it when its state changes (the first look
        included), until it reaches a state in ``until`` or a final one (terminated, failed, cancelled).

        Raises ``WatchTimeout`` when ``timeout`` seconds pass first, ``ValueError`` for an unknown state.
        """
        wanted = frozenset(until)
        unknown = wanted - ORDER_STATES
        if unknown:
            raise ValueError(f"unknown order state(s) {sorted(unknown)}; states: {', '.join(sorted(ORDER_STATES))}")
        return self._watch(order_id, wanted, timeout, interval)  # checked now, not at the first next()

    def _watch(
        self, order_id: str, wanted: frozenset[str], timeout: float, interval: float
    ) -> Iterator[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        last: str | None = None
        while True:
            order = self.order_get(order_id)
            state = order["state"]
            if state != last:
                last = state
                yield order
            if state in wanted or state in TERMINAL_STATES:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.WatchTimeout(
                    0,
                    "watch_timeout",
                    f"order {order_id} is still {state} after {timeout:g}s (waiting for {' or '.join(sorted(wanted))})",
                )
            self._sleep(min(interval, remaining))

    def terminate(self, order_id: str) -> dict[str, Any]:
        """Ask for the order's instance to be stopped (idempotent; a placed order is cancelled instead)."""
        body: dict[str, Any] = self.post(f"orders/{order_id}/terminate").body
        return body

    def stop(self, order_id: str) -> dict[str, Any]:
        """Stop the running order's machine, keeping its disk (idempotent); the order, ``stopping`` until the
        provider has stopped it. A 409 ``action_unsupported`` where its provider cannot."""
        body: dict[str, Any] = self.post(f"orders/{order_id}/stop").body
        return body

    def start(self, order_id: str) -> dict[str, Any]:
        """Start the stopped order's machine again (idempotent); ``starting`` until its agent reports."""
        body: dict[str, Any] = self.post(f"orders/{order_id}/start").body
        return body

    def restart(self, order_id: str) -> dict[str, Any]:
        """Reboot the running order's machine in place; ``starting`` until its agent reports again."""
        body: dict[str, Any] = self.post(f"orders/{order_id}/restart").body
        return body

    def logs(self, order_id: str, *, lines: int = 100) -> dict[str, Any]:
        """The workload's last ``lines`` (1 to 1000) lines of output: ``{"lines", "at", "source"}``."""
        if not 1 <= lines <= MAX_LOG_LINES:
            raise ValueError(f"lines: 1 to {MAX_LOG_LINES}, not {lines}")
        body: dict[str, Any] = self.get(f"orders/{order_id}/logs", {"lines": lines})
        return body

    # --- SSH keys and launch templates -----------------------------------------------------------------------

    def ssh_keys(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The organisation's SSH public keys (needs keys:manage or orders:place)."""
        return self._pages("ssh-keys", {}, limit, 100)

    def ssh_key_add(self, public_key: str, name: str = "", *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Add a public key (ed25519, ECDSA, or RSA of 3072+ bits). Never give it a private key: the broker
        refuses one and does not keep it, but it should not travel at all (``cli`` checks before sending)."""
        payload = {"public_key": public_key, "name": name}
        body: dict[str, Any] = self.post("ssh-keys", payload, idempotency_key=idempotency_key).body
        return body

    def ssh_key_delete(self, key_id: str) -> None:
        self.request("DELETE", f"ssh-keys/{key_id}")

    def launch_templates(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        return self._pages("launch-templates", {}, limit, 100)

    def launch_template_save(
        self, name: str, launch: Mapping[str, Any], *, description: str = "", idempotency_key: str | None = None
    ) -> dict[str, Any]:
        payload = {"name": name, "description": description, "launch": dict(launch)}
        body: dict[str, Any] = self.post("launch-templates", payload, idempotency_key=idempotency_key).body
        return body

    def launch_template(self, ref: str) -> dict[str, Any]:
        """One of the organisation's launch templates, by id or name."""
        body: dict[str, Any] = self.get(f"launch-templates/{quote_path(ref, safe='')}")
        return body

    # --- The template gallery, clusters, billing -------------------------------------------------------------

    def gallery(self) -> list[dict[str, Any]]:
        """The broker's ready launch configurations (PyTorch, vLLM, Jupyter, a batch job): each with what it
        needs (GPU memory, the variables to fill) and its ``launch``, variables at their defaults."""
        body: dict[str, Any] = self.get("templates/gallery")
        return list(body["results"])

    def gallery_entry(self, slug: str) -> dict[str, Any]:
        body: dict[str, Any] = self.get(f"templates/gallery/{quote_path(slug, safe='')}")
        return body

    def clusters(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The organisation's clusters (multi-node orders), newest first."""
        return self._pages("clusters", {}, limit, 100)

    def cluster(self, cluster_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.get(f"clusters/{quote_path(cluster_id, safe='')}")
        return body

    def cluster_terminate(self, cluster_id: str) -> dict[str, Any]:
        """Stop every machine of the cluster (idempotent)."""
        body: dict[str, Any] = self.post(f"clusters/{quote_path(cluster_id, safe='')}/terminate").body
        return body

    # --- Fleets --------------------------------------------------------------------------------------------

    def fleets(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The organisation's fleets, newest first."""
        return self._pages("fleets", {}, limit, 100)

    def fleet(self, fleet_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.get(f"fleets/{quote_path(fleet_id, safe='')}")
        return body

    def fleet_create(self, fleet: Mapping[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Define a fleet; the answer carries its metrics token, once."""
        body: dict[str, Any] = self.post("fleets", dict(fleet), idempotency_key=idempotency_key).body
        return body

    def fleet_update(self, fleet_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change a fleet's limits, rule, price cap or budget; the next evaluation follows them."""
        body: dict[str, Any] = self.request(
            "PATCH", f"fleets/{quote_path(fleet_id, safe='')}", json_body=dict(changes)
        ).body
        return body

    def fleet_end(self, fleet_id: str) -> dict[str, Any]:
        """End the fleet: every replica terminated, none placed again (idempotent)."""
        body: dict[str, Any] = self.post(f"fleets/{quote_path(fleet_id, safe='')}/end").body
        return body

    def fleet_decisions(self, fleet_id: str, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The fleet's scaling decisions, newest first."""
        return self._pages(f"fleets/{quote_path(fleet_id, safe='')}/decisions", {}, limit, 100)

    def fleet_metric(self, fleet_id: str, name: str, value: float, *, metrics_token: str) -> dict[str, Any]:
        """Post one value of the fleet's metric with the fleet's own metrics token (``fmt_…``), as its workload
        does; the client's API token is not sent."""
        response = self._session.post(
            f"{self.api_url}/fleets/{quote_path(fleet_id, safe='')}/metrics",
            json={"name": name, "value": value},
            headers={"Authorization": f"Bearer {metrics_token}", "Idempotency-Key": str(uuid.uuid4())},
            timeout=self.timeout,
        )
        body: dict[str, Any] = self._answer(response, 1, None).body
        return body

    def billing(self) -> dict[str, Any]:
        """Credit available, what running orders hold, and the billing details (needs billing:manage)."""
        body: dict[str, Any] = self.get("billing")
        return body

    def topups(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The organisation's top-ups, newest first."""
        return self._pages("billing/topups", {}, limit, 100)

    def invoices(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The organisation's issued invoices, newest first."""
        return self._pages("invoices", {}, limit, 100)

    # --- Ledger --------------------------------------------------------------------------------------------

    def receipt(self, order_id: str) -> dict[str, Any]:
        """The order's ledger entries with inclusion proofs against the newest checkpoint (needs ledger:read)."""
        body: dict[str, Any] = self.get(f"orders/{order_id}/receipt")
        return body

    def receipt_verified(
        self,
        order_id: str,
        *,
        trusted_key: str | None = None,
        wait: float = 0.0,
        interval: float | None = None,
    ) -> tuple[dict[str, Any], VerificationResult]:
        """Fetch the order's receipt and verify it here; while its verdict is ``pending`` (no check failed, but
        entries wait for a signed checkpoint) fetch it again, for at most ``wait`` seconds in all, every
        ``interval`` seconds (default: the broker's ``Retry-After``, else 2). Asking is what makes the broker
        sign promptly. Returns the last receipt and its verification: verified, failed (a failure is never
        waited out), or still pending when the time is up."""
        deadline = time.monotonic() + wait
        while True:
            answer = self.request("GET", f"orders/{order_id}/receipt")
            receipt: dict[str, Any] = answer.body
            result = verify_receipt(receipt, trusted_key=trusted_key, order_id=order_id)
            remaining = deadline - time.monotonic()
            if not result.pending or remaining <= 0:
                return receipt, result
            pause = interval if interval is not None else _retry_after(answer.headers.get("Retry-After")) or 2.0
            log.info("receipt of %s pending: %s; asking again in %.1fs", order_id, result.pending_message(), pause)
            self._sleep(min(pause, remaining))

    def verify_receipt(
        self, receipt: Mapping[str, Any], *, trusted_key: str | None = None, order_id: str | None = None
    ) -> VerificationResult:
        """Verify a receipt locally (``brokerclient.verify``); nothing is fetched. Pin ``trusted_key``: without
        it the receipt's own key is used, which shows only that whoever answered signed it."""
        return verify_receipt(dict(receipt), trusted_key=trusted_key, order_id=order_id)

    def ledger_key(self) -> dict[str, Any]:
        """The broker's verifier key as it publishes it (to compare with one obtained out of band)."""
        body: dict[str, Any] = self.get("ledger/key")
        return body

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        """The ledger's proof that its tree of ``new_size`` entries extends the one of ``old_size``."""
        body: dict[str, Any] = self.get("ledger/consistency", {"old": old_size, "new": new_size})
        return [bytes.fromhex(p) for p in body.get("proof", [])]

    def checkpoint_latest(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("ledger/checkpoints/latest")
        return body

    # --- Money ---------------------------------------------------------------------------------------------

    def budget(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("budget")
        return body

    def invoice(self, month: str | None = None) -> dict[str, Any]:
        """The lines of the orders that ended in ``month`` (``YYYY-MM``, UTC; default this month)."""
        body: dict[str, Any] = self.get("invoice", {"month": month} if month else None)
        return body

    # --- Schema --------------------------------------------------------------------------------------------

    def gpu_model_keys(self) -> list[str] | None:
        """The GPU model keys a quote accepts, read from the OpenAPI schema; None when it does not say."""
        schema = self.get("schema", {"format": "json"})
        try:
            item = schema["components"]["schemas"]["QuoteCreateInputRequest"]["properties"]["gpu_models"]["items"]
            if "$ref" in item:
                item = schema["components"]["schemas"][item["$ref"].rsplit("/", 1)[-1]]
            return [str(key) for key in item["enum"]]
        except (KeyError, TypeError):
            return None


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
