"""Launch configurations: what a buyer's machine runs and who may reach it, validated into one immutable row.

A configuration, as the API and the storefront take it (every field optional)::

    {"image": "ami-0abc...",                        # the buyer's own image; absent: the cloud's GPU-ready default
     "workload": {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "command": [...], "args": [...],
                  "env": [{"name": "MODEL", "value": "..."}, {"name": "HF_TOKEN", "value": "...", "secret": true}],
                  "ports": [8000], "shm_size_gb": 16,
                  "registry": {"server": "ghcr.io", "username": "me", "password": "..."}}
              | {"kind": "script", "script": "#!/bin/bash\\n...", "env": [...]}
              | {"kind": "none"},                     # the default: just the machine
     "disk_gb": 200,
     "ports": [8888],                                # more inbound ports; 22 (SSH) is always open
     "allowed_cidrs": ["203.0.113.0/24"],            # who may reach the ports; absent: the caller's address only
     "ssh_keys": ["<key id>", ...],                  # absent: every key of the organisation
     "spend_cap_usd": "50",                          # stop the machine once the order has cost this much
     "on_silence": "keep"}                           # the agent stopped reporting: keep it, or "replace" it

Secret values (env marked secret, the registry password) are kept apart, encrypted; they are never
ledgered, logged, sent in webhooks or shown in any answer after the one that created them. The ledger
records ``sha256``, a salted commitment to the whole configuration, secrets included.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets as random_secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from ledger.canonical import canonical_bytes, sha256_hex
from marketplace.launch.keys import ssh_key_list
from marketplace.models import LaunchConfiguration, LaunchTemplate, Organization, SshKey
from providers.launch import IngressRule, WorkloadKind
from providers.secrets import decrypt_secret, encrypt_secret
from providers.sshkeys import SshKeyInvalid, SshPublicKey, ssh_key_parse
from providers.text import name_problem, storable_problem
from untrusted.jsonbody import bounded_json

SSH_PORT = 22
MAX_PORTS = 16
MAX_CIDRS = 16
MAX_ENV = 64
MAX_ENV_VALUE = 8192
# The stored secret env as JSON: json.dumps writes a non-ASCII character as a 6-character \uXXXX escape.
MAX_ENV_JSON = MAX_ENV * 6 * (MAX_ENV_VALUE + 256)
MAX_ARGS = 64
MAX_ARG = 4096
MAX_SCRIPT = 256 * 1024  # above every cloud's user data limit: each adapter then applies its own
DISK_GB_MIN, DISK_GB_MAX = 10, 16384
SHM_GB_MAX = 1024
SPEND_CAP_MAX = Decimal("1000000")
FIELDS = frozenset(
    {"image", "workload", "disk_gb", "ports", "allowed_cidrs", "ssh_keys", "spend_cap_usd", "on_silence"}
)
# What a running order does once its agent has been silent ``BROKER_LEASE_SILENCE_S``: it is degraded either
# way; "keep" leaves the machine to come back, "replace" terminates it and fails over to the next offer.
ON_SILENCE_KEEP, ON_SILENCE_REPLACE = "keep", "replace"
ON_SILENCE = (ON_SILENCE_KEEP, ON_SILENCE_REPLACE)
WORKLOAD_FIELDS = {
    WorkloadKind.NONE: frozenset({"kind"}),
    WorkloadKind.CONTAINER: frozenset({"kind", "image", "command", "args", "env", "ports", "shm_size_gb", "registry"}),
    WorkloadKind.SCRIPT: frozenset({"kind", "script", "env"}),
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Names the agent sets for the workload itself (its GPUs and ports), names the NVIDIA container runtime acts on
# (NVIDIA_VISIBLE_DEVICES and its siblings choose the devices a container gets) and the broker's own: a buyer's
# value there would be overwritten on one machine and obeyed on another, so it is refused instead.
RESERVED_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "LEASE_PORTS"})
RESERVED_ENV_PREFIXES = ("NVIDIA_", "LEASE_PORT_", "BROKER_", "GPU_BROKER_")
_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
_REGISTRY = re.compile(r"^[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$")


class LaunchConfigInvalid(ValueError):
    """A configuration that cannot be accepted; ``fields`` maps each wrong field to what is wrong with it."""

    code = "invalid_launch"

    def __init__(self, fields: Mapping[str, str]):
        self.fields = dict(fields)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.fields.items()))


@dataclass(frozen=True)
class LaunchChoice:
    """How an order, a quote or a procurement names its configuration: inline (``data``) or a template's name
    or id (``template``); neither: the defaults. ``caller_address`` is where the request came from, the
    default for who may reach the machine."""

    data: Mapping[str, Any] | None = None
    template: str | None = None
    caller_address: str | None = None


class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def add(self, field: str, message: str) -> None:
        self.fields.setdefault(field, message)


def _int(value: Any, field: str, low: int, high: int, errors: _Errors) -> int | None:
    # A bool is an int to Python, and a string of a million digits is slow to convert: refuse both first.
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(field, f"a whole number from {low} to {high}")
        return None
    if not low <= value <= high:
        errors.add(field, f"{value} is not between {low} and {high}")
        return None
    return value


def _str(value: Any, field: str, limit: int, errors: _Errors, *, allow_newline: bool = True) -> str | None:
    if not isinstance(value, str):
        errors.add(field, "a string")
        return None
    if len(value) > limit:
        errors.add(field, f"at most {limit} characters ({len(value)} given)")
        return None
    if problem := storable_problem(value):
        errors.add(field, problem)
        return None
    if not allow_newline and ("\n" in value or "\r" in value):
        errors.add(field, "no line breaks")
        return None
    return value


def _str_list(value: Any, field: str, errors: _Errors) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ARGS:
        errors.add(field, f"a list of at most {MAX_ARGS} strings")
        return []
    out = []
    for index, item in enumerate(value):
        text = _str(item, f"{field}[{index}]", MAX_ARG, errors)
        if text is not None:
            out.append(text)
    return out


def _ports(value: Any, field: str, errors: _Errors) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_PORTS:
        errors.add(field, f"a list of at most {MAX_PORTS} port numbers")
        return []
    ports = []
    for index, item in enumerate(value):
        port = _int(item, f"{field}[{index}]", 1, 65535, errors)
        if port == SSH_PORT:
            errors.add(f"{field}[{index}]", "22 is the machine's SSH, always open to the allowed addresses")
        elif port is not None:
            ports.append(port)
    return sorted(set(ports))


def _env(value: Any, field: str, errors: _Errors) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(the env as stored: secret entries without their value, the secret values by name).

    A value is data: the agent hands it to the workload unchanged (a process environment, Docker's
    ``--env-file``), never to a shell, so quotes, ``$``, backticks, spaces and non-ASCII arrive as given. What
    cannot travel that way is refused here, naming the field: NUL (no environment can hold it), CR or LF (the
    env file is one line per variable), and text that is not UTF-8 (a lone surrogate)."""
    if value is None:
        return [], {}
    if isinstance(value, dict):  # {"NAME": "value"} is accepted too, none of it secret
        value = [{"name": k, "value": v} for k, v in value.items()]
    if not isinstance(value, list) or len(value) > MAX_ENV:
        errors.add(field, f"a list of at most {MAX_ENV} {{name, value, secret}} objects")
        return [], {}
    stored: list[dict[str, Any]] = []
    secret_values: dict[str, str] = {}
    seen: set[str] = set()
    for index, item in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(item, dict) or set(item) - {"name", "value", "secret"}:
            errors.add(where, "an object with name, value and optionally secret")
            continue
        name = item.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            errors.add(f"{where}.name", "letters, digits and _, not starting with a digit")
            continue
        if name.upper() in RESERVED_ENV_NAMES or name.upper().startswith(RESERVED_ENV_PREFIXES):
            errors.add(f"{where}.name", f"{name} is set by the machine's agent or GPU runtime, not by the buyer")
            continue
        if name in seen:
            errors.add(f"{where}.name", f"{name} is set twice")
            continue
        seen.add(name)
        text = _str(item.get("value", ""), f"{where}.value", MAX_ENV_VALUE, errors, allow_newline=False)
        secret = item.get("secret", False)
        if not isinstance(secret, bool):
            errors.add(f"{where}.secret", "true or false")
            continue
        if text is None:
            continue
        if secret:
            stored.append({"name": name, "secret": True})
            secret_values[name] = text
        else:
            stored.append({"name": name, "value": text})
    return stored, secret_values


