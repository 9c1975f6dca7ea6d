"""Monthly invoices, read from the double-entry book: drafted at any time, issued once a month has ended.

A month (UTC, by entry ``created_at``) of an organisation's buyer-credit account gives its lines:
``order.charge`` entries are charges (net C and tax T, the tax named by the entry's memo, see ``tax.tax_memo``),
``order.refund`` entries are credit notes (negative, no tax change), ``sla.credit`` entries are SLA credits (credit
notes too: an order below its SLA, marketplace/sla/credits.py), ``topup`` entries are payments received.

Issuing is idempotent (one invoice per organisation, month and currency, a unique constraint) and numbers are
sequential per year without gaps: a number is the year's highest committed one plus one, and two issuers that
pick the same number meet the number's unique index; the loser retries with the next. The issued invoice keeps
its lines and parties as JSON (``Invoice.lines``: ``{"seller", "buyer", "items", "payments", "tax_note"}``),
their canonical hash, and a ledger entry of that hash in the same transaction.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.canonical import canonical_bytes, sha256_hex
from ledger.services import ledger_append
from marketplace.billing.tax import tax_memo_parse
from marketplace.billing.vat_ids import REVERSE_CHARGE_NOTE
from marketplace.models import (
    BillingProfile,
    BookAccountKind,
    BookEntry,
    BookLine,
    Invoice,
    InvoiceLine,
    Organization,
)
from marketplace.money import lines_total, minor_text, money_text
from marketplace.orders.selectors import month_bounds

log = logging.getLogger(__name__)

CHARGE, REFUND, TOPUP, SLA_CREDIT = "order.charge", "order.refund", "topup", "sla.credit"
NUMBER_ATTEMPTS = 20
CENT = Decimal("0.01")


@dataclass(frozen=True)
class DraftLine:
    """One charge (positive) or credit note (negative) of the month."""

    type: str  # "charge" | "credit"
    at: dt.datetime
    order: str  # the order's public id
    description: str
    seconds: int
    net_minor: int
    tax_country: str  # "" when no tax applied
    tax_name: str
    tax_rate: Decimal | None
    tax_minor: int

    @property
    def hours(self) -> Decimal:
        return (Decimal(self.seconds) / 3600).quantize(CENT)


@dataclass(frozen=True)
class Payment:
    at: dt.datetime
    amount_minor: int
    entry: str


@dataclass(frozen=True)
class TaxSummary:
    """The month's charges under one rate (``name`` empty: no tax), and the tax on them."""

    country: str
    name: str
    rate: Decimal | None
    net_minor: int
    tax_minor: int


@dataclass(frozen=True)
class InvoiceDraft:
    organization_id: int
    month: str
    currency: str
    seller: dict[str, str]
    buyer: dict[str, str]
    lines: list[DraftLine]
    payments: list[Payment]
    tax_lines: list[TaxSummary]
    tax_note: str
    subtotal_minor: int
    tax_minor: int
    total_minor: int
    payments_minor: int = field(default=0)


def seller_details() -> dict[str, str]:
    return {
        "name": getattr(settings, "BROKER_LEGAL_NAME", "GPU Broker"),
        "address": getattr(settings, "BROKER_LEGAL_ADDRESS", ""),
        "tax_id": getattr(settings, "BROKER_TAX_ID", ""),
    }


def buyer_details(organization: Organization) -> dict[str, str]:
    profile = BillingProfile.objects.filter(organization=organization).first()
    return {
        "name": organization.name,
        "country": profile.country if profile else "",
        "tax_id": profile.tax_id if profile else "",
    }


