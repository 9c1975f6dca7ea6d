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
  ``POST`` deallocate, powerOff, start and restart are long-running operations too (``power_seconds``) that move
  the instance view's ``PowerState/...`` (``vms.VmHandlers._power_vm``).
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
import json
import re
import secrets
import shutil
import ssl
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from sandboxes.azure.auth import TokenHandlers
from sandboxes.azure.catalogue import PRICE_PAGE_SIZE, CatalogueHandlers
from sandboxes.azure.images import ImageCatalogue
from sandboxes.azure.network import NETWORK, NetworkSecurityGroups, SandboxNsg
from sandboxes.azure.quotas import QuotaHandlers
from sandboxes.azure.seed import COMPUTE, SEED_PATH, load_seed
from sandboxes.azure.state import Call, SandboxVm, _Vm
from sandboxes.azure.tls import _write_tls
from sandboxes.azure.vms import DEFAULT_CREATE_SECONDS, DEFAULT_POWER_SECONDS, POWER_ACTIONS, VM_PAGE_SIZE, VmHandlers
from sandboxes.azure.wire import Operations, arm_error
from sandboxes.faults import IMAGE_ACTION, TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response

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
    # Virtual Machines - Deallocate, Power Off, Start, Restart: POST .../virtualMachines/{vmName}/<action>, 202 with
    # an Azure-AsyncOperation header (Compute REST API reference,
    # https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/deallocate and its siblings power-off,
    # start, restart).
    *(
        (
            "POST",
            re.compile(_RG + rf"/providers/Microsoft\.Compute/virtualMachines/(?P<vm>[^/]+)/{verb}$", re.I),
            action,
        )
        for verb, action in (
            ("deallocate", "VirtualMachines_Deallocate"),
            ("powerOff", "VirtualMachines_PowerOff"),
            ("start", "VirtualMachines_Start"),
            ("restart", "VirtualMachines_Restart"),
        )
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
# The demo account's login key for bare launches: a well-formed Ed25519 public key (ARM checks keyData) whose
# private half does not exist, since its 32 bytes were chosen, not generated.
DEMO_SSH_KEY = (
    "ssh-ed25519 "
    + base64.b64encode(
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + b"gpu-broker azure sandbox demo key"[:32]
    ).decode()
    + " broker@sandbox"
)


# --------------------------------------------------------------------------------------------- sandbox


class AzureSandbox(TokenHandlers, CatalogueHandlers, QuotaHandlers, VmHandlers, SandboxApp):
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
        self.power_seconds = DEFAULT_POWER_SECONDS
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
        self.power_seconds = DEFAULT_POWER_SECONDS
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
        if action in POWER_ACTIONS:
            return self._power_vm(request, action, key, call)
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


def start_azure_sandbox(host: str = "127.0.0.1", port: int = 0) -> AzureSandbox:
    """Build an ``AzureSandbox`` and serve it over HTTPS on a daemon thread; ``sandbox.url`` is its base URL
    and ``sandbox.cert_path`` the CA certificate to trust."""
    sandbox = AzureSandbox()
    sandbox.start(host, port)
    return sandbox
