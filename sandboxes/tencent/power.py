"""The CVM sandbox's stop, start and reboot: ``StopInstances``, ``StartInstances`` and ``RebootInstances``, each for
up to 100 ``InstanceIds`` and answered with ``{"RequestId"}`` alone (CVM API reference, StopInstances,
https://www.tencentcloud.com/document/api/213/33235, StartInstances, https://www.tencentcloud.com/document/api/213/33236,
RebootInstances, https://www.tencentcloud.com/document/api/213/33243). The state then moves as CVM moves it,
computed from timestamps like the rest of the sandbox: RUNNING -> STOPPING -> STOPPED, STOPPED -> STARTING ->
RUNNING, RUNNING -> REBOOTING -> RUNNING, each ``power_seconds`` long.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sandboxes.boot import Booter
from sandboxes.faults import OUTCOME_KINDS, Fault, FaultRegistry
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.state import _INSTANCE_ID, _Instance, _Request, _string_list

# StoppedMode: KEEP_CHARGING keeps the instance's resources (and bills them); STOP_CHARGING ("no charges when shut
# down", pay-as-you-go only) releases its CPU and memory, which a start must then find again.
STOPPED_MODES = ("KEEP_CHARGING", "STOP_CHARGING")
STOP_TYPES = ("SOFT", "HARD", "SOFT_FIRST")
# The state each action needs, and the actions' names on the instance's LatestOperation.
NEEDS = {"stop": "RUNNING", "start": "STOPPED", "reboot": "RUNNING"}


def state_refusal(instance_id: str, state: str) -> ApiError:
    """CVM's refusal of an instance in the wrong state: ``UnsupportedOperation.InstanceState<State>``
    (``InstanceStateStopped``, ``InstanceStateRunning``, ...), one code per state in CVM's error code list."""
    words = "".join(part.capitalize() for part in state.split("_"))
    return ApiError(f"UnsupportedOperation.InstanceState{words}", f"The instance {instance_id} is {state}.")


class PowerHandlers:
    """The power actions, mixed into ``TencentSandbox``."""

    _clock: Callable[[], float]
    _fault_error: Callable[[Fault, _Request], ApiError]
    _instances: dict[str, _Instance]
    _lock: threading.Lock
    _purge: Callable[[float], None]
    _state: Callable[[_Instance, float], str]
    booter: Booter
    faults: FaultRegistry

    def _chosen(self, request: _Request, action: str, now: float) -> list[_Instance]:
        """Every named instance, all in the state ``action`` needs, or the first refusal (caller holds the lock):
        one CVM request acts on all of its instances or on none."""
        ids = _string_list(request.params, "InstanceIds", 100)
        if not ids:
            raise ApiError("MissingParameter", "The parameter InstanceIds is required.")
        chosen: list[_Instance] = []
        for instance_id in ids:
            if not _INSTANCE_ID.match(instance_id):
                raise ApiError("InvalidInstanceId.Malformed", f"The instance id {instance_id} is malformed.")
            instance = self._instances.get(instance_id)
            if instance is None or instance.region != request.region:
                raise ApiError("InvalidInstanceId.NotFound", f"The instance {instance_id} is not found.")
            state = self._state(instance, now)
            if state != NEEDS[action]:
                raise state_refusal(instance_id, state)
            chosen.append(instance)
        return chosen

    def _begin(self, instances: list[_Instance], action: str, now: float, request: _Request) -> None:
        for instance in instances:
            instance.power_action, instance.power_at, instance.power_request_id = action, now, request.request_id

    def _stop_instances(self, request: _Request) -> dict[str, Any]:
        mode = request.params.get("StoppedMode") or "KEEP_CHARGING"
        if mode not in STOPPED_MODES:
            raise ApiError("InvalidParameterValue", f"StoppedMode {mode!r} is not one of {', '.join(STOPPED_MODES)}.")
        stop_type = request.params.get("StopType")
        if stop_type is not None and stop_type not in STOP_TYPES:
            raise ApiError("InvalidParameterValue", f"StopType {stop_type!r} is not one of {', '.join(STOP_TYPES)}.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = self._chosen(request, "stop", now)
            if mode == "STOP_CHARGING" and any(i.charge_type != "POSTPAID_BY_HOUR" for i in chosen):
                raise ApiError(
                    "UnsupportedOperation.StoppedModeStopCharging",
                    "Only pay-as-you-go instances can be stopped without charges.",
                )
            self._begin(chosen, "stop", now, request)
            for instance in chosen:
                instance.stopped_mode = mode
        for instance in chosen:
            self.booter.power_off(instance.instance_id)
        return {}

    def _start_instances(self, request: _Request) -> dict[str, Any]:
        """A start of an instance stopped without charges must find CPU and memory again: a ``capacity`` fault on
        ``StartInstances`` refuses it with ``ResourceInsufficient.SpecifiedInstanceType`` and it stays STOPPED. One
        stopped while still charged kept its resources and always starts."""
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = self._chosen(request, "start", now)
        for instance in chosen:
            if instance.stopped_mode != "STOP_CHARGING":
                continue
            placed = _Request(request.action, request.region, request.secret_id, request.params, request.request_id,
                              (instance.seed.instance_type,), instance.zone)  # fmt: skip
            fault = self.faults.take(request.action, placed.instance_types, instance.zone, kinds=OUTCOME_KINDS)
            if fault is not None:
                raise self._fault_error(fault, placed)
        with self._lock:
            chosen = self._chosen(request, "start", now)  # a concurrent start may have won meanwhile
            self._begin(chosen, "start", now, request)
            for instance in chosen:
                instance.stopped_mode = ""
        for instance in chosen:
            self.booter.power_on(instance.instance_id)
        return {}

    def _reboot_instances(self, request: _Request) -> dict[str, Any]:
        stop_type = request.params.get("StopType")
        if stop_type is not None and stop_type not in STOP_TYPES:
            raise ApiError("InvalidParameterValue", f"StopType {stop_type!r} is not one of {', '.join(STOP_TYPES)}.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = self._chosen(request, "reboot", now)
            self._begin(chosen, "reboot", now, request)
        for instance in chosen:
            self.booter.power_off(instance.instance_id)
            self.booter.power_on(instance.instance_id)
        return {}
