"""The lease agent: the broker's agent on a machine rented for one order, started by the boot script.

    python3 agent.pyz lease --spec /opt/gpu-broker/lease.json                  # what the boot script runs
    python3 agent.pyz lease --spec lease.json --simulate "NVIDIA H100 80GB HBM3:80x8"   # no GPUs needed

The same code runs inside an independent host's agent for each lease it starts (``agent.py``), and in the
sandboxes, which "boot" an instance by starting it from the instance's user data (``sandboxes/boot.py``).

A lease's life, every step but the first signed with the lease's own key (``protocol.py``):

1. ``POST /agent/v1/lease/claim`` ``{"boot_token"}`` -> ``{"key_id", "secret", "heartbeat_s"}``. The token from
   the user data works once and expires; whoever reads the user data later holds nothing.
2. ``POST /agent/v1/lease/secrets`` -> ``{"env": {...}, "registry_password"}``: the buyer's secret values,
   which never appear in user data, logs or the broker's answers.
3. The executor checks the GPUs, starts the workload (a container, a script, or nothing), finds SSH listening
   and reads the host keys.
4. ``POST /agent/v1/lease/ready`` ``{"gpus", "workload", "ssh", "host_keys", "ports"}`` -> ``{"state": "running"}``, or
   ``{"state": "refused", "problem"}`` when the machine is not what the order bought (the broker terminates it
   and fails over). A step that fails posts ``/agent/v1/lease/failed`` ``{"stage", "reason"}`` instead.
5. ``POST /agent/v1/lease/heartbeat`` ``{"gpus": [...telemetry], "workload": {"state"}}`` every ``heartbeat_s``;
   an answer ``{"state": "ended"}`` stops the workload and the agent.

Surviving a reboot (``main``): the claimed key, and the secret values a script needs again, are kept in a
root-only key file (0600, replaced atomically) beside the lease file. An agent that finds it never spends the
token again: it re-attaches, asking the broker with a heartbeat signed by the kept key whether the lease still
runs, starts the workload again (a reboot killed it) and goes on heartbeating. An exclusive lock beside the
lease file makes a second agent exit at once, so a boot script run twice (GCP runs it at every boot) never
starts two.

What does the work on the machine is an executor (``executor_base.py`` holds the contract,
``lease_executors.py`` the real machine's and the simulated one). This module owns the lease's conversation with
the broker: the calls and their retries, the kept key, the lock and the command line.

Standard library only: these files run on any image with Python 3.9+, fetched from the broker as a zipapp
(``bundle.py``).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from providers.community import protocol
from providers.community.executor_base import LOG_TAIL_LINES, Executor, ExecutorError, text_tail
from providers.community.lease_executors import HostExecutor, SimulatedExecutor, parse_simulated
from untrusted import jsonbody

log = logging.getLogger("gpu-broker.lease")

AGENT_VERSION = "1"
MAX_ANSWER = 1024 * 1024
MAX_REASON = 2000
KEY_FILE_NAME = "agent.key"  # beside the lease file: the lease's key and its secrets, root-only
LOCK_FILE_NAME = "agent.lock"  # beside the lease file: held by the one agent of this machine
# main's exit status when the lease is over for good (ended, refused, failed, its token or key refused): the
# systemd unit's RestartPreventExitStatus lists it with 0, so only a crash is restarted.
EXIT_OVER = 3
EXIT_BUSY = 4  # another agent holds the lock

# (method, path with query, body, headers) -> (HTTP status, body); raises OSError when the broker is unreachable.
Transport = Callable[[str, str, bytes, dict[str, str]], tuple[int, bytes]]


class BrokerRefused(Exception):
    """The broker answered a lease call with an error (a spent token, a forged signature, ...)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


