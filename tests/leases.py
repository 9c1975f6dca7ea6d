"""Booting machines in tests: the lease agent a sandbox (or a host agent) holds for an instance, driven by the
test through Django's test client, so the broker's real views and services answer inside the test's own
database transaction."""

from __future__ import annotations

from typing import Any

from django.test import Client

from marketplace.launch.config import LaunchChoice
from marketplace.launch.leases import boot_token
from marketplace.models import Lease, Order
from providers.community.lease import LeaseAgent

# What tests order with unless they say otherwise: just the machine, the organisation's keys, SSH from here.
LAUNCH = LaunchChoice(data={"allowed_cidrs": ["127.0.0.1/32"]})


class ClientTransport:
    """The lease agent's HTTP to the broker, through a Django test client."""

    def __init__(self, client: Client | None = None):
        self.client = client or Client()
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, method: str, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items() if k.lower() != "content-type"}
        response = self.client.generic(method, target, data=body, content_type="application/json", **extra)
        self.calls.append((method, target, response.status_code))
        return response.status_code, response.content


def held_agent(order: Order, source: Any) -> LeaseAgent:
    """The lease agent ``source`` holds for the order's active instance: ``source`` is a sandbox (its booter)
    or a list of host agents (``providers.community.agent.Agent``)."""
    instance = order.instances.filter(active=True).get()
    if hasattr(source, "booter"):
        return source.booter.machine(instance.provider_instance_id).agent
    _, _, agent_id = instance.provider_instance_id.partition("/")
    for host in source:
        if agent_id in host.instances and host.instances[agent_id].lease is not None:
            return host.instances[agent_id].lease
    raise LookupError(f"no host holds a lease for {instance.provider_instance_id}")


def boot_if_launched(order: Order, source: Any) -> Order:
    """Boot the order's machine if it has one waiting for its agent (a failed order has none); the order,
    refreshed."""
    order.refresh_from_db()
    if order.state == "provisioning" and order.instances.filter(active=True).exists():
        boot(order, source)
    return order


def boot(order: Order, source: Any, transport: ClientTransport | None = None) -> str:
    """Run the held agent's boot (claim, secrets, checks, ready) through the test client; its final state."""
    agent = held_agent(order, source)
    agent.transport = transport or ClientTransport()
    state = agent.boot()
    order.refresh_from_db()
    return state


def claimed_lease(order: Order, client: Client) -> tuple[Lease, str, str]:
    """Claim the order's lease as its agent would, through the test client: (lease, key id, secret). The boot
    token is spent; the lease's state is what the claim left."""
    lease = Lease.objects.get(order=order)
    answer = client.post(
        "/agent/v1/lease/claim", {"boot_token": boot_token(lease.attempt.client_token)}, content_type="application/json"
    ).json()
    return Lease.objects.get(pk=lease.pk), answer["key_id"], answer["secret"]


def running_order(acme: Any, alice: Any, offer: Any, capture: Any, source: Any, *, allow_failover: bool) -> Order:
    """An order of ``offer`` placed by alice for acme, provisioned (its tasks run as its transaction commits)
    and booted from ``source``: running, or the test fails saying why not."""
    from decimal import Decimal

    from marketplace.models import OrderState
    from marketplace.orders.services import PlaceRequest, order_place

    with capture(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH,
                offer_id=offer.pk,
                max_price_per_hour=offer.price_usd + Decimal("1"),
                allow_failover=allow_failover,
            ),
        ).order
    boot_if_launched(order, source)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order
