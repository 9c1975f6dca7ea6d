"""The double-entry book (issue 22): every movement of money is one entry of balanced lines between accounts.

Amounts are integers in the currency's minor unit (cents), signed: a line debits its account with a positive
amount and credits it with a negative one, and the lines of an entry sum to zero per currency. Balances are
never stored: an account's balance is the sum of its lines. Entries and lines are written once.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from ledger.models import AppendOnlyModel
from marketplace.models.organizations import Organization


class BookAccountKind(models.TextChoices):
    """What an account holds. Buyer and provider accounts belong to an organisation; the others are the house's."""

    CASH = "cash", "cash at the payment platform"
    BUYER_CREDIT = "buyer_credit", "buyer's prepaid credit"
    ORDER_HOLD = "order_hold", "credit held for running orders"
    REVENUE = "revenue", "sales"
    COMMISSION = "commission", "the marketplace's commission"
    PROVIDER_PAYABLE = "provider_payable", "owed to a provider"
    PAYOUTS = "payouts", "paid out to providers"
    REFUNDS = "refunds", "refunded to buyers"
    TAX_PAYABLE = "tax_payable", "tax collected, owed to tax authorities"
    GRANTS = "grants", "credit granted by the marketplace"


class BookAccount(models.Model):
    """One account of the book in one currency, of an organisation or of the house (``organization`` NULL)."""

    kind = models.CharField(max_length=24, choices=BookAccountKind.choices)
    organization = models.ForeignKey(
        Organization, null=True, blank=True, on_delete=models.PROTECT, related_name="book_accounts"
    )
    currency = models.CharField(max_length=3, help_text="ISO 4217, upper case")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "organization", "currency"],
                condition=models.Q(organization__isnull=False),
                name="book_account_one_per_owner",
            ),
            models.UniqueConstraint(
                fields=["kind", "currency"],
                condition=models.Q(organization__isnull=True),
                name="book_account_one_house",
            ),
            models.CheckConstraint(condition=models.Q(currency__regex=r"^[A-Z]{3}$"), name="book_account_currency"),
        ]

    def __str__(self) -> str:
        owner = self.organization_id or "house"
        return f"{self.kind}/{owner}/{self.currency}"


class BookEntry(AppendOnlyModel):
    """One balanced movement of money; ``key`` makes posting it idempotent (a webhook's event id, an order's)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=48)
    memo = models.CharField(max_length=255, blank=True, default="")
    key = models.CharField(max_length=128, unique=True)
    created_at = models.DateTimeField()
    # The order an entry is about (its holds, its charge), so an order's hold is the sum of its entries' lines.
    order = models.ForeignKey(
        "marketplace.Order", null=True, blank=True, on_delete=models.PROTECT, related_name="book_entries"
    )

    def __str__(self) -> str:
        return f"book entry {self.public_id} ({self.kind})"


class BookLine(AppendOnlyModel):
    """One side of an entry: ``amount_minor`` on ``account`` (positive: debit; negative: credit)."""

    entry = models.ForeignKey(BookEntry, on_delete=models.PROTECT, related_name="lines")
    account = models.ForeignKey(BookAccount, on_delete=models.PROTECT, related_name="lines")
    amount_minor = models.BigIntegerField()

    class Meta:
        constraints = [models.CheckConstraint(condition=~models.Q(amount_minor=0), name="book_line_not_zero")]
        indexes = [models.Index(fields=["account"], name="book_line_account")]


class BillingProfile(models.Model):
    """An organisation's payment details: its Stripe customer, saved card, country (for tax) and auto top-up."""

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="billing_profile")
    stripe_customer = models.CharField(max_length=64, blank=True, default="")
    payment_method = models.CharField(max_length=64, blank=True, default="", help_text="saved card (Stripe id)")
    country = models.CharField(max_length=2, blank=True, default="", help_text="ISO 3166-1 alpha-2, for tax")
    tax_id = models.CharField(max_length=32, blank=True, default="")
    auto_topup_below_minor = models.BigIntegerField(null=True, blank=True)
    auto_topup_amount_minor = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"billing profile of organization {self.organization_id}"


class TopUpState(models.TextChoices):
    PENDING = "pending", "waiting for the card"
    REQUIRES_ACTION = "requires_action", "waiting for the card holder"
    SUCCEEDED = "succeeded", "credited"
    FAILED = "failed", "failed"


