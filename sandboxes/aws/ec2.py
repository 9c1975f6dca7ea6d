"""The AWS sandbox's EC2 and SSM: requests forwarded to moto behind the refusals EC2 makes and moto does not,
``RunInstances`` idempotent on ``ClientToken`` and booting what it launched, injected outcomes, and SSM's
``GetParameter`` for the Deep Learning AMI ids.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from werkzeug.wrappers import Response

from sandboxes.aws import launch as aws_launch
from sandboxes.aws import power as aws_power
from sandboxes.aws.placement import ACTIONS as PLACEMENT_ACTIONS
from sandboxes.aws.placement import PlacementGroups
from sandboxes.aws.state import (
    _FILTER_VALUE,
    EC2_FAULTS,
    FILTER_VALUES_MAX,
    SSM_FAULTS,
    STATIC_ACTIONS,
    _ec2_error,
    _json_error,
    _Request,
    _Stored,
)
from sandboxes.boot import Booter
from sandboxes.faults import IMAGE_ACTION, OUTCOME_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import WSGIEnviron


class Ec2Handlers:
    """EC2's and SSM's actions, mixed into ``AwsSandbox``."""

    _dirty_regions: set[str]
    _fault_response: Callable[[Fault, _Request, dict[FaultKind, tuple[str, int, str]]], Response]
    _lock: threading.Lock
    _moto: DomainDispatcherApplication
    _spot: dict[tuple[str, str, str], Decimal]
    _spot_history: Callable[[_Request], Response]
    _static_cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[bytes, str, list[tuple[str, str]]]]
    _token_locks: dict[tuple[str, str], threading.Lock]
    _tokens: dict[tuple[str, str], _Stored]
    _transport_fault: Callable[[_Request], Fault | None]
    booter: Booter
    faults: FaultRegistry
    key_accepted: Callable[[str], bool]
    placement_groups: PlacementGroups

    def _ec2(self, environ: WSGIEnviron, request: _Request) -> Response:
        if not self.key_accepted(request.access_key):
            return _ec2_error("AuthFailure", EC2_FAULTS[FaultKind.CREDENTIALS][2], 401)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, EC2_FAULTS)
        if request.action == "DescribeSpotPriceHistory":
            return self._spot_history(request)
        if request.action == "RunInstances":
            return self._run_instances(environ, request)
        if request.action in PLACEMENT_ACTIONS:
            answer = self.placement_groups.answer(request.action, request.region, request.params)
            if len(answer) == 3:
                return _ec2_error(*answer)
            return Response(answer[0], status=answer[1], mimetype="text/xml")
        if request.action in aws_power.ACTIONS:
            return self._power(environ, request)
        refusal = self._boot_refusal(request)
        if refusal is not None:
            return _ec2_error(*refusal)
        values = sum(1 for key in request.params if _FILTER_VALUE.match(key))
        if values > FILTER_VALUES_MAX:
            message = f"The maximum number of filter values specified on a single call is {FILTER_VALUES_MAX}"
            return _ec2_error("FilterLimitExceeded", message, 400)
        response = self._forward(environ, request)
        if request.action == "TerminateInstances" and response.status_code == 200:
            for instance_id in aws_launch.terminated_ids(request.params):
                self.booter.halt(instance_id)
        return response

    def _power(self, environ: WSGIEnviron, request: _Request) -> Response:
        """Stop, start or reboot through moto, after EC2's refusals and a start's capacity fault (matched on the
        instance's type and zone); the booted machine is powered off and on with the instance."""
        refusal = aws_power.refusal(request.action, request.region, request.params)
        if refusal is not None:
            return _ec2_error(*refusal)
        instance_ids = aws_power.named(request.params)
        if request.action == "StartInstances":
            types, zone = aws_power.placement(request.region, instance_ids)
            placed = _Request(request.service, request.action, request.region, request.access_key, request.body,
                              request.params, request.payload, types, zone)  # fmt: skip
            fault = self.faults.take(request.action, types, zone, kinds=OUTCOME_KINDS)
            if fault is not None:
                return self._fault_response(fault, placed, EC2_FAULTS)
        response = self._forward(environ, request)
        if response.status_code != 200:
            return response
        for instance_id in instance_ids:
            if request.action == "StopInstances":
                self.booter.power_off(instance_id)
            elif request.action == "StartInstances":
                self.booter.power_on(instance_id)
            else:
                self.booter.power_off(instance_id)
                self.booter.power_on(instance_id)
        return response

    def _boot_refusal(self, request: _Request) -> aws_launch.Refusal | None:
        """EC2's refusals that moto does not make, for the requests a booted launch and its release send."""
        params = request.params
        if request.action == "DescribeImages":
            image_ids = aws_launch.indexed(params, "ImageId")
            if image_ids and self._image_missing(request):
                return ("InvalidAMIID.NotFound", f"The image id '[{', '.join(image_ids)}]' does not exist", 400)
        if request.action == "AuthorizeSecurityGroupIngress":
            return aws_launch.ingress_refusal(request.region, params)
        if request.action == "DeleteSecurityGroup" and params.get("GroupId"):
            return aws_launch.group_in_use(request.region, params["GroupId"])
        return None

    def _image_missing(self, request: _Request) -> bool:
        """An ``image_missing`` fault for this lookup: the region then has no such image."""
        fault = self.faults.take(
            IMAGE_ACTION, request.instance_types, request.zone, kinds={FaultKind.IMAGE_MISSING}, region=request.region
        )
        return fault is not None

    def _forward(self, environ: WSGIEnviron, request: _Request) -> Response:
        cache_key = None
        if request.action in STATIC_ACTIONS:
            # moto rebuilds its fixed catalogue on every call (~0.7 s a region); the real API answers fast.
            cache_key = (request.region, tuple(sorted((k, v) for k, v in request.params.items())))
            with self._lock:
                cached = self._static_cache.get(cache_key)
            if cached is not None:
                return Response(cached[0], status=cached[1], headers=cached[2])
        response = self._forward_to_moto(environ, request)
        if cache_key is not None and response.status_code == 200:
            with self._lock:
                self._static_cache[cache_key] = (response.get_data(), response.status, list(response.headers.items()))
        return response

    def _forward_to_moto(self, environ: WSGIEnviron, request: _Request) -> Response:
        env = dict(environ)
        env["wsgi.input"] = io.BytesIO(request.body)
        env["CONTENT_LENGTH"] = str(len(request.body))
        captured: dict[str, Any] = {}
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return chunks.append

        result = self._moto(env, start_response)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not request.action.startswith(("Describe", "Get", "List")):
            with self._lock:
                self._dirty_regions.add(request.region)
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        return Response(b"".join(chunks), status=captured["status"], headers=headers)

    def _run_instances(self, environ: WSGIEnviron, request: _Request) -> Response:
        token = request.params.get("ClientToken", "")
        if not token:
            return self._outcome(request) or self._booted(request, self._forward(environ, request))
        key = (request.region, token)
        fingerprint = tuple(sorted((k, v) for k, v in request.params.items() if k != "ClientToken"))
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first and then gets its answer.
        with token_lock:
            with self._lock:
                stored = self._tokens.get(key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    return _ec2_error(
                        "IdempotentParameterMismatch",
                        "Arguments on this idempotent request are inconsistent with arguments used in previous "
                        "request(s).",
                        400,
                    )
                return Response(stored.body, status=stored.status, headers=stored.headers)
            response = self._outcome(request)
            if response is not None:
                return response
            response = self._forward(environ, request)
            if response.status_code == 200:
                with self._lock:
                    self._tokens[key] = _Stored(
                        fingerprint, response.status, list(response.headers.items()), response.get_data()
                    )
            return self._booted(request, response)

    def _booted(self, request: _Request, response: Response) -> Response:
        """moto's instances run as soon as they exist: each joins the placement group its launch named, and
        boots from the user data its launch carried."""
        if response.status_code != 200:
            return response
        group = request.params.get("Placement.GroupName")
        if group:
            launched = aws_launch.launched_instance_ids(response.get_data())
            self.placement_groups.joined(request.region, group, launched)
        user_data = aws_launch.decoded_user_data(request.params)
        instance_type = request.params.get("InstanceType", "")
        for instance_id in aws_launch.launched_instance_ids(response.get_data()):
            self.booter.boot(
                instance_id=instance_id,
                user_data=user_data,
                gpus=aws_launch.instance_gpus(instance_type),
                instance_type=instance_type,
                zone=aws_launch.instance_zone(request.region, instance_id),
            )
        return response

    def _outcome(self, request: _Request) -> Response | None:
        """EC2's parameter refusals, then capacity/quota faults and the spot price check: what AWS decides after
        accepting the request."""
        image_missing = bool(request.params.get("ImageId")) and self._image_missing(request)
        refusal = aws_launch.run_instances_refusal(request.region, request.params, image_missing)
        refusal = refusal or self.placement_groups.launch_refusal(request.region, request.params)
        if refusal is not None:
            return _ec2_error(*refusal)
        fault = self.faults.take(request.action, request.instance_types, request.zone, kinds=OUTCOME_KINDS)
        if fault is not None:
            return self._fault_response(fault, request, EC2_FAULTS)
        if request.params.get("InstanceMarketOptions.MarketType") == "spot":
            max_price = request.params.get("InstanceMarketOptions.SpotOptions.MaxPrice")
            current = self._spot.get((request.region, request.params.get("InstanceType", ""), request.zone or ""))
            if max_price and current is not None and Decimal(max_price) < current:
                return _ec2_error(
                    "SpotMaxPriceTooLow",
                    f"Your Spot request price of {max_price} is lower than the minimum required Spot request "
                    f"fulfillment price of {current}.",
                    400,
                )
        return None

    def _ssm(self, environ: WSGIEnviron, request: _Request) -> Response:
        """Systems Manager: the DLAMI's public parameter answered here (so ``image_missing`` faults reach it),
        every other request answered by moto."""
        if not self.key_accepted(request.access_key):
            code, status, message = SSM_FAULTS[FaultKind.CREDENTIALS]
            return _json_error(code, message, status)
        fault = self._transport_fault(request)
        if fault is not None:
            return self._fault_response(fault, request, SSM_FAULTS)
        name = request.payload.get("Name")
        if request.action == "GetParameter" and name == aws_launch.DLAMI_PARAMETER:
            if self._image_missing(request):
                # GetParameter's error for a name the region does not have: ParameterNotFound, HTTP 400 (SSM
                # API reference, https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetParameter.html).
                return _json_error("ParameterNotFound", f"Parameter {name} not found.", 400)
            value = aws_launch.ensure_dlami(request.region)
            answer = aws_launch.parameter_answer(name, value, request.region)
            return Response(json.dumps(answer), content_type="application/x-amz-json-1.1")
        return self._forward_to_moto(environ, request)
