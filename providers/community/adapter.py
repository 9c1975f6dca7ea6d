"""The ``community`` adapter: independent providers' machines, reached through their host agents.

ORM-free like every adapter. The account's credentials carry the machines to sell as JSON
(``values["machines"]``, built from the ``Machine`` rows by ``ProviderAccount.credentials``): each with its
agent URL, key id and secret, and its listing (GPUs, price, region, availability). One machine is one zone,
so the broker's failover and shared blocks treat a busy machine like a sold-out zone. It is sold on demand at
its GPU-hour price, and as interruptible ("spot") at its minimum bid when it has one.

A machine is sold whole (``capacity`` 1) unless its listing names fewer GPUs per lease than it has: a
divisible machine is offered once per lease size a buyer can rent (the minimum, doubling, and the whole
machine), each priced for its GPUs, with ``capacity`` the number of such leases the machine holds. The broker
holds GPU indexes before launch (``GpuHold``, marketplace/orders/reservations.py), which sets each size's
``reserved`` so that capacity minus reserved is the leases that still fit in the GPUs nobody holds; the launch
request names the indexes held.

Each MIG profile the listing offers is sold too, as a slice of one GPU (``_slice_quotes``): the launch names
the GPU index held and the profile, and the agent creates that MIG instance for the lease alone.

Only the machines on sale (verified and online) are offered and searched by order; every machine with an
agent is still reached to describe and stop the instances it runs. Every agent answer is validated here
(types, lengths, states) into the DTOs, a ``MalformedProviderResponse`` naming the field otherwise. Option
(a string, as stored on the account): ``deadline``, the seconds each agent call may take in all (default 15,
at most 60).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from providers.base import ProviderAdapter
from providers.community import protocol
from providers.community.client import (
    DEFAULT_DEADLINE_S,
    PROVIDER,
    AgentClient,
    AgentTimeout,
    AgentUnreachable,
    OutboundAgentClient,
)
from providers.community.mig import MIG_PROFILE, mig_profile
from providers.community.pricing import slice_price
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    MalformedProviderResponse,
    ProviderError,
    ProviderRequestRejected,
)
from providers.launch import LaunchLimits, UserDataMeasure
from providers.options import option_number
from providers.sshkeys import KEY_TYPES
from providers.types import (
    GPU_FRACTION,
    Credentials,
    InstanceHandle,
    InstanceState,
    LaunchSpec,
    OfferQuote,
    PricingModel,
)

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "terminated": InstanceState.TERMINATED,
    "failed": InstanceState.FAILED,
}
# What an agent's answer may hold, so nothing it sends can overflow a column or surprise a sweep: an
# instance id fits ``Instance.provider_instance_id`` (128) after the machine's name (60) and a slash, and
# the SSH host ``Instance.public_ip`` (64).
_AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOSTNAME = re.compile(r"(?=.{1,64}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*")
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 64, 128, 256
MAX_TOKEN = 64  # ``Attempt.client_token``
MAX_INSTANCES = 256
MAX_GPUS = 64
MAX_DEADLINE_S = 60.0  # whatever the account says: a provisioning worker is never held longer by one call
_PROFILE_NAME = re.compile(r"[1-7]g\.[0-9]{1,3}gb")
# How an agent that does not know the bare ``GET /v1/instances`` answers it: no such route (404), not that method
# there (405, RFC 9110), or a request it refuses for lacking ``order_ref`` (400).
_LISTING_UNKNOWN = frozenset({400, 404, 405})


@dataclass(frozen=True)
class MachineListing:
    name: str
    url: str
    key_id: str
    secret: str
    region: str
    country: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: int
    vcpus: int
    memory_gib: int
    price_per_gpu_hour: Decimal
    min_bid_per_gpu_hour: Decimal | None
    availability: list[dict[str, Any]]
    for_sale: bool = True  # verified and online; a machine out of sale is still reached for its orders
    min_gpus_per_lease: int = 0  # 0 (an older listing) or ``gpu_count``: sold whole
    mig_profiles: tuple[str, ...] = ()

    @property
    def instance_type(self) -> str:
        return lease_instance_type(self.gpu_count, self.gpu_model)

    @property
    def divisible(self) -> bool:
        return 0 < self.min_gpus_per_lease < self.gpu_count

    def lease_sizes(self) -> list[int]:
        """The GPU counts one lease may take: the minimum, doubling while below the whole, and the whole."""
        if not self.divisible:
            return [self.gpu_count]
        sizes, size = [], self.min_gpus_per_lease
        while size < self.gpu_count:
            sizes.append(size)
            size *= 2
        return [*sizes, self.gpu_count]


def lease_instance_type(gpus: int, gpu_model: str) -> str:
    """``community-2xH100-SXM5``: what a lease of ``gpus`` GPUs of a machine is sold as."""
    return f"community-{gpus}x{gpu_model}"


def slice_instance_type(gpu_model: str, profile: str) -> str:
    """``community-1xH100-SXM5-mig-3g.40gb``: what one MIG slice of a machine's GPU is sold as (at most 38
    characters for the models with MIG profiles, within ``Offer.instance_type``'s 64)."""
    return f"{lease_instance_type(1, gpu_model)}-mig-{profile}"


