"""``GcpAdapter``: the broker's contract (``providers.base.ProviderAdapter``) over Compute Engine and Cloud Billing."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar
from urllib.parse import quote_plus

from providers import ratelimit
from providers.base import ProviderAdapter, quota_refuse_short, unknown_instance
from providers.endpoints import KEY_MAX_BYTES, KEY_MAX_DEPTH
from providers.errors import CredentialsRejected, ImageUnavailable, ProviderRequestRejected
from providers.gcp import catalog, errors, launching, mapping
from providers.gcp.client import (
    BACKOFF_SECONDS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_READ_TIMEOUT,
    ClientSettings,
    GcpClient,
)
from providers.launch import IngressRule, LaunchLimits, LaunchProblem, OrderResource, UserDataMeasure
from providers.options import option_number
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel
from untrusted.jsonbody import bounded_json

USAGE_TYPES = {PricingModel.ON_DEMAND: catalog.ON_DEMAND, PricingModel.SPOT: catalog.PREEMPTIBLE}
# An instance name is "[a-z]([-a-z0-9]*[a-z0-9])?", at most 63 characters (Compute Engine API reference,
# instances, https://cloud.google.com/compute/docs/reference/rest/v1/instances): nothing in it is special in a
# regular expression or in a URL, so names join into a filter as they are.
_INSTANCE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# A list's filter rides in its GET URL. Google's own API clients send a GET whose URL is longer than 2048
# characters as a POST with X-HTTP-Method-Override instead ("GET requests with a long URL (> 2048 chars)",
# google-api-client, MethodOverride, https://cloud.google.com/java/docs/reference/google-api-client/latest/
# com.google.api.client.googleapis); google-cloud-compute's REST transport does not, so a batch's filter is kept
# to this many URL-encoded characters, which leaves the rest of the URL its room below 2048.
NAMES_FILTER_MAX_CHARS = 1500
# maxResults: "Acceptable values are 0 to 500, inclusive" (AggregatedListInstancesRequest): a batch names no more
# instances than one page holds.
NAMES_PER_FILTER_MAX = 500
_FILTER_OPEN, _FILTER_CLOSE = 'name eq "(', ')"'


def names_filters(names: Sequence[str]) -> list[str]:
    """``name eq "(a|b|...)"`` filters (a regular expression that must match the whole name, "The literal value
    must match the entire field", AggregatedListInstancesRequest.filter) naming each of ``names`` once, each at
    most ``NAMES_FILTER_MAX_CHARS`` URL-encoded characters and ``NAMES_PER_FILTER_MAX`` names."""
    fixed = len(quote_plus(_FILTER_OPEN)) + len(quote_plus(_FILTER_CLOSE))
    separator = len(quote_plus("|"))
    filters: list[str] = []
    batch: list[str] = []
    size = fixed
    for name in dict.fromkeys(names):
        grown = size + len(name) + (separator if batch else 0)
        if batch and (grown > NAMES_FILTER_MAX_CHARS or len(batch) == NAMES_PER_FILTER_MAX):
            filters.append(_FILTER_OPEN + "|".join(batch) + _FILTER_CLOSE)
            batch, grown = [], fixed + len(name)
        batch.append(name)
        size = grown
    if batch:
        filters.append(_FILTER_OPEN + "|".join(batch) + _FILTER_CLOSE)
    return filters


def _service_account_info(credentials: Credentials) -> dict[str, Any]:
    raw = credentials.values.get("service_account_json", "")
    if not raw:
        raise CredentialsRejected("service_account_json is required", code="invalid_key", provider=errors.PROVIDER)
    try:
        info = bounded_json(raw, max_bytes=KEY_MAX_BYTES, max_depth=KEY_MAX_DEPTH)
    except ValueError as exc:
        raise CredentialsRejected(
            f"service_account_json is not a key's JSON: {exc}", code="invalid_key", provider=errors.PROVIDER
        ) from None
    if not isinstance(info, dict) or info.get("type", "service_account") != "service_account":
        raise CredentialsRejected(
            "service_account_json is not a service account key", code="invalid_key", provider=errors.PROVIDER
        )
    return info


class GcpAdapter(ProviderAdapter):
    """One GCP project over ``self.regions``.

    Credentials: ``values`` holds ``service_account_json`` (the key file's JSON text) and optionally
    ``project_id`` (default: the key's own project); ``endpoint_url``, when set, serves both Compute Engine and
    Cloud Billing. Options (all strings): ``connect_timeout``/``read_timeout`` seconds (defaults 5/30),
    ``max_attempts`` for reads (default 3) and ``retry_backoff`` (first pause, seconds, default 0.25, doubling),
    ``page_size`` for list calls (default 500), ``image`` (default: Ubuntu 22.04 for a bare launch, the Deep
    Learning VM family ``launching.DLVM_FAMILY`` for a booted one; a buyer's own image wins over both),
    ``boot_disk_gb`` (100), ``network``/``subnetwork``, ``n1_bundles`` (comma-separated N1 host + GPU pairings to
    quote, e.g. ``n1-standard-8+1xT4``).

    A booted launch (``spec.boot``) carries the buyer's keys as ``ssh-keys`` metadata, the boot script as
    ``startup-script`` metadata, a network tag per order that the order's VPC firewall rules target (allow rules
    for the buyer's ranges, one deny rule for everyone else), the boot disk size and a checked image.

    Instance ids are ``<zone>/<name>``: GCP addresses instances by zone and name, and the name is derived from
    the client token, so the id is known before GCP creates anything and stays valid for a failed insert.
    """

    kind = "gcp"
    launch_limits = LaunchLimits(
        user_data_max_bytes=launching.METADATA_VALUE_MAX_BYTES,
        user_data_measure=UserDataMeasure.RAW,
        user_data_field="the startup-script metadata value",
        source=launching.METADATA_SOURCE,
        disk_gb_min=launching.DISK_GB_MIN,
        disk_gb_max=launching.DISK_GB_MAX,
        native_key_types=launching.NATIVE_KEY_TYPES,
    )
    # The user the ssh-keys lines name: the guest agent creates it on first boot, with sudo.
    login_user = "gpu"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        if not self.regions:
            raise ValueError("regions: a GCP account needs at least one region")
        info = _service_account_info(credentials)
        project = credentials.values.get("project_id") or str(info.get("project_id") or "")
        if not project:
            raise CredentialsRejected("project_id is required", code="invalid_key", provider=errors.PROVIDER)
        self.project = project
        self._client = GcpClient(
            ClientSettings(
                project_id=project,
                service_account_info=info,
                endpoint_url=credentials.endpoint_url or None,
                connect_timeout=option_number(self.options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
                read_timeout=option_number(self.options, "read_timeout", DEFAULT_READ_TIMEOUT),
                max_attempts=int(option_number(self.options, "max_attempts", DEFAULT_MAX_ATTEMPTS)),
                page_size=int(option_number(self.options, "page_size", DEFAULT_PAGE_SIZE)),
                retry_backoff=option_number(self.options, "retry_backoff", BACKOFF_SECONDS),
                rate_limits=ratelimit.limits_from_options(self.options, self.kind),
            )
        )
        raw_bundles = self.options.get("n1_bundles")
        names = [b.strip() for b in raw_bundles.split(",") if b.strip()] if raw_bundles else catalog.DEFAULT_N1_BUNDLES
        self._bundles = [catalog.parse_instance_type(name) for name in names]
        self._boot_disk_gb = int(option_number(self.options, "boot_disk_gb", launching.DEFAULT_BOOT_DISK_GB))

    # ------------------------------------------------------------------------------------------- reads

    def check_credentials(self) -> None:
        """``regions.get`` of the first region: cheap, and proves both the key and access to the project.

        Raises ``CredentialsRejected`` (401/403), ``TransientProviderError`` or ``ProviderRequestRejected``.
        """
        region = self._client.regions_get(self.regions[0])
        if not region.get("name"):
            raise errors.malformed("regions.get answered without a region name")

    def list_offers(self) -> list[OfferQuote]:
        """One on-demand and, where every part has a Preemptible SKU, one spot quote per (zone, GPU machine) in the
        account's regions. Bundled-GPU types (A2, A3, G2) are quoted as listed; N1 hosts as the configured
        ``n1_bundles`` where the zone offers the accelerator with enough cards. A price is the sum of the GPU,
        vCPU and RAM SKUs of the region; a machine with any part unpriced is left out.

        Read-only; raises ``TransientProviderError``, ``CredentialsRejected`` or ``MalformedProviderResponse``.
        """
        machine_items = self._client.aggregated("machine_types")
        limits = catalog.accelerator_limits(self._client.aggregated("accelerator_types"))
        index = catalog.sku_index(self._client.skus())
        bundles_by_host: dict[str, list[catalog.InstanceTypeName]] = {}
        for bundle in self._bundles:
            bundles_by_host.setdefault(bundle.machine_type, []).append(bundle)

        offers: list[OfferQuote] = []
        for scope, item in machine_items:
            zone = catalog.zone_of_scope(scope)
            if zone is None or catalog.region_of_zone(zone) not in self.regions:
                continue
            machine = catalog.machine_type(item, zone)
            if machine.accelerators:
                accelerator = machine.accelerators[0][0]
                count = sum(n for name, n in machine.accelerators if name == accelerator)
                offers.extend(self._quotes(index, machine, machine.name, accelerator, count))
            for bundle in bundles_by_host.get(machine.name, []):
                if bundle.accelerator and limits.get((zone, bundle.accelerator), 0) >= bundle.count:
                    offers.extend(self._quotes(index, machine, str(bundle), bundle.accelerator, bundle.count))
        return sorted(offers, key=lambda q: (q.region, q.zone, q.instance_type, q.pricing_model.value))

    def _quotes(
        self, index: catalog.SkuIndex, machine: catalog.MachineType, instance_type: str, accelerator: str, count: int
    ) -> list[OfferQuote]:
        family = catalog.host_family(machine.name)
        if family is None:
            return []
        region = catalog.region_of_zone(machine.zone)
        gpu = catalog.gpu_spec(machine.name, accelerator, count)
        quotes: list[OfferQuote] = []
        for pricing_model, usage_type in USAGE_TYPES.items():
            composed = catalog.compose_price(
                index, region, usage_type, family, machine.vcpus, machine.memory_gib, accelerator, count
            )
            if composed is None:
                continue
            quotes.append(
                OfferQuote(
                    region=region,
                    zone=machine.zone,
                    instance_type=instance_type,
                    pricing_model=pricing_model,
                    gpu_model=gpu.model,
                    gpu_count=gpu.count,
                    gpu_memory_gb=gpu.memory_gb,
                    vcpus=machine.vcpus,
                    memory_gib=machine.memory_gib,
                    price=composed.price,
                    currency=composed.currency,
                    capacity=None,
                    interconnect=gpu.interconnect,
                    extra={
                        "machine_type": machine.name,
                        "accelerator_type": accelerator,
                        "host_family": family,
                        "price_exact": str(composed.exact),
                        "sku_ids": composed.sku_ids,
                    },
                )
            )
        return quotes

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's state. While it is PROVISIONING or STOPPING, or once it 404s, its newest zone operation
        decides: a failed insert is ``FAILED`` with ``extra`` ``error_class``/``error_code``/``error_message``, a
        finished delete ``TERMINATED``. Raises ``ProviderRequestRejected`` (notFound) when GCP has neither the
        instance nor an operation on it.
        """
        zone, name = mapping.split_instance_id(region, instance_id)
        item = self._client.instance_get(zone, name)
        if item is None:
            handle = mapping.handle_without_instance(zone, name, self._operations(zone, name))
            if handle is None:
                raise ProviderRequestRejected(
                    f"instance {instance_id} not found in {region}", code="notFound", provider=errors.PROVIDER
                )
            return handle
        handle = mapping.instance_handle(item)
        status = str(handle.extra.get("status", ""))
        if status not in mapping.OPERATION_STATUSES:
            return handle
        operations = self._operations(zone, name)
        if status == "PROVISIONING":
            insert = mapping.latest_operation(operations, {"insert"})
            if insert and errors.operation_error(insert) is not None:
                # The instance may linger a moment after a failed insert; the operation is the truth.
                return self._with(handle, InstanceState.FAILED, insert)
        else:
            gone = mapping.latest_operation(operations, mapping.GONE_OPERATIONS)
            if gone and gone.get("status") == "DONE" and errors.operation_error(gone) is None:
                return self._with(handle, InstanceState.TERMINATED, gone)
        return handle

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """One ``instances.aggregated_list`` per batch of names (``names_filters``), each one page: ``ceil(n /
        names per filter)`` requests, about 24 names a filter at the broker's 59-character names.

        As in ``describe``, an instance's newest operation decides while it is starting or stopping, and once
        GCP no longer lists it: such an instance is then read on its own (``describe`` for one listed
        PROVISIONING or STOPPING; its operations for one not listed, absent when GCP never heard of it). A fleet
        running steadily has none; each costs one or two more reads."""
        names: dict[str, str] = {}
        for instance_id in dict.fromkeys(instance_ids):
            _zone, name = mapping.split_instance_id(region, instance_id)
            if _INSTANCE_NAME.fullmatch(name):  # else GCP never had it: absent
                names[instance_id] = name
        found: dict[str, InstanceHandle] = {}
        settling: list[str] = []
        for names_filter in names_filters(sorted(set(names.values()))):
            for scope, item in self._client.aggregated("instances", names_filter):
                if catalog.zone_of_scope(scope) is None:
                    continue
                handle = mapping.instance_handle(item)
                if handle.instance_id not in names:  # the same name in a zone the broker did not ask about
                    continue
                if str(handle.extra.get("status", "")) in mapping.OPERATION_STATUSES:
                    settling.append(handle.instance_id)
                else:
                    found[handle.instance_id] = handle
        for instance_id in settling:
            try:
                found[instance_id] = self.describe(region, instance_id)
            except ProviderRequestRejected as exc:
                if not unknown_instance(exc):
                    raise
        for instance_id in names:
            if instance_id in found or instance_id in settling:
                continue
            zone, name = mapping.split_instance_id(region, instance_id)
            gone = mapping.handle_without_instance(zone, name, self._operations(zone, name))
            if gone is not None:
                found[instance_id] = gone
        return found

    def _operations(self, zone: str, name: str) -> list[dict[str, Any]]:
        link = mapping.instance_link(self.project, zone, name)
        return self._client.operations(zone, f'targetLink = "{link}"')

    @staticmethod
    def _with(handle: InstanceHandle, state: InstanceState, operation: dict[str, Any]) -> InstanceHandle:
        return dataclasses.replace(handle, state=state, extra={**handle.extra, **mapping.operation_extra(operation)})

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Every instance labelled ``broker-order=<order_ref>`` in the account's regions, in any state.

        One ``instances.aggregated_list`` with a label filter covers every zone. Instances whose insert failed
        leave nothing to find: GCP keeps no instance for them.
        """
        value = mapping.label_value(order_ref)
        items = self._client.aggregated("instances", f'labels.{mapping.ORDER_LABEL} = "{value}"')
        handles = [
            mapping.instance_handle(item)
            for scope, item in items
            if (zone := catalog.zone_of_scope(scope)) is not None
            and catalog.region_of_zone(zone) in self.regions
            # The filter is GCP's; checking again keeps a filter the server ignored from returning strangers.
            and (item.get("labels") or {}).get(mapping.ORDER_LABEL) == value
        ]
        return sorted(handles, key=lambda h: (h.region, h.instance_id))

    # ------------------------------------------------------------------------------------------ writes

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``instances.insert`` of one instance named after ``spec.client_token``, with ``requestId`` derived from
        it: a repeat returns the first operation (GCP deduplicates on the request id), and a repeat after GCP
        forgot the id meets ``alreadyExists`` and returns the existing instance. Labelled ``broker-order``.

        Exactly one attempt (see ``ProviderAdapter.launch``). Usually returns a PENDING handle: the insert is an
        operation, and capacity failures (ZONE_RESOURCE_POOL_EXHAUSTED) surface later through ``describe``.
        Quota and other synchronous refusals raise here. ``spec.max_price`` is not sent: Spot VMs have no bid, the
        price is the Preemptible SKU rate. A token whose insert failed keeps failing (GCP answers the request id
        with the failed operation), so a new attempt needs a new token.

        With ``spec.boot``, before the insert: the image is resolved in the zone (``ImageUnavailable`` when GCP has
        none, before anything is created), then the order's firewall rules are found or created (reused by every
        attempt and region of the order). The instance carries ``startup-script``, ``ssh-keys`` and, on a Deep
        Learning VM image, ``install-nvidia-driver`` metadata, the order's network tag and the buyer's disk size.
        With ``spec.boot`` None the launch is the bare one it always was: no image lookup, no firewall.
        """
        if spec.pricing_model is PricingModel.RESERVED:
            raise ProviderRequestRejected("reserved capacity cannot be launched on demand", provider=errors.PROVIDER)
        if not spec.zone or catalog.region_of_zone(spec.zone) != spec.region:
            raise ProviderRequestRejected(
                f"zone {spec.zone!r} is not a zone of {spec.region}", code="invalid", provider=errors.PROVIDER
            )
        instance_type = catalog.parse_instance_type(spec.instance_type)
        name = mapping.instance_name(spec.client_token)
        request_id = mapping.request_id("insert", spec.client_token)
        labels = mapping.labels(spec.order_ref, spec.tags)
        network = self.options.get("network") or launching.DEFAULT_NETWORK
        metadata = {mapping.IDEMPOTENCY_METADATA: spec.client_token, mapping.ORDER_METADATA: spec.order_ref}
        image = spec.image or self.options.get("image") or launching.DEFAULT_IMAGE
        disk_gb = self._boot_disk_gb
        tags: tuple[str, ...] = ()
        if spec.boot is not None:
            # Image first: a missing image must fail the attempt before anything exists at GCP.
            ref = self._image_ref(spec)
            resolved = self._resolve_image(ref, spec.zone)
            image = str(resolved.get("self_link") or ref)
            disk_gb = self._disk_gb(spec.boot.disk_gb, resolved, ref)
            tags = self._ensure_firewalls(spec.order_ref, spec.boot.ingress, network)
            metadata.update(self._boot_metadata(spec, ref))
        resource = launching.instance_resource(
            name=name,
            zone=spec.zone,
            instance_type=instance_type,
            spot=spec.pricing_model is PricingModel.SPOT,
            image=image,
            boot_disk_gb=disk_gb,
            network=network,
            subnetwork=self.options.get("subnetwork") or None,
            labels=labels,
            metadata=metadata,
            network_tags=tags,
        )
        try:
            operation = self._client.insert(spec.zone, resource, request_id)
        except ProviderRequestRejected as exc:
            if exc.code not in ("alreadyExists", "ALREADY_EXISTS"):
                raise
            existing = self._client.instance_get(spec.zone, name)
            if (
                existing is None
                or (existing.get("labels") or {}).get(mapping.ORDER_LABEL) != labels[mapping.ORDER_LABEL]
            ):
                raise
            return mapping.instance_handle(existing, {"request_id": request_id})
        errors.raise_operation_error(operation)
        if operation.get("status") == "DONE":
            current = self._client.instance_get(spec.zone, name)
            if current is not None:
                return mapping.instance_handle(
                    current, {"request_id": request_id, **mapping.operation_extra(operation)}
                )
        return InstanceHandle(
            instance_id=f"{spec.zone}/{name}",
            region=spec.region,
            zone=spec.zone,
            instance_type=str(instance_type),
            state=InstanceState.PENDING,
            tags=labels,
            extra={
                "status": "PROVISIONING",
                "request_id": request_id,
                "client_token": spec.client_token,
                "order_ref": spec.order_ref,
                "provisioning_model": "SPOT" if spec.pricing_model is PricingModel.SPOT else "STANDARD",
                **mapping.operation_extra(operation),
            },
        )

    def quota_check(self, spec: LaunchSpec) -> None:
        """The region's GPU and vCPU quotas from ``regions.get`` against what the launch adds (the accelerator
        type from the offer's ``accelerator_type``). The project-wide GPUS_ALL_REGIONS quota is not read: it
        needs a second call (projects.get) and the launch still reports it."""
        quotas = catalog.quota_uses(self._client.regions_get(spec.region))
        accelerator = str(spec.offer_extra.get("accelerator_type") or "")
        spot = spec.pricing_model is PricingModel.SPOT
        needs = catalog.quota_needs(quotas, accelerator, spec.gpu_count, spec.vcpus, spot)
        quota_refuse_short(errors.PROVIDER, spec.region, quotas, needs)

    # ---------------------------------------------------------------------------- stop, start, reboot

    stoppable: ClassVar[bool] = True
    # "Stopped instances do not incur VM usage charges while they are stopped. However, resources that the VM is
    # using, such as persistent disks and static IP addresses, will continue to be charged until they are deleted"
    # (Compute Engine API reference, instances.stop,
    # https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop). A stopped instance is TERMINATED.
    stopped_billing: ClassVar[str] = (
        "its persistent disks (and a static IP address, if reserved); a stopped (TERMINATED) instance's vCPUs, "
        "memory and GPUs are not billed (Compute Engine instances.stop, "
        "https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop)"
    )

    def _current(self, region: str, instance_id: str) -> tuple[str, str, InstanceHandle]:
        zone, name = mapping.split_instance_id(region, instance_id)
        item = self._client.instance_get(zone, name)
        if item is None:  # deleted (or never was): GCP answers 404 to stop, start and reset alike
            raise ProviderRequestRejected(
                f"instance {instance_id} not found in {region}", code="notFound", provider=errors.PROVIDER
            )
        return zone, name, mapping.instance_handle(item)

    def _act(self, zone: str, name: str, action: str, request_id: str) -> None:
        """Send the action and follow its operation to the end (bounded); raise the operation's error."""
        operation = self._client.instance_action(zone, name, action, request_id)
        errors.raise_operation_error(operation)
        errors.raise_operation_error(self._client.settle_zone(zone, operation))

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """``instances.stop``; a no-op (no write) when GCP reports the instance TERMINATED (its word for stopped)
        or STOPPING already. Each call is a request of its own: a fresh request id, which the client's own retries
        of it share (GCP answers a repeated id with the first operation, a failed one included). Raises
        ``ProviderRequestRejected`` (notFound) for a deleted instance."""
        zone, name, current = self._current(region, instance_id)
        if current.extra.get("status") in ("TERMINATED", "STOPPING"):
            return current
        self._act(zone, name, "stop", str(uuid.uuid4()))
        return self.describe(region, instance_id)

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """``instances.start`` and its operation followed to the end: no capacity in the zone
        (``ZONE_RESOURCE_POOL_EXHAUSTED``) is ``CapacityUnavailable`` and the instance stays TERMINATED with its
        disks. A no-op (no write) when the instance is provisioning, staging or running. A start while a stop is
        still under way is refused by GCP (``resourceNotReady``, transient). The operation is followed for about
        20 s (``settle_zone``); one that fails later leaves the instance TERMINATED again, which ``describe`` then
        reports as ``STOPPED``."""
        zone, name, current = self._current(region, instance_id)
        if current.state in (InstanceState.PENDING, InstanceState.RUNNING):
            return current
        self._act(zone, name, "start", str(uuid.uuid4()))
        return self.describe(region, instance_id)

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """``instances.reset``: a hard reset in place (same disks, same addresses), the instance RUNNING throughout.
        Only a running instance is reset: any other is ``ProviderRequestRejected`` before a call."""
        zone, name, current = self._current(region, instance_id)
        if current.extra.get("status") != "RUNNING":
            raise ProviderRequestRejected(
                f"instance {instance_id} is {current.extra.get('status') or 'not running'}, not RUNNING",
                code="notRunning",
                provider=errors.PROVIDER,
            )
        self._act(zone, name, "reset", str(uuid.uuid4()))
        return self.describe(region, instance_id)

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """``instances.delete`` (Spot and on-demand alike). Idempotent: an instance GCP no longer has (404) is
        reported terminated without a write, and a repeated delete reuses its request id. Returns STOPPING while
        the delete operation runs, TERMINATED once it is done.
        """
        zone, name = mapping.split_instance_id(region, instance_id)
        current = self._client.instance_get(zone, name)
        if current is None:
            return InstanceHandle(
                instance_id=instance_id, region=region, zone=zone, instance_type="", state=InstanceState.TERMINATED
            )
        handle = mapping.instance_handle(current)
        key = f"{self.project}/{instance_id}/{handle.extra.get('gcp_id', '')}"
        operation = self._client.delete(zone, name, mapping.request_id("delete", key))
        if operation is None:
            return dataclasses.replace(handle, state=InstanceState.TERMINATED)
        errors.raise_operation_error(operation)
        state = InstanceState.TERMINATED if operation.get("status") == "DONE" else InstanceState.STOPPING
        return self._with(handle, state, operation)

    # ------------------------------------------------------------------------- what makes a machine usable

    def launch_problems(self, spec: LaunchSpec) -> list[LaunchProblem]:
        """The shared checks (startup-script over 256 KiB, disk outside 10-65536 GB, too many ingress pairs) and
        an image reference GCP would not parse. Pure.

        The startup-script limit is the only metadata limit a boot can reach: the script carries every key twice
        (authorized_keys and the lease file), so the ``ssh-keys`` value stays smaller than the script, and the
        two together under the 512 KB metadata total."""
        problems = super().launch_problems(spec)
        if spec.boot is not None:
            try:
                self._image_ref(spec)
            except ProviderRequestRejected as exc:
                problems.append(LaunchProblem("launch.image", exc.message))
        return problems

    def _image_ref(self, spec: LaunchSpec) -> launching.ImageRef:
        """The buyer's image, else the account's ``image`` option, else the Deep Learning VM family. Pure."""
        chosen = (spec.boot.image if spec.boot is not None else None) or spec.image or self.options.get("image")
        return launching.image_ref(chosen, self.project) if chosen else launching.DEFAULT_GPU_IMAGE

    def _resolve_image(self, ref: launching.ImageRef, zone: str) -> dict[str, Any]:
        """The image the launch will boot. A family resolves to its newest image rolled out in the zone
        (``imageFamilyViews.get``), so a family missing from the region fails here rather than at insert. Raises
        ``ImageUnavailable`` naming the region when GCP has no usable image."""
        if ref.family:
            image = self._client.image_family_view(ref.project, zone, ref.family)
        else:
            image = self._client.image_get(ref.project, ref.name)
        if image is None or not launching.image_usable(image):
            region = catalog.region_of_zone(zone)
            raise ImageUnavailable(
                f"image {ref} is not available in {region} ({zone})", code="notFound", provider=errors.PROVIDER
            )
        return image

    def _disk_gb(self, requested: int | None, image: dict[str, Any], ref: launching.ImageRef) -> int:
        """The boot disk: the buyer's size, else the account's default grown to the image's own size. A size
        below the image's is refused here, as GCP would refuse the insert."""
        image_gb = int(image.get("disk_size_gb") or 0)
        if requested is None:
            return max(self._boot_disk_gb, image_gb)
        if requested < image_gb:
            raise ProviderRequestRejected(
                f"a {requested} GB boot disk is smaller than image {ref} ({image_gb} GB)",
                code="invalid",
                provider=errors.PROVIDER,
            )
        return requested

    def _boot_metadata(self, spec: LaunchSpec, ref: launching.ImageRef) -> dict[str, str]:
        boot = spec.boot
        if boot is None:
            return {}
        script = self.user_data(spec) or b""
        metadata = {launching.STARTUP_SCRIPT_KEY: script.decode()}
        if boot.ssh_keys:
            metadata[launching.SSH_KEYS_KEY] = launching.ssh_keys_value(self.login_user, boot.ssh_keys)
        if ref.is_deep_learning_vm:
            metadata[launching.DRIVER_METADATA_KEY] = launching.DRIVER_METADATA_VALUE
        return metadata

    def _ensure_firewalls(self, order_ref: str, ingress: Iterable[IngressRule], network: str) -> tuple[str, ...]:
        """The order's VPC firewall rules, created once per project (rules are global, so a failover to another
        region reuses them): found by name first, inserted with a request id derived from the name, and an
        ``alreadyExists`` from a concurrent twin taken as success. Returns the network tag to put on the instance;
        none when the buyer opened no port."""
        groups = launching.firewall_groups(ingress)
        if not groups:
            return ()
        bodies = [launching.firewall_allow_resource(order_ref, g, network) for g in groups]
        bodies.append(launching.firewall_deny_resource(order_ref, network))
        for body in bodies:
            if self._client.firewall_get(body["name"]) is not None:
                continue
            try:
                operation = self._client.firewall_insert(body, mapping.request_id("firewall", body["name"]))
            except ProviderRequestRejected as exc:
                if exc.code in ("alreadyExists", "ALREADY_EXISTS"):
                    continue
                raise
            # A rule still being created is fine: GCP applies it when done, and the machine takes longer to boot.
            errors.raise_operation_error(self._client.settle_global(operation))
        return (launching.network_tag(order_ref),)

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete the order's firewall rules (GCP lets a rule go while instances still carry its tag). Idempotent:
        a rule already gone (404) is skipped, a repeated delete reuses its request id. Returns the rules whose
        delete GCP has not finished or refused, for the reconciler's next sweep."""
        prefix = launching.firewall_prefix(order_ref)
        remaining: list[OrderResource] = []
        for item in self._client.firewalls(f'name eq "{prefix}.*"'):
            resource = launching.firewall_order_resource(item)
            if resource is None or resource.order_ref != order_ref:
                continue
            key = f"{self.project}/{resource.resource_id}/{item.get('id', '')}"
            operation = self._client.firewall_delete(resource.resource_id, mapping.request_id("firewall-delete", key))
            if operation is None:
                continue
            operation = self._client.settle_global(operation)
            if operation.get("status") != "DONE" or errors.operation_error(operation) is not None:
                remaining.append(resource)
        return remaining

    def list_order_resources(self) -> list[OrderResource]:
        """Every broker firewall rule of the project (found by name prefix, the order read from the description).
        Read-only."""
        items = self._client.firewalls(f'name eq "{launching.FIREWALL_PREFIX}.*"')
        resources = [r for item in items if (r := launching.firewall_order_resource(item)) is not None]
        return sorted(resources, key=lambda r: (r.order_ref, r.kind, r.resource_id))
