"""EC2 placement groups for the AWS sandbox: moto 5.2 has none, so the sandbox's WSGI layer answers them here.

What EC2 does, and so what this module does, on the query (XML) wire:

- ``CreatePlacementGroup`` (``GroupName``, ``Strategy``, ``TagSpecification.N``) answers ``placementGroup``;
  a name the Region already holds is ``InvalidPlacementGroup.Duplicate``
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html);
- ``DescribePlacementGroups`` answers ``placementGroupSet`` items (``groupName``, ``state``, ``strategy``,
  ``groupId``, ``groupArn``, ``tagSet``), narrowed by ``GroupName.N``, ``GroupId.N`` and the ``group-name``,
  ``state``, ``strategy``, ``tag:<key>`` and ``tag-key`` filters; a name asked for by ``GroupName.N`` that
  the Region does not hold is ``InvalidPlacementGroup.Unknown``, while a filter simply matches nothing
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribePlacementGroups.html);
- ``DeletePlacementGroup`` (``GroupName``) answers ``return`` true; "You must terminate all instances in the
  placement group before you can delete the placement group": while one is not terminated the answer is
  ``InvalidPlacementGroup.InUse``, and an unknown name ``InvalidPlacementGroup.Unknown``
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeletePlacementGroup.html);
- ``RunInstances`` with ``Placement.GroupName``: an unknown group is ``InvalidPlacementGroup.Unknown``; "A
  cluster placement group can't span multiple Availability Zones"
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups.html), so a cluster group holding
  instances in one zone refuses a launch into another with ``InvalidPlacementGroup.InUse``, "The placement
  group '<name>' is in use in another availability zone: <zone>", as EC2 answers it (quoted in
  github.com/hashicorp/terraform/issues/16183 and github.com/bcbio/bcbio-nextgen-vm/issues/45).

Error codes and their meaning: "Error codes for the Amazon EC2 API",
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html. Every refusal is HTTP 400.

Membership lives in moto: an instance launched into a group carries the group's name in its placement
(``Placement.GroupName`` in ``DescribeInstances``), and a group is in use while any instance naming it is not
terminated. Groups themselves are kept here per Region and cleared by ``reset``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from moto.core import DEFAULT_ACCOUNT_ID

from sandboxes.aws import launch as aws_launch
from sandboxes.aws.launch import Refusal

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ACTIONS = frozenset({"CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"})
# CreatePlacementGroup's Strategy values and GroupName's "Up to 255 ASCII characters" (API reference above).
STRATEGIES = frozenset({"cluster", "spread", "partition"})
GROUP_NAME_MAX = 255
DUPLICATE = "InvalidPlacementGroup.Duplicate"
UNKNOWN = "InvalidPlacementGroup.Unknown"
IN_USE = "InvalidPlacementGroup.InUse"
_FILTER_NAME = re.compile(r"^Filter\.(\d+)\.Name$")


@dataclass(slots=True)
class PlacementGroup:
    """One group as EC2 describes it."""

    name: str
    group_id: str
    strategy: str
    region: str
    tags: dict[str, str] = field(default_factory=dict)
    state: str = "available"

    @property
    def arn(self) -> str:
        return f"arn:aws:ec2:{self.region}:{DEFAULT_ACCOUNT_ID}:placement-group/{self.name}"


def _group_id(region: str, name: str) -> str:
    return "pg-" + hashlib.sha256(f"{region}/{name}/{uuid.uuid4()}".encode()).hexdigest()[:17]


def _tags(params: Mapping[str, str]) -> dict[str, str]:
    """The ``placement-group`` tags of ``TagSpecification.N.Tag.M.Key/Value``."""
    tags: dict[str, str] = {}
    for spec, resource in enumerate(aws_launch.indexed(params, "TagSpecification", ".ResourceType"), start=1):
        if resource != "placement-group":
            continue
        keys = aws_launch.indexed(params, f"TagSpecification.{spec}.Tag", ".Key")
        values = aws_launch.indexed(params, f"TagSpecification.{spec}.Tag", ".Value")
        tags.update(zip(keys, values, strict=False))
    return tags


def _filters(params: Mapping[str, str]) -> list[tuple[str, set[str]]]:
    found = []
    for key, name in params.items():
        match = _FILTER_NAME.match(key)
        if match:
            found.append((name, set(aws_launch.indexed(params, f"Filter.{match.group(1)}.Value"))))
    return found


def _matches(group: PlacementGroup, name: str, values: set[str]) -> bool | None:
    """Whether ``group`` passes one filter; None for a filter name this sandbox does not know."""
    if name == "group-name":
        return group.name in values
    if name == "group-arn":
        return group.arn in values
    if name == "state":
        return group.state in values
    if name == "strategy":
        return group.strategy in values
    if name == "tag-key":
        return bool(values & set(group.tags))
    if name.startswith("tag:"):
        return group.tags.get(name[4:]) in values
    return None


def _item(group: PlacementGroup, element: str = "item") -> str:
    tags = "".join(
        f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in sorted(group.tags.items())
    )
    return (
        f"<{element}>"
        f"<groupName>{escape(group.name)}</groupName>"
        f"<state>{group.state}</state>"
        f"<strategy>{group.strategy}</strategy>"
        f"<groupId>{group.group_id}</groupId>"
        f"<tagSet>{tags}</tagSet>"
        f"<groupArn>{escape(group.arn)}</groupArn>"
        f"</{element}>"
    )


def _answer(action: str, inner: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<{action}Response xmlns="{EC2_XMLNS}"><requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>'
    )


class PlacementGroups:
    """The Region's placement groups; ``answer`` serves the three actions, ``launch_refusal`` and ``joined``
    put ``RunInstances`` under their rules. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], PlacementGroup] = {}

    def reset(self) -> None:
        with self._lock:
            self._groups.clear()

    def names(self, region: str) -> list[str]:
        """The groups ``region`` holds (for tests asserting what is left)."""
        with self._lock:
            return sorted(name for r, name in self._groups if r == region)

    def answer(self, action: str, region: str, params: Mapping[str, str]) -> tuple[str, int] | Refusal:
        """(XML body, 200) for one of ``ACTIONS``, or a refusal (code, message, HTTP status)."""
        if action == "CreatePlacementGroup":
            return self._create(region, params)
        if action == "DescribePlacementGroups":
            return self._describe(region, params)
        return self._delete(region, params)

    def _create(self, region: str, params: Mapping[str, str]) -> tuple[str, int] | Refusal:
        name = params.get("GroupName", "")
        strategy = params.get("Strategy", "")
        if not name or len(name) > GROUP_NAME_MAX or not name.isascii():
            return ("InvalidParameterValue", f"Invalid value '{name}' for GroupName", 400)
        if strategy not in STRATEGIES:
            return ("InvalidParameterValue", f"Invalid value '{strategy}' for Strategy", 400)
        with self._lock:
            if (region, name) in self._groups:
                return (DUPLICATE, f"The placement group '{name}' already exists.", 400)
            group = PlacementGroup(name, _group_id(region, name), strategy, region, _tags(params))
            self._groups[(region, name)] = group
        return _answer("CreatePlacementGroup", _item(group, "placementGroup")), 200

    def _describe(self, region: str, params: Mapping[str, str]) -> tuple[str, int] | Refusal:
        names = aws_launch.indexed(params, "GroupName")
        ids = set(aws_launch.indexed(params, "GroupId"))
        filters = _filters(params)
        with self._lock:
            groups = [g for (r, _), g in sorted(self._groups.items()) if r == region]
        missing = [n for n in names if n not in {g.name for g in groups}]
        if missing:
            return (UNKNOWN, f"The Placement Group '{missing[0]}' is unknown.", 400)
        chosen = []
        for group in groups:
            if (names and group.name not in names) or (ids and group.group_id not in ids):
                continue
            verdicts = [_matches(group, name, values) for name, values in filters]
            if any(v is None for v in verdicts):
                unknown = next(name for (name, _), v in zip(filters, verdicts, strict=True) if v is None)
                return ("InvalidParameterValue", f"The filter '{unknown}' is invalid", 400)
            if all(verdicts):
                chosen.append(group)
        items = "".join(_item(g) for g in chosen)
        return _answer("DescribePlacementGroups", f"<placementGroupSet>{items}</placementGroupSet>"), 200

    def _delete(self, region: str, params: Mapping[str, str]) -> tuple[str, int] | Refusal:
        name = params.get("GroupName", "")
        with self._lock:
            if (region, name) not in self._groups:
                return (UNKNOWN, f"The Placement Group '{name}' is unknown.", 400)
            if _live_zones(region, name):
                return (IN_USE, f"The placement group '{name}' is in use and may not be deleted.", 400)
            del self._groups[(region, name)]
        return _answer("DeletePlacementGroup", "<return>true</return>"), 200

    def launch_refusal(self, region: str, params: Mapping[str, str]) -> Refusal | None:
        """EC2's refusal of a ``RunInstances`` into ``Placement.GroupName``; None without a group or when the
        launch may go in."""
        name = params.get("Placement.GroupName")
        if not name:
            return None
        with self._lock:
            group = self._groups.get((region, name))
        if group is None:
            return (UNKNOWN, f"The Placement Group '{name}' is unknown.", 400)
        zone = params.get("Placement.AvailabilityZone")
        held = _live_zones(region, name)
        if group.strategy == "cluster" and zone and held and zone not in held:
            return (IN_USE, f"The placement group '{name}' is in use in another availability zone: {held[0]}", 400)
        return None

    def joined(self, region: str, name: str, instance_ids: list[str]) -> None:
        """The launched instances are in the group: moto then describes them with ``Placement.GroupName``."""
        wanted = set(instance_ids)
        for reservation in list(aws_launch.backend(region).reservations.values()):
            for instance in reservation.instances:
                if instance.id in wanted:
                    instance.placement.group_name = name


def _live_zones(region: str, name: str) -> list[str]:
    """The zones of the group's instances that are not terminated, sorted."""
    zones = set()
    for reservation in list(aws_launch.backend(region).reservations.values()):
        for instance in reservation.instances:
            if instance.placement.group_name == name and instance.state != "terminated":
                zones.add(str(instance.availability_zone))
    return sorted(zones)
