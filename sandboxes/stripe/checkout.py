"""The Stripe sandbox's Checkout: Checkout Sessions in ``payment`` mode (create, retrieve, list, expire) and the
hosted page a session's ``url`` leads to, where a person types a card.

The API follows https://docs.stripe.com/api/checkout/sessions (create, object, list, expire); the page follows
what https://docs.stripe.com/payments/checkout describes: the customer pays on Stripe's page, is sent through 3-D
Secure when the card asks for it, sees a decline on the page and may try another card, and on success is sent
(303) to ``success_url`` with ``{CHECKOUT_SESSION_ID}`` replaced by the session's id; ``cancel_url`` is the page's
way back. A session's PaymentIntent is made when the person first submits a card (as Stripe does since API version
2022-08-01) and carries ``payment_intent_data.metadata``; a later card confirms the same PaymentIntent again.
Stripe's test card numbers (https://docs.stripe.com/testing) decide the outcome through ``test_card_behaviour``.
"""

from __future__ import annotations

import copy
import html
import re
import time
from typing import Any

from sandboxes.stripe import currencies, wire
from sandboxes.stripe.payments import PaymentHandlers
from sandboxes.stripe.shapes import new_object
from sandboxes.stripe.state import _Ctx, _luhn_ok, _now, test_card_behaviour
from sandboxes.stripe.wire import StripeError, invalid

# A session expires 24 hours after it is made unless ``expires_at`` says sooner, but not sooner than 30 minutes
# (https://docs.stripe.com/api/checkout/sessions/create#create_checkout_session-expires_at).
DEFAULT_LIFETIME_S = 24 * 3600
MIN_LIFETIME_S = 30 * 60
MAX_LINE_ITEMS = 100  # "a maximum of 100 line items" in payment mode (the create page's line_items)
MAX_QUANTITY = 999_999
MAX_PAGE_FORM_BYTES = 8 * 1024
_PRICE_DATA = frozenset({"currency", "unit_amount", "product_data"})
_PRODUCT_DATA = frozenset({"name", "description"})
_PAYMENT_INTENT_DATA = frozenset({"metadata", "setup_future_usage", "description"})
_EXPIRY = re.compile(r"^\s*(\d{1,2})\s*/?\s*(\d{2}|\d{4})\s*$")
_SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£"}


def _url(params: dict[str, Any], name: str) -> str | None:
    value = wire.string(params, name, max_len=5000)
    if value is not None and not re.match(r"^https?://[^\s]+$", value):
        raise invalid(f"Not a valid URL: {name}", param=name, code="url_invalid")
    return value


def _brand(digits: str) -> str:
    """The card brand a number's leading digits name (the prefixes of Stripe's test cards)."""
    for prefixes, brand in (
        (("34", "37"), "amex"),
        (("6011", "65"), "discover"),
        (("30", "36", "38"), "diners"),
        (("35",), "jcb"),
        (("62",), "unionpay"),
        (("4",), "visa"),
        (("5", "2"), "mastercard"),
    ):
        if digits.startswith(prefixes):
            return brand
    return "unknown"


def money_text(amount: int, currency: str) -> str:
    """``amount`` minor units as the page shows them: ``$50.00``, ``¥50``, ``12.50 CHF``."""
    text = currencies.display(amount, currency).split(" ")[0]
    symbol = _SYMBOLS.get(currency)
    return f"{symbol}{text}" if symbol else f"{text} {currency.upper()}"


def card_problems(number: str, expiry: str, cvc: str, name: str, *, today: tuple[int, int]) -> dict[str, str]:
    """What the page refuses before any charge, field by field, as Stripe's card form does: the number's length and
    Luhn check digit, an expiry (MM / YY) in the past or malformed, a CVC of other than 3 or 4 digits, no name.
    ``today`` is (year, month); a card is valid through the end of its expiry month."""
    problems: dict[str, str] = {}
    digits = number.replace(" ", "").replace("-", "")
    if not (digits.isascii() and digits.isdigit()) or len(digits) < 12:
        problems["number"] = "Your card number is incomplete."
    elif len(digits) > 19 or not _luhn_ok(digits):
        problems["number"] = "Your card number is invalid."
    match = _EXPIRY.match(expiry)
    if match is None:
        problems["expiry"] = "Your card's expiration date is incomplete."
    else:
        month, year = int(match.group(1)), int(match.group(2))
        year = year + 2000 if year < 100 else year
        if not 1 <= month <= 12:
            problems["expiry"] = "Your card's expiration month is invalid."
        elif (year, month) < today:
            problems["expiry"] = "Your card's expiration date is in the past."
        elif year > today[0] + 50:
            problems["expiry"] = "Your card's expiration year is invalid."
    if not (cvc.isascii() and cvc.isdigit() and 3 <= len(cvc) <= 4):
        problems["cvc"] = "Your card's security code is incomplete."
    if not name.strip():
        problems["name"] = "Enter the name on the card."
    return problems


