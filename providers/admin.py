from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from providers.community.services import MachineInvalid, machine_decide
from providers.models import Machine, MachineState, Provider, ProviderAccount


@admin.register(ProviderAccount)
class ProviderAccountAdmin(admin.ModelAdmin):
    list_display = ["provider", "name", "kind", "enabled", "sync_status", "last_synced_at"]
    exclude = ["credentials_encrypted"]  # secrets are never shown again once saved


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    """Staff verify machines after reading their self-test; each decision is ledgered."""

    list_display = ["name", "account", "gpu_count", "gpu_model", "region", "state", "online", "self_test_ok",
                    "last_heartbeat_at"]  # fmt: skip
    list_filter = ["state", "online", "self_test_ok"]
    exclude = ["secret_encrypted"]
    readonly_fields = ["key_id", "agent_url", "hardware", "self_test", "self_test_ok", "registered_at",
                       "last_heartbeat_at", "online"]  # fmt: skip
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


admin.site.register(Provider)
