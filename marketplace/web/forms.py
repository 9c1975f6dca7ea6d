from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django import forms
from django.core.validators import RegexValidator

from marketplace.catalog.query import PROVIDERS as QUERY_PROVIDERS
from marketplace.catalog.regions import JURISDICTIONS
from marketplace.launch.config import DISK_GB_MAX, DISK_GB_MIN, SPEND_CAP_MAX
from marketplace.matching import PROFILES, Amount, Profile, Tolerance
from marketplace.matching.types import MAX_NODES
from marketplace.models import GpuModel, OfferStatus, Role, TokenScope
from marketplace.models.organizations import BUYER_ROLES
from marketplace.numbers import MAX_BUDGET, MAX_PRICE_PER_HOUR, DecimalFormField, FloatFormField, IntegerFormField
from marketplace.portal.forms import SignupForm
from providers.models import Provider, ProviderKind
from providers.sshkeys import MAX_KEY_TEXT, MAX_NAME

PRICING = [("", "any"), ("on_demand", "on-demand"), ("spot", "spot")]


class OfferFilterForm(forms.Form):
    """The offers page's filter controls. Each writes one term of the search language
    (``marketplace.web.search.CONTROLS``), so its bounds are the language's: nothing here can say what a query
    cannot."""

    gpu = forms.ChoiceField(required=False, label="GPU")
    count = IntegerFormField(required=False, min_value=1, max_value=64, label="GPUs at least")
    region = forms.CharField(
        required=False,
        max_length=64,
        label="Region",
        validators=[
            RegexValidator(r"^[A-Za-z0-9_.-]*$", "a region (us-east-1) or a jurisdiction (eu, us, apac), no spaces")
        ],
        widget=forms.TextInput(attrs={"placeholder": "eu or us-east-1", "size": 12}),
    )
    pricing = forms.ChoiceField(required=False, choices=PRICING)
    provider = forms.ChoiceField(
        required=False, choices=[("", "any"), *((k, ProviderKind(k).label) for k in QUERY_PROVIDERS)]
    )
    seller = forms.ChoiceField(required=False, label="Seller")
    free = IntegerFormField(required=False, min_value=1, max_value=1024, label="Free GPUs ≥")
    gpumem = IntegerFormField(required=False, min_value=1, max_value=16384, label="GB per GPU ≥")
    vcpu = IntegerFormField(required=False, min_value=1, max_value=100_000, label="vCPU ≥")
    ram = IntegerFormField(required=False, min_value=1, max_value=1_000_000, label="RAM GiB ≥")
    disk = IntegerFormField(required=False, min_value=1, max_value=10_000_000, label="Disk GB ≥")
    net = DecimalFormField(
        required=False, min_value=Decimal("0"), max_value=Decimal(100_000), decimal_places=2, label="Net Gbit/s ≥"
    )
    reliability = DecimalFormField(
        required=False, min_value=Decimal("0"), max_value=Decimal(1), decimal_places=3, label="Reliability ≥ (0 to 1)"
    )
    # The search language's bound on a price, which is below the storefront's bound on a budget.
    max_price = DecimalFormField(
        required=False, min_value=Decimal("0"), max_value=Decimal(1_000_000), decimal_places=4, label="Max USD/h"
    )
    max_gpuprice = DecimalFormField(
        required=False, min_value=Decimal("0"), max_value=Decimal(1_000_000), decimal_places=4, label="Max USD/GPU-h"
    )
    perf = DecimalFormField(
        required=False, min_value=Decimal("0"), max_value=Decimal(1_000_000), decimal_places=2,
        label="FP16 TFLOPS per USD/h ≥",
    )  # fmt: skip

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        sellers = Provider.objects.filter(accounts__offers__status=OfferStatus.AVAILABLE).order_by("name").distinct()
        # A term holds no space, so a seller's name is written with underscores for its spaces (query.py).
        self.fields["seller"].choices = [  # type: ignore[attr-defined]
            ("", "any"),
            *((name.replace(" ", "_"), name) for name in sellers.values_list("name", flat=True)),
        ]
        keys = list(
            GpuModel.objects.filter(offers__isnull=False).values_list("key", flat=True).distinct().order_by("key")
        )
        # A family (H100) is a choice when it has several variants on sale: gpu=H100 matches every one of them.
        variants = Counter(k.split("-")[0] for k in keys if "-" in k)
        families = sorted(f for f, n in variants.items() if n > 1 and f not in keys)
        self.fields["gpu"].choices = [  # type: ignore[attr-defined]
            ("", "any"),
            *((f, f"{f} (any variant)") for f in families),
            *((k, k) for k in keys),
        ]