def _workload(value: Any, errors: _Errors) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the workload as stored, its secrets)."""
    if value is None:
        return {"kind": WorkloadKind.NONE.value}, {}
    if not isinstance(value, dict):
        errors.add("launch.workload", "an object with a kind: none, container or script")
        return {"kind": WorkloadKind.NONE.value}, {}
    try:
        kind = WorkloadKind(str(value.get("kind", WorkloadKind.NONE)))
    except ValueError:
        errors.add("launch.workload.kind", "none, container or script")
        return {"kind": WorkloadKind.NONE.value}, {}
    unknown = sorted(set(value) - WORKLOAD_FIELDS[kind])
    if unknown:
        errors.add(f"launch.workload.{unknown[0]}", f"not a field of a {kind.value} workload")
    stored: dict[str, Any] = {"kind": kind.value}
    secret: dict[str, Any] = {}
    if kind is WorkloadKind.NONE:
        return stored, secret
    env, secret_env = _env(value.get("env"), "launch.workload.env", errors)
    stored["env"] = env
    if secret_env:
        secret["env"] = secret_env
    if kind is WorkloadKind.SCRIPT:
        script = _str(value.get("script"), "launch.workload.script", MAX_SCRIPT, errors)
        if script is not None and not script.strip():
            errors.add("launch.workload.script", "the script is empty")
        stored["script"] = script or ""
        return stored, secret
    image = value.get("image")
    if not isinstance(image, str) or not _IMAGE_REF.match(image):
        errors.add("launch.workload.image", "a container image reference, e.g. nvcr.io/nvidia/pytorch:24.10-py3")
    stored["image"] = image if isinstance(image, str) else ""
    stored["command"] = _str_list(value.get("command"), "launch.workload.command", errors)
    stored["args"] = _str_list(value.get("args"), "launch.workload.args", errors)
    stored["ports"] = _ports(value.get("ports"), "launch.workload.ports", errors)
    if value.get("shm_size_gb") is not None:
        stored["shm_size_gb"] = _int(value["shm_size_gb"], "launch.workload.shm_size_gb", 1, SHM_GB_MAX, errors)
    registry = value.get("registry")
    if registry is not None:
        if not isinstance(registry, dict) or set(registry) - {"server", "username", "password"}:
            errors.add("launch.workload.registry", "an object with server, username and password")
        else:
            server = registry.get("server", "")
            if not isinstance(server, str) or (server and not _REGISTRY.match(server)):
                errors.add("launch.workload.registry.server", "a registry host name, e.g. ghcr.io")
            username = _str(registry.get("username"), "launch.workload.registry.username", 255, errors)
            password = _str(registry.get("password"), "launch.workload.registry.password", 4096, errors)
            if username is not None and password is not None:
                stored["registry"] = {"server": server, "username": username}
                secret["registry_password"] = password
    return stored, secret


def _cidrs(value: Any, caller_address: str | None, errors: _Errors) -> list[str]:
    if value is None:
        if not caller_address:
            errors.add("launch.allowed_cidrs", "name who may reach the machine (no caller address to default to)")
            return []
        try:
            address = ipaddress.ip_address(caller_address)
        except ValueError:
            errors.add("launch.allowed_cidrs", "name who may reach the machine (the caller's address is unknown)")
            return []
        return [str(ipaddress.ip_network(f"{address}/{address.max_prefixlen}"))]
    if not isinstance(value, list) or not value or len(value) > MAX_CIDRS:
        errors.add("launch.allowed_cidrs", f"a list of 1 to {MAX_CIDRS} address ranges, e.g. 203.0.113.0/24")
        return []
    out: list[str] = []
    for index, item in enumerate(value):
        try:
            if not isinstance(item, str) or len(item) > 64:
                raise ValueError
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            errors.add(f"launch.allowed_cidrs[{index}]", "an IPv4 or IPv6 address range, e.g. 203.0.113.0/24")
    return sorted(set(out))


def _keys(value: Any, keys: Sequence[SshKey], workload: str, errors: _Errors) -> list[dict[str, Any]]:
    by_id = {str(k.public_id): k for k in keys}
    if value is None:
        chosen = list(keys)
    elif not isinstance(value, list) or len(value) > 32:
        errors.add("launch.ssh_keys", "a list of your SSH key ids")
        return []
    else:
        chosen = []
        for index, item in enumerate(value):
            key = by_id.get(str(item)) if isinstance(item, str) else None
            if key is None:
                errors.add(f"launch.ssh_keys[{index}]", "no such SSH key in this organisation")
            else:
                chosen.append(key)
    if not chosen and workload == WorkloadKind.NONE:
        errors.add(
            "launch.ssh_keys",
            "a machine without a workload needs an SSH key to be of use: add one (/api/v1/ssh-keys) and name it",
        )
    unique = {k.fingerprint: k for k in chosen}
    return [
        {"id": str(k.public_id), "name": k.name, "key_type": k.key_type, "fingerprint": k.fingerprint,
         "public_key": k.public_key}
        for k in sorted(unique.values(), key=lambda k: k.name)
    ]  # fmt: skip


def _spend_cap(value: Any, errors: _Errors) -> str | None:
    if value is None:
        return None
    # ASCII only: Decimal() reads any Unicode digit ("\u0661\u0662" is 12) and a text nobody typed is refused.
    if isinstance(value, bool) or not isinstance(value, str | int) or len(str(value)) > 16 or not str(value).isascii():
        errors.add("launch.spend_cap_usd", 'an amount in USD, e.g. "50" or "12.50"')
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        errors.add("launch.spend_cap_usd", 'an amount in USD, e.g. "50" or "12.50"')
        return None
    if not amount.is_finite() or amount <= 0 or amount > SPEND_CAP_MAX or amount.as_tuple().exponent < -2:  # type: ignore[operator]
        errors.add("launch.spend_cap_usd", f"more than 0 and at most {SPEND_CAP_MAX} USD, in cents at most")
        return None
    return format(amount.quantize(Decimal("0.01")), "f")


def _on_silence(value: Any, errors: _Errors) -> str:
    if value is None:
        return ON_SILENCE_KEEP
    if not isinstance(value, str) or value not in ON_SILENCE:
        errors.add("launch.on_silence", 'either "keep" (the default) or "replace"')
        return ON_SILENCE_KEEP
    return value


def on_silence_of(spec: Mapping[str, Any] | None) -> str:
    """A stored configuration's choice; "keep" for one stored before the field existed."""
    return str((spec or {}).get("on_silence") or ON_SILENCE_KEEP)


