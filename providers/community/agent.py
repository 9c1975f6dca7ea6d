"""The reference host agent an independent provider runs on each machine (protocol: ``protocol.py``).

    python -m providers.community.agent --broker https://broker.example --key-id mk_... --secret-file S \\
        --listen 0.0.0.0:7070 --public-url https://host.example:7070 [--simulate H100:80x8]

Without ``--public-url`` it runs outbound-only (a host behind NAT): it opens no port, registers with an
empty URL and polls the broker's command queue every second for the same signed requests, answering each
through the same ``dispatch`` the HTTP server uses (``protocol.py``: commands carry the broker's signature
and an expiry the agent checks).

It registers with the broker, reports a self-test and sends a heartbeat with each GPU's utilization,
temperature and power every ``protocol.HEARTBEAT_S`` seconds, and answers the broker's signed launch,
describe, list and terminate requests. GPUs are read with ``nvidia-smi``; ``--simulate MODEL:GB xN`` stands in
for them (the sandbox runs several simulated hosts this way).

A launch reserves GPUs by index (the ones the broker names in ``gpu_indexes``, else the lowest free ones;
two live leases never share one) and reports the instance running after ``--launch-seconds``. When it carries
a boot script (the same user data a cloud machine gets), the agent starts a lease for it: the lease agent of
``lease.py`` phones home with the one-time boot token, fetches the buyer's secrets, and runs the workload
through ``executor.LeaseExecutor`` on the lease's own GPUs, ports, working directory (with a disk quota the
agent enforces) and unprivileged user. ``--simulate`` swaps only the GPUs (and, having no Docker, runs the
process runner). A terminate kills the lease's processes, wipes its directory and reports what it cleaned.

Standard library plus werkzeug, so it installs anywhere the broker's source does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from providers.boot import BootScriptUnreadable, lease_file_from_script
from providers.community import protocol
from providers.community.containers import LEASE_IMAGE, LEASE_UID_FIRST, ContainerRuntime, lease_uid, runtime_probe
from providers.community.executor import (
    FakeDevices,
    LeaseExecutor,
    LeasePlan,
    MigDevice,
    NvidiaDevices,
    user_plan,
)
from providers.community.lease import (
    ExecutorError,
    LeaseAgent,
    Transport,
    http_transport,
    telemetry_sample,
    write_private,
)
from providers.community.mig import MEMORY_SLICES, MigProfile, mig_place, mig_table_for_memory
from untrusted import jsonbody

log = logging.getLogger("providers.community.agent")
MAX_LAUNCH_BODY = 512 * 1024  # a boot script of the adapter's limit, base64-encoded, and the rest of the request
DATA_DIR = Path("/var/lib/gpu-broker-agent")
PORTS_FIRST = 40000  # each lease gets PORTS_PER_LEASE ports from here on a real host
PORTS_PER_LEASE = 16
DISK_QUOTA_GB = 100
Answer = tuple[int, dict[str, Any]]  # an HTTP status and the JSON object answered with it
_COMMAND_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Gpu:
    model: str
    memory_gb: int


@dataclass
class Instance:
    id: str
    client_token: str
    order_ref: str
    gpus: int
    tags: dict[str, str]
    gpu_indexes: tuple[int, ...] = ()
    state: str = "pending"
    started: float = field(default_factory=time.monotonic)
    lease: LeaseAgent | None = None
    lease_stop: threading.Event = field(default_factory=threading.Event)
    ending: bool = False  # a terminate is cleaning up; the GPUs stay held until it is done
    ended: float | None = None  # time.monotonic() when it was terminated
    cleanup: dict[str, Any] | None = None
    # A MIG slice: its profile, the memory slices of its GPU it occupies, and the MIG device made for it.
    mig_profile: str = ""
    mig_slots: tuple[int, ...] = ()
    mig_device: MigDevice | None = None
    uid_slot: int = -1  # a walled lease's slot in the host's lease uids (containers.lease_uid)
    lease_file: dict[str, Any] | None = None  # what its boot script carried, kept to resume it after a restart

    @property
    def executor(self) -> LeaseExecutor | None:
        executor = self.lease.executor if self.lease is not None else None
        return executor if isinstance(executor, LeaseExecutor) else None

    def holds_gpus(self) -> bool:
        return self.state in ("pending", "running")

    def json(self, ssh: str) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "client_token": self.client_token,
            "order_ref": self.order_ref,
            "gpus": self.gpus,
            "gpu_indexes": list(self.gpu_indexes),
            "tags": self.tags,
            "ssh": ssh,
        }
        if self.mig_profile:
            answer["mig_profile"] = self.mig_profile
        if self.executor is not None and self.executor.problem:
            answer["problem"] = self.executor.problem
        if self.cleanup is not None:
            answer["cleanup"] = self.cleanup
        return answer


@dataclass(frozen=True)
class _Slice:
    """Where a MIG slice lease goes: its GPU, its profile, its first memory slice."""

    index: int
    profile: MigProfile
    start: int


class PortPool:
    """The host ports leases get, ``per_lease`` each, never two leases the same. A real host hands out blocks
    from ``first``; a simulated one (many in one process, in tests) asks the OS for free ports instead."""

    def __init__(self, first: int | None, per_lease: int = PORTS_PER_LEASE, last: int = 65000):
        self.first = first
        self.per_lease = per_lease
        self.last = last
        self.held: dict[str, tuple[int, ...]] = {}

    def take(self, lease_id: str) -> tuple[int, ...]:
        if self.first is None:
            ports = free_ports(self.per_lease)
        else:
            taken = {port for block in self.held.values() for port in block}
            start = self.first
            while any(port in taken for port in range(start, start + self.per_lease)):
                start += self.per_lease
            if start + self.per_lease > self.last:
                raise RuntimeError("no free ports")
            ports = tuple(range(start, start + self.per_lease))
        self.held[lease_id] = ports
        return ports

    def release(self, lease_id: str) -> tuple[int, ...]:
        return self.held.pop(lease_id, ())


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` ports free on loopback now (the OS's choice): for simulated hosts and machines, many to a
    process."""
    ports = []
    for _ in range(count):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
    return tuple(ports)


