"""The double-entry book (issue 22): every movement of money is one entry of balanced lines between accounts.

Amounts are integers in the currency's minor unit (cents), signed: a line debits its account with a positive
amount and credits it with a negative one, and the lines of an entry sum to zero per currency. Balances are
never stored: an account's balance is the sum of its lines. Entries and lines are written once.
"""

from __future__ import annotations

import uuid

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
