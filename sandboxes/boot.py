"""How a sandbox "boots" an instance: it reads the lease file from the user data the launch carried and
starts the lease agent (``providers/community/lease.py``) with a simulated executor, as cloud-init would
start it from the boot script on a real machine.

Every sandbox owns a ``Booter`` and calls ``boot`` when one of its instances first reaches running and
``halt`` when it is terminated. A cloud's stop that keeps the disk calls ``power_off`` (the agent stops, a
machine's container is stopped but kept, nothing answers SSH) and its start ``power_on``: the machine's agent
starts again as at boot, and with the key it kept at its first boot re-attaches to its lease
(``LeaseAgent.reattach``) instead of spending the boot token again; a container is started again, never a
second one. A reboot is ``power_off`` then ``power_on``. Modes:

- ``thread`` (a served sandbox's, so ``bin/run``'s): each booted instance runs its agent in a daemon thread,
  which phones home over HTTP to the broker URL in its lease file;
- ``hold`` (the default in process, so a test's sandbox never calls anything it did not ask for): the agent
  is built but not started; a test drives ``machine(instance_id).agent.boot()`` itself, through a transport
  of its choosing, so the broker's side runs in the test's own database transaction, or switches the
  sandbox to ``thread`` to have it phone home to a live server;
- ``off``: nothing boots (a sandbox used only for its catalogue).

Boot faults come from the sandbox's fault registry, matched on the action ``boot``, the instance type and
the zone: ``boot_silent`` (the machine never phones home), ``gpu_mismatch`` (it reports fewer GPUs than its
type has) and ``workload_fail`` (the container or script fails to start; the fault's ``message`` is the
reason the agent reports).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from providers import gpu_names
from providers.boot import BootScriptUnreadable, lease_file_from_script
from providers.community.containers import ContainerRuntime, lease_uid, leftovers_clear, runtime_probe
from providers.community.devices import FakeDevices
from providers.community.executor import LeaseExecutor
from providers.community.executor_base import GpuSeen
from providers.community.lease import LeaseAgent, Transport
from providers.community.lease_executors import SimulatedExecutor
from providers.community.lease_plan import LeasePlan, user_plan
from providers.community.ports import free_ports
from providers.gpu_specs import GPU_SPECS
from sandboxes.faults import BOOT_ACTION, BOOT_KINDS, FaultKind, FaultRegistry

log = logging.getLogger("sandboxes.boot")
SANDBOX_UID_FIRST = 3_500_000  # the sandbox clouds' machines: apart from the simulated hosts' lease uids
MAX_PORTS = 15
DISK_QUOTA_BYTES = 100 * 10**9
POWER_OFF_JOIN_S = 5.0  # how long a power-off waits for the machine's agent thread to notice and end


def sandbox_runtime(owner: str) -> ContainerRuntime | None:
    """The machine's Docker for the sandboxes' machines and simulated hosts, publishing on loopback, with no GPU
    device nodes (their GPUs are simulated); None, saying why on stderr, where it cannot wall leases off."""
    runtime = runtime_probe(publish_address="127.0.0.1", dev_root=Path(tempfile.gettempdir()) / "gpu-broker-no-gpus")
    if isinstance(runtime, str):
        log.warning("machines are simulated, not containers: %s", runtime)
        return None
    runtime = dataclasses.replace(runtime, owner=owner)
    leftovers_clear(runtime)  # of a run killed before it could stop its machines
    return runtime


# What nvidia-smi calls each GPU the broker sells (its ``name`` column), so the broker's check of a ready
# report meets the names real machines print.
NVIDIA_SMI_NAMES: dict[str, str] = {
    gpu_names.T4: "Tesla T4",
    gpu_names.A10: "NVIDIA A10",
    gpu_names.A10G: "NVIDIA A10G",
    gpu_names.L4: "NVIDIA L4",
    gpu_names.L40S: "NVIDIA L40S",
    gpu_names.V100_16_SXM2: "Tesla V100-SXM2-16GB",
    gpu_names.V100_32_SXM2: "Tesla V100-SXM2-32GB",
    gpu_names.V100_16_PCIE: "Tesla V100-PCIE-16GB",
    gpu_names.A100_40_SXM: "NVIDIA A100-SXM4-40GB",
    gpu_names.A100_40_PCIE: "NVIDIA A100-PCIE-40GB",
    gpu_names.A100_80_SXM: "NVIDIA A100-SXM4-80GB",
    gpu_names.A100_80_PCIE: "NVIDIA A100 80GB PCIe",
    gpu_names.H100_SXM: "NVIDIA H100 80GB HBM3",
    gpu_names.H100_PCIE: "NVIDIA H100 PCIe",
    gpu_names.H100_NVL: "NVIDIA H100 NVL",
    gpu_names.H200_SXM: "NVIDIA H200",
    gpu_names.H200_NVL: "NVIDIA H200 NVL",
    gpu_names.B200: "NVIDIA B200",
    gpu_names.GB200: "NVIDIA GB200",
    gpu_names.MI250X: "AMD Instinct MI250X",
    gpu_names.MI300X: "AMD Instinct MI300X",
}


# Each board's rated power in watts, from the spec table (the vendors' datasheets), so a simulated machine's
# power draw stays within what its GPUs can draw.
RATED_POWER_W: dict[str, int] = {spec["key"]: spec["tdp_w"] for spec in GPU_SPECS if spec["tdp_w"]}


def simulated_gpus(model_key: str, count: int, memory_gb: int) -> list[GpuSeen]:
    """The GPUs a machine of this type shows, named as nvidia-smi names them, drawing within their rating."""
    name = NVIDIA_SMI_NAMES.get(model_key, model_key)
    limit = RATED_POWER_W.get(model_key, 300)
    return [GpuSeen(index, name, memory_gb, limit) for index in range(count)]


def _machine_name(instance_id: str) -> str:
    return "i-" + hashlib.sha256(instance_id.encode()).hexdigest()[:12]


class BootMode(enum.StrEnum):
    THREAD = "thread"
    HOLD = "hold"
    OFF = "off"


@dataclass
class BootedMachine:
    """One booted instance: its lease file, its simulated executor and its agent."""

    instance_id: str
    lease: dict[str, Any]
    executor: SimulatedExecutor | LeaseExecutor
    agent: LeaseAgent
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    gpus: list[GpuSeen] = field(default_factory=list)
    ssh_host: str = "127.0.0.1"
    key_file: Path | None = None  # where the agent keeps its claimed key, as a machine's own agent does


class _PowerCut:
    """A powered-off machine's executor as its agent's thread sees it on the way out: ``power_off`` has already
    cut the power (stopped the container, closed the sockets), so the agent's exit must not tear down what the
    machine keeps for its next start (the lease's container, its work directory)."""

    def __init__(self, executor: SimulatedExecutor | LeaseExecutor):
        self.executor = executor

    def stop(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executor, name)


def _power_cut(executor: SimulatedExecutor | LeaseExecutor) -> None:
    """Stop what runs on the machine and keep what it wrote: a container is stopped, not removed."""
    if isinstance(executor, LeaseExecutor):
        if executor.walls is not None:
            executor.walls.docker("stop", executor.walls.container, timeout=120)
        return
    executor.stop()  # a simulated machine holds nothing but the sockets it answers on


@dataclass(frozen=True)
class BootRecord:
    """What happened when an instance booted, for tests and the sandbox's control API."""

    instance_id: str
    outcome: str  # "booted", "silent", "no_user_data", "unreadable", "powered_off", "started_again"
    detail: str = ""


class Booter:
    """The booted instances of one sandbox."""

    def __init__(self, faults: FaultRegistry, mode: BootMode | str = BootMode.HOLD):
        self.faults = faults
        self.mode = BootMode(mode)
        self.transport_factory: Callable[[str], Transport] | None = None  # None: HTTP to the lease's broker
        self._machines: dict[str, BootedMachine] = {}
        self.records: list[BootRecord] = []
        self._lock = threading.Lock()
        # Where Docker answers (the run command's sandboxes), each machine is a real walled container with an
        # OpenSSH server, so a buyer's first order gives a real shell; else a simulated executor.
        self.containers: ContainerRuntime | None = None
        self.uid_first = SANDBOX_UID_FIRST
        # How long a machine takes from its launch to its agent's first step (0: at once). A real one boots for a
        # minute or more, so its agent never phones home while the broker is still recording the launch.
        self.start_delay_s = 0.0
        self._work_root: Path | None = None
        self._powered_off: dict[str, BootedMachine] = {}

    def boot(
        self,
        *,
        instance_id: str,
        user_data: bytes | None,
        gpus: list[GpuSeen],
        instance_type: str = "",
        zone: str | None = None,
        ssh_host: str = "127.0.0.1",
    ) -> BootedMachine | None:
        """Start the lease agent the user data asks for; None when there is none to start (no user data, a
        script the broker did not write, or a ``boot_silent`` fault). Booting an instance twice is a no-op."""
        with self._lock:
            if instance_id in self._machines or instance_id in self._powered_off or self.mode is BootMode.OFF:
                return self._machines.get(instance_id)
        if not user_data:
            self._record(instance_id, "no_user_data")
            return None
        try:
            lease = lease_file_from_script(user_data)
        except BootScriptUnreadable as exc:
            self._record(instance_id, "unreadable", str(exc))
            return None
        fault = self.faults.take(BOOT_ACTION, [instance_type], zone, kinds=BOOT_KINDS)
        if fault is not None and fault.kind is FaultKind.BOOT_SILENT:
            self._record(instance_id, "silent")
            return None
        if fault is not None and fault.kind is FaultKind.GPU_MISMATCH:
            gpus = gpus[: max(0, len(gpus) // 2)] if len(gpus) > 1 else []
        failure = None
        if fault is not None and fault.kind is FaultKind.WORKLOAD_FAIL:
            failure = fault.message or "the container exited at once: exec format error"
        executor: SimulatedExecutor | LeaseExecutor = (
            self._container(instance_id, lease, gpus, failure, ssh_host)
            if self.containers is not None
            else SimulatedExecutor(gpus, fail_workload=failure, ssh_host=ssh_host)
        )
        transport = self.transport_factory(str(lease["broker_url"])) if self.transport_factory else None
        key_file = self._work() / f"{_machine_name(instance_id)}.key"
        agent = LeaseAgent(lease, executor, transport=transport, key_file=key_file)
        machine = BootedMachine(instance_id, lease, executor, agent, gpus=gpus, ssh_host=ssh_host, key_file=key_file)
        with self._lock:
            self._machines[instance_id] = machine
        self._record(instance_id, "booted")
        self._run(machine)
        return machine

    def _run(self, machine: BootedMachine) -> None:
        if self.mode is BootMode.THREAD:
            machine.thread = threading.Thread(
                target=self._agent_run, args=(machine,), name=f"lease:{machine.instance_id}", daemon=True
            )
            machine.thread.start()

    def _agent_run(self, machine: BootedMachine) -> None:
        if self.start_delay_s and machine.stop.wait(self.start_delay_s):
            return  # powered off before it finished booting
        machine.agent.run(machine.stop)

    def _work(self) -> Path:
        with self._lock:
            if self._work_root is None:
                self._work_root = Path(tempfile.mkdtemp(prefix="gpu-broker-sandbox-machines-"))
            return self._work_root

    def power_off(self, instance_id: str) -> None:
        """The instance stopped with its disk kept: its agent stops, its container is stopped (not removed) and
        nothing answers on its ports. A machine that never booted, or is off already, is left as it is."""
        with self._lock:
            machine = self._machines.pop(instance_id, None)
            if machine is not None:
                self._powered_off[instance_id] = machine
        if machine is None:
            return
        if machine.thread is not None:
            machine.agent.executor = _PowerCut(machine.executor)
            machine.stop.set()
            # Before a start can follow (a reboot is power_off then power_on at once): the old agent must not
            # act on the machine once the new one runs.
            machine.thread.join(timeout=POWER_OFF_JOIN_S)
        _power_cut(machine.executor)
        self._record(instance_id, "powered_off")

    def power_on(self, instance_id: str) -> BootedMachine | None:
        """The stopped instance runs again: a fresh agent on the same machine (same lease file, same kept key,
        same container and work directory) re-attaches to its lease. None when the machine was not powered off
        by ``power_off`` (it never booted an agent)."""
        with self._lock:
            old = self._powered_off.pop(instance_id, None)
        if old is None:
            return None
        executor: SimulatedExecutor | LeaseExecutor
        if isinstance(old.executor, LeaseExecutor):
            executor = LeaseExecutor(old.executor.plan, old.executor.devices, simulate=True, ssh_host=old.ssh_host,
                                     disk_poll_s=None, runtime=self.containers)  # fmt: skip
        else:
            executor = SimulatedExecutor(old.gpus, fail_workload=old.executor.fail_workload, ssh_host=old.ssh_host)
        transport = self.transport_factory(str(old.lease["broker_url"])) if self.transport_factory else None
        agent = LeaseAgent(old.lease, executor, transport=transport, key_file=old.key_file)
        machine = BootedMachine(instance_id, old.lease, executor, agent, gpus=old.gpus, ssh_host=old.ssh_host,
                                key_file=old.key_file)  # fmt: skip
        with self._lock:
            self._machines[instance_id] = machine
        self._record(instance_id, "started_again")
        self._run(machine)
        return machine

    def powered_off(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._powered_off

    def _container(
        self, instance_id: str, lease: dict[str, Any], gpus: list[GpuSeen], failure: str | None, ssh_host: str
    ) -> LeaseExecutor:
        """A walled container for the machine, on stand-in GPUs: the host agent's executor with the whole
        (simulated) machine as its share."""
        assert self.containers is not None
        name = _machine_name(instance_id)
        exposed = tuple(int(p) for p in lease.get("ports") or [] if int(p) != 22)[:MAX_PORTS]
        with self._lock:
            used = {m.executor.plan.uid for m in self._machines.values() if isinstance(m.executor, LeaseExecutor)}
        uid = next(lease_uid(slot, self.uid_first) for slot in range(len(used) + 1)
                   if lease_uid(slot, self.uid_first) not in used)  # fmt: skip
        work = self._work() / name
        plan = LeasePlan(
            lease_id=name, gpu_indexes=tuple(g.index for g in gpus), host_ports=free_ports(1 + len(exposed)),
            work_dir=work, disk_quota_bytes=DISK_QUOTA_BYTES, user=user_plan("unused", work), exposed=exposed,
            authorized_keys=tuple(str(k) for k in lease.get("ssh_keys") or []), uid=uid, share=1.0,
            login_name=str(lease.get("login_user") or "lease"),
        )  # fmt: skip
        devices = FakeDevices([(g.name, g.memory_gb, g.power_limit_w) for g in gpus])
        return LeaseExecutor(plan, devices, simulate=True, ssh_host=ssh_host, disk_poll_s=None,
                             fail_workload=failure, runtime=self.containers)  # fmt: skip

    def _record(self, instance_id: str, outcome: str, detail: str = "") -> None:
        with self._lock:
            self.records.append(BootRecord(instance_id, outcome, detail))
        log.debug("boot %s: %s %s", instance_id, outcome, detail)

    def machine(self, instance_id: str) -> BootedMachine:
        with self._lock:
            return self._machines[instance_id]

    def machines(self) -> list[BootedMachine]:
        with self._lock:
            return list(self._machines.values())

    def halt(self, instance_id: str) -> None:
        """The instance is gone: stop its agent and close its sockets (a powered-off machine's container, kept
        while it was stopped, is removed now)."""
        with self._lock:
            machine = self._machines.pop(instance_id, None) or self._powered_off.pop(instance_id, None)
        if machine is not None:
            machine.stop.set()
            machine.executor.stop()

    def reset(self) -> None:
        with self._lock:
            machines = [*self._machines.values(), *self._powered_off.values()]
            self._machines, self._powered_off = {}, {}
            self.records = []
        for machine in machines:
            machine.stop.set()
            machine.executor.stop()
        if self._work_root is not None:
            shutil.rmtree(self._work_root, ignore_errors=True)
            self._work_root = None
