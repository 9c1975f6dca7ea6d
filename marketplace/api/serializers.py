"""Input and output serializers, one pair per operation."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from marketplace.models import Offer, Order


class OfferOutput(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu_model.key")
    provider = serializers.CharField(source="account.kind")
    price_per_gpu_hour_usd = serializers.DecimalField(max_digits=14, decimal_places=6)

    class Meta:
        model = Offer
        fields = [
            "id",
            "provider",
            "region",
            "zone",
            "instance_type",
            "pricing_model",
            "gpu_model",
            "gpu_count",
            "gpu_memory_gb",
            "vcpus",
            "memory_gib",
            "price",
            "currency",
            "price_usd",
            "price_per_gpu_hour_usd",
            "capacity",
            "interconnect",
            "status",
            "last_seen_at",
        ]


class OfferListInput(serializers.Serializer):
    gpu = serializers.CharField(required=False, allow_blank=True, max_length=32)
    count = serializers.IntegerField(required=False, min_value=1, max_value=64)
    region = serializers.CharField(required=False, allow_blank=True, max_length=64)
    pricing = serializers.ChoiceField(required=False, allow_blank=True, choices=["on_demand", "spot", "reserved"])
    max_price = serializers.DecimalField(required=False, max_digits=14, decimal_places=6, min_value=Decimal("0"))


class OrderPlaceInput(serializers.Serializer):
    offer = serializers.IntegerField(min_value=1)
    max_price_per_hour = serializers.DecimalField(
        required=False, max_digits=14, decimal_places=6, min_value=Decimal("0.000001")
    )
    allow_failover = serializers.BooleanField(required=False, default=True)
    regions = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=50
    )


class AttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    offer = serializers.IntegerField(source="offer_id")
    zone = serializers.CharField(source="offer.zone")
    instance_type = serializers.CharField(source="offer.instance_type")
    outcome = serializers.CharField()
    error_class = serializers.CharField()
    provider_code = serializers.CharField()
    provider_message = serializers.CharField()


class InstanceOutput(serializers.Serializer):
    provider_instance_id = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()
    instance_type = serializers.CharField()
    state = serializers.CharField()
    public_ip = serializers.CharField()


class OrderOutput(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id")
    gpu_model = serializers.CharField(source="gpu_model.key")
    attempts = AttemptOutput(many=True)
    instance = serializers.SerializerMethodField()
    ledger_head = serializers.SerializerMethodField()

    class Meta:
        model = Order
        fields = [
            "id",
            "state",
            "state_reason",
            "offer",
            "gpu_model",
            "gpu_count",
            "pricing_model",
            "regions",
            "max_price_per_hour",
            "price_per_hour",
            "allow_failover",
            "attempts",
            "instance",
            "ledger_head",
            "created_at",
            "state_changed_at",
        ]

    def get_instance(self, order: Order) -> dict[str, object] | None:
        instance = order.instance
        return None if instance is None else dict(InstanceOutput(instance).data)

    def get_ledger_head(self, order: Order) -> str | None:
        entries = self.context.get("ledger_heads", {})
        return entries.get(order.pk)
