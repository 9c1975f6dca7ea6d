"""Schema-only serializers: the answers whose bodies are built as dicts by the views and services that own them
(``billing_body``, ``topup_body``, ``ledger.receipts``, the invoices), declared field by field so the OpenAPI
schema types them. Nothing renders through these: each mirrors the function named in its docstring, and
tests/api/test_schemathesis.py holds the real answers to them."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ledger.receipts import COMPLETE, PENDING
from marketplace.api.serializers import QuoteOutput
from marketplace.models import PaymentTerms, TopUpState


def page_of(name: str, item: serializers.Serializer) -> type[serializers.Serializer]:
    """The cursor page envelope (``marketplace.api.pagination.Page.body``) around ``item``."""
    fields: dict[str, Any] = {
        "results": item,
        "next_cursor": serializers.CharField(allow_null=True, help_text="the cursor of the next page; null: last"),
        "next": serializers.CharField(allow_null=True, help_text="the next page's URL; null: last"),
    }
    return type(name, (serializers.Serializer,), fields)


# --------------------------------------------------------------------------------------------- billing


class AutoTopUpOutput(serializers.Serializer):
    below = serializers.CharField(help_text="credit below which a top-up is charged, as decimal text")
    amount = serializers.CharField(help_text="what each automatic top-up adds, as decimal text")


class TopUpBoundsOutput(serializers.Serializer):
    min = serializers.CharField()
    max = serializers.CharField()


class BillingOutput(serializers.Serializer):
    """``marketplace.api.billing.billing_body``: amounts as decimal text in ``currency``."""

    currency = serializers.CharField()
    payment_terms = serializers.ChoiceField(choices=PaymentTerms.choices)
    credit_available = serializers.CharField()
    held_for_running_orders = serializers.CharField()
    country = serializers.CharField(allow_null=True, help_text="ISO 3166-1 alpha-2; null: not set")
    tax_id = serializers.CharField(allow_null=True)
    payment_method = serializers.CharField(allow_null=True, help_text="the saved card; null: none saved")
    auto_topup = AutoTopUpOutput(allow_null=True, help_text="null: automatic top-up is off")
    email_verified = serializers.BooleanField(
        allow_null=True, help_text="whether the caller's (or the token creator's) email address is verified"
    )
    top_up = TopUpBoundsOutput(help_text="the smallest and largest top-up")


class TopUpOutput(serializers.Serializer):
    """``marketplace.api.billing.topup_body``."""

    id = serializers.UUIDField()
    amount = serializers.CharField()
    currency = serializers.CharField()
    state = serializers.ChoiceField(choices=TopUpState.choices)
    automatic = serializers.BooleanField()
    next_action_url = serializers.CharField(allow_null=True)
    checkout_url = serializers.CharField(allow_null=True, help_text="Stripe's page where a person types the card")
    failure = serializers.CharField(allow_null=True)
    action_deadline = serializers.DateTimeField(
        allow_null=True, help_text="while it waits for 3-D Secure: when it is cancelled as abandoned"
    )
    refunded = serializers.CharField()
    created_at = serializers.DateTimeField()


TopUpPageOutput = page_of("TopUpPageOutput", TopUpOutput(many=True))


# --------------------------------------------------------------------------------------------- procurement


class ProcurementAssignmentOutput(serializers.Serializer):
    demand = serializers.CharField(help_text="the demand's id, or its position from 1")
    quote = QuoteOutput(allow_null=True, help_text="null: the demand was not placed")
    reason = serializers.CharField()


class ProcurementOutput(serializers.Serializer):
    """POST /api/v1/procurements (``marketplace.api.views.ProcurementCreateApi``)."""

    batch = serializers.UUIDField()
    expires_at = serializers.DateTimeField()
    total_cost = serializers.CharField(help_text="USD as decimal text")
    objective = serializers.FloatField()
    lower_bound = serializers.FloatField()
    gap = serializers.FloatField()
    method = serializers.CharField()
    optimal = serializers.BooleanField()
    seconds = serializers.FloatField()
    placed = serializers.IntegerField(help_text="how many demands got a quote")
    assignments = ProcurementAssignmentOutput(many=True)


# --------------------------------------------------------------------------------------------- ledger


class AnchorOutput(serializers.Serializer):
    chain_id = serializers.IntegerField()
    tx_hash = serializers.CharField()
    block_number = serializers.IntegerField()
    block_hash = serializers.CharField()
    sender = serializers.CharField()


class CheckpointOutput(serializers.Serializer):
    """``ledger.receipts.checkpoint_json``."""

    size = serializers.IntegerField()
    root = serializers.CharField()
    note = serializers.CharField(help_text="the signed checkpoint note")
    key_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    anchor = AnchorOutput(allow_null=True, help_text="null until it is anchored on a chain")


class KeyPeriodOutput(serializers.Serializer):
    """One entry of ``ledger.receipts.key_history_json``."""

    verifier_key = serializers.CharField(allow_null=True)
    key_id = serializers.CharField()
    first_size = serializers.IntegerField(allow_null=True)
    last_size = serializers.IntegerField(allow_null=True)
    first_signed_at = serializers.DateTimeField(allow_null=True)
    last_signed_at = serializers.DateTimeField(allow_null=True)
    handover = serializers.CharField(allow_null=True)


class LedgerEntryOutput(serializers.Serializer):
    """``ledger.receipts.entry_json``; a queued entry has no sequence or chain hashes yet."""

    sequence = serializers.IntegerField(allow_null=True)
    kind = serializers.CharField()
    subject = serializers.CharField()
    created_at = serializers.DateTimeField()
    payload = serializers.CharField(help_text="the canonical JSON text that was hashed")
    payload_hash = serializers.CharField()
    prev_hash = serializers.CharField(allow_null=True)
    entry_hash = serializers.CharField(allow_null=True)
    leaf_hash = serializers.CharField(allow_blank=True)


class ProvenEntryOutput(LedgerEntryOutput):
    inclusion_proof = serializers.ListField(
        child=serializers.CharField(), allow_null=True, help_text="hex hashes from the leaf to the checkpoint's root"
    )


class ReceiptOutput(serializers.Serializer):
    """``ledger.receipts.receipt``: GET /api/v1/orders/<id>/receipt."""

    format = serializers.CharField()
    origin = serializers.CharField()
    status = serializers.ChoiceField(
        choices=[COMPLETE, PENDING], help_text="pending while entries wait for a checkpoint, else complete"
    )
    signed_size = serializers.IntegerField()
    first_pending = serializers.IntegerField(allow_null=True)
    verifier_key = serializers.CharField()
    subject = serializers.CharField()
    checkpoint = CheckpointOutput(allow_null=True)
    entries = ProvenEntryOutput(many=True)
    pending = LedgerEntryOutput(many=True)
    queued = LedgerEntryOutput(many=True)
    key_history = KeyPeriodOutput(many=True)
    problem = serializers.CharField(required=False, help_text="present only when proofs could not be made")


class LedgerKeyOutput(serializers.Serializer):
    origin = serializers.CharField()
    verifier_key = serializers.CharField()
    key_history = KeyPeriodOutput(many=True)


class CheckpointPageOutput(serializers.Serializer):
    checkpoints = CheckpointOutput(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="the after= of the next page; null: last")


class ConsistencyOutput(serializers.Serializer):
    old_size = serializers.IntegerField()
    new_size = serializers.IntegerField()
    proof = serializers.ListField(child=serializers.CharField())


class LeafHashesOutput(serializers.Serializer):
    start = serializers.IntegerField()
    leaf_hashes = serializers.ListField(child=serializers.CharField())


# --------------------------------------------------------------------------------------------- invoices


class InvoiceSummaryOutput(serializers.Serializer):
    """``marketplace.api.invoices._summary``: amounts in minor units of ``currency``."""

    number = serializers.CharField()
    month = serializers.CharField()
    currency = serializers.CharField()
    issued_at = serializers.DateTimeField()
    subtotal_minor = serializers.IntegerField()
    tax_minor = serializers.IntegerField()
    total_minor = serializers.IntegerField()
    sha256 = serializers.CharField()


InvoicePageOutput = page_of("InvoicePageOutput", InvoiceSummaryOutput(many=True))


class InvoiceItemOutput(serializers.Serializer):
    type = serializers.ChoiceField(choices=["charge", "credit"], help_text="a charge, or a credit note")
    at = serializers.DateTimeField()
    order = serializers.CharField(help_text="the order's id")
    description = serializers.CharField()
    seconds = serializers.IntegerField()
    net_minor = serializers.IntegerField()
    tax_country = serializers.CharField(allow_blank=True, help_text="empty when no tax applied")
    tax_name = serializers.CharField(allow_blank=True)
    tax_rate = serializers.CharField(allow_null=True)
    tax_minor = serializers.IntegerField()


class InvoicePaymentOutput(serializers.Serializer):
    at = serializers.DateTimeField()
    amount_minor = serializers.IntegerField()
    entry = serializers.CharField()


class InvoiceLinesOutput(serializers.Serializer):
    """The issued invoice's ``lines`` document (``marketplace.billing.invoices._snapshot``)."""

    seller = serializers.DictField(child=serializers.CharField(allow_blank=True))
    buyer = serializers.DictField(child=serializers.CharField(allow_blank=True))
    items = InvoiceItemOutput(many=True)
    payments = InvoicePaymentOutput(many=True)
    payments_minor = serializers.IntegerField()
    tax_note = serializers.CharField(allow_blank=True)


class InvoiceTaxLineOutput(serializers.Serializer):
    country = serializers.CharField(allow_blank=True)
    name = serializers.CharField(allow_blank=True, help_text="empty: no tax")
    rate = serializers.CharField(allow_null=True)
    net_minor = serializers.IntegerField()
    tax_minor = serializers.IntegerField()


class InvoiceDocumentOutput(serializers.Serializer):
    """``marketplace.billing.invoices.invoice_document``: what ``sha256`` is the canonical hash of."""

    number = serializers.CharField()
    month = serializers.CharField()
    currency = serializers.CharField()
    issued_at = serializers.DateTimeField()
    subtotal_minor = serializers.IntegerField()
    tax_minor = serializers.IntegerField()
    total_minor = serializers.IntegerField()
    lines = InvoiceLinesOutput()
    tax_lines = InvoiceTaxLineOutput(many=True)


class IssuedInvoiceOutput(serializers.Serializer):
    invoice = InvoiceDocumentOutput()
    sha256 = serializers.CharField()
