"""What a host agent's machine holds for the broker's leases: its GPUs, the instances launched on it and their
leases (each on its own GPUs, ports, directory and account, through ``executor.LeaseExecutor``), MIG slices,
terminate and its cleanup, and the records in the state directory that bring leases back after a restart.

``Host`` is the machine's side; ``agent.Agent`` adds the broker's side (signed HTTP or the command poll,
register and heartbeat) and the command line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from providers.boot import BootScriptUnreadable, lease_file_from_script
from providers.community import protocol
from providers.community.containers import LEASE_UID_FIRST, ContainerRuntime, lease_uid
from providers.community.devices import FakeDevices, MigDevice, NvidiaDevices
from providers.community.executor import LeaseExecutor
from providers.community.executor_base import ExecutorError, telemetry_sample
from providers.community.host_gpus import Gpu, read_nvidia_smi, simulated_rating_w
from providers.community.instances import KEEP_ENDED, KEEP_ENDED_S, Answer, Instance, _answer, _check_indexes, _Slice
from providers.community.lease import LeaseAgent, Transport, write_private
from providers.community.lease_plan import LeasePlan, user_plan
from providers.community.mig import MEMORY_SLICES, mig_place, mig_table_for_memory
from providers.community.ports import PORTS_FIRST, PortPool
from untrusted import jsonbody

log = logging.getLogger("providers.community.agent")
MAX_LAUNCH_BODY = 512 * 1024  # a boot script of the adapter's limit, base64-encoded, and the rest of the request
DATA_DIR = Path("/var/lib/gpu-broker-agent")
DISK_QUOTA_GB = 100
# What the broker may ask of a lease besides ending it (issue 36): each is the lease's own container.
INSTANCE_ACTIONS = ("stop", "start", "reboot")


class Host:
    """One machine's instances and leases, whoever asks for them (``agent.Agent`` serves them to the broker)."""

    def __init__(
        self,
        *,
        public_url: str = "",
        ssh_address: str = "",
        simulated: list[Gpu] | None = None,
        launch_seconds: float = 0.5,
        lease_threads: bool = True,
        data_dir: Path | None = None,
        disk_quota_bytes: int = DISK_QUOTA_GB * 10**9,
        grace_s: float = 10.0,
        disk_poll_s: float | None = 5.0,
        mig: dict[int, list[str]] | None = None,
        mig_profiles: Sequence[str] | None = None,
        containers: ContainerRuntime | str = "containers not asked for",
        uid_first: int = LEASE_UID_FIRST,
    ):
        self.public_url = public_url
        # Where buyers reach this host's SSH and lease ports; the public URL's host unless given (behind NAT:
        # the router's public address, with the ports forwarded).
        self.ssh_address = ssh_address
        self.simulated = simulated
        self.launch_seconds = launch_seconds
        self.instances: dict[str, Instance] = {}
        self._lock = threading.Lock()
        # Leases run in threads; with ``lease_threads`` off they are only built, and a test drives them.
        self.lease_threads = lease_threads
        self.lease_transport: Transport | None = None  # None: HTTP to the broker URL in the lease file
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

    def _live_count(self) -> int:
        with self._lock:
            return sum(1 for i in self.instances.values() if i.state in ("pending", "running"))

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

    def act(self, instance: Instance, action: str) -> Answer:
        """Stop, start or reboot the lease's workload (``INSTANCE_ACTIONS``): its container stopped with its disk,
        GPUs and ports kept; started again; restarted in place. Idempotent (stopping a stopped lease, starting a
        running one, answers it as it is). 409 ``not_running`` for an instance ending, ended or still pending,
        409 ``unsupported`` where the lease runs as processes rather than a container (nothing to stop and keep)."""
        with self._lock:
            self._refresh(instance)
            state = instance.state
            if instance.ending or state not in ("running", "stopped"):
                return _answer({"code": "not_running", "message": f"instance {instance.id} is {state}"}, 409)
            wanted = {"stop": "stopped", "start": "running", "reboot": "running"}[action]
            if state == wanted and action != "reboot":
                return _answer(instance.json(self._ssh()))
            if action == "reboot" and state != "running":
                return _answer({"code": "not_running", "message": f"instance {instance.id} is {state}"}, 409)
        executor = instance.executor
        try:
            if executor is not None:
                {"stop": executor.pause, "start": executor.unpause, "reboot": executor.restart}[action]()
        except ExecutorError as exc:
            return _answer({"code": "unsupported", "message": str(exc)[:300]}, 409)
        with self._lock:
            instance.state = wanted
            return _answer(instance.json(self._ssh()))

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

    def stop(self) -> None:
        """Remove a simulated host's own data directory (``agent.Agent.stop`` first ends the broker's side)."""
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
