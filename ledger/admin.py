from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ledger.models import Anchor, Checkpoint, LedgerEntry, PersonalDatum
from ledger.services import personal_erase


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows are append-only: staff may look, never add, change or delete."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ["sequence", "kind", "subject", "entry_hash", "created_at"]
    search_fields = ["subject", "kind"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["size", "root_hash", "key_id", "created_at"]


@admin.register(Anchor)
class AnchorAdmin(ReadOnlyAdmin):
    list_display = ["checkpoint", "chain_id", "tx_hash", "block_number", "anchored_at"]


@admin.register(PersonalDatum)
class PersonalDatumAdmin(ReadOnlyAdmin):
    """Personal data the ledger commits to. Erasure deletes it; the ledger's entries and proofs stay valid."""

    list_display = ["person", "commitment", "created_at"]
    search_fields = ["person"]
    actions = ["erase_people"]

    @admin.action(description="Erase all personal data of the selected people")
    def erase_people(self, request: HttpRequest, queryset: QuerySet[PersonalDatum]) -> None:
        people = sorted(set(queryset.values_list("person", flat=True)))
        staff = getattr(request.user, "pk", None)
        erased = sum(personal_erase(person=p, reason=f"erasure by staff user {staff} in the admin") for p in people)
        self.message_user(request, f"Erased {erased} record(s) of {len(people)} people.", messages.SUCCESS)
