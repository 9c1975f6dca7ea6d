from __future__ import annotations

from django.contrib import admin

from providers.models import Provider, ProviderAccount


@admin.register(ProviderAccount)
class ProviderAccountAdmin(admin.ModelAdmin):
    list_display = ["provider", "name", "kind", "enabled", "sync_status", "last_synced_at"]
    exclude = ["credentials_encrypted"]  # secrets are never shown again once saved


admin.site.register(Provider)
