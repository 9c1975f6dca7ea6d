"""The ``community`` adapter: independent providers' machines, reached through their host agents.

ORM-free like every adapter. The account's credentials carry the machines to sell as JSON
(``values["machines"]``, built from the ``Machine`` rows by ``ProviderAccount.credentials``): each with its
agent URL, key id and secret, and its listing (GPUs, price, region, availability). One machine is one zone,
so the broker's failover and shared blocks treat a busy machine like a sold-out zone; it is sold whole
(``capacity`` 1, reserved by the broker before launch) on demand at its GPU-hour price, and as interruptible
("spot") at its minimum bid when it has one.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from providers.base import ProviderAdapter
from providers.community.client import PROVIDER, AgentClient
from providers.errors import CredentialsRejected, ProviderError, ProviderRequestRejected
from providers.launch import LaunchLimits, UserDataMeasure
from providers.options import option_number
from providers.sshkeys import KEY_TYPES
from providers.types import Credentials, InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "terminated": InstanceState.TERMINATED,
    "failed": InstanceState.FAILED,
}


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

    @property
    def instance_type(self) -> str:
        return f"community-{self.gpu_count}x{self.gpu_model}"


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
        self._timeout = option_number(self.options, "read_timeout", 10.0)

    def _client(self, machine: MachineListing) -> AgentClient:
        return AgentClient(machine.url, machine.key_id, machine.secret, timeout=self._timeout)

    def _machine(self, zone: str) -> MachineListing:
        machine = self.machines.get(zone)
        if machine is None:
            raise ProviderRequestRejected(
                f"no machine {zone!r} in this account", code="unknown_machine", provider=PROVIDER
            )
        return machine

    def check_credentials(self) -> None:
        """Each machine's agent answers a signed status request (an account with no machines passes)."""
        for machine in self.machines.values():
            self._client(machine).call("GET", "/v1/status")

    def list_offers(self) -> list[OfferQuote]:
        """A quote per machine that is inside an availability window and whose agent answers with all its GPUs
        present and free. A machine that does not answer is left out, not an error: the others still sell."""
        now = dt.datetime.now(dt.UTC)
        offers: list[OfferQuote] = []
        for machine in sorted(self.machines.values(), key=lambda m: m.name):
            if not available_now(machine.availability, now):
                continue
            try:
                status = self._client(machine).call("GET", "/v1/status")
            except ProviderError:
                continue
            found = (status.get("hardware") or {}).get("gpus") or []
            if len(found) < machine.gpu_count or int(status.get("gpus_free", 0)) < machine.gpu_count:
                continue
            offers.extend(self._quotes(machine))
        return offers

    def _quotes(self, machine: MachineListing) -> list[OfferQuote]:
        prices = {PricingModel.ON_DEMAND: machine.price_per_gpu_hour}
        if machine.min_bid_per_gpu_hour is not None:
            prices[PricingModel.SPOT] = machine.min_bid_per_gpu_hour
        return [
            OfferQuote(
                region=machine.region,
                zone=machine.name,
                instance_type=machine.instance_type,
                pricing_model=model,
                gpu_model=machine.gpu_model,
                gpu_count=machine.gpu_count,
                gpu_memory_gb=machine.gpu_memory_gb,
                vcpus=machine.vcpus,
                memory_gib=Decimal(machine.memory_gib),
                price=per_gpu * machine.gpu_count,
                currency="USD",
                capacity=1,
                extra={"machine": machine.name, "country": machine.country},
            )
            for model, per_gpu in prices.items()
        ]

    def launch(self, spec: LaunchSpec) -> InstanceHandle:
        """``POST /v1/instances`` on the machine named by ``spec.zone``, idempotent on the client token. With a
        boot, the request carries the boot script (base64), from which the host agent starts the lease."""
        machine = self._machine(spec.zone)
        body: dict[str, Any] = {
            "client_token": spec.client_token,
            "order_ref": spec.order_ref,
            "gpus": machine.gpu_count,
            "image": spec.image or self.options.get("image", ""),
            "tags": {"broker:order": spec.order_ref, **spec.tags},
        }
        script = self.user_data(spec)
        if script is not None:
            body["boot"] = base64.b64encode(script).decode()
        answer = self._client(machine).call("POST", "/v1/instances", body)
        return self._handle(machine, answer)

    def describe(self, region: str, instance_id: str) -> InstanceHandle:
        machine, agent_id = self._split(instance_id)
        return self._handle(machine, self._client(machine).call("GET", f"/v1/instances/{quote(agent_id)}"))

    def terminate(self, region: str, instance_id: str) -> InstanceHandle:
        machine, agent_id = self._split(instance_id)
        return self._handle(machine, self._client(machine).call("DELETE", f"/v1/instances/{quote(agent_id)}"))

    def find_by_order(self, order_ref: str) -> list[InstanceHandle]:
        found: list[InstanceHandle] = []
        for machine in self.machines.values():
            answer = self._client(machine).call("GET", f"/v1/instances?order_ref={quote(order_ref)}")
            found.extend(self._handle(machine, item) for item in answer.get("instances") or [])
        return sorted(found, key=lambda h: h.instance_id)

    def _split(self, instance_id: str) -> tuple[MachineListing, str]:
        machine_name, _, agent_id = instance_id.partition("/")
        return self._machine(machine_name), agent_id

    @staticmethod
    def _handle(machine: MachineListing, item: dict[str, Any]) -> InstanceHandle:
        try:
            state = _STATES.get(str(item["state"]), InstanceState.UNKNOWN)
            agent_id = str(item["id"])
        except KeyError as exc:
            raise ProviderRequestRejected(f"the agent's instance lacks {exc}", provider=PROVIDER) from None
        return InstanceHandle(
            instance_id=f"{machine.name}/{agent_id}",
            region=machine.region,
            zone=machine.name,
            instance_type=machine.instance_type,
            state=state,
            public_ip=str(item.get("ssh") or "").rsplit(":", 1)[0] or None,
            tags={str(k): str(v) for k, v in (item.get("tags") or {}).items()},
            extra={"ssh": item.get("ssh"), "client_token": item.get("client_token")},
        )
