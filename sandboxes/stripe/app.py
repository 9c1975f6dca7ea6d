"""The Stripe sandbox: an in-process emulator of the parts of Stripe's API v1 the broker uses, on Stripe's wire.

Wire (``sandboxes/stripe/wire.py``): ``/v1/...`` with ``Authorization: Bearer <secret key>``, form bodies
with bracket nesting, JSON objects with Stripe's id prefixes and ``object`` field, and Stripe's error objects. The
real ``stripe`` SDK runs against it unchanged (``base_addresses={"api": sandbox.url}``).

What it emulates: customers; PaymentIntents confirmed with Stripe's test payment methods (``pm_card_visa``
succeeds, ``pm_card_chargeDeclined*`` decline with 402, ``pm_card_authenticationRequired`` needs 3-D Secure,
finished through ``authenticate``); refunds up to what remains; Connect Express accounts (unverified until
``verify_account``), account links, transfers (only to an account whose ``transfers`` capability is active),
per-account balances and payouts (``pending`` until ``settle_payout``); events for every state change, signed
for a webhook endpoint exactly as Stripe signs them; ``Idempotency-Key`` replay and conflict; ``Stripe-Account``.

Faults (``sandbox.faults``, actions named ``<resource>.<verb>``, default ``payment_intents.create``): ``throttle``
is 429 ``rate_limit``; ``capacity``/``quota`` are 500 ``api_error``; ``credentials`` is 401; ``slow`` sleeps
``seconds`` first; any kind with ``code="connection_drop"`` closes the connection without doing the call, and
``code="connection_drop_after"`` does the call (its idempotent result is saved) and then closes the connection.

Control routes (under ``/_sandbox/stripe/``): ``payment_intents/<id>/authenticate`` {"outcome": "approve"|"fail"},
``accounts/<id>/verify``, ``payouts/<id>/settle`` {"outcome": "paid"|"failed", "failure_code"},
``webhook_endpoint`` {"url", "secret", "deliver": "manual"|"before_answer"|"auto"} (until set: no url, secret
``whsec_sandbox``), ``events/pending`` (GET, takes them),
``events/deliver`` (POST), ``calls`` (GET); and the HTML pages ``authenticate/<pi>`` and ``onboarding/<acct>``.
"""

from __future__ import annotations

import base64
import copy
import hmac
import html
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from werkzeug.wrappers import Request, Response

from sandboxes.faults import FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response
from sandboxes.stripe import wire
from sandboxes.stripe.wire import StripeError, invalid, missing