def parse_machines(raw: str) -> list[MachineListing]:
    try:
        items = json.loads(raw or "[]")
        return [
            MachineListing(
                name=str(m["name"]),
                url=str(m.get("url") or ""),
                key_id=str(m["key_id"]),
                secret=str(m["secret"]),
                region=str(m["region"]),
                country=str(m.get("country") or ""),
                gpu_model=str(m["gpu_model"]),
                gpu_count=int(m["gpu_count"]),
                gpu_memory_gb=int(m["gpu_memory_gb"]),
                vcpus=int(m["vcpus"]),
                memory_gib=int(m["memory_gib"]),
                price_per_gpu_hour=Decimal(str(m["price_per_gpu_hour"])),
                min_bid_per_gpu_hour=None
                if m.get("min_bid_per_gpu_hour") in (None, "")
                else Decimal(str(m["min_bid_per_gpu_hour"])),
                availability=list(m.get("availability") or []),
                for_sale=bool(m.get("for_sale", True)),
                min_gpus_per_lease=int(m.get("min_gpus_per_lease") or 0),
                mig_profiles=tuple(str(p) for p in m.get("mig_profiles") or ()),
            )
            for m in items
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise CredentialsRejected(f"the account's machine list is malformed: {exc}", provider=PROVIDER) from None


def available_now(windows: Sequence[dict[str, Any]], now: dt.datetime) -> bool:
    """Inside one of the availability windows (UTC weekdays 0=Monday, ``HH:MM`` start inclusive, end
    exclusive; an end before the start runs past midnight). No windows: always available."""
    if not windows:
        return True
    minute = now.hour * 60 + now.minute
    for window in windows:
        start_h, start_m = (int(x) for x in str(window.get("start", "00:00")).split(":"))
        end_h, end_m = (int(x) for x in str(window.get("end", "24:00")).split(":"))
        start, end = start_h * 60 + start_m, end_h * 60 + end_m
        weekdays = window.get("weekdays") or list(range(7))
        if start <= end:
            if now.weekday() in weekdays and start <= minute < end:
                return True
        elif (now.weekday() in weekdays and minute >= start) or ((now.weekday() - 1) % 7 in weekdays and minute < end):
            return True
    return False


class CommunityAdapter(ProviderAdapter):
    kind = "community"
    # The host agent takes the boot script in its launch request; its own protocol bounds the body it reads.
    launch_limits = LaunchLimits(
        user_data_max_bytes=192 * 1024,
        user_data_measure=UserDataMeasure.BASE64,
        user_data_field="the host agent's boot field",
        source="the host agent protocol, providers/community/protocol.py",
        disk_gb_min=1,
        disk_gb_max=65536,
        ingress_rules_max=64,
        native_key_types=KEY_TYPES,  # the lease agent writes every key itself
    )
    login_user = "lease"

    def __init__(self, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None):
        super().__init__(credentials, regions, options)
        self.machines = {m.name: m for m in parse_machines(credentials.values.get("machines", "[]"))}
        # One deadline per agent call, connect to last byte: a silent agent costs this, then fails over.
        self._deadline = min(option_number(self.options, "deadline", DEFAULT_DEADLINE_S), MAX_DEADLINE_S)

    def _client(self, machine: MachineListing) -> AgentClient:
        """HTTP to the agent's public URL; without one (an outbound-only agent, behind NAT) its command queue."""
        if not machine.url:
            return OutboundAgentClient(machine.key_id, machine.secret, deadline=self._deadline)
        return AgentClient(machine.url, machine.key_id, machine.secret, deadline=self._deadline)

    def _on_sale(self) -> list[MachineListing]:
        return sorted((m for m in self.machines.values() if m.for_sale), key=lambda m: m.name)

    def _machine(self, zone: str) -> MachineListing:
        machine = self.machines.get(zone)
        if machine is None:
            raise ProviderRequestRejected(
                f"no machine {zone!r} in this account", code="unknown_machine", provider=PROVIDER
            )
        return machine

    def check_credentials(self) -> None:
        """Each machine on sale answers a signed status request (an account with none passes)."""
        for machine in self._on_sale():
            _status(self._client(machine).call("GET", "/v1/status"))

    def list_offers(self) -> list[OfferQuote]:
        """Quotes for each machine that is inside an availability window and whose agent answers with all its
        GPUs present, leased or not: which GPUs are free is the broker's holds to count, and a leased machine
        stays on sale so an order that outranks its interruptible leases can outbid them. A machine that does
        not answer is left out, not an error: the others still sell."""
        now = dt.datetime.now(dt.UTC)
        offers: list[OfferQuote] = []
        for machine in self._on_sale():
            try:
                if not available_now(machine.availability, now):
                    continue
            except (ValueError, TypeError, AttributeError):
                continue  # windows the broker cannot read: this machine is not offered, the others are
            try:
                answer = self._client(machine).call("GET", "/v1/status")
                gpus_found, _ = _status(answer)
            except ProviderError:
                continue
            if gpus_found < machine.gpu_count:
                continue
            if not _walls_leases(answer):
                # Its leases would share one user, every GPU node and the host's ports: sold whole only.
                machine = dataclasses.replace(machine, min_gpus_per_lease=machine.gpu_count, mig_profiles=())
            offers.extend(self._quotes(machine))
            offers.extend(self._slice_quotes(machine))
        return offers

    def _quotes(self, machine: MachineListing) -> list[OfferQuote]:
        prices = {PricingModel.ON_DEMAND: machine.price_per_gpu_hour}
        if machine.min_bid_per_gpu_hour is not None:
            prices[PricingModel.SPOT] = machine.min_bid_per_gpu_hour
        extra: dict[str, Any] = {"machine": machine.name, "country": machine.country}
        if machine.mig_profiles:
            extra["mig_profiles"] = list(machine.mig_profiles)
        return [
            OfferQuote(
                region=machine.region,
                zone=machine.name,
                instance_type=lease_instance_type(size, machine.gpu_model),
                pricing_model=model,
                gpu_model=machine.gpu_model,
                gpu_count=size,
                gpu_memory_gb=machine.gpu_memory_gb,
                # The host's CPUs and memory are shared in proportion to the GPUs a lease takes.
                vcpus=max(1, machine.vcpus * size // machine.gpu_count),
                memory_gib=Decimal(machine.memory_gib * size // machine.gpu_count),
                price=per_gpu * size,
                currency="USD",
                capacity=machine.gpu_count // size,
                extra=dict(extra),
            )
            for size in machine.lease_sizes()
            for model, per_gpu in prices.items()
        ]

    def _slice_quotes(self, machine: MachineListing) -> list[OfferQuote]:
        """One on-demand offer per MIG profile the listing offers: one slice of one GPU.

        A profile ``Ng.Mgb`` is N of the GPU's 7 compute slices (NVIDIA's MIG User Guide, "Supported MIG
        Profiles"), so ``extra[GPU_FRACTION]`` is N/7, ``gpu_memory_gb`` is M, and the price is the listing's
        on-demand GPU-hour price times N/7, rounded half up to 4 decimals (the listing's own precision); the
        host's CPUs and memory are shared by the same share of one GPU. ``capacity`` is how many such slices
        the machine holds when nobody leases any: per GPU, 7 // N capped by NVIDIA's "Number of Instances
        Available" for the profile. Slices are not sold interruptible: a slice is never outbid
        (marketplace/orders/bids.py takes whole GPUs), and an interruptible lease nobody can take back would
        be an on-demand one at the bid's price."""
        quotes = []
        for name in machine.mig_profiles:
            profile = mig_profile(machine.gpu_model, name)
            if profile is None:
                continue  # the listing was checked when saved; a table that lost a profile sells the others
            share = profile.share
            host_share = share / machine.gpu_count
            extra = {"machine": machine.name, "country": machine.country, "mig_profiles": list(machine.mig_profiles)}
            quotes.append(
                OfferQuote(
                    region=machine.region,
                    zone=machine.name,
                    instance_type=slice_instance_type(machine.gpu_model, name),
                    pricing_model=PricingModel.ON_DEMAND,
                    gpu_model=machine.gpu_model,
                    gpu_count=1,
                    gpu_memory_gb=profile.memory_gb,
                    vcpus=max(1, int(machine.vcpus * host_share)),
                    memory_gib=Decimal(int(machine.memory_gib * host_share)),
                    price=slice_price(machine.price_per_gpu_hour, share),
                    currency="USD",
                    capacity=machine.gpu_count * profile.per_gpu,
                    extra={**extra, GPU_FRACTION: float(share), MIG_PROFILE: name},
                )
            )
        return quotes

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``POST /v1/instances`` on the machine named by ``spec.zone``, idempotent on the client token. With a
        boot, the request carries the boot script (base64), from which the host agent starts the lease. A MIG
        slice's offer (``offer_extra[MIG_PROFILE]``) launches one GPU with ``mig_profile`` named: the agent
        creates that MIG instance on the GPU held and the lease sees only it."""
        machine = self._machine(spec.zone)
        if not machine.for_sale:
            # Its offer may outlive it until the next sync: a machine out of sale takes no new launch.
            raise CapacityUnavailable(
                f"machine {machine.name} is not on sale now", code="machine_off_sale", provider=PROVIDER
            )
        profile = spec.offer_extra.get(MIG_PROFILE)
        gpus = 1 if profile else spec.gpu_count or machine.gpu_count
        if profile and profile not in machine.mig_profiles:
            raise ProviderRequestRejected(
                f"machine {machine.name} does not offer MIG profile {str(profile)[:32]!r}", code="mig_profile_unlisted",
                provider=PROVIDER,
            )  # fmt: skip
        if spec.gpu_indexes and len(spec.gpu_indexes) != gpus:
            raise ProviderRequestRejected(
                f"{len(spec.gpu_indexes)} GPU indexes held for a lease of {gpus}", code="gpu_indexes_mismatch",
                provider=PROVIDER,
            )  # fmt: skip
        body: dict[str, Any] = {
            "client_token": spec.client_token,
            "order_ref": spec.order_ref,
            "gpus": gpus,
            "image": spec.image or self.options.get("image", ""),
            "tags": {"broker:order": spec.order_ref, **spec.tags},
        }
        if spec.gpu_indexes:
            body["gpu_indexes"] = list(spec.gpu_indexes)  # the broker's holds; without them the agent picks
        if profile:
            body["mig_profile"] = profile
        script = self.user_data(spec)
        if script is not None:
            body["boot"] = base64.b64encode(script).decode()
        try:
            answer = self._client(machine).call("POST", "/v1/instances", body)
        except (AgentTimeout, AgentUnreachable) as exc:
            # A machine that does not answer is as good as a sold-out zone: fail over now rather than retry it
            # for minutes. Should it have launched after all, the reconciler finds and stops that instance.
            raise CapacityUnavailable(exc.message, code=exc.code, provider=PROVIDER) from None
        return self._handle(machine, answer)

    def describe_many(self, region: str, instance_ids: Sequence[str]) -> dict[str, InstanceHandle]:
        """The base contract, with one request per machine: independent hosts sell per GPU, so one machine often
        runs several of the leases asked about. The ids (``<machine>/<agent id>``) are grouped by machine and each
        machine's agent is asked once for every instance it holds (the bare ``GET /v1/instances`` of
        providers/community/protocol.py); the asked ids it lists are answered, the others are absent.

        An agent older than that listing (its answer lacks ``"all": true``, or it does not route the request:
        400, 404, 405) is asked for each of its ids instead, as the base class does; only that machine pays for
        it. The listing is validated whole (at most ``protocol.MAX_LISTED`` instances, each read into the DTO,
        none twice), else ``MalformedProviderResponse``.

        As the contract says, the whole call fails, reporting none: a machine that cannot be reached raises
        ``TransientProviderError`` for all the ids asked, and an id of a machine the account does not have raises
        ``ProviderRequestRejected`` (``unknown_machine``) before any agent is asked. The broker's sweep asks about
        one machine per call (marketplace/orders/running.py, ``_read_group``), so a silent machine leaves
        only its own leases unanswered."""
        asked: dict[str, dict[str, str]] = {}  # machine name -> {instance id: agent id}
        for instance_id in dict.fromkeys(instance_ids):
            machine, agent_id = self._split(instance_id)
            asked.setdefault(machine.name, {})[instance_id] = agent_id
        found: dict[str, InstanceHandle] = {}
        for name, ids in asked.items():
            listed = self._listing(self.machines[name])
            if listed is None:
                found.update(super().describe_many(region, list(ids)))
                continue
            found.update((instance_id, listed[instance_id]) for instance_id in ids if instance_id in listed)
        return found

    def _listing(self, machine: MachineListing) -> dict[str, InstanceHandle] | None:
        """Every instance the machine's agent lists, by instance id; None when the agent predates the listing."""
        try:
            answer = self._client(machine).call("GET", "/v1/instances")
        except ProviderRequestRejected as exc:
            if exc.http_status in _LISTING_UNKNOWN:
                return None
            raise
        if answer.get("all") is not True:
            return None  # an older agent's search for the empty order reference: it says nothing of the others
        items = answer.get("instances")
        if not isinstance(items, list) or len(items) > protocol.MAX_LISTED:
            raise _malformed("instances", f"expected a list of at most {protocol.MAX_LISTED}")
        listed: dict[str, InstanceHandle] = {}
        for item in items:
            handle = self._handle(machine, item)
            if handle.instance_id in listed:
                raise _malformed("instances", f"{handle.instance_id.partition('/')[2]} is listed twice")
            listed[handle.instance_id] = handle
        return listed

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        machine, agent_id = self._split(instance_id)
        return self._handle(machine, self._client(machine).call("GET", f"/v1/instances/{quote(agent_id)}"))

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        machine, agent_id = self._split(instance_id)
        return self._handle(machine, self._client(machine).call("DELETE", f"/v1/instances/{quote(agent_id)}"))

    # A stopped lease keeps its GPUs reserved (the seller can rent them to nobody else), so it costs its price.
    stoppable = True
    stopped_compute_billed = True
    stopped_billing = "its GPUs, which stay reserved to the lease while its container is stopped"

    def stop(self, region: str, instance_id: str) -> InstanceHandle:
        """``POST /v1/instances/{id}/stop``: the lease's container stopped, its disk, GPUs and ports kept."""
        return self._act(instance_id, "stop")

    def start(self, region: str, instance_id: str) -> InstanceHandle:
        """``POST /v1/instances/{id}/start``: the stopped lease's container started again."""
        return self._act(instance_id, "start")

    def reboot(self, region: str, instance_id: str) -> InstanceHandle:
        """``POST /v1/instances/{id}/reboot``: the lease's container restarted in place."""
        return self._act(instance_id, "reboot")

    def _act(self, instance_id: str, action: str) -> InstanceHandle:
        machine, agent_id = self._split(instance_id)
        return self._handle(machine, self._client(machine).call("POST", f"/v1/instances/{quote(agent_id)}/{action}"))

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        found: list[InstanceHandle] = []
        for machine in self._on_sale():
            answer = self._client(machine).call("GET", f"/v1/instances?order_ref={quote(order_ref)}")
            items = answer.get("instances")
            if items is None:
                items = []
            if not isinstance(items, list) or len(items) > MAX_INSTANCES:
                raise _malformed("instances", f"expected a list of at most {MAX_INSTANCES}")
            found.extend(self._handle(machine, item) for item in items)
        return sorted(found, key=lambda h: h.instance_id)

    def _split(self, instance_id: str) -> tuple[MachineListing, str]:
        machine_name, _, agent_id = instance_id.partition("/")
        return self._machine(machine_name), agent_id

    @staticmethod
    def _handle(machine: MachineListing, item: Any) -> InstanceHandle:
        """The agent's instance, validated field by field; ``MalformedProviderResponse`` names the first
        field out of shape."""
        if not isinstance(item, dict):
            raise _malformed("instance", "expected an object")
        agent_id = item.get("id")
        if not isinstance(agent_id, str) or not _AGENT_ID.fullmatch(agent_id):
            raise _malformed("instance.id", "expected 1 to 64 letters, digits, dots, dashes or underscores")
        state = item.get("state")
        if not isinstance(state, str) or state not in _STATES:
            raise _malformed("instance.state", f"expected one of {', '.join(_STATES)}")
        for name in ("client_token", "order_ref"):
            value = item.get(name)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_TOKEN):
                raise _malformed(f"instance.{name}", f"expected text of at most {MAX_TOKEN} characters")
        gpus = item.get("gpus")
        if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 1024):
            raise _malformed("instance.gpus", "expected a whole number from 0 to 1024")
        profile = item.get("mig_profile")
        profile = None if profile == "" else profile  # absent or empty: a lease of whole GPUs
        if profile is not None and (not isinstance(profile, str) or not _PROFILE_NAME.fullmatch(profile)):
            raise _malformed("instance.mig_profile", "expected a MIG profile name such as 3g.40gb")
        ssh = item.get("ssh")
        host = _ssh_host(ssh)
        if profile is not None:
            instance_type = slice_instance_type(machine.gpu_model, profile)
        else:
            instance_type = lease_instance_type(gpus, machine.gpu_model) if gpus else machine.instance_type
        return InstanceHandle(
            instance_id=f"{machine.name}/{agent_id}",
            region=machine.region,
            zone=machine.name,
            instance_type=instance_type,
            state=_STATES[state],
            public_ip=host,
            tags=_tags(item.get("tags")),
            extra={"ssh": ssh or None, "client_token": item.get("client_token")},
        )


