"""Bearer tokens with RBAC rules, the API server's 401 and 403 answers, and SelfSubjectRulesReview.

- Authentication ("Authenticating", https://kubernetes.io/docs/reference/access-authn-authz/authentication/): a
  request without a known ``Authorization: Bearer <token>`` is answered 401 with the ``Status`` body
  ``{"message": "Unauthorized", "reason": "Unauthorized", "code": 401}``.
- Authorization ("Using RBAC Authorization", https://kubernetes.io/docs/reference/access-authn-authz/rbac/): each
  token has PolicyRules (verbs, apiGroups, resources, ``*`` wildcards) that add up; a request's verb is get, list,
  watch, create, update, patch, delete or deletecollection ("Authorization", request verbs,
  https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb). A denied
  request is a 403 whose message is the API server's: ``<resource> is forbidden: User "<name>" cannot <verb>
  resource "<resource>" in API group "<group>" in the namespace "<ns>"`` (``at the cluster scope`` without one).
- SelfSubjectRulesReview (https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-rules-review-v1/)
  answers the caller's rules in a namespace, plus what every authenticated user may do (system:basic-user,
  system:discovery).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandboxes.kubernetes.wire import Resource, forbidden, unauthorized

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
DEMO_TOKEN = "k8s-sandbox-demo-token"  # noqa: S105 - a sandbox's published demo credential, not a secret
DEMO_USER = "system:serviceaccount:broker-system:broker"


@dataclass(frozen=True, slots=True)
class PolicyRule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return (
            ("*" in self.verbs or verb in self.verbs)
            and ("*" in self.api_groups or group in self.api_groups)
            and ("*" in self.resources or resource in self.resources)
        )

    def to_json(self) -> dict[str, Any]:
        return {"verbs": list(self.verbs), "apiGroups": list(self.api_groups), "resources": list(self.resources)}


FULL_ACCESS = (PolicyRule(("*",), ("*",), ("*",)),)
# What the broker's adapter uses, for a token built by denying some of it (``TokenRegistry.register(deny=...)``).
SERVED: tuple[tuple[str, str], ...] = (
    ("", "nodes"),
    ("", "namespaces"),
    ("", "pods"),
    ("", "pods/log"),
    ("", "services"),
    ("", "secrets"),
    ("", "events"),
    ("", "resourcequotas"),
    ("networking.k8s.io", "networkpolicies"),
    ("batch", "jobs"),
)
# Granted to every authenticated user by the default ClusterRoles system:basic-user and system:discovery.
BASIC_RULES = (
    PolicyRule(("create",), ("authorization.k8s.io",), ("selfsubjectaccessreviews", "selfsubjectrulesreviews")),
)
DISCOVERY_PATHS = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]


@dataclass(frozen=True, slots=True)
class Identity:
    token: str
    user: str
    rules: tuple[PolicyRule, ...] = field(default_factory=tuple)

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return any(rule.allows(verb, group, resource) for rule in (*self.rules, *BASIC_RULES))


class TokenRegistry:
    """The tokens the sandbox accepts. Thread-safe; ``reset`` keeps only the demo token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, Identity] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._tokens = {DEMO_TOKEN: Identity(DEMO_TOKEN, DEMO_USER, FULL_ACCESS)}

    def register(
        self,
        *,
        user: str = "system:serviceaccount:broker-system:limited",
        rules: Iterable[PolicyRule] | None = None,
        deny: Iterable[tuple[str, str]] = (),
        token: str | None = None,
    ) -> str:
        """Accept a new token for ``user`` and return it. Its rules are ``rules``, else everything the sandbox serves
        less the (verb, resource) pairs in ``deny`` (``[("create", "networkpolicies")]``)."""
        denied = {(verb, resource) for verb, resource in deny}
        if rules is None:
            built = []
            for group, resource in SERVED:
                verbs = tuple(v for v in VERBS if (v, resource) not in denied)
                if verbs:
                    built.append(PolicyRule(verbs, (group,), (resource,)))
            rules = built
        token = token or "sbx-" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = Identity(token, user, tuple(rules))
        return token

    def revoke(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)

    def identify(self, authorization: str | None) -> Identity:
        """The identity of an ``Authorization`` header; ``ApiError`` 401 for none or an unknown token."""
        if not authorization or not authorization.startswith("Bearer "):
            raise unauthorized()
        token = authorization[len("Bearer ") :].strip()
        with self._lock:
            identity = self._tokens.get(token)
        if identity is None:
            raise unauthorized()
        return identity


def forbidden_message(identity: Identity, verb: str, resource: Resource, namespace: str, subresource: str = "") -> str:
    """The authorization filter's ``forbiddenMessage`` for a resource request."""
    plural = resource.plural + (f"/{subresource}" if subresource else "")
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return f'User "{identity.user}" cannot {verb} resource "{plural}" in API group "{resource.group}" {where}'


def authorize(
    identity: Identity, verb: str, resource: Resource, namespace: str, name: str | None, subresource: str = ""
) -> None:
    """Raise the API server's 403 when the identity's rules do not grant ``verb`` on the resource."""
    plural = resource.plural + (f"/{subresource}" if subresource else "")
    if identity.allows(verb, resource.group, plural):
        return
    raise forbidden(resource, name, forbidden_message(identity, verb, resource, namespace, subresource))


def rules_review(identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
    """The SelfSubjectRulesReview answer: the request echoed, with ``status`` holding the caller's rules."""
    # An empty namespace asks for the rules that hold cluster-wide: the sandbox's rules are all cluster-wide.
    namespace = str(((body.get("spec") or {}).get("namespace")) or "")
    rules = [rule.to_json() for rule in (*BASIC_RULES, *identity.rules)]
    return {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {"namespace": namespace},
        "status": {
            "resourceRules": rules,
            "nonResourceRules": [
                {"verbs": ["get"], "nonResourceURLs": DISCOVERY_PATHS},
            ],
            "incomplete": False,
        },
    }
