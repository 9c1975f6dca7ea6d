"""Simulated independent hosts: several reference agents (providers/community/agent.py) in one process.

    python -m providers.sandbox.community --broker http://127.0.0.1:8000 --hosts var/community-hosts.json

The hosts file lists each machine's key id, secret and simulated GPUs (``manage.py demo seed`` writes it when
it lists the demo machines); every agent serves on a free port of 127.0.0.1, registers with the broker and
heartbeats, exactly as the agent on a provider's real machine would.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from providers.community.agent import Agent, parse_simulated
from providers.community.protocol import HEARTBEAT_S


def start_hosts(
    broker_url: str, hosts: Sequence[dict[str, Any]], *, report: bool = True, heartbeat_s: float = HEARTBEAT_S
) -> list[Agent]:
    """Start one simulated agent per host entry ({"key_id", "secret", "simulate", "launch_seconds"?})."""
    agents = []
    for host in hosts:
        agent = Agent(
            broker_url=broker_url,
            key_id=str(host["key_id"]),
            secret=str(host["secret"]),
            simulated=parse_simulated(str(host["simulate"])),
            launch_seconds=float(host.get("launch_seconds", 1.0)),
            heartbeat_s=heartbeat_s,
        )
        agent.serve("127.0.0.1", 0, report=report)
        agents.append(agent)
    return agents


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m providers.sandbox.community")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--hosts", required=True, help="JSON list of {key_id, secret, simulate}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    agents = start_hosts(args.broker, json.loads(Path(args.hosts).read_text()))
    for agent in agents:
        print(f"community host {agent.key_id} listening on {agent.public_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        for agent in agents:
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