# Board power ratings (W) a simulated GPU draws within, from NVIDIA's datasheets (SXM boards where both exist):
# a simulated host's telemetry must pass the broker's plausibility check, which compares it with these ratings.
SIMULATED_RATING_W = {"B200": 1000, "H200": 700, "H100": 700, "A100": 400, "L40S": 350, "L40": 300, "A10G": 300,
                      "A10": 150, "L4": 72, "T4": 70, "V100": 300, "4090": 450, "3090": 350, "A6000": 300}  # fmt: skip


def simulated_rating_w(model: str) -> int:
    """The rating of the first known name ``model`` contains, longest names first ("L40S" before "L40"); 300 W
    for a model not in the table."""
    for name in sorted(SIMULATED_RATING_W, key=len, reverse=True):
        if name in model.upper():
            return SIMULATED_RATING_W[name]
    return 300


def parse_simulated(spec: str) -> list[Gpu]:
    """``H100:80x8`` -> eight 80 GB H100s."""
    model_memory, _, count = spec.partition("x")
    model, _, memory = model_memory.partition(":")
    if not model or not memory.isdigit() or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--simulate wants MODEL:GBxCOUNT, e.g. H100:80x8, not {spec!r}")
    return [Gpu(model, int(memory))] * int(count)


def read_nvidia_smi() -> tuple[list[Gpu], list[dict[str, Any]]]:
    """(GPUs, telemetry) from ``nvidia-smi``; raises ``RuntimeError`` when it is missing or fails."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise RuntimeError("nvidia-smi not found: no NVIDIA driver on this machine (use --simulate to test)")
    query = "name,memory.total,utilization.gpu,temperature.gpu,power.draw,memory.used"
    out = subprocess.run(  # noqa: S603 - a fixed binary and arguments
        [binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
    )
    if out.returncode != 0:
        # On one line: the broker refuses a self-test whose text holds control characters such as newlines.
        raise RuntimeError(f"nvidia-smi failed: {' '.join(out.stderr.split())[:200]}")
    gpus, telemetry = [], []
    for index, line in enumerate(out.stdout.strip().splitlines()):
        name, total, util, temp, power, used = (part.strip() for part in line.split(","))
        gpus.append(Gpu(name.removeprefix("NVIDIA "), round(float(total) / 1024)))
        telemetry.append(telemetry_sample(index, float(util), float(temp), float(power), float(used) / 1024))
    return gpus, telemetry


# Ended instances an agent remembers (a repeated terminate or launch answers from them), at most this many and
# this long; well over what a listing holds (protocol.MAX_LISTED) and any broker retry's horizon.
KEEP_ENDED = 1024
KEEP_ENDED_S = 7 * 86400.0


class Agent:
    """One machine's agent: the broker-facing HTTP app (or, outbound-only, the command poll) and the
    register/heartbeat loop."""

    def __init__(
        self,
        *,
        broker_url: str,
        key_id: str,
        secret: str,
        public_url: str = "",
        ssh_address: str = "",
        simulated: list[Gpu] | None = None,
        launch_seconds: float = 0.5,
        heartbeat_s: float = protocol.HEARTBEAT_S,
        lease_threads: bool = True,
        data_dir: Path | None = None,
        disk_quota_bytes: int = DISK_QUOTA_GB * 10**9,
        grace_s: float = 10.0,
        disk_poll_s: float | None = 5.0,
        mig: dict[int, list[str]] | None = None,
        mig_profiles: Sequence[str] | None = None,
        poll_s: float = 1.0,
        broker_transport: Transport | None = None,
        command_threads: bool = True,
        containers: ContainerRuntime | str = "containers not asked for",
        uid_first: int = LEASE_UID_FIRST,
    ):
        self.broker_url = broker_url.rstrip("/")
        self.key_id = key_id
        self.secret = secret
        self.public_url = public_url
        # Where buyers reach this host's SSH and lease ports; the public URL's host unless given (behind NAT:
        # the router's public address, with the ports forwarded).
        self.ssh_address = ssh_address
        self.simulated = simulated
        self.launch_seconds = launch_seconds
        self.heartbeat_s = heartbeat_s
        self.instances: dict[str, Instance] = {}
        self._seen_nonces: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: Any = None
        self.rejected: list[str] = []  # refusal codes, for the operator (and tests)
        # Leases run in threads; with ``lease_threads`` off they are only built, and a test drives them.
        self.lease_threads = lease_threads
        self.lease_transport: Transport | None = None  # None: HTTP to the broker URL in the lease file
        # Outbound-only: how often the broker's command queue is polled, over what (None: HTTP to broker_url),
        # and whether each command runs in a thread of its own (off: in the poll, for a test to drive).
        self.poll_s = poll_s
        self.broker_transport = broker_transport
        self.command_threads = command_threads
        # A simulated host (often several in one test process) gets a directory of its own, removed on stop.
        self._own_data_dir = data_dir is None and simulated is not None
        if data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix="gpu-broker-agent-")) if simulated is not None else DATA_DIR
        self.data_dir = data_dir
        self.disk_quota_bytes = disk_quota_bytes
        self.grace_s = grace_s
        self.disk_poll_s = disk_poll_s
        self.ports = PortPool(None if simulated is not None else PORTS_FIRST)
        # The MIG profiles this host sells as slices (its listing's); None: every one its GPUs offer.
        self.mig_profiles = None if mig_profiles is None else tuple(mig_profiles)
        # The walls every lease gets, or why this host cannot build them (it then sells whole machines only).
        self.containers = containers if isinstance(containers, ContainerRuntime) else None
        self.isolation_reason = "" if self.containers is not None else str(containers)
        self.uid_first = uid_first  # where this host's lease uids start (several simulated hosts share a machine)
        self.devices: NvidiaDevices | FakeDevices = (
            FakeDevices([(g.model, g.memory_gb) for g in simulated], mig or {})
            if simulated is not None
            else NvidiaDevices()
        )

    # ------------------------------------------------------------------------------------------ hardware

    def gpus(self) -> list[Gpu]:
        return list(self.simulated) if self.simulated is not None else read_nvidia_smi()[0]

    def telemetry(self) -> list[dict[str, Any]]:
        if self.simulated is None:
            return read_nvidia_smi()[1]
        held = self._held_gpus()
        samples = []
        for index, gpu in enumerate(self.simulated):
            working = index in held
            util = random.uniform(85, 99) if working else random.uniform(0, 3)  # noqa: S311 - simulation
            # Idle near a tenth of the rating, busy up to nine tenths.
            power = simulated_rating_w(gpu.model) * (0.1 + 0.8 * util / 100)
            samples.append(
                telemetry_sample(index, util, 38 + util * 0.4, power, gpu.memory_gb * (0.7 if working else 0.01))
            )
        return samples

    def self_test(self) -> dict[str, Any]:
        """What the broker compares with the listing: GPUs found, driver, and a host-to-device copy rate."""
        try:
            gpus = self.gpus()
        except RuntimeError as exc:
            return {"ok": False, "error": str(exc)}
        return {
            "ok": bool(gpus),
            "gpus": [{"model": g.model, "memory_gb": g.memory_gb} for g in gpus],
            "driver": "simulated" if self.simulated is not None else "nvidia",
            "h2d_bandwidth_gbs": 24.5 if self.simulated is not None else None,
            "isolation": self.isolation(),
        }

    def isolation(self) -> dict[str, Any]:
        """Whether each lease runs in a walled container of its own (``containers.py``): what a per-GPU sale
        needs. A simulated host without Docker says so: it stands in for one in the sandbox."""
        return {
            "containers": self.containers is not None,
            "simulated": self.simulated is not None,
            "reason": self.isolation_reason[:300],
        }

    def _busy_gpus(self) -> int:
        return len(self._held_gpus())

    def _held_gpus(self) -> dict[int, str]:
        """GPU index -> the live instance holding it."""
        with self._lock:
            return self._held_gpus_locked()

    def _held_gpus_locked(self) -> dict[int, str]:
        return {index: i.id for i in self.instances.values() if i.holds_gpus() for index in i.gpu_indexes}

    # ----------------------------------------------------------------------------------- broker calls

    def _call_broker(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One signed POST to the broker; its JSON object. Raises ``urllib.error.HTTPError`` for a refusal
        (whatever the transport), ``URLError``/``OSError`` when unreachable, ``ValueError`` for a bad answer."""
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **protocol.sign(self.key_id, self.secret, "POST", path, body)}
        send = self.broker_transport or http_transport(self.broker_url, timeout=10)
        status, raw = send("POST", path, body, headers)
        if status >= 400:
            raise urllib.error.HTTPError(
                self.broker_url + path, status, f"the broker answered {status}", Message(), None
            )
        answer = jsonbody.bounded_json(raw)
        return dict(answer) if isinstance(answer, dict) else {}

    def register(self) -> dict[str, Any]:
        gpus = self.gpus()
        hardware = {"gpus": [{"model": g.model, "memory_gb": g.memory_gb} for g in gpus]}
        return self._call_broker(
            "/agent/v1/register", {"agent_url": self.public_url, "hardware": hardware, "self_test": self.self_test()}
        )

    def heartbeat(self) -> dict[str, Any]:
        return self._call_broker("/agent/v1/heartbeat", {"gpus": self.telemetry(), "instances": self._live_count()})

    def _live_count(self) -> int:
        with self._lock:
            return sum(1 for i in self.instances.values() if i.state in ("pending", "running"))

    def _loop(self) -> None:
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    self.register()
                    registered = True
                self.heartbeat()
            except urllib.error.HTTPError as exc:
                log.warning("the broker refused: HTTP %s", exc.code)
                # Too many heartbeats (429) is no reason to register again; any other refusal may be.
                registered = registered and exc.code == 429
            except (urllib.error.URLError, OSError, ValueError) as exc:
                log.warning("broker unreachable or refused: %s", exc)
                registered = False
            self._stop.wait(self.heartbeat_s)

    # ------------------------------------------------------------------------ outbound-only: polling

    def poll_once(self) -> int:
        """Fetch the broker's pending commands and run each (in a thread of its own, as the HTTP server
        would), posting its answer. Returns how many came; raises as ``_call_broker`` does."""
        answer = self._call_broker("/agent/v1/commands", {})
        commands = answer.get("commands")
        commands = [c for c in commands if isinstance(c, dict)] if isinstance(commands, list) else []
        for command in commands:
            if self.command_threads:
                threading.Thread(target=self._answer_command, args=(command,), daemon=True).start()
            else:
                self._answer_command(command)
        return len(commands)

    def _answer_command(self, command: dict[str, Any]) -> None:
        command_id = str(command.get("id", ""))
        if not _COMMAND_ID.fullmatch(command_id):
            log.warning("ignored a command with a malformed id")
            return
        status, data = self.run_command(command)
        try:
            self._call_broker(f"/agent/v1/commands/{command_id}/answer", {"status": status, "answer": data})
        except urllib.error.HTTPError as exc:
            # 409: the broker gave up on it meanwhile; nothing to undo (a launch is found by the reconciler).
            log.warning("the broker refused the answer to %s: HTTP %s", command_id, exc.code)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("could not answer command %s: %s", command_id, exc)

    def run_command(self, command: dict[str, Any]) -> Answer:
        """(status, JSON object) for one queued command: checked as an inbound request is (the broker's
        signature, our key, a fresh nonce) and refused past its expiry, then served by ``dispatch``."""
        method, target = str(command.get("method", "")), str(command.get("target", ""))
        path = target.split("?", 1)[0]
        body = str(command.get("body", "")).encode()
        headers = command.get("headers")
        try:
            signed = protocol.check_command(
                headers if isinstance(headers, dict) else {}, method, target, body,
                command_id=str(command.get("id", "")), secret=self.secret,
            )  # fmt: skip
            self._accept(signed)
        except protocol.Rejected as exc:
            return self._refusal(method, path, exc)
        # Blank values kept, as the HTTP server keeps them: ``?order_ref=`` is a search, not the bare listing.
        query = {key: values[0] for key, values in parse_qs(target.partition("?")[2], keep_blank_values=True).items()}
        return self.dispatch(method, path, query, body)

    def _poll_loop(self) -> None:
        """Poll every ``poll_s`` until stopped; a refusal or an unreachable broker waits longer."""
        while not self._stop.is_set():
            pause = self.poll_s
            try:
                self.poll_once()
            except urllib.error.HTTPError as exc:
                log.warning("the broker refused the poll: HTTP %s", exc.code)
                pause = max(pause, 5.0)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                log.warning("broker unreachable for the poll: %s", exc)
                pause = max(pause, 5.0)
            self._stop.wait(pause)

    def start_outbound(self, *, report: bool = True) -> threading.Thread:
        """Run without a public URL: poll the broker for its commands in a daemon thread (returned) and,
        unless ``report`` is off, register (with an empty URL) and heartbeat."""
        self.public_url = ""
        poller = threading.Thread(target=self._poll_loop, name="agent-poll", daemon=True)
        poller.start()
        if report:
            threading.Thread(target=self._loop, daemon=True).start()
        return poller

    # ---------------------------------------------------------------------------------- HTTP server

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        return self._handle(request)(environ, start_response)

    def _handle(self, request: Request) -> Response:
        body = request.get_data()
        target = request.full_path.rstrip("?") if request.query_string else request.path
        try:
            signed = protocol.check(request.headers, None, request.method, target, body, secret=self.secret)
            self._accept(signed)
        except protocol.Rejected as exc:
            status, refusal = self._refusal(request.method, request.path, exc)
            return _json(refusal, status)
        status, data = self.dispatch(request.method, request.path, request.args.to_dict(), body)
        return _json(data, status)

    def _accept(self, signed: protocol.SignedRequest) -> None:
        """The checks a signed request or command passes after its signature: our key, a nonce not seen."""
        if signed.key_id != self.key_id:
            raise protocol.Rejected("unknown_key", "signed with another machine's key")
        self._remember_nonce(signed.nonce)

    def _refusal(self, method: str, path: str, exc: protocol.Rejected) -> Answer:
        log.warning("refused %s %s: %s (%s)", method, path[:200], exc.code, exc.message)
        self.rejected.append(exc.code)
        return 401, {"code": exc.code, "message": exc.message}

    def dispatch(self, method: str, path: str, query: dict[str, str], body: bytes) -> Answer:
        """(HTTP status, JSON object) for one authenticated broker request, however it came: over HTTP
        (``_handle``) or from the broker's command queue (``run_command``)."""
        parts = [p for p in path.split("/") if p]
        if parts == ["v1", "status"] and method == "GET":
            return _answer({"hardware": self.self_test(), "gpus_free": self._free(), "instances": self._live_count()})
        if parts == ["v1", "instances"] and method == "POST":
            try:
                launch = jsonbody.bounded_json(body, max_bytes=MAX_LAUNCH_BODY)
            except ValueError as exc:
                return _answer({"code": "invalid", "message": str(exc)}, 400)
            if not isinstance(launch, dict):
                return _answer({"code": "invalid", "message": "the launch request is a JSON object"}, 400)
            return self._launch(launch)
        if parts == ["v1", "instances"] and method == "GET":
            if "order_ref" not in query:
                return _answer(self._listing())
            order_ref = query["order_ref"]
            with self._lock:
                found = [self._refresh(i) for i in self.instances.values() if i.order_ref == order_ref]
            return _answer({"instances": [i.json(self._ssh()) for i in found]})
        if len(parts) == 3 and parts[:2] == ["v1", "instances"]:
            with self._lock:
                instance = self.instances.get(parts[2])
                if instance is None:
                    return _answer({"code": "not_found", "message": f"no instance {parts[2]}"}, 404)
                # Claimed under the lock, cleaned outside it: a grace period must not hold up every request.
                ending = method == "DELETE" and instance.holds_gpus() and not instance.ending
                instance.ending = instance.ending or ending
            if ending:
                self.terminate(instance)
            with self._lock:
                return _answer(self._refresh(instance).json(self._ssh()))
        return _answer({"code": "not_found", "message": f"no route {method} {path[:200]}"}, 404)

    def _listing(self) -> dict[str, Any]:
        """The bare ``GET /v1/instances``: every live instance, then the ended ones, most recently launched first,
        while the list stays within ``protocol.MAX_LISTED`` items and ``protocol.MAX_LISTING_BYTES`` (an agent
        remembers up to ``KEEP_ENDED`` ended leases). Live ones are never left out: a machine with more than the
        broker reads is refused as malformed, and the broker then asks for each instance by id."""
        ssh = self._ssh()
        with self._lock:
            held = [self._refresh(instance) for instance in self.instances.values()]
            listed = [instance.json(ssh) for instance in held if instance.holds_gpus()]
            ended = [instance.json(ssh) for instance in reversed(held) if not instance.holds_gpus()]
        size = len(json.dumps({"instances": listed, "all": True}))
        for item in ended:
            size += len(json.dumps(item)) + 2  # and the separator before it
            if len(listed) >= protocol.MAX_LISTED or size > protocol.MAX_LISTING_BYTES:
                break
            listed.append(item)
        return {"instances": listed, "all": True}

    def _remember_nonce(self, nonce: str) -> None:
        now = time.monotonic()
        with self._lock:
            for old, seen in list(self._seen_nonces.items()):
                if now - seen > 2 * protocol.MAX_SKEW_S:
                    del self._seen_nonces[old]
            if nonce in self._seen_nonces:
                raise protocol.Rejected("replayed", "this nonce was already used")
            self._seen_nonces[nonce] = now

    def _free(self) -> int:
        return len(self.gpus()) - self._busy_gpus()

    def _ssh(self) -> str:
        host = self.ssh_address or self.public_url.split("://", 1)[-1].rsplit(":", 1)[0] or "127.0.0.1"
        return f"{host}:22"

    def _refresh(self, instance: Instance) -> Instance:
        if instance.state == "pending" and time.monotonic() - instance.started >= self.launch_seconds:
            instance.state = "running"
        return instance

    def _launch(self, request: dict[str, Any]) -> Answer:
        token = str(request.get("client_token") or "")
        gpus = request.get("gpus")
        if not token or not isinstance(gpus, int) or gpus < 1:
            return _answer({"code": "invalid", "message": "client_token and a positive gpus count are required"}, 400)
        with self._lock:
            for instance in self.instances.values():
                if instance.client_token == token:
                    return _answer(self._refresh(instance).json(self._ssh()))
            total = len(self.simulated) if self.simulated is not None else len(read_nvidia_smi()[0])
            held = self._held_gpus_locked()
            asked = request.get("gpu_indexes")
            sliced: _Slice | None = None
            indexes: tuple[int, ...]
            partial = request.get("mig_profile") is not None or gpus < total
            if partial and self.containers is None and self.simulated is None:
                why = f"this host sells whole machines only: it cannot wall leases off ({self.isolation_reason})"
                return _answer({"code": "whole_only", "message": why[:300]}, 409)
            if request.get("mig_profile") is not None:
                placed = self._slice_place(request["mig_profile"], gpus, asked)
                if not isinstance(placed, _Slice):
                    return placed
                sliced, indexes = placed, (placed.index,)
            elif asked is not None:
                refusal = _check_indexes(asked, gpus, total, held)
                if refusal is not None:
                    return refusal
                indexes = tuple(sorted(asked))
            else:
                free = [index for index in range(total) if index not in held]
                if len(free) < gpus:
                    return _answer({"code": "no_capacity", "message": f"{len(free)} of {total} GPUs free"}, 409)
                indexes = tuple(free[:gpus])
            lease = None
            if request.get("boot"):
                try:
                    lease = lease_file_from_script(str(request["boot"]).encode())
                except BootScriptUnreadable as exc:
                    return _answer({"code": "invalid", "message": f"boot: {exc}"}, 400)
            instance = Instance(
                id="i-" + uuid.uuid4().hex[:12],
                client_token=token,
                order_ref=str(request.get("order_ref") or ""),
                gpus=gpus,
                gpu_indexes=indexes,
                tags={str(k): str(v) for k, v in (request.get("tags") or {}).items()},
            )
            if sliced is not None:
                # Made last, once nothing else can refuse the launch, and under the lock, so two launches never
                # create on one GPU at once (the new device is told apart by what was there before).
                try:
                    instance.mig_device = self.devices.mig_create(sliced.index, sliced.profile.name)
                except ExecutorError as exc:
                    return _answer({"code": "gpus_busy", "message": f"GPU {sliced.index}: {exc}"[:300]}, 409)
                instance.mig_profile = sliced.profile.name
                instance.mig_slots = tuple(sliced.profile.slots(sliced.start))
            if lease is not None:
                try:
                    instance.lease = self._lease(instance, lease)
                except BaseException:
                    if instance.mig_device is not None:
                        self._mig_destroy(instance.mig_device)  # nobody will ever terminate this instance
                    raise
            self.instances[instance.id] = instance
            if lease is not None:
                instance.lease_file = lease
                self._keep(instance)
        if instance.lease is not None and self.lease_threads:
            threading.Thread(
                target=instance.lease.run, args=(instance.lease_stop,), name=f"lease:{instance.id}", daemon=True
            ).start()
        return _answer(instance.json(self._ssh()), 201)

    def _slice_place(self, name: Any, gpus: int, asked: Any) -> _Slice | Answer:
        """Where a launch's MIG slice goes (call under the lock), or the refusal: 400 for a profile this
        machine does not sell or a request out of shape, 409 ``gpus_busy`` when the GPU named (or, unnamed,
        every GPU) has no room for it beside the live leases (a GPU leased whole has none)."""
        gpus_seen = self.gpus()
        table = mig_table_for_memory(gpus_seen[0].memory_gb) if gpus_seen else {}
        offered = [p for p in table if self.mig_profiles is None or p in self.mig_profiles]
        if not isinstance(name, str) or name not in offered:
            why = f"mig_profile: this machine offers {', '.join(offered) or 'no MIG profiles'}; not {str(name)[:32]!r}"
            return _answer({"code": "invalid", "message": why}, 400)
        if gpus != 1:
            why = f"mig_profile: a MIG slice is one GPU's; gpus is {gpus}"
            return _answer({"code": "invalid", "message": why}, 400)
        profile = table[name]
        taken: dict[int, set[int]] = {}
        for instance in self.instances.values():
            if instance.holds_gpus():
                for index in instance.gpu_indexes:
                    # A GPU leased whole is all taken; a slice takes its memory slices of its GPU.
                    taken.setdefault(index, set()).update(instance.mig_slots or range(MEMORY_SLICES))
        if asked is None:
            placed = mig_place(taken, profile, len(gpus_seen))
            if placed is None:
                return _answer({"code": "gpus_busy", "message": f"no GPU has room for a {name}"}, 409)
            return _Slice(placed[0], profile, placed[1])
        if (
            not isinstance(asked, list)
            or len(asked) != 1
            or not isinstance(asked[0], int)
            or isinstance(asked[0], bool)
            or not 0 <= asked[0] < len(gpus_seen)
        ):
            why = f"gpu_indexes: one GPU from 0 to {len(gpus_seen) - 1} for a MIG slice"
            return _answer({"code": "invalid", "message": why}, 400)
        index = asked[0]
        start = profile.place(taken.get(index, set()))
        if start is None:
            why = f"GPU {index} has no room for a {name}: its memory slices {sorted(taken[index])} are held"
            return _answer({"code": "gpus_busy", "message": why}, 409)
        return _Slice(index, profile, start)

    def _lease(self, instance: Instance, lease: dict[str, Any], ports: tuple[int, ...] = ()) -> LeaseAgent:
        """The lease agent for one launch, on the instance's GPUs, with ports and a directory of its own (the
        ``ports`` it had, for a lease resumed after a restart). Its key is kept in the agent's state directory,
        root-only, so a restarted agent re-attaches to the lease without a boot token."""
        exposed = tuple(int(p) for p in lease.get("ports") or [] if int(p) != 22)[: self.ports.per_lease - 1]
        total = max(1, len(self.gpus()))
        share = len(instance.mig_slots) / MEMORY_SLICES / total if instance.mig_slots else instance.gpus / total
        if self.containers is not None and instance.uid_slot < 0:
            used = {i.uid_slot for i in self.instances.values() if i.holds_gpus()}
            instance.uid_slot = min(slot for slot in range(len(used) + 1) if slot not in used)
        if ports:
            self.ports.held[instance.id] = ports
        plan = LeasePlan(
            lease_id=instance.id,
            gpu_indexes=instance.gpu_indexes,
            host_ports=ports or self.ports.take(instance.id),
            work_dir=self.data_dir / "leases" / instance.id,
            disk_quota_bytes=self.disk_quota_bytes,
            user=user_plan("lease-" + instance.id.removeprefix("i-")[:12], self.data_dir / "leases" / instance.id),
            exposed=exposed,
            authorized_keys=tuple(str(key) for key in lease.get("ssh_keys") or []),  # checked with the lease file
            # A MIG slice's lease sees its own MIG device alone.
            mig_devices=(instance.mig_device.uuid,) if instance.mig_device is not None else (),
            uid=lease_uid(instance.uid_slot, self.uid_first) if self.containers is not None else 0,
            share=share,
            login_name=str(lease.get("login_user") or "lease"),
        )
        executor = LeaseExecutor(
            plan,
            self.devices,
            simulate=self.simulated is not None,
            ssh_host=self._ssh().rsplit(":", 1)[0],
            grace_s=self.grace_s,
            disk_poll_s=self.disk_poll_s,
            runtime=self.containers,
        )
        if executor.simulate or executor.docker is not None:
            login = lease  # SSH on the lease's own endpoint: the broker's login name is the lease's alone
        else:
            login = {**lease, "login_user": plan.user.name}  # the host's sshd: one account per lease
        return LeaseAgent(
            login, executor, transport=self.lease_transport, key_file=self._state_dir() / f"{instance.id}.key"
        )

    # --------------------------------------------------------------------------- surviving a restart

    def _state_dir(self) -> Path:
        state = self.data_dir / "state"
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        return state

    def _keep(self, instance: Instance) -> None:
        """The instance's record in the state directory (root-only, replaced atomically): what ``recover``
        needs to bring its lease back after the agent or the machine restarts."""
        record = {
            "id": instance.id, "client_token": instance.client_token, "order_ref": instance.order_ref,
            "gpus": instance.gpus, "gpu_indexes": list(instance.gpu_indexes), "tags": instance.tags,
            "mig_profile": instance.mig_profile, "mig_slots": list(instance.mig_slots),
            "mig_device": dataclasses.asdict(instance.mig_device) if instance.mig_device is not None else None,
            "uid_slot": instance.uid_slot, "lease": instance.lease_file,
            "ports": list(self.ports.held.get(instance.id, ())),
        }  # fmt: skip
        write_private(self._state_dir() / f"{instance.id}.json", json.dumps(record).encode())

    def _forget(self, instance: Instance) -> None:
        for suffix in (".json", ".key"):
            (self._state_dir() / f"{instance.id}{suffix}").unlink(missing_ok=True)

    def recover(self) -> list[str]:
        """Bring back the leases this agent ran before it (or the machine) stopped: each from its record, its
        container started again behind its walls (never a second one) and its lease agent re-attached with the
        kept key, so heartbeats resume with no buyer action. A record that cannot be read is left for the
        operator, logged. Returns the ids resumed."""
        resumed = []
        for path in sorted(self._state_dir().glob("i-*.json")):
            try:
                record = jsonbody.bounded_json(path.read_bytes(), max_bytes=MAX_LAUNCH_BODY)
                device = record.get("mig_device")
                instance = Instance(
                    id=str(record["id"]), client_token=str(record["client_token"]),
                    order_ref=str(record["order_ref"]), gpus=int(record["gpus"]),
                    tags={str(k): str(v) for k, v in dict(record["tags"]).items()},
                    gpu_indexes=tuple(int(i) for i in record["gpu_indexes"]), state="running",
                    mig_profile=str(record.get("mig_profile") or ""),
                    mig_slots=tuple(int(i) for i in record.get("mig_slots") or ()),
                    mig_device=MigDevice(**device) if isinstance(device, dict) else None,
                    uid_slot=int(record.get("uid_slot", -1)), lease_file=dict(record["lease"]),
                )  # fmt: skip
                ports = tuple(int(p) for p in record.get("ports") or ())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("cannot resume the lease recorded in %s: %s", path.name, exc)
                continue
            with self._lock:
                instance.lease = self._lease(instance, instance.lease_file or {}, ports)
                self.instances[instance.id] = instance
            if self.lease_threads:
                threading.Thread(target=instance.lease.run, args=(instance.lease_stop,), name=f"lease:{instance.id}",
                                 daemon=True).start()  # fmt: skip
            resumed.append(instance.id)
        return resumed

    def terminate(self, instance: Instance) -> dict[str, Any]:
        """End an instance: its lease stopped, processes killed, directory wiped, ports released; the
        GPUs are free once this returns. Returns (and the instance reports) what was cleaned."""
        cleanup = self._end_lease(instance)
        with self._lock:
            if instance.mig_device is not None:
                # After its processes are gone (the driver will not destroy a MIG device in use).
                cleanup["mig_device_destroyed"] = self._mig_destroy(instance.mig_device)
            cleanup["ports_released"] = list(self.ports.release(instance.id))
            instance.cleanup = cleanup
            self._forget(instance)
            instance.state, instance.ended = "terminated", time.monotonic()
            self._forget_ended_locked(instance.ended)
        return cleanup

    def _forget_ended_locked(self, now: float) -> None:
        """Forget ended instances past ``KEEP_ENDED_S``, and the oldest beyond ``KEEP_ENDED``: an agent up for
        months would otherwise hold every lease it ever ran. A forgotten one answers ``not_found``, which the
        broker reads as gone; the broker never retries a launch or asks about an end that late."""
        ended = sorted((i for i in self.instances.values() if i.ended is not None), key=lambda i: i.ended or 0.0)
        stale = [i for i in ended if now - (i.ended or now) > KEEP_ENDED_S]
        surplus = ended[len(stale) :][: max(0, len(ended) - len(stale) - KEEP_ENDED)]
        for instance in [*stale, *surplus]:
            del self.instances[instance.id]

    def _mig_destroy(self, device: MigDevice) -> bool:
        try:
            self.devices.mig_destroy(device)
        except ExecutorError as exc:
            # Its memory slices stay taken on the GPU: a later slice there is refused by the driver (409).
            log.error("could not destroy MIG device %s on GPU %s: %s", device.uuid, device.gpu_index, exc)
            return False
        return True

    @staticmethod
    def _end_lease(instance: Instance) -> dict[str, Any]:
        instance.lease_stop.set()
        if instance.lease is not None:
            instance.lease.executor.stop()
        executor = instance.executor
        if executor is not None and executor.cleanup is not None:
            return dict(executor.cleanup)
        return {"processes_killed": 0, "bytes_freed": 0, "ports_released": []}

    def serve(self, host: str, port: int, *, report: bool = True) -> str:
        """Serve in a daemon thread and (unless ``report`` is off) start registering and heartbeating; returns
        the URL."""
        self._server = make_server(host, port, self, threaded=True)
        url = f"http://{host}:{self._server.server_port}"
        self.public_url = self.public_url or url
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        if report:
            threading.Thread(target=self._loop, daemon=True).start()
        return url

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _check_indexes(asked: Any, gpus: int, total: int, held: dict[int, str]) -> Answer | None:
    """The refusal for a launch's ``gpu_indexes``, or None when the lease may have them."""
    if (
        not isinstance(asked, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in asked)
        or len(set(asked)) != len(asked)
    ):
        return _answer({"code": "invalid", "message": "gpu_indexes: distinct whole numbers"}, 400)
    if len(asked) != gpus:
        return _answer({"code": "invalid", "message": f"gpu_indexes names {len(asked)} GPUs; gpus is {gpus}"}, 400)
    if any(not 0 <= i < total for i in asked):
        return _answer({"code": "invalid", "message": f"gpu_indexes: this machine has GPUs 0 to {total - 1}"}, 400)
    busy = sorted(i for i in asked if i in held)
    if busy:
        return _answer({"code": "gpus_busy", "message": f"GPUs {busy} are held by another lease"}, 409)
    return None