def launch_parse(
    data: Mapping[str, Any] | None, *, keys: Sequence[SshKey], caller_address: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec, secrets) from a configuration as given; raises ``LaunchConfigInvalid`` naming every wrong field."""
    data = dict(data or {})
    errors = _Errors()
    for name in sorted(set(data) - FIELDS):
        errors.add(f"launch.{name}", "not a launch configuration field")
    image = data.get("image")
    if image is not None and (not isinstance(image, str) or not _IMAGE_REF.match(image)):
        errors.add("launch.image", "an image id of the cloud, e.g. ami-0123456789abcdef0")
    workload, secret = _workload(data.get("workload"), errors)
    disk = (
        None
        if data.get("disk_gb") is None
        else _int(data["disk_gb"], "launch.disk_gb", DISK_GB_MIN, DISK_GB_MAX, errors)
    )
    extra_ports = _ports(data.get("ports"), "launch.ports", errors)
    spec = {
        "image": image if isinstance(image, str) else None,
        "workload": workload,
        "disk_gb": disk,
        "ports": sorted({SSH_PORT, *extra_ports, *workload.get("ports", [])}),
        "allowed_cidrs": _cidrs(data.get("allowed_cidrs"), caller_address, errors),
        "ssh_keys": _keys(data.get("ssh_keys"), keys, workload["kind"], errors),
        "spend_cap_usd": _spend_cap(data.get("spend_cap_usd"), errors),
        "on_silence": _on_silence(data.get("on_silence"), errors),
    }
    if errors.fields:
        raise LaunchConfigInvalid(errors.fields)
    return spec, secret


def commitment(spec: Mapping[str, Any], secrets: Mapping[str, Any], salt: str) -> str:
    """The salted SHA-256 the ledger keeps: of ``{"salt", "spec", "secrets"}`` in canonical JSON."""
    return sha256_hex(canonical_bytes({"salt": salt, "spec": dict(spec), "secrets": dict(secrets)}))


def launch_configuration_create(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    choice: LaunchChoice,
    broker_env: Sequence[tuple[str, str, bool]] = (),
) -> LaunchConfiguration:
    """Validate ``choice`` and store it, or return the named template's configuration (immutable, so an order
    keeps what it was placed with whatever happens to the template later). Raises ``LaunchConfigInvalid``.

    ``broker_env`` is the broker's own (name, value, secret) variables for a workload that runs something (a
    fleet's metrics token and URL): added after the buyer's env is checked, since a buyer may not set a
    ``BROKER_`` name; ignored for a template (its configuration is stored already) and a workload of kind none."""
    if choice.data is not None and not isinstance(choice.data, Mapping):
        raise LaunchConfigInvalid({"launch": "a launch configuration is a JSON object"})
    if choice.template is not None:
        if choice.data is not None:
            raise LaunchConfigInvalid({"launch_template": "name a template or give a configuration, not both"})
        template = launch_template_get(organization=organization, ref=choice.template)
        if template is None:
            raise LaunchConfigInvalid({"launch_template": "no such launch template in this organisation"})
        return template.configuration
    keys = list(ssh_key_list(organization=organization))
    spec, secrets = launch_parse(choice.data, keys=keys, caller_address=choice.caller_address)
    if broker_env and spec["workload"]["kind"] != WorkloadKind.NONE.value:
        workload = dict(spec["workload"])
        secret_env = dict(secrets.get("env") or {})
        env = list(workload.get("env") or [])
        for name, value, secret in broker_env:
            env.append({"name": name, "secret": True} if secret else {"name": name, "value": value})
            if secret:
                secret_env[name] = value
        spec = {**spec, "workload": {**workload, "env": env}}
        secrets = {**secrets, "env": secret_env} if secret_env else secrets
    salt = random_secrets.token_hex(16)
    return LaunchConfiguration.objects.create(
        organization=organization,
        spec=spec,
        secrets_encrypted=_encrypt(secrets),
        salt=salt,
        sha256=commitment(spec, secrets, salt),
        created_by=user,
    )


def _encrypt(secrets: Mapping[str, Any]) -> str:
    if not secrets:
        return ""
    # The store takes a flat string map: nest the env as its own JSON text.
    flat = {k: json.dumps(v) if isinstance(v, dict) else str(v) for k, v in secrets.items()}
    return encrypt_secret(flat)


def launch_secrets(config: LaunchConfiguration) -> dict[str, Any]:
    """The configuration's secret values: ``{"env": {name: value}, "registry_password": ...}``. For the lease
    agent's signed request only: never render, log or ledger what this returns."""
    flat = decrypt_secret(config.secrets_encrypted)
    out: dict[str, Any] = {}
    if "env" in flat:
        out["env"] = bounded_json(flat["env"], max_bytes=MAX_ENV_JSON, max_depth=2)  # {name: value}
    if "registry_password" in flat:
        out["registry_password"] = flat["registry_password"]
    return out


