"""Simulated independent hosts: several reference agents (providers/community/agent.py) in one process.

    python -m sandboxes.community.hosts --broker http://127.0.0.1:8000 --hosts var/community-hosts.json

The hosts file lists each machine's key id, secret and simulated GPUs (``manage.py demo seed`` writes it when
it lists the demo machines); every agent serves on a free port of 127.0.0.1, registers with the broker and
heartbeats, exactly as the agent on a provider's real machine would.

Each is a ``SimulatedHost``: the reference agent, recording the broker requests it serves (over HTTP or from its
command queue) as the cloud sandboxes record theirs, and able to answer the bare ``GET /v1/instances`` listing
as the agents already in the field that predate it do.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from providers.community.agent import Agent
from providers.community.containers import LEASE_UID_FIRST, ContainerRuntime
from providers.community.host_gpus import parse_simulated
from providers.community.instances import Answer
from providers.community.protocol import HEARTBEAT_S
from sandboxes.boot import sandbox_runtime

# How a simulated host answers the bare ``GET /v1/instances`` (protocol.py): as this release does, as the reference
# agent before it did (a search for the empty order reference, so a list of nothing the broker launched, without
# ``"all": true``), or as an agent that routes only the requests it knows (404 ``not_found``).
LISTING_ALL = "all"
LISTING_OLDER_AGENT = "older_agent"
LISTING_NO_ROUTE = "no_route"
LISTINGS = (LISTING_ALL, LISTING_OLDER_AGENT, LISTING_NO_ROUTE)


@dataclass(frozen=True)
class HostCall:
    """One broker request a simulated host served, once its signature was accepted."""

    method: str
    path: str
    query: dict[str, str]


class SimulatedHost(Agent):
    """The reference agent with a log of the requests it serves (the newest 10,000): ``calls`` counts them
    where they arrive, whichever way they came. ``listing`` is one of ``LISTINGS``."""

    def __init__(self, *, listing: str = LISTING_ALL, **options: Any):
        if listing not in LISTINGS:
            raise ValueError(f"listing: one of {', '.join(LISTINGS)}, not {listing!r}")
        super().__init__(**options)
        self.listing = listing
        self._calls: deque[HostCall] = deque(maxlen=10_000)
        self._calls_lock = threading.Lock()

    def dispatch(self, method: str, path: str, query: dict[str, str], body: bytes) -> Answer:
        with self._calls_lock:
            self._calls.append(HostCall(method, path, dict(query)))
        bare_listing = method == "GET" and path.rstrip("/") == "/v1/instances" and "order_ref" not in query
        if bare_listing and self.listing == LISTING_NO_ROUTE:
            return 404, {"code": "not_found", "message": f"no route {method} {path}"}
        if bare_listing and self.listing == LISTING_OLDER_AGENT:
            query = {**query, "order_ref": ""}  # what the earlier reference agent read a missing one as
        return super().dispatch(method, path, query, body)

    def calls(self, method: str | None = None, path: str | None = None) -> list[HostCall]:
        """Requests served since the last ``clear_calls``, oldest first, optionally of one method and path."""
        with self._calls_lock:
            return [c for c in self._calls if method in (None, c.method) and path in (None, c.path)]

    def clear_calls(self) -> None:
        with self._calls_lock:
            self._calls.clear()


def start_hosts(
    broker_url: str,
    hosts: Sequence[dict[str, Any]],
    *,
    report: bool = True,
    heartbeat_s: float = HEARTBEAT_S,
    containers: ContainerRuntime | None = None,
) -> list[Agent]:
    """Start one simulated agent per host entry ({"key_id", "secret", "simulate", "launch_seconds"?}); with
    ``containers``, each host walls its leases off in real containers (its uids a range of its own)."""
    agents: list[Agent] = []
    for index, host in enumerate(hosts):
        walls: dict[str, Any] = {}
        if containers is not None:
            walls = {"containers": containers, "uid_first": LEASE_UID_FIRST + 10_000 * index}
        agent = SimulatedHost(
            broker_url=broker_url,
            key_id=str(host["key_id"]),
            secret=str(host["secret"]),
            simulated=parse_simulated(str(host["simulate"])),
            launch_seconds=float(host.get("launch_seconds", 1.0)),
            heartbeat_s=heartbeat_s,
            **walls,
        )
        agent.serve("127.0.0.1", 0, report=report)
        agents.append(agent)
    return agents


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.community.hosts")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--hosts", required=True, help="JSON list of {key_id, secret, simulate}")
    parser.add_argument("--containers", action="store_true", help="wall each lease off in a real container")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    runtime = sandbox_runtime("sandbox-hosts") if args.containers else None
    agents = start_hosts(args.broker, json.loads(Path(args.hosts).read_text()), containers=runtime)
    for agent in agents:
        print(f"community host {agent.key_id} listening on {agent.public_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        for agent in agents:
            for instance in list(agent.instances.values()):
                if instance.holds_gpus():
                    agent.terminate(instance)  # its container, network and rule go with it
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