class WorkloadForm(forms.Form):
    """The storefront's workload wizard: a profile and what the buyer wants to override of its defaults."""

    profile = forms.ChoiceField(
        choices=[(p.value, f"{p.value.replace('_', '-')}: {PROFILES[p].description}") for p in Profile]
    )
    gpu_models = forms.MultipleChoiceField(
        required=False,
        label="GPU models",
        help_text="any that fits, if none is chosen; Ctrl or ⌘ to choose several",
        widget=forms.SelectMultiple(attrs={"size": 4}),
    )
    gpu_count = IntegerFormField(required=False, min_value=1, max_value=64, label="GPUs")
    total_gpu_memory_gb = IntegerFormField(
        required=False, min_value=1, max_value=16384, label="or total GPU memory (GB)"
    )
    nodes = IntegerFormField(
        required=False,
        min_value=1,
        max_value=MAX_NODES,
        label="Machines",
        help_text="GPUs are per machine",
    )
    duration_hours = FloatFormField(
        initial=8,
        min_value=0.01,
        max_value=8760,
        label="Hours",
        help_text="for fixed work: hours on the reference GPU",
    )
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
    deadline_hours = FloatFormField(
        required=False,
        min_value=0.01,
        max_value=8760,
        label="Finish within (hours)",
        help_text="interruptions included",
    )
    max_price_per_hour = DecimalFormField(
        required=False, min_value=Decimal("0.000001"), max_value=MAX_PRICE_PER_HOUR, decimal_places=6, label="Max USD/h"
    )
    fractions = forms.BooleanField(required=False, label="Slices of a card (MIG) will do")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # The models on sale now, by the keys the ranking matches (providers.gpu_names).
        on_sale = set(GpuModel.objects.filter(offers__status=OfferStatus.AVAILABLE).values_list("key", flat=True))
        # Sorted here, not by the database, whose collation may order "A100-..." and "A10G" either way.
        self.fields["gpu_models"].choices = [(k, k) for k in sorted(on_sale)]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if data.get("gpu_count") and data.get("total_gpu_memory_gb"):
            self.add_error("total_gpu_memory_gb", "give GPUs or total memory, not both")
        profile = data.get("profile")
        deadline, duration = data.get("deadline_hours"), data.get("duration_hours")
        fixed_hours = profile and PROFILES[Profile(profile)].amount != Amount.WORK
        if deadline is not None and duration is not None and fixed_hours and deadline < duration:
            self.add_error("deadline_hours", f"at least the {duration:g} hours asked for: no offer runs them faster")
        return data

    def demand_data(self) -> dict[str, object]:
        """The cleaned form in the API's DemandInput shape, so both go through one conversion."""
        d = self.cleaned_data
        data: dict[str, object] = {
            "profile": d["profile"],
            "duration_hours": d["duration_hours"],
            "interruption_tolerance": d["interruption_tolerance"],
            "checkpoint_interval_hours": 1.0,
            "gpu_models": list(d.get("gpu_models") or []),
            "regions": [],
            "jurisdictions": [d["jurisdiction"]] if d["jurisdiction"] else [],
            "pricing_models": [d["pricing"]] if d["pricing"] else [],
            "fractions": bool(d.get("fractions")),
        }
        for key in ("gpu_count", "total_gpu_memory_gb", "nodes", "deadline_hours", "max_price_per_hour"):
            if d.get(key) is not None:
                data[key] = d[key]
        return data


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="what uses it, e.g. ci-pipeline")
    scopes = forms.MultipleChoiceField(
        choices=TokenScope.choices, widget=forms.CheckboxSelectMultiple, help_text="only what that program needs"
    )