def invoice_draft(organization: Organization, month: str, currency: str = "USD") -> InvoiceDraft:
    """What the organisation's invoice for ``month`` (YYYY-MM, UTC) says from the book as it stands. Raises
    ``ValueError`` for a malformed month."""
    start, end = month_bounds(month)
    buyer_lines = list(
        BookLine.objects.filter(
            account__kind=BookAccountKind.BUYER_CREDIT,
            account__organization=organization,
            account__currency=currency,
            entry__created_at__gte=start,
            entry__created_at__lt=end,
            entry__kind__in=[CHARGE, REFUND, TOPUP, SLA_CREDIT],
        )
        .select_related("entry", "entry__order")
        .order_by("entry__created_at", "entry__id")
    )
    entry_ids = [line.entry_id for line in buyer_lines]
    taxes: dict[int, int] = defaultdict(int)
    for entry_id, amount in BookLine.objects.filter(
        entry_id__in=entry_ids, account__kind=BookAccountKind.TAX_PAYABLE, account__currency=currency
    ).values_list("entry_id", "amount_minor"):
        taxes[entry_id] -= amount  # tax owed is a credit: its line is negative
    order_ids = [line.entry.order_id for line in buyer_lines if line.entry.order_id]
    usage = {row.order_id: row for row in InvoiceLine.objects.filter(order_id__in=order_ids)}
    # A refund gives back its share of the charge's tax: it is named as its charge named it, whatever the month.
    charge_memos = dict(BookEntry.objects.filter(order_id__in=order_ids, kind=CHARGE).values_list("order_id", "memo"))
    lines: list[DraftLine] = []
    payments: list[Payment] = []
    untaxed = reverse_charged = 0
    for line in buyer_lines:
        entry = line.entry
        if entry.kind == TOPUP:
            payments.append(Payment(at=entry.created_at, amount_minor=-line.amount_minor, entry=str(entry.public_id)))
            continue
        order = entry.order
        used = usage.get(order.pk) if order else None
        description = used.description if used else (f"order {order.public_id}" if order else entry.memo)
        if entry.kind == CHARGE:
            tax = taxes.get(entry.pk, 0)
            named = tax_memo_parse(entry.memo)
            untaxed += named is None
            reverse_charged += named is not None and named.reverse_charge
            lines.append(
                DraftLine(
                    type="charge", at=entry.created_at, order=str(order.public_id) if order else "",
                    description=description, seconds=used.seconds if used else 0,
                    net_minor=line.amount_minor - tax, tax_country=named[0] if named else "",
                    tax_name=named[1] if named else "", tax_rate=named[2] if named else None, tax_minor=tax,
                )
            )  # fmt: skip
        elif entry.kind == SLA_CREDIT:
            # The seller's payable pays it, before tax: a credit note without tax, its memo saying how it was measured.
            lines.append(
                DraftLine(
                    type="credit", at=entry.created_at, order=str(order.public_id) if order else "",
                    description=f"{entry.memo} ({description})", seconds=0, net_minor=line.amount_minor,
                    tax_country="", tax_name="", tax_rate=None, tax_minor=0,
                )
            )  # fmt: skip
        else:
            tax = taxes.get(entry.pk, 0)  # negative: the tax the refund gave back
            named = tax_memo_parse(charge_memos.get(order.pk, "")) if order and tax else None
            lines.append(
                DraftLine(
                    type="credit", at=entry.created_at, order=str(order.public_id) if order else "",
                    description=f"Refund: {description}", seconds=0, net_minor=line.amount_minor - tax,
                    tax_country=named[0] if named else "", tax_name=named[1] if named else "",
                    tax_rate=named[2] if named else None, tax_minor=tax,
                )
            )  # fmt: skip
    summary: dict[tuple[str, str, Decimal | None], list[int]] = {}
    for item in lines:
        if item.type == "charge" or item.tax_minor:
            sums = summary.setdefault((item.tax_country, item.tax_name, item.tax_rate), [0, 0])
            sums[0] += item.net_minor
            sums[1] += item.tax_minor
    tax_lines = [
        TaxSummary(country=key[0], name=key[1], rate=key[2], net_minor=sums[0], tax_minor=sums[1])
        for key, sums in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or Decimal(0)))
    ]
    buyer = buyer_details(organization)
    tax_note = ""
    if untaxed:
        where = f"the buyer's country ({buyer['country']})" if buyer["country"] else "no billing country given"
        tax_note = f"No tax charged on {untaxed} line(s): no tax rate applies ({where})."
    if reverse_charged:
        # The words Article 226(11a) of Directive 2006/112/EC requires, with both parties' VAT ids shown above.
        tax_note = f"{tax_note} {REVERSE_CHARGE_NOTE}".strip()
    # Each line was rounded once, when the book charged it; a total is the sum of those lines (marketplace.money).
    subtotal = lines_total(item.net_minor for item in lines)
    tax_total = lines_total(item.tax_minor for item in lines)
    return InvoiceDraft(
        organization_id=organization.pk, month=month, currency=currency, seller=seller_details(), buyer=buyer,
        lines=lines, payments=payments, tax_lines=tax_lines, tax_note=tax_note, subtotal_minor=subtotal,
        tax_minor=tax_total, total_minor=subtotal + tax_total,
        payments_minor=lines_total(p.amount_minor for p in payments),
    )  # fmt: skip


