from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from marketplace.billing.credit import money
from marketplace.billing.payments import TopUpRefused, order_refund, order_refundable_minor
from marketplace.machines import machine_decide
from marketplace.models import (
    Attempt,
    BookEntry,
    GpuModel,
    Instance,
    Invoice,
    Membership,
    Offer,
    Order,
    Organization,
    Payout,
    ProviderProfile,
    ProviderState,
    QuarantinedOffer,
    ReconciliationMismatch,
    ReconciliationRun,
    StripeEvent,
    TopUp,
)
from marketplace.portal.services import PortalError, provider_state_change
from providers.community.services import PRICE_FALL_FIELDS, MachineInvalid
from providers.models import Machine, MachineState


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ["instance_type", "zone", "pricing_model", "gpu_model", "gpu_count", "price_usd", "status"]
    list_filter = ["status", "pricing_model", "gpu_model"]


class RefundReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=255,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Shown to the buyer on the invoice's credit line and kept on the book entry. No personal data.",
    )


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["public_id", "organization", "state", "gpu_model", "gpu_count", "price_per_hour", "created_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in Order._meta.fields]
    actions = ["refund_to_credit"]

    @admin.action(
        description="Refund what is left of the selected ended orders' charges as credit", permissions=["change"]
    )
    def refund_to_credit(self, request: HttpRequest, queryset: QuerySet[Order]) -> object:
        """The intermediate page asks for the reason; then one refund (and transaction) per order, so one
        refused order (still running, never charged) does not hold back the others."""
        form = RefundReasonForm(request.POST if "apply" in request.POST else None)
        orders = list(queryset.select_related("organization").order_by("pk"))
        if form.is_bound and form.is_valid():
            done = 0
            for order in orders:
                left = order_refundable_minor(order)
                try:
                    # Keyed by what was refunded before: submitting the page twice refunds once.
                    order_refund(order=order, amount_minor=left, key=f"left:{left}", reason=form.cleaned_data["reason"])
                except TopUpRefused as error:
                    self.message_user(request, f"{order.public_id}: {error}", messages.ERROR)
                else:
                    done += 1
            if done:
                self.message_user(request, f"{done} order{'s' if done != 1 else ''} refunded.", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "admin/order_refund.html",
            {
                **self.admin_site.each_context(request),
                "title": "Refund orders to credit",
                "opts": self.model._meta,
                "orders": [(order, money(order_refundable_minor(order))) for order in orders],
                "form": form,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            },
        )


class StateReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Recorded on the provider and in the ledger. No personal data: the ledger cannot forget it.",
    )