class CheckoutHandlers(PaymentHandlers):
    """Checkout Sessions and their hosted page, mixed into ``StripeSandbox``."""

    _checkout_extra: dict[str, dict[str, Any]]  # session id -> what the object does not show (line items, PI data)
    _checkout_by_pi: dict[str, str]  # PaymentIntent id -> the session that made it

    # ------------------------------------------------------------------------------------------ API

    def _checkout_create(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/checkout/sessions/create, ``mode=payment`` with ``price_data`` line items."""
        mode = wire.string(params, "mode", required=True, max_len=20)
        if mode != "payment":
            raise invalid(
                f"Invalid mode: {mode!s:.20}; the sandbox emulates Checkout in payment mode only.", param="mode"
            )
        items, currency, total = self._line_items(params)
        customer = wire.string(params, "customer", max_len=255)
        if customer is not None:
            self._lookup(ctx, "customer", customer, "customer")
        methods = params.get("payment_method_types")
        if methods is not None and methods != ["card"]:
            raise invalid(
                "The sandbox's Checkout takes payment_method_types [card] only.", param="payment_method_types"
            )
        now = _now()
        expires_at = now + DEFAULT_LIFETIME_S
        text = wire.string(params, "expires_at", max_len=12)
        if text is not None:
            if not text.isdigit() or not now + MIN_LIFETIME_S <= int(text) <= now + DEFAULT_LIFETIME_S:
                raise invalid(
                    "The `expires_at` timestamp must be between 30 minutes and 24 hours from Checkout Session "
                    "creation.",
                    param="expires_at",
                )
            expires_at = int(text)
        session = new_object(
            "checkout.session",
            id=wire.new_id("cs_test_", 58),
            amount_subtotal=total,
            amount_total=total,
            cancel_url=_url(params, "cancel_url"),
            client_reference_id=wire.string(params, "client_reference_id", max_len=200),
            created=now,
            currency=currency,
            customer=customer,
            customer_creation=None if customer else "if_required",
            expires_at=expires_at,
            metadata=wire.metadata(params),
            payment_method_collection="if_required",
            success_url=_url(params, "success_url"),
        )
        session["url"] = f"{ctx.host_url}_sandbox/stripe/checkout/{session['id']}"
        self._checkout_extra[session["id"]] = {
            "line_items": items,
            "payment_intent_data": self._payment_intent_data(params),
        }
        return copy.deepcopy(self._store(ctx, session))

    @staticmethod
    def _line_items(params: dict[str, Any]) -> tuple[list[dict[str, Any]], str, int]:
        """The ``line_items`` (each ``price_data`` + ``quantity``), their one currency and their total."""
        items = params.get("line_items")
        if items is None or items == "":
            raise invalid("Missing required param: line_items.", param="line_items", code="parameter_missing")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_LINE_ITEMS:
            raise invalid(f"line_items must be a list of 1 to {MAX_LINE_ITEMS} items.", param="line_items")
        kept, currencies_seen, total = [], set(), 0
        for index, item in enumerate(items):
            where = f"line_items[{index}]"
            if not isinstance(item, dict):
                raise invalid(f"Invalid object: {where}", param=where)
            for key in item:
                if key not in ("price_data", "quantity"):
                    raise invalid(f"Received unknown parameter: {where}[{key[:40]}]", code="parameter_unknown")
            price = item.get("price_data")
            if not isinstance(price, dict):
                raise invalid(f"Missing required param: {where}[price_data].", code="parameter_missing")
            product = price.get("product_data")
            for key in price:
                if key not in _PRICE_DATA:
                    raise invalid(
                        f"Received unknown parameter: {where}[price_data][{key[:40]}]", code="parameter_unknown"
                    )
            if not isinstance(product, dict):
                raise invalid(f"Missing required param: {where}[price_data][product_data].", code="parameter_missing")
            for key in product:
                if key not in _PRODUCT_DATA:
                    raise invalid(
                        f"Received unknown parameter: {where}[price_data][product_data][{key[:40]}]",
                        code="parameter_unknown",
                    )
            name = wire.string(product, "name", required=True, max_len=250)
            currencies_seen.add(wire.currency(price))
            unit = wire.amount(price, "unit_amount") or 0
            quantity_text = wire.string(item, "quantity", required=True, max_len=7) or ""
            if not quantity_text.isdigit() or not 1 <= int(quantity_text) <= MAX_QUANTITY:
                raise invalid(f"Invalid integer: {where}[quantity]", param=f"{where}[quantity]")
            total += unit * int(quantity_text)
            kept.append({"name": name, "unit_amount": unit, "quantity": int(quantity_text)})
        if len(currencies_seen) != 1:
            raise invalid("All line_items must be in the same currency.", param="line_items")
        currency = currencies_seen.pop()
        floor = currencies.MINIMUM_CHARGE.get(currency, 1)
        if total < floor:
            raise invalid(
                "The Checkout Session's total amount due must add up to at least "
                f"{currencies.display(floor, currency)}",
                param="line_items",
                code="amount_too_small",
            )
        if total > wire.MAX_AMOUNT:
            raise invalid(
                f"Amount must be no more than {wire.MAX_AMOUNT}.", param="line_items", code="amount_too_large"
            )
        return kept, currency, total

    @staticmethod
    def _payment_intent_data(params: dict[str, Any]) -> dict[str, Any]:
        """``payment_intent_data``: what the session's PaymentIntent is made with."""
        data = params.get("payment_intent_data")
        if data is None or data == "":
            return {"metadata": {}, "setup_future_usage": None, "description": None}
        if not isinstance(data, dict):
            raise invalid("Invalid object: payment_intent_data", param="payment_intent_data")
        for key in data:
            if key not in _PAYMENT_INTENT_DATA:
                raise invalid(f"Received unknown parameter: payment_intent_data[{key[:40]}]", code="parameter_unknown")
        usage = wire.string(data, "setup_future_usage", max_len=20)
        if usage not in (None, "on_session", "off_session"):
            raise invalid(
                "Invalid payment_intent_data[setup_future_usage]: must be one of on_session, off_session",
                param="payment_intent_data[setup_future_usage]",
            )
        return {
            "metadata": wire.metadata(data),
            "setup_future_usage": usage,
            "description": wire.string(data, "description", max_len=1000),
        }

    def _checkout_get(self, ctx: _Ctx, params: dict[str, Any], session_id: str) -> dict[str, Any]:
        session = self._lookup(ctx, "checkout.session", session_id)
        self._checkout_lapse(ctx, session)
        return copy.deepcopy(session)

    def _checkout_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/checkout/sessions/list, filtered by ``customer``, ``payment_intent`` or
        ``status``."""
        customer = wire.string(params, "customer", max_len=255)
        intent = wire.string(params, "payment_intent", max_len=255)
        status = wire.string(params, "status", max_len=20)
        for session in [o for o in self._objects.values() if o["object"] == "checkout.session"]:
            self._checkout_lapse(ctx, session)
        return self._page(
            ctx,
            "checkout.session",
            params,
            "/v1/checkout/sessions",
            lambda s: (
                customer in (None, s["customer"])
                and intent in (None, s["payment_intent"])
                and status in (None, s["status"])
            ),
        )

    def _checkout_expire(self, ctx: _Ctx, params: dict[str, Any], session_id: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/checkout/sessions/expire: only an open session; emits
        checkout.session.expired."""
        session = self._lookup(ctx, "checkout.session", session_id)
        self._checkout_lapse(ctx, session)
        if session["status"] != "open":
            raise invalid(
                f'Only Checkout Sessions with a status in ["open"] can be expired. This Checkout Session has a '
                f'status of "{session["status"]}".'
            )
        self._checkout_end(ctx, session, "expired")
        return copy.deepcopy(session)

    def _checkout_lapse(self, ctx: _Ctx, session: dict[str, Any]) -> None:
        """An open session past its ``expires_at`` is expired, as Stripe expires it; lock held."""
        if session["status"] == "open" and _now() >= session["expires_at"]:
            self._checkout_end(ctx, session, "expired")

    def _checkout_end(self, ctx: _Ctx, session: dict[str, Any], status: str) -> None:
        # A finished session no longer offers its page (``url`` is null once it is complete or expired).
        session.update(status=status, url=None)
        self._emit(ctx, f"checkout.session.{'completed' if status == 'complete' else status}", session)

    # ----------------------------------------------------------------------------------- the page

    def checkout_pay(self, ctx: _Ctx, session_id: str, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """A card submitted on the hosted page. Answers what the page does next, with the session as it is now:
        ``("problems", {field: message})``, ``("declined", {"message"})``, ``("authenticate", {"url"})``,
        ``("paid", {})`` or ``("closed", {})``; lock held."""
        session = self._find("checkout.session", session_id)
        self._checkout_lapse(ctx, session)
        if session["status"] != "open":
            return "closed", {}
        today = time.gmtime()
        number, name = form.get("number", ""), form.get("name", "")
        problems = card_problems(number, form.get("expiry", ""), form.get("cvc", ""), name, today=today[:2])
        if problems:
            return "problems", problems
        digits = number.replace(" ", "").replace("-", "")
        method = wire.new_id("pm_")
        self._card_methods[method] = (test_card_behaviour(digits), _brand(digits))
        pi = self._checkout_intent(ctx, session)
        pi["payment_method"] = method
        self._checkout_extra[session_id]["name"] = name.strip()[:200]
        return_url = f"{ctx.host_url}_sandbox/stripe/checkout/{session_id}/return"
        try:
            self._confirm(ctx, pi, {"return_url": return_url})
        except StripeError as exc:
            return "declined", {"message": str(exc.error.get("message") or "Your card was declined.")}
        if pi["status"] == "requires_action":
            return "authenticate", {"url": pi["next_action"]["redirect_to_url"]["url"]}
        self._checkout_paid(ctx, pi)
        return "paid", {}

    def _checkout_intent(self, ctx: _Ctx, session: dict[str, Any]) -> dict[str, Any]:
        """The session's PaymentIntent, made on the first card with ``payment_intent_data``; lock held."""
        if session["payment_intent"] is not None:
            return self._objects[session["payment_intent"]]
        data = self._checkout_extra[session["id"]]["payment_intent_data"]
        pi = new_object(
            "payment_intent",
            id=wire.new_id("pi_"),
            created=_now(),
            amount=session["amount_total"],
            currency=session["currency"],
            customer=session["customer"],
            description=data["description"],
            metadata=copy.deepcopy(data["metadata"]),
            setup_future_usage=data["setup_future_usage"],
        )
        pi["client_secret"] = f"{pi['id']}_secret_{wire.new_id('', 24)}"
        self._store(ctx, pi, self._scope[session["id"]])
        self._checkout_by_pi[pi["id"]] = session["id"]
        session["payment_intent"] = pi["id"]
        return pi

    def _checkout_paid(self, ctx: _Ctx, pi: dict[str, Any]) -> None:
        """The session whose PaymentIntent just succeeded is complete and paid; lock held."""
        session_id = self._checkout_by_pi.get(pi["id"])
        if session_id is None or pi["status"] != "succeeded":
            return
        session = self._objects[session_id]
        customer = self._objects.get(session["customer"] or "") or {}
        session["payment_status"] = "paid"
        session["customer_details"] = {
            "address": None,
            "email": customer.get("email"),
            "name": self._checkout_extra[session_id].get("name"),
            "phone": None,
            "tax_exempt": "none",
            "tax_ids": [],
        }
        self._checkout_end(ctx, session, "complete")

    def checkout_view(self, session_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A session and what its page shows (line items, the last card error); KeyError when there is none."""
        with self._lock:  # type: ignore[attr-defined]
            session = self._find("checkout.session", session_id)
            self._checkout_lapse(self._control_ctx(), session)
            extra = copy.deepcopy(self._checkout_extra[session_id])
            pi = self._objects.get(session["payment_intent"] or "") or {}
            extra["last_error"] = (pi.get("last_payment_error") or {}).get("message")
            return copy.deepcopy(session), extra


def success_redirect(session: dict[str, Any]) -> str | None:
    """Where a paid session sends the customer: ``success_url`` with ``{CHECKOUT_SESSION_ID}`` replaced
    (https://docs.stripe.com/payments/checkout/custom-success-page)."""
    url = session["success_url"]
    return url.replace("{CHECKOUT_SESSION_ID}", session["id"]) if url else None


PAGE_STYLE = """
*{box-sizing:border-box}body{margin:0;font:16px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1a1f36;
background:#f6f8fa}.test{background:#ffde92;color:#5c3b00;text-align:center;font-size:14px;padding:6px 12px}
main{max-width:920px;margin:0 auto;padding:40px 24px;display:flex;gap:56px;flex-wrap:wrap}
.summary{flex:1 1 300px}.pay{flex:1 1 360px;background:#fff;border-radius:8px;padding:28px;
box-shadow:0 2px 6px rgba(0,0,0,.08)}a.back{color:#4f566b;text-decoration:none;font-size:15px}
a.back:hover{text-decoration:underline}.summary h1{font-size:17px;color:#4f566b;font-weight:500;margin:28px 0 4px}
.amount{font-size:36px;font-weight:600;margin:0 0 20px}.item{display:flex;justify-content:space-between;
border-top:1px solid #e3e8ee;padding-top:14px;color:#4f566b}h2{font-size:18px;margin:0 0 18px}
label{display:block;font-size:14px;font-weight:500;color:#3c4257;margin:14px 0 6px}
input{width:100%;font:inherit;padding:10px 12px;border:1px solid #c9ced6;border-radius:6px;background:#fff}
input:focus{outline:2px solid #635bff;outline-offset:1px;border-color:#635bff}
input[aria-invalid=true]{border-color:#c0123c}.row{display:flex;gap:12px}.row>div{flex:1}
.field-error{color:#c0123c;font-size:14px;margin:6px 0 0}
.alert{background:#fde8ec;border:1px solid #f3b4c2;color:#8a0c2b;border-radius:6px;padding:10px 12px;margin:0 0 14px}
button{width:100%;margin-top:22px;font:inherit;font-weight:600;color:#fff;background:#635bff;border:0;
border-radius:6px;padding:12px}button:hover{background:#5146e0}button.quiet{background:#fff;color:#3c4257;
border:1px solid #c9ced6}button.quiet:hover{background:#f6f8fa}.panel{display:block;max-width:440px;margin:48px auto;
background:#fff;border-radius:8px;padding:28px;box-shadow:0 2px 6px rgba(0,0,0,.08)}
.panel h1{font-size:20px;margin:0 0 12px}
.note{font-size:13px;color:#697386;margin-top:14px}
"""


def checkout_page(
    session: dict[str, Any],
    extra: dict[str, Any],
    *,
    values: dict[str, str] | None = None,
    problems: dict[str, str] | None = None,
    alert: str | None = None,
) -> str:
    """The hosted page: what is bought, then a card form with a label and, when refused, an error for each field."""
    values, problems = values or {}, problems or {}
    esc = html.escape
    total = money_text(session["amount_total"], session["currency"])
    title = extra["line_items"][0]["name"] if extra["line_items"] else "Payment"
    items = "".join(
        f'<div class="item"><span>{esc(i["name"])}{" x " + str(i["quantity"]) if i["quantity"] > 1 else ""}</span>'
        f"<span>{esc(money_text(i['unit_amount'] * i['quantity'], session['currency']))}</span></div>"
        for i in extra["line_items"]
    )
    items = items if len(extra["line_items"]) > 1 else ""  # one item: its name and the total say it all, as on Stripe's
    back = (
        f'<a class="back" href="{esc(session["cancel_url"])}">&larr; Back to the site</a>'
        if session["cancel_url"]
        else ""
    )

    def field(name: str, label: str, autocomplete: str, placeholder: str, inputmode: str = "text") -> str:
        error = problems.get(name)
        described = f' aria-invalid="true" aria-describedby="{name}-error"' if error else ""
        message = f'<p class="field-error" id="{name}-error">{esc(error)}</p>' if error else ""
        return (
            f'<label for="{name}">{label}</label><input id="{name}" name="{name}" autocomplete="{autocomplete}" '
            f'inputmode="{inputmode}" placeholder="{placeholder}" value="{esc(values.get(name, ""))}" '
            f'maxlength="64" required{described}>{message}'
        )

    if session["status"] != "open":
        done = "This payment is complete." if session["status"] == "complete" else "This Checkout Session has expired."
        form = f"<h2>{esc(done)}</h2><p>You may close this page.</p>"
    else:
        shown = f'<div class="alert" role="alert">{esc(alert)}</div>' if alert else ""
        form = (
            f'<h2>Pay with card</h2>{shown}<form method="post" novalidate>'
            + field("number", "Card number", "cc-number", "1234 1234 1234 1234", "numeric")
            + '<div class="row"><div>'
            + field("expiry", "Expiry (MM / YY)", "cc-exp", "MM / YY", "numeric")
            + "</div><div>"
            + field("cvc", "CVC", "cc-csc", "CVC", "numeric")
            + "</div></div>"
            + field("name", "Name on card", "cc-name", "Full name")
            + f'<button type="submit">Pay {esc(total)}</button></form>'
            '<p class="note">Stripe sandbox: use a test card such as 4242 4242 4242 4242 with any future expiry and '
            "any CVC. Nothing is charged.</p>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Pay {esc(total)} · Stripe sandbox Checkout</title><style>{PAGE_STYLE}</style></head><body>"
        '<div class="test" role="note">Test mode: Stripe sandbox</div><main>'
        f'<section class="summary" aria-label="Order summary">{back}<h1>{esc(title)}</h1>'
        f'<p class="amount">{esc(total)}</p>{items}</section>'
        f'<section class="pay" aria-label="Payment">{form}</section></main></body></html>'
    )
