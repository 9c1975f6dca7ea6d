"""What the connect form asks for per cloud: the SDK's credentials, the adapter options a seller may set, and
what a region name of that cloud looks like. Mirrors the README's "Clouds" table."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError

from providers.endpoints import KEY_MAX_BYTES, KEY_MAX_DEPTH
from providers.kubernetes.permissions import cluster_role_yaml
from providers.kubernetes.pricing import parse_gpu_prices
from untrusted.jsonbody import bounded_json


def validate_service_account_json(value: str) -> None:
    """A Google service-account key file: a JSON object of type ``service_account`` with its key and email."""
    try:
        info = bounded_json(value, max_bytes=KEY_MAX_BYTES, max_depth=KEY_MAX_DEPTH)
    except ValueError as exc:
        raise ValidationError(f"paste the key file's JSON: this is not a key file ({exc})") from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ValidationError('this is not a service-account key (its "type" must be "service_account")')
    missing = [key for key in ("client_email", "private_key") if not info.get(key)]
    if missing:
        raise ValidationError(f"the key has no {' or '.join(missing)}")


def _gpu_prices(value: str) -> None:
    try:
        parse_gpu_prices(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def _shared_gpus(value: str) -> None:
    if value not in ("allow", "deny"):
        raise ValidationError(f"write allow or deny, not {value[:40]!r}")


def _tencent_site(value: str) -> None:
    if value not in ("china", "international"):
        raise ValidationError(f"the billing site is china or international, not {value[:40]!r}")


@dataclass(frozen=True)
class CloudField:
    """One input of the connect form. ``secret`` values are never written back into a page, not even into a
    form redisplayed with errors; every credential is write-only once saved."""

    key: str
    label: str
    required: bool = False
    secret: bool = False
    kind: str = "text"  # text, textarea, url, number, integer
    help: str = ""
    min_value: float | None = None
    max_value: float | None = None
    validator: Callable[[str], None] | None = None  # raises ValidationError


@dataclass(frozen=True)
class Cloud:
    kind: str
    label: str
    credentials: tuple[CloudField, ...]
    options: tuple[CloudField, ...]
    region_pattern: re.Pattern[str]
    region_examples: tuple[str, ...] = field(default_factory=tuple)
    # Where the adapter calls: an override for a cloud (optional), the API server for a cluster (required).
    endpoint_label: str = "Endpoint override"
    endpoint_help: str = "optional: a sovereign region's or a private endpoint"
    endpoint_required: bool = False
    # A cluster's seller needs the role its service account must hold, shown on the connect form.
    setup_note: str = ""
    setup_text: str = ""
    # Options a seller of this kind must set to sell at all (a cluster's prices), shown beside the credentials
    # rather than folded away with the others.
    primary_options: tuple[str, ...] = ()

    @property
    def all_options(self) -> tuple[CloudField, ...]:
        return self.options + COMMON_OPTIONS


# Every adapter understands these (providers/options.py); the connect check overrides them with short ones.
COMMON_OPTIONS: tuple[CloudField, ...] = (
    CloudField("connect_timeout", "Connect timeout (s)", kind="number", min_value=0.1, max_value=120),
    CloudField("read_timeout", "Read timeout (s)", kind="number", min_value=0.1, max_value=600),
    CloudField("max_attempts", "Read attempts", kind="integer", min_value=1, max_value=10),
)

CLOUDS: dict[str, Cloud] = {
    "aws": Cloud(
        kind="aws",
        label="Amazon Web Services",
        credentials=(
            CloudField("access_key_id", "Access key id", required=True),
            CloudField("secret_access_key", "Secret access key", required=True, secret=True),
            CloudField("session_token", "Session token", secret=True, help="only for temporary credentials"),
        ),
        options=(
            CloudField("image_id", "Image id (AMI)", help="default: the region's Deep Learning Base GPU AMI"),
            CloudField("subnet_id", "Subnet ids", help="comma-separated, one per zone; default: the default VPC"),
        ),
        # us-east-1, eu-central-2, us-gov-west-1, cn-northwest-1
        region_pattern=re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}"),
        region_examples=("us-east-1", "eu-west-1"),
    ),
    "azure": Cloud(
        kind="azure",
        label="Microsoft Azure",
        credentials=(
            CloudField("tenant_id", "Tenant id", required=True),
            CloudField("client_id", "Client (application) id", required=True),
            CloudField("client_secret", "Client secret", required=True, secret=True),
            CloudField("subscription_id", "Subscription id", required=True),
        ),
        options=(
            CloudField("resource_group", "Resource group"),
            CloudField("subnet_id", "Subnet id", help="needed to launch"),
            CloudField(
                "ssh_public_key", "SSH public key", kind="textarea", help="only for launches without a buyer's keys"
            ),
            CloudField("image", "Image", help="default: Microsoft's Ubuntu-HPC GPU image"),
            CloudField("authority_url", "Authority URL", kind="url", help="sovereign clouds only"),
            CloudField("prices_url", "Retail prices URL", kind="url", help="sovereign clouds only"),
        ),
        # eastus, westus3, southcentralus: no dashes
        region_pattern=re.compile(r"[a-z][a-z0-9]{2,39}"),
        region_examples=("eastus", "westeurope"),
    ),
    "gcp": Cloud(
        kind="gcp",
        label="Google Cloud",
        credentials=(
            CloudField(
                "service_account_json",
                "Service-account key (JSON)",
                required=True,
                secret=True,
                kind="textarea",
                help="the whole key file",
                validator=validate_service_account_json,
            ),
            CloudField("project_id", "Project id", help="default: the key's own project"),
        ),
        options=(
            CloudField("image", "Image", help="default: the Deep Learning VM image family"),
            CloudField("boot_disk_gb", "Boot disk (GB)", kind="integer", min_value=10, max_value=65536),
            CloudField("network", "Network"),
            CloudField("subnetwork", "Subnetwork"),
            CloudField("page_size", "Page size", kind="integer", min_value=1, max_value=500),
        ),
        # us-central1, europe-west4, northamerica-northeast1
        region_pattern=re.compile(r"[a-z]+-[a-z]+\d{1,2}"),
        region_examples=("us-central1", "europe-west4"),
    ),
    "alibaba": Cloud(
        kind="alibaba",
        label="Alibaba Cloud",
        credentials=(
            CloudField("access_key_id", "AccessKey id", required=True),
            CloudField("access_key_secret", "AccessKey secret", required=True, secret=True),
            CloudField("security_token", "STS security token", secret=True, help="only for temporary credentials"),
        ),
        options=(
            CloudField("image_id", "Image id"),
            CloudField(
                "image_family", "Image family", help="default: acs:ubuntu_22_04_x64, the driver installed at boot"
            ),
            CloudField("vswitch_id", "vSwitch id"),
            CloudField("security_group_id", "Security group id", help="only for launches without a firewall"),
        ),
        # cn-shanghai, ap-southeast-1, cn-shanghai-finance-1
        region_pattern=re.compile(r"[a-z]{2}(-[a-z]+)+(-\d{1,2})?"),
        region_examples=("cn-shanghai", "ap-southeast-1"),
    ),
    "tencent": Cloud(
        kind="tencent",
        label="Tencent Cloud",
        credentials=(
            CloudField("secret_id", "SecretId", required=True),
            CloudField("secret_key", "SecretKey", required=True, secret=True),
            CloudField("token", "Temporary token", secret=True, help="only for temporary credentials"),
        ),
        options=(
            CloudField("image_id", "Image id"),
            # Tencent's price answers carry no currency: the account's site says which one they are in.
            CloudField(
                "site",
                "Billing site",
                help="china (prices in CNY, the default) or international (prices in USD)",
                validator=_tencent_site,
            ),
            CloudField("retry_backoff", "Retry backoff (s)", kind="number", min_value=0, max_value=30),
        ),
        # ap-guangzhou, na-siliconvalley, ap-shanghai-fsi
        region_pattern=re.compile(r"[a-z]{2}-[a-z]+(-[a-z0-9]+)*"),
        region_examples=("ap-guangzhou", "ap-shanghai"),
    ),
    "kubernetes": Cloud(
        kind="kubernetes",
        label="Kubernetes cluster",
        credentials=(
            CloudField(
                "token",
                "Service account token",
                secret=True,
                kind="textarea",
                help="a token of a service account bound to the ClusterRole above (or paste a kubeconfig)",
            ),
            CloudField("ca_bundle", "Cluster CA (PEM)", kind="textarea", help="the API server's certificate authority"),
            CloudField(
                "kubeconfig",
                "Or a kubeconfig",
                secret=True,
                kind="textarea",
                help="pasted once: its current context's server, CA and token fill the fields above",
            ),
        ),
        options=(
            CloudField(
                "gpu_prices",
                "Prices per GPU-hour (USD)",
                kind="textarea",
                help="one rule per line: GPU model, price, and optionally a node pool label, e.g. "
                "'A100-80GB-SXM4 1.90' or 'T4 0.30 broker.example/pool=spot'",
                validator=_gpu_prices,
            ),
            CloudField(
                "shared_gpus",
                "Time-sliced GPUs",
                help="allow: sell nvidia.com/gpu.shared replicas too",
                validator=_shared_gpus,
            ),
            CloudField("dcgm_url", "DCGM exporter URL", kind="url", help="optional: per-GPU utilization from it"),
            CloudField("image", "Default image", help="for script workloads; default nvidia/cuda base"),
        ),
        # The seller's own name for where the cluster is: eu-central, us-tx-1
        region_pattern=re.compile(r"[a-z][a-z0-9-]{1,30}[a-z0-9]"),
        region_examples=("eu-central", "us-tx"),
        endpoint_label="API server URL",
        endpoint_help="https://..., as the cluster's kubeconfig names it (not needed with a kubeconfig)",
        endpoint_required=True,
        setup_note="The service account needs this ClusterRole (and a ClusterRoleBinding to it); saving checks "
        "each rule with a SelfSubjectRulesReview and names any that is missing.",
        setup_text=cluster_role_yaml(),
        primary_options=("gpu_prices",),
    ),
}