def _answer(data: dict[str, Any], status: int = 200) -> Answer:
    return status, data


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, mimetype="application/json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m providers.community.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--broker", required=True, help="the broker's base URL")
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--secret-file", required=True, help="file holding the machine secret shown when listed")
    parser.add_argument("--listen", default="127.0.0.1:7070", help="host:port to serve the broker on")
    parser.add_argument(
        "--public-url", default="",
        help="URL the broker reaches this agent at; without it the agent only polls the broker (behind NAT)",
    )  # fmt: skip
    parser.add_argument(
        "--ssh-address", default="",
        help="host name or address buyers reach this machine's SSH and lease ports at (default: the public URL's "
        "host); behind NAT, the router's public address with those ports forwarded",
    )  # fmt: skip
    parser.add_argument("--simulate", help="simulated GPUs, e.g. H100:80x8 (no nvidia-smi needed)")
    parser.add_argument("--launch-seconds", type=float, default=2.0)
    parser.add_argument("--data-dir", type=Path, help=f"where leases' working directories live (default {DATA_DIR})")
    parser.add_argument("--disk-quota-gb", type=int, default=DISK_QUOTA_GB, help="each lease's disk quota")
    parser.add_argument(
        "--mig-profiles", help="the MIG profiles the listing sells as slices, e.g. 1g.10gb,3g.40gb (default: every "
        "profile the GPUs offer); the GPUs they run on must be in MIG mode (nvidia-smi -i N -mig 1)",
    )  # fmt: skip
    parser.add_argument(
        "--containers", choices=("auto", "off"), default="auto",
        help="auto: every lease in a walled container of its own where Docker, iptables, root and the lease image "
        "are here (needed to sell per GPU); off: processes, and the machine sells whole only",
    )  # fmt: skip
    parser.add_argument("--lease-image", default=LEASE_IMAGE, help="the image leases without one of their own run")
    args = parser.parse_args(argv)
    if not (args.public_url or args.ssh_address or args.simulate):
        # An outbound-only host would report its leases' SSH at its own loopback: no buyer could log in.
        parser.error("without --public-url, give --ssh-address: where buyers reach this machine's SSH")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    agent = Agent(
        broker_url=args.broker,
        key_id=args.key_id,
        secret=Path(args.secret_file).read_text().strip(),
        public_url=args.public_url,
        ssh_address=args.ssh_address,
        simulated=parse_simulated(args.simulate) if args.simulate else None,
        launch_seconds=args.launch_seconds,
        data_dir=args.data_dir,
        disk_quota_bytes=args.disk_quota_gb * 10**9,
        mig_profiles=None if args.mig_profiles is None else [p.strip() for p in args.mig_profiles.split(",")],
        containers=runtime_probe(image=args.lease_image) if args.containers == "auto" else "--containers off",
    )
    if agent.containers is None:
        print(f"leases are not walled off: {agent.isolation_reason}; this machine sells whole only", flush=True)
    resumed = agent.recover()
    if resumed:
        print(f"resumed {len(resumed)} lease(s) from before the restart: {', '.join(resumed)}", flush=True)
    if args.public_url:
        print(f"agent for {args.key_id} serving on {agent.serve(host or '127.0.0.1', int(port))}", flush=True)
    else:
        agent.start_outbound()
        print(f"agent for {args.key_id} polling {args.broker} (no public URL)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
