"""Independent hosts for tests: verified machines of a community account, each with a simulated host agent
serving in this process."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal

from django.utils import timezone

from providers.community.agent import Agent, parse_simulated
from providers.community.containers import ContainerRuntime
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
    containers: ContainerRuntime | None = None,
) -> list[Agent]:
    """List, verify and start one simulated agent per name. With ``lease_threads`` off, each lease the agent
    starts is held for the test to drive (``tests.leases.boot``); on, it phones home by itself. With
    ``containers`` (``tests.containers.lease_runtime``) each lease runs in a real walled container."""
    agents = []
    for name in names:
        listed = machine_list(account=fleet, name=name, listing=dict(listing or LISTING))
        agent = Agent(broker_url="http://127.0.0.1:9", key_id=listed.machine.key_id, secret=listed.secret,
                      simulated=parse_simulated(simulate), launch_seconds=0, lease_threads=lease_threads,
                      **({"containers": containers} if containers is not None else {}))  # fmt: skip
        url = agent.serve("127.0.0.1", 0, report=False)
        Machine.objects.filter(pk=listed.machine.pk).update(
            agent_url=url,
            state=MachineState.VERIFIED,
            online=True,
            last_heartbeat_at=timezone.now(),
            registered_at=timezone.now(),
        )
        agents.append(agent)
    return agents


def stop_hosts(agents: Sequence[Agent]) -> None:
    for agent in agents:
        for instance in agent.instances.values():
            agent._end_lease(instance)
        agent.stop()


class HostilePeer:
    """A stand-in for a hostile or broken host agent (or whatever its URL leads to): a TCP server on loopback
    that reads each HTTP request and answers with what the test scripts, byte for byte.

    ``answer(method, target)`` gives (status, body, extra headers); with ``silent`` it answers nothing and
    holds the connection until ``close``; with ``trickle`` it sends its answer one byte at a time (a byte,
    then a short wait on ``release``) until released. ``requests`` lists what it received."""

    def __init__(
        self,
        answer: Callable[[str, str], tuple[int, bytes, dict[str, str]]] | None = None,
        *,
        silent: bool = False,
        trickle: bool = False,
    ):
        self.answer = answer or (lambda method, target: (404, b'{"code": "not_found", "message": "none"}', {}))
        self.silent = silent
        self.trickle = trickle
        self.requests: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.answered_fully = threading.Event()
        peer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                peer._serve(self)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _serve(self, handler: socketserver.StreamRequestHandler) -> None:
        method, target, _ = handler.rfile.readline(65537).decode("latin-1").split(" ", 2)
        length = 0
        while (line := handler.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        handler.rfile.read(length)
        self.requests.append((method, target))
        if self.silent:
            self.release.wait()
            return
        status, body, headers = self.answer(method, target)
        head = f"HTTP/1.1 {status} Scripted\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in {"Content-Type": "application/json", **headers}.items())
        raw = head.encode() + b"\r\n" + body
        try:
            if not self.trickle:
                handler.wfile.write(raw)
            else:
                for index in range(len(raw)):
                    handler.wfile.write(raw[index : index + 1])
                    handler.wfile.flush()
                    if self.release.wait(0.05):
                        return
            self.answered_fully.set()
        except OSError:
            pass  # the broker hung up

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
