"""What the seller's service account must be allowed, and how a token that lacks some of it is refused.

Each launch makes a namespace with a Secret, a Pod, a Service, a NetworkPolicy and a ResourceQuota in it;
offers read every node and every pod (free GPUs are allocatable minus what pods request); termination deletes
the namespace. ``clusterrole.yaml`` beside this module is the ClusterRole the README gives the seller, and a test
holds it equal to ``PERMISSIONS``.

The check reads ``SelfSubjectRulesReview`` (authorization.k8s.io/v1, allowed to every authenticated user by the
default ``system:basic-user`` role: https://kubernetes.io/docs/reference/access-authn-authz/rbac/#discovery-roles)
for a namespace the broker never creates, so only grants that hold in every namespace count, as the broker's
namespaces are new each order. Where the API server says its answer is ``incomplete`` (an authorizer such as a
webhook cannot list its rules), a permission missing from it is not refused: the launch then names a 403 itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.errors import CredentialsRejected

PROVIDER = "kubernetes"
# A namespace name the broker never makes (its own are brk-<hex>): rules granted only inside one namespace do
# not show here.
REVIEW_NAMESPACE = "brk-permissions-review"


@dataclass(frozen=True, slots=True)
class Permission:
    """One verb on one resource of one API group ("" is the core group)."""

    verb: str
    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource} ({self.group or 'core'})"


def _all(group: str, resource: str, *verbs: str) -> list[Permission]:
    return [Permission(verb, group, resource) for verb in verbs]


# In the order a refusal names the first one missing: reads first, then a launch's writes in the order it makes them.
PERMISSIONS: tuple[Permission, ...] = (
    *_all("", "nodes", "get", "list"),
    *_all("", "pods", "get", "list", "create"),
    *_all("", "namespaces", "get", "list", "create", "delete"),
    *_all("", "secrets", "create"),
    *_all("", "services", "get", "list", "create"),
    *_all("networking.k8s.io", "networkpolicies", "create"),
    *_all("", "resourcequotas", "create"),
)


def grants(rule: Mapping[str, Any], permission: Permission) -> bool:
    """Whether one ``resourceRules[]`` entry grants ``permission``. ``*`` matches any verb, group or resource; a
    rule limited to ``resourceNames`` grants neither create nor list, so it is not counted."""
    if rule.get("resourceNames"):
        return False
    verbs = _strings(rule.get("verbs"))
    groups = _strings(rule.get("apiGroups"))
    resources = _strings(rule.get("resources"))
    return (
        (permission.verb in verbs or "*" in verbs)
        and (permission.group in groups or "*" in groups)
        and (permission.resource in resources or "*" in resources)
    )


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def missing(review_status: Mapping[str, Any], needed: Sequence[Permission] = PERMISSIONS) -> list[Permission]:
    """The permissions of ``needed`` that no rule of a SelfSubjectRulesReview's ``status`` grants, in order."""
    rules = [r for r in review_status.get("resourceRules") or [] if isinstance(r, Mapping)][:10_000]
    return [p for p in needed if not any(grants(rule, p) for rule in rules)]


def check_review(review_status: Mapping[str, Any]) -> None:
    """Raise ``CredentialsRejected`` naming the first missing permission ('the service account may not create
    networkpolicies (networking.k8s.io)'), unless the review says it is incomplete."""
    if review_status.get("incomplete") is True:
        return
    lacking = missing(review_status)
    if lacking:
        first = lacking[0]
        more = f" (and {len(lacking) - 1} more of the ClusterRole's permissions)" if len(lacking) > 1 else ""
        raise CredentialsRejected(
            f"the service account may not {first}{more}; bind it to the broker's ClusterRole",
            code="Forbidden",
            provider=PROVIDER,
            http_status=403,
        )


def cluster_role_rules(permissions: Sequence[Permission] = PERMISSIONS) -> list[dict[str, list[str]]]:
    """``permissions`` as ClusterRole rules, one per (group, resource), in first-mention order."""
    rules: dict[tuple[str, str], list[str]] = {}
    for p in permissions:
        rules.setdefault((p.group, p.resource), []).append(p.verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": verbs} for (group, resource), verbs in rules.items()
    ]


CLUSTER_ROLE_FILE = Path(__file__).with_name("clusterrole.yaml")


def cluster_role_yaml() -> str:
    """The ClusterRole manifest a seller applies (``clusterrole.yaml``), as the portal and ``manage.py provider
    clusterrole`` show it."""
    return CLUSTER_ROLE_FILE.read_text()
