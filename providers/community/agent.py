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

This module owns the broker's side: the signed HTTP server and the command poll, register and heartbeat, and
the command line. What the machine holds (instances, leases, launch and terminate, the records that bring leases
back after a restart) is ``host.Host``, which ``Agent`` extends.

Standard library plus werkzeug, so it installs anywhere the broker's source does.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import threading
import time
import urllib.error
from collections.abc import Sequence
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from providers.community import protocol
from providers.community.containers import LEASE_IMAGE, LEASE_UID_FIRST, ContainerRuntime, runtime_probe
from providers.community.host import DATA_DIR, DISK_QUOTA_GB, INSTANCE_ACTIONS, MAX_LAUNCH_BODY, Host
from providers.community.host_gpus import Gpu, parse_simulated
from providers.community.instances import Answer, _answer
from providers.community.lease import Transport, http_transport
from untrusted import jsonbody

log = logging.getLogger("providers.community.agent")
_COMMAND_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Agent(Host):
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
        super().__init__(
            public_url=public_url, ssh_address=ssh_address, simulated=simulated, launch_seconds=launch_seconds,
            lease_threads=lease_threads, data_dir=data_dir, disk_quota_bytes=disk_quota_bytes, grace_s=grace_s,
            disk_poll_s=disk_poll_s, mig=mig, mig_profiles=mig_profiles, containers=containers, uid_first=uid_first,
        )  # fmt: skip
        self.broker_url = broker_url.rstrip("/")
        self.key_id = key_id
        self.secret = secret
        self.heartbeat_s = heartbeat_s
        self._seen_nonces: dict[str, float] = {}
        self._stop = threading.Event()
        self._server: Any = None
        self.rejected: list[str] = []  # refusal codes, for the operator (and tests)
        # Outbound-only: how often the broker's command queue is polled, over what (None: HTTP to broker_url),
        # and whether each command runs in a thread of its own (off: in the poll, for a test to drive).
        self.poll_s = poll_s
        self.broker_transport = broker_transport
        self.command_threads = command_threads

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
        if len(parts) == 4 and parts[:2] == ["v1", "instances"] and method == "POST" and parts[3] in INSTANCE_ACTIONS:
            with self._lock:
                instance = self.instances.get(parts[2])
            if instance is None:
                return _answer({"code": "not_found", "message": f"no instance {parts[2]}"}, 404)
            return self.act(instance, parts[3])
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

    def _remember_nonce(self, nonce: str) -> None:
        now = time.monotonic()
        with self._lock:
            for old, seen in list(self._seen_nonces.items()):
                if now - seen > 2 * protocol.MAX_SKEW_S:
                    del self._seen_nonces[old]
            if nonce in self._seen_nonces:
                raise protocol.Rejected("replayed", "this nonce was already used")
            self._seen_nonces[nonce] = now

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
        super().stop()


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
