"""``AzureAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Azure Resource Manager
(Microsoft.Compute) and the Retail Prices API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from providers.azure import mapping
from providers.azure.client import (
    AUTHORITY_URL,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLLING_INTERVAL,
    DEFAULT_READ_TIMEOUT,
    PRICES_URL,
    AzureClient,
    ClientSettings,
)
from providers.base import ProviderAdapter, quota_refuse_short
from providers.errors import CredentialsRejected, TransientProviderError
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

DEFAULT_RESOURCE_GROUP = "broker"
# A launch waits this long for a quick verdict (Azure reports most allocation failures within seconds);
# a VM still creating after it is returned PENDING and its outcome read by describe().
DEFAULT_LAUNCH_WAIT_S = 15.0
DEFAULT_TERMINATE_WAIT_S = 15.0
REQUIRED_CREDENTIALS = ("tenant_id", "client_id", "client_secret", "subscription_id")


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
    ``subnet_id`` (the full resource id of the subnet the inline NIC joins) and ``ssh_public_key`` (required),
    ``admin_username``, ``image`` (``publisher:offer:sku:version`` or an image resource id; default Ubuntu 24.04),
    ``os_disk_type``, ``public_ip`` (true/false, default true); ``authority_url`` (Entra ID, default
    ``https://login.microsoftonline.com``), ``prices_url`` (default ``https://prices.azure.com``),
    ``ca_bundle`` (a PEM file to trust instead of the system store, for every endpoint);
    ``connect_timeout``/``read_timeout`` seconds (5/20), ``max_attempts`` for reads (3),
    ``polling_interval`` seconds between operation polls (3), ``launch_wait_s``/``terminate_wait_s`` how long
    a launch or terminate waits for Azure's verdict (15 each; 0 returns as soon as Azure accepted).

    Instance ids are VM names, unique in the resource group; zones are named as in ``mapping``.
    """

    kind = "azure"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: an Azure account needs at least one region (location)")
        missing = [key for key in REQUIRED_CREDENTIALS if not credentials.values.get(key)]
        if missing:
            raise CredentialsRejected(f"credentials missing: {', '.join(missing)}", provider=mapping.PROVIDER)
        options = self.options
        self.resource_group = options.get("resource_group") or DEFAULT_RESOURCE_GROUP
        self.launch_wait_s = option_number(options, "launch_wait_s", DEFAULT_LAUNCH_WAIT_S, allow_zero=True)
        self.terminate_wait_s = option_number(options, "terminate_wait_s", DEFAULT_TERMINATE_WAIT_S, allow_zero=True)
        self.launch_settings = mapping.LaunchSettings(
            subnet_id=options.get("subnet_id", ""),
            ssh_public_key=options.get("ssh_public_key", ""),
            admin_username=options.get("admin_username") or mapping.DEFAULT_ADMIN_USERNAME,
            image=options.get("image") or mapping.DEFAULT_IMAGE,
            os_disk_type=options.get("os_disk_type") or mapping.DEFAULT_OS_DISK_TYPE,
            public_ip=_flag(options, "public_ip", True),
        )
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
        specs: dict[str, mapping.SkuSpec] = {}
        for item in self._client.skus(region):
            spec = mapping.sku_spec(item, region)
            if spec is not None:
                specs[spec.name] = spec
        offers: list[OfferQuote] = []
        for name in sorted(specs):
            spec = specs[name]
            items = self._client.retail_prices(mapping.prices_filter(region, name))
            prices = mapping.sku_prices(items, region, name)
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
        spec: mapping.SkuSpec,
        pricing_model: PricingModel,
        prices: mapping.SkuPrices,
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
        quota_refuse_short(mapping.PROVIDER, spec.region, quotas, needs)

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The VM's state from its instance view. A VM whose create failed is ``FAILED`` with ``error_class``,
        ``error_code`` and ``error_message`` in ``extra``. Raises ``ProviderRequestRejected`` (ResourceNotFound)
        when Azure has no such VM.
        """
        vm = self._client.get_vm(self.resource_group, instance_id)
        if vm is None:
            raise mapping.rejected(
                f"virtual machine {instance_id} not found in resource group {self.resource_group}",
                code="ResourceNotFound",
            )
        return mapping.instance_handle(vm, resource_group=self.resource_group)

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

        Waits up to ``launch_wait_s`` for Azure's verdict. An allocation failure within the wait raises
        ``CapacityUnavailable`` after deleting the failed VM; a later one shows in ``describe``. Raises
        ``CapacityUnavailable`` (SkuNotAvailable, spot price), ``QuotaExceeded``, ``CredentialsRejected``,
        ``TransientProviderError`` (429) or ``ProviderRequestRejected``.
        """
        name = mapping.vm_name(spec.client_token)
        body = mapping.vm_body(spec, name, self.launch_settings)
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
                provider=mapping.PROVIDER,
            )
        handle = mapping.instance_handle(vm, resource_group=self.resource_group)
        if result.existed and handle.extra.get("client_token") not in ("", spec.client_token):
            raise mapping.rejected(
                f"virtual machine {name} exists for another client token", code="IdempotentParameterMismatch"
            )
        return handle

    def _delete_quietly(self, name: str) -> None:
        try:
            self._client.delete_vm(self.resource_group, name, wait_s=0)
        except Exception:  # noqa: S110 - cleanup of a failed VM must not hide the launch's own error
            pass

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
