from django.contrib import admin

from marketplace.models import Attempt, GpuModel, Instance, Membership, Offer, Order, Organization, QuarantinedOffer


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ["instance_type", "zone", "pricing_model", "gpu_model", "gpu_count", "price_usd", "status"]
    list_filter = ["status", "pricing_model", "gpu_model"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["public_id", "organization", "state", "gpu_model", "gpu_count", "price_per_hour", "created_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in Order._meta.fields]


admin.site.register([GpuModel, QuarantinedOffer, Attempt, Instance, Organization, Membership])
