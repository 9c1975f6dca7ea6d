"""The Azure sandbox: Resource Manager (Microsoft.Compute, Microsoft.Network), Entra ID's token endpoint and the
Retail Prices API in one HTTPS server, so ``azure-mgmt-compute``, ``azure-mgmt-network`` and the adapter run
unchanged against it.

- **TLS**: the ARM bearer policy refuses plain http, so the sandbox makes a CA and a server certificate
  (SAN ``IP:127.0.0.1``, ``DNS:localhost``) with ``cryptography`` at start-up; ``sandbox.cert_path`` is the CA
  to trust (the adapter's ``ca_bundle`` option).
- **Token**: ``POST /<tenant>/oauth2/v2.0/token`` (client-credentials grant) issues HMAC-signed bearer tokens
  that ARM routes check. Client ids starting with ``bad`` (or outside an allow-list) get Entra ID's error
  shape (``AADSTS700016``); an empty secret gets ``AADSTS7000215``.
- **Catalogue**: ``resource_skus.list`` from the seed CSV (real sizes and list prices), with zones, a
  zone restriction and a location restriction (``NotAvailableForSubscription``), plus non-GPU decoys.
- **Prices**: ``GET /api/retail/prices`` with ``$filter`` (``field eq 'value'`` joined by ``and``),
  ``$skip`` paging and ``NextPageLink`` pointing back here; Linux, Windows, Spot, Low Priority, DevTest and
  reservation rows so the adapter's filtering is exercised.
- **VMs**: ``PUT`` (``If-None-Match: *`` -> 412 for an existing VM, which is never changed), ``GET`` (with
  ``$expand=instanceView``), a resource group's list, the subscription's List All (with ``statusOnly=true``: each
  VM's instance view instead of its model; ``vm_page_size`` a page, ``nextLink`` back here), ``DELETE`` (204 for a
  missing VM); creates and deletes are long-running
  operations (``Azure-AsyncOperation``/``Location`` headers back at this server) that finish after
  ``create_seconds``/``delete_seconds``. A create's boot fields are checked as ARM checks them
  (``launch``: custom data, SSH keys, OS disk size, platform image, the NIC's security group); ARM keeps
  ``osProfile.customData`` and never returns it (``vm_request`` shows tests what a create carried).
- **Boot**: a VM that first runs starts the lease agent its custom data names (``self.booter``, with the GPUs
  of its size); its delete halts it.
- **Network security groups** (``network``) and **images** (``images``): PUT/GET/DELETE/list of
  ``Microsoft.Network/networkSecurityGroups`` with ARM's long-running operations and refusals (a group still on a
  NIC cannot be deleted), marketplace image versions per location and managed images (``images``).
- **Faults** (``sandbox.faults``; actions are ARM operation ids such as ``VirtualMachines_CreateOrUpdate``,
  ``ResourceSkus_List``, ``RetailPrices_List``, ``OAuth2_Token``): ``capacity`` makes the create's operation
  fail with ``ZonalAllocationFailed`` (``AllocationFailed`` without a zone) at HTTP 200, or a synchronous 409
  when its code is ``SkuNotAvailable``; ``quota`` is a synchronous 409 ``OperationNotAllowed`` about the cores
  quota; ``throttle`` a 429 with ``Retry-After``; ``credentials`` a 403 ``AuthorizationFailed`` (401
  ``invalid_client`` on the token endpoint); ``slow`` sleeps before answering; ``image_missing`` (action
  ``image``, matched on the region) makes an image lookup answer 404 as Azure does for an image a region lacks.

Use in-process: ``sandbox = start_azure_sandbox()``; ``sandbox.url``, ``sandbox.cert_path``, ``sandbox.reset()``;
``sandbox.answer_next(action, body)`` replaces the next answer to one operation (a malformed one, say).
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from werkzeug.wrappers import Request, Response

from providers import gpu_names
from sandboxes.azure import launch as azure_launch
from sandboxes.azure.images import ImageCatalogue
from sandboxes.azure.network import NETWORK, NetworkSecurityGroups, SandboxNsg
from sandboxes.azure.wire import Operation, Operations, arm_error, now_iso
from sandboxes.boot import simulated_gpus
from sandboxes.faults import (
    IMAGE_ACTION,
    OUTCOME_KINDS,
    TRANSPORT_KINDS,
    Fault,
    FaultKind,
    FaultRegistry,
)
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

SEED_PATH = Path(__file__).parent / "prices.csv"
COMPUTE = "Microsoft.Compute"
ZONAL_REGIONS = frozenset({"eastus", "southcentralus", "westus3"})  # westus has no availability zones
REGION_DISPLAY = {
    "eastus": "US East",
    "southcentralus": "US South Central",
    "westus": "US West",
    "westus3": "US West 3",
}
# Sandbox availability quirks, so the adapter's handling of zones and restrictions is exercised.
ZONE_OVERRIDES: dict[tuple[str, str], list[str]] = {("westus3", "Standard_NC32ads_A10_v4"): ["1", "2"]}
ZONE_RESTRICTIONS: dict[tuple[str, str], list[str]] = {("eastus", "Standard_ND96isr_H100_v5"): ["3"]}
LOCATION_RESTRICTIONS = frozenset({("eastus", "Standard_NC24rs_v3")})
RDMA_SIZES = re.compile(r"^Standard_(ND40rs_v2|NC24rs_v3|ND96asr_v4|ND96amsr_A100_v4|ND96isr_H100_v5)$")
WINDOWS_UPLIFT_PER_VCPU = Decimal("0.046")  # decoy Windows rows only: never a price the broker may use
RESERVATION_DISCOUNT = Decimal("0.62")  # decoy reservation rows only
TOKEN_LIFETIME_S = 3600
DEFAULT_CREATE_SECONDS = 0.2
# vCPU quota limits per region unless a test sets its own with ``set_quota`` (usage names as Azure spells them).
DEFAULT_CORE_QUOTAS = {"cores": 10000, "lowPriorityCores": 10000}
DEFAULT_FAMILY_CORES = 2000
PRICE_PAGE_SIZE = 100
SKU_PAGE_SIZE = 100
VM_PAGE_SIZE = 50
_VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}[A-Za-z0-9_]$|^[A-Za-z0-9]$")
_SUB = r"/subscriptions/(?P<sub>[^/]+)"
_RG = _SUB + r"/resourceGroups/(?P<rg>[^/]+)"
_IMAGE_SKU = (
    _SUB + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/publishers/(?P<publisher>[^/]+)"
    r"/artifacttypes/vmimage/offers/(?P<offer>[^/]+)/skus/(?P<sku>[^/]+)"
)
_NSG = _RG + r"/providers/Microsoft\.Network/networkSecurityGroups"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(_SUB + r"/providers/Microsoft\.Compute/skus$", re.I), "ResourceSkus_List"),
    ("GET", re.compile(_SUB + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/usages$", re.I), "Usage_List"),
    (
        "GET",
        re.compile(_SUB + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/operations/(?P<op>[^/]+)$", re.I),
        "Operations_Get",
    ),
    ("GET", re.compile(_RG + r"/providers/Microsoft\.Compute/virtualMachines$", re.I), "VirtualMachines_List"),
    ("GET", re.compile(_SUB + r"/providers/Microsoft\.Compute/virtualMachines$", re.I), "VirtualMachines_ListAll"),
    (
        "PUT",
        re.compile(_RG + r"/providers/Microsoft\.Compute/virtualMachines/(?P<vm>[^/]+)$", re.I),
        "VirtualMachines_CreateOrUpdate",
    ),
    (
        "GET",
        re.compile(_RG + r"/providers/Microsoft\.Compute/virtualMachines/(?P<vm>[^/]+)$", re.I),
        "VirtualMachines_Get",
    ),
    (
        "DELETE",
        re.compile(_RG + r"/providers/Microsoft\.Compute/virtualMachines/(?P<vm>[^/]+)$", re.I),
        "VirtualMachines_Delete",
    ),
    ("GET", re.compile(_IMAGE_SKU + r"/versions$", re.I), "VirtualMachineImages_List"),
    ("GET", re.compile(_IMAGE_SKU + r"/versions/(?P<version>[^/]+)$", re.I), "VirtualMachineImages_Get"),
    ("GET", re.compile(_RG + r"/providers/Microsoft\.Compute/images/(?P<image>[^/]+)$", re.I), "Images_Get"),
    ("GET", re.compile(_NSG + r"$", re.I), "NetworkSecurityGroups_List"),
    ("PUT", re.compile(_NSG + r"/(?P<nsg>[^/]+)$", re.I), "NetworkSecurityGroups_CreateOrUpdate"),
    ("GET", re.compile(_NSG + r"/(?P<nsg>[^/]+)$", re.I), "NetworkSecurityGroups_Get"),
    ("DELETE", re.compile(_NSG + r"/(?P<nsg>[^/]+)$", re.I), "NetworkSecurityGroups_Delete"),
    (
        "GET",
        re.compile(_SUB + r"/providers/Microsoft\.Network/locations/(?P<loc>[^/]+)/operations/(?P<op>[^/]+)$", re.I),
        "NetworkOperations_Get",
    ),
]
IMAGE_ACTIONS = frozenset({"VirtualMachineImages_List", "VirtualMachineImages_Get", "Images_Get"})
TOKEN_PATH = re.compile(r"^/(?P<tenant>[^/]+)/oauth2/v2\.0/token$")
PRICES_PATH = "/api/retail/prices"
_FILTER_CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$", re.I)
_AND = re.compile(r"\s+and\s+", re.I)
PRICE_FIELDS = {
    "servicename": "serviceName",
    "armregionname": "armRegionName",
    "armskuname": "armSkuName",
    "pricetype": "type",
    "skuname": "skuName",
    "productname": "productName",
    "metername": "meterName",
    "location": "location",
    "currencycode": "currencyCode",
    "servicefamily": "serviceFamily",
}
SYNC_CAPACITY_CODES = frozenset({"SkuNotAvailable"})
# The demo account's login key for bare launches: a well-formed Ed25519 public key (ARM checks keyData) whose
# private half does not exist, since its 32 bytes were chosen, not generated.
DEMO_SSH_KEY = (
    "ssh-ed25519 "
    + base64.b64encode(
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"gpu-broker azure sandbox demo key"[:32]
    ).decode()
    + " broker@sandbox"
)
# What the sandbox's "hardware" is (the GPUs nvidia-smi would list), from the size's series as Azure documents them.
GPU_KEYS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Standard_NC\d+as_T4_v3$"), gpu_names.T4),
    (re.compile(r"^Standard_NC\d+ads_A10_v4$"), gpu_names.A10),
    (re.compile(r"^Standard_NC\d+r?s_v3$"), gpu_names.V100_16_PCIE),
    (re.compile(r"^Standard_ND40rs_v2$"), gpu_names.V100_32_SXM2),
    (re.compile(r"^Standard_NC\d+ads_A100_v4$"), gpu_names.A100_80_PCIE),
    (re.compile(r"^Standard_ND96asr_v4$"), gpu_names.A100_40_SXM),
    (re.compile(r"^Standard_ND96amsr_A100_v4$"), gpu_names.A100_80_SXM),
    (re.compile(r"^Standard_NCC?\d+adi?s_H100_v5$"), gpu_names.H100_NVL),
    (re.compile(r"^Standard_ND96isr_H100_v5$"), gpu_names.H100_SXM),
)


# ------------------------------------------------------------------------------------------------ seed


@dataclass(frozen=True, slots=True)
class SeedPrice:
    """One row of ``prices.csv``: a size in a region with its list prices and their source."""

    region: str
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: Decimal
    on_demand: Decimal
    spot: Decimal | None
    source: str
    source_date: str
    note: str = ""


def load_seed(path: Path = SEED_PATH) -> list[SeedPrice]:
    with path.open(newline="") as handle:
        return [
            SeedPrice(
                region=row["region"],
                instance_type=row["instance_type"],
                gpu_model=row["gpu_model"],
                gpu_count=int(row["gpu_count"]),
                gpu_memory_gb=int(row["gpu_memory_gb"]),
                vcpus=int(row["vcpus"]),
                memory_gib=Decimal(row["memory_gib"]),
                on_demand=Decimal(row["on_demand_usd"]),
                spot=Decimal(row["spot_usd"]) if row["spot_usd"] else None,
                source=row["source"],
                source_date=row["source_date"],
                note=row.get("note", ""),
            )
            for row in csv.DictReader(handle)
        ]


def _short(size: str) -> str:
    return size.removeprefix("Standard_")


def _meter(size: str) -> str:
    """``Standard_NC24ads_A100_v4`` -> ``NC24ads A100 v4``, the Retail Prices ``skuName``/``meterName`` form."""
    return _short(size).replace("_", " ")


def _series(size: str) -> str:
    head, _, rest = _short(size).partition("_")
    return re.sub(r"\d+", "", head, count=1) + (f"_{rest}" if rest else "")


def _family(size: str) -> str:
    return "standard" + _series(size).replace("_", "") + "Family"


def _gpu_key(size: str, seed: SeedPrice) -> str:
    return next((key for pattern, key in GPU_KEYS if pattern.match(size)), seed.gpu_model)


def _uuid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "sandbox-azure/" + "/".join(parts)))


# ------------------------------------------------------------------------------------------------- TLS


def _write_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost; returns (ca, cert chain, key) paths."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-broker Azure sandbox CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM)
    )
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxVm:
    """A VM as the sandbox holds it (for tests asserting what was, or was not, launched).

    ``state`` is ``creating``, ``running``, ``failed`` or ``deleting``; a deleted VM is no longer listed.
    """

    instance_id: str
    resource_group: str
    region: str
    zone: str
    instance_type: str
    state: str
    priority: str
    tags: dict[str, str]


@dataclass(frozen=True, slots=True)
class Call:
    """One request the sandbox received, before faults were applied."""

    action: str
    region: str = ""
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(slots=True)
class _Vm:
    subscription: str
    resource_group: str
    name: str
    location: str
    zones: list[str]
    size: str
    body: dict[str, Any]
    vm_id: str
    created: str
    create_op: Operation
    delete_op: Operation | None = None
    etag: int = 1
    booted: bool = False  # the sandbox has started its lease agent (once, when it first ran)

    def provisioning_state(self, now: float) -> str:
        if self.delete_op is not None:
            return "Deleting"
        if now < self.create_op.done_at:
            return "Creating"
        return "Failed" if self.create_op.error else "Succeeded"

    @property
    def resource_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/{COMPUTE}"
            f"/virtualMachines/{self.name}"
        )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# --------------------------------------------------------------------------------------------- sandbox


class AzureSandbox(SandboxApp):
    """The Azure sandbox WSGI app. ``start()`` serves it over HTTPS; ``faults`` injects failures; ``reset()``
    forgets VMs, faults, the call log and the credential allow-list (issued tokens stay valid)."""

    kind = "azure"

    def __init__(self, seed_path: Path = SEED_PATH, cert_dir: Path | None = None):
        super().__init__(FaultRegistry(default_action="VirtualMachines_CreateOrUpdate"))
        self.seed = load_seed(seed_path)
        self._seed_by_key = {(r.region, r.instance_type): r for r in self.seed}
        self.regions = sorted({r.region for r in self.seed})
        self._owns_tls_dir = cert_dir is None
        self._tls_dir = Path(cert_dir) if cert_dir else Path(tempfile.mkdtemp(prefix="azure-sandbox-tls-"))
        self._tls_dir.mkdir(parents=True, exist_ok=True)
        self.cert_path, self._chain_path, self._key_path = _write_tls(self._tls_dir)
        self._token_key = secrets.token_bytes(32)
        self._skus = self._build_skus()
        self._prices = self._build_prices()
        self.create_seconds = DEFAULT_CREATE_SECONDS
        self.delete_seconds = 0.0
        self.retry_after_s = 1
        self.price_page_size = PRICE_PAGE_SIZE
        self.vm_page_size = VM_PAGE_SIZE
        self._lock = threading.Lock()
        self._scripted: dict[str, deque[tuple[int, Any]]] = {}
        self._vms: dict[tuple[str, str, str], _Vm] = {}
        self._operations = Operations()
        self.network = NetworkSecurityGroups(self.regions, self._operations, self._nsg_users)
        self.images = ImageCatalogue(self.regions)
        self._valid_client_ids: frozenset[str] | None = None
        self._quota_limits: dict[str, int] = {}

    def ssl_context(self) -> ssl.SSLContext:
        if not self._key_path.exists():  # started again after stop() removed the throwaway certificates
            self._tls_dir.mkdir(parents=True, exist_ok=True)
            self.cert_path, self._chain_path, self._key_path = _write_tls(self._tls_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self._chain_path), str(self._key_path))
        return context

    def stop(self) -> None:
        super().stop()
        if self._owns_tls_dir:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------ seed views

    def _zones_of(self, region: str, size: str) -> list[str]:
        if region not in ZONAL_REGIONS:
            return []
        return list(ZONE_OVERRIDES.get((region, size), ["1", "2", "3"]))

    def _build_skus(self) -> list[dict[str, Any]]:
        skus: list[dict[str, Any]] = []
        for row in self.seed:
            skus.append(self._sku(row.region, row.instance_type, row.vcpus, row.memory_gib, row.gpu_count))
        for region in self.regions:  # decoys the adapter must skip: no GPUs, not a VM
            skus.append(self._sku(region, "Standard_D4s_v5", 4, Decimal(16), 0))
            skus.append(
                {
                    "resourceType": "disks",
                    "name": "Premium_LRS",
                    "tier": "Premium",
                    "size": "P1",
                    "family": "PremiumDisks",
                    "locations": [region],
                    "locationInfo": [{"location": region, "zones": self._zones_of(region, ""), "zoneDetails": []}],
                    "capabilities": [{"name": "MaxSizeGiB", "value": "4"}],
                    "restrictions": [],
                }
            )
        return skus

    def _sku(self, region: str, size: str, vcpus: int, memory_gib: Decimal, gpus: int) -> dict[str, Any]:
        capabilities = {
            "MaxResourceVolumeMB": str(vcpus * 30 * 1024),
            "OSVhdSizeMB": "1047552",
            "vCPUs": str(vcpus),
            "MemoryGB": f"{memory_gib.normalize():f}",
            "HyperVGenerations": "V2" if "H100" in size or "A100" in size or "A10_" in size else "V1,V2",
            "LowPriorityCapable": "True",
            "vCPUsAvailable": str(vcpus),
            "PremiumIO": "True" if re.search(r"\d+\w*s_", size) else "False",
            "AcceleratedNetworkingEnabled": "True",
            "RdmaEnabled": "True" if RDMA_SIZES.match(size) else "False",
        }
        if gpus:
            capabilities["GPUs"] = str(gpus)
        restrictions: list[dict[str, Any]] = []
        if (region, size) in LOCATION_RESTRICTIONS:
            restrictions.append(
                {
                    "type": "Location",
                    "values": [region],
                    "restrictionInfo": {"locations": [region]},
                    "reasonCode": "NotAvailableForSubscription",
                }
            )
        closed = ZONE_RESTRICTIONS.get((region, size))
        if closed:
            restrictions.append(
                {
                    "type": "Zone",
                    "values": [region],
                    "restrictionInfo": {"locations": [region], "zones": closed},
                    "reasonCode": "NotAvailableForSubscription",
                }
            )
        return {
            "resourceType": "virtualMachines",
            "name": size,
            "tier": "Standard",
            "size": _short(size),
            "family": _family(size),
            "locations": [region],
            "locationInfo": [{"location": region, "zones": self._zones_of(region, size), "zoneDetails": []}],
            "capabilities": [{"name": k, "value": v} for k, v in capabilities.items()],
            "restrictions": restrictions,
        }

    def _build_prices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for row in self.seed:
            meter, series = _meter(row.instance_type), _series(row.instance_type)
            linux = f"Virtual Machines {series} Series"

            def item(
                sku_name: str,
                product: str,
                price: Decimal,
                kind: str = "Consumption",
                _row: SeedPrice = row,
                **more: Any,
            ) -> dict[str, Any]:
                return {
                    "currencyCode": "USD",
                    "tierMinimumUnits": 0.0,
                    "retailPrice": float(price),
                    "unitPrice": float(price),
                    "armRegionName": _row.region,
                    "location": REGION_DISPLAY.get(_row.region, _row.region),
                    "effectiveStartDate": "2025-06-01T00:00:00Z",
                    "meterId": _uuid(_row.region, _row.instance_type, sku_name, product, kind),
                    "meterName": sku_name,
                    "productId": "DZH318Z0" + hashlib.sha256(product.encode()).hexdigest()[:4].upper(),
                    "skuId": "DZH318Z0/" + hashlib.sha256(sku_name.encode()).hexdigest()[:4].upper(),
                    "productName": product,
                    "skuName": sku_name,
                    "serviceName": "Virtual Machines",
                    "serviceId": "DZH313Z7MMC8",
                    "serviceFamily": "Compute",
                    "unitOfMeasure": "1 Hour",
                    "type": kind,
                    "isPrimaryMeterRegion": True,
                    "armSkuName": _row.instance_type,
                    **more,
                }

            items.append(item(meter, linux, row.on_demand))
            items.append(item(meter, linux, row.on_demand, "DevTestConsumption"))
            items.append(item(meter, f"{linux} Windows", row.on_demand + WINDOWS_UPLIFT_PER_VCPU * row.vcpus))
            reserved = (row.on_demand * RESERVATION_DISCOUNT * 8760).quantize(Decimal("0.01"))
            items.append(item(meter, linux, reserved, "Reservation", reservationTerm="1 Year"))
            if row.spot is not None:
                items.append(item(f"{meter} Spot", linux, row.spot))
                items.append(item(f"{meter} Low Priority", linux, row.spot))
                items.append(item(f"{meter} Spot", f"{linux} Windows", row.spot + WINDOWS_UPLIFT_PER_VCPU * row.vcpus))
        return items

    # -------------------------------------------------------------------------------- public helpers

    # A service principal the sandbox accepts (any client id not starting with "bad" would do).
    demo_credentials: dict[str, str] = {
        "tenant_id": "72f988bf-0000-0000-0000-0000000005b0",
        "client_id": "broker-sandbox-app",
        "client_secret": "sandbox-secret",
        "subscription_id": "00000000-0000-0000-0000-0000000005b0",
    }
    demo_subnet_id = (
        "/subscriptions/00000000-0000-0000-0000-0000000005b0/resourceGroups/broker-net/providers"
        "/Microsoft.Network/virtualNetworks/broker/subnets/gpu"
    )

    def account_options(self) -> dict[str, str]:
        """Adapter options that point an account at this sandbox: its CA, token and price endpoints, a subnet
        and a login key (the sandbox accepts any), and a short polling interval. Needs a started sandbox."""
        return {
            "ca_bundle": str(self.cert_path),
            "authority_url": self.url,
            "prices_url": self.url,
            "subnet_id": self.demo_subnet_id,
            "ssh_public_key": DEMO_SSH_KEY,
            "polling_interval": "0.05",
        }

    def zones(self, region: str, instance_type: str) -> list[str]:
        """The zone numbers a seeded size is offered in ([] in a region without zones)."""
        return self._zones_of(region, instance_type)

    def on_demand_price(self, region: str, instance_type: str) -> Decimal | None:
        row = self._seed_by_key.get((region, instance_type))
        return row.on_demand if row else None

    def spot_price(self, region: str, instance_type: str) -> Decimal | None:
        row = self._seed_by_key.get((region, instance_type))
        return row.spot if row else None

    def accept_client_ids(self, client_ids: Iterable[str] | None) -> None:
        """Accept only these client ids at the token endpoint; None restores the default rule: any
        non-empty id that does not start with ``bad``."""
        with self._lock:
            self._valid_client_ids = frozenset(client_ids) if client_ids is not None else None

    def client_accepted(self, client_id: str) -> bool:
        with self._lock:
            valid = self._valid_client_ids
        if valid is not None:
            return client_id in valid
        return bool(client_id) and not client_id.startswith("bad")

    def instances(self, region: str | None = None) -> list[SandboxVm]:
        """Every VM the sandbox holds (deleted ones are gone), optionally in one region."""
        self._boot_due()
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vms = list(self._vms.values())
        states = {"Creating": "creating", "Succeeded": "running", "Failed": "failed", "Deleting": "deleting"}
        found = [
            SandboxVm(
                instance_id=vm.name,
                resource_group=vm.resource_group,
                region=vm.location,
                zone=f"{vm.location}-{vm.zones[0]}" if vm.zones else vm.location,
                instance_type=vm.size,
                state=states[vm.provisioning_state(now)],
                priority=str(vm.body.get("properties", {}).get("priority") or "Regular"),
                tags=dict(vm.body.get("tags") or {}),
            )
            for vm in vms
            if region is None or vm.location == region
        ]
        return sorted(found, key=lambda v: (v.region, v.instance_id))

    def vm_request(self, instance_id: str) -> dict[str, Any]:
        """What a VM was created with, as ARM keeps it (custom data included, which no GET returns), for tests
        that read back what a launch carried. Raises ``KeyError`` for a VM the sandbox does not hold."""
        with self._lock:
            for vm in self._vms.values():
                if vm.name.lower() == instance_id.lower():
                    body: dict[str, Any] = json.loads(json.dumps(vm.body))
                    return body
        raise KeyError(instance_id)

    def network_security_group(self, resource_id: str) -> SandboxNsg | None:
        """A network security group by its resource id, None when there is none (or its delete finished)."""
        return self.network.find(resource_id)

    def reset(self) -> None:
        self.faults.clear()
        with self._lock:
            self._vms.clear()
            self._operations.clear()
            self.clear_calls()
            self._valid_client_ids = None
            self._quota_limits.clear()
            self._scripted.clear()
        self.booter.reset()
        self.network.reset()
        self.images.reset()
        self.create_seconds = DEFAULT_CREATE_SECONDS
        self.delete_seconds = 0.0
        self.retry_after_s = 1
        self.price_page_size = PRICE_PAGE_SIZE
        self.vm_page_size = VM_PAGE_SIZE

    def answer_next(self, action: str, body: Any, *, status: int = 200) -> None:
        """Answer the next well-formed request for ``action`` (an ARM operation id such as
        ``VirtualMachines_ListAll``) with ``body`` instead of the sandbox's own answer, once: a JSON value, or bytes
        sent as they are. For tests of what a client makes of an answer Azure's reference does not allow."""
        with self._lock:
            self._scripted.setdefault(action, deque()).append((status, body))

    def _scripted_answer(self, action: str) -> Response | None:
        with self._lock:
            queued = self._scripted.get(action)
            if not queued:
                return None
            status, body = queued.popleft()
        if isinstance(body, bytes):
            return Response(body, status=status, mimetype="application/json")
        return json_response(body, status=status)

    def set_quota(self, name: str, limit: int | None) -> None:
        """Set a vCPU quota's limit (``cores``, ``lowPriorityCores`` or a family such as
        ``standardNCADSH100v5Family``) in every region; None restores the default. The usages list reports it
        beside the live usage, and a create that would exceed it is refused with 409 OperationNotAllowed."""
        with self._lock:
            if limit is None:
                self._quota_limits.pop(name, None)
            else:
                self._quota_limits[name] = int(limit)

    def _quota_limit(self, name: str) -> int:
        return self._quota_limits.get(name, DEFAULT_CORE_QUOTAS.get(name, DEFAULT_FAMILY_CORES))

    def _core_needs(self, location: str, size: str, spot: bool) -> dict[str, int]:
        """The quotas a VM of ``size`` counts against, with its vCPUs: Spot VMs only against the regional
        low-priority quota, the others against their family's and the regional total."""
        seed = self._seed_by_key.get((location, size))
        vcpus = seed.vcpus if seed else 0
        return {"lowPriorityCores": vcpus} if spot else {_family(size): vcpus, "cores": vcpus}

    def _core_usage(self, location: str) -> dict[str, int]:
        """vCPUs in use per quota name in ``location``. Caller holds the lock."""
        usage: dict[str, int] = {}
        for vm in self._vms.values():
            if vm.location != location:
                continue
            spot = (vm.body.get("properties") or {}).get("priority") == "Spot"
            for name, vcpus in self._core_needs(vm.location, vm.size, spot).items():
                usage[name] = usage.get(name, 0) + vcpus
        return usage

    def _quota_refusal(self, location: str, size: str, spot: bool) -> Response | None:
        """Azure's 409 when the VM would take a vCPU quota past its limit. Caller holds the lock."""
        usage = self._core_usage(location)
        for name, vcpus in self._core_needs(location, size, spot).items():
            limit, used = self._quota_limit(name), usage.get(name, 0)
            if used + vcpus > limit:
                label = "LowPriorityCores" if name == "lowPriorityCores" else name
                message = (
                    f"Operation could not be completed as it results in exceeding approved {label} Cores quota. "
                    f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: "
                    f"{limit}, Current Usage: {used}, Additional Required: {vcpus}, (Minimum) New Limit Required: "
                    f"{used + vcpus}."
                )
                return arm_error("OperationNotAllowed", message, 409)
        return None

    def control_extra(self, request: Request, route: str) -> Response | None:
        if route == "quotas" and request.method == "POST":
            body = request.get_json(force=True, silent=True) or {}
            limit = body.get("limit")
            self.set_quota(str(body.get("name", "")), None if limit is None else int(limit))
            return json_response({"name": body.get("name"), "limit": limit})
        if route == "credentials" and request.method in ("PUT", "POST"):
            body = request.get_json(force=True, silent=True) or {}
            ids = body.get("valid_client_ids")
            self.accept_client_ids(ids if ids is None else [str(i) for i in ids])
            return json_response({"valid_client_ids": ids})
        if route == "calls" and request.method == "GET":
            return json_response({"calls": [[c.action, c.region] for c in self.calls()]})
        if route == "instances" and request.method == "GET":
            return json_response(
                {
                    "instances": [
                        {"instance_id": v.instance_id, "region": v.region, "state": v.state} for v in self.instances()
                    ]
                }
            )
        if route == "ca.pem" and request.method == "GET":
            return Response(self.cert_path.read_bytes(), mimetype="application/x-pem-file")
        return None

    # -------------------------------------------------------------------------------------- routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        self._boot_due()
        response = self._dispatch(request)
        # Again after answering: a VM this answer showed running has booted by the time the caller reads it.
        self._boot_due()
        return response(environ, start_response)

    # ------------------------------------------------------------------------------------------- boot

    def _boot_due(self) -> None:
        """Start the lease agent of each VM that has come to run, once, from the custom data it was created with
        (cloud-init's first boot on a real VM); the booter is called outside the sandbox's lock."""
        now = time.monotonic()
        due: list[_Vm] = []
        with self._lock:
            for vm in self._vms.values():
                if not vm.booted and vm.delete_op is None and vm.provisioning_state(now) == "Succeeded":
                    vm.booted = True
                    due.append(vm)
        for vm in due:
            os_profile = (vm.body.get("properties") or {}).get("osProfile") or {}
            seed = self._seed_by_key.get((vm.location, vm.size))
            gpus = simulated_gpus(_gpu_key(vm.size, seed), seed.gpu_count, seed.gpu_memory_gb) if seed else []
            self.booter.boot(
                instance_id=vm.name,
                user_data=azure_launch.custom_data(os_profile) or None,
                gpus=gpus,
                instance_type=vm.size,
                zone=f"{vm.location}-{vm.zones[0]}" if vm.zones else vm.location,
            )

    def _dispatch(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        token_match = TOKEN_PATH.match(path)
        if token_match and request.method == "POST":
            self._log(Call("OAuth2_Token"))
            return self._token(request, token_match.group("tenant"))
        if path.lower() == PRICES_PATH and request.method == "GET":
            return self._retail_prices(request)
        for method, pattern, action in ROUTES:
            match = pattern.match(path)
            if match and request.method == method:
                return self._arm(request, action, match.groupdict())
        for _, pattern, _ in ROUTES:
            if pattern.match(path):
                return arm_error("MethodNotAllowed", f"The requested method {request.method} is not allowed.", 405)
        return arm_error("InvalidResourceType", f"No route for {request.method} {path}", 404)

    def _log(self, call: Call) -> None:
        with self._lock:
            self.record_call(call)

    def _transport_fault(self, call: Call) -> Fault | None:
        fault = self.faults.take(call.action, call.instance_types, call.zone, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(
                call.action, call.instance_types, call.zone, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        return fault

    def _throttled(self) -> Response:
        """Compute's throttling answer as Microsoft's "Troubleshooting API throttling errors" shows it: 429,
        ``OperationNotAllowed`` with a too-many-requests message, the operation group in ``details``."""
        group = "PutVM3Min"
        counts = {"operationGroup": group, "allowedRequestCount": 240, "measuredRequestCount": 241}
        return arm_error(
            "OperationNotAllowed",
            "The server rejected the request because too many requests have been received for this subscription.",
            429,
            {"Retry-After": str(self.retry_after_s)},
            details=[{"code": "TooManyRequests", "target": group, "message": json.dumps(counts)}],
        )

    # ------------------------------------------------------------------------------------------ token

    def _token(self, request: Request, tenant: str) -> Response:
        form = request.form
        client_id = form.get("client_id", "")
        fault = self._transport_fault(Call("OAuth2_Token"))
        if fault is not None and fault.kind is FaultKind.THROTTLE:
            return self._aad_error("temporarily_unavailable", 90055, "Too many requests. Retry later.", 429)
        if form.get("grant_type") != "client_credentials":
            return self._aad_error("unsupported_grant_type", 70003, "The app requested an unsupported grant type.", 400)
        if not form.get("scope"):
            return self._aad_error("invalid_request", 90014, "The required field 'scope' is missing.", 400)
        if not self.client_accepted(client_id):
            return self._aad_error(
                "unauthorized_client",
                700016,
                f"Application with identifier '{client_id}' was not found in the directory '{tenant}'. This can "
                "happen if the application has not been installed by the administrator of the tenant or consented "
                "to by any user in the tenant.",
                400,
            )
        if not form.get("client_secret") or (fault is not None and fault.kind is FaultKind.CREDENTIALS):
            return self._aad_error(
                "invalid_client",
                7000215,
                "Invalid client secret provided. Ensure the secret being sent in the request is the client secret "
                f"value, not the client secret ID, for a secret added to app '{client_id}'.",
                401,
            )
        expires = int(time.time()) + TOKEN_LIFETIME_S
        payload = _b64(json.dumps({"tid": tenant, "cid": client_id, "exp": expires}).encode())
        signature = _b64(hmac.new(self._token_key, payload.encode(), hashlib.sha256).digest())
        return json_response(
            {
                "token_type": "Bearer",
                "expires_in": TOKEN_LIFETIME_S,
                "ext_expires_in": TOKEN_LIFETIME_S,
                "access_token": f"sbx1.{payload}.{signature}",
            }
        )

    @staticmethod
    def _aad_error(error: str, code: int, description: str, status: int) -> Response:
        trace, correlation = str(uuid.uuid4()), str(uuid.uuid4())
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        return json_response(
            {
                "error": error,
                "error_description": f"AADSTS{code}: {description}\r\nTrace ID: {trace}\r\nCorrelation ID: "
                f"{correlation}\r\nTimestamp: {stamp}",
                "error_codes": [code],
                "timestamp": stamp,
                "trace_id": trace,
                "correlation_id": correlation,
                "error_uri": f"https://login.microsoftonline.com/error?code={code}",
            },
            status=status,
        )

    def _token_problem(self, request: Request) -> Response | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return arm_error(
                "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.", 401
            )
        parts = header[len("Bearer ") :].split(".")
        if len(parts) != 3 or parts[0] != "sbx1":
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        expected = _b64(hmac.new(self._token_key, parts[1].encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[2]):
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        try:
            claims = json.loads(_unb64(parts[1]))
            expires = int(claims["exp"])
        except (ValueError, KeyError, TypeError):
            return arm_error("InvalidAuthenticationToken", "The access token is invalid.", 401)
        if expires < time.time():
            return arm_error("ExpiredAuthenticationToken", "The access token expiry UTC time is earlier than now.", 401)
        return None

    # ------------------------------------------------------------------------------------ retail prices

    def _retail_prices(self, request: Request) -> Response:
        self._log(Call("RetailPrices_List"))
        fault = self._transport_fault(Call("RetailPrices_List"))
        if fault is not None:
            if fault.kind is FaultKind.THROTTLE:
                response = json_response({"Error": {"Code": "TooManyRequests", "Message": "Rate limited"}}, 429)
                response.headers["Retry-After"] = str(self.retry_after_s)
                return response
            return json_response({"Error": {"Code": "Forbidden", "Message": "Access denied"}}, 403)
        odata = request.args.get("$filter", "")
        clauses: list[tuple[str, str]] = []
        for clause in _AND.split(odata.strip()) if odata.strip() else []:
            match = _FILTER_CLAUSE.match(clause)
            field_name = PRICE_FIELDS.get(match.group(1).lower()) if match else None
            if match is None or field_name is None:
                return json_response({"Error": {"Code": "InvalidFilter", "Message": f"Invalid filter: {clause}"}}, 400)
            clauses.append((field_name, match.group(2)))
        currency = request.args.get("currencyCode", "USD").strip("'")
        try:
            skip = int(request.args.get("$skip", "0"))
        except ValueError:
            return json_response({"Error": {"Code": "InvalidSkip", "Message": "Invalid $skip"}}, 400)
        rows = [
            item
            for item in self._prices
            if item["currencyCode"] == currency and all(str(item.get(f)) == v for f, v in clauses)
        ]
        page = rows[skip : skip + self.price_page_size]
        next_link = None
        if skip + self.price_page_size < len(rows):
            query = "&".join(
                f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in request.args.items() if k != "$skip"
            )
            next_link = f"{request.host_url}api/retail/prices?{query}&$skip={skip + self.price_page_size}"
        return json_response(
            {
                "BillingCurrency": currency,
                "CustomerEntityId": "Default",
                "CustomerEntityType": "Retail",
                "Items": page,
                "NextPageLink": next_link,
                "Count": len(page),
            }
        )

    # -------------------------------------------------------------------------------------------- ARM

    def _arm(self, request: Request, action: str, args: dict[str, str]) -> Response:
        body: dict[str, Any] = {}
        if request.method == "PUT":
            parsed = request.get_json(force=True, silent=True)
            if not isinstance(parsed, dict):
                return arm_error(
                    "InvalidRequestContent", "The request content was invalid and could not be deserialized.", 400
                )
            body = parsed
        location = str(body.get("location") or args.get("loc") or "")
        size = str(((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize") or "")
        zones = [str(z) for z in body.get("zones") or ()]
        zone = f"{location}-{zones[0]}" if zones else (location or None)
        call = Call(action, location, (size,) if size else (), zone)
        self._log(call)
        problem = self._token_problem(request)
        if problem is not None:
            return problem
        fault = self._transport_fault(call)
        if fault is not None:
            if fault.kind is FaultKind.THROTTLE:
                return self._throttled()
            namespace = NETWORK if action.startswith("Network") else COMPUTE
            return arm_error(
                fault.code or "AuthorizationFailed",
                f"The client does not have authorization to perform action '{namespace}/{action}' over scope "
                f"'/subscriptions/{args.get('sub', '')}' or the scope is invalid.",
                403,
            )
        if not request.args.get("api-version"):
            return arm_error(
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
                400,
            )
        scripted = self._scripted_answer(action)
        if scripted is not None:
            return scripted
        if action == "ResourceSkus_List":
            return self._list_skus(request)
        if action == "Usage_List":
            return self._usages(args["loc"])
        if action in ("Operations_Get", "NetworkOperations_Get"):
            return self._operations.response(args["op"])
        if action == "VirtualMachines_List":
            return self._list_vms(request, args["sub"], args["rg"])
        if action == "VirtualMachines_ListAll":
            return self._list_all_vms(request, args["sub"])
        if action in IMAGE_ACTIONS:
            return self._image(request, action, args)
        if action.startswith("NetworkSecurityGroups_"):
            return self._network_security_groups(request, action, args, body)
        key = (args["sub"].lower(), args["rg"].lower(), args["vm"].lower())
        if action == "VirtualMachines_Get":
            return self._get_vm(request, key)
        if action == "VirtualMachines_Delete":
            return self._delete_vm(request, key)
        return self._put_vm(request, args, key, body, call)

    def _image(self, request: Request, action: str, args: dict[str, str]) -> Response:
        # An image_missing fault answers as Azure does for an image the region lacks; the lookup names no size or
        # zone, so the fault is matched on the region alone.
        location = args.get("loc", "").lower()
        if action == "Images_Get":
            managed = self.images.managed(
                f"/subscriptions/{args['sub']}/resourceGroups/{args['rg']}/providers/{COMPUTE}/images/{args['image']}"
            )
            location = managed.location if managed is not None else ""
        fault = self.faults.take(IMAGE_ACTION, [], None, kinds={FaultKind.IMAGE_MISSING}, region=location or None)
        if action == "Images_Get":
            if fault is not None:
                return arm_error(
                    "ResourceNotFound",
                    f"The Resource '{COMPUTE}/images/{args['image']}' under resource group '{args['rg']}' was not "
                    "found.",
                    404,
                )
            return self.images.managed_image(args)
        if fault is not None:
            return self.images.not_found()
        if action == "VirtualMachineImages_List":
            return self.images.versions(request, args)
        return self.images.version(args)

    def _network_security_groups(
        self, request: Request, action: str, args: dict[str, str], body: dict[str, Any]
    ) -> Response:
        if action == "NetworkSecurityGroups_List":
            return self.network.list_groups(request, args)
        if action == "NetworkSecurityGroups_Get":
            return self.network.get(args)
        if action == "NetworkSecurityGroups_Delete":
            return self.network.delete(request, args)
        return self.network.put(request, args, body)

    def _nsg_users(self, nsg_id: str) -> list[str]:
        """The NICs that use a network security group: each live VM's inline NICs that name it (a NIC made with
        ``deleteOption: Delete`` goes when its VM's delete finishes)."""
        users: list[str] = []
        with self._lock:
            self._sweep(time.monotonic())
            for vm in self._vms.values():
                properties = vm.body.get("properties") or {}
                configurations = (properties.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []
                for configuration in configurations:
                    named = ((configuration.get("properties") or {}).get("networkSecurityGroup") or {}).get("id")
                    if str(named or "").lower() == nsg_id.lower():
                        users.append(
                            f"/subscriptions/{vm.subscription}/resourceGroups/{vm.resource_group}/providers/{NETWORK}"
                            f"/networkInterfaces/{configuration.get('name', vm.name)}"
                        )
        return users

    def _list_skus(self, request: Request) -> Response:
        odata = request.args.get("$filter", "").strip()
        skus = self._skus
        if odata:
            match = re.match(r"^location\s+eq\s+'([^']+)'$", odata, re.I)
            if match is None:
                return arm_error("InvalidFilter", f"The filter '{odata}' is not supported.", 400)
            wanted = match.group(1).lower()
            skus = [s for s in skus if wanted in {loc.lower() for loc in s["locations"]}]
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        page = skus[offset : offset + SKU_PAGE_SIZE]
        result: dict[str, Any] = {"value": page}
        if offset + SKU_PAGE_SIZE < len(skus):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + SKU_PAGE_SIZE)})
        return json_response(result)

    @staticmethod
    def _link(request: Request, replace: dict[str, str]) -> str:
        args = {k: v for k, v in request.args.items() if k not in replace}
        args.update(replace)
        query = "&".join(f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in args.items())
        return f"{request.host_url.rstrip('/')}{request.path}?{query}"

    def _usages(self, location: str) -> Response:
        if location.lower() not in self.regions:
            return arm_error(
                "NoRegisteredProviderFound", f"No registered resource provider found for location '{location}'.", 400
            )
        now = time.monotonic()
        location = location.lower()
        with self._lock:
            self._sweep(now)
            usage = self._core_usage(location)
            machines = sum(1 for vm in self._vms.values() if vm.location == location)
            families = sorted({_family(r.instance_type) for r in self.seed if r.region == location})
            names = [
                ("cores", "Total Regional vCPUs"),
                ("lowPriorityCores", "Total Regional Low-priority vCPUs"),
                *((family, family) for family in families),
            ]
            value = [
                {
                    "unit": "Count",
                    "currentValue": usage.get(name, 0),
                    "limit": self._quota_limit(name),
                    "name": {"value": name, "localizedValue": label},
                }
                for name, label in names
            ]
        value.append(
            {
                "unit": "Count",
                "currentValue": machines,
                "limit": 25000,
                "name": {"value": "virtualMachines", "localizedValue": "Virtual Machines"},
            }
        )
        return json_response({"value": value})

    def _operation_url(self, request: Request, vm: _Vm, op: Operation) -> str:
        api_version = request.args.get("api-version", "")
        return self._operations.url(request.host_url, vm.subscription, COMPUTE, op, api_version)

    def _new_operation(self, location: str, seconds: float, error: tuple[str, str] | None = None) -> Operation:
        return self._operations.new(location, seconds, error)

    def _sweep(self, now: float) -> None:
        """Forget VMs whose delete finished. Caller holds the lock."""
        for key, vm in list(self._vms.items()):
            if vm.delete_op is not None and now >= vm.delete_op.done_at:
                del self._vms[key]

    def _vm_json(self, vm: _Vm, now: float, *, instance_view: bool) -> dict[str, Any]:
        properties = json.loads(json.dumps(vm.body.get("properties") or {}))
        # ARM keeps customData for the VM's provisioning agent and never returns it.
        (properties.get("osProfile") or {}).pop("customData", None)
        state = vm.provisioning_state(now)
        properties.update(vmId=vm.vm_id, provisioningState=state, timeCreated=vm.created)
        if instance_view:
            properties["instanceView"] = self._instance_view(vm, now)
        result: dict[str, Any] = {
            "name": vm.name,
            "id": vm.resource_id,
            "type": f"{COMPUTE}/virtualMachines",
            "location": vm.location,
            "tags": dict(vm.body.get("tags") or {}),
            "etag": f'"{vm.etag}"',
            "properties": properties,
        }
        if vm.zones:
            result["zones"] = list(vm.zones)
        return result

    @staticmethod
    def _instance_view(vm: _Vm, now: float) -> dict[str, Any]:
        """The VM's run-time status as ARM reports it in ``properties.instanceView``: a ``ProvisioningState/...``
        status (``ProvisioningState/failed/<code>`` with the error's message for a failed create) and, unless the
        create failed, a ``PowerState/...`` one."""
        state = vm.provisioning_state(now)
        statuses: list[dict[str, Any]] = []
        if state == "Failed" and vm.create_op.error:
            code, message = vm.create_op.error
            statuses.append(
                {
                    "code": f"ProvisioningState/failed/{code}",
                    "level": "Error",
                    "displayStatus": "Provisioning failed",
                    "message": message,
                    "time": vm.created,
                }
            )
        else:
            statuses.append(
                {
                    "code": f"ProvisioningState/{state.lower()}",
                    "level": "Info",
                    "displayStatus": {"Succeeded": "Provisioning succeeded"}.get(state, state),
                }
            )
            power = {"Creating": "starting", "Succeeded": "running", "Deleting": "stopping"}[state]
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        computer_name = ((vm.body.get("properties") or {}).get("osProfile") or {}).get("computerName", vm.name)
        return {"computerName": computer_name, "hyperVGeneration": "V2", "statuses": statuses}

    def _status_json(self, vm: _Vm, now: float) -> dict[str, Any]:
        """One item of List All with ``statusOnly=true``: the VM's identity and its run-time status (the instance
        view, where a GET with ``$expand=instanceView`` puts it), none of its model (size, zones, tags)."""
        return {
            "name": vm.name,
            "id": vm.resource_id,
            "type": f"{COMPUTE}/virtualMachines",
            "location": vm.location,
            "properties": {"instanceView": self._instance_view(vm, now)},
        }

    def _list_all_vms(self, request: Request, sub: str) -> Response:
        """Virtual Machines - List All: every VM of the subscription, in every resource group, ``vm_page_size`` a
        page with a ``nextLink`` (``$skiptoken``) back here. ``statusOnly=true`` lists each VM's run-time status
        instead of its model. ``$expand=instanceView`` needs a scale set ``$filter``, and the sandbox holds no scale
        sets, so either is refused."""
        if request.args.get("$filter") is not None:
            return arm_error(
                "InvalidParameter",
                "The sandbox holds no virtual machine scale sets to filter by.",
                400,
                target="$filter",
            )
        if request.args.get("$expand") is not None:
            return arm_error(
                "InvalidParameter",
                "The $expand option 'instanceView' can only be specified if a valid $filter option is specified.",
                400,
                target="$expand",
            )
        status_only = request.args.get("statusOnly", "").lower() == "true"
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vms = sorted(
                (vm for (s, _, _), vm in self._vms.items() if s == sub.lower()),
                key=lambda v: (v.resource_group.lower(), v.name.lower()),
            )
            page = vms[offset : offset + self.vm_page_size]
            values = [
                self._status_json(vm, now) if status_only else self._vm_json(vm, now, instance_view=False)
                for vm in page
            ]
        result: dict[str, Any] = {"value": values}
        if offset + self.vm_page_size < len(vms):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + self.vm_page_size)})
        return json_response(result)

    def _list_vms(self, request: Request, sub: str, rg: str) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vms = sorted(
                (vm for (s, g, _), vm in self._vms.items() if s == sub.lower() and g == rg.lower()),
                key=lambda v: v.name.lower(),
            )
            values = [self._vm_json(vm, now, instance_view=False) for vm in vms]
        try:
            offset = int(request.args.get("$skiptoken", "0"))
        except ValueError:
            return arm_error("InvalidSkipToken", "The skip token is invalid.", 400)
        result: dict[str, Any] = {"value": values[offset : offset + self.vm_page_size]}
        if offset + self.vm_page_size < len(values):
            result["nextLink"] = self._link(request, {"$skiptoken": str(offset + self.vm_page_size)})
        return json_response(result)

    def _get_vm(self, request: Request, key: tuple[str, str, str]) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vm = self._vms.get(key)
            if vm is None:
                return self._not_found(key)
            expand = request.args.get("$expand", "").lower() == "instanceview"
            return json_response(self._vm_json(vm, now, instance_view=expand))

    @staticmethod
    def _not_found(key: tuple[str, str, str]) -> Response:
        return arm_error(
            "ResourceNotFound",
            f"The Resource '{COMPUTE}/virtualMachines/{key[2]}' under resource group '{key[1]}' was not found.",
            404,
        )

    def _delete_vm(self, request: Request, key: tuple[str, str, str]) -> Response:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            vm = self._vms.get(key)
            if vm is None:
                return Response(status=204)  # Azure answers a delete of a missing resource with 204
            if vm.delete_op is None:
                vm.delete_op = self._new_operation(vm.location, self.delete_seconds)
            url = self._operation_url(request, vm, vm.delete_op)
        self.booter.halt(vm.name)  # the VM stops as its delete begins
        response = Response(status=202)
        response.headers["Azure-AsyncOperation"] = url
        response.headers["Location"] = url + "&monitor=true"
        return response

    def _put_vm(
        self, request: Request, args: dict[str, str], key: tuple[str, str, str], body: dict[str, Any], call: Call
    ) -> Response:
        name = args["vm"]
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            existing = self._vms.get(key)
            if existing is not None:
                if request.headers.get("If-None-Match", "").strip() == "*":
                    return arm_error(
                        "PreconditionFailed",
                        "The condition specified using HTTP conditional header(s) is not met.",
                        412,
                    )
                # A plain PUT on an existing VM would be an update; the sandbox keeps the VM as it is.
                return json_response(self._vm_json(existing, now, instance_view=False), status=200)
        invalid = self._validate(name, body)
        if invalid is None:
            vm_id = (
                f"/subscriptions/{args['sub']}/resourceGroups/{args['rg']}/providers/{COMPUTE}/virtualMachines/{name}"
            )
            location = str(body["location"]).lower()
            invalid = azure_launch.nsg_refusal(vm_id, body["properties"], location, self.network)
        if invalid is not None:
            return invalid
        fault = self.faults.take(call.action, call.instance_types, call.zone, kinds=OUTCOME_KINDS)
        location = str(body["location"]).lower()
        zones = [str(z) for z in body.get("zones") or ()]
        size = str(body["properties"]["hardwareProfile"]["vmSize"])
        failure: tuple[str, str] | None = None
        if fault is not None:
            refusal, failure = self._fault_outcome(fault, location, zones, size)
            if refusal is not None:
                return refusal
        with self._lock:
            if key in self._vms:  # a concurrent PUT of the same name won the race
                return arm_error(
                    "PreconditionFailed", "The condition specified using HTTP conditional header(s) is not met.", 412
                )
            refusal = self._quota_refusal(location, size, body["properties"].get("priority") == "Spot")
            if refusal is not None:
                return refusal
            op = self._new_operation(location, self.create_seconds, failure)
            vm = _Vm(
                subscription=args["sub"],
                resource_group=args["rg"],
                name=name,
                location=location,
                zones=zones,
                size=size,
                body=json.loads(json.dumps(body)),
                vm_id=str(uuid.uuid4()),
                created=now_iso(),
                create_op=op,
            )
            self._vms[key] = vm
            result = self._vm_json(vm, now, instance_view=False)
            url = self._operation_url(request, vm, op)
        response = json_response(result, status=201)
        response.headers["Azure-AsyncOperation"] = url
        return response

    def _fault_outcome(
        self, fault: Fault, location: str, zones: list[str], size: str
    ) -> tuple[Response | None, tuple[str, str] | None]:
        """(a synchronous refusal, or the error the create's operation will end with)."""
        if fault.kind is FaultKind.QUOTA:
            family = _family(size)
            vcpus = self._seed_by_key[(location, size)].vcpus if (location, size) in self._seed_by_key else 0
            message = (
                f"Operation could not be completed as it results in exceeding approved {family} Cores quota. "
                f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: 0, "
                f"Current Usage: 0, Additional Required: {vcpus}, (Minimum) New Limit Required: {vcpus}."
            )
            return arm_error(fault.code or "OperationNotAllowed", message, 409), None
        code = fault.code or ("ZonalAllocationFailed" if zones else "AllocationFailed")
        if code in SYNC_CAPACITY_CODES:
            return self._sku_not_available(location, zones, size), None
        message = (
            "Allocation failed. We do not have sufficient capacity for the requested VM size in this "
            f"{'zone' if zones else 'region'}. Read more about improving likelihood of allocation success at "
            "http://aka.ms/allocation-guidance"
        )
        return None, (code, message)

    @staticmethod
    def _sku_not_available(location: str, zones: list[str], size: str) -> Response:
        return arm_error(
            "SkuNotAvailable",
            f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' is "
            f"currently not available in location '{location}' zones '{','.join(zones)}'. Please try another size "
            "or deploy to a different location or zones. See https://aka.ms/azureskunotavailable for details.",
            409,
        )

    def _validate(self, name: str, body: dict[str, Any]) -> Response | None:
        """What ARM checks synchronously before accepting a create."""
        if not _VM_NAME.match(name):
            return arm_error("InvalidResourceName", f"The resource name '{name}' is invalid.", 400)
        location = str(body.get("location") or "").lower()
        if location not in self.regions:
            return arm_error(
                "LocationNotAvailableForResourceType",
                f"The provided location '{location}' is not available for resource type '{COMPUTE}/virtualMachines'.",
                400,
            )
        properties = body.get("properties") or {}
        size = str((properties.get("hardwareProfile") or {}).get("vmSize") or "")
        if not size:
            return arm_error("InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing (null).", 400)
        zones = [str(z) for z in body.get("zones") or ()]
        if zones and location not in ZONAL_REGIONS:
            return arm_error("InvalidParameter", f"Availability zones are not supported in location '{location}'.", 400)
        sku = next((s for s in self._skus if s["name"] == size and location in s["locations"]), None)
        if sku is None or any(r["type"] == "Location" for r in sku["restrictions"]):
            return self._sku_not_available(location, zones, size)
        closed = {z for r in sku["restrictions"] if r["type"] == "Zone" for z in r["restrictionInfo"]["zones"]}
        offered = set(sku["locationInfo"][0]["zones"])
        if any(z not in offered or z in closed for z in zones):
            return self._sku_not_available(location, zones, size)
        storage = properties.get("storageProfile") or {}
        if not storage.get("imageReference"):
            return arm_error(
                "InvalidParameter", "Required parameter 'storageProfile.imageReference' is missing (null).", 400
            )
        os_profile = properties.get("osProfile") or {}
        if not os_profile.get("computerName") or not os_profile.get("adminUsername"):
            return arm_error("InvalidParameter", "Required parameter 'osProfile' is missing (null).", 400)
        linux = os_profile.get("linuxConfiguration") or {}
        keys = (linux.get("ssh") or {}).get("publicKeys") or []
        if not os_profile.get("adminPassword") and not any(k.get("keyData") for k in keys):
            return arm_error(
                "InvalidParameter",
                "Authentication using either SSH or by user name and password must be enabled in Linux profile.",
                400,
            )
        refusal = (
            azure_launch.custom_data_refusal(os_profile)
            or azure_launch.key_refusal(os_profile)
            or azure_launch.disk_refusal(storage, location, self.images)
        )
        if refusal is not None:
            return refusal
        network = properties.get("networkProfile") or {}
        configurations = network.get("networkInterfaceConfigurations") or []
        if not network.get("networkInterfaces") and not configurations:
            return arm_error("InvalidParameter", "Required parameter 'networkProfile' is missing (null).", 400)
        if configurations:
            if not network.get("networkApiVersion"):
                return arm_error(
                    "InvalidParameter", "networkApiVersion is required with networkInterfaceConfigurations.", 400
                )
            for configuration in configurations:
                ip_configs = (configuration.get("properties") or {}).get("ipConfigurations") or []
                if not ip_configs or not all(
                    ((c.get("properties") or {}).get("subnet") or {}).get("id") for c in ip_configs
                ):
                    return arm_error("InvalidParameter", "Every ipConfiguration needs a subnet id.", 400)
        if str(properties.get("priority") or "Regular") == "Spot":
            return self._validate_spot(location, size, properties)
        return None

    def _validate_spot(self, location: str, size: str, properties: dict[str, Any]) -> Response | None:
        if properties.get("evictionPolicy") not in ("Deallocate", "Delete"):
            return arm_error("InvalidParameter", "evictionPolicy must be Deallocate or Delete for a Spot VM.", 400)
        current = self.spot_price(location, size)
        if current is None:
            return arm_error(
                "SkuNotAvailable",
                f"The requested VM size '{size}' is not available for Azure Spot in '{location}'.",
                409,
            )
        max_price = (properties.get("billingProfile") or {}).get("maxPrice", -1)
        try:
            max_price_value = Decimal(str(max_price))
        except ArithmeticError:
            return arm_error("InvalidParameter", f"maxPrice {max_price!r} is not a number.", 400)
        if max_price_value != -1 and max_price_value < current:
            return arm_error(
                "OperationNotAllowed",
                f"Unable to perform operation 'Create VM' since the provided max price '{max_price_value} USD' is "
                f"lower than the current spot price '{current} USD' for Azure Spot VM size '{size}'. For more "
                "information, see http://aka.ms/AzureSpot/errormessages.",
                409,
            )
        return None


def start_azure_sandbox(host: str = "127.0.0.1", port: int = 0) -> AzureSandbox:
    """Build an ``AzureSandbox`` and serve it over HTTPS on a daemon thread; ``sandbox.url`` is its base URL
    and ``sandbox.cert_path`` the CA certificate to trust."""
    sandbox = AzureSandbox()
    sandbox.start(host, port)
    return sandbox