def _rate_text(rate: Decimal | None) -> str | None:
    return None if rate is None else format(rate, "f")


def _snapshot(draft: InvoiceDraft) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The draft as JSON-ready values (no Decimal, no datetime): the ``lines`` document and the tax lines."""
    items = [
        {
            "type": item.type, "at": item.at.astimezone(dt.UTC).isoformat(), "order": item.order,
            "description": item.description, "seconds": item.seconds, "net_minor": item.net_minor,
            "tax_country": item.tax_country, "tax_name": item.tax_name, "tax_rate": _rate_text(item.tax_rate),
            "tax_minor": item.tax_minor,
        }
        for item in draft.lines
    ]  # fmt: skip
    payments = [
        {"at": p.at.astimezone(dt.UTC).isoformat(), "amount_minor": p.amount_minor, "entry": p.entry}
        for p in draft.payments
    ]
    document = {
        "seller": draft.seller, "buyer": draft.buyer, "items": items, "payments": payments,
        "payments_minor": draft.payments_minor, "tax_note": draft.tax_note,
    }  # fmt: skip
    tax_lines = [
        {"country": t.country, "name": t.name, "rate": _rate_text(t.rate), "net_minor": t.net_minor,
         "tax_minor": t.tax_minor}
        for t in draft.tax_lines
    ]  # fmt: skip
    return document, tax_lines


def invoice_document(invoice: Invoice) -> dict[str, Any]:
    """The issued invoice as one JSON object: what its ``sha256`` is the canonical hash of (and what the API
    returns)."""
    return {
        "number": invoice.number,
        "month": invoice.month,
        "currency": invoice.currency,
        "issued_at": invoice.issued_at.astimezone(dt.UTC).isoformat(),
        "subtotal_minor": invoice.subtotal_minor,
        "tax_minor": invoice.tax_minor,
        "total_minor": invoice.total_minor,
        "lines": invoice.lines,
        "tax_lines": invoice.tax_lines,
    }


def invoice_hash(invoice: Invoice) -> str:
    return sha256_hex(canonical_bytes(invoice_document(invoice)))


def _number_prefix(year: int) -> str:
    return f"{getattr(settings, 'BROKER_INVOICE_PREFIX', 'INV')}-{year}-"


def _next_number(year: int) -> str:
    prefix = _number_prefix(year)
    # Zero-padded, so the text order is the numeric order (up to a million invoices a year).
    last = (
        Invoice.objects.filter(number__startswith=prefix).order_by("-number").values_list("number", flat=True).first()
    )
    return f"{prefix}{(int(last[len(prefix) :]) if last else 0) + 1:06d}"


def invoice_get(organization: Organization, number: str) -> Invoice | None:
    """The organisation's issued invoice of that number; None for another organisation's, an unknown number or
    text that is no invoice number at all (checked before the query: a NUL is an error in PostgreSQL)."""
    if not (0 < len(number) <= 32 and number.isascii() and all(c.isalnum() or c == "-" for c in number)):
        return None
    return Invoice.objects.filter(organization=organization, number=number).first()


def _issued(organization: Organization, month: str, currency: str) -> Invoice | None:
    return Invoice.objects.filter(organization=organization, month=month, currency=currency).first()


def invoice_issue(
    organization: Organization, month: str, currency: str = "USD", now: dt.datetime | None = None
) -> Invoice:
    """Issue the organisation's invoice for ``month`` once that month has ended (UTC); issuing it again returns
    the same invoice. Raises ``ValueError`` for a malformed month or one that has not ended yet."""
    now = now or timezone.now()
    try:
        _, end = month_bounds(month)
    except ValueError:
        raise ValueError(f"{month!r} is not a month: give it as YYYY-MM") from None
    if end > now:
        raise ValueError(f"the month {month} has not ended yet (it ends {end:%Y-%m-%d %H:%M} UTC): no invoice yet")
    existing = _issued(organization, month, currency)
    if existing is not None:
        return existing
    document, tax_lines = _snapshot(invoice_draft(organization, month, currency))
    items = document["items"]
    subtotal = lines_total(item["net_minor"] for item in items)
    tax_total = lines_total(item["tax_minor"] for item in items)
    issued_at = now.astimezone(dt.UTC).replace(microsecond=0)
    for _attempt in range(NUMBER_ATTEMPTS):
        try:
            with transaction.atomic():
                invoice = Invoice(
                    organization=organization, number=_next_number(issued_at.year), month=month, currency=currency,
                    subtotal_minor=subtotal, tax_minor=tax_total, total_minor=subtotal + tax_total, lines=document,
                    tax_lines=tax_lines, issued_at=issued_at,
                )  # fmt: skip
                invoice.sha256 = invoice_hash(invoice)
                invoice.save()
                ledger_append(
                    kind="invoice.issued",
                    subject=f"invoice:{invoice.number}",
                    payload={
                        "number": invoice.number, "month": month, "currency": currency,
                        "organization": organization.pk, "sha256": invoice.sha256, "subtotal_minor": subtotal,
                        "tax_minor": tax_total, "total_minor": subtotal + tax_total,
                    },
                )  # fmt: skip
            return invoice
        except IntegrityError:
            # Either this month's invoice was issued concurrently (answer with it) or another organisation's
            # invoice took the number (take the next).
            existing = _issued(organization, month, currency)
            if existing is not None:
                return existing
    raise RuntimeError(f"no free invoice number after {NUMBER_ATTEMPTS} attempts")


def previous_month(now: dt.datetime) -> str:
    first = now.astimezone(dt.UTC).replace(day=1)
    return (first - dt.timedelta(days=1)).strftime("%Y-%m")


def invoices_issue_due(now: dt.datetime, *, before_each: Callable[[], None] | None = None) -> list[Invoice]:
    """Issue last month's invoice of every organisation whose buyer account moved that month, each in its own
    transaction: one organisation's failure is logged and the others go on. Safe to run again. ``before_each``
    runs before each organisation (a sweep's clock check, which may raise to stop it)."""
    month = previous_month(now)
    start, end = month_bounds(month)
    due = (
        BookLine.objects.filter(
            account__kind=BookAccountKind.BUYER_CREDIT,
            account__organization__isnull=False,
            entry__created_at__gte=start,
            entry__created_at__lt=end,
        )
        .values_list("account__organization_id", "account__currency")
        .distinct()
        .order_by("account__organization_id", "account__currency")
    )
    issued = []
    for organization_id, currency in due:
        if before_each is not None:
            before_each()
        try:
            organization = Organization.objects.get(pk=organization_id)
            issued.append(invoice_issue(organization, month, currency, now=now))
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not one organisation's failure
        except Exception:
            log.exception("issuing the %s %s invoice of organisation %s failed", month, currency, organization_id)
    return issued


# --- Renderings --------------------------------------------------------------------------------------------------


def _rate_percent(rate: str | None) -> str:
    return "" if rate is None else f"{(Decimal(rate) * 100).normalize():f} %"


def invoice_csv(invoice: Invoice) -> str:
    """The invoice as CSV: a header row, one row per line, then one row per tax rate and the totals."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(
        ["invoice", "row", "date", "order", "description", "hours", "net", "tax_name", "tax_rate", "tax", "currency"]
    )
    number, currency = invoice.number, invoice.currency

    def money(amount_minor: int) -> str:
        return minor_text(amount_minor, currency)

    for item in invoice.lines["items"]:
        tax_name = f"{item['tax_country']} {item['tax_name']}".strip()
        writer.writerow(
            [number, item["type"], item["at"][:10], item["order"], item["description"],
             format((Decimal(item["seconds"]) / 3600).quantize(CENT), "f"), money(item["net_minor"]), tax_name,
             item["tax_rate"] or "", money(item["tax_minor"]), currency]
        )  # fmt: skip
    for tax in invoice.tax_lines:
        name = f"{tax['country']} {tax['name']}".strip() or "no tax"
        writer.writerow(
            [number, "tax", "", "", f"{name} on {money(tax['net_minor'])}", "", money(tax["net_minor"]),
             name, tax["rate"] or "", money(tax["tax_minor"]), currency]
        )  # fmt: skip
    writer.writerow([number, "subtotal", "", "", "", "", money(invoice.subtotal_minor), "", "", "", currency])
    writer.writerow([number, "tax_total", "", "", "", "", "", "", "", money(invoice.tax_minor), currency])
    writer.writerow([number, "total", "", "", "", "", money(invoice.total_minor), "", "", "", currency])
    return out.getvalue()


def _pdf_text(text: str) -> str:
    # The core fonts cover Latin-1 only; a name in another script is shown with replacements, not a failure.
    return text.encode("latin-1", "replace").decode("latin-1")


def invoice_pdf(invoice: Invoice, *, compress: bool = True) -> bytes:
    """The invoice as an A4 PDF: seller and buyer, number and month, the lines, the tax per rate and the total,
    every amount with its currency."""
    from fpdf import FPDF

    doc = invoice.lines
    cur = invoice.currency
    pdf = FPDF(orientation="P", unit="mm", format="A4")
    pdf.set_compression(compress)
    pdf.set_title(f"Invoice {invoice.number}")
    pdf.set_author(_pdf_text(doc["seller"]["name"]))
    pdf.add_page()
    pdf.set_auto_page_break(auto=True, margin=15)
    width = pdf.w - pdf.l_margin - pdf.r_margin

    def text(value: str, size: float = 10, style: str = "", h: float = 5) -> None:
        pdf.set_font("Helvetica", style=style, size=size)
        pdf.multi_cell(width, h, _pdf_text(value), new_x="LMARGIN", new_y="NEXT")

    text(f"Invoice {invoice.number}", size=18, style="B", h=9)
    text(f"Month: {invoice.month} (UTC)   Issued: {invoice.issued_at:%Y-%m-%d}   Currency: {cur}")
    pdf.ln(3)
    seller, buyer = doc["seller"], doc["buyer"]
    text("From", style="B")
    text("\n".join(v for v in [seller["name"], seller.get("address", ""), seller.get("tax_id", "")] if v))
    pdf.ln(2)
    text("To", style="B")
    buyer_rows = [buyer["name"], buyer["country"] and f"Country: {buyer['country']}"]
    text("\n".join(v for v in [*buyer_rows, buyer["tax_id"] and f"Tax id: {buyer['tax_id']}"] if v))
    pdf.ln(4)

    def fit(value: str, w: float) -> str:
        """``value`` cut (with "...") to ``w`` mm in the current font, so a long description stays in its column."""
        if pdf.get_string_width(value) <= w:
            return value
        while value and pdf.get_string_width(value + "...") > w:
            value = value[:-1]
        return value + "..."

    columns = [("Date", 20), ("Order", 22), ("Description", width - 20 - 22 - 14 - 30 - 24 - 30), ("Hours", 14),
               ("Net", 30), ("Tax", 24), ("Tax amount", 30)]  # fmt: skip
    pdf.set_font("Helvetica", style="B", size=8)
    for label, w in columns:
        pdf.cell(w, 6, label, border="B", align="R" if label in {"Hours", "Net", "Tax amount"} else "L")
    pdf.ln()
    pdf.set_font("Helvetica", size=8)
    for item in doc["items"]:
        tax = f"{item['tax_country']} {item['tax_name']} {_rate_percent(item['tax_rate'])}".strip() or "none"
        hours = format((Decimal(item["seconds"]) / 3600).quantize(CENT), "f") if item["seconds"] else ""
        cells = [item["at"][:10], item["order"][:8], item["description"][:200], hours,
                 money_text(item['net_minor'], cur), tax, money_text(item['tax_minor'], cur)]  # fmt: skip
        for (label, w), value in zip(columns, cells, strict=True):
            pdf.cell(w, 5, fit(_pdf_text(value), w - 1), align="R" if label in {"Hours", "Net", "Tax amount"} else "L")
        pdf.ln()
    if not doc["items"]:
        pdf.cell(width, 5, "No charges this month.")
        pdf.ln()
    pdf.ln(3)

    def total_row(label: str, value: str, style: str = "") -> None:
        pdf.set_font("Helvetica", style=style, size=10)
        pdf.cell(width - 40, 6, _pdf_text(label), align="R")
        pdf.cell(40, 6, value, align="R", new_x="LMARGIN", new_y="NEXT")

    total_row("Subtotal", money_text(invoice.subtotal_minor, cur))
    for tax in invoice.tax_lines:
        name = f"{tax['country']} {tax['name']} {_rate_percent(tax['rate'])}".strip() or "No tax"
        total_row(f"{name} on {money_text(tax['net_minor'], cur)}", money_text(tax["tax_minor"], cur))
    total_row("Total", money_text(invoice.total_minor, cur), style="B")
    if doc["payments"]:
        total_row("Payments received this month (prepaid credit)", money_text(doc["payments_minor"], cur))
    if doc["tax_note"]:
        pdf.ln(2)
        text(doc["tax_note"], size=8)
    pdf.ln(2)
    text(f"SHA-256 of this invoice (ledgered): {invoice.sha256}", size=7)
    return bytes(pdf.output())