def http_transport(broker_url: str, *, timeout: float = 15.0) -> Transport:
    """Requests to the broker over HTTP(S), each bounded by ``timeout``."""
    base = broker_url.rstrip("/")

    def send(method: str, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(base + target, data=body, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the lease's broker
                return int(response.status), response.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read(MAX_ANSWER + 1)

    return send


def write_private(path: Path, data: bytes) -> None:
    """``data`` as ``path``, readable by its owner alone, replaced atomically: a reader (or a reboot) finds the
    old file or the new one, never a torn one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class LeaseAgent:
    """One lease: claim, secrets, checks, ready, heartbeats. ``boot``, ``reattach`` and ``heartbeat`` are single
    steps (tests drive them one at a time); ``run`` loops until the broker ends the lease or ``stop`` is set.

    With a ``key_file`` (a machine's own agent; not the host agent's leases, nor the sandboxes'), the claimed
    key is kept there once the token is spent, with the secret env a script needs to start again, and ``run``
    re-attaches with it instead of booting when it exists."""

    def __init__(
        self,
        lease: dict[str, Any],
        executor: Executor,
        *,
        transport: Transport | None = None,
        claim_wait_s: float = 900.0,
        key_file: Path | None = None,
    ):
        self.lease = lease
        self.executor = executor
        self.transport = transport or http_transport(str(lease["broker_url"]))
        self.claim_wait_s = claim_wait_s
        self.key_file = key_file
        self.key_id = ""
        self._secret = ""
        self.heartbeat_s: float = protocol.HEARTBEAT_S
        # booting -> running | refused | failed | ended | claim_refused | key_refused
        self.state = "booting"

    def _post(self, path: str, payload: dict[str, Any], *, signed: bool = True, tries: int = 6) -> dict[str, Any]:
        """One call, tried again (with a fresh signature and nonce) while the broker cannot be reached or answers
        5xx or 429, waiting 1, 2, 4... seconds; other refusals raise ``BrokerRefused`` at once."""
        body = json.dumps(payload).encode()
        for attempt in range(tries):
            headers = {"Content-Type": "application/json"}
            if signed:
                headers.update(protocol.sign(self.key_id, self._secret, "POST", path, body))
            try:
                status, raw = self.transport("POST", path, body, headers)
            except OSError:
                if attempt + 1 >= tries:
                    raise
                time.sleep(2.0**attempt)
                continue
            if (status >= 500 or status == 429) and attempt + 1 < tries:
                log.warning("%s answered %s; trying again", path, status)
                time.sleep(2.0**attempt)
                continue
            return self._answer(status, raw)
        raise BrokerRefused(0, "unreachable", f"{path}: no answer")

    def _answer(self, status: int, raw: bytes) -> dict[str, Any]:
        try:
            answer = jsonbody.bounded_json(raw, max_bytes=MAX_ANSWER)
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if status >= 400:
            raise BrokerRefused(status, str(answer.get("code", "")), str(answer.get("message", ""))[:300])
        return answer

    def claim(self) -> None:
        """Spend the boot token for the lease's key; retried while the broker cannot be reached."""
        deadline = time.monotonic() + self.claim_wait_s
        delay = 2.0
        while True:
            try:
                answer = self._post(
                    "/agent/v1/lease/claim",
                    {"boot_token": self.lease["boot_token"], "agent": {"version": AGENT_VERSION,
                                                                       "executor": self.executor.name}},
                    signed=False,
                    tries=1,
                )  # fmt: skip
                break
            except BrokerRefused as exc:
                # A token refused (401) is final; a broker in trouble (5xx, 429) is waited for, like no answer.
                if (exc.status < 500 and exc.status != 429) or time.monotonic() > deadline:
                    raise
                log.warning("the broker answered %s to the claim; retrying in %.0f s", exc.status, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("broker unreachable (%s); retrying in %.0f s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
        self.key_id, self._secret = str(answer["key_id"]), str(answer["secret"])
        self.heartbeat_s = float(answer.get("heartbeat_s") or protocol.HEARTBEAT_S)
        # The token is spent: from here on, only the kept key lets this machine's agent speak for the lease.
        self._keep({})

    def _keep(self, secrets: dict[str, Any]) -> None:
        if self.key_file is None:
            return
        kept = {"key_id": self.key_id, "secret": self._secret, "heartbeat_s": self.heartbeat_s, "secrets": secrets}
        write_private(self.key_file, json.dumps(kept).encode())

    def kept_key(self) -> dict[str, Any] | None:
        """What ``claim`` kept in the key file; None when there is no key file or nothing in it."""
        if self.key_file is None or not self.key_file.exists():
            return None
        try:
            kept = jsonbody.bounded_json(self.key_file.read_bytes(), max_bytes=MAX_ANSWER)
        except ValueError as exc:
            log.error("the key file %s is unreadable (%s); booting as if it were not there", self.key_file, exc)
            return None
        if not isinstance(kept, dict) or not isinstance(kept.get("key_id"), str) or not kept.get("secret"):
            log.error("the key file %s holds no key; booting as if it were not there", self.key_file)
            return None
        return kept

    def fail(self, stage: str, reason: str) -> None:
        self.state = "failed"
        log.error("lease failed at %s: %s", stage, reason)
        try:
            self._post("/agent/v1/lease/failed", {"stage": stage, "reason": reason[:MAX_REASON]})
        except (OSError, BrokerRefused) as exc:
            log.error("could not report the failure: %s", exc)

    def boot(self) -> str:
        """Claim, fetch the secrets, check the machine, start the workload and report ready. Returns the
        lease's state: ``running``, ``refused`` (the broker found the machine wrong), ``failed`` or
        ``claim_refused`` (the token was spent or expired)."""
        try:
            self.claim()
        except BrokerRefused as exc:
            log.error("the broker refused the boot token: %s", exc)
            self.state = "claim_refused"
            return self.state
        secrets = self._post("/agent/v1/lease/secrets", {})
        workload = dict(self.lease.get("workload") or {})
        if workload.get("kind") == "script":
            # A script started again after a reboot needs them, and the broker hands them out once, before ready.
            # (A container keeps its env in its own configuration; ``docker start`` reuses it.)
            self._keep({"env": secrets.get("env") or {}})
        try:
            gpus = self.executor.gpus()
        except ExecutorError as exc:
            self.fail("gpus", str(exc))
            return self.state
        login_user = str(self.lease.get("login_user") or "root")
        try:
            detail = self.executor.start(workload, secrets, login_user)
        except ExecutorError as exc:
            self.fail("workload", str(exc))
            return self.state
        ssh = self.executor.ssh()
        if not ssh.listening:
            self.fail("ssh", f"nothing answers SSH on port {ssh.port}")
            return self.state
        exposed = self.executor.expose([int(p) for p in self.lease.get("ports") or [] if int(p) != 22])
        answer = self._post(
            "/agent/v1/lease/ready",
            {
                "ports": exposed,
                "gpus": [{"index": g.index, "name": g.name, "memory_gb": g.memory_gb} for g in gpus],
                "workload": {"kind": str(workload.get("kind") or "none"), "detail": detail[:MAX_REASON]},
                "ssh": {"listening": True, "port": ssh.port, "user": login_user, "host": ssh.host},
                "host_keys": self.executor.host_keys(),
                "agent": {"version": AGENT_VERSION, "executor": self.executor.name},
            },
        )
        self.state = "running" if answer.get("state") == "running" else "refused"
        if self.state == "refused":
            log.error("the broker refused this machine: %s", answer.get("problem"))
            self.executor.stop()
        return self.state

    def reattach(self) -> str:
        """An agent started again on a machine whose lease it had claimed (a reboot, a crash): no token is spent.
        It asks the broker with a heartbeat signed by the kept key whether the lease still runs, and stops if not
        (``ended``, or ``key_refused`` for a key the broker no longer knows); otherwise it starts the workload
        again (``resume``) and returns ``running``. A broker it cannot reach yet is no reason to stop: the workload
        is resumed and the heartbeats that follow keep trying. A lease claimed but never ready answers ``ended``
        too (its secrets are handed out once): the attempt's boot deadline fails that machine over."""
        kept = self.kept_key()
        if kept is None:
            raise ValueError("reattach needs a kept key")
        self.key_id, self._secret = str(kept["key_id"]), str(kept["secret"])
        self.heartbeat_s = float(kept.get("heartbeat_s") or protocol.HEARTBEAT_S)
        try:
            if self.heartbeat() == "ended":
                log.info("the broker says this lease has ended")
                return self.state
        except BrokerRefused as exc:
            if exc.status in (401, 403):
                log.error("the broker refused the kept key: %s", exc)
                self.state = "key_refused"
                return self.state
            log.warning("the broker did not take the first heartbeat (%s); resuming the workload anyway", exc)
        except (OSError, ExecutorError) as exc:
            # The broker unreachable yet, or nvidia-smi not answering while the driver loads after the boot.
            log.warning("no first heartbeat (%s); resuming the workload anyway", exc)
        workload = dict(self.lease.get("workload") or {})
        saved = kept.get("secrets")
        secrets: dict[str, Any] = saved if isinstance(saved, dict) else {}
        login_user = str(self.lease.get("login_user") or "root")
        # Executors without ``resume`` (the host agent's per-lease one) never re-attach; ``start`` is their resume.
        start_again = getattr(self.executor, "resume", None) or self.executor.start
        try:
            detail = start_again(workload, secrets, login_user)
            log.info("re-attached: %s", detail)
        except ExecutorError as exc:
            # The lease is past ready, so there is no failure to report: the heartbeats carry the workload's
            # state, which the order shows.
            log.error("the workload did not start again: %s", exc)
        self.state = "running"
        return self.state

    def heartbeat(self) -> str:
        """One telemetry report; returns the broker's view of the lease (``running`` or ``ended``)."""
        report: dict[str, Any] = {"gpus": self.executor.telemetry(), "workload": self.executor.workload_state()}
        logs = getattr(self.executor, "logs", None)
        if logs is not None:
            try:
                # The workload's recent output, which the buyer reads on the order (issue 36); never the reason
                # a heartbeat is not sent.
                report["logs"] = text_tail(str(logs(LOG_TAIL_LINES)).encode())
            except (OSError, ExecutorError, subprocess.SubprocessError) as exc:
                log.warning("could not read the workload's logs: %s", exc)
        answer = self._post("/agent/v1/lease/heartbeat", report)
        if answer.get("state") == "ended":
            self.state = "ended"
            self.executor.stop()
        return self.state

    def run(self, stop: threading.Event | None = None) -> str:
        stop = stop or threading.Event()
        try:
            first = self.reattach() if self.kept_key() is not None else self.boot()
            if first != "running":
                return self.state
            while not stop.wait(self.heartbeat_s):
                try:
                    if self.heartbeat() == "ended":
                        break
                except (OSError, BrokerRefused, ExecutorError) as exc:
                    log.warning("heartbeat not delivered: %s", exc)
        except (OSError, BrokerRefused, KeyError, ValueError) as exc:
            log.error("lease agent stopped: %s", exc)
            self.state = "failed"
        finally:
            if stop.is_set():
                self.executor.stop()
        return self.state


def hold_lock(path: Path) -> int | None:
    """An exclusive ``flock`` on ``path``, held for the life of the process (the descriptor stays open); None
    when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 once the broker ended the lease, ``EXIT_OVER`` when the lease is over otherwise (refused,
    failed, its token or key refused), ``EXIT_BUSY`` when another agent runs here, 1 for anything unforeseen (the
    systemd unit restarts only that)."""
    parser = argparse.ArgumentParser(prog="agent.pyz", description="the broker's agent on a rented machine")
    commands = parser.add_subparsers(dest="command", required=True)
    lease = commands.add_parser("lease", help="run one lease from the file the boot script wrote")
    lease.add_argument("--spec", required=True, help="the lease file (/opt/gpu-broker/lease.json)")
    lease.add_argument("--simulate", help="simulated GPUs, NAME:GBxCOUNT (no nvidia-smi, docker or sshd needed)")
    lease.add_argument("--key-file", help=f"where the lease's key is kept (default: {KEY_FILE_NAME} beside --spec)")
    lease.add_argument("--lock-file", help=f"held while this agent runs (default: {LOCK_FILE_NAME} beside --spec)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spec_path = Path(args.spec)
    lock = hold_lock(Path(args.lock_file) if args.lock_file else spec_path.with_name(LOCK_FILE_NAME))
    if lock is None:
        print("another lease agent runs on this machine; this one stops", flush=True)
        return EXIT_BUSY
    spec = json.loads(spec_path.read_text())
    executor: Executor = SimulatedExecutor(parse_simulated(args.simulate)) if args.simulate else HostExecutor()
    key_file = Path(args.key_file) if args.key_file else spec_path.with_name(KEY_FILE_NAME)
    state = LeaseAgent(spec, executor, key_file=key_file).run()
    print(f"lease ended: {state}", flush=True)
    if state in ("ended", "running"):
        return 0
    return EXIT_OVER if state in ("refused", "failed", "claim_refused", "key_refused") else 1


if __name__ == "__main__":
    raise SystemExit(main())