def _budget_field(label: str) -> DecimalFormField:
    return DecimalFormField(
        required=False, min_value=Decimal("0.01"), max_value=MAX_BUDGET, max_digits=14, decimal_places=2, label=label
    )


class BudgetForm(forms.Form):
    """The organisation's spending limits in USD; a blank field removes that limit."""

    budget_per_hour = _budget_field("Hourly budget (USD/h)")
    budget_monthly = _budget_field("Monthly budget (USD)")


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


# --- Launching a machine: SSH keys and the order's launch configuration ----------------------------------------


class SshKeyForm(forms.Form):
    """One public key, pasted or uploaded as its .pub file. The text is never rendered back (``render_value``
    would not apply to a textarea, so the template leaves it out on errors): a private key pasted by mistake
    must not travel to the browser again."""

    name = forms.CharField(
        required=False, max_length=MAX_NAME, help_text="default: the key's comment, e.g. alice@laptop"
    )
    public_key = forms.CharField(
        required=False,
        max_length=MAX_KEY_TEXT,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAA… you@laptop", "spellcheck": "false"}),
        label="Public key",
    )
    public_key_file = forms.FileField(required=False, label="or upload the .pub file")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        upload = data.get("public_key_file")
        if upload is not None:
            if data.get("public_key", "").strip():
                raise forms.ValidationError("paste the key or upload its file, not both")
            if upload.size > MAX_KEY_TEXT:
                self.add_error("public_key_file", f"a public key file is at most {MAX_KEY_TEXT} bytes")
                return data
            try:
                data["public_key"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("public_key_file", "not a text file: choose the .pub file, e.g. id_ed25519.pub")
        elif not data.get("public_key", "").strip() and "public_key" not in self.errors:
            self.add_error("public_key", "paste one public key, e.g. the contents of ~/.ssh/id_ed25519.pub")
        return data


WORKLOAD_CHOICES = [
    ("none", "Just the machine"),
    ("container", "A container"),
    ("script", "A script"),
]
ACCESS_CHOICES = [("mine", "only your address"), ("anywhere", "anywhere"), ("custom", "these address ranges")]
ON_SILENCE_CHOICES = [
    ("keep", "keep the machine and wait for its agent"),
    ("replace", "replace it: stop it and move to the next offer"),
]
ANYWHERE = ["0.0.0.0/0"]


def _split_ports(raw: str) -> list[int]:
    """``"8000, 8888"`` as numbers; the service checks their range."""
    ports = []
    for item in raw.replace(",", " ").split():
        if not (item.isascii() and item.isdigit()) or len(item) > 5:  # int() would read any Unicode digit
            raise forms.ValidationError(f"{item[:12]!r} is not a port number: give numbers separated by commas")
        ports.append(int(item))
    return ports


def _split_words(raw: str) -> list[str]:
    """A command line as its words, quoted as a shell would read it (``"--name 'my model'"``: two words)."""
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise forms.ValidationError(f"cannot split into words: {exc}") from None


class LaunchForm(forms.Form):
    """The order's configure step: how long, which keys, what runs and who may reach it. Environment
    variables come as numbered rows (``env_name_<i>``, ``env_value_<i>``, ``env_secret_<i>``) read by
    ``env_rows``; ``launch_data`` builds the configuration in the shape ``marketplace.launch.config`` takes."""

    duration_hours = DecimalFormField(
        required=False, min_value=Decimal("0.01"), max_value=Decimal("8760"), decimal_places=2, label="Run for (hours)"
    )
    spend_cap_usd = DecimalFormField(
        required=False,
        min_value=Decimal("0.01"),
        max_value=SPEND_CAP_MAX,
        max_digits=9,
        decimal_places=2,
        label="or stop at a spend of (USD)",
    )
    ssh_keys = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple, label="SSH keys")
    on_silence = forms.ChoiceField(
        choices=ON_SILENCE_CHOICES, required=False, initial="keep", label="If the machine's agent stops reporting"
    )
    workload_kind = forms.ChoiceField(choices=WORKLOAD_CHOICES, initial="none", widget=forms.RadioSelect)
    container_image = forms.CharField(
        required=False, max_length=255, label="Image",
        widget=forms.TextInput(attrs={"placeholder": "vllm/vllm-openai:v0.6.3", "spellcheck": "false"}),
    )  # fmt: skip
    command = forms.CharField(
        required=False, max_length=4096, label="Command (replaces the image's entrypoint)",
        widget=forms.TextInput(attrs={"placeholder": "empty: the image's own", "spellcheck": "false"}),
    )  # fmt: skip
    args = forms.CharField(
        required=False, max_length=16384, label="Arguments",
        widget=forms.TextInput(attrs={"placeholder": "--model meta-llama/Llama-3.1-8B", "spellcheck": "false"}),
    )  # fmt: skip
    container_ports = forms.CharField(
        required=False, max_length=200, label="Exposed ports", widget=forms.TextInput(attrs={"placeholder": "8000"})
    )
    shm_size_gb = IntegerFormField(required=False, min_value=1, max_value=1024, label="Shared memory (GB)")
    registry_server = forms.CharField(
        required=False, max_length=253, label="Registry", widget=forms.TextInput(attrs={"placeholder": "ghcr.io"})
    )
    registry_username = forms.CharField(required=False, max_length=255, label="Registry user")
    registry_password = forms.CharField(
        required=False, max_length=4096, label="Registry password", widget=forms.PasswordInput(render_value=False)
    )
    script = forms.CharField(
        required=False, strip=False, label="Script",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "placeholder": "#!/bin/bash\nset -e\n…"}),
    )  # fmt: skip
    ports = forms.CharField(
        required=False, max_length=200, label="More open ports", widget=forms.TextInput(attrs={"placeholder": "8888"})
    )
    access = forms.ChoiceField(choices=ACCESS_CHOICES, initial="mine", widget=forms.RadioSelect)
    cidrs = forms.CharField(
        required=False, max_length=2000, label="Address ranges",
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "203.0.113.0/24, 198.51.100.7/32"}),
    )  # fmt: skip
    disk_gb = IntegerFormField(required=False, min_value=DISK_GB_MIN, max_value=DISK_GB_MAX, label="Disk (GB)")
    image = forms.CharField(
        required=False, max_length=255, label="Own machine image",
        widget=forms.TextInput(attrs={"placeholder": "empty: the provider's GPU-ready image"}),
    )  # fmt: skip
    allow_failover = forms.BooleanField(required=False, initial=True, label="May fail over to a like offer")
    max_price_per_hour = DecimalFormField(
        required=False,
        min_value=Decimal("0.000001"),
        max_value=MAX_PRICE_PER_HOUR,
        decimal_places=6,
        label="paying at most (USD/h)",
    )
    bid_per_gpu_hour = DecimalFormField(
        required=False,
        min_value=Decimal("0.0001"),
        max_value=Decimal("100000"),
        max_digits=10,
        decimal_places=4,
        label="Your bid (USD per GPU-hour)",
    )
    save_template = forms.BooleanField(required=False, label="Save as a launch template")
    # Not "template_name": that is the attribute naming the template a Form renders itself with.
    save_name = forms.CharField(required=False, max_length=80, label="Template name")

    def __init__(self, *args: Any, keys: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["ssh_keys"].choices = keys  # type: ignore[attr-defined]

    def clean_container_ports(self) -> list[int]:
        return _split_ports(self.cleaned_data.get("container_ports", ""))

    def clean_ports(self) -> list[int]:
        return _split_ports(self.cleaned_data.get("ports", ""))

    def clean_command(self) -> list[str]:
        return _split_words(self.cleaned_data.get("command", ""))

    def clean_args(self) -> list[str]:
        return _split_words(self.cleaned_data.get("args", ""))

    def clean_cidrs(self) -> list[str]:
        return self.cleaned_data.get("cidrs", "").replace(",", " ").split()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if (
            data.get("duration_hours") is None
            and data.get("spend_cap_usd") is None
            and not self.has_error("duration_hours")
        ):
            self.add_error("duration_hours", "give the hours to run, a spend cap, or both")
        if data.get("access") == "custom" and not data.get("cidrs") and not self.has_error("cidrs"):
            self.add_error("cidrs", "name at least one address range, e.g. 203.0.113.0/24")
        if data.get("save_template") and not (data.get("save_name") or "").strip():
            self.add_error("save_name", "name the template")
        return data

    def launch_data(self, env: list[dict[str, Any]], registry_password: str | None) -> dict[str, Any]:
        """The launch configuration as the service takes it; ``env`` from ``env_rows``, secrets filled in."""
        d = self.cleaned_data
        data: dict[str, Any] = {"ssh_keys": list(d["ssh_keys"]), "ports": d["ports"]}
        kind = d["workload_kind"]
        workload: dict[str, Any] = {"kind": kind}
        if kind == "container":
            workload.update(image=d["container_image"].strip(), command=d["command"], args=d["args"], env=env,
                            ports=d["container_ports"])  # fmt: skip
            if d.get("shm_size_gb") is not None:
                workload["shm_size_gb"] = d["shm_size_gb"]
            if d["registry_server"] or d["registry_username"] or registry_password:
                workload["registry"] = {"server": d["registry_server"].strip(), "username": d["registry_username"],
                                        "password": registry_password or ""}  # fmt: skip
        elif kind == "script":
            workload.update(script=d["script"], env=env)
        data["workload"] = workload
        if d["access"] == "anywhere":
            data["allowed_cidrs"] = list(ANYWHERE)
        elif d["access"] == "custom":
            data["allowed_cidrs"] = d["cidrs"]
        # "mine" leaves allowed_cidrs out: the service defaults it to the caller's own address.
        if d.get("disk_gb") is not None:
            data["disk_gb"] = d["disk_gb"]
        if (d.get("image") or "").strip():
            data["image"] = d["image"].strip()
        if d.get("spend_cap_usd") is not None:
            data["spend_cap_usd"] = format(d["spend_cap_usd"], "f")
        data["on_silence"] = d.get("on_silence") or "keep"
        return data


MAX_ENV_ROWS = 64


@dataclass
class EnvRow:
    """One environment variable row of the form. A secret row's value is never rendered back: ``kept`` says a
    value given before is kept when the field stays empty."""

    index: int
    name: str = ""
    value: str = ""
    secret: bool = False
    kept: bool = False
    error: str = ""

    @property
    def shown_value(self) -> str:
        return "" if self.secret else self.value


def env_rows(post: Mapping[str, str]) -> list[EnvRow]:
    """The environment rows as posted, empty rows included (they keep their place for field errors)."""
    raw = post.get("env_rows", "0")
    count = min(int(raw), MAX_ENV_ROWS) if raw.isascii() and raw.isdigit() and len(raw) <= 4 else 0
    return [
        EnvRow(
            index=i,
            name=post.get(f"env_name_{i}", "").strip(),
            value=post.get(f"env_value_{i}", ""),
            secret=bool(post.get(f"env_secret_{i}")),
        )
        for i in range(max(count, 0))
    ]
