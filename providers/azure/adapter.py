"""``AzureAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Azure Resource Manager
(Microsoft.Compute, Microsoft.Network) and the Retail Prices API.

A launch with a boot (``providers.launch.BootSpec``) uses Azure's own mechanisms: the boot script as
``osProfile.customData`` (cloud-init runs it at first boot), the buyer's RSA and Ed25519 keys in
``osProfile.linuxConfiguration.ssh.publicKeys`` for the login user, a network security group per (order, region)
on the VM's NIC holding one inbound rule per (port, address range), ``osDisk.diskSizeGB``, and a marketplace
image checked to exist in the region before anything is created (Microsoft's Ubuntu-HPC image unless the buyer
or the account names another).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, ClassVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from providers import ratelimit
from providers.azure import catalog, errors, launching, mapping
from providers.azure.client import AzureClient
from providers.azure.pipeline import (
    AUTHORITY_URL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLLING_INTERVAL,
    DEFAULT_READ_TIMEOUT,
    PRICES_URL,
    ClientSettings,
)
from providers.base import ProviderAdapter, quota_refuse_short
from providers.errors import CredentialsRejected, ImageUnavailable, ProviderRequestRejected, TransientProviderError
from providers.launch import BootSpec, LaunchLimits, LaunchProblem, OrderResource
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

DEFAULT_RESOURCE_GROUP = "broker"
# A launch waits this long for a quick verdict (Azure reports most allocation failures within seconds);
# a VM still creating after it is returned PENDING and its outcome read by describe().
DEFAULT_LAUNCH_WAIT_S = 15.0
DEFAULT_TERMINATE_WAIT_S = 15.0
REQUIRED_CREDENTIALS = ("tenant_id", "client_id", "client_secret", "subscription_id")
NSG_IN_USE = "InUseNetworkSecurityGroupCannotBeDeleted"  # ARM's refusal to delete a group still on a NIC


def _flag(options: dict[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw in (None, ""):
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"options.{key}: {raw!r} is not true or false")


class AzureAdapter(ProviderAdapter):
    """One Azure subscription over ``self.regions`` (ARM locations such as ``eastus``).

    Credentials: ``values`` holds a service principal's ``tenant_id``, ``client_id``, ``client_secret`` and the
    ``subscription_id``; ``endpoint_url``, when set, replaces ``https://management.azure.com``.

    Options (all strings): ``resource_group`` the VMs live in (default ``broker``); for launches
    ``subnet_id`` (the full resource id of the subnet the inline NIC joins) and ``ssh_public_key`` (required for a
    launch without a boot, and used only there), ``admin_username`` (likewise; a boot logs in as ``login_user``),
    ``image`` (``publisher:offer:sku:version`` or an image resource id; default Ubuntu 24.04 for a bare launch and
    Microsoft's Ubuntu-HPC image for a launch with a boot, unless the buyer names one),
    ``os_disk_type``, ``public_ip`` (true/false, default true); ``authority_url`` (Entra ID, default
    ``https://login.microsoftonline.com``), ``prices_url`` (default ``https://prices.azure.com``),
    ``ca_bundle`` (a PEM file to trust instead of the system store, for every endpoint);
    ``connect_timeout``/``read_timeout`` seconds (5/20), ``max_attempts`` for reads (3),
    ``polling_interval`` seconds between operation polls (3), ``launch_wait_s``/``terminate_wait_s`` how long
    a launch or terminate waits for Azure's verdict (15 each; 0 returns as soon as Azure accepted).

    Instance ids are VM names, unique in the resource group; zones are named as in ``mapping``.
    """

    kind = "azure"
    launch_limits: ClassVar[LaunchLimits] = launching.LAUNCH_LIMITS
    login_user: ClassVar[str] = launching.DEFAULT_ADMIN_USERNAME  # the adminUsername every launch with a boot sets

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an Azure account needs at least one region (location)")
        missing = [key for key in REQUIRED_CREDENTIALS if not credentials.values.get(key)]
        if missing:
            raise CredentialsRejected(f"credentials missing: {', '.join(missing)}", provider=errors.PROVIDER)
        options = self.options
        self.resource_group = options.get("resource_group") or DEFAULT_RESOURCE_GROUP
        self.launch_wait_s = option_number(options, "launch_wait_s", DEFAULT_LAUNCH_WAIT_S, allow_zero=True)
        self.terminate_wait_s = option_number(options, "terminate_wait_s", DEFAULT_TERMINATE_WAIT_S, allow_zero=True)
        self.launch_settings = launching.LaunchSettings(
            subnet_id=options.get("subnet_id", ""),
            ssh_public_key=options.get("ssh_public_key", ""),
            admin_username=options.get("admin_username") or launching.DEFAULT_ADMIN_USERNAME,
            image=options.get("image") or launching.DEFAULT_IMAGE,
            os_disk_type=options.get("os_disk_type") or launching.DEFAULT_OS_DISK_TYPE,
            public_ip=_flag(options, "public_ip", True),
            gpu_image=options.get("image") or launching.DEFAULT_GPU_IMAGE,
        )
        self.subscription_id = credentials.values["subscription_id"]
        values = credentials.values
        self._client = AzureClient(
            ClientSettings(
                tenant_id=values["tenant_id"],
                client_id=values["client_id"],
                client_secret=values["client_secret"],
                subscription_id=values["subscription_id"],
                arm_url=(credentials.endpoint_url or "https://management.azure.com").rstrip("/"),
                authority_url=(options.get("authority_url") or AUTHORITY_URL).rstrip("/"),
                prices_url=(options.get("prices_url") or PRICES_URL).rstrip("/"),
                ca_bundle=options.get("ca_bundle") or None,
                connect_timeout=option_number(options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=int(option_number(options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
                polling_interval=option_number(options, "polling_interval", DEFAULT_POLLING_INTERVAL, allow_zero=True),
                rate_limits=ratelimit.limits_from_options(options, self.kind),
            )
        )

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """The compute usages of the first region: cheap, needs only ``Microsoft.Compute/locations/usages/read``.

        Raises ``CredentialsRejected`` (an AADSTS refusal, AuthorizationFailed, SubscriptionNotFound) or
        ``TransientProviderError``.
        """
        self._client.usages(self.regions[0])

    def list_offers(self) -> list[OfferQuote]:
        """One on-demand quote per (zone, GPU size) with a Linux pay-as-you-go price, and one spot quote per
        (zone, size) where the size is spot-capable and has a spot price. Sizes or zones restricted for this
        subscription, and sizes without an on-demand price, are left out.

        Read-only; raises ``TransientProviderError``, ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        offers: list[OfferQuote] = []
        for region in self.regions:
            offers.extend(self._region_offers(region))
        return offers

    def _region_offers(self, region: str) -> list[OfferQuote]:
        specs: dict[str, catalog.SkuSpec] = {}
        for item in self._client.skus(region):
            spec = catalog.sku_spec(item, region)
            if spec is not None:
                specs[spec.name] = spec
        offers: list[OfferQuote] = []
        for name in sorted(specs):
            spec = specs[name]
            items = self._client.retail_prices(catalog.prices_filter(region, name))
            prices = catalog.sku_prices(items, region, name)
            if prices.on_demand is None:
                continue
            for zone in spec.zones:
                offers.append(
                    self._quote(
                        region, zone, spec, PricingModel.ON_DEMAND, prices, {"meter_id": prices.on_demand_meter}
                    )
                )
                if prices.spot is not None and spec.spot_capable:
                    offers.append(
                        self._quote(region, zone, spec, PricingModel.SPOT, prices, {"meter_id": prices.spot_meter})
                    )
        return offers

    def _quote(
        self,
        region: str,
        zone: str,
        spec: catalog.SkuSpec,
        pricing_model: PricingModel,
        prices: catalog.SkuPrices,
        extra: dict[str, Any],
    ) -> OfferQuote:
        price = prices.spot if pricing_model is PricingModel.SPOT else prices.on_demand
        assert price is not None
        return OfferQuote(
            region=region,
            zone=zone,
            instance_type=spec.name,
            pricing_model=pricing_model,
            gpu_model=spec.gpu.model,
            gpu_count=spec.gpu.count,
            gpu_memory_gb=spec.gpu.memory_gb,
            vcpus=spec.vcpus,
            memory_gib=spec.memory_gib,
            price=price,
            currency=prices.currency,
            capacity=None,
            interconnect=spec.gpu.interconnect,
            extra={**spec.extra, **extra},
        )

    def quota_check(self, spec: LaunchSpec) -> None:
        """The region's vCPU quotas from ``usage.list`` (the family from the offer's ``family``) against the VM's
        vCPUs; Spot VMs against the low-priority quota."""
        quotas = mapping.quota_uses(self._client.usages(spec.region))
        family = str(spec.offer_extra.get("family") or "")
        needs = mapping.quota_needs(family, spec.vcpus, spec.pricing_model is PricingModel.SPOT)
        quota_refuse_short(errors.PROVIDER, spec.region, quotas, needs)

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The VM's state from its instance view. A VM whose create failed is ``FAILED`` with ``error_class``,
        ``error_code`` and ``error_message`` in ``extra``. Raises ``ProviderRequestRejected`` (ResourceNotFound)
        when Azure has no such VM.
        """
        vm = self._client.get_vm(self.resource_group, instance_id)
        if vm is None:
            raise errors.rejected(
                f"virtual machine {instance_id} not found in resource group {self.resource_group}",
                code="ResourceNotFound",
            )
        return mapping.instance_handle(vm, resource_group=self.resource_group)

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """One "Virtual Machines - List All" with ``statusOnly=true`` (Compute REST API reference), all its pages:
        ``ceil(VMs in the subscription / page size)`` requests, whatever the number of ids. ARM lists a resource
        group's VMs with their instance view only for one scale set ("'instanceView' ... can only be specified if a
        valid $filter option is specified", the filter being a scale set's id), so the subscription-wide list is the
        one read that gives every standalone VM's power state.

        The answer covers the whole subscription; only VMs of this account's resource group in ``region`` whose names
        were asked are kept (VM names compared as ARM compares them, without case). Each is mapped as ``describe``
        maps a VM from its instance view, but a status-only item carries no model: the handles' ``instance_type``,
        ``zone`` and ``tags`` are empty. A name the list lacks is absent (a VM whose delete finished, or never was).
        Every listed item must be readable (name, resource id, location; the instance view of a kept one), else the
        call raises ``MalformedProviderResponse``."""
        asked: dict[str, list[str]] = {}
        for instance_id in dict.fromkeys(instance_ids):
            asked.setdefault(instance_id.lower(), []).append(instance_id)
        if not asked:
            return {}
        found: dict[str, InstanceHandle] = {}
        for vm in self._client.vm_statuses():
            place = mapping.listed_vm(vm)
            if place.resource_group.lower() != self.resource_group.lower() or place.location.lower() != region.lower():
                continue
            ids = asked.get(place.name.lower())
            if not ids:
                continue
            handle = mapping.instance_handle(vm, resource_group=self.resource_group, status_only=True)
            for instance_id in ids:
                found[instance_id] = handle
        return found

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Every VM in the resource group tagged ``broker:order=<order_ref>`` in one of the account's regions."""
        regions = {r.lower() for r in self.regions}
        handles: list[InstanceHandle] = []
        for vm in self._client.list_vms(self.resource_group):
            tags = vm.get("tags") or {}
            if tags.get(mapping.ORDER_TAG) != order_ref or str(vm.get("location", "")).lower() not in regions:
                continue
            # The list has no instance view; read each match again for its power state.
            current = self._client.get_vm(self.resource_group, str(vm.get("name", "")))
            if current is not None:
                handles.append(mapping.instance_handle(current, resource_group=self.resource_group))
        return sorted(handles, key=lambda h: (h.region, h.instance_id))

    # ------------------------------------------------------------------------------------------ writes

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """Create one VM named after ``spec.client_token`` with ``If-None-Match: *``: a repeat returns the VM
        the first call created, unchanged. Exactly one create attempt (no SDK retry).

        With ``spec.boot``: a VM of that name is looked up first (a repeat creates nothing), then the image is
        checked to exist in the region (``ImageUnavailable`` before anything is created), then the order's network
        security group for the region is found by name or written, then the VM is created with the boot's custom
        data, keys, disk and that group on its NIC.

        Waits up to ``launch_wait_s`` for Azure's verdict. An allocation failure within the wait raises
        ``CapacityUnavailable`` after deleting the failed VM; a later one shows in ``describe``. Raises
        ``CapacityUnavailable`` (SkuNotAvailable, spot price), ``QuotaExceeded``, ``ImageUnavailable``,
        ``CredentialsRejected``, ``TransientProviderError`` (429) or ``ProviderRequestRejected``.
        """
        name = launching.vm_name(spec.client_token)
        if spec.boot is None:
            return self._create(spec, name, launching.vm_body(spec, name, self.launch_settings))
        launching.check_launchable(spec, self.launch_settings, with_boot=True)  # before anything is created
        existing = self._client.get_vm(self.resource_group, name)
        if existing is not None:
            return self._handle_of(existing, spec, existed=True)
        boot = spec.boot
        script = self.user_data(spec) or b""
        parts = launching.BootParts(
            image=self._checked_image(spec, boot),
            custom_data=base64.b64encode(script).decode(),
            admin_username=self.login_user,
            public_keys=_native_keys(boot),
            nsg_id=self._order_nsg(spec),
            disk_gb=boot.disk_gb,
        )
        return self._create(spec, name, launching.vm_body(spec, name, self.launch_settings, parts))

    def _create(self, spec: LaunchSpec, name: str, body: dict[str, Any]) -> InstanceHandle:
        result = self._client.create_vm(self.resource_group, name, body, wait_s=self.launch_wait_s)
        if result.error is not None:
            # Azure keeps a VM whose allocation failed (with its NIC and disk); nothing runs on it, so remove it.
            self._delete_quietly(name)
            raise result.error
        vm = self._client.get_vm(self.resource_group, name)
        if vm is None:
            raise TransientProviderError(
                f"virtual machine {name} was accepted but cannot be read yet",
                code="NotFound",
                provider=errors.PROVIDER,
            )
        return self._handle_of(vm, spec, existed=result.existed)

    def _handle_of(self, vm: dict[str, Any], spec: LaunchSpec, *, existed: bool) -> InstanceHandle:
        handle = mapping.instance_handle(vm, resource_group=self.resource_group)
        if existed and handle.extra.get("client_token") not in ("", spec.client_token):
            raise errors.rejected(
                f"virtual machine {handle.instance_id} exists for another client token",
                code="IdempotentParameterMismatch",
            )
        return handle

    def _checked_image(self, spec: LaunchSpec, boot: BootSpec) -> launching.ImageRef:
        """The image the launch runs (the buyer's, else the account's ``image`` option, else Ubuntu-HPC), read
        back from Azure in the launch's region. Raises ``ImageUnavailable`` when the region has no such image."""
        image = launching.parse_image(boot.image or spec.image or self.launch_settings.gpu_image)
        region = spec.region
        if image.marketplace:
            if image.version.lower() == "latest":
                found = bool(self._client.image_versions(region, image.publisher, image.offer, image.sku))
            else:
                version = self._client.image_version(region, image.publisher, image.offer, image.sku, image.version)
                found = version is not None
        else:
            managed = launching.managed_image_parts(image.resource_id)
            if managed is None or managed[0].lower() != self.subscription_id.lower():
                # A gallery image or another subscription's: this client cannot read it, and ARM answers
                # ImageNotFound / GalleryImageNotFound at create, which map to ImageUnavailable too.
                return image
            record = self._client.managed_image(managed[1], managed[2])
            # Managed images are regional: a VM elsewhere cannot start from one.
            found = record is not None and str(record.get("location", "")).lower() == region.lower()
        if not found:
            raise ImageUnavailable(
                f"image {image} is not available in {region}", code="ImageNotFound", provider=errors.PROVIDER
            )
        return image

    def _order_nsg(self, spec: LaunchSpec) -> str:
        """The order's network security group in the launch's region, found by name and written only when missing
        or different (a PUT converges, so a race between two attempts leaves one group). Returns its id."""
        name = launching.nsg_name(spec.order_ref, spec.region)
        wanted = launching.nsg_body(spec)
        current = self._client.get_nsg(self.resource_group, name)
        if current is None or not launching.nsg_matches(current, wanted):
            self._client.put_nsg(self.resource_group, name, wanted, wait_s=self.launch_wait_s)
        return launching.nsg_id(self.subscription_id, self.resource_group, name)

    def launch_problems(self, spec: LaunchSpec) -> list[LaunchProblem]:
        """The base checks (custom data size, OS disk range, rules per security group) and the image's form."""
        problems = super().launch_problems(spec)
        image = spec.boot.image if spec.boot is not None else None
        if image:
            try:
                launching.parse_image(image)
            except ProviderRequestRejected:
                problems.append(
                    LaunchProblem(
                        "launch.image",
                        "an Azure image is publisher:offer:sku:version (e.g. "
                        f"{launching.DEFAULT_GPU_IMAGE}) or an image resource id",
                    )
                )
        return problems

    def _delete_quietly(self, name: str) -> None:
        try:
            self._client.delete_vm(self.resource_group, name, wait_s=0)
        except Exception:  # noqa: S110 - cleanup of a failed VM must not hide the launch's own error
            pass

    # ---------------------------------------------------------------------------- stop, start, reboot

    stoppable: ClassVar[bool] = True
    # Deallocate "shuts down the virtual machine and releases the compute resources. You are not billed for the
    # compute resources that this virtual machine uses" (Compute REST API reference, Virtual Machines - Deallocate,
    # https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/deallocate); its managed disks remain and
    # are billed as storage ("States and billing status of Azure Virtual Machines",
    # https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing). Power Off alone ("stopped") keeps
    # the hardware allocated and billed, so the broker's stop deallocates.
    stopped_billing: ClassVar[str] = (
        "its managed disks (storage); a deallocated VM's compute is not billed (Azure Virtual Machines - "
        "Deallocate, https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/deallocate)"
    )

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """Deallocate the VM (its disk, NIC and name kept, its compute released and no longer billed), waiting up
        to ``terminate_wait_s``. A no-op (no write) when it is deallocated or deallocating already; a VM only
        powered off ("stopped", still billed) is deallocated. Raises ``ProviderRequestRejected`` for a VM Azure does
        not have (``ResourceNotFound``) or is deleting (409 ``OperationNotAllowed``)."""
        current = self.describe(region, instance_id)
        if current.extra.get("power_state") in ("deallocated", "deallocating"):
            return current
        self._client.power_vm(self.resource_group, instance_id, "deallocate", wait_s=self.terminate_wait_s)
        return self.describe(region, instance_id)

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """Start the VM again, waiting up to ``launch_wait_s`` for Azure to allocate it. A no-op (no write) when it
        is running or starting. An allocation failure (``AllocationFailed``, ``ZonalAllocationFailed``) is
        ``CapacityUnavailable``; the VM stays deallocated with its disk. Raises ``ProviderRequestRejected`` for a VM
        Azure does not have or is deleting."""
        current = self.describe(region, instance_id)
        if current.state in (InstanceState.PENDING, InstanceState.RUNNING):
            return current
        self._client.power_vm(self.resource_group, instance_id, "start", wait_s=self.launch_wait_s)
        return self.describe(region, instance_id)

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """Restart the running VM on its host (same disk, same addresses). Azure refuses a VM that is not running
        (409 ``OperationNotAllowed``, "The operation requires the VM to be running"): ``ProviderRequestRejected``."""
        self.describe(region, instance_id)  # a VM Azure does not have: ResourceNotFound, named
        self._client.power_vm(self.resource_group, instance_id, "restart", wait_s=self.launch_wait_s)
        return self.describe(region, instance_id)

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Delete the VM (its NIC, IP and OS disk go with it); waits up to ``terminate_wait_s``.

        Returns ``TERMINATED`` when the delete finished or the VM no longer exists (so a repeat is a no-op),
        ``STOPPING`` while Azure is still deleting.
        """
        vm = self._client.get_vm(self.resource_group, instance_id)
        if vm is None:
            return mapping.gone_handle(region, instance_id, self.resource_group)
        current = mapping.instance_handle(vm, resource_group=self.resource_group)
        finished = self._client.delete_vm(self.resource_group, instance_id, wait_s=self.terminate_wait_s)
        state = InstanceState.TERMINATED if finished else InstanceState.STOPPING
        return InstanceHandle(
            instance_id=current.instance_id,
            region=current.region,
            zone=current.zone,
            instance_type=current.instance_type,
            state=state,
            public_ip=current.public_ip,
            private_ip=current.private_ip,
            launched_at=current.launched_at,
            tags=current.tags,
            extra={**current.extra, "provisioning_state": "Deleted" if finished else "Deleting"},
        )

    # ------------------------------------------------------------------------------- order resources

    def list_order_resources(self) -> list[OrderResource]:
        """Every network security group in the resource group tagged with a broker order, in the account's
        regions (ARM lists a resource group's groups with their tags; the tag is matched here)."""
        regions = {r.lower() for r in self.regions}
        found: list[OrderResource] = []
        for nsg in self._client.list_nsgs(self.resource_group):
            resource = launching.order_resource(nsg)
            if resource is not None and resource.region.lower() in regions:
                found.append(resource)
        return sorted(found, key=lambda r: (r.order_ref, r.region, r.resource_id))

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete the order's network security groups in every region of the account. A group still on the NIC
        of a VM Azure is deleting is refused (``InUseNetworkSecurityGroupCannotBeDeleted``) and returned, for the
        reconciler's next sweep; one already gone is skipped."""
        remaining: list[OrderResource] = []
        for resource in self.list_order_resources():
            if resource.order_ref != order_ref:
                continue
            try:
                self._client.delete_nsg(self.resource_group, resource.extra["name"], wait_s=self.terminate_wait_s)
            except ProviderRequestRejected as exc:
                if exc.code != NSG_IN_USE:
                    raise
                remaining.append(resource)
        return remaining


def _native_keys(boot: BootSpec) -> tuple[str, ...]:
    """The buyer's keys ARM itself installs: RSA and Ed25519 (``launching.NATIVE_KEY_TYPES``). The boot script
    appends every key, these included, so no order is refused for its key type.

    ARM refuses a Linux VM with password login off and no key, so a launch whose keys are all of other types
    carries one placeholder Ed25519 key whose private half is never kept: nobody can log in with it."""
    keys = tuple(
        key.public_key
        for key in boot.ssh_keys
        if key.key_type in launching.NATIVE_KEY_TYPES
        and (key.key_type != "ssh-rsa" or key.bits >= launching.RSA_MIN_BITS)
    )
    if keys:
        return keys
    placeholder = ed25519.Ed25519PrivateKey.generate().public_key()
    return (placeholder.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode(),)
