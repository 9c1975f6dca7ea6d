"""Forms of the provider portal. Every field validates on its own and says what is wrong next to it."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.contrib.auth import get_user_model, password_validation
from django.core.validators import RegexValidator, URLValidator

from marketplace.models import PROVIDER_ROLES, ProviderProfile
from marketplace.numbers import DecimalFormField, IntegerFormField, number_problem
from marketplace.portal.clouds import Cloud, CloudField
from marketplace.portal.countries import COUNTRIES
from marketplace.portal.price_falls import pct
from marketplace.portal.services import TERMS_VERSION, AccountInput, BusinessDetails
from providers import ratelimit
from providers.community.mig import mig_profiles_problem
from providers.community.pricing import PriceFallRule, PriceRuleError, price_fall_rule_read
from providers.text import name_problem


def _label(choice: tuple[str, str]) -> str:
    return choice[1]


def readable_name(value: str) -> None:
    """Refuse a name other people read that holds control or invisible formatting characters
    (``providers.text.name_problem``)."""
    if problem := name_problem(value):
        raise forms.ValidationError(problem)


ROLE_CHOICES = [(role.value, role.label) for role in PROVIDER_ROLES]
COUNTRY_CHOICES = [("", "choose a country"), *sorted(((c, f"{n} ({c})") for c, n in COUNTRIES.items()), key=_label)]
_TAX_ID = re.compile(r"[A-Z0-9][A-Z0-9.\-/]{3,31}")
MAX_REGIONS = 64


class WebURLField(forms.URLField):
    """An endpoint the adapters call: http or https only (Django's URLField also admits ftp)."""

    default_validators = [URLValidator(schemes=["http", "https"])]


class _PasswordsForm(forms.Form):
    """A new password typed twice, checked against the site's password validators."""

    password1 = forms.CharField(
        label="Password", strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )
    password2 = forms.CharField(
        label="Password again", strip=False, widget=forms.PasswordInput(attrs={"autocomplete": "new-password"})
    )

    def _user_for_validation(self) -> Any:
        return get_user_model()(username=self.cleaned_data.get("username", ""))

    def clean_password2(self) -> str:
        first, second = self.cleaned_data.get("password1"), self.cleaned_data["password2"]
        if first and first != second:
            raise forms.ValidationError("the two passwords differ")
        return second

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        password = data.get("password1")
        if password:
            try:
                # After the other fields, so "too similar to the username" can be judged.
                password_validation.validate_password(password, self._user_for_validation())
            except forms.ValidationError as error:
                self.add_error("password1", error)
        return data


class SignupForm(_PasswordsForm):
    username = forms.CharField(
        max_length=150,
        validators=[get_user_model().username_validator],
        help_text="letters, digits and @ . + - _",
        widget=forms.TextInput(attrs={"autocomplete": "username", "autofocus": True}),
    )
    email = forms.EmailField(label="Your email", widget=forms.EmailInput(attrs={"autocomplete": "email"}))
    organization_name = forms.CharField(
        label="Organisation name", max_length=120, help_text="how buyers will see you; must be unique"
    )
    field_order = ["username", "email", "password1", "password2", "organization_name"]

    def clean_organization_name(self) -> str:
        name = " ".join(self.cleaned_data["organization_name"].split())
        readable_name(name)  # after the whitespace is made plain spaces: a pasted tab is no harm
        if len(name) < 2:
            raise forms.ValidationError("give at least 2 characters")
        return name

    def _user_for_validation(self) -> Any:
        return get_user_model()(username=self.cleaned_data.get("username", ""), email=self.cleaned_data.get("email"))


class InvitationSignupForm(_PasswordsForm):
    """Signing up from an invitation: the address is the invited one, so only a username and a password."""

    username = forms.CharField(
        max_length=150,
        validators=[get_user_model().username_validator],
        widget=forms.TextInput(attrs={"autocomplete": "username"}),
    )
    field_order = ["username", "password1", "password2"]


class DetailsForm(forms.Form):
    legal_name = forms.CharField(max_length=200, help_text="as registered")
    country = forms.ChoiceField(choices=COUNTRY_CHOICES, help_text="of registration")
    registered_address = forms.CharField(max_length=1000, widget=forms.Textarea(attrs={"rows": 3}))
    tax_id = forms.CharField(label="Tax / VAT id", max_length=40, help_text="e.g. DE123456789")
    contact_email = forms.EmailField(label="Contact email", help_text="for the marketplace's questions")

    @classmethod
    def for_profile(cls, profile: ProviderProfile, data: Any = None) -> DetailsForm:
        initial = {
            "legal_name": profile.legal_name,
            "country": profile.country,
            "registered_address": profile.registered_address,
            "tax_id": profile.tax_id,
            "contact_email": profile.contact_email,
        }
        return cls(data, initial=initial)

    def clean_legal_name(self) -> str:
        name = " ".join(self.cleaned_data["legal_name"].split())
        readable_name(name)
        return name

    def clean_tax_id(self) -> str:
        value = re.sub(r"\s+", "", self.cleaned_data["tax_id"]).upper()
        if not _TAX_ID.fullmatch(value):
            raise forms.ValidationError("use 4 to 32 letters and digits (dots, dashes and slashes allowed)")
        return value

    def clean_registered_address(self) -> str:
        lines = [" ".join(line.split()) for line in self.cleaned_data["registered_address"].splitlines()]
        for line in lines:
            readable_name(line)
        value = "\n".join(line for line in lines if line)
        if len(value) < 5:
            raise forms.ValidationError("give the full registered address")
        return value

    def details(self) -> BusinessDetails:
        d = self.cleaned_data
        return BusinessDetails(
            legal_name=d["legal_name"],
            country=d["country"],
            registered_address=d["registered_address"],
            tax_id=d["tax_id"],
            contact_email=d["contact_email"].lower(),
        )


class TermsForm(forms.Form):
    version = forms.CharField(widget=forms.HiddenInput, initial=TERMS_VERSION)
    accept = forms.BooleanField(label=f"I accept the provider terms, version {TERMS_VERSION}, for my organisation")


class InviteForm(forms.Form):
    email = forms.EmailField(widget=forms.EmailInput(attrs={"placeholder": "name@example.com"}))
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial="operator")

    def clean_email(self) -> str:
        return self.cleaned_data["email"].strip().lower()


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