def _malformed(field: str, why: str) -> MalformedProviderResponse:
    return MalformedProviderResponse(
        f"the machine's agent answered a malformed {field}: {why}", code="agent_malformed", provider=PROVIDER
    )


def _walls_leases(answer: dict[str, Any]) -> bool:
    """Does the agent put each lease in a walled container of its own (``containers.py``), or is it a
    simulated host standing in for one? An agent that does not say (one older than the walls) does not."""
    hardware = answer.get("hardware")
    isolation = hardware.get("isolation") if isinstance(hardware, dict) else None
    if not isinstance(isolation, dict):
        return False
    return isolation.get("containers") is True or isolation.get("simulated") is True


def _status(answer: dict[str, Any]) -> tuple[int, int]:
    """(GPUs present, GPUs free) from a ``/v1/status`` answer, validated."""
    hardware = answer.get("hardware")
    hardware = {} if hardware is None else hardware
    if not isinstance(hardware, dict):
        raise _malformed("hardware", "expected an object")
    gpus = hardware.get("gpus")
    gpus = [] if gpus is None else gpus
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS or not all(isinstance(g, dict) for g in gpus):
        raise _malformed("hardware.gpus", f"expected a list of at most {MAX_GPUS} objects")
    free = answer.get("gpus_free", 0)
    if not isinstance(free, int) or isinstance(free, bool) or not 0 <= free <= MAX_GPUS:
        raise _malformed("gpus_free", f"expected a whole number from 0 to {MAX_GPUS}")
    return len(gpus), free


def _tags(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_TAGS:
        raise _malformed("instance.tags", f"expected an object of at most {MAX_TAGS} entries")
    for key, value in raw.items():
        if not isinstance(value, str) or len(key) > MAX_TAG_KEY or len(value) > MAX_TAG_VALUE:
            raise _malformed(
                "instance.tags", f"expected text keys of at most {MAX_TAG_KEY} and values of {MAX_TAG_VALUE}"
            )
    return dict(raw)


def _ssh_host(raw: Any) -> str | None:
    """The host of an ``ssh`` value ``host:port`` (an IP address or a DNS name of at most 64 characters)."""
    if raw is None or raw == "":
        return None
    why = "expected host:port with an IP address or a DNS name of at most 64 characters"
    if not isinstance(raw, str) or len(raw) > 80:
        raise _malformed("instance.ssh", why)
    host, _, port = raw.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _malformed("instance.ssh", why)
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        address = ""
    if address:
        if len(address) > 64:
            raise _malformed("instance.ssh", why)
        return address
    if not _HOSTNAME.fullmatch(host):
        raise _malformed("instance.ssh", why)
    return host
