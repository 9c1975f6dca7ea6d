"""The ECS sandbox's stop, start and reboot: ``StopInstance``, ``StartInstance`` and ``RebootInstance``, each for
one instance named by ``InstanceId`` (ECS API reference, StopInstance,
https://www.alibabacloud.com/help/en/ecs/developer-reference/api-ecs-2014-05-26-stopinstance, and its siblings
StartInstance and RebootInstance). Every answer is ``{"RequestId"}`` alone; the status moves on as ECS moves it:
Running -> Stopping -> Stopped, Stopped -> Starting -> Running, each step seen by the next Describe call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sandboxes.alibaba import wire
from sandboxes.alibaba.state import _Instance, _Request
from sandboxes.alibaba.wire import WireError
from sandboxes.boot import Booter
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultRegistry

# StoppedMode: "KeepCharging" (standard mode: the instance type's resources and public IP kept, still billed),
# "StopCharging" (economical mode: vCPUs, memory and GPUs released and no longer billed, which a start must find
# again). Without it ECS uses the account's default, standard mode here.
STOPPED_MODES = ("KeepCharging", "StopCharging")


def _incorrect_status() -> WireError:
    # 403 IncorrectInstanceStatus, "The current status of the resource does not support this operation.": the
    # error code StopInstance, StartInstance and RebootInstance list for an instance in the wrong status.
    return WireError(
        "IncorrectInstanceStatus", "The current status of the resource does not support this operation.", 403
    )


class PowerHandlers:
    """``StopInstance``, ``StartInstance``, ``RebootInstance``, mixed into ``AlibabaSandbox``."""

    _fault_error: Callable[[Fault], WireError]
    _lock: threading.Lock
    _one_instance: Callable[[_Request], _Instance]
    booter: Booter
    faults: FaultRegistry

    def _stop_instance(self, req: _Request) -> dict[str, Any]:
        """A Running instance starts Stopping (the next look finds it Stopped); any other status is refused."""
        mode = req.params.get("StoppedMode") or "KeepCharging"
        if mode not in STOPPED_MODES:
            raise WireError("InvalidParameter", 'The specified parameter "StoppedMode" is not valid.', 400)
        wire.boolean(req.params, "ForceStop")
        with self._lock:
            instance = self._one_instance(req)
            if instance.status != "Running":
                raise _incorrect_status()
            instance.status = "Stopping"
            instance.stopped_mode = mode
        self.booter.power_off(instance.instance_id)
        return {}

    def _start_instance(self, req: _Request) -> dict[str, Any]:
        """A Stopped instance starts Starting (the next look finds it Running). One stopped in economical mode
        gave its vCPUs and GPUs back, so a start may find none in its zone: a ``capacity`` fault on
        ``StartInstance`` answers 403 ``OperationDenied.NoStock`` and the instance stays Stopped. One stopped in
        standard mode kept them and always starts."""
        with self._lock:
            instance = self._one_instance(req)
            if instance.status != "Stopped":
                raise _incorrect_status()
            released = instance.stopped_mode == "StopCharging"
        if released:
            fault = self.faults.take(req.action, (instance.instance_type,), instance.zone, kinds=OUTCOME_KINDS)
            if fault is not None:
                raise self._fault_error(fault)
        with self._lock:
            if instance.status != "Stopped":  # a concurrent start won
                raise _incorrect_status()
            instance.status = "Starting"
            instance.stopped_mode = ""
        self.booter.power_on(instance.instance_id)
        return {}

    def _reboot_instance(self, req: _Request) -> dict[str, Any]:
        """A Running instance restarts in place and is Running again; any other status is refused."""
        wire.boolean(req.params, "ForceStop")
        with self._lock:
            instance = self._one_instance(req)
            if instance.status != "Running":
                raise _incorrect_status()
        self.booter.power_off(instance.instance_id)
        self.booter.power_on(instance.instance_id)
        return {}
