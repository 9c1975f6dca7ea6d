"""The provider portal's Payouts page: what the marketplace owes the organisation, its Stripe Connect account,
its payouts and the monthly statements.

Owners only (money leaves for a bank account): other members get 403, anyone outside a provider organisation
404 (``views._membership``). Each view calls one service of ``marketplace.billing.payouts``.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from marketplace.billing.payout_contents import payout_contents
from marketplace.billing.payouts import (
    CURRENCY,
    PayoutRefused,
    connect_onboard,
    connect_refresh,
    payable_minor,
    payout_run,
)
from marketplace.billing.stripe_gateway import PaymentError, PaymentUnavailable
from marketplace.models import ConnectAccount, Payout, PayoutState
from marketplace.money import from_minor
from marketplace.portal.selectors import Permission
from marketplace.portal.views import _membership, _page

HISTORY = 50  # payouts listed, newest first
STATEMENT_MONTHS = 12


def _major(amount_minor: int) -> Decimal:
    """Minor units (cents) as an amount to show, two decimals (USD's minor unit)."""
    return from_minor(amount_minor, "USD")


def _months(today: dt.date, count: int) -> list[str]:
    """This month and the ``count - 1`` before it, as ``YYYY-MM``, newest first."""
    year, month, out = today.year, today.month, []
    for _ in range(count):
        out.append(f"{year:04d}-{month:02d}")
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
    return out


@login_required
@require_GET
def payouts(request: HttpRequest) -> HttpResponse:
    """The payable balance, the Connect account's status and what Stripe still needs, the payout history with
    each failure's reason, and links to the monthly statements."""
    membership = _membership(request, Permission.DETAILS)
    organization = membership.organization
    connect = ConnectAccount.objects.filter(organization=organization).first()
    contents = payout_contents(organization)
    history = [
        (payout, _major(payout.amount_minor), [(i, _major(i.amount_minor)) for i in contents.get(payout.public_id, [])])
        for payout in Payout.objects.filter(organization=organization).order_by("-created_at", "-pk")[:HISTORY]
    ]
    if request.GET.get("onboarding") == "expired":
        messages.info(request, "The onboarding link expired. Continue onboarding for a new one.")
    payable = payable_minor(organization)
    minimum = int(settings.PAYOUT_MINIMUM_MINOR)
    return _page(
        request, "portal/payouts.html", membership, "payouts", connect=connect, currency=CURRENCY,
        payable=_major(payable), owed_back=_major(-payable) if payable < 0 else None, minimum=_major(minimum),
        short_of_minimum=_major(minimum - payable) if payable < minimum else None, history=history, states=PayoutState,
        months=_months(timezone.now().date(), STATEMENT_MONTHS),
        can_onboard=bool(organization.provider_profile.country),
    )  # fmt: skip


@login_required
@require_POST
def payouts_onboard(request: HttpRequest) -> HttpResponse:
    """Start (or continue) Stripe's onboarding: the organisation's Express account, made once, and a fresh
    account link; the browser goes straight on to Stripe, which sends it back to ``payouts_connect_return``."""
    membership = _membership(request, Permission.DETAILS)
    organization = membership.organization
    profile = organization.provider_profile
    if not profile.country:
        messages.error(request, "Fill in your business details (the country) before onboarding for payouts.")
        return redirect("portal:payouts")
    page = request.build_absolute_uri(reverse("portal:payouts"))
    try:
        url = connect_onboard(
            organization=organization,
            email=profile.contact_email or membership.user.email,
            country=profile.country,
            refresh_url=f"{page}?onboarding=expired",
            return_url=request.build_absolute_uri(reverse("portal:payouts-connect-return")),
        )
    except PaymentError as exc:
        messages.error(request, f"Stripe could not start the onboarding: {exc.message}")
        return redirect("portal:payouts")
    # Straight on to Stripe: one step for the provider. The site's CSP lets a form's answer lead to Stripe's
    # onboarding origin (broker.security.stripe_page_origins) and nowhere else off the site.
    return redirect(url)


@login_required
@require_GET
def payouts_connect_return(request: HttpRequest) -> HttpResponse:
    """Where Stripe sends the owner back after onboarding: re-read the account, then the Payouts page."""
    membership = _membership(request, Permission.DETAILS)
    try:
        connect = connect_refresh(membership.organization)
    except ConnectAccount.DoesNotExist:
        return redirect("portal:payouts")
    except PaymentError as exc:
        messages.error(request, f"Stripe could not confirm the account: {exc.message}")
        return redirect("portal:payouts")
    if connect.payouts_enabled:
        messages.success(request, "Your Stripe account is verified: payouts are enabled.")
    else:
        messages.info(request, "Stripe still needs some details before it enables payouts.")
    return redirect("portal:payouts")


@login_required
@require_POST
def payouts_run(request: HttpRequest) -> HttpResponse:
    """Pay the payable out now (the same run as the daily schedule's)."""
    membership = _membership(request, Permission.DETAILS)
    try:
        payout = payout_run(organization=membership.organization)
    except PayoutRefused as exc:
        messages.error(request, f"Payout refused: {exc.reason}")
        return redirect("portal:payouts")
    except PaymentUnavailable as exc:
        messages.error(request, f"Stripe is unavailable, try again later: {exc.message}")
        return redirect("portal:payouts")
    if payout is None:
        messages.info(request, "Nothing to pay out: the payable is below the minimum payout.")
    elif payout.state == PayoutState.IN_TRANSIT:
        messages.success(request, f"{_major(payout.amount_minor)} {payout.currency} is on its way to your bank.")
    elif payout.state == PayoutState.FAILED:
        messages.error(request, f"The payout failed: {payout.failure_message} The amount is payable again.")
    else:
        messages.info(request, "Stripe did not answer: the payout is sent again on the next run.")
    return redirect("portal:payouts")
