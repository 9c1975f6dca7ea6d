from __future__ import annotations

from decimal import Decimal

from django import forms

from marketplace.models import GpuModel

PRICING = [("", "any"), ("on_demand", "on-demand"), ("spot", "spot")]


class OfferFilterForm(forms.Form):
    gpu = forms.ChoiceField(required=False, label="GPU")
    count = forms.IntegerField(required=False, min_value=1, max_value=64, label="GPUs at least")
    region = forms.CharField(required=False, max_length=64)
    pricing = forms.ChoiceField(required=False, choices=PRICING)
    max_price = forms.DecimalField(required=False, min_value=Decimal("0"), decimal_places=4, label="Max $/h")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        keys = GpuModel.objects.filter(offers__isnull=False).values_list("key", flat=True).distinct().order_by("key")
        self.fields["gpu"].choices = [("", "any"), *((k, k) for k in keys)]  # type: ignore[attr-defined]


class OrderPlaceForm(forms.Form):
    offer = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    max_price_per_hour = forms.DecimalField(required=False, min_value=Decimal("0.000001"), decimal_places=6)
    allow_failover = forms.BooleanField(required=False, initial=True)
