from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from marketplace.catalog.regions import JURISDICTIONS
from marketplace.matching import PROFILES, Profile, Tolerance
from marketplace.models import GpuModel, Role, TokenScope
from marketplace.models.organizations import BUYER_ROLES
from marketplace.portal.forms import SignupForm

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


class WorkloadForm(forms.Form):
    """The storefront's workload wizard: a profile and what the buyer wants to override of its defaults."""

    profile = forms.ChoiceField(
        choices=[(p.value, f"{p.value.replace('_', '-')}: {PROFILES[p].description}") for p in Profile]
    )
    gpu_count = forms.IntegerField(required=False, min_value=1, max_value=64, label="GPUs")
    total_gpu_memory_gb = forms.IntegerField(
        required=False, min_value=1, max_value=16384, label="or total GPU memory (GB)"
    )
    duration_hours = forms.FloatField(initial=8, min_value=0.01, max_value=8760, label="Hours")
    jurisdiction = forms.ChoiceField(
        required=False, choices=[("", "anywhere"), *((j, j) for j in JURISDICTIONS)], label="Data must stay in"
    )
    pricing = forms.ChoiceField(
        required=False,
        choices=[("", "on-demand or spot"), ("on_demand", "on-demand only"), ("spot", "spot only")],
        label="Pricing",
    )
    interruption_tolerance = forms.ChoiceField(
        choices=[(t.value, t.value) for t in Tolerance], initial=Tolerance.CHECKPOINTED.value, label="Interruptions"
    )
    max_price_per_hour = forms.DecimalField(
        required=False, min_value=Decimal("0.000001"), decimal_places=6, label="Max $/h"
    )

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if data.get("gpu_count") and data.get("total_gpu_memory_gb"):
            self.add_error("total_gpu_memory_gb", "give GPUs or total memory, not both")
        return data

    def demand_data(self) -> dict[str, object]:
        """The cleaned form in the API's DemandInput shape, so both go through one conversion."""
        d = self.cleaned_data
        data: dict[str, object] = {
            "profile": d["profile"],
            "duration_hours": d["duration_hours"],
            "interruption_tolerance": d["interruption_tolerance"],
            "checkpoint_interval_hours": 1.0,
            "gpu_models": [],
            "regions": [],
            "jurisdictions": [d["jurisdiction"]] if d["jurisdiction"] else [],
            "pricing_models": [d["pricing"]] if d["pricing"] else [],
        }
        for key in ("gpu_count", "total_gpu_memory_gb", "max_price_per_hour"):
            if d.get(key) is not None:
                data[key] = d[key]
        return data


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="what uses it, e.g. ci-pipeline")
    scopes = forms.MultipleChoiceField(
        choices=TokenScope.choices, widget=forms.CheckboxSelectMultiple, help_text="only what that program needs"
    )


class BudgetForm(forms.Form):
    """The organisation's spending limits in USD; a blank field removes that limit."""

    budget_per_hour = forms.DecimalField(
        required=False, min_value=Decimal("0.01"), max_digits=14, decimal_places=2, label="Hourly budget (USD/h)"
    )
    budget_monthly = forms.DecimalField(
        required=False, min_value=Decimal("0.01"), max_digits=14, decimal_places=2, label="Monthly budget (USD)"
    )


# --- Buyer organisations: signing up and the team -------------------------------------------------------------

BUYER_ROLE_CHOICES = [(role.value, role.label) for role in BUYER_ROLES]


class BuyerSignupForm(SignupForm):
    """The provider portal's sign-up fields (the site's password validators included), for a buyer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["organization_name"].help_text = "your company or team, as teammates will see it; must be unique"
        self.fields["email"].help_text = "invitations to other organisations come to this address"


class BuyerInviteForm(forms.Form):
    email = forms.EmailField(widget=forms.EmailInput(attrs={"placeholder": "name@example.com"}))
    role = forms.ChoiceField(choices=BUYER_ROLE_CHOICES, initial=Role.MEMBER.value)

    def clean_email(self) -> str:
        return str(self.cleaned_data["email"]).strip().lower()


class BuyerRoleForm(forms.Form):
    role = forms.ChoiceField(choices=BUYER_ROLE_CHOICES)
