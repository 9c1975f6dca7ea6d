"""The Tencent Cloud sandbox: an in-process emulator of the CVM API 3.0 (version 2017-03-12) on its real wire.

Wire: ``POST /`` with a JSON body and the headers ``X-TC-Action``, ``X-TC-Version``, ``X-TC-Region``,
``X-TC-Timestamp`` and ``Authorization: TC3-HMAC-SHA256 ...``. Every answer is HTTP 200 with
``{"Response": {..., "RequestId"}}``; errors too, as ``{"Response": {"Error": {"Code", "Message"}, "RequestId"}}``.
The real ``tencentcloud-sdk-python-cvm`` runs against it unchanged.

What it emulates:

- ``DescribeZones``, ``DescribeZoneInstanceConfigInfos`` (catalogue with CNY list prices from the seed CSV,
  SELL/SOLD_OUT per zone; a secret id put on the International site with ``set_account_site`` is answered only
  the USD prices a test set with ``set_price``, since none was sourced and CVM's answers name no currency),
  ``DescribeInstanceTypeConfigs`` (``GpuType``/``GpuMemory``), ``DescribeImages``;
- ``RunInstances``, asynchronous as on CVM: it answers with ``InstanceIdSet`` and the instance is ``PENDING``
  until ``launch_seconds`` have passed, then ``RUNNING`` or ``LAUNCH_FAILED``. Idempotent on ``ClientToken`` per
  region (the same token answers the same ids and never creates a second instance);
- what a launch carries for access (``sandboxes/tencent/access.py``): RunInstances ``UserData`` (base64,
  kept as sent and readable by DescribeInstancesAttributes), ``SystemDisk.DiskSize``, ``LoginSettings.KeyIds``
  and ``SecurityGroupIds``; CVM key pairs (``ImportKeyPair``, ``DescribeKeyPairs``, ``DeleteKeyPairs``) and, on
  the VPC API (the same version string, told apart by the signature's service ``vpc``), security groups
  (``CreateSecurityGroup``, ``CreateSecurityGroupPolicies``, ``DescribeSecurityGroups``,
  ``DescribeSecurityGroupPolicies``, ``DeleteSecurityGroup``), all taggable and found by ``tag:<key>`` filters.
  A key pair or group an instance still uses (until it is shut down) cannot be deleted. An instance boots the
  lease agent from its user data when it first runs (``self.booter``) and halts when terminated;
- ``DescribeInstances`` (ids or filters incl. ``tag:<key>``, Offset/Limit), ``DescribeInstancesStatus``,
  ``TerminateInstances`` (``TERMINATING`` for ``terminate_seconds``, then ``SHUTDOWN`` in the recycle bin for
  ``retention_seconds``, then gone; a LAUNCH_FAILED instance is recycled after ``retention_seconds`` too);
- TC3 signatures checked with the secret the sandbox knows for a secret id (``register_secret``); secret ids
  starting with ``bad`` get ``AuthFailure.SecretIdNotFound``; unknown ids are accepted unless ``strict``;
- injectable faults (``sandbox.faults``, default action ``RunInstances``): ``capacity`` makes the launch fail
  *later* (RunInstances succeeds, the instance turns LAUNCH_FAILED with the error in
  ``LatestOperationErrorMsg``) unless a ``code`` is given, which is then answered synchronously by RunInstances
  (``ResourceInsufficient.*``, ``ResourcesSoldOut.*``, ``InvalidParameterValue.InsufficientPrice``, ...);
  ``quota`` is ``LimitExceeded.InstanceQuota`` (or ``code``); ``throttle`` is ``RequestLimitExceeded``;
  ``credentials`` is ``AuthFailure.UnauthorizedOperation``; ``slow`` sleeps ``seconds`` before answering;
  ``image_missing`` (action ``image``, optionally per ``region``) makes DescribeImages find nothing, as CVM
  answers a lookup of an image the region does not have.

Use in-process: ``sandbox = start_tencent_sandbox()``; point ``HttpProfile(protocol="http",
endpoint=<host:port of sandbox.url>)`` (or ``TencentAdapter`` with ``endpoint_url=sandbox.url``) at it;
``sandbox.reset()`` between tests.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from sandboxes.faults import TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response
from sandboxes.tencent import access, auth
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.auth import DEFAULT_SECRETS
from sandboxes.tencent.catalogue import (
    ON_DEMAND,
    REGIONS,
    SEED_PATH,
    SITE_CURRENCIES,
    SPOT,
    load_seed,
    type_config_rows,
)
from sandboxes.tencent.instances import InstanceHandlers
from sandboxes.tencent.offerings import OfferingHandlers
from sandboxes.tencent.power import PowerHandlers
from sandboxes.tencent.security import SecurityHandlers
from sandboxes.tencent.state import (
    API_VERSION,
    FAULT_ERRORS,
    SERVICES,
    VPC_SERVICE,
    Call,
    LaunchRecord,
    SandboxInstance,
    _answer,
    _error,
    _Instance,
    _Request,
    _request_id,
    _Timing,
)

# --------------------------------------------------------------------------------------------- sandbox


class TencentSandbox(InstanceHandlers, PowerHandlers, SecurityHandlers, OfferingHandlers, SandboxApp):
    """The Tencent CVM sandbox WSGI app. ``start()`` serves it; ``faults`` injects failures; ``reset()`` forgets
    instances, tokens, faults, calls, registered secrets and stock changes."""

    kind = "tencent"

    def __init__(
        self,
        seed_path: Path = SEED_PATH,
        *,
        launch_seconds: float = 0.2,
        terminate_seconds: float = 0.2,
        retention_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(FaultRegistry(default_action="RunInstances"))
        self.seed = load_seed(seed_path)
        self._seed_by_key = {(r.region, r.instance_type): r for r in self.seed}
        self._seed_sold_out = {(r.region, z, r.instance_type) for r in self.seed for z in r.sold_out_zones}
        self._type_configs = type_config_rows(self.seed)
        self._timing = _Timing(launch_seconds, terminate_seconds, retention_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._instances: dict[str, _Instance] = {}
        self._sequence = itertools.count(1)
        self._tokens: dict[tuple[str, str], list[str]] = {}
        self._token_locks: dict[tuple[str, str], threading.Lock] = {}
        self._secrets: dict[str, str] = dict(DEFAULT_SECRETS)
        self._strict = False
        self._sold_out: set[tuple[str, str, str]] = set(self._seed_sold_out)
        self._sites: dict[str, str] = {}  # secret id -> site, when not DEFAULT_SITE
        self._set_prices: dict[str, dict[tuple[str, str, str], Decimal]] = {}  # currency -> (region, type, charge)
        self._key_pairs: dict[str, access.KeyPairRecord] = {}
        self._security_groups: dict[str, access.SecurityGroupRecord] = {}
        self._vpc_actions: dict[str, Callable[[_Request], dict[str, Any]]] = {
            "CreateSecurityGroup": self._create_security_group,
            "CreateSecurityGroupPolicies": self._create_security_group_policies,
            "DescribeSecurityGroups": self._describe_security_groups,
            "DescribeSecurityGroupPolicies": self._describe_security_group_policies,
            "DeleteSecurityGroup": self._delete_security_group,
        }
        self._actions: dict[str, Callable[[_Request], dict[str, Any]]] = {
            "ImportKeyPair": self._import_key_pair,
            "DescribeKeyPairs": self._describe_key_pairs,
            "DeleteKeyPairs": self._delete_key_pairs,
            "DescribeInstancesAttributes": self._describe_instances_attributes,
            "DescribeZones": self._describe_zones,
            "DescribeZoneInstanceConfigInfos": self._describe_zone_instance_config_infos,
            "DescribeInstanceTypeConfigs": self._describe_instance_type_configs,
            "DescribeImages": self._describe_images,
            "RunInstances": self._run_instances,
            "DescribeInstances": self._describe_instances,
            "DescribeInstancesStatus": self._describe_instances_status,
            "TerminateInstances": self._terminate_instances,
            "StopInstances": self._stop_instances,
            "StartInstances": self._start_instances,
            "RebootInstances": self._reboot_instances,
        }

    # -------------------------------------------------------------------------------- public helpers

    def regions(self) -> list[str]:
        return sorted({r.region for r in self.seed})

    def zones(self, region: str, instance_type: str) -> list[str]:
        """The zones that sell a seeded type now (sold-out zones excluded)."""
        row = self._seed_by_key.get((region, instance_type))
        if row is None:
            return []
        with self._lock:
            return [z for z in row.all_zones if (region, z, instance_type) not in self._sold_out]

    def on_demand_price(self, region: str, instance_type: str) -> Decimal | None:
        row = self._seed_by_key.get((region, instance_type))
        return row.on_demand if row else None

    def set_sold_out(self, region: str, zone: str, instance_type: str, sold_out: bool = True) -> None:
        """Mark a (zone, type) the seed offers as sold out (SOLD_OUT rows, RunInstances refused) or back on sale."""
        row = self._seed_by_key.get((region, instance_type))
        if row is None or zone not in row.all_zones:
            raise ValueError(f"{instance_type} is not offered in {zone}")
        with self._lock:
            if sold_out:
                self._sold_out.add((region, zone, instance_type))
            else:
                self._sold_out.discard((region, zone, instance_type))

    def set_account_site(self, secret_id: str, site: str) -> None:
        """Put the account of ``secret_id`` on a site (``SITE_CURRENCIES``): its catalogue then carries prices in
        that site's currency only. Restored to the China site by ``reset()``."""
        if site not in SITE_CURRENCIES:
            raise ValueError(f"site must be one of {sorted(SITE_CURRENCIES)}")
        with self._lock:
            self._sites[secret_id] = site

    def set_price(
        self, region: str, instance_type: str, amount: Decimal, currency: str, charge_type: str = ON_DEMAND
    ) -> None:
        """An hourly price in ``currency`` for accounts billed in it (e.g. USD), until ``reset()``."""
        if (region, instance_type) not in self._seed_by_key:
            raise ValueError(f"{instance_type} is not seeded in {region}")
        if currency not in SITE_CURRENCIES.values() or charge_type not in (ON_DEMAND, SPOT):
            raise ValueError(f"unknown currency {currency!r} or charge type {charge_type!r}")
        with self._lock:
            self._set_prices.setdefault(currency, {})[(region, instance_type, charge_type)] = amount

    def register_secret(self, secret_id: str, secret_key: str) -> None:
        """Know ``secret_key`` for ``secret_id``: its requests must then carry a valid TC3 signature."""
        with self._lock:
            self._secrets[secret_id] = secret_key

    def set_strict(self, strict: bool) -> None:
        """Strict: only registered secret ids are accepted (SecretIdNotFound for the others)."""
        with self._lock:
            self._strict = strict

    def instances(self, region: str | None = None) -> list[SandboxInstance]:
        """Every instance CVM would still describe (any state), optionally in one region."""
        self._advance()
        now = self._clock()
        with self._lock:
            self._purge(now)
            found = [
                SandboxInstance(
                    instance_id=i.instance_id,
                    region=i.region,
                    zone=i.zone,
                    instance_type=i.seed.instance_type,
                    state=self._state(i, now),
                    charge_type=i.charge_type,
                    client_token=i.client_token,
                    tags=dict(i.tags),
                )
                for i in self._instances.values()
                if region is None or i.region == region
            ]
        return sorted(found, key=lambda i: (i.region, i.instance_id))

    def launched(self, instance_id: str) -> LaunchRecord:
        """What the launch of ``instance_id`` carried, read from the sandbox's own records in CVM's and VPC's
        wire shapes: its image, ``SystemDisk``, base64 ``UserData``, the key pairs of its ``LoginSettings.KeyIds``
        and the security groups of its ``SecurityGroupIds`` with their policies. KeyError for an unknown id."""
        now = self._clock()
        with self._lock:
            instance = self._instances[instance_id]
            key_pairs = [
                self._key_pairs[k].to_json(self._key_users(k, now)) for k in instance.key_ids if k in self._key_pairs
            ]
            groups = [
                {**g.to_json(), "SecurityGroupPolicySet": g.policy_set()}
                for g in (self._security_groups.get(i) for i in instance.security_group_ids)
                if g is not None
            ]
            return LaunchRecord(
                instance_id=instance_id,
                region=instance.region,
                image_id=str(instance.image["ImageId"]),
                system_disk=dict(instance.system_disk),
                user_data=instance.user_data,
                key_pairs=key_pairs,
                security_groups=groups,
            )

    def key_pairs(self, region: str | None = None) -> list[dict[str, Any]]:
        """Every key pair the sandbox holds, as DescribeKeyPairs answers them, optionally in one region."""
        now = self._clock()
        with self._lock:
            return [
                kp.to_json(self._key_users(kp.key_id, now))
                for kp in sorted(self._key_pairs.values(), key=lambda k: k.key_id)
                if region is None or kp.region == region
            ]

    def security_groups(self, region: str | None = None) -> list[dict[str, Any]]:
        """Every security group the sandbox holds with its policies, optionally in one region."""
        with self._lock:
            return [
                {**g.to_json(), "SecurityGroupPolicySet": g.policy_set()}
                for g in sorted(self._security_groups.values(), key=lambda g: g.group_id)
                if region is None or g.region == region
            ]

    def reset(self) -> None:
        self.faults.clear()
        self.booter.reset()
        with self._lock:
            self._key_pairs.clear()
            self._security_groups.clear()
            self._instances.clear()
            self._tokens.clear()
            self._token_locks.clear()
            self.clear_calls()
            self._secrets = dict(DEFAULT_SECRETS)
            self._strict = False
            self._sold_out = set(self._seed_sold_out)
            self._sites.clear()
            self._set_prices.clear()

    def control_extra(self, request: Request, route: str) -> Response | None:
        body = request.get_json(force=True, silent=True) or {}
        if route == "credentials" and request.method in ("PUT", "POST"):
            if "secret_id" in body:
                self.register_secret(str(body["secret_id"]), str(body["secret_key"]))
            if "strict" in body:
                self.set_strict(bool(body["strict"]))
            with self._lock:
                return json_response({"secret_ids": sorted(self._secrets), "strict": self._strict})
        if route == "stock" and request.method in ("PUT", "POST"):
            self.set_sold_out(
                str(body["region"]), str(body["zone"]), str(body["instance_type"]), bool(body.get("sold_out", True))
            )
            return json_response({"sold_out": bool(body.get("sold_out", True))})
        if route == "calls" and request.method == "GET":
            return json_response({"calls": [[c.action, c.region] for c in self.calls()]})
        if route == "key_pairs" and request.method == "GET":
            return json_response({"key_pairs": self.key_pairs()})
        if route == "security_groups" and request.method == "GET":
            return json_response({"security_groups": self.security_groups()})
        if route == "instances" and request.method == "GET":
            rows = [{"instance_id": i.instance_id, "region": i.region, "state": i.state} for i in self.instances()]
            return json_response({"instances": rows})
        return None

    # -------------------------------------------------------------------------------------- routing

    def handle(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        request_id = _request_id()
        try:
            response = self._dispatch(request, request_id)
        except ApiError as exc:
            response = _error(exc.code, exc.message, request_id)
        return response(environ, start_response)

    def _dispatch(self, http: Request, request_id: str) -> Response:
        body = http.get_data(cache=False)
        action = http.headers.get("X-TC-Action", "")
        region = http.headers.get("X-TC-Region", "")
        authorization = auth.parse_authorization(http.headers.get("Authorization", ""))
        if http.method != "POST" or http.path != "/":
            raise ApiError("UnsupportedProtocol", "The sandbox answers POST / with a JSON body only.")
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            raise ApiError("InvalidParameter", "The request body is not JSON.") from None
        if not isinstance(params, dict):
            raise ApiError("InvalidParameter", "The request body must be a JSON object.")
        # Logged before any check, so tests can assert that a refused request still reached the "provider".
        request = self._describe_request(action, region, authorization, params, request_id)
        with self._lock:
            self.record_call(Call(action, region, request.secret_id, request.instance_types, request.zone))
        if not action:
            raise ApiError("MissingParameter", "The X-TC-Action header is missing.")
        if http.headers.get("X-TC-Version", "") != API_VERSION:
            raise ApiError("NoSuchVersion", f"The API version must be {API_VERSION}.")
        self._authenticate(http, authorization, body)
        # Transport faults act before the API looks at the request, like a gateway's throttling would.
        fault = self._transport_fault(request)
        if fault is not None:
            raise self._fault_error(fault, request)
        actions = self._vpc_actions if authorization and authorization.service == VPC_SERVICE else self._actions
        if action not in actions:
            raise ApiError("InvalidAction", f"The action {action} is not supported by the sandbox.")
        if region not in REGIONS:
            raise ApiError("UnsupportedRegion", f"The region {region or '(none)'} is not supported.")
        # Instances that began running since the last request boot before this one is answered, and again after
        # it, so an answer that shows RUNNING always finds the machine booted.
        self._advance()
        answer = actions[action](request)
        self._advance()
        return _answer(answer, request_id)

    @staticmethod
    def _describe_request(
        action: str, region: str, authorization: auth.Authorization | None, params: dict[str, Any], request_id: str
    ) -> _Request:
        """The request with the instance types and zone that faults match on."""
        types: list[str] = []
        if isinstance(params.get("InstanceType"), str):
            types.append(params["InstanceType"])
        zone = (params.get("Placement") or {}).get("Zone") if isinstance(params.get("Placement"), dict) else None
        for item in params.get("Filters") or []:
            if isinstance(item, dict) and item.get("Name") == "instance-type":
                types.extend(str(v) for v in item.get("Values") or [])
            if isinstance(item, dict) and item.get("Name") == "zone" and item.get("Values"):
                zone = zone or str(item["Values"][0])
        return _Request(
            action=action,
            region=region,
            secret_id=authorization.secret_id if authorization else "",
            params=params,
            request_id=request_id,
            instance_types=tuple(types),
            zone=str(zone) if zone else None,
        )

    def _authenticate(self, http: Request, authorization: auth.Authorization | None, body: bytes) -> None:
        if authorization is None:
            raise ApiError("AuthFailure.SignatureFailure", "The Authorization header is missing or not TC3.")
        secret_id = authorization.secret_id
        with self._lock:
            secret = self._secrets.get(secret_id)
            strict = self._strict
        # The id is checked before the signature, as on Tencent: an unknown id says nothing about the key.
        if secret_id.startswith("bad") or (secret is None and strict):
            raise ApiError("AuthFailure.SecretIdNotFound", "The SecretId is not found, please ensure it exists.")
        timestamp = http.headers.get("X-TC-Timestamp", "")
        problem = auth.timestamp_problem(authorization, timestamp, time.time())
        if problem is not None:
            raise ApiError(*problem)
        if authorization.service not in SERVICES:
            raise ApiError("AuthFailure.SignatureFailure", "The credential scope service must be cvm or vpc.")
        if secret is None:
            return  # an unregistered id (not strict): the sandbox cannot know its key, so it trusts the id
        signed = auth.SignedRequest(
            method=http.method,
            path=http.path,
            query=http.query_string.decode("latin-1"),
            headers={k.lower(): v for k, v in http.headers.items()},
            body=body,
            timestamp=timestamp,
        )
        if not auth.matches(secret, authorization, signed):
            raise ApiError(
                "AuthFailure.SignatureFailure",
                "The provided credentials could not be validated. Please check your signature is correct.",
            )

    def _transport_fault(self, request: _Request) -> Fault | None:
        fault = self.faults.take(request.action, request.instance_types, request.zone, kinds=TRANSPORT_KINDS)
        if fault is not None and fault.kind is FaultKind.SLOW:
            self.faults.sleep(fault.seconds)
            fault = self.faults.take(
                request.action, request.instance_types, request.zone, kinds={FaultKind.THROTTLE, FaultKind.CREDENTIALS}
            )
        return fault

    @staticmethod
    def _fault_error(fault: Fault, request: _Request) -> ApiError:
        code, template = FAULT_ERRORS[fault.kind]
        if fault.code:
            code, template = fault.code, "Sandbox fault {code} for {instance_type} in {zone}."
        return ApiError(
            code, template.format(code=code, instance_type=",".join(request.instance_types) or "-", zone=request.zone)
        )


def start_tencent_sandbox(host: str = "127.0.0.1", port: int = 0, **options: Any) -> TencentSandbox:
    """Build a ``TencentSandbox`` (``options`` go to its constructor) and serve it on a daemon thread."""
    sandbox = TencentSandbox(**options)
    sandbox.start(host, port)
    return sandbox
