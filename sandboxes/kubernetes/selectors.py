"""Label and field selectors as the list verbs take them (``?labelSelector=``, ``?fieldSelector=``).

Label selector syntax from "Labels and Selectors"
(https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors): equality-based
(``=``, ``==``, ``!=``) and set-based (``in``, ``notin``, ``key``, ``!key``) requirements joined by commas, all of
which must hold. Field selectors (https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/)
take ``=``, ``==`` and ``!=`` on the fields each kind supports; any other field is a 400 ``field label not supported``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandboxes.kubernetes.wire import ApiError, Resource, bad_request

MAX_SELECTOR = 4096
_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "=":
            return present and value == self.values[0]
        if self.operator == "!=":
            return not present or value != self.values[0]
        if self.operator == "in":
            return present and value in self.values
        if self.operator == "notin":
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        return not present


def _split(text: str) -> list[str]:
    """Split at the commas outside ``( )``."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _check_key(key: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise bad_request(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{key}": name part must '
            "consist of alphanumeric characters, '-', '_' or '.'"
        )
    return key


def _check_value(key: str, value: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise bad_request(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{value}": a valid label '
            "must be an empty string or consist of alphanumeric characters, '-', '_' or '.'"
        )
    return value


def parse_label_selector(text: str | None) -> list[Requirement]:
    """The requirements of a label selector; ``ApiError`` 400 for a malformed one."""
    if not text:
        return []
    if len(text) > MAX_SELECTOR:
        raise bad_request(f"label selector longer than {MAX_SELECTOR} characters")
    requirements = []
    for raw in _split(text):
        part = raw.strip()
        if not part:
            raise bad_request(f"unable to parse requirement: found '', expected: identifier in {text!r}")
        set_match = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", part)
        if set_match:
            key, operator, listed = set_match.groups()
            values = tuple(_check_value(key, v.strip()) for v in listed.split(",") if v.strip())
            if not values:
                raise bad_request("unable to parse requirement: for 'in', 'notin' operators, values set can't be empty")
            requirements.append(Requirement(_check_key(key), operator, values))
            continue
        equality = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$", part)
        if equality:
            key, operator, value = equality.groups()
            requirements.append(
                Requirement(_check_key(key), "!=" if operator == "!=" else "=", (_check_value(key, value),))
            )
            continue
        if part.startswith("!"):
            requirements.append(Requirement(_check_key(part[1:].strip()), "!"))
            continue
        if re.match(r"^\S+$", part):
            requirements.append(Requirement(_check_key(part), "exists"))
            continue
        raise bad_request(f"unable to parse requirement: {part!r} is not a valid label selector requirement")
    return requirements


def labels_match(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


# ------------------------------------------------------------------------------------------------ fields


def _path(*keys: str) -> Callable[[dict[str, Any]], str]:
    def read(obj: dict[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return read


_COMMON = {"metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace")}
# The field labels each kind supports (the API server's per-kind field label conversion functions).
FIELDS: dict[str, dict[str, Callable[[dict[str, Any]], str]]] = {
    "pods": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "events": {
        **{
            f"involvedObject.{f}": _path("involvedObject", f)
            for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"),
        "type": _path("type"),
    },
    "secrets": {"type": _path("type")},
    "nodes": {"spec.unschedulable": _path("spec", "unschedulable")},
    "namespaces": {"status.phase": _path("status", "phase")},
}


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    read: Callable[[dict[str, Any]], str]
    equal: bool
    value: str


def parse_field_selector(text: str | None, resource: Resource) -> list[FieldRequirement]:
    """The requirements of a field selector on ``resource``; ``ApiError`` 400 for an unsupported field."""
    if not text:
        return []
    if len(text) > MAX_SELECTOR:
        raise bad_request(f"field selector longer than {MAX_SELECTOR} characters")
    supported = {**_COMMON, **FIELDS.get(resource.plural, {})}
    found = []
    for part in text.split(","):
        match = re.match(r"^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not match:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, operator, value = match.groups()
        if field not in supported:
            raise ApiError(400, "BadRequest", f"field label not supported: {field}")
        found.append(FieldRequirement(supported[field], operator != "!=", value))
    return found


def fields_match(requirements: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all((r.read(obj) == r.value) == r.equal for r in requirements)