def launch_view(config: LaunchConfiguration | None) -> dict[str, Any] | None:
    """What the buyer's organisation may see of a configuration: everything but secret values."""
    if config is None:
        return None
    return {"id": str(config.public_id), **config.spec, "sha256": config.sha256, "salt": config.salt}


def ingress_rules(spec: Mapping[str, Any]) -> tuple[IngressRule, ...]:
    cidrs = tuple(spec.get("allowed_cidrs") or ())
    return tuple(IngressRule(port=int(port), cidrs=cidrs) for port in spec.get("ports") or ())


def spec_ssh_keys(spec: Mapping[str, Any]) -> tuple[SshPublicKey, ...]:
    """The configuration's keys, parsed again from their stored public halves (they were valid when stored)."""
    keys = []
    for entry in spec.get("ssh_keys") or ():
        try:
            keys.append(ssh_key_parse(str(entry["public_key"])))
        except (SshKeyInvalid, KeyError):
            continue
    return tuple(keys)


# --------------------------------------------------------------------------------------------- templates


def launch_template_get(*, organization: Organization, ref: str) -> LaunchTemplate | None:
    """A template of the organisation by its id or its name."""
    templates = LaunchTemplate.objects.filter(organization=organization).select_related("configuration")
    try:
        return templates.filter(public_id=uuid.UUID(ref)).first()
    except ValueError:
        return templates.filter(name=ref).first()


