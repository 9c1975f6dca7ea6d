"""The storefront's Billing page: prepaid credit and what running orders hold, card top-ups (on Stripe's hosted
Checkout page; a saved card charged from here, 3-D Secure's extra step included), the billing country and auto
top-up, and email verification."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.billing.book import BookError, book_account_balance, credit_available
from marketplace.billing.credit import CURRENCY, money
from marketplace.billing.payments import (
    MAX_TOPUP_MINOR,
    MIN_TOPUP_MINOR,
    CheckoutRequest,
    TopUpRefused,
    TopUpRequest,
    billing_profile_read,
    email_verified,
    topup_action_deadline,
    topup_cancel,
    topup_checkout_start,
    topup_refresh,
    topup_start,
)
from marketplace.billing.stripe_gateway import PaymentError
from marketplace.billing.vat_ids import VatIdInvalid, tax_id_for_profile
from marketplace.billing.verification import (
    VerificationFailed,
    email_verification_send,
    email_verification_token,
    email_verify,
)
from marketplace.models import BookAccountKind, Organization
from marketplace.models.billing import BillingProfile, TopUp, TopUpState
from marketplace.numbers import DecimalFormField
from marketplace.orders.selectors import BuyerPermission, buyer_role_allows
from marketplace.portal.countries import COUNTRIES
from marketplace.web.orgs import buyer_access
from providers.text import name_problem

# Stripe's test PaymentMethods (https://docs.stripe.com/testing): offered beside the saved card while payments go
# to a sandbox, a shortcut past the hosted page for trying each outcome. A card is otherwise typed only on the
# hosted Checkout page.
TEST_CARDS = [
    ("pm_card_visa", "Visa ending 4242 (succeeds)"),
    ("pm_card_authenticationRequired", "Visa ending 3184 (asks for 3-D Secure)"),
    ("pm_card_chargeDeclined", "Visa ending 0002 (declined)"),
    ("pm_card_chargeDeclinedInsufficientFunds", "Visa ending 9995 (declined: insufficient funds)"),
]


def _sandbox_payments() -> bool:
    return "api.stripe.com" not in settings.STRIPE_API_BASE


def _amount_field() -> DecimalFormField:
    return DecimalFormField(
        label="Amount (USD)",
        min_value=Decimal(MIN_TOPUP_MINOR) / 100,
        max_value=Decimal(MAX_TOPUP_MINOR) / 100,
        max_digits=10,
        decimal_places=2,
        initial=Decimal(50),
    )


class CheckoutForm(forms.Form):
    """A top-up paid on Stripe's hosted page, where the card is typed."""

    amount = _amount_field()
    save_card = forms.BooleanField(label="Save the card for auto top-up", required=False)