# --- Cloud accounts -------------------------------------------------------------------------------------------


class SecretTextarea(forms.Textarea):
    """A textarea that never writes its value back into the page (a key file pasted into a refused form)."""

    def format_value(self, value: Any) -> None:
        return None


def _cloud_field(spec: CloudField, *, required: bool, credential: bool) -> forms.Field:
    attrs = {"autocomplete": "off", "spellcheck": "false"}
    field: forms.Field
    if spec.kind == "textarea":
        textarea = SecretTextarea if spec.secret else forms.Textarea
        widget = textarea(attrs={**attrs, "rows": 6 if spec.secret else 3})
        field = forms.CharField(widget=widget, max_length=20000, strip=True)
    elif spec.kind == "url":
        field = WebURLField(assume_scheme="https", max_length=500)
    elif spec.kind in ("number", "integer"):
        field = forms.CharField(max_length=20, widget=forms.TextInput(attrs={"inputmode": "decimal"}))
    elif spec.secret:
        field = forms.CharField(
            max_length=4000, strip=True, widget=forms.PasswordInput(attrs={**attrs, "autocomplete": "new-password"})
        )
    else:
        field = forms.CharField(max_length=500 if credential else 2000, strip=True, widget=forms.TextInput(attrs=attrs))
    field.required = required
    field.label = spec.label
    field.help_text = spec.help
    if spec.validator is not None:
        field.validators.append(spec.validator)
    return field


# An option with no stated bound still gets one: its text is checked before Decimal() reads it (issue 17).
_OPTION_BOUND = Decimal(10**12)