class TopUp(models.Model):
    """One card payment into prepaid credit. The row is committed before Stripe is called, so a webhook that
    arrives before the call's answer finds it (by ``public_id`` in the PaymentIntent's metadata)."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="topups")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    automatic = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=128)
    payment_intent = models.CharField(max_length=64, null=True, blank=True, unique=True)
    # A top-up paid on Stripe's hosted Checkout page: the session's id (its page is ``next_action_url`` while open).
    checkout_session = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=16, choices=TopUpState.choices, default=TopUpState.PENDING)
    # 3-D Secure's page, or the hosted Checkout page (Stripe's Checkout URLs run to several hundred characters).
    next_action_url = models.URLField(max_length=2000, blank=True, default="")
    failure = models.CharField(max_length=255, blank=True, default="")
    refunded_minor = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "idempotency_key"], name="topup_idempotency"),
            models.CheckConstraint(condition=models.Q(amount_minor__gt=0), name="topup_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"top-up {self.public_id} ({self.state})"


class StripeEvent(models.Model):
    """A webhook event taken in: its id is unique, so a replayed event is recognised and changes nothing."""

    event_id = models.CharField(max_length=64, unique=True)
    type = models.CharField(max_length=64)
    account = models.CharField(max_length=64, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=255, blank=True, default="")
    # Answered 2xx and changed nothing: an object we do not have, a type we do not handle, another account's event.
    ignored = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.event_id} ({self.type})"


class ConnectAccount(models.Model):
    """A provider organisation's Stripe Connect account, where its payouts go."""

    organization = models.OneToOneField(Organization, on_delete=models.PROTECT, related_name="connect_account")
    stripe_account = models.CharField(max_length=64, unique=True)
    country = models.CharField(max_length=2)
    payouts_enabled = models.BooleanField(default=False)
    details_submitted = models.BooleanField(default=False)
    requirements_due = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.stripe_account} (organization {self.organization_id})"


class PayoutState(models.TextChoices):
    CREATED = "created", "created"
    IN_TRANSIT = "in_transit", "on its way to the bank"
    PAID = "paid", "paid"
    FAILED = "failed", "failed (the money is payable again)"


class Payout(models.Model):
    """Payables paid to a provider: a Stripe transfer to its Connect account, then a payout to its bank."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="payouts")
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    stripe_transfer = models.CharField(max_length=64, blank=True, default="")
    stripe_payout = models.CharField(max_length=64, null=True, blank=True, unique=True)
    state = models.CharField(max_length=16, choices=PayoutState.choices, default=PayoutState.CREATED)
    failure_code = models.CharField(max_length=64, blank=True, default="")
    failure_message = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(amount_minor__gt=0), name="payout_amount_positive")]

    def __str__(self) -> str:
        return f"payout {self.public_id} ({self.state})"


class Invoice(models.Model):
    """A month's invoice for an organisation, issued once and never changed; its lines are kept as issued and
    its hash is ledgered."""

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="invoices")
    number = models.CharField(max_length=32, unique=True)
    month = models.CharField(max_length=7, help_text="YYYY-MM (UTC)")
    currency = models.CharField(max_length=3)
    subtotal_minor = models.BigIntegerField()
    tax_minor = models.BigIntegerField()
    total_minor = models.BigIntegerField()
    lines = models.JSONField()
    tax_lines = models.JSONField(default=list)
    issued_at = models.DateTimeField()
    sha256 = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "month", "currency"], name="invoice_one_per_month")
        ]

    def __str__(self) -> str:
        return f"invoice {self.number}"


class EmailVerification(models.Model):
    """An address a person has proved they read: the first top-up waits for one."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="email_verifications")
    email = models.EmailField()
    verified_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "email"], name="email_verified_once")]

    def __str__(self) -> str:
        return f"verified address of user {self.user_id}"


class ReconciliationRun(models.Model):
    """One UTC day of Stripe's money movements matched against the book (``billing/reconciliation.py``). Run again,
    the day's counts and its unreviewed mismatches are replaced; reviewed ones stay."""

    day = models.DateField(unique=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    stripe_items = models.IntegerField(default=0)
    book_items = models.IntegerField(default=0)
    matched = models.IntegerField(default=0)
    mismatches = models.IntegerField(default=0)
    error = models.CharField(max_length=255, blank=True, default="")

    def __str__(self) -> str:
        return f"reconciliation {self.day}"


class MismatchKind(models.TextChoices):
    MISSING_IN_BOOK = "missing_in_book", "at Stripe, not in the book"
    MISSING_AT_STRIPE = "missing_at_stripe", "in the book, not at Stripe"
    AMOUNT_DIFFERS = "amount_differs", "amounts differ"
    STATUS_DIFFERS = "status_differs", "payout status differs"


class ReconciliationMismatch(models.Model):
    """One thing Stripe and the book disagree on. Nothing is fixed automatically: staff look, correct the book
    through its services if needed, and mark it reviewed with a note."""

    run = models.ForeignKey(ReconciliationRun, on_delete=models.CASCADE, related_name="found")
    kind = models.CharField(max_length=24, choices=MismatchKind.choices)
    stripe_object = models.CharField(max_length=64, blank=True, default="")
    account = models.CharField(max_length=64, blank=True, default="", help_text="the connected account, if any")
    book_key = models.CharField(max_length=128, blank=True, default="")
    currency = models.CharField(max_length=3)
    stripe_minor = models.BigIntegerField(null=True, blank=True)
    book_minor = models.BigIntegerField(null=True, blank=True)
    detail = models.CharField(max_length=255)
    found_at = models.DateTimeField()
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    review_note = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["-found_at", "pk"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail[:60]}"