class TopUpForm(forms.Form):
    """A top-up charged to a card Stripe already holds: the saved one, or (sandbox only) a test PaymentMethod."""

    amount = _amount_field()
    payment_method = forms.ChoiceField(label="Card", choices=[])
    save_card = forms.BooleanField(label="Save this card for auto top-up", required=False)

    def __init__(self, *args, saved: str = "", **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        choices = list(TEST_CARDS) if _sandbox_payments() else []
        if saved and saved not in dict(choices):
            choices.insert(0, (saved, f"Saved card ({saved})"))
        field = self.fields["payment_method"]
        field.choices, field.initial = choices, saved or None  # type: ignore[attr-defined]


class ProfileForm(forms.Form):
    country = forms.ChoiceField(
        label="Billing country", choices=[("", "choose…"), *sorted(COUNTRIES.items(), key=lambda kv: kv[1])]
    )
    tax_id = forms.CharField(label="Tax id (VAT number)", required=False, max_length=32)

    def clean_tax_id(self) -> str:
        value = self.cleaned_data["tax_id"].strip()
        problem = name_problem(value) if value else None
        if problem:
            raise forms.ValidationError(problem)
        return value

    auto_topup_below = DecimalFormField(
        label="Auto top-up when credit falls below (USD)",
        required=False,
        min_value=Decimal(0),
        max_value=Decimal(MAX_TOPUP_MINOR) / 100,
        decimal_places=2,
    )
    auto_topup_amount = DecimalFormField(
        label="Auto top-up amount (USD)",
        required=False,
        min_value=Decimal(MIN_TOPUP_MINOR) / 100,
        max_value=Decimal(MAX_TOPUP_MINOR) / 100,
        decimal_places=2,
    )

    def clean(self):  # type: ignore[no-untyped-def]
        data = super().clean()
        if (data.get("auto_topup_below") is None) != (data.get("auto_topup_amount") is None):
            raise forms.ValidationError("Give both auto top-up figures, or neither to turn it off.")
        if data.get("country") and "tax_id" in data:
            try:
                data["tax_id"] = tax_id_for_profile(data["country"], data["tax_id"])
            except VatIdInvalid as exc:
                self.add_error("tax_id", str(exc))
        return data


@login_required
@require_http_methods(["GET", "POST"])
def billing(request: HttpRequest) -> HttpResponse:
    """Credit, holds, top-ups and billing details; owners top up and change the details."""
    membership = buyer_access(request, BuyerPermission.PAY if request.method == "POST" else BuyerPermission.READ)
    organization = membership.organization
    can_pay = buyer_role_allows(membership.role, BuyerPermission.PAY)
    profile = billing_profile_read(organization)  # a save below makes it
    topup_form = TopUpForm(saved=profile.payment_method)
    checkout_form = CheckoutForm(auto_id="checkout_%s")  # ids apart from the saved-card form's on the same page
    profile_form = ProfileForm(
        initial={
            "country": profile.country,
            "tax_id": profile.tax_id,
            "auto_topup_below": None
            if profile.auto_topup_below_minor is None
            else Decimal(profile.auto_topup_below_minor) / 100,
            "auto_topup_amount": None
            if profile.auto_topup_amount_minor is None
            else Decimal(profile.auto_topup_amount_minor) / 100,
        }
    )
    status = 200
    if request.method == "POST" and request.POST.get("action") == "checkout":
        checkout_form = CheckoutForm(request.POST, auto_id="checkout_%s")
        if checkout_form.is_valid():
            return _checkout(request, organization, checkout_form)
        status = 400
    elif request.method == "POST" and request.POST.get("action") == "topup":
        topup_form = TopUpForm(request.POST, saved=profile.payment_method)
        if topup_form.is_valid():
            return _topup(request, organization, topup_form)
        status = 400
    elif request.method == "POST" and request.POST.get("action") == "cancel_topup":
        return _cancel_topup(request, organization)
    elif request.method == "POST" and request.POST.get("action") == "profile":
        profile_form = ProfileForm(request.POST)
        if profile_form.is_valid():
            data = profile_form.cleaned_data
            if data["auto_topup_below"] is not None and not profile.payment_method:
                profile_form.add_error(None, "Auto top-up charges a saved card: top up once with “Save this card”.")
                status = 400
            else:
                profile.country, profile.tax_id = data["country"], data["tax_id"].strip()
                below, amount = data["auto_topup_below"], data["auto_topup_amount"]
                profile.auto_topup_below_minor = None if below is None else int(below * 100)
                profile.auto_topup_amount_minor = None if amount is None else int(amount * 100)
                profile.save()
                messages.success(request, "Billing details saved.")
                return redirect("storefront:billing")
        else:
            status = 400
    held = -book_account_balance(kind=BookAccountKind.ORDER_HOLD, currency=CURRENCY, organization=organization)
    authenticate = None
    try:
        wanted = uuid.UUID(request.GET.get("authenticate", ""))
    except ValueError:
        wanted = None
    if wanted is not None:
        authenticate = TopUp.objects.filter(
            organization=organization, public_id=wanted, state=TopUpState.REQUIRES_ACTION
        ).first()
    if request.GET.get("checkout") == "cancelled":
        messages.warning(request, "Payment not completed: you left the card page, and nothing was charged.")
    resume = request.GET.get("resume", "")
    resume_url = (
        f"{reverse('storefront:order-confirm')}?draft={resume}" if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", resume) else ""
    )
    return render(
        request,
        "storefront/billing.html",
        {
            "organization": organization,
            "can_pay": can_pay,
            "profile": profile,
            "country_name": COUNTRIES.get(profile.country, ""),
            "available": Decimal(credit_available(organization, CURRENCY)) / 100,
            "held": Decimal(held) / 100,
            "topups": _topups_shown(organization),
            "topup_form": topup_form,
            "checkout_form": checkout_form,
            "card_choices": bool(topup_form.fields["payment_method"].choices),  # type: ignore[attr-defined]
            "profile_form": profile_form,
            "email_verified": email_verified(request.user),  # type: ignore[arg-type]
            "sandbox": _sandbox_payments(),
            "authenticate": authenticate,
            "resume_url": resume_url,
        },
        status=status,
    )


def _checkout(request: HttpRequest, organization: Organization, form: CheckoutForm) -> HttpResponse:
    data = form.cleaned_data
    key = request.POST.get("nonce", "")[:64] or uuid.uuid4().hex  # a double submit opens one page
    billing_url = request.build_absolute_uri(reverse("storefront:billing"))
    try:
        topup = topup_checkout_start(
            organization=organization,
            user=request.user,  # type: ignore[arg-type]
            request=CheckoutRequest(
                amount_minor=int(data["amount"] * 100),
                # Stripe puts the session's id in place of {CHECKOUT_SESSION_ID}
                # (https://docs.stripe.com/payments/checkout/custom-success-page).
                success_url=request.build_absolute_uri(reverse("storefront:topup-checkout-return"))
                + "?session_id={CHECKOUT_SESSION_ID}",
                cancel_url=f"{billing_url}?checkout=cancelled",
                save_card=bool(data.get("save_card")),
                idempotency_key=f"web:{key}",
            ),
        )
    except TopUpRefused as exc:
        messages.error(request, str(exc))
        return redirect("storefront:billing")
    if topup.state == TopUpState.REQUIRES_ACTION and topup.next_action_url:
        # To Stripe's page; the site's CSP lets a form's answer lead there (broker/security.py, form-action).
        return HttpResponse(status=303, headers={"Location": topup.next_action_url})
    _say_how_it_went(request, topup)
    return redirect("storefront:billing")


@login_required
def topup_checkout_return(request: HttpRequest) -> HttpResponse:
    """Where Stripe's Checkout page sends the buyer after paying (``?session_id=cs_...``): read the session back,
    credit its payment if the webhook has not already, and say how it went."""
    organization = buyer_access(request).organization
    session = request.GET.get("session_id", "")
    if not re.fullmatch(r"cs_[A-Za-z0-9_]{1,250}", session):
        raise Http404("no such top-up")
    topup = TopUp.objects.filter(organization=organization, checkout_session=session).first()
    if topup is None:
        raise Http404("no such top-up")
    try:
        topup = topup_refresh(topup)
    except (PaymentError, BookError) as exc:
        messages.warning(request, f"Could not read the payment back yet ({exc}); it is credited when it is.")
        return redirect("storefront:billing")
    _say_how_it_went(request, topup)
    return redirect("storefront:billing")


def _topups_shown(organization: Organization) -> list[TopUp]:
    """The newest top-ups; one waiting for 3-D Secure carries when it is cancelled as abandoned."""
    topups = list(TopUp.objects.filter(organization=organization).order_by("-id")[:50])
    for topup in topups:
        if topup.state == TopUpState.REQUIRES_ACTION and not topup.checkout_session:
            topup.action_deadline = topup_action_deadline(topup)  # type: ignore[attr-defined]
    return topups


def _cancel_topup(request: HttpRequest, organization: Organization) -> HttpResponse:
    try:
        wanted = uuid.UUID(request.POST.get("topup", ""))
    except ValueError:
        raise Http404("no such top-up") from None
    topup = TopUp.objects.filter(organization=organization, public_id=wanted).first()
    if topup is None:
        raise Http404("no such top-up")
    try:
        topup = topup_cancel(topup)
    except TopUpRefused as exc:
        messages.error(request, str(exc))
        return redirect("storefront:billing")
    except PaymentError as exc:
        messages.error(request, f"The payment platform could not cancel it now ({exc.message}); try again.")
        return redirect("storefront:billing")
    if topup.state == TopUpState.FAILED:
        messages.success(request, "Top-up cancelled: nothing was charged.")
    else:
        _say_how_it_went(request, topup)  # 3-D Secure was passed just before: it is credited
    return redirect("storefront:billing")


def _say_how_it_went(request: HttpRequest, topup: TopUp) -> None:
    if topup.state == TopUpState.SUCCEEDED:
        messages.success(request, f"Added {money(topup.amount_minor)} to your credit.")
    elif topup.state == TopUpState.FAILED:
        messages.error(request, f"The top-up failed: {topup.failure}")
    elif topup.checkout_session:
        messages.warning(request, "Payment not completed: nothing was charged yet. Finish it from the list below.")
    else:
        messages.warning(request, "The payment platform has not answered yet; the top-up is credited when it does.")


def _topup(request: HttpRequest, organization: Organization, form: TopUpForm) -> HttpResponse:
    data = form.cleaned_data
    # The form's nonce makes a double submit one payment.
    key = request.POST.get("nonce", "")[:64] or uuid.uuid4().hex
    try:
        topup = topup_start(
            organization=organization,
            user=request.user,  # type: ignore[arg-type]
            request=TopUpRequest(
                amount_minor=int(data["amount"] * 100),
                payment_method=data["payment_method"],
                # Stripe sends the card holder back here with ?payment_intent=pi_... after 3-D Secure.
                return_url=request.build_absolute_uri(reverse("storefront:topup-return")),
                idempotency_key=f"web:{key}",
            ),
        )
    except TopUpRefused as exc:
        messages.error(request, str(exc))
        return redirect("storefront:billing")
    except PaymentError as exc:
        messages.error(request, f"The payment platform refused the payment: {exc.message}")
        return redirect("storefront:billing")
    if data.get("save_card") and topup.state == TopUpState.SUCCEEDED:
        BillingProfile.objects.filter(organization=organization).update(payment_method=data["payment_method"])
    if topup.state == TopUpState.REQUIRES_ACTION and topup.next_action_url:
        # A link, not a redirect: the site's CSP (form-action 'self') rightly stops a form's answer from sending
        # the browser to another site, so the page offers the bank's check as a link the person follows.
        return redirect(f"{reverse('storefront:billing')}?authenticate={topup.public_id}")
    if topup.state == TopUpState.SUCCEEDED:
        messages.success(request, f"Added {money(topup.amount_minor)} to your credit.")
    elif topup.state == TopUpState.FAILED:
        messages.error(request, f"The top-up failed: {topup.failure}")
    else:
        messages.warning(request, "The payment platform has not answered yet; the top-up is credited when it does.")
    return redirect("storefront:billing")


@login_required
def topup_return(request: HttpRequest) -> HttpResponse:
    """Where the card holder comes back after 3-D Secure (``?payment_intent=``): read the payment back and say
    how it went."""
    organization = buyer_access(request).organization
    intent = request.GET.get("payment_intent", "")[:64]
    topup = TopUp.objects.filter(organization=organization, payment_intent=intent).first() if intent else None
    if topup is None:
        raise Http404("no such top-up")
    try:
        topup = topup_refresh(topup)
    except PaymentError as exc:
        messages.warning(request, f"Could not read the payment back yet ({exc.message}); it is credited when it is.")
        return redirect("storefront:billing")
    if topup.state == TopUpState.SUCCEEDED:
        messages.success(request, f"Added {money(topup.amount_minor)} to your credit.")
    elif topup.state == TopUpState.FAILED:
        messages.error(request, f"The top-up failed: {topup.failure}")
    else:
        messages.warning(request, "The card's bank has not confirmed the payment yet.")
    return redirect("storefront:billing")


@login_required
@require_POST
def email_verification_request(request: HttpRequest) -> HttpResponse:
    """Send (again) the link that verifies the signed-in person's address."""
    token = email_verification_token(request.user)  # type: ignore[arg-type]
    link = request.build_absolute_uri(reverse("storefront:email-verify", args=[token]))
    if email_verification_send(user=request.user, link=link):  # type: ignore[arg-type]
        messages.success(request, f"We sent a link to {request.user.email}: open it to verify the address.")  # type: ignore[union-attr]
    else:
        messages.error(request, "The email could not be sent: check the address on your account, or try later.")
    return redirect("storefront:billing")


def email_verify_view(request: HttpRequest, token: str) -> HttpResponse:
    """The link in the email: records the address as verified."""
    try:
        user = email_verify(token)
    except VerificationFailed as exc:
        return render(request, "storefront/email_verify.html", {"error": str(exc)}, status=400)
    return render(request, "storefront/email_verify.html", {"email": user.email})  # type: ignore[attr-defined]