def _number(spec: CloudField, raw: str) -> str:
    low = Decimal(str(spec.min_value)) if spec.min_value is not None else -_OPTION_BOUND
    high = Decimal(str(spec.max_value)) if spec.max_value is not None else _OPTION_BOUND
    if number_problem(raw, low=low, high=high, whole=spec.kind == "integer", in_range=False):
        whole = "a whole " if spec.kind == "integer" else "a "
        raise forms.ValidationError(f"enter {whole}number, written with the digits 0-9")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise forms.ValidationError("enter a number") from None
    if not value.is_finite():
        raise forms.ValidationError("enter a number")
    if spec.kind == "integer" and value != value.to_integral_value():
        raise forms.ValidationError("enter a whole number")
    if spec.min_value is not None and value < Decimal(str(spec.min_value)):
        raise forms.ValidationError(f"at least {spec.min_value:g}")
    if spec.max_value is not None and value > Decimal(str(spec.max_value)):
        raise forms.ValidationError(f"at most {spec.max_value:g}")
    return str(int(value)) if spec.kind == "integer" else format(value.normalize(), "f")


class AccountForm(forms.Form):
    """One cloud account: its name, regions and endpoint, the cloud's credentials and options.

    On an existing account the credentials are write-only: their inputs start empty, an empty input keeps the
    stored value, and the page only says which are set."""

    name = forms.CharField(
        max_length=120,
        validators=[RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", "letters, digits, dots, dashes and underscores")],
        help_text="yours to choose, e.g. main or eu-prod",
    )
    regions = forms.CharField(max_length=2000, help_text="comma-separated")
    endpoint_url = WebURLField(
        label="Endpoint override",
        required=False,
        assume_scheme="https",
        max_length=500,
        help_text="optional: a sovereign region's or a private endpoint",
    )

    rate_limits = forms.CharField(
        label="Request rate limits",
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=(
            "optional, only where your cloud granted this account other limits than its defaults: one bucket per "
            "line, group = capacity/refill per second. Every worker of the marketplace shares them."
        ),
    )

    def __init__(
        self,
        data: Any = None,
        *,
        cloud: Cloud,
        editing: bool = False,
        stored: frozenset[str] = frozenset(),
        **kwargs: Any,
    ):
        super().__init__(data, **kwargs)
        self.cloud = cloud
        self.stored = stored
        self.editing = editing
        self.fields["regions"].help_text = f"comma-separated, e.g. {', '.join(cloud.region_examples)}"
        self.fields["endpoint_url"].label = cloud.endpoint_label
        self.fields["endpoint_url"].help_text = cloud.endpoint_help
        self.fields["regions"].widget.attrs["placeholder"] = ", ".join(cloud.region_examples)
        for spec in cloud.credentials:
            self.fields[spec.key] = _cloud_field(
                spec, required=spec.required and spec.key not in stored, credential=True
            )
            if spec.key in stored:
                self.fields[spec.key].widget.attrs["placeholder"] = "set: leave empty to keep"
                if not spec.required:
                    self.fields[f"clear_{spec.key}"] = forms.BooleanField(required=False, label="remove")
            elif spec.secret and self.is_bound:
                self.fields[spec.key].widget.attrs["placeholder"] = "enter it again: secrets are never sent back"
        for spec in cloud.all_options:
            self.fields[spec.key] = _cloud_field(spec, required=False, credential=False)
        groups = sorted(ratelimit.account_groups(cloud.kind))
        if groups:
            # The bucket a poll of running orders draws on, where the cloud has one by that name.
            preferred = ("DescribeInstances", "cvm/DescribeInstances", "arm/reads", "compute/reads")
            example = next((g for g in preferred if g in groups), groups[0])
            self.fields["rate_limits"].widget.attrs["placeholder"] = f"{example} = 100/20"
        else:
            del self.fields["rate_limits"]
        if self.editing:
            self.fields["name"].disabled = True

    def credential_fields(self) -> list[tuple[forms.BoundField, bool, forms.BoundField | None]]:
        """(input, whether a value is stored, the "remove" checkbox if any), in the cloud's order."""
        clear = {name: self[name] for name in self.fields if name.startswith("clear_")}
        return [(self[s.key], s.key in self.stored, clear.get(f"clear_{s.key}")) for s in self.cloud.credentials]

    def option_fields(self) -> list[forms.BoundField]:
        return [self[s.key] for s in self.cloud.all_options if s.key not in self.cloud.primary_options]

    def primary_option_fields(self) -> list[forms.BoundField]:
        return [self[s.key] for s in self.cloud.all_options if s.key in self.cloud.primary_options]

    def clean_regions(self) -> list[str]:
        names = [n for n in re.split(r"[\s,;]+", self.cleaned_data["regions"].strip().lower()) if n]
        if not names:
            raise forms.ValidationError("name at least one region")
        bad = [n for n in names if not self.cloud.region_pattern.fullmatch(n)]
        if bad:
            shown = ", ".join(f"“{n[:40]}”" for n in bad[:5])
            raise forms.ValidationError(
                f"not {self.cloud.label} region names: {shown} (they look like {', '.join(self.cloud.region_examples)})"
            )
        unique = list(dict.fromkeys(names))
        if len(unique) > MAX_REGIONS:
            raise forms.ValidationError(f"at most {MAX_REGIONS} regions")
        return unique

    def clean_rate_limits(self) -> dict[str, str]:
        """``group = capacity/refill`` lines -> the account's ``rate_limit.<group>`` options, checked as every
        path checks them (``providers.ratelimit.limits_from_options``)."""
        options = rate_limit_options(self.cleaned_data.get("rate_limits") or "")
        try:
            ratelimit.limits_from_options(options, self.cloud.kind)
        except ValueError as exc:
            # Said to a seller: the line's group first, and no module names.
            message = str(exc).removeprefix(f"options.{ratelimit.OPTION_PREFIX}")
            raise forms.ValidationError(message.replace(" (providers.ratelimit.ACCOUNT_GROUPS)", "")) from None
        return options

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.cloud.endpoint_required and not data.get("endpoint_url") and not data.get("kubeconfig"):
            if "endpoint_url" not in self.errors:
                self.add_error("endpoint_url", f"give the {self.cloud.endpoint_label}, or paste a kubeconfig")
        for spec in self.cloud.all_options:
            raw = (data.get(spec.key) or "").strip()
            if raw and spec.kind in ("number", "integer"):
                try:
                    data[spec.key] = _number(spec, raw)
                except forms.ValidationError as error:
                    self.add_error(spec.key, error)
        return data

    def account_input(self, *, kind: str) -> AccountInput:
        d = self.cleaned_data
        return AccountInput(
            kind=kind,
            name=d["name"],
            regions=d["regions"],
            endpoint_url=d.get("endpoint_url") or "",
            credentials={s.key: d.get(s.key) or "" for s in self.cloud.credentials},
            clear=frozenset(s.key for s in self.cloud.credentials if d.get(f"clear_{s.key}")),
            options={s.key: str(d.get(s.key) or "") for s in self.cloud.all_options} | d.get("rate_limits", {}),
            # The form shows every rate limit stored: a line taken out removes its option.
            managed_options=frozenset(s.key for s in self.cloud.all_options)
            | frozenset(rate_limit_options(str(self.initial.get("rate_limits") or ""), checked=False))
            | frozenset(d.get("rate_limits", {})),
            required_credentials=frozenset(s.key for s in self.cloud.credentials if s.required),
        )


MAX_RATE_LIMIT_LINES = 50


def rate_limit_options(text: str, *, checked: bool = True) -> dict[str, str]:
    """The request rate limits field's lines (``group = capacity/refill``; blank lines skipped) -> options
    ``rate_limit.<group>``. Raises ``ValidationError`` naming the line when one has no ``=`` or a group appears
    twice; ``checked=False`` skips such lines instead (text the form itself wrote)."""
    options: dict[str, str] = {}
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if checked and len(lines) > MAX_RATE_LIMIT_LINES:
        raise forms.ValidationError(f"at most {MAX_RATE_LIMIT_LINES} lines")
    for number, line in enumerate(lines, start=1):
        group, sep, figures = (part.strip() for part in line.partition("="))
        key = f"{ratelimit.OPTION_PREFIX}{group}"
        if checked and (not sep or not group):
            raise forms.ValidationError(
                f"line {number}: write group = capacity/refill, e.g. DescribeInstances = 200/40"
            )
        if checked and key in options:
            raise forms.ValidationError(f"line {number}: {group[:60]} is given twice")
        if sep and group:
            options[key] = figures
    return options


def rate_limit_text(options: dict[str, Any]) -> str:
    """An account's ``rate_limit.<group>`` options as the field's lines, in group order."""
    return "\n".join(
        f"{key.removeprefix(ratelimit.OPTION_PREFIX)} = {value}"
        for key, value in sorted(options.items())
        if key.startswith(ratelimit.OPTION_PREFIX)
    )


_WINDOW = re.compile(
    r"^(?P<days>[a-z]{3}(?:-[a-z]{3})?(?:,[a-z]{3}(?:-[a-z]{3})?)*)\s+(?P<start>\d\d:\d\d)-(?P<end>\d\d:\d\d)$"
)
_DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_REGION = re.compile(r"[a-z][a-z0-9-]{1,30}[a-z0-9]")


def parse_windows(text: str) -> list[dict[str, Any]]:
    """``mon-fri 08:00-20:00`` per line (UTC; an end before the start runs past midnight) -> availability
    windows; raises ``ValidationError`` naming the bad line. Empty: always available."""
    windows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = " ".join(raw.lower().split())
        if not line:
            continue
        match = _WINDOW.match(line)
        if match is None:
            raise forms.ValidationError(f"line {number}: write days and hours like 'mon-fri 08:00-20:00'")
        weekdays: set[int] = set()
        for part in match["days"].split(","):
            first, _, last = part.partition("-")
            if first not in _DAYS or (last and last not in _DAYS):
                raise forms.ValidationError(f"line {number}: days are mon, tue, wed, thu, fri, sat, sun")
            a, b = _DAYS.index(first), _DAYS.index(last or first)
            weekdays.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
        for time in (match["start"], match["end"]):
            hours, minutes = int(time[:2]), int(time[3:])
            if hours > 24 or minutes > 59 or (hours == 24 and minutes):
                raise forms.ValidationError(f"line {number}: {time} is not a time of day")
        if match["start"] == match["end"]:
            raise forms.ValidationError(f"line {number}: a window needs different start and end times")
        windows.append({"weekdays": sorted(weekdays), "start": match["start"], "end": match["end"]})
    return windows


class MachineForm(forms.Form):
    """A machine listing: what it is, where, and at what price. Prices in USD per GPU-hour."""

    name = forms.SlugField(max_length=60, help_text="letters, digits and dashes, e.g. fra-h100-1")
    gpu_model = forms.ChoiceField(label="GPU model")
    gpu_count = IntegerFormField(label="GPUs", min_value=1, max_value=16)
    gpu_memory_gb = IntegerFormField(label="Memory per GPU (GB)", min_value=1, max_value=1024)
    vcpus = IntegerFormField(label="vCPUs", min_value=1, max_value=1024)
    memory_gib = IntegerFormField(label="RAM (GiB)", min_value=1, max_value=32768)
    disk_gb = IntegerFormField(label="Disk (GB)", min_value=10, max_value=1_000_000)
    network_gbps = DecimalFormField(
        label="Network (Gbit/s)", min_value=Decimal("0.1"), max_value=Decimal(3200), decimal_places=2
    )
    country = forms.ChoiceField(choices=COUNTRY_CHOICES)
    region = forms.CharField(max_length=32, help_text="your region label, e.g. eu-de or us-tx")
    price_per_gpu_hour = DecimalFormField(
        label="Price per GPU-hour, on demand (USD)", min_value=Decimal("0.01"), max_value=Decimal(100),
        decimal_places=4,
    )  # fmt: skip
    min_bid_per_gpu_hour = DecimalFormField(
        label="Minimum bid per GPU-hour, interruptible (USD)", required=False, min_value=Decimal("0.01"),
        max_value=Decimal(100), decimal_places=4, help_text="leave empty to sell on demand only",
    )  # fmt: skip
    availability = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="one window per line in UTC, e.g. mon-fri 08:00-20:00; empty: always",
    )
    min_gpus_per_lease = IntegerFormField(
        label="Fewest GPUs per lease", required=False, min_value=1, max_value=16,
        help_text="leave empty to sell the machine whole; e.g. 1 or 2 to rent its GPUs out to several buyers",
    )  # fmt: skip
    mig_profiles = forms.CharField(
        label="MIG profiles", required=False, max_length=200,
        help_text="A100 or H100 only: profile names separated by commas, e.g. 1g.10gb, 3g.40gb; empty: none",
    )  # fmt: skip

    def __init__(self, *args: Any, gpu_models: list[tuple[str, int]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.memory_of = dict(gpu_models)
        self.fields["gpu_model"].choices = [("", "choose a model"), *((k, f"{k} ({m} GB)") for k, m in gpu_models)]

    def clean_region(self) -> str:
        value = self.cleaned_data["region"].strip().lower()
        if not _REGION.fullmatch(value):
            raise forms.ValidationError("use 3 to 32 lower-case letters, digits and dashes, e.g. eu-de")
        return value

    def clean_availability(self) -> list[dict[str, Any]]:
        return parse_windows(self.cleaned_data.get("availability") or "")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        model, memory = data.get("gpu_model"), data.get("gpu_memory_gb")
        if model and memory and memory > self.memory_of.get(model, memory):
            self.add_error("gpu_memory_gb", f"a {model} has {self.memory_of[model]} GB")
        price, bid = data.get("price_per_gpu_hour"), data.get("min_bid_per_gpu_hour")
        if price is not None and bid is not None and bid >= price:
            self.add_error("min_bid_per_gpu_hour", "the minimum bid must be below the on-demand price")
        count, least = data.get("gpu_count"), data.get("min_gpus_per_lease")
        if count and least and least > count:
            self.add_error("min_gpus_per_lease", f"at most the machine's {count} GPUs")
        if model and (problem := mig_profiles_problem(model, data.get("mig_profiles") or [])):
            self.add_error("mig_profiles", problem)
        return data

    def clean_mig_profiles(self) -> list[str]:
        raw = self.cleaned_data.get("mig_profiles") or ""
        return [name.strip().lower() for name in raw.split(",") if name.strip()]

    def listing(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {key: d[key] for key in ("gpu_model", "gpu_count", "gpu_memory_gb", "vcpus", "memory_gib", "disk_gb",
                                        "network_gbps", "country", "region", "price_per_gpu_hour",
                                        "min_bid_per_gpu_hour", "availability", "min_gpus_per_lease",
                                        "mig_profiles")}  # fmt: skip


class MachinePriceFallForm(forms.Form):
    """The price falls a seller accepts for one machine. The fields are read as text and checked by the
    market's own rule (``price_fall_rule_read``), so the portal and every other surface refuse the same values
    with the same words; an empty field keeps its default, no fall."""

    fragment_discount_pct = forms.CharField(
        label="Fragment discount (%)", required=False, max_length=16,
        help_text="off the list price for GPUs left free while others are leased; 0: none",
    )  # fmt: skip
    idle_after_hours = forms.CharField(
        label="Idle after (hours)", required=False, max_length=16,
        help_text="whole hours with no GPU leased before the idle price starts to fall",
    )  # fmt: skip
    idle_step_pct = forms.CharField(
        label="Idle step (% per hour)", required=False, max_length=16,
        help_text="of the list price, for each further hour idle; 0: none",
    )  # fmt: skip
    floor_pct = forms.CharField(
        label="Floor (% of the list price)", required=False, max_length=16,
        help_text="the lowest share of the list price you accept; 100: no fall",
    )  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.widget.attrs["inputmode"] = "decimal"

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            data["rule"] = price_fall_rule_read(data)
        except PriceRuleError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, str(exc))
        return data

    def rule(self) -> PriceFallRule:
        rule: PriceFallRule = self.cleaned_data["rule"]
        return rule

    @staticmethod
    def initial_for(rule: PriceFallRule) -> dict[str, str]:
        return {
            "fragment_discount_pct": pct(rule.fragment_discount_pct),
            "idle_after_hours": str(rule.idle_after_hours),
            "idle_step_pct": pct(rule.idle_step_pct),
            "floor_pct": pct(rule.floor_pct),
        }


class SlaCommitmentForm(forms.Form):
    """A host's or cluster's committed availability, in percent (issue 38); the service checks the floor."""

    sla_commitment_pct = forms.DecimalField(
        label="Committed availability (%)",
        max_digits=6,
        decimal_places=3,
        min_value=0,
        max_value=100,
        help_text="what your offers promise buyers; measured by the marketplace, credited to them below it",
    )
