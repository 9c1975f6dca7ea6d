"""Independent hosts for tests: verified machines of a community account, each with a simulated host agent
serving in this process."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.utils import timezone

from providers.community.agent import Agent, parse_simulated
from providers.community.services import machine_list
from providers.models import Machine, MachineState, ProviderAccount

LISTING = {
    "gpu_model": "H100-SXM5",
    "gpu_count": 8,
    "gpu_memory_gb": 80,
    "vcpus": 96,
    "memory_gib": 1024,
    "disk_gb": 4000,
    "network_gbps": Decimal("100"),
    "country": "DE",
    "region": "eu-de",
    "price_per_gpu_hour": Decimal("1.9000"),
}


def start_hosts(
    fleet: ProviderAccount,
    names: Sequence[str],
    *,
    lease_threads: bool,
    simulate: str = "H100:80x8",
    listing: dict[str, object] | None = None,
) -> list[Agent]:
    """List, verify and start one simulated agent per name. With ``lease_threads`` off, each lease the agent
    starts is held for the test to drive (``tests.leases.boot``); on, it phones home by itself."""
    agents = []
    for name in names:
        listed = machine_list(account=fleet, name=name, listing=dict(listing or LISTING))
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                      simulated=parse_simulated(simulate), launch_seconds=0, lease_threads=lease_threads)  # fmt: skip
        url = agent.serve("127.0.0.1", 0, report=False)
        Machine.objects.filter(pk=listed.machine.pk).update(
            agent_url=url, state=MachineState.VERIFIED, online=True, last_heartbeat_at=timezone.now()
        )
        agents.append(agent)
    return agents


def stop_hosts(agents: Sequence[Agent]) -> None:
    for agent in agents:
        for instance in agent.instances.values():
            agent._end_lease(instance)
        agent.stop()
