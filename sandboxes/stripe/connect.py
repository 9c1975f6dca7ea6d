"""The Stripe sandbox's Connect: Express accounts and their onboarding links, transfers to them, balances,
payouts, and the balance transactions each leaves on both sides.
"""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import urlencode

from sandboxes.stripe import wire
from sandboxes.stripe.objects import ObjectStore
from sandboxes.stripe.shapes import new_object
from sandboxes.stripe.state import ONBOARDING_DUE, _Ctx, _now
from sandboxes.stripe.wire import invalid, missing


class ConnectHandlers(ObjectStore):
    """Connect accounts, account links, transfers, balances and payouts, mixed into ``StripeSandbox``."""

    _balances: dict[str, dict[str, int]]

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
        acct = self._base("acct_", "account", params, type="express", country=country)
        acct.update(email=wire.string(params, "email", max_len=512), default_currency="usd")
        acct["capabilities"] = {name: "inactive" for name in names}
        acct["requirements"].update(
            currently_due=list(ONBOARDING_DUE),
            eventually_due=list(ONBOARDING_DUE),
            past_due=list(ONBOARDING_DUE),
            disabled_reason="requirements.past_due",
        )
        self._store(ctx, acct, "")
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
        return new_object("account_link", created=created, expires_at=created + 300, url=url)

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
        group = wire.string(params, "transfer_group", max_len=255)
        transfer = self._base("tr_", "transfer", params, amount=amount, currency=currency, destination=destination)
        transfer.update(description=wire.string(params, "description"), transfer_group=group)
        transfer["balance_transaction"] = self._balance_transaction(
            ctx.account or "", "transfer", -(amount or 0), currency, transfer["id"]
        )
        transfer["destination_payment"] = self._destination_payment(transfer)
        self._store(ctx, transfer)
        funds = self._balances.setdefault(destination, {})
        funds[currency] = funds.get(currency, 0) + (amount or 0)
        self._emit(ctx, "transfer.created", transfer)
        return copy.deepcopy(transfer)

    def _destination_payment(self, transfer: dict[str, Any]) -> str:
        """The payment a transfer makes on the connected account: a ``py_`` charge there whose balance transaction
        is of type ``payment`` (https://docs.stripe.com/connect/separate-charges-and-transfers); lock held."""
        payment = new_object(
            "charge",
            id=wire.new_id("py_"),
            created=transfer["created"],
            amount=transfer["amount"],
            amount_captured=transfer["amount"],
            captured=True,
            currency=transfer["currency"],
            paid=True,
            source_transfer=transfer["id"],
            status="succeeded",
        )
        destination = transfer["destination"]
        payment["balance_transaction"] = self._balance_transaction(
            destination, "payment", transfer["amount"], transfer["currency"], payment["id"], category="charge"
        )
        self._objects[payment["id"]] = payment
        self._scope[payment["id"]] = destination
        return str(payment["id"])

    def _transfer_get(self, ctx: _Ctx, params: dict[str, Any], transfer: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "transfer", transfer))

    def _transfer_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/transfers/list, filtered by ``destination`` or ``transfer_group``."""
        destination = wire.string(params, "destination", max_len=255)
        group = wire.string(params, "transfer_group", max_len=255)
        return self._page(
            ctx,
            "transfer",
            params,
            "/v1/transfers",
            lambda t: destination in (None, t["destination"]) and group in (None, t["transfer_group"]),
        )

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
        payout = self._base("po_", "payout", params, amount=amount, currency=currency, status="pending")
        payout.update(arrival_date=payout["created"] + 2 * 86400, description=wire.string(params, "description"))
        payout.update(statement_descriptor=wire.string(params, "statement_descriptor", max_len=22))
        payout["destination"] = "ba_" + account.removeprefix("acct_")[:24]
        payout["balance_transaction"] = self._balance_transaction(
            account, "payout", -amount, currency, payout["id"], description=payout["description"] or "STRIPE PAYOUT"
        )
        self._store(ctx, payout)
        return copy.deepcopy(payout)

    def _payout_get(self, ctx: _Ctx, params: dict[str, Any], payout: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "payout", payout))

    def _payout_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/payouts/list of the acting account, filtered by ``status``."""
        status = wire.string(params, "status", max_len=20)
        return self._page(ctx, "payout", params, "/v1/payouts", lambda p: status in (None, p["status"]))

    def _balance_transaction_get(self, ctx: _Ctx, params: dict[str, Any], txn: str) -> dict[str, Any]:
        return copy.deepcopy(self._lookup(ctx, "balance_transaction", txn))

    def _balance_transaction_list(self, ctx: _Ctx, params: dict[str, Any], _: str) -> dict[str, Any]:
        """https://docs.stripe.com/api/balance_transactions/list of the acting account, filtered by ``type``,
        ``source`` and ``currency`` (``payout`` is for automatic payouts only, which the sandbox does not make)."""
        type_ = wire.string(params, "type", max_len=40)
        source = wire.string(params, "source", max_len=255)
        currency = wire.currency(params) if params.get("currency") else None
        return self._page(
            ctx,
            "balance_transaction",
            params,
            "/v1/balance_transactions",
            lambda t: (
                type_ in (None, t["type"]) and source in (None, t["source"]) and currency in (None, t["currency"])
            ),
        )
