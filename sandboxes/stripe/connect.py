"""The Stripe sandbox's Connect: Express accounts and their onboarding links, transfers to them, balances and
payouts.
"""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import urlencode

from sandboxes.stripe import wire
from sandboxes.stripe.objects import ObjectStore
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
