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

import base64
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request, Response

from sandboxes.boot import simulated_gpus
from sandboxes.faults import IMAGE_ACTION, OUTCOME_KINDS, TRANSPORT_KINDS, Fault, FaultKind, FaultRegistry
from sandboxes.server import SandboxApp, StartResponse, WSGIEnviron, json_response
from sandboxes.tencent import access, auth
from sandboxes.tencent.access import ApiError
from sandboxes.tencent.auth import DEFAULT_SECRETS
from sandboxes.tencent.catalogue import (
    DEFAULT_SITE,
    ON_DEMAND,
    PUBLIC_IMAGES,
    REGIONS,
    SEED_CURRENCY,
    SEED_PATH,
    SITE_CURRENCIES,
    SPOT,
    SeedPrice,
    load_seed,
    quota_rows,
    type_config_rows,
)

API_VERSION = "2017-03-12"  # CVM's and VPC's version alike
SERVICE = "cvm"
VPC_SERVICE = "vpc"
SERVICES = frozenset({SERVICE, VPC_SERVICE})
ORDERING_TIMEOUT = 30.0  # how long a same-token request waits for the first one before giving up
_INSTANCE_ID = re.compile(r"^ins-[a-z0-9]{8}$")
_IMAGE_ID = re.compile(r"^img-[a-z0-9]{8}$")
# RunInstances UserData: "base64-encoded, at most 16 KB" (https://cloud.tencent.com/document/api/213/15730),
# counted on the encoded field as the broker's pre-check counts it. Over it: InvalidParameterValue.TooLong.
USER_DATA_MAX_BYTES = 16 * 1024
# SystemDisk.DiskSize: the reference documents only the 50 GB default; an invalid size is answered
# InvalidParameterValue "The value `N` specified in the parameter `SystemDisk.DiskSize` is not valid", as the
# API answered in tencentcloud-sdk-python issue #7. The range kept here is the adapter's (20 GB public images).
SYSTEM_DISK_DEFAULT_GB = 50
SYSTEM_DISK_MAX_GB = 16384
DISK_TYPES = frozenset(
    {"LOCAL_BASIC", "LOCAL_SSD", "CLOUD_BASIC", "CLOUD_SSD", "CLOUD_PREMIUM", "CLOUD_BSSD", "CLOUD_HSSD", "CLOUD_TSSD"}
)
# "An instance can be bound to at most 5 security groups" (CVM error LimitExceeded.AssociateUSGLimitExceeded).
SECURITY_GROUPS_PER_INSTANCE = 5
DEFAULT_SECURITY_GROUP = "sg-sbx00001"
RELEASED_STATES = frozenset({"LAUNCH_FAILED", "SHUTDOWN"})  # no longer holding key pairs or security groups

# What each fault kind answers on the CVM wire: (code, message template).
FAULT_ERRORS: dict[FaultKind, tuple[str, str]] = {
    FaultKind.CAPACITY: (
        "ResourceInsufficient.SpecifiedInstanceType",
        "The specified instance type {instance_type} is out of stock in {zone}.",
    ),
    FaultKind.QUOTA: (
        "LimitExceeded.InstanceQuota",
        "The number of pay-as-you-go instances would exceed the quota of the account in {zone}.",
    ),
    FaultKind.THROTTLE: ("RequestLimitExceeded", "Your current request frequency is too high, please retry later."),
    FaultKind.CREDENTIALS: (
        "AuthFailure.UnauthorizedOperation",
        "The request has not been authorized by CAM for this operation.",
    ),
}


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class SandboxInstance:
    """An instance as the sandbox holds it (for tests asserting what was, or was not, launched)."""

    instance_id: str
    region: str
    zone: str
    instance_type: str
    state: str
    charge_type: str
    client_token: str
    tags: dict[str, str]

    @property
    def holds_resources(self) -> bool:
        """False once the instance holds no capacity and bills nothing: launch failed, or terminated."""
        return self.state not in ("LAUNCH_FAILED", "SHUTDOWN")


@dataclass(frozen=True, slots=True)
class Call:
    """One API request the sandbox received, before faults were applied."""

    action: str
    region: str
    secret_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(slots=True)
class _Instance:
    instance_id: str
    uuid: str
    sequence: int
    region: str
    zone: str
    seed: SeedPrice
    charge_type: str
    image: dict[str, Any]
    name: str
    tags: dict[str, str]
    client_token: str
    created_at: datetime
    private_ip: str
    run_request_id: str
    ready_at: float
    failure: tuple[str, str] | None = None
    terminate_at: float | None = None
    terminate_request_id: str = ""
    user_data: str | None = None  # base64, as RunInstances received it
    system_disk: dict[str, Any] = field(default_factory=dict)
    key_ids: list[str] = field(default_factory=list)
    security_group_ids: list[str] = field(default_factory=list)
    booted: bool = False


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """What a launch carried, as the sandbox keeps it in CVM's wire format (for tests reading it back)."""

    instance_id: str
    region: str
    image_id: str
    system_disk: dict[str, Any]
    user_data: str | None
    key_pairs: list[dict[str, Any]]
    security_groups: list[dict[str, Any]]