DEFAULT_SECRET_KEY = "sk_test_sandbox"  # noqa: S105 (a test-mode key)
# The endpoint secret events are signed with until a test sets another (the broker's default STRIPE_WEBHOOK_SECRET).
DEFAULT_WEBHOOK_SECRET = "whsec_sandbox"  # noqa: S105
API_VERSION = "2026-10-28.endive"  # what events carry when the request named no Stripe-Version
DELIVERY_TIMEOUT = 5.0
COURIER_RETRY_S = 5.0  # how soon ``auto`` delivery tries an event the endpoint did not take again
MAX_PENDING_EVENTS = 10_000
# Stripe's test PaymentMethods (https://docs.stripe.com/testing#declined-payments): decline code and message.
DECLINES = {
    "pm_card_chargeDeclined": ("generic_decline", "Your card was declined."),
    "pm_card_chargeDeclinedInsufficientFunds": ("insufficient_funds", "Your card has insufficient funds."),
}
SUCCEEDS = frozenset({"pm_card_visa", "pm_card_mastercard", "pm_card_amex"})
THREE_D_SECURE = "pm_card_authenticationRequired"
TEST_METHODS = SUCCEEDS | set(DECLINES) | {THREE_D_SECURE}
# What an unverified Express account still owes (https://docs.stripe.com/api/accounts/object#account_object-requirements).
ONBOARDING_DUE = ["business_type", "external_account", "tos_acceptance.date", "tos_acceptance.ip"]
# Payout failure codes (https://docs.stripe.com/api/payouts/failures) and the message each carries.
PAYOUT_FAILURES = {
    "account_closed": "The bank account has been closed.",
    "account_frozen": "The bank account has been frozen.",
    "bank_account_restricted": "The bank account has restrictions on either the type or number of payouts allowed.",
    "could_not_process": "The bank could not process this payout.",
    "insufficient_funds": "Your Stripe account has insufficient funds to cover the payout.",
    "invalid_account_number": "The routing number seems correct, but the account number is invalid.",
    "no_account": "The bank account details on file are probably incorrect.",
}


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received (before auth and faults), for tests asserting what was asked."""

    action: str
    account: str | None
    idempotency_key: str | None


@dataclass(slots=True)
class _Ctx:
    operation: str
    account: str | None
    idempotency_key: str | None
    request_id: str | None
    host_url: str
    api_version: str
    events: list[str] = field(default_factory=list)


Handler = Callable[[_Ctx, dict[str, Any], str], dict[str, Any]]


def _now() -> int:
    return int(time.time())


def _form_page(title: str, text: str, buttons: list[tuple[str, str]], hidden: dict[str, str] | None = None) -> Response:
    fields = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in (hidden or {}).items()
    )
    choices = "".join(
        f'<button type="submit" name="outcome" value="{html.escape(v)}">{html.escape(label)}</button> '
        for v, label in buttons
    )
    body = (
        f'<!doctype html><html lang="en"><title>{html.escape(title)}</title><main><h1>{html.escape(title)}</h1>'
        f'<p>{html.escape(text)}</p><form method="post">{fields}{choices}</form></main></html>'
    )
    return Response(body, mimetype="text/html")


def _page(title: str, text: str) -> Response:
    body = f"<!doctype html><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
    return Response(body, mimetype="text/html")


class StripeSandbox(SandboxApp):
    """The Stripe sandbox WSGI app. ``start()`` serves it; ``reset()`` forgets every object, key, event and fault."""

    kind = "stripe"

    def __init__(self, secret_key: str = DEFAULT_SECRET_KEY, webhook_secret: str = DEFAULT_WEBHOOK_SECRET):
        super().__init__(FaultRegistry(default_action="payment_intents.create"))
        self.secret_key = secret_key
        self.webhook_secret = webhook_secret
        self._lock = threading.Lock()
        self._wake = threading.Event()  # an event to deliver (``auto``)
        self._courier: threading.Thread | None = None
        self._routes: list[tuple[str, re.Pattern[str], str, Handler]] = [
            ("POST", re.compile(r"^/v1/customers$"), "customers.create", self._customer_create),
            ("GET", re.compile(r"^/v1/customers/([\w-]+)$"), "customers.retrieve", self._customer_get),
            ("POST", re.compile(r"^/v1/payment_intents$"), "payment_intents.create", self._pi_create),
            ("GET", re.compile(r"^/v1/payment_intents/([\w-]+)$"), "payment_intents.retrieve", self._pi_get),
            (
                "POST",
                re.compile(r"^/v1/payment_intents/([\w-]+)/confirm$"),
                "payment_intents.confirm",
                self._pi_confirm,
            ),
            ("POST", re.compile(r"^/v1/refunds$"), "refunds.create", self._refund_create),
            ("POST", re.compile(r"^/v1/accounts$"), "accounts.create", self._account_create),
            ("GET", re.compile(r"^/v1/accounts/([\w-]+)$"), "accounts.retrieve", self._account_get),
            ("POST", re.compile(r"^/v1/account_links$"), "account_links.create", self._account_link_create),
            ("POST", re.compile(r"^/v1/transfers$"), "transfers.create", self._transfer_create),
            ("GET", re.compile(r"^/v1/balance$"), "balance.retrieve", self._balance_get),
            ("POST", re.compile(r"^/v1/payouts$"), "payouts.create", self._payout_create),
            ("GET", re.compile(r"^/v1/payouts/([\w-]+)$"), "payouts.retrieve", self._payout_get),
            ("GET", re.compile(r"^/v1/events/([\w-]+)$"), "events.retrieve", self._event_get),
        ]
        self.reset()

    def reset(self) -> None:
        self.faults.clear()
        self.clear_calls()
        with self._lock:
            self._objects: dict[str, dict[str, Any]] = {}  # every object by id
            self._scope: dict[str, str] = {}  # object id -> the account it lives on ("" = the platform)
            self._balances: dict[str, dict[str, int]] = {}  # account -> currency -> available minor units
            self._idempotency: dict[tuple[str, str], tuple[str, int, dict[str, Any]]] = {}
            self._pending: list[str] = []  # events not yet taken or delivered
            self._payloads: dict[str, str] = {}  # event id -> its exact JSON body
            # No url: events wait in ``pending_events`` until a test names one or takes them.
            self._endpoint: dict[str, str] | None = {"url": "", "secret": self.webhook_secret, "deliver": "manual"}

    # ------------------------------------------------------------------------------ public helpers

    def get(self, object_id: str) -> dict[str, Any]:
        """A copy of any object the sandbox holds (KeyError if none)."""
        with self._lock:
            return copy.deepcopy(self._objects[object_id])

    def get_objects(self, kind: str) -> list[dict[str, Any]]:
        """Copies of every object of ``kind`` (``"payment_intent"``, ``"payout"``, ...), oldest first."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects.values() if o["object"] == kind]

    def balance(self, account: str) -> dict[str, int]:
        with self._lock:
            return dict(self._balances.get(account, {}))

    def set_webhook_endpoint(self, url: str = "", secret: str | None = None, deliver: str = "manual") -> str:
        """Where events go and the ``whsec_`` secret they are signed with (generated when not given)."""
        if deliver not in ("manual", "before_answer", "auto"):
            raise ValueError("deliver must be manual, before_answer or auto")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("url must be http(s)")
        secret = secret or wire.new_id("whsec_", 32)
        if deliver == "auto" and not url:
            raise ValueError("auto delivery needs a url")
        with self._lock:
            self._endpoint = {"url": url, "secret": secret, "deliver": deliver}
            if deliver == "auto" and self._courier is None:
                self._courier = threading.Thread(target=self._courier_run, name="stripe-sandbox-courier", daemon=True)
                self._courier.start()
        self._wake.set()
        return secret

    def _courier_run(self) -> None:
        """``auto`` delivery, as Stripe does it: each event is POSTed soon after it happens (after the call that
        caused it has usually answered), and one the endpoint did not take is sent again a few seconds later."""
        while True:
            self._wake.wait(timeout=COURIER_RETRY_S)
            self._wake.clear()
            with self._lock:
                auto = self._endpoint is not None and self._endpoint["deliver"] == "auto" and bool(self._pending)
            if auto:
                try:
                    self.deliver_events()
                except ValueError:
                    continue  # the endpoint changed meanwhile

    def pending_events(self) -> list[dict[str, Any]]:
        """Take every undelivered event, each as ``{"id", "type", "payload", "signature"}`` signed now."""
        with self._lock:
            if self._endpoint is None:
                raise ValueError("no webhook endpoint: POST /_sandbox/stripe/webhook_endpoint first")
            secret, taken, self._pending = self._endpoint["secret"], self._pending, []
            return [self._signed(event_id, secret) for event_id in taken]

    def deliver_events(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """POST pending events (or just ``only``) to the endpoint's url with ``Stripe-Signature``; the ones that
        fail stay pending and are reported."""
        with self._lock:
            if self._endpoint is None or not self._endpoint["url"]:
                raise ValueError("no webhook endpoint url")
            url, secret = self._endpoint["url"], self._endpoint["secret"]
            wanted = set(only) if only is not None else None
            batch = [e for e in self._pending if wanted is None or e in wanted]
            signed = [self._signed(event_id, secret) for event_id in batch]
        delivered, failed = [], []
        for item in signed:
            request = urllib.request.Request(  # noqa: S310 (the endpoint url is checked to be http(s))
                url,
                data=item["payload"].encode(),
                method="POST",
                headers={"Content-Type": "application/json; charset=utf-8", "Stripe-Signature": item["signature"]},
            )
            try:
                with urllib.request.urlopen(request, timeout=DELIVERY_TIMEOUT) as answer:  # noqa: S310
                    answer.read(1024)
                delivered.append(item["id"])
            except (urllib.error.URLError, OSError, ValueError) as exc:
                failed.append({"id": item["id"], "error": str(exc)[:200]})
        with self._lock:
            done = set(delivered)
            self._pending = [e for e in self._pending if e not in done]
        return {"delivered": delivered, "failed": failed}

    def authenticate(self, payment_intent: str, outcome: str) -> dict[str, Any]:
        """Finish a 3-D Secure challenge: ``approve`` -> succeeded, ``fail`` -> requires_payment_method."""
        if outcome not in ("approve", "fail"):
            raise ValueError("outcome must be approve or fail")
        ctx = self._control_ctx()
        with self._lock:
            pi = self._find("payment_intent", payment_intent)
            if pi["status"] != "requires_action":
                raise ValueError(f"{payment_intent} is {pi['status']}, not requires_action")
            pi["next_action"] = None
            if outcome == "approve":
                self._succeed(ctx, pi)
            else:
                # Stripe's failed-authentication error (https://docs.stripe.com/error-codes, message paraphrased).
                message = "The provided PaymentMethod has failed authentication. Provide a new one to continue."
                error = {"type": "invalid_request_error", "code": "payment_intent_authentication_failure"}
                doc_url = "https://docs.stripe.com/error-codes/payment-intent-authentication-failure"
                self._fail(ctx, pi, {**error, "message": message, "doc_url": doc_url})
            answer = copy.deepcopy(pi)
        self._after(ctx)
        return answer

    def verify_account(self, account: str) -> dict[str, Any]:
        """Onboarding done: details submitted, charges and payouts enabled, nothing due; emits account.updated."""
        ctx = self._control_ctx()
        with self._lock:
            acct = self._find("account", account)
            previous = {k: copy.deepcopy(acct[k]) for k in ("charges_enabled", "payouts_enabled", "details_submitted")}
            previous["requirements"] = {"currently_due": list(acct["requirements"]["currently_due"])}
            acct.update(charges_enabled=True, payouts_enabled=True, details_submitted=True)
            acct["capabilities"] = {name: "active" for name in acct["capabilities"]}
            acct["requirements"].update(currently_due=[], eventually_due=[], past_due=[], disabled_reason=None)
            self._emit(ctx, "account.updated", acct, account=account, previous=previous)
            answer = copy.deepcopy(acct)
        self._after(ctx)
        return answer

    def settle_payout(self, payout: str, outcome: str, failure_code: str | None = None) -> dict[str, Any]:
        """A pending payout arrives (``paid``) or bounces (``failed``: the money returns to the balance)."""
        ctx = self._control_ctx()
        with self._lock:
            po = self._find("payout", payout)
            if po["status"] != "pending":
                raise ValueError(f"{payout} is already {po['status']}")
            account = self._scope[payout]
            if outcome == "paid":
                po["status"] = "paid"
            elif outcome == "failed":
                code = failure_code or "could_not_process"
                if code not in PAYOUT_FAILURES:
                    raise ValueError(f"failure_code must be one of {sorted(PAYOUT_FAILURES)}")
                po.update(status="failed", failure_code=code, failure_message=PAYOUT_FAILURES[code])
                po["failure_balance_transaction"] = wire.new_id("txn_")
                funds = self._balances.setdefault(account, {})
                funds[po["currency"]] = funds.get(po["currency"], 0) + po["amount"]
            else:
                raise ValueError("outcome must be paid or failed")
            self._emit(ctx, f"payout.{po['status']}", po, account=account or None)
            answer = copy.deepcopy(po)
        self._after(ctx)
        return answer

    # ------------------------------------------------------------------------------------ control

    def control_extra(self, request: Request, route: str) -> Response | None:
        if not route.startswith("stripe/"):
            return None
        parts = route.split("/")[1:]
        if request.method == "GET" and len(parts) == 2 and parts[0] in ("authenticate", "onboarding"):
            with self._lock:
                known = parts[1] in self._objects
            if not known:
                return json_response({"error": f"no such object {parts[1][:40]}"}, status=404)
            if parts[0] == "authenticate":
                return _form_page(
                    "Stripe sandbox: 3-D Secure",
                    f"Your bank asks you to confirm payment {parts[1]}.",
                    [("approve", "Complete authentication"), ("fail", "Fail authentication")],
                )
            return _form_page(
                "Stripe sandbox: onboarding",
                f"Connected account {parts[1]}: business details and bank account (sandbox).",
                [("verify", "Submit and verify")],
                hidden={"return_url": request.args.get("return_url", "")[:2048]},
            )
        if request.method == "POST" and len(parts) == 2 and parts[0] in ("authenticate", "onboarding"):
            return self._page_post(parts[0], parts[1], request)
        raw = request.stream.read(wire.MAX_BODY_BYTES + 1) if request.method == "POST" else b""
        if len(raw) > wire.MAX_BODY_BYTES:
            return json_response({"error": "body too large"}, status=413)
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            return json_response({"error": "the body must be a JSON object"}, status=400)
        body = body if isinstance(body, dict) else {}
        try:
            return self._control_route(request.method, parts, body)
        except KeyError as exc:
            return json_response({"error": f"no such object {exc.args[0]}"}, status=404)
        except ValueError as exc:
            return json_response({"error": str(exc)}, status=409)

    def _page_post(self, page: str, object_id: str, request: Request) -> Response:
        """A person's answer on the 3-D Secure or onboarding page, then back to the site that sent them, as
        Stripe redirects: to the PaymentIntent's ``return_url`` with ``payment_intent`` and ``redirect_status``
        (https://docs.stripe.com/payments/3d-secure#manual-redirect), or to the account link's ``return_url``."""
        outcome = request.form.get("outcome", "")
        try:
            if page == "authenticate":
                with self._lock:
                    pi = self._objects.get(object_id) or {}
                    redirect = ((pi.get("next_action") or {}).get("redirect_to_url") or {}).get("return_url") or ""
                done = self.authenticate(object_id, outcome)
                status = "succeeded" if done.get("status") == "succeeded" else "failed"
                query = urlencode({"payment_intent": object_id, "redirect_status": status})
            else:
                self.verify_account(object_id)
                redirect, query = request.form.get("return_url", ""), ""
        except KeyError:
            return json_response({"error": f"no such object {object_id[:40]}"}, status=404)
        except ValueError as exc:
            return json_response({"error": str(exc)}, status=409)
        if not redirect.startswith(("http://", "https://")):
            return _page("Stripe sandbox", "Done: you may close this page.")
        joiner = "&" if "?" in redirect else "?"
        return Response(status=303, headers={"Location": redirect + (joiner + query if query else "")})

    def _control_route(self, method: str, parts: list[str], body: dict[str, Any]) -> Response | None:
        if method == "POST" and len(parts) == 3 and parts[0] == "payment_intents" and parts[2] == "authenticate":
            return json_response(self.authenticate(parts[1], str(body.get("outcome", ""))))
        if method == "POST" and len(parts) == 3 and parts[0] == "accounts" and parts[2] == "verify":
            return json_response(self.verify_account(parts[1]))
        if method == "POST" and len(parts) == 3 and parts[0] == "payouts" and parts[2] == "settle":
            code = body.get("failure_code")
            return json_response(self.settle_payout(parts[1], str(body.get("outcome", "")), code and str(code)))
        if method == "POST" and parts == ["webhook_endpoint"]:
            secret = body.get("secret")
            url, deliver = str(body.get("url") or ""), str(body.get("deliver") or "manual")
            secret = self.set_webhook_endpoint(url, str(secret) if secret else None, deliver)
            return json_response({"url": url, "secret": secret, "deliver": deliver})
        if method == "GET" and parts == ["events", "pending"]:
            return json_response({"events": self.pending_events()})
        if method == "POST" and parts == ["events", "deliver"]:
            return json_response(self.deliver_events())
        if method == "GET" and parts == ["calls"]:
            return json_response({"calls": [[c.action, c.account] for c in self.calls()]})
        return None

    # ------------------------------------------------------------------------------------ routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        http = Request(environ)
        headers: dict[str, str] = {"Request-Id": wire.new_id("req_", 14)}
        drop_after = False
        try:
            ctx, params, handler, arg = self._parse(http, headers["Request-Id"])
            headers["Stripe-Version"] = ctx.api_version
            drop_after = self._fault(ctx.operation, environ)
            with self._lock:
                status, payload, replayed = self._execute(ctx, http, params, handler, arg)
            if replayed:
                headers["Idempotent-Replayed"] = "true"
            if drop_after:
                self._drop(environ)
            self._after(ctx)
        except StripeError as exc:
            status, payload = exc.status, exc.body()
        response = json_response(payload, status)
        response.headers.update(headers)
        if drop_after:
            response.headers["Connection"] = "close"
        return response(environ, start_response)

    def _parse(self, http: Request, request_id: str) -> tuple[_Ctx, dict[str, Any], Handler, str]:
        for method, pattern, operation, handler in self._routes:  # noqa: B007 (the match found is used below)
            match = pattern.match(http.path)
            if match and http.method == method:
                break
        else:
            raise invalid(f"Unrecognized request URL ({http.method}: {http.path[:200]}).", status=404)
        # Read at most one byte past the bound, whatever Content-Length claims (or a chunked body hides).
        raw = http.stream.read(wire.MAX_BODY_BYTES + 1) if method == "POST" else http.query_string
        if len(raw) > wire.MAX_BODY_BYTES:
            raise invalid(f"The request body exceeds {wire.MAX_BODY_BYTES} bytes.", status=413)
        params = wire.parse_form(raw)
        account = http.headers.get("Stripe-Account") or None
        key = http.headers.get("Idempotency-Key") or None
        if key is not None and len(key) > 255:
            raise invalid("Idempotency keys are at most 255 characters long.")
        self.record_call(Call(operation, account, key))
        self._authenticate(http.headers.get("Authorization", ""))
        version = (http.headers.get("Stripe-Version") or API_VERSION)[:40]
        ctx = _Ctx(operation, account, key, request_id, http.host_url, version)
        return ctx, params, handler, match.group(1) if match.groups() else ""

    def _authenticate(self, authorization: str) -> None:
        """The secret key as a Bearer token (what the SDK sends) or as the Basic auth user name (curl -u key:), as
        https://docs.stripe.com/api/authentication describes; a bad key is 401 with an invalid_request_error."""
        scheme, _, value = authorization.partition(" ")
        key = value.strip()
        if scheme == "Basic":
            try:
                key = base64.b64decode(key, validate=True).decode().partition(":")[0]
            except (ValueError, UnicodeDecodeError):
                key = ""
        elif scheme != "Bearer":
            key = ""
        if not key:
            raise invalid("You did not provide an API key (Authorization: Bearer <key>).", status=401)
        if not hmac.compare_digest(key.encode(), self.secret_key.encode()):
            raise invalid(f"Invalid API Key provided: {key[:8]}{'*' * 8}{key[-4:]}", status=401)

    def _fault(self, operation: str, environ: WSGIEnviron) -> bool:
        """Apply an injected fault; True when the connection must drop after the call is done."""
        fault = self.faults.take(operation)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(operation, kinds={k for k in FaultKind if k is not FaultKind.SLOW})
        if fault is None:
            return False
        if fault.code == "connection_drop_after":
            return True
        if fault.code == "connection_drop":
            self._drop(environ)
            raise StripeError(500, "api_error", "connection dropped")  # never read: the socket is closed
        if fault.kind is FaultKind.THROTTLE:
            message = fault.message or "Too many requests hit the API too quickly."
            raise StripeError(429, "invalid_request_error", message, code="rate_limit")
        if fault.kind is FaultKind.CREDENTIALS:
            raise invalid(fault.message or "Expired API Key provided.", code="api_key_expired", status=401)
        raise StripeError(500, "api_error", fault.message or "An unknown error occurred on Stripe's servers.")

    @staticmethod
    def _drop(environ: WSGIEnviron) -> None:
        # Closing the socket under werkzeug: the client reads no answer at all, as on a dropped connection.
        sock = environ.get("werkzeug.socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _execute(
        self, ctx: _Ctx, http: Request, params: dict[str, Any], handler: Handler, arg: str
    ) -> tuple[int, dict[str, Any], bool]:
        """Run one call under the lock. A POST with an Idempotency-Key replays the saved answer for the same
        path and parameters and refuses other ones (https://docs.stripe.com/api/idempotent_requests)."""
        if ctx.account is not None:
            acct = self._objects.get(ctx.account)
            if acct is None or acct["object"] != "account":
                raise StripeError(
                    403,
                    "invalid_request_error",
                    f"The provided key does not have access to account '{ctx.account[:40]}' (or it does not exist).",
                    code="account_invalid",
                )
        slot = (ctx.account or "", ctx.idempotency_key or "")
        fingerprint = json.dumps([http.path, params], sort_keys=True)
        if http.method == "POST" and ctx.idempotency_key:
            saved = self._idempotency.get(slot)
            if saved is not None:
                if saved[0] != fingerprint:
                    raise StripeError(
                        400,
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same parameters they were first "
                        f"used with. Try using a key other than '{ctx.idempotency_key[:40]}' if you meant to "
                        "execute a different request.",
                    )
                return saved[1], copy.deepcopy(saved[2]), True
        try:
            status, payload = 200, handler(ctx, params, arg)
        except StripeError as exc:
            # Stripe saves an answer once the endpoint ran: a card decline is one, a refused parameter is not.
            if exc.status != 402:
                raise
            status, payload = exc.status, exc.body()
        if http.method == "POST" and ctx.idempotency_key:
            self._idempotency[slot] = (fingerprint, status, copy.deepcopy(payload))
        return status, payload, False

    def _after(self, ctx: _Ctx) -> None:
        """Deliver the events this call emitted before its answer, when the endpoint asks for that."""
        with self._lock:
            before = self._endpoint is not None and self._endpoint["deliver"] == "before_answer"
        if before and ctx.events:
            self.deliver_events(ctx.events)

    # ------------------------------------------------------------------------------------ state

    def _control_ctx(self) -> _Ctx:
        return _Ctx("control", None, None, None, "", API_VERSION)

    def _find(self, kind: str, object_id: str) -> dict[str, Any]:
        """An object of ``kind`` for a control route (KeyError, answered 404, when there is none); lock held."""
        found = self._objects.get(object_id)
        if found is None or found["object"] != kind:
            raise KeyError(object_id[:40])
        return found

    def _lookup(self, ctx: _Ctx, kind: str, object_id: str, param: str = "id") -> dict[str, Any]:
        """An object of ``kind`` on the account the request acts for, or Stripe's 404 resource_missing."""
        found = self._objects.get(object_id)
        if found is None or found["object"] != kind or self._scope[object_id] != (ctx.account or ""):
            raise missing(kind, object_id, param)
        return found

    def _store(self, ctx: _Ctx, obj: dict[str, Any]) -> dict[str, Any]:
        self._objects[obj["id"]] = obj
        self._scope[obj["id"]] = ctx.account or ""
        return obj

    def _base(self, prefix: str, kind: str, params: dict[str, Any]) -> dict[str, Any]:
        meta = wire.metadata(params)
        return {"id": wire.new_id(prefix), "object": kind, "created": _now(), "livemode": False, "metadata": meta}

    def _emit(
        self,
        ctx: _Ctx,
        type_: str,
        obj: dict[str, Any],
        *,
        account: str | None = None,
        previous: dict[str, Any] | None = None,
    ) -> None:
        """Record an event in Stripe's shape (https://docs.stripe.com/api/events/object); lock held."""
        data: dict[str, Any] = {"object": copy.deepcopy(obj)}
        if previous is not None:
            data["previous_attributes"] = previous
        event: dict[str, Any] = {
            "id": wire.new_id("evt_"),
            "object": "event",
            "api_version": ctx.api_version,
            "created": _now(),
            "data": data,
            "livemode": False,
            "pending_webhooks": 1 if self._endpoint is not None else 0,
            "request": {"id": ctx.request_id, "idempotency_key": ctx.idempotency_key},
            "type": type_,
        }
        account = account or ctx.account
        if account:
            event["account"] = account  # Connect events name the connected account
        self._objects[event["id"]] = event
        self._scope[event["id"]] = ""
        self._payloads[event["id"]] = json.dumps(event, indent=2)
        if len(self._pending) < MAX_PENDING_EVENTS:
            self._pending.append(event["id"])
        ctx.events.append(event["id"])
        if self._endpoint is not None and self._endpoint["deliver"] == "auto":
            self._wake.set()

    def _signed(self, event_id: str, secret: str) -> dict[str, Any]:
        payload = self._payloads[event_id]
        event_type = self._objects[event_id]["type"]
        return {"id": event_id, "type": event_type, "payload": payload, "signature": wire.sign(payload, secret)}

    # ------------------------------------------------------------------------- customers, payments

    def _customer_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        customer = self._base("cus_", "customer", params)
        customer.update(email=wire.string(params, "email", max_len=512), name=wire.string(params, "name", max_len=256))
        customer.update(description=wire.string(params, "description"), balance=0, currency=None, delinquent=False)
        return copy.deepcopy(self._store(ctx, customer))

    def _customer_get(self, ctx: _Ctx, params: dict[str, Any], customer: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "customer", customer))

    def _pi_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payment_intents/create; ``confirm=true`` confirms in the same call."""
        pi = self._base("pi_", "payment_intent", params)
        pi.update(amount=wire.amount(params), currency=wire.currency(params))
        customer = wire.string(params, "customer", max_len=255)
        if customer is not None:
            self._lookup(ctx, "customer", customer, "customer")
        pi.update(
            customer=customer,
            payment_method=None,
            status="requires_payment_method",
            amount_received=0,
            amount_capturable=0,
            capture_method="automatic",
            confirmation_method="automatic",
            client_secret=f"{pi['id']}_secret_{wire.new_id('', 24)}",
            description=wire.string(params, "description"),
            latest_charge=None,
            last_payment_error=None,
            next_action=None,
            payment_method_types=["card"],
            canceled_at=None,
            cancellation_reason=None,
        )
        self._attach_method(pi, params)
        confirm = wire.boolean(params, "confirm")
        if wire.boolean(params, "off_session") and not confirm:
            raise invalid("off_session can only be used when confirm=true.", param="off_session")
        if confirm and pi["payment_method"] is None:
            raise invalid("confirm=true needs a payment_method.", param="payment_method", code="parameter_missing")
        self._store(ctx, pi)
        if confirm:
            self._confirm(ctx, pi, params)
        return copy.deepcopy(pi)

    def _pi_get(self, ctx: _Ctx, params: dict[str, Any], pi_id: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "payment_intent", pi_id))

    def _pi_confirm(self, ctx: _Ctx, params: dict[str, Any], pi_id: str) -> dict[str, Any]:
        pi = self._lookup(ctx, "payment_intent", pi_id)
        if pi["status"] not in ("requires_payment_method", "requires_confirmation", "requires_action"):
            raise invalid(
                f"This PaymentIntent's status is {pi['status']}; it cannot be confirmed.",
                code="payment_intent_unexpected_state",
            )
        self._attach_method(pi, params)
        self._confirm(ctx, pi, params)
        return copy.deepcopy(pi)

    @staticmethod
    def _attach_method(pi: dict[str, Any], params: dict[str, Any]) -> None:
        method = wire.string(params, "payment_method", max_len=255)
        if method is None:
            return
        if method not in TEST_METHODS:
            raise missing("PaymentMethod", method, "payment_method")
        pi.update(payment_method=method, status="requires_confirmation")

    def _confirm(self, ctx: _Ctx, pi: dict[str, Any], params: dict[str, Any]) -> None:
        """The outcome the test PaymentMethod stands for (https://docs.stripe.com/testing)."""
        method = pi["payment_method"]
        if method is None:
            raise invalid(
                "You cannot confirm this PaymentIntent because it's missing a payment method.",
                param="payment_method",
                code="payment_intent_unexpected_state",
            )
        pi["last_payment_error"] = None
        if method in SUCCEEDS:
            self._succeed(ctx, pi)
        elif method in DECLINES:
            decline_code, message = DECLINES[method]
            self._decline(ctx, pi, "card_declined", decline_code, message)
        elif wire.boolean(params, "off_session"):
            # Off-session there is nobody to authenticate: Stripe declines (https://docs.stripe.com/declines/codes).
            message = "Your card was declined. This transaction requires authentication."
            self._decline(ctx, pi, "authentication_required", "authentication_required", message)
        else:
            return_url = wire.string(params, "return_url", max_len=2048)
            url = f"{ctx.host_url}_sandbox/stripe/authenticate/{pi['id']}"
            redirect = {"url": url, "return_url": return_url}
            pi.update(status="requires_action", next_action={"type": "redirect_to_url", "redirect_to_url": redirect})
            self._emit(ctx, "payment_intent.requires_action", pi)

    def _charge(self, ctx: _Ctx, pi: dict[str, Any], status: str) -> dict[str, Any]:
        charge: dict[str, Any] = {"id": wire.new_id("ch_"), "object": "charge", "created": _now(), "livemode": False}
        charge.update(amount=pi["amount"], currency=pi["currency"], customer=pi["customer"], payment_intent=pi["id"])
        paid = status == "succeeded"
        charge.update(status=status, paid=paid, captured=paid, amount_captured=pi["amount"] if paid else 0)
        charge.update(amount_refunded=0, refunded=False, payment_method=pi["payment_method"], metadata={})
        charge["balance_transaction"] = wire.new_id("txn_") if paid else None
        self._store(ctx, charge)
        self._scope[charge["id"]] = self._scope[pi["id"]]
        pi["latest_charge"] = charge["id"]
        return charge

    def _succeed(self, ctx: _Ctx, pi: dict[str, Any]) -> None:
        self._charge(ctx, pi, "succeeded")
        pi.update(status="succeeded", amount_received=pi["amount"], next_action=None, last_payment_error=None)
        self._emit(ctx, "payment_intent.succeeded", pi, account=self._scope[pi["id"]] or None)

    def _fail(self, ctx: _Ctx, pi: dict[str, Any], error: dict[str, Any]) -> None:
        pi.update(status="requires_payment_method", last_payment_error=error, next_action=None)
        self._emit(ctx, "payment_intent.payment_failed", pi, account=self._scope[pi["id"]] or None)

    def _decline(self, ctx: _Ctx, pi: dict[str, Any], code: str, decline_code: str, message: str) -> None:
        """A card error: the PI keeps the error in ``last_payment_error`` and the call answers 402 with it and
        the PI (https://docs.stripe.com/api/errors)."""
        charge = self._charge(ctx, pi, "failed")
        method = {"id": pi["payment_method"], "object": "payment_method", "type": "card"}
        error = StripeError(402, "card_error", message, code=code, decline_code=decline_code)
        error.error.update(charge=charge["id"], payment_method=method)
        self._fail(ctx, pi, copy.deepcopy(error.error))
        error.error["payment_intent"] = copy.deepcopy(pi)
        raise error

    def _refund_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/refunds/create: ``amount`` defaults to what remains refundable."""
        pi_id = wire.string(params, "payment_intent", required=True, max_len=255) or ""
        pi = self._lookup(ctx, "payment_intent", pi_id, "payment_intent")
        if pi["status"] != "succeeded":
            raise invalid(
                f"This PaymentIntent ({pi_id}) does not have a successful charge to refund.",
                param="payment_intent",
                code="charge_not_refundable",
            )
        charge = self._objects[pi["latest_charge"]]
        remaining = charge["amount"] - charge["amount_refunded"]
        if remaining <= 0:
            raise invalid(f"Charge {charge['id']} has already been refunded.", code="charge_already_refunded")
        amount = wire.amount(params, required=False) or remaining
        if amount > remaining:
            raise invalid(
                f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})",
                param="amount",
                code="amount_too_large",
            )
        refund = self._base("re_", "refund", params)
        refund.update(amount=amount, currency=pi["currency"], charge=charge["id"], payment_intent=pi_id)
        refund.update(status="succeeded", reason=None, balance_transaction=wire.new_id("txn_"))
        self._store(ctx, refund)
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] == charge["amount"]
        self._emit(ctx, "refund.created", refund)
        self._emit(ctx, "charge.refunded", charge)
        return copy.deepcopy(refund)

    def _event_get(self, ctx: _Ctx, params: dict[str, Any], event_id: str) -> dict[str, Any]:
        event = self._objects.get(event_id)
        if event is None or event["object"] != "event":
            raise missing("event", event_id)
        return copy.deepcopy(event)

    # ------------------------------------------------------------------------------------ connect

    def _account_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """An Express account, unverified (https://docs.stripe.com/api/accounts/create)."""
        kind = wire.string(params, "type", required=True, max_len=20)
        if kind != "express":
            raise invalid("The sandbox creates Express accounts only (type=express).", param="type")
        country = (wire.string(params, "country", max_len=2) or "US").upper()
        if not re.fullmatch(r"[A-Z]{2}", country):
            raise invalid(f"Invalid country: {country}", param="country")
        requested = params.get("capabilities") or {}
        if not isinstance(requested, dict):
            raise invalid("capabilities must be a hash.", param="capabilities")
        names = sorted(n for n, v in requested.items() if isinstance(v, dict) and v.get("requested") == "true")
        if "transfers" not in names:
            # Express accounts must request transfers (https://docs.stripe.com/connect/express-accounts).
            raise invalid("Express accounts must request the transfers capability.", param="capabilities")
        acct = self._base("acct_", "account", params)
        acct.update(type="express", country=country, email=wire.string(params, "email", max_len=512))
        acct.update(default_currency="usd", charges_enabled=False, payouts_enabled=False, details_submitted=False)
        acct["capabilities"] = {name: "inactive" for name in names}
        acct["requirements"] = {
            "currently_due": list(ONBOARDING_DUE),
            "eventually_due": list(ONBOARDING_DUE),
            "past_due": list(ONBOARDING_DUE),
            "pending_verification": [],
            "disabled_reason": "requirements.past_due",
            "current_deadline": None,
            "errors": [],
        }
        self._store(ctx, acct)
        self._scope[acct["id"]] = ""
        return copy.deepcopy(acct)

    def _account_get(self, ctx: _Ctx, params: dict[str, Any], account: str) -> dict[str, Any]:
        acct = self._objects.get(account)
        if acct is None or acct["object"] != "account":
            raise missing("account", account)
        return copy.deepcopy(acct)

    def _account_link_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/account_links/create: a short-lived onboarding url."""
        account = wire.string(params, "account", required=True, max_len=255) or ""
        self._account_get(ctx, params, account)
        for name in ("refresh_url", "return_url"):
            value = wire.string(params, name, required=name == "refresh_url", max_len=2048)
            if value is not None and not value.startswith(("http://", "https://")):
                raise invalid(f"Not a valid URL: {name}", param=name, code="url_invalid")
        if wire.string(params, "type", required=True, max_len=40) not in ("account_onboarding", "account_update"):
            raise invalid("type must be account_onboarding or account_update.", param="type")
        created = _now()
        back = wire.string(params, "return_url", max_len=2048) or ""
        url = f"{ctx.host_url}_sandbox/stripe/onboarding/{account}" + (
            f"?{urlencode({'return_url': back})}" if back else ""
        )
        return {"object": "account_link", "created": created, "expires_at": created + 300, "url": url}

    def _transfer_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/transfers/create to a connected account whose transfers capability is active."""
        amount, currency = wire.amount(params), wire.currency(params)
        destination = wire.string(params, "destination", required=True, max_len=255) or ""
        acct = self._objects.get(destination)
        if acct is None or acct["object"] != "account":
            raise missing("account", destination, "destination")
        if acct["capabilities"].get("transfers") != "active":
            raise invalid(
                "Your destination account needs to have at least one of the following capabilities enabled: "
                "transfers, crypto_transfers, legacy_payments",
                param="destination",
                code="insufficient_capabilities_for_transfer",
            )
        transfer = self._base("tr_", "transfer", params)
        transfer.update(amount=amount, currency=currency, destination=destination, amount_reversed=0, reversed=False)
        transfer.update(balance_transaction=wire.new_id("txn_"), destination_payment=wire.new_id("py_"))
        self._store(ctx, transfer)
        funds = self._balances.setdefault(destination, {})
        funds[currency] = funds.get(currency, 0) + (amount or 0)
        self._emit(ctx, "transfer.created", transfer)
        return copy.deepcopy(transfer)

    def _balance_get(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/balance/balance_object of the account in ``Stripe-Account`` (or platform)."""
        funds = self._balances.get(ctx.account or "", {}) or {"usd": 0}
        available = [{"amount": v, "currency": c, "source_types": {"card": v}} for c, v in sorted(funds.items())]
        pending = [{"amount": 0, "currency": c, "source_types": {"card": 0}} for c in sorted(funds)]
        return {"object": "balance", "available": available, "pending": pending, "livemode": False}

    def _payout_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payouts/create from the available balance of the account acting."""
        amount, currency = wire.amount(params) or 0, wire.currency(params)
        account = ctx.account or ""
        acct = self._objects.get(account)
        if acct is not None and not acct["payouts_enabled"]:
            raise invalid("Payouts are not enabled for this account.", code="payouts_not_allowed")
        funds = self._balances.setdefault(account, {})
        if amount > funds.get(currency, 0):
            raise invalid(
                "You have insufficient funds in your Stripe account for this transfer.",
                param="amount",
                code="balance_insufficient",
            )
        funds[currency] -= amount
        payout = self._base("po_", "payout", params)
        payout.update(amount=amount, currency=currency, status="pending", arrival_date=payout["created"] + 2 * 86400)
        payout.update(automatic=False, method="standard", type="bank_account", source_type="card")
        payout.update(destination="ba_" + account.removeprefix("acct_")[:24], failure_code=None, failure_message=None)
        payout.update(balance_transaction=wire.new_id("txn_"), failure_balance_transaction=None)
        self._store(ctx, payout)
        return copy.deepcopy(payout)

    def _payout_get(self, ctx: _Ctx, params: dict[str, Any], payout: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "payout", payout))


def start_stripe_sandbox(host: str = "127.0.0.1", port: int = 0, **options: Any) -> StripeSandbox:
    """Build a ``StripeSandbox`` (``options`` go to its constructor) and serve it on a daemon thread."""
    sandbox = StripeSandbox(**options)
    sandbox.start(host, port)
    return sandbox