@admin.register(ProviderProfile)
class ProviderProfileAdmin(admin.ModelAdmin):
    """Marketplace staff verify or suspend providers here; the state changes only through the two actions."""

    list_display = ["organization", "state", "legal_name", "country", "terms_version", "state_changed_at"]
    list_filter = ["state", "country"]
    search_fields = ["organization__name", "legal_name", "tax_id"]
    readonly_fields = [f.name for f in ProviderProfile._meta.fields]
    actions = ["verify", "suspend"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # profiles are made by signing up

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def _decide(self, request: HttpRequest, queryset: QuerySet[ProviderProfile], to: str, action: str) -> object:
        """The intermediate page asking for the reason; once given, one service call (and transaction) per
        provider, so one refused transition does not hold back the others."""
        form = StateReasonForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            done = 0
            for profile in queryset.order_by("pk"):
                try:
                    provider_state_change(
                        profile_id=profile.pk, to=to, reason=form.cleaned_data["reason"], by=request.user
                    )
                except PortalError as error:
                    self.message_user(request, error.message, messages.ERROR)
                else:
                    done += 1
            if done:
                self.message_user(request, f"{done} provider{'s' if done != 1 else ''} {to}.", messages.SUCCESS)
            return None
        return TemplateResponse(
            request,
            "portal/admin_state_change.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{action.capitalize()} providers",
                "opts": self.model._meta,
                "profiles": queryset.select_related("organization"),
                "form": form,
                "action": action,
                "to": to,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Verify the selected providers (their accounts sell)", permissions=["change"])
    def verify(self, request: HttpRequest, queryset: QuerySet[ProviderProfile]) -> object:
        return self._decide(request, queryset, ProviderState.VERIFIED, "verify")

    @admin.action(description="Suspend the selected providers (their accounts stop selling)", permissions=["change"])
    def suspend(self, request: HttpRequest, queryset: QuerySet[ProviderProfile]) -> object:
        return self._decide(request, queryset, ProviderState.SUSPENDED, "suspend")


admin.site.register([GpuModel, QuarantinedOffer, Attempt, Instance, Organization, Membership])


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Money records change through their services only (marketplace/billing): staff read them here."""

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(TopUp)
class TopUpAdmin(_ReadOnlyAdmin):
    list_display = ["public_id", "organization", "amount_minor", "currency", "state", "automatic", "created_at"]
    list_filter = ["state", "automatic"]


@admin.register(Payout)
class PayoutAdmin(_ReadOnlyAdmin):
    list_display = ["public_id", "organization", "amount_minor", "currency", "state", "failure_code", "created_at"]
    list_filter = ["state"]


@admin.register(Invoice)
class InvoiceAdmin(_ReadOnlyAdmin):
    list_display = ["number", "organization", "month", "currency", "total_minor", "issued_at"]


@admin.register(StripeEvent)
class StripeEventAdmin(_ReadOnlyAdmin):
    list_display = ["event_id", "type", "account", "received_at", "ignored", "outcome"]
    list_filter = ["ignored", "type"]


class _MismatchInline(admin.TabularInline):
    model = ReconciliationMismatch
    extra = 0
    can_delete = False
    fields = ["kind", "stripe_object", "account", "book_key", "stripe_minor", "book_minor", "detail", "reviewed_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(_ReadOnlyAdmin):
    list_display = ["day", "finished_at", "stripe_items", "book_items", "matched", "mismatches", "error"]
    inlines = [_MismatchInline]


@admin.register(ReconciliationMismatch)
class ReconciliationMismatchAdmin(admin.ModelAdmin):
    """Where staff see what Stripe and the book disagree on. Nothing here changes money: staff correct the book
    through its services (a refund, a payout) and then mark the mismatch reviewed with a note."""

    list_display = ["found_at", "kind", "detail", "stripe_object", "book_key", "reviewed_at", "review_note"]
    list_filter = ["kind", ("reviewed_at", admin.EmptyFieldListFilter)]
    search_fields = ["stripe_object", "book_key", "account", "detail"]
    fields = [
        "run", "kind", "detail", "stripe_object", "account", "book_key", "currency", "stripe_minor", "book_minor",
        "found_at", "reviewed_at", "reviewed_by", "review_note",
    ]  # fmt: skip
    readonly_fields = [f for f in fields if f != "review_note"]
    actions = ["mark_reviewed"]

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def save_model(self, request, obj, form, change):  # type: ignore[no-untyped-def]
        # Writing a note is reviewing it.
        if obj.review_note and obj.reviewed_at is None:
            obj.reviewed_at, obj.reviewed_by = timezone.now(), request.user
        super().save_model(request, obj, form, change)

    @admin.action(description="Mark reviewed (checked by hand)", permissions=["change"])
    def mark_reviewed(self, request, queryset):  # type: ignore[no-untyped-def]
        done = queryset.filter(reviewed_at__isnull=True).update(reviewed_at=timezone.now(), reviewed_by=request.user)
        self.message_user(request, f"{done} mismatch(es) marked reviewed.")


@admin.register(BookEntry)
class BookEntryAdmin(_ReadOnlyAdmin):
    list_display = ["public_id", "kind", "key", "memo", "created_at"]
    list_filter = ["kind"]


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    """Staff verify independent providers' machines after reading their self-test; each decision is the market's,
    ledgered (``marketplace.machines``)."""

    list_display = ["name", "account", "gpu_count", "gpu_model", "region", "state", "online", "self_test_ok",
                    "last_heartbeat_at"]  # fmt: skip
    list_filter = ["state", "online", "self_test_ok"]
    exclude = ["secret_encrypted"]
    # The price falls are the seller's to set, through the portal's checks (providers.community.services).
    readonly_fields = ["key_id", "agent_url", "hardware", "self_test", "self_test_ok", "registered_at",
                       "last_heartbeat_at", "online", *PRICE_FALL_FIELDS]  # fmt: skip
    actions = ["verify", "suspend"]

    @admin.action(description="Verify the selected machines (their self-test passed)")
    def verify(self, request: HttpRequest, queryset: QuerySet[Machine]) -> None:
        for machine in queryset.order_by("pk"):
            try:
                machine_decide(
                    machine=machine, state=MachineState.VERIFIED, by=request.user,
                    reason="self-test matched the listing; verified by staff",
                )  # fmt: skip
            except MachineInvalid as exc:
                # What differs from the listing, as the provider sees it on the portal.
                self.message_user(request, f"Machine {machine.name}: {exc}", messages.ERROR)

    @admin.action(description="Suspend the selected machines")
    def suspend(self, request: HttpRequest, queryset: QuerySet[Machine]) -> None:
        for machine in queryset:
            machine_decide(machine=machine, state=MachineState.SUSPENDED, by=request.user, reason="suspended by staff")
