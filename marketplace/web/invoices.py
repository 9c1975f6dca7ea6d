"""Storefront invoices: the organisation's issued invoices and this month's draft so far, one invoice's page,
and its PDF and CSV. Members of the organisation only: another organisation's invoice is a 404."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from marketplace.billing.invoices import invoice_csv, invoice_draft, invoice_get, invoice_pdf
from marketplace.models import Invoice, Organization
from marketplace.money import money_text
from marketplace.web.orgs import buyer_access


def _hours(seconds: int) -> str:
    return format((Decimal(seconds) / 3600).quantize(Decimal("0.01")), "f") if seconds else ""


def _invoice_or_404(organization: Organization, number: str) -> Invoice:
    invoice = invoice_get(organization, number)
    if invoice is None:
        raise Http404("no such invoice")
    return invoice


@login_required
def invoices(request: HttpRequest) -> HttpResponse:
    """Issued invoices, newest first, and the current month's draft from the book as it stands."""
    organization = buyer_access(request).organization
    month = timezone.now().strftime("%Y-%m")
    draft = invoice_draft(organization, month)

    def money(amount_minor: int) -> str:
        return money_text(amount_minor, draft.currency)

    issued = Invoice.objects.filter(organization=organization).order_by("-month", "-number")
    return render(
        request,
        "storefront/invoices.html",
        {
            "organization": organization,
            "invoices": [(invoice, money_text(invoice.total_minor, invoice.currency)) for invoice in issued],
            "draft": draft,
            "draft_lines": [(line, money(line.net_minor), money(line.tax_minor)) for line in draft.lines],
            "draft_subtotal": money(draft.subtotal_minor),
            "draft_tax": money(draft.tax_minor),
            "draft_total": money(draft.total_minor),
        },
    )


@login_required
def invoice_detail(request: HttpRequest, number: str) -> HttpResponse:
    organization = buyer_access(request).organization
    invoice = _invoice_or_404(organization, number)
    doc = invoice.lines

    def money(amount_minor: int) -> str:
        return money_text(amount_minor, invoice.currency)

    return render(
        request,
        "storefront/invoice_detail.html",
        {
            "organization": organization,
            "invoice": invoice,
            # Not "buyer": the base template's header names its own context so.
            "invoice_seller": doc["seller"],
            "invoice_buyer": doc["buyer"],
            "items": [
                (item, _hours(item["seconds"]), money(item["net_minor"]), money(item["tax_minor"]))
                for item in doc["items"]
            ],
            "tax_lines": [(tax, money(tax["net_minor"]), money(tax["tax_minor"])) for tax in invoice.tax_lines],
            "payments_total": money(doc["payments_minor"]),
            "has_payments": bool(doc["payments"]),
            "tax_note": doc["tax_note"],
            "subtotal": money(invoice.subtotal_minor),
            "tax_total": money(invoice.tax_minor),
            "total": money(invoice.total_minor),
        },
    )


@login_required
def invoice_pdf_view(request: HttpRequest, number: str) -> HttpResponse:
    invoice = _invoice_or_404(buyer_access(request).organization, number)
    response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="invoice-{invoice.number}.pdf"'
    return response


@login_required
def invoice_csv_view(request: HttpRequest, number: str) -> HttpResponse:
    invoice = _invoice_or_404(buyer_access(request).organization, number)
    response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="invoice-{invoice.number}.csv"'
    return response
