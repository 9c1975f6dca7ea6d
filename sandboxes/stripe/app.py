"""The Stripe sandbox: an in-process emulator of the parts of Stripe's API v1 the broker uses, on Stripe's wire.

Wire (``sandboxes/stripe/wire.py``): ``/v1/...`` with ``Authorization: Bearer <secret key>``, form bodies
with bracket nesting, JSON objects with Stripe's id prefixes and ``object`` field, and Stripe's error objects. The
real ``stripe`` SDK runs against it unchanged (``base_addresses={"api": sandbox.url}``).

What it emulates: customers; PaymentIntents confirmed with Stripe's test payment methods (``pm_card_visa`` and the
other brands succeed, ``pm_card_chargeDeclined*``/``pm_card_visa_chargeDeclined*`` decline with 402 and their codes,
``pm_card_authenticationRequired``/``pm_card_threeDSecure2Required`` need 3-D Secure, finished through
``authenticate``; ``state.test_card_behaviour`` maps Stripe's test card numbers, typed on the hosted Checkout
page, to the same outcomes), Checkout Sessions (``checkout.py``), and cancelled
(``/cancel``); charges; refunds up to what remains; Connect Express accounts (unverified until ``verify_account``),
account links, transfers (only to an account whose ``transfers`` capability is active), per-account balances and
payouts (``pending`` until ``settle_payout``); balance transactions for charges (with Stripe's card fee), refunds,
transfers (both sides), payouts and failed payouts; events for every state change, signed for a webhook endpoint
exactly as Stripe signs them; ``Idempotency-Key`` replay and conflict; ``Stripe-Account``.

As strict as Stripe: each endpoint takes only the parameters ``params.py`` lists for it (any other is 400
``parameter_unknown``); a charge below its currency's minimum is ``amount_too_small`` and an unsupported currency
is refused (``currencies.py``); ``expand`` reaches only the fields Stripe documents as expandable ("This property
cannot be expanded"). Lists of payment intents, refunds, transfers, payouts, events and balance transactions page
newest first with ``limit``/``starting_after``/``ending_before`` and filter by ``created``. Every object carries the
fields its reference page lists (``shapes.py``).

Faults (``sandbox.faults``, actions named ``<resource>.<verb>``, default ``payment_intents.create``): ``throttle``
is 429 ``rate_limit``; ``capacity``/``quota`` are 500 ``api_error``; ``credentials`` is 401; ``slow`` sleeps
``seconds`` first; any kind with ``code="connection_drop"`` closes the connection without doing the call, and
``code="connection_drop_after"`` does the call (its idempotent result is saved) and then closes the connection.

Control routes (under ``/_sandbox/stripe/``): ``payment_intents/<id>/authenticate`` {"outcome": "approve"|"fail"},
``accounts/<id>/verify``, ``payouts/<id>/settle`` {"outcome": "paid"|"failed", "failure_code"},
``webhook_endpoint`` {"url", "secret", "deliver": "manual"|"before_answer"|"auto"} (until set: no url, secret
``whsec_sandbox``), ``events/pending`` (GET, takes them),
``events/deliver`` (POST), ``calls`` (GET); and the HTML pages ``authenticate/<pi>``, ``onboarding/<acct>`` and
``checkout/<cs>`` (a Checkout Session's hosted card page, ``checkout.py``; ``checkout/<cs>/return`` is where its
3-D Secure challenge sends the card holder back).
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
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Request, Response

from sandboxes.faults import FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response
from sandboxes.stripe import wire
from sandboxes.stripe.checkout import (
    MAX_PAGE_FORM_BYTES,
    PAGE_STYLE,
    CheckoutHandlers,
    checkout_page,
    money_text,
    success_redirect,
)
from sandboxes.stripe.connect import ConnectHandlers
from sandboxes.stripe.params import allowed_params, check_expand
from sandboxes.stripe.state import (
    API_VERSION,
    COURIER_RETRY_S,
    DEFAULT_SECRET_KEY,
    DEFAULT_WEBHOOK_SECRET,
    DELIVERY_TIMEOUT,
    PAYOUT_FAILURES,
    Call,
    Handler,
    _Ctx,
)
from sandboxes.stripe.wire import StripeError, invalid


def _form_page(title: str, text: str, buttons: list[tuple[str, str]], hidden: dict[str, str] | None = None) -> Response:
    """A sandbox page that asks a person one thing (3-D Secure, onboarding); the first button is the main one."""
    fields = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in (hidden or {}).items()
    )
    choices = "".join(
        f'<button type="submit" name="outcome" value="{html.escape(v)}"{" class=quiet" if n else ""}>'
        f"{html.escape(label)}</button>"
        for n, (v, label) in enumerate(buttons)
    )
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head><body>"
        '<div class="test" role="note">Test mode: Stripe sandbox</div>'
        f'<main class="panel"><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>'
        f'<form method="post">{fields}{choices}</form></main></body></html>'
    )
    return Response(body, mimetype="text/html")


def _page(title: str, text: str) -> Response:
    body = f"<!doctype html><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
    return Response(body, mimetype="text/html")


class StripeSandbox(CheckoutHandlers, ConnectHandlers, SandboxApp):
    """The Stripe sandbox WSGI app. ``start()`` serves it; ``reset()`` forgets every object, key, event and fault."""

    kind = "stripe"

    def __init__(self, secret_key: str = DEFAULT_SECRET_KEY, webhook_secret: str = DEFAULT_WEBHOOK_SECRET):
        super().__init__(FaultRegistry(default_action="payment_intents.create"))
        self.secret_key = secret_key
        self.webhook_secret = webhook_secret
        self._lock = threading.Lock()
        self._wake = threading.Event()  # an event to deliver (``auto``)
        self._courier: threading.Thread | None = None
        self._routes: list[tuple[str, re.Pattern[str], str, Handler, frozenset[str]]] = [
            (method, re.compile(f"^{path}$"), operation, handler, allowed_params(operation))
            for method, path, operation, handler in (
                ("POST", r"/v1/customers", "customers.create", self._customer_create),
                ("GET", r"/v1/customers/([\w-]+)", "customers.retrieve", self._customer_get),
                ("GET", r"/v1/payment_intents", "payment_intents.list", self._pi_list),
                ("POST", r"/v1/payment_intents", "payment_intents.create", self._pi_create),
                ("GET", r"/v1/payment_intents/([\w-]+)", "payment_intents.retrieve", self._pi_get),
                ("POST", r"/v1/payment_intents/([\w-]+)/confirm", "payment_intents.confirm", self._pi_confirm),
                ("POST", r"/v1/payment_intents/([\w-]+)/cancel", "payment_intents.cancel", self._pi_cancel),
                ("GET", r"/v1/refunds", "refunds.list", self._refund_list),
                ("POST", r"/v1/refunds", "refunds.create", self._refund_create),
                ("GET", r"/v1/refunds/([\w-]+)", "refunds.retrieve", self._refund_get),
                ("POST", r"/v1/accounts", "accounts.create", self._account_create),
                ("GET", r"/v1/accounts/([\w-]+)", "accounts.retrieve", self._account_get),
                ("POST", r"/v1/account_links", "account_links.create", self._account_link_create),
                ("GET", r"/v1/transfers", "transfers.list", self._transfer_list),
                ("POST", r"/v1/transfers", "transfers.create", self._transfer_create),
                ("GET", r"/v1/transfers/([\w-]+)", "transfers.retrieve", self._transfer_get),
                ("GET", r"/v1/balance", "balance.retrieve", self._balance_get),
                ("GET", r"/v1/balance_transactions", "balance_transactions.list", self._balance_transaction_list),
                (
                    "GET",
                    r"/v1/balance_transactions/([\w-]+)",
                    "balance_transactions.retrieve",
                    self._balance_transaction_get,
                ),
                ("GET", r"/v1/payouts", "payouts.list", self._payout_list),
                ("POST", r"/v1/payouts", "payouts.create", self._payout_create),
                ("GET", r"/v1/payouts/([\w-]+)", "payouts.retrieve", self._payout_get),
                ("POST", r"/v1/checkout/sessions", "checkout.sessions.create", self._checkout_create),
                ("GET", r"/v1/checkout/sessions", "checkout.sessions.list", self._checkout_list),
                ("GET", r"/v1/checkout/sessions/([\w-]+)", "checkout.sessions.retrieve", self._checkout_get),
                (
                    "POST",
                    r"/v1/checkout/sessions/([\w-]+)/expire",
                    "checkout.sessions.expire",
                    self._checkout_expire,
                ),
                ("GET", r"/v1/events", "events.list", self._event_list),
                ("GET", r"/v1/events/([\w-]+)", "events.retrieve", self._event_get),
            )
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
            self._card_methods = {}
            self._checkout_extra = {}
            self._checkout_by_pi = {}
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
                self._checkout_paid(ctx, pi)  # a Checkout Session's card passed 3-D Secure: the session is paid
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
        """A pending payout arrives (``paid``) or bounces (``failed``: the money returns to the balance). A paid one
        may still fail: "a payout can show as paid and then fail" when the bank returns it days later
        (https://docs.stripe.com/payouts#payout-failures)."""
        ctx = self._control_ctx()
        with self._lock:
            po = self._find("payout", payout)
            if po["status"] != "pending" and not (po["status"] == "paid" and outcome == "failed"):
                raise ValueError(f"{payout} is already {po['status']}")
            account = self._scope[payout]
            if outcome == "paid":
                po["status"] = "paid"
            elif outcome == "failed":
                code = failure_code or "could_not_process"
                if code not in PAYOUT_FAILURES:
                    raise ValueError(f"failure_code must be one of {sorted(PAYOUT_FAILURES)}")
                po.update(status="failed", failure_code=code, failure_message=PAYOUT_FAILURES[code])
                po["failure_balance_transaction"] = self._balance_transaction(
                    account, "payout_failure", po["amount"], po["currency"], po["id"], category="payout_reversal"
                )
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
        if parts[0] == "checkout" and len(parts) in (2, 3) and request.method in ("GET", "POST"):
            return self._checkout_page(request, parts)
        if request.method == "GET" and len(parts) == 2 and parts[0] in ("authenticate", "onboarding"):
            with self._lock:
                known = parts[1] in self._objects
            if not known:
                return json_response({"error": f"no such object {parts[1][:40]}"}, status=404)
            if parts[0] == "authenticate":
                with self._lock:
                    pi = self._objects[parts[1]]
                    amount = money_text(pi.get("amount", 0), pi.get("currency") or "usd")
                return _form_page(
                    "Confirm this payment with your bank",
                    f"3-D Secure check (Stripe sandbox): your bank asks you to confirm the payment of {amount} "
                    f"({parts[1]}).",
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

    def _checkout_page(self, request: Request, parts: list[str]) -> Response:
        """The hosted Checkout page of session ``parts[1]``: GET shows it, POST pays with the typed card, and
        ``<id>/return`` is where 3-D Secure sends the card holder back (``checkout.py`` says what each does)."""
        session_id = parts[1]
        returning = len(parts) == 3
        if returning and (parts[2] != "return" or request.method != "GET"):
            return json_response({"error": "no such page"}, status=404)
        try:
            session, extra = self.checkout_view(session_id)
        except KeyError:
            response = _page("Stripe sandbox", "No such Checkout Session.")
            response.status_code = 404
            return response
        if request.method == "GET":
            target = success_redirect(session)
            if session["status"] == "complete" and target:
                return Response(status=303, headers={"Location": target})
            # Back from 3-D Secure without success: the page says why, and takes another card.
            alert = extra["last_error"] if returning else None
            return Response(
                checkout_page(session, extra, alert=alert), status=402 if alert else 200, mimetype="text/html"
            )
        # Bounded however the body comes (a chunked one has no Content-Length to check first).
        request.max_content_length = MAX_PAGE_FORM_BYTES
        try:
            form = {k: request.form.get(k, "")[:64] for k in ("number", "expiry", "cvc", "name")}
        except RequestEntityTooLarge:
            return json_response({"error": "form too large"}, status=413)
        ctx = _Ctx("checkout.page", None, None, wire.new_id("req_", 14), request.host_url, API_VERSION)
        with self._lock:
            outcome, detail = self.checkout_pay(ctx, session_id, form)
        self._after(ctx)
        session, extra = self.checkout_view(session_id)
        if outcome == "authenticate":
            return Response(status=303, headers={"Location": detail["url"]})
        if outcome in ("paid", "closed"):
            target = success_redirect(session)
            if session["status"] == "complete" and target:
                return Response(status=303, headers={"Location": target})
            return Response(checkout_page(session, extra), mimetype="text/html")
        kept = {k: v for k, v in form.items() if k != "cvc"}
        if outcome == "problems":
            return Response(
                checkout_page(session, extra, values=kept, problems=detail), status=400, mimetype="text/html"
            )
        return Response(
            checkout_page(session, extra, values=kept, alert=detail["message"]), status=402, mimetype="text/html"
        )

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
        for method, pattern, operation, handler, allowed in self._routes:  # noqa: B007 (the match is used below)
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
        wire.known_params(params, allowed)
        check_expand(operation, wire.expand_paths(params))
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
            self._expand(payload, wire.expand_paths(params))
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


def start_stripe_sandbox(host: str = "127.0.0.1", port: int = 0, **options: Any) -> StripeSandbox:
    """Build a ``StripeSandbox`` (``options`` go to its constructor) and serve it on a daemon thread."""
    sandbox = StripeSandbox(**options)
    sandbox.start(host, port)
    return sandbox