class TemplateInvalid(ValueError):
    """A template that cannot be saved; the message names the field."""


@transaction.atomic
def launch_template_save(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    name: str,
    description: str = "",
    choice: LaunchChoice,
    template: LaunchTemplate | None = None,
) -> LaunchTemplate:
    """Create a template, or (``template`` given) replace its configuration and name. Raises
    ``LaunchConfigInvalid`` or ``TemplateInvalid``."""
    name = (name or "").strip()
    if not name or len(name) > 80 or "\n" in name:
        raise TemplateInvalid("name: 1 to 80 characters on one line")
    if problem := name_problem(name):
        raise TemplateInvalid(f"name: {problem}")
    if problem := storable_problem(description):
        raise TemplateInvalid(f"description: {problem}")
    if len(description) > 255:
        raise TemplateInvalid("description: at most 255 characters")
    clash = LaunchTemplate.objects.filter(organization=organization, name=name)
    if template is not None:
        clash = clash.exclude(pk=template.pk)
    if clash.exists():
        raise TemplateInvalid(f"name: the organisation already has a template called {name!r}")
    config = launch_configuration_create(
        organization=organization,
        user=user,
        choice=LaunchChoice(data=choice.data, caller_address=choice.caller_address),
    )
    if template is None:
        return LaunchTemplate.objects.create(
            organization=organization, name=name, description=description, configuration=config, created_by=user
        )
    template.name, template.description, template.configuration = name, description, config
    template.save()
    return template


def launch_template_delete(*, template: LaunchTemplate) -> None:
    """Forget a template; its configuration stays for the orders and quotes placed with it."""
    LaunchTemplate.objects.filter(pk=template.pk).delete()
