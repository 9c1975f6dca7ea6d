"""Migration 0012 gives provider organisations that predate the portal a profile, keeping sellers selling."""

from __future__ import annotations

BEFORE = [("marketplace", "0011_listing_reservations")]
AFTER = [("marketplace", "0012_provider_portal")]


def test_existing_provider_organisations_get_a_profile_verified_only_if_already_selling(migrate_to):
    old = migrate_to(BEFORE)
    Provider = old.get_model("providers", "Provider")
    ProviderAccount = old.get_model("providers", "ProviderAccount")
    Organization = old.get_model("marketplace", "Organization")
    selling = Provider.objects.create(name="Selling Cloud")
    ProviderAccount.objects.create(provider=selling, kind="aws", name="main", regions=["us-east-1"], enabled=True)
    idle = Provider.objects.create(name="Idle Cloud")
    Organization.objects.create(name="Selling Cloud", kind="provider", provider=selling)
    Organization.objects.create(name="Idle Cloud", kind="provider", provider=idle)
    Organization.objects.create(name="A Buyer", kind="buyer")

    new = migrate_to(AFTER)
    profiles = new.get_model("marketplace", "ProviderProfile").objects.order_by("organization__name")
    assert [(p.organization.name, p.state) for p in profiles] == [
        ("Idle Cloud", "pending"),
        ("Selling Cloud", "verified"),
    ]
    assert new.get_model("providers", "ProviderAccount").objects.get().enabled is True
