"""The adapter contract every provider package implements.

Adapters are ORM-free: DTOs from ``providers.types`` in and out, errors from ``providers.errors``
raised. Only a provider's ``client.py`` imports its SDK.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from providers.boot import render_boot_script, user_data_problems
from providers.errors import ProviderError, ProviderRequestRejected, QuotaExceeded
from providers.launch import LaunchLimits, LaunchProblem, OrderResource, UserDataMeasure
from providers.types import Credentials, InstanceHandle, LaunchSpec, OfferQuote, QuotaUse


class ProviderAdapter(abc.ABC):
    """One provider account's view of a cloud.

    Every method makes real SDK calls with explicit timeouts. Errors raised are always subclasses of
    ``providers.errors.ProviderError``; no SDK exception escapes.
    """

    kind: str = ""
    # Each cloud states its own, citing its reference; this default is the strictest seen (EC2's 16 KB raw).
    launch_limits: ClassVar[LaunchLimits] = LaunchLimits(
        user_data_max_bytes=16 * 1024,
        user_data_measure=UserDataMeasure.RAW,
        user_data_field="user data",
        source="the broker's default limit",
    )
    login_user: ClassVar[str] = "ubuntu"  # who the buyer's keys log in as on the default image
    # The cloud can launch instances into a cluster placement group (``LaunchSpec.placement_group``): packed
    # close together in one zone's network. Where False, a launch never names a group.
    placement_groups: ClassVar[bool] = False
    # ``launch_prepare`` makes something: a caller may run it beside its own work before the launch.
    prepares_launch: ClassVar[bool] = False

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        self.credentials = credentials
        self.regions = tuple(regions)
        self.options = dict(options or {})

    @abc.abstractmethod
    def check_credentials(self) -> None:
        """A cheap real read that proves the credentials work.

        Raises ``CredentialsRejected`` when the provider refuses them, ``TransientProviderError`` when it
        could not be reached. Safe to call any number of times.
        """

    @abc.abstractmethod
    def list_offers(self) -> list[OfferQuote]:
        """Every GPU offer this account can buy in its regions: catalogue, on-demand and spot prices.

        Read-only and safe to repeat. Rows are returned as the provider states them; validation and
        quarantine happen in the broker's ingestion, not here.
        """

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """Start one instance.

        Idempotent on ``spec.client_token`` within ``spec.region``: a repeat with the same token returns the
        instance the first call created instead of a second one. Raises ``CapacityUnavailable``,
        ``QuotaExceeded``, ``CredentialsRejected``, ``TransientProviderError`` or ``ProviderRequestRejected``.
        The SDK's own retries are off for this call: the broker decides whether to retry or fail over.
        """

    def launch_prepare(self, spec: LaunchSpec) -> None:
        """Make, ahead of ``launch(spec)`` on this adapter, what that launch needs beside its instance (the
        image read, the key pair, the firewall), so that the launch then only starts the instance.

        For a caller that has other work to do first (recording the attempt): it may run this on another
        thread meanwhile, and must let it finish before calling ``launch``. Idempotent, as the launch is;
        what it made is the order's, tagged and released as the launch's would be. Its errors are the
        launch's to report: the launch makes again whatever this did not, and raises what stops it. The
        default makes nothing (``prepares_launch`` False)."""
        return None

    def quota_check(self, spec: LaunchSpec) -> None:
        """Refuse, before any launch call, a launch the account's published quotas cannot hold.

        Raises ``QuotaExceeded`` (code ``precheck``) naming the quota, its limit, its usage and what the launch
        needs. Returns when there is room, or when the provider publishes no quota this launch counts against
        (the default: the launch itself is then the only judge). Read-only; may raise
        ``TransientProviderError`` or ``CredentialsRejected``, after which a caller may still try the launch.
        """
        return None  # AWS, Alibaba and Tencent: their quotas surface as launch errors only

    @abc.abstractmethod
    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        """The instance's current state. Raises ``ProviderRequestRejected`` if the provider does not know it."""

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """The current state of each of ``instance_ids`` in ``region`` that the provider still knows, keyed by
        instance id. An id the provider does not know (it never had it, or forgot it once it ended) is absent
        from the answer: that is how "not found" is reported, never by raising. Each id is asked once.

        Read-only and safe to repeat. A cloud that reads many instances in one request answers in batches of at
        most its documented maximum per request: ``ceil(n / max)`` requests (plus pages, where it pages). This
        default asks ``describe`` once per id, so every adapter answers. The whole call fails, reporting none of
        what it read: ``TransientProviderError`` when the provider cannot be asked (the caller asks again
        later), ``CredentialsRejected``, ``MalformedProviderResponse``, or ``ProviderRequestRejected`` other
        than "not found"."""
        found: dict[str, InstanceHandle] = {}
        for instance_id in dict.fromkeys(instance_ids):
            try:
                found[instance_id] = self.describe(region, instance_id)
            except ProviderRequestRejected as exc:
                if not unknown_instance(exc):
                    raise
        return found

    @abc.abstractmethod
    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        """Ask the provider to terminate the instance. Idempotent: terminating a terminated instance is a no-op."""

    @abc.abstractmethod
    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        """Instances tagged with the broker's order reference, in every region of the account (for reconciling)."""

    # ---------------------------------------------------------------- what makes a launched machine usable

    def boot_prelude(self, spec: LaunchSpec) -> str:
        """Shell lines the boot script runs first on this cloud (e.g. installing the GPU driver where the
        cloud's images lack it). Pure; the default adds nothing."""
        return ""

    def user_data(self, spec: LaunchSpec) -> bytes | None:
        """The boot script ``spec.boot`` becomes on this cloud, raw (the adapter encodes it for the wire);
        None when the launch carries no boot. Pure and deterministic, so a resumed attempt sends the same bytes."""
        if spec.boot is None:
            return None
        return render_boot_script(spec.boot, login_user=self.login_user, prelude=self.boot_prelude(spec))

    def launch_problems(self, spec: LaunchSpec) -> list[LaunchProblem]:
        """Why this cloud would refuse the launch's boot, found without calling it: user data over the
        documented limit, a disk outside the allowed range, more ingress rules than one launch may open.
        Pure; an empty list means nothing is known to be wrong. The broker asks before every attempt, so a
        configuration over a limit is refused with a field error and never reaches the provider."""
        boot = spec.boot
        if boot is None:
            return []
        limits = self.launch_limits
        problems: list[LaunchProblem] = []
        script = self.user_data(spec)
        if script is not None:
            problems.extend(user_data_problems(script, limits))
        if boot.disk_gb is not None and not limits.disk_gb_min <= boot.disk_gb <= limits.disk_gb_max:
            problems.append(
                LaunchProblem(
                    "launch.disk_gb",
                    f"{boot.disk_gb} GB is outside {self.kind}'s {limits.disk_gb_min}-{limits.disk_gb_max} GB",
                )
            )
        rules = sum(len(rule.cidrs) for rule in boot.ingress)
        if rules > limits.ingress_rules_max:
            problems.append(
                LaunchProblem(
                    "launch.allowed_cidrs",
                    f"{rules} (port, address range) pairs; {self.kind} takes at most {limits.ingress_rules_max} "
                    "in one launch's firewall",
                )
            )
        return problems

    # ---------------------------------------------------------------- stop, start and reboot, keeping the disk

    # The cloud has a stop that keeps the instance's disk and identity, so ``start`` brings the same machine
    # back (every cloud we sell has one). Where False, ``stop``/``start`` raise ``ProviderRequestRejected``.
    stoppable: ClassVar[bool] = False
    # What the provider still bills while the instance is stopped, in words a buyer reads ("its disks"), with
    # the reference that says so; the order's billing follows it (issue 36).
    stopped_billing: ClassVar[str] = ""
    # Whether a stopped instance still costs its whole price (the machine stays held for it, as an independent
    # host's GPUs do); False where the provider bills only storage, which offers carry no price for.
    stopped_compute_billed: ClassVar[bool] = False

    def can_stop(self, pricing_model: str) -> bool:
        """Whether an instance bought at ``pricing_model`` can be stopped and started again (a cloud may refuse
        it for interruptible instances). The default: whenever the cloud is ``stoppable``."""
        return self.stoppable

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """Stop the instance, keeping its disk, so ``start`` brings it back. Idempotent: stopping a stopped
        instance is a no-op. Returns the handle, ``STOPPING`` until the provider reports it ``STOPPED``.
        Raises ``ProviderRequestRejected`` where the provider cannot stop it (or has no stop): an instance it no
        longer has, one terminated, or one its cloud will not stop (EC2 refuses a one-time spot instance,
        ``UnsupportedOperation``). Where the cloud has a stop that bills less than another (Azure's deallocate,
        Alibaba's and Tencent's stop without charges), this stop is the one ``stopped_billing`` describes."""
        raise ProviderRequestRejected(
            f"{self.kind} cannot stop an instance and keep its disk", code="Unsupported", provider=self.kind
        )

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """Start a stopped instance again. Idempotent: starting a running one is a no-op. Returns the handle,
        ``PENDING`` until it runs. Raises ``CapacityUnavailable`` when the provider has no capacity to start it
        (the disk is kept; the buyer may try later), ``ProviderRequestRejected`` where it cannot."""
        raise ProviderRequestRejected(
            f"{self.kind} cannot start a stopped instance", code="Unsupported", provider=self.kind
        )

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """Reboot the running instance in place (same disk, same address). Raises ``ProviderRequestRejected``
        where the provider cannot."""
        raise ProviderRequestRejected(f"{self.kind} cannot reboot an instance", code="Unsupported", provider=self.kind)

    def release_order_resources(self, order_ref: str) -> list[OrderResource]:
        """Delete what the broker created for the order besides its instances (key pairs, security groups,
        firewall rules, network security groups) in every region of the account.

        Idempotent: what is already gone is skipped. Returns the resources still there because the provider
        refused to delete them yet (a security group still attached to an instance that is shutting down);
        the reconciler tries again later. Raises ``TransientProviderError`` or ``CredentialsRejected`` when
        the provider cannot be asked. The default, for providers whose launches create nothing else, does
        nothing."""
        return []

    def delete_placement_group(self, region: str, name: str) -> None:
        """Delete the placement group ``name`` in ``region`` that launches made for ``LaunchSpec.placement_group``.

        Idempotent: a group that does not exist counts as deleted. Raises ``TransientProviderError`` while
        instances still hold the group (the caller tries again once they are gone), or
        ``CredentialsRejected``. The default, for clouds without placement groups, has nothing to delete."""
        return None

    def list_order_resources(self) -> list[OrderResource]:
        """Every resource besides instances tagged with a broker order in the account's regions: what the
        reconciler compares with the orders it knows. Read-only. The default lists nothing."""
        return []


def unknown_instance(error: ProviderError) -> bool:
    """Is this the provider saying it does not know the instance? Its not-found code in any cloud's casing
    (``InvalidInstanceID.NotFound``, ``ResourceNotFound``, ``notFound``, the host agent's ``not_found``)."""
    return "notfound" in error.code.replace(".", "").replace("_", "").lower()


def quota_refuse_short(provider: str, region: str, quotas: dict[str, QuotaUse], needs: dict[str, float]) -> None:
    """Raise ``QuotaExceeded`` for the first quota in ``needs`` (name -> amount the launch adds) that ``quotas``
    cannot hold; quotas the provider did not report are not judged."""
    for name, needed in needs.items():
        quota = quotas.get(name)
        if quota is None or needed <= 0:
            continue
        if quota.usage + needed > quota.limit:
            raise QuotaExceeded(
                f"quota {name} in {region}: {quota.usage:g} of {quota.limit:g} in use, the launch needs {needed:g}",
                code="precheck",
                provider=provider,
            )