@dataclass(slots=True)
class _Request:
    action: str
    region: str
    secret_id: str
    params: dict[str, Any]
    request_id: str
    instance_types: tuple[str, ...] = ()
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class _Carried:
    user_data: str | None
    system_disk: dict[str, Any]
    key_ids: tuple[str, ...]
    security_group_ids: tuple[str, ...]


@dataclass(slots=True)
class _Timing:
    launch_seconds: float
    terminate_seconds: float
    retention_seconds: float


def _request_id() -> str:
    return str(uuid.uuid4())


def _answer(payload: dict[str, Any], request_id: str) -> Response:
    body = json.dumps({"Response": {**payload, "RequestId": request_id}}, ensure_ascii=False)
    return Response(body, status=200, mimetype="application/json")


def _error(code: str, message: str, request_id: str) -> Response:
    # Tencent answers errors with HTTP 200; the SDK finds them by the Error key.
    return _answer({"Error": {"Code": code, "Message": message}}, request_id)


def _int(params: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError("InvalidParameterValue", f"{key} must be an integer")
    if not low <= value <= high:
        raise ApiError("InvalidParameterValue.Range", f"{key} must be between {low} and {high}")
    return value


def _string_list(params: dict[str, Any], key: str, limit: int) -> list[str]:
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ApiError("InvalidParameter", f"{key} must be a list of strings")
    if len(value) > limit:
        raise ApiError("InvalidParameterValue.LimitExceeded", f"{key} takes at most {limit} values")
    return value


def _filters(
    params: dict[str, Any], allowed: Sequence[str], *, max_filters: int, max_values: int, tags: bool = False
) -> list[tuple[str, set[str]]]:
    """``Filters`` as (name, values); AND across filters, OR within one, as the CVM API applies them."""
    raw = params.get("Filters") or []
    if not isinstance(raw, list):
        raise ApiError("InvalidParameter", "Filters must be a list")
    if len(raw) > max_filters:
        raise ApiError("InvalidParameterValue.LimitExceeded", f"at most {max_filters} Filters per request")
    result: list[tuple[str, set[str]]] = []
    for item in raw:
        name = str((item or {}).get("Name") or "")
        values = (item or {}).get("Values") or []
        if name not in allowed and not (tags and name.startswith("tag:") and len(name) > 4):
            raise ApiError("InvalidFilter", f"The filter {name!r} is not supported.")
        if not isinstance(values, list) or not values:
            raise ApiError("InvalidParameter", f"Filter {name!r} needs Values")
        if len(values) > max_values:
            raise ApiError("InvalidFilterValue.LimitExceeded", f"Filter {name!r} takes at most {max_values} values")
        result.append((name, {str(v) for v in values}))
    return result


def _matches(fields: Mapping[str, Iterable[str]], filters: list[tuple[str, set[str]]]) -> bool:
    return all(any(value in wanted for value in fields.get(name, ())) for name, wanted in filters)


# --------------------------------------------------------------------------------------------- sandbox


class TencentSandbox(SandboxApp):
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

    # ------------------------------------------------------------------------------------------ reads

    def _describe_zones(self, request: _Request) -> dict[str, Any]:
        zones = [
            {"Zone": z.name, "ZoneName": z.label, "ZoneId": z.zone_id, "ZoneState": "AVAILABLE"}
            for z in REGIONS[request.region]
        ]
        return {"TotalCount": len(zones), "ZoneSet": zones}

    def _describe_zone_instance_config_infos(self, request: _Request) -> dict[str, Any]:
        filters = _filters(
            request.params,
            ("zone", "instance-family", "instance-type", "instance-charge-type", "sort-keys"),
            max_filters=10,
            max_values=100,
        )
        filters = [(name, values) for name, values in filters if name != "sort-keys"]
        with self._lock:
            sold_out = set(self._sold_out)
            currency = SITE_CURRENCIES[self._sites.get(request.secret_id, DEFAULT_SITE)]
            prices = None if currency == SEED_CURRENCY else dict(self._set_prices.get(currency, {}))
        rows = [
            row
            for region, row in quota_rows(self.seed, sold_out, prices)
            if region == request.region
            and _matches(
                {
                    "zone": [row["Zone"]],
                    "instance-family": [row["InstanceFamily"]],
                    "instance-type": [row["InstanceType"]],
                    "instance-charge-type": [row["InstanceChargeType"]],
                },
                filters,
            )
        ]
        return {"InstanceTypeQuotaSet": rows}

    def _describe_instance_type_configs(self, request: _Request) -> dict[str, Any]:
        # CVM takes a single value per filter here (its documentation: "Filter.Values的上限为1").
        filters = _filters(request.params, ("zone", "instance-family", "instance-type"), max_filters=10, max_values=1)
        rows = [
            row
            for region, row in self._type_configs
            if region == request.region
            and _matches(
                {
                    "zone": [row["Zone"]],
                    "instance-family": [row["InstanceFamily"]],
                    "instance-type": [row["InstanceType"]],
                },
                filters,
            )
        ]
        return {"InstanceTypeConfigSet": rows}

    def _describe_images(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "ImageIds", 100)
        filters = _filters(
            params, ("image-id", "image-type", "image-name", "platform"), max_filters=10, max_values=5, tags=True
        )
        if ids and filters:
            raise ApiError(
                "InvalidParameter.InvalidParameterCoexistImageIdsFilters", "ImageIds and Filters are exclusive."
            )
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        instance_type = params.get("InstanceType")
        types = [instance_type] if isinstance(instance_type, str) else []
        missing = self.faults.take(IMAGE_ACTION, types, None, kinds={FaultKind.IMAGE_MISSING}, region=request.region)
        if missing is not None:
            # CVM answers a lookup of an image the region lacks with an empty set, not an error.
            return {"TotalCount": 0, "ImageSet": []}
        found = []
        for image in PUBLIC_IMAGES:
            if ids and image["ImageId"] not in ids:
                continue
            fields = {"image-id": [image["ImageId"]], "image-type": [image["ImageType"]]}
            ok = _matches(fields, [(n, v) for n, v in filters if n in fields])
            # image-name and platform match fuzzily (a substring, any case), as CVM documents them.
            for name, key in (("image-name", "ImageName"), ("platform", "Platform")):
                for fname, wanted in filters:
                    if fname == name and not any(w.lower() in str(image[key]).lower() for w in wanted):
                        ok = False
            if any(n.startswith("tag:") for n, _ in filters):
                ok = False  # public images carry no tags
            if ok:
                found.append(image)
        return {"TotalCount": len(found), "ImageSet": found[offset : offset + limit]}

    def _describe_instances(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "InstanceIds", 100)
        filters = _filters(
            params,
            (
                "zone",
                "instance-id",
                "instance-state",
                "instance-charge-type",
                "instance-name",
                "instance-type",
                "tag-key",
                "tag-value",
            ),
            max_filters=10,
            max_values=5,
            tags=True,
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "InstanceIds and Filters cannot be specified together.")
        for instance_id in ids:
            if not _INSTANCE_ID.match(instance_id):
                raise ApiError("InvalidInstanceId.Malformed", f"The instance id {instance_id} is malformed.")
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = [
                i
                for i in sorted(self._instances.values(), key=lambda i: i.sequence)
                if i.region == request.region
                and (not ids or i.instance_id in ids)
                and _matches(self._filter_fields(i, now), filters)
            ]
            page = [self._instance_json(i, now) for i in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "InstanceSet": page}

    def _describe_instances_status(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "InstanceIds", 100)
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen = [
                i
                for i in sorted(self._instances.values(), key=lambda i: i.sequence)
                if i.region == request.region and (not ids or i.instance_id in ids)
            ]
            statuses = [
                {"InstanceId": i.instance_id, "InstanceState": self._state(i, now)}
                for i in chosen[offset : offset + limit]
            ]
        return {"TotalCount": len(chosen), "InstanceStatusSet": statuses}

    # ----------------------------------------------------------------------------------------- writes

    def _run_instances(self, request: _Request) -> dict[str, Any]:
        params = request.params
        token = params.get("ClientToken") or ""
        if not isinstance(token, str):
            raise ApiError("InvalidParameter", "ClientToken must be a string")
        if len(token.encode()) > 64:
            raise ApiError("InvalidClientToken.TooLong", "The ClientToken must be at most 64 bytes.")
        if not token:
            return {"InstanceIdSet": self._create(request)}
        key = (request.region, token)
        with self._lock:
            token_lock = self._token_locks.setdefault(key, threading.Lock())
        # Same-token requests are serialised: the second waits for the first, then answers its ids.
        if not token_lock.acquire(timeout=ORDERING_TIMEOUT):
            raise ApiError("InternalError", "A request with the same ClientToken is still in progress.")
        try:
            with self._lock:
                stored = self._tokens.get(key)
            # The token is looked up before any validation or fault: a retry of an accepted request must get the
            # accepted answer even if the zone has sold out since.
            if stored is not None:
                return {"InstanceIdSet": list(stored)}
            ids = self._create(request)
            with self._lock:
                self._tokens[key] = ids
            return {"InstanceIdSet": ids}
        finally:
            token_lock.release()

    def _create(self, request: _Request) -> list[str]:
        """Validate a RunInstances request, apply outcome faults and create its instances (PENDING)."""
        params = request.params
        charge = params.get("InstanceChargeType") or ON_DEMAND
        if charge not in (ON_DEMAND, SPOT):
            raise ApiError("InvalidParameterValue", "The sandbox sells POSTPAID_BY_HOUR and SPOTPAID instances only.")
        placement = params.get("Placement")
        zone = str(placement.get("Zone") or "") if isinstance(placement, dict) else ""
        instance_type = str(params.get("InstanceType") or "")
        image_id = str(params.get("ImageId") or "")
        for name, value in (("Placement.Zone", zone), ("InstanceType", instance_type), ("ImageId", image_id)):
            if not value:
                raise ApiError("MissingParameter", f"The parameter {name} is required.")
        count = _int(params, "InstanceCount", 1, 1, 100)
        if zone not in {z.name for z in REGIONS[request.region]}:
            raise ApiError("InvalidZone.MismatchRegion", f"The zone {zone} is not in {request.region}.")
        if not _IMAGE_ID.match(image_id):
            raise ApiError("InvalidImageId.Malformed", f"The image id {image_id} is malformed.")
        image = next((i for i in PUBLIC_IMAGES if i["ImageId"] == image_id), None)
        if image is None:
            raise ApiError("InvalidImageId.NotFound", f"The image {image_id} is not found.")
        seed = self._seed_by_key.get((request.region, instance_type))
        if seed is None:
            if not any(r.instance_type == instance_type for r in self.seed):
                raise ApiError("InvalidParameterValue.InstanceTypeNotFound", f"{instance_type} does not exist.")
            raise ApiError("ResourceUnavailable.InstanceType", f"{instance_type} is not sold in {request.region}.")
        if zone not in seed.all_zones:
            raise ApiError("ResourceUnavailable.InstanceType", f"{instance_type} is not sold in {zone}.")
        if charge == SPOT:
            self._check_spot(seed, params)
        carried = self._launch_fields(request, image)
        with self._lock:
            sold_out = (request.region, zone, instance_type) in self._sold_out
        if sold_out:
            raise ApiError(
                "ResourceInsufficient.ZoneSoldOutForSpecifiedInstance", f"{instance_type} is sold out in {zone}."
            )
        if params.get("DryRun"):
            raise ApiError("DryRunOperation", "The request would have succeeded, but DryRun was set.")

        failure: tuple[str, str] | None = None
        fail_after = self._timing.launch_seconds
        fault = self.faults.take("RunInstances", [instance_type], zone, kinds=OUTCOME_KINDS)
        if fault is not None:
            if fault.kind is FaultKind.CAPACITY and not fault.code:
                # CVM's own stock-out shape: the request is accepted and the instance fails to launch later.
                code, template = FAULT_ERRORS[FaultKind.CAPACITY]
                failure = (code, f"{code}: " + template.format(instance_type=instance_type, zone=zone))
                fail_after = fault.seconds or fail_after
            else:
                raise self._fault_error(fault, request)

        tags: dict[str, str] = {}
        # Only instance tags matter here; other resource types (disks, images) are not emulated.
        for spec in params.get("TagSpecification") or []:
            if isinstance(spec, dict) and spec.get("ResourceType") == "instance":
                tags.update({str(t["Key"]): str(t.get("Value") or "") for t in spec.get("Tags") or []})
        now = self._clock()
        created = datetime.now(UTC).replace(microsecond=0)
        name = str(params.get("InstanceName") or "未命名")
        ids: list[str] = []
        with self._lock:
            for _ in range(count):
                sequence = next(self._sequence)
                instance_id = self._new_id()
                self._instances[instance_id] = _Instance(
                    instance_id=instance_id,
                    uuid=str(uuid.uuid4()),
                    sequence=sequence,
                    region=request.region,
                    zone=zone,
                    seed=seed,
                    charge_type=charge,
                    image=image,
                    name=name if count == 1 else f"{name}{len(ids) + 1}",
                    tags=dict(tags),
                    client_token=str(params.get("ClientToken") or ""),
                    created_at=created,
                    private_ip=f"10.{sorted(REGIONS).index(request.region)}.{sequence // 250}.{sequence % 250 + 2}",
                    run_request_id=request.request_id,
                    ready_at=now + (fail_after if failure else self._timing.launch_seconds),
                    failure=failure,
                    user_data=carried.user_data,
                    system_disk=dict(carried.system_disk),
                    key_ids=list(carried.key_ids),
                    security_group_ids=list(carried.security_group_ids),
                )
                ids.append(instance_id)
        return ids

    def _launch_fields(self, request: _Request, image: dict[str, Any]) -> _Carried:
        """RunInstances' access fields, checked as CVM checks them: ``UserData``, ``SystemDisk``,
        ``LoginSettings.KeyIds`` (key pairs of this region) and ``SecurityGroupIds`` (groups of this region)."""
        params = request.params
        user_data = None
        if params.get("UserData") is not None:
            user_data = access.decode_user_data(params["UserData"], USER_DATA_MAX_BYTES)
        disk = params.get("SystemDisk") or {}
        if not isinstance(disk, dict):
            raise ApiError("InvalidParameter", "SystemDisk must be an object.")
        size = disk.get("DiskSize", SYSTEM_DISK_DEFAULT_GB)
        smallest = int(image.get("ImageSize") or 1)
        if isinstance(size, bool) or not isinstance(size, int) or not smallest <= size <= SYSTEM_DISK_MAX_GB:
            raise ApiError(
                "InvalidParameterValue",
                f"The value `{size}` specified in the parameter `SystemDisk.DiskSize` is not valid.",
            )
        disk_type = str(disk.get("DiskType") or "CLOUD_PREMIUM")
        if disk_type not in DISK_TYPES:
            raise ApiError("InvalidParameterValue", f"The disk type {disk_type} is not valid.")
        login = params.get("LoginSettings") or {}
        if not isinstance(login, dict):
            raise ApiError("InvalidParameter", "LoginSettings must be an object.")
        key_ids = _string_list(login, "KeyIds", 100)
        if key_ids and login.get("Password"):
            raise ApiError("InvalidParameterCombination", "LoginSettings takes a password or key pairs, not both.")
        groups = _string_list(params, "SecurityGroupIds", 100)
        if len(groups) > SECURITY_GROUPS_PER_INSTANCE:
            raise ApiError(
                "LimitExceeded.AssociateUSGLimitExceeded",
                f"An instance can be bound to at most {SECURITY_GROUPS_PER_INSTANCE} security groups.",
            )
        with self._lock:
            for key_id in key_ids:
                if not access.KEY_ID.match(key_id):
                    raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
                known = self._key_pairs.get(key_id)
                if known is None or known.region != request.region:
                    raise ApiError("InvalidParameterValue.KeyPairNotFound", f"The key pair {key_id} does not exist.")
            for group_id in groups:
                known_group = self._security_groups.get(group_id)
                if known_group is None or known_group.region != request.region:
                    raise ApiError("InvalidSecurityGroupId.NotFound", f"The security group {group_id} does not exist.")
        return _Carried(
            user_data=user_data,
            system_disk={"DiskType": disk_type, "DiskSize": size},
            key_ids=tuple(key_ids),
            security_group_ids=tuple(groups),
        )

    @staticmethod
    def _check_spot(seed: SeedPrice, params: dict[str, Any]) -> None:
        if seed.spot is None:
            # The seed has no sourced spot price for any Tencent type, so none is offered (or invented).
            raise ApiError(
                "UnsupportedOperation.NoInstanceTypeSupportSpot", f"{seed.instance_type} is not sold as spot."
            )
        market = params.get("InstanceMarketOptions") or {}
        raw = (market.get("SpotOptions") or {}).get("MaxPrice")
        try:
            bid = Decimal(str(raw)) if raw not in (None, "") else None
        except InvalidOperation:
            raise ApiError("InvalidParameterValue", f"MaxPrice {raw!r} is not a number.") from None
        if bid is not None and bid < seed.spot:
            raise ApiError("InvalidParameterValue.InsufficientPrice", f"The bid {bid} is below the spot price.")

    def _terminate_instances(self, request: _Request) -> dict[str, Any]:
        ids = _string_list(request.params, "InstanceIds", 100)
        if not ids:
            raise ApiError("MissingParameter", "The parameter InstanceIds is required.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            chosen: list[_Instance] = []
            for instance_id in ids:
                if not _INSTANCE_ID.match(instance_id):
                    raise ApiError("InvalidInstanceId.Malformed", f"The instance id {instance_id} is malformed.")
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != request.region:
                    raise ApiError("InvalidInstanceId.NotFound", f"The instance {instance_id} is not found.")
                state = self._state(instance, now)
                if state == "TERMINATING":
                    raise ApiError("UnsupportedOperation.InstanceStateTerminating", f"{instance_id} is terminating.")
                if state == "SHUTDOWN":
                    raise ApiError("UnsupportedOperation.InstanceStateShutdown", f"{instance_id} is shut down.")
                chosen.append(instance)
            for instance in chosen:
                instance.terminate_at = now
                instance.terminate_request_id = request.request_id
        for instance in chosen:
            self.booter.halt(instance.instance_id)
        return {}

    # ----------------------------------------------------------------------------------- key pairs (CVM)

    def _import_key_pair(self, request: _Request) -> dict[str, Any]:
        params = request.params
        name = access.check_key_name(params.get("KeyName"))
        project = params.get("ProjectId")
        if project is None:
            raise ApiError("MissingParameter", "The parameter ProjectId is required.")
        if isinstance(project, bool) or not isinstance(project, int):
            raise ApiError("InvalidParameterValue", "ProjectId must be an integer.")
        public_key = access.check_rsa_public_key(params.get("PublicKey"))
        tags = access.spec_tags(params, "keypair")
        with self._lock:
            mine = [k for k in self._key_pairs.values() if k.region == request.region]
            if any(k.name == name for k in mine):
                raise ApiError("InvalidKeyPairName.Duplicate", f"The key pair name {name} already exists.")
            if any(access.key_body(k.public_key) == access.key_body(public_key) for k in mine):
                raise ApiError("InvalidPublicKey.Duplicate", "The public key has already been imported.")
            key_id = self._new_resource_id("skey-", self._key_pairs)
            self._key_pairs[key_id] = access.KeyPairRecord(
                key_id=key_id,
                region=request.region,
                name=name,
                project_id=project,
                public_key=public_key,
                created_at=datetime.now(UTC).replace(microsecond=0),
                tags=tags,
            )
        return {"KeyId": key_id}

    def _describe_key_pairs(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "KeyIds", 100)
        filters = _filters(
            params, ("project-id", "key-name", "tag-key", "tag-value"), max_filters=10, max_values=5, tags=True
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "KeyIds and Filters cannot be specified together.")
        for key_id in ids:
            if not access.KEY_ID.match(key_id):
                raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
        offset = _int(params, "Offset", 0, 0, 1_000_000)
        limit = _int(params, "Limit", 20, 1, 100)
        now = self._clock()
        with self._lock:
            chosen = [
                k
                for k in sorted(self._key_pairs.values(), key=lambda k: (k.created_at, k.key_id))
                if k.region == request.region
                and (not ids or k.key_id in ids)
                and _matches(
                    self._tag_fields(k.tags, {"project-id": [str(k.project_id)], "key-name": [k.name]}), filters
                )
            ]
            page = [k.to_json(self._key_users(k.key_id, now)) for k in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "KeyPairSet": page}

    def _delete_key_pairs(self, request: _Request) -> dict[str, Any]:
        ids = _string_list(request.params, "KeyIds", access.KEY_IDS_PER_REQUEST)
        if not ids:
            raise ApiError("MissingParameter", "The parameter KeyIds is required.")
        now = self._clock()
        with self._lock:
            for key_id in ids:
                if not access.KEY_ID.match(key_id):
                    raise ApiError("InvalidKeyPairId.Malformed", f"The key pair id {key_id} is malformed.")
                known = self._key_pairs.get(key_id)
                if known is None or known.region != request.region:
                    raise ApiError("InvalidKeyPairId.NotFound", f"The key pair {key_id} does not exist.")
                if self._key_users(key_id, now):
                    raise ApiError(
                        "InvalidParameterValue.KeyPairNotSupported",
                        f"The key pair {key_id} is bound to an instance and cannot be deleted.",
                    )
            for key_id in ids:
                del self._key_pairs[key_id]
        return {}

    def _key_users(self, key_id: str, now: float) -> list[str]:
        """Instances still bound to the key pair (caller locks)."""
        return [
            i.instance_id
            for i in sorted(self._instances.values(), key=lambda i: i.sequence)
            if key_id in i.key_ids and self._state(i, now) not in RELEASED_STATES
        ]

    def _describe_instances_attributes(self, request: _Request) -> dict[str, Any]:
        attributes = _string_list(request.params, "Attributes", 10)
        ids = _string_list(request.params, "InstanceIds", 100)
        if attributes != ["UserData"]:
            raise ApiError("InvalidParameterValue", "Attributes takes UserData.")
        now = self._clock()
        with self._lock:
            self._purge(now)
            found = []
            for instance_id in ids:
                instance = self._instances.get(instance_id)
                if instance is None or instance.region != request.region:
                    raise ApiError("InvalidInstanceId.NotFound", f"The instance {instance_id} is not found.")
                found.append({"InstanceId": instance_id, "Attributes": {"UserData": instance.user_data}})
        return {"InstanceSet": found}

    # ---------------------------------------------------------------------------- security groups (VPC)

    def _create_security_group(self, request: _Request) -> dict[str, Any]:
        params = request.params
        name, description = access.check_group_fields(params)
        tags = access.tags_from(params.get("Tags"), "Tags")
        now = datetime.now(UTC).replace(microsecond=0)
        with self._lock:
            group_id = self._new_resource_id("sg-", self._security_groups)
            group = access.SecurityGroupRecord(
                group_id=group_id,
                region=request.region,
                name=name,
                description=description,
                project_id=str(params.get("ProjectId") or "0"),
                created_at=now,
                updated_at=now,
                tags=tags,
            )
            self._security_groups[group_id] = group
            return {"SecurityGroup": group.to_json()}

    def _group(self, request: _Request) -> access.SecurityGroupRecord:
        """The request's ``SecurityGroupId`` in its region (caller locks)."""
        group_id = request.params.get("SecurityGroupId")
        if not isinstance(group_id, str) or not group_id:
            raise ApiError("MissingParameter", "The parameter SecurityGroupId is required.")
        if not access.GROUP_ID.match(group_id):
            raise ApiError("InvalidSecurityGroupID.Malformed", f"The security group id {group_id} is malformed.")
        group = self._security_groups.get(group_id)
        if group is None or group.region != request.region:
            raise ApiError("InvalidSecurityGroupID.NotFound", f"The security group {group_id} does not exist.")
        return group

    def _create_security_group_policies(self, request: _Request) -> dict[str, Any]:
        policy_set = request.params.get("SecurityGroupPolicySet")
        if not isinstance(policy_set, dict):
            raise ApiError("MissingParameter", "The parameter SecurityGroupPolicySet is required.")
        given = [d for d in access.DIRECTIONS if policy_set.get(d)]
        if len(given) != 1:
            raise ApiError("InvalidParameter", "Create the rules of one direction (Ingress or Egress) per request.")
        direction = given[0]
        raw = policy_set[direction]
        if not isinstance(raw, list):
            raise ApiError("InvalidParameter", f"{direction} must be a list.")
        policies = [access.check_policy(p) for p in raw]
        with self._lock:
            group = self._group(request)
            if len(group.ingress) + len(group.egress) + len(policies) > access.POLICIES_PER_GROUP:
                raise ApiError(
                    "LimitExceeded.SecurityGroupPolicySet",
                    f"A security group holds at most {access.POLICIES_PER_GROUP} rules.",
                )
            (group.ingress if direction == "Ingress" else group.egress).extend(policies)
            group.version += 1
            group.updated_at = datetime.now(UTC).replace(microsecond=0)
        return {}

    def _describe_security_groups(self, request: _Request) -> dict[str, Any]:
        params = request.params
        ids = _string_list(params, "SecurityGroupIds", 100)
        filters = _filters(
            params,
            ("security-group-id", "project-id", "security-group-name", "tag-key"),
            max_filters=10,
            max_values=5,
            tags=True,
        )
        if ids and filters:
            raise ApiError("InvalidParameterCombination", "SecurityGroupIds and Filters cannot be specified together.")
        # VPC types Offset and Limit as strings (the SDK's DescribeSecurityGroupsRequest).
        paging = {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in params.items()}
        offset = _int(paging, "Offset", 0, 0, 1_000_000)
        limit = _int(paging, "Limit", 20, 1, 100)
        with self._lock:
            chosen = [
                g
                for g in sorted(self._security_groups.values(), key=lambda g: (g.created_at, g.group_id))
                if g.region == request.region
                and (not ids or g.group_id in ids)
                and _matches(
                    self._tag_fields(
                        g.tags,
                        {
                            "security-group-id": [g.group_id],
                            "project-id": [g.project_id],
                            "security-group-name": [g.name],
                        },
                    ),
                    filters,
                )
            ]
            page = [g.to_json() for g in chosen[offset : offset + limit]]
        return {"TotalCount": len(chosen), "SecurityGroupSet": page}

    def _describe_security_group_policies(self, request: _Request) -> dict[str, Any]:
        with self._lock:
            return {"SecurityGroupPolicySet": self._group(request).policy_set()}

    def _delete_security_group(self, request: _Request) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            group = self._group(request)
            if self._group_users(group.group_id, now):
                raise ApiError("ResourceInUse", f"The security group {group.group_id} is bound to an instance.")
            del self._security_groups[group.group_id]
        return {}

    def _group_users(self, group_id: str, now: float) -> list[str]:
        """Instances still in the security group (caller locks)."""
        return [
            i.instance_id
            for i in self._instances.values()
            if group_id in i.security_group_ids and self._state(i, now) not in RELEASED_STATES
        ]

    @staticmethod
    def _tag_fields(tags: Mapping[str, str], fields: dict[str, list[str]]) -> dict[str, Iterable[str]]:
        found: dict[str, Iterable[str]] = {**fields, "tag-key": list(tags), "tag-value": list(tags.values())}
        for key, value in tags.items():
            found[f"tag:{key}"] = [value]
        return found

    @staticmethod
    def _new_resource_id(prefix: str, taken: Mapping[str, Any]) -> str:
        while True:
            candidate = prefix + uuid.uuid4().hex[:8]
            if candidate not in taken:
                return candidate

    # ------------------------------------------------------------------------------------- booting

    def _advance(self) -> None:
        """Boot every instance that has begun running since it was last looked at, from its user data."""
        now = self._clock()
        starting: list[_Instance] = []
        with self._lock:
            for instance in self._instances.values():
                if not instance.booted and self._state(instance, now) == "RUNNING":
                    instance.booted = True
                    starting.append(instance)
        for instance in starting:
            seed = instance.seed
            self.booter.boot(
                instance_id=instance.instance_id,
                user_data=base64.b64decode(instance.user_data) if instance.user_data else None,
                gpus=simulated_gpus(seed.gpu_key, seed.gpu_count, seed.gpu_memory_gb),
                instance_type=seed.instance_type,
                zone=instance.zone,
            )

    # ------------------------------------------------------------------------------------ instances

    def _new_id(self) -> str:
        while True:
            candidate = "ins-" + uuid.uuid4().hex[:8]
            if candidate not in self._instances:
                return candidate

    def _state(self, instance: _Instance, now: float) -> str:
        # States are computed from timestamps when asked for: no background thread, and a test clock moves them.
        timing = self._timing
        if instance.terminate_at is not None:
            return "TERMINATING" if now < instance.terminate_at + timing.terminate_seconds else "SHUTDOWN"
        if now < instance.ready_at:
            return "PENDING"
        return "LAUNCH_FAILED" if instance.failure else "RUNNING"

    def _purge(self, now: float) -> None:
        """Forget what CVM no longer describes: recycled launch failures and terminated instances (caller locks)."""
        timing = self._timing
        gone = []
        for instance in self._instances.values():
            if instance.terminate_at is not None:
                until = instance.terminate_at + timing.terminate_seconds + timing.retention_seconds
            elif instance.failure is not None:
                until = instance.ready_at + timing.retention_seconds
            else:
                continue
            if now >= until:
                gone.append(instance.instance_id)
        for instance_id in gone:
            del self._instances[instance_id]

    def _filter_fields(self, instance: _Instance, now: float) -> dict[str, Iterable[str]]:
        fields: dict[str, Iterable[str]] = {
            "zone": [instance.zone],
            "instance-id": [instance.instance_id],
            "instance-state": [self._state(instance, now)],
            "instance-charge-type": [instance.charge_type],
            "instance-name": [instance.name],
            "instance-type": [instance.seed.instance_type],
            "tag-key": list(instance.tags),
            "tag-value": list(instance.tags.values()),
        }
        for key, value in instance.tags.items():
            fields[f"tag:{key}"] = [value]
        return fields

    def _instance_json(self, instance: _Instance, now: float) -> dict[str, Any]:
        """An ``Instance`` as DescribeInstances answers it (the fields the SDK model defines that matter here)."""
        state = self._state(instance, now)
        if instance.terminate_at is not None:
            operation, request_id = "TerminateInstances", instance.terminate_request_id
            operation_state = "OPERATING" if state == "TERMINATING" else "SUCCESS"
            error_message = None
        else:
            operation, request_id = "RunInstances", instance.run_request_id
            operation_state = {"PENDING": "OPERATING", "LAUNCH_FAILED": "FAILED"}.get(state, "SUCCESS")
            error_message = instance.failure[1] if instance.failure and state == "LAUNCH_FAILED" else None
        seed = instance.seed
        return {
            "Placement": {"Zone": instance.zone, "ProjectId": 0},
            "InstanceId": instance.instance_id,
            "InstanceType": seed.instance_type,
            "CPU": seed.vcpus,
            "Memory": seed.memory_gib,
            "RestrictState": "NORMAL",
            "InstanceName": instance.name,
            "InstanceChargeType": instance.charge_type,
            "SystemDisk": {
                "DiskType": instance.system_disk.get("DiskType", "CLOUD_PREMIUM"),
                "DiskId": "disk-" + instance.instance_id[4:],
                "DiskSize": instance.system_disk.get("DiskSize", SYSTEM_DISK_DEFAULT_GB),
            },
            "DataDisks": None,
            "PrivateIpAddresses": [instance.private_ip],
            "PublicIpAddresses": None,  # no InternetAccessible bandwidth was bought
            "InternetAccessible": {"InternetChargeType": "", "InternetMaxBandwidthOut": 0, "PublicIpAssigned": False},
            "VirtualPrivateCloud": {"VpcId": "vpc-sbx00001", "SubnetId": "subnet-sbx00001", "AsVpcGateway": False},
            "ImageId": instance.image["ImageId"],
            "RenewFlag": None,
            "CreatedTime": instance.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ExpiredTime": None,
            "OsName": instance.image["OsName"],
            "SecurityGroupIds": list(instance.security_group_ids) or [DEFAULT_SECURITY_GROUP],
            "LoginSettings": {"KeyIds": list(instance.key_ids) or None},
            "InstanceState": state,
            "Tags": [{"Key": k, "Value": v} for k, v in sorted(instance.tags.items())],
            "StopChargingMode": "NOT_APPLICABLE",
            "Uuid": instance.uuid,
            "LatestOperation": operation,
            "LatestOperationState": operation_state,
            "LatestOperationRequestId": request_id,
            "LatestOperationErrorMsg": error_message,
            "IsolatedSource": "NOTISOLATED",
            "GPUInfo": {"GPUCount": float(seed.gpu_count), "GPUId": [], "GPUType": seed.gpu_type},
            "LicenseType": "TencentCloud",
            "DisableApiTermination": False,
            "DefaultLoginUser": "ubuntu",
            "DefaultLoginPort": 22,
        }


def start_tencent_sandbox(host: str = "127.0.0.1", port: int = 0, **options: Any) -> TencentSandbox:
    """Build a ``TencentSandbox`` (``options`` go to its constructor) and serve it on a daemon thread."""
    sandbox = TencentSandbox(**options)
    sandbox.start(host, port)
    return sandbox
