"""The launch configuration in the OpenAPI schema, field by field, with the limits ``marketplace.launch.config``
enforces: every number and pattern here is that module's own constant, so the schema cannot drift from the
validation. ``launch_parse`` stays the judge; the schema tells a client (and a generated one) what it accepts.

What a schema cannot say is left to the 400 ``invalid_launch`` answer, which names the field: that an SSH key id
is one of the organisation's, that an env name is not given twice, that a script is more than blank, that text
holds no NUL.

``COMPONENTS`` is added to the schema's components by ``marketplace.api.schema.add_components``; serializer
fields point at it with ``LaunchConfigurationField`` (requests) and ``launch_view_schema`` (answers).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace.launch.config import (
    _ENV_NAME,
    _IMAGE_REF,
    _REGISTRY,
    DISK_GB_MAX,
    DISK_GB_MIN,
    MAX_ARG,
    MAX_ARGS,
    MAX_CIDRS,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_PORTS,
    MAX_SCRIPT,
    ON_SILENCE,
    ON_SILENCE_KEEP,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    SHM_GB_MAX,
    SPEND_CAP_MAX,
    SSH_PORT,
)
from providers.launch import WorkloadKind

_REF = "#/components/schemas/"
# Free text is typed by its length only. Its remaining rules (no NUL, providers.text.storable_problem; an env
# value on one line; a script not blank) are left to the 400: a pattern beside a long maxLength turns into a
# bounded repetition that schema tools (schemathesis among them) take minutes to compile.
# The largest key list a configuration takes (config._keys) and the longest address range text (config._cidrs).
MAX_SSH_KEYS = 32
MAX_CIDR_TEXT = 64
MAX_REGISTRY_USERNAME, MAX_REGISTRY_PASSWORD = 255, 4096
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RANGE = rf"^{_OCTET}(\.{_OCTET}){{3}}(/(3[0-2]|[12]?[0-9]))?$"
_IPV6_RANGE = r"^([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?$"


def _any_case(text: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in text)


# config._env compares names upper-cased: the reserved ones in any case.
_RESERVED_NAME = (
    "^("
    + "|".join(
        [*(f"{_any_case(n)}$" for n in sorted(RESERVED_ENV_NAMES)), *(_any_case(p) for p in RESERVED_ENV_PREFIXES)]
    )
    + ")"
)


def _spend_cap_pattern() -> str:
    # More than 0, at most SPEND_CAP_MAX, in cents at most (config._spend_cap), as plain decimal text.
    top = int(SPEND_CAP_MAX)
    below = len(str(top)) - 2  # digits after the first of a number below the cap's order of magnitude
    return rf"^(0\.(0[1-9]|[1-9][0-9]?)|[1-9][0-9]{{0,{below}}}(\.[0-9]{{1,2}})?|{top}(\.0{{1,2}})?)$"


def _port_list(what: str) -> dict[str, Any]:
    return {
        "type": "array",
        "nullable": True,
        "maxItems": MAX_PORTS,
        "items": {"type": "integer", "minimum": 1, "maximum": 65535, "not": {"enum": [SSH_PORT]}},
        "description": f"{what}; {SSH_PORT} (SSH) is always open and may not be named",
    }


def _strings(what: str) -> dict[str, Any]:
    return {
        "type": "array",
        "nullable": True,
        "maxItems": MAX_ARGS,
        "items": {"type": "string", "maxLength": MAX_ARG},
        "description": what,
    }


_ENV = {
    "type": "array",
    "nullable": True,
    "maxItems": MAX_ENV,
    "items": {"$ref": _REF + "LaunchEnvVar"},
    "description": "environment variables, each name once; secret values are never shown again",
}

COMPONENTS: dict[str, dict[str, Any]] = {
    "LaunchEnvVar": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {
                "type": "string",
                "pattern": _ENV_NAME.pattern,
                "not": {"pattern": _RESERVED_NAME},
                "description": "letters, digits and _; not one the agent or the GPU runtime sets "
                f"({', '.join(sorted(RESERVED_ENV_NAMES))}, {'*, '.join(RESERVED_ENV_PREFIXES)}*)",
            },
            "value": {"type": "string", "maxLength": MAX_ENV_VALUE, "default": "", "description": "one line"},
            "secret": {"type": "boolean", "default": False, "description": "kept encrypted, never shown again"},
        },
    },
    "LaunchRegistry": {
        "type": "object",
        "additionalProperties": False,
        "required": ["username", "password"],
        "properties": {
            "server": {"type": "string", "pattern": f"^$|{_REGISTRY.pattern}", "description": "e.g. ghcr.io"},
            "username": {"type": "string", "maxLength": MAX_REGISTRY_USERNAME},
            "password": {"type": "string", "maxLength": MAX_REGISTRY_PASSWORD, "writeOnly": True},
        },
        "description": "credentials for a private registry; the password is kept encrypted",
    },
    "LaunchWorkloadNone": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"kind": {"type": "string", "enum": [WorkloadKind.NONE.value]}},
        "description": "just the machine: SSH in and work (the default)",
    },
    "LaunchWorkloadContainer": {
        "type": "object",
        "additionalProperties": False,
        "required": ["kind", "image"],
        "properties": {
            "kind": {"type": "string", "enum": [WorkloadKind.CONTAINER.value]},
            "image": {"type": "string", "pattern": _IMAGE_REF.pattern, "description": "e.g. vllm/vllm-openai:v0.6.3"},
            "command": _strings("replaces the image's entrypoint"),
            "args": _strings("the command's arguments"),
            "env": _ENV,
            "ports": _port_list("the container's ports, published on the machine"),
            "shm_size_gb": {"type": "integer", "nullable": True, "minimum": 1, "maximum": SHM_GB_MAX},
            "registry": {"allOf": [{"$ref": _REF + "LaunchRegistry"}], "nullable": True},
        },
        "description": "a container image run with the GPUs",
    },
    "LaunchWorkloadScript": {
        "type": "object",
        "additionalProperties": False,
        "required": ["kind", "script"],
        "properties": {
            "kind": {"type": "string", "enum": [WorkloadKind.SCRIPT.value]},
            "script": {"type": "string", "minLength": 1, "maxLength": MAX_SCRIPT, "description": "not blank"},
            "env": _ENV,
        },
        "description": "a shell script run as the login user",
    },
    "LaunchConfiguration": {
        "type": "object",
        "additionalProperties": False,
        "description": "what the machine runs and who may reach it (docs/BUYERS.md: Launch configuration); "
        "every field is optional",
        "properties": {
            "image": {
                "type": "string",
                "nullable": True,
                "pattern": _IMAGE_REF.pattern,
                "description": "the buyer's own machine image; absent: the cloud's GPU-ready default",
            },
            "workload": {
                "nullable": True,
                "oneOf": [
                    {"$ref": _REF + "LaunchWorkloadNone"},
                    {"$ref": _REF + "LaunchWorkloadContainer"},
                    {"$ref": _REF + "LaunchWorkloadScript"},
                ],
            },
            "disk_gb": {"type": "integer", "nullable": True, "minimum": DISK_GB_MIN, "maximum": DISK_GB_MAX},
            "ports": _port_list("more inbound ports"),
            "allowed_cidrs": {
                "type": "array",
                "nullable": True,
                "minItems": 1,
                "maxItems": MAX_CIDRS,
                "items": {"type": "string", "maxLength": MAX_CIDR_TEXT, "pattern": f"{_IPV4_RANGE}|{_IPV6_RANGE}"},
                "description": "who may reach the ports; absent: the caller's address only",
            },
            "ssh_keys": {
                "type": "array",
                "nullable": True,
                "maxItems": MAX_SSH_KEYS,
                "items": {"type": "string", "format": "uuid"},
                "description": "ids of the organisation's SSH keys (/api/v1/ssh-keys); absent: every one",
            },
            "spend_cap_usd": {
                "nullable": True,
                "oneOf": [
                    {"type": "string", "pattern": _spend_cap_pattern()},
                    {"type": "integer", "minimum": 1, "maximum": int(SPEND_CAP_MAX)},
                ],
                "description": f'stop the machine once the order has cost this much: "50" or "12.50", at most '
                f"{SPEND_CAP_MAX}",
            },
            "on_silence": {
                "type": "string",
                "nullable": True,
                "enum": list(ON_SILENCE),
                "default": ON_SILENCE_KEEP,
                "description": "when the machine's agent stops reporting: keep the machine, or replace it",
            },
        },
    },
    "LaunchConfigurationView": {
        "type": "object",
        "description": "a stored launch configuration: everything but secret values",
        "required": ["id", "workload", "ports", "allowed_cidrs", "ssh_keys", "sha256", "salt"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "image": {"type": "string", "nullable": True},
            "workload": {
                "type": "object",
                "required": ["kind"],
                "properties": {
                    "kind": {"type": "string", "enum": [k.value for k in WorkloadKind]},
                    "image": {"type": "string"},
                    "script": {"type": "string"},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "ports": {"type": "array", "items": {"type": "integer"}},
                    "shm_size_gb": {"type": "integer", "nullable": True},
                    "env": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "value": {"type": "string", "description": "absent for a secret"},
                                "secret": {"type": "boolean"},
                            },
                        },
                    },
                    "registry": {
                        "type": "object",
                        "properties": {"server": {"type": "string"}, "username": {"type": "string"}},
                    },
                },
            },
            "disk_gb": {"type": "integer", "nullable": True},
            "ports": {"type": "array", "items": {"type": "integer"}, "description": f"{SSH_PORT} always among them"},
            "allowed_cidrs": {"type": "array", "items": {"type": "string"}},
            "ssh_keys": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "name", "key_type", "fingerprint", "public_key"],
                    "properties": {
                        "id": {"type": "string", "format": "uuid"},
                        "name": {"type": "string"},
                        "key_type": {"type": "string"},
                        "fingerprint": {"type": "string"},
                        "public_key": {"type": "string"},
                    },
                },
            },
            "spend_cap_usd": {"type": "string", "nullable": True},
            "on_silence": {"type": "string", "enum": list(ON_SILENCE)},
            "sha256": {"type": "string", "description": "the ledger's salted commitment to the configuration"},
            "salt": {"type": "string"},
        },
    },
}

LAUNCH_INPUT = {"$ref": _REF + "LaunchConfiguration"}
LAUNCH_VIEW = {"allOf": [{"$ref": _REF + "LaunchConfigurationView"}], "nullable": True}


@extend_schema_field(LAUNCH_INPUT)
class LaunchConfigurationField(serializers.JSONField):
    """A launch configuration in a request: JSON kept as given for ``launch_parse`` to judge, typed in the
    schema as ``LaunchConfiguration``."""
