"""API views for issued invoices: the list, one invoice as JSON, and its PDF and CSV. The organisation is the
token's (``request_organization``); another organisation's invoice is a 404."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api import pagination
from marketplace.api.outputs import InvoicePageOutput, IssuedInvoiceOutput
from marketplace.api.schema import ERROR
from marketplace.api.tokens import request_organization
from marketplace.billing.invoices import invoice_csv, invoice_document, invoice_get, invoice_pdf
from marketplace.models import Invoice

# The same scopes as the month's running invoice (GET /api/v1/invoice).
INVOICE_SCOPES = {"GET": ("orders:place", "instances:manage")}


def _invoice_or_404(request: Request, number: str) -> Invoice:
    invoice = invoice_get(request_organization(request), number)
    if invoice is None:
        raise NotFound("no such invoice")
    return invoice


def _summary(invoice: Invoice) -> dict[str, object]:
    return {
        "number": invoice.number,
        "month": invoice.month,
        "currency": invoice.currency,
        "issued_at": invoice.issued_at.isoformat(),
        "subtotal_minor": invoice.subtotal_minor,
        "tax_minor": invoice.tax_minor,
        "total_minor": invoice.total_minor,
        "sha256": invoice.sha256,
    }


class InvoiceListApi(APIView):
    """GET /api/v1/invoices: the organisation's issued invoices, newest first (cursor pagination), amounts in
    minor units of ``currency``."""

    required_scopes = INVOICE_SCOPES

    @extend_schema(
        operation_id="invoices_list", parameters=pagination.PARAMETERS, responses={200: InvoicePageOutput, 400: ERROR}
    )
    def get(self, request: Request) -> Response:
        invoices = Invoice.objects.filter(organization=request_organization(request))
        keys = [pagination.Key("id", descending=True)]
        page = pagination.paginate(request, invoices.order_by("-id"), keys=keys, tag=pagination.listing_tag("invoices"))
        return Response(page.body(request, [_summary(invoice) for invoice in page.rows]))


class InvoiceDetailApi(APIView):
    """GET /api/v1/invoices/<number>: the issued invoice as kept (its ``sha256`` is the canonical hash of
    ``invoice``, ledgered as ``invoice.issued``)."""

    required_scopes = INVOICE_SCOPES

    @extend_schema(operation_id="invoice_issued_retrieve", responses={200: IssuedInvoiceOutput, 404: ERROR})
    def get(self, request: Request, number: str) -> Response:
        invoice = _invoice_or_404(request, number)
        return Response({"invoice": invoice_document(invoice), "sha256": invoice.sha256})


class _DownloadApi(APIView):
    required_scopes = INVOICE_SCOPES

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[object, str]:
        # A client asking for the file's own type (Accept: application/pdf) must not get a 406: the file is
        # answered as is, and errors fall back to the one JSON error shape.
        return super().perform_content_negotiation(request, force=True)


class InvoicePdfApi(_DownloadApi):
    """GET /api/v1/invoices/<number>.pdf: the invoice as an A4 PDF (attachment)."""

    @extend_schema(
        operation_id="invoice_pdf_retrieve",
        responses={(200, "application/pdf"): OpenApiTypes.BINARY, 404: ERROR},
    )
    def get(self, request: Request, number: str) -> HttpResponse:
        invoice = _invoice_or_404(request, number)
        response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
        response["Content-Disposition"] = f'attachment; filename="invoice-{invoice.number}.pdf"'
        return response


class InvoiceCsvApi(_DownloadApi):
    """GET /api/v1/invoices/<number>.csv: the invoice as CSV (attachment)."""

    @extend_schema(
        operation_id="invoice_csv_retrieve",
        responses={(200, "text/csv"): OpenApiTypes.STR, 404: ERROR},
    )
    def get(self, request: Request, number: str) -> HttpResponse:
        invoice = _invoice_or_404(request, number)
        response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="invoice-{invoice.number}.csv"'
        return response
