"""A kubeconfig pasted once, turned into the account's credentials: the API server URL, a bearer token and the
cluster's CA bundle (PEM).

The file's shape is client-go's ``Config`` (https://kubernetes.io/docs/concepts/configuration/organize-cluster-
access-kubeconfig/, fields as in ``k8s.io/client-go/tools/clientcmd/api/v1``): ``current-context`` names an entry
of ``contexts[]`` whose ``context`` names a ``cluster`` and a ``user``; ``clusters[].cluster`` holds ``server`` and
``certificate-authority-data`` (base64 of the PEM), ``users[].user`` holds ``token``. Only what the broker can hold
is taken: a token. Client certificates, exec plugins, auth providers, basic auth and anything read from a file on
the seller's machine are refused with a message that says what to give instead.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

import yaml

MAX_KUBECONFIG_BYTES = 64 * 1024
MAX_TOKEN_CHARS = 16 * 1024
MAX_CA_BUNDLE_CHARS = 64 * 1024
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"

# user fields that authenticate some other way than a bearer token the broker can hold
_OTHER_AUTH = {
    "client-certificate-data": "a client certificate",
    "client-certificate": "a client certificate",
    "client-key-data": "a client key",
    "client-key": "a client key",
    "exec": "an exec credential plugin",
    "auth-provider": "an auth provider",
    "username": "basic authentication",
    "password": "basic authentication",
    "tokenFile": "a token file",
}


class KubeconfigRefused(ValueError):
    """The kubeconfig cannot be turned into credentials the broker can use; the message says why."""


def kubeconfig_credentials(text: str) -> tuple[str, dict[str, str]]:
    """``(server_url, {"token": ..., "ca_bundle": ...})`` from a kubeconfig's current context. ``ca_bundle`` is
    ``""`` when the cluster gives none (a server whose certificate a public CA signed). Raises
    ``KubeconfigRefused`` (a ``ValueError``) naming what is wrong or unsupported."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_KUBECONFIG_BYTES:
        raise KubeconfigRefused(f"the kubeconfig is larger than {MAX_KUBECONFIG_BYTES // 1024} KiB")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigRefused(f"the kubeconfig is not YAML: {str(exc)[:200]}") from None
    if not isinstance(config, dict):
        raise KubeconfigRefused("the kubeconfig is not a mapping with clusters, users and contexts")
    contexts = _named(config, "contexts")
    name = config.get("current-context")
    if not name:
        if len(contexts) != 1:
            raise KubeconfigRefused("the kubeconfig names no current-context; set one")
        name = next(iter(contexts))
    if not isinstance(name, str) or name not in contexts:
        raise KubeconfigRefused(f"current-context {str(name)[:100]!r} is not among the contexts")
    context = _mapping(contexts[name], f"context {name!r}")
    cluster_name, user_name = context.get("cluster"), context.get("user")
    clusters, users = _named(config, "clusters"), _named(config, "users")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise KubeconfigRefused(f"context {name!r} names cluster {str(cluster_name)[:100]!r}, which is not listed")
    if not isinstance(user_name, str) or user_name not in users:
        raise KubeconfigRefused(f"context {name!r} names user {str(user_name)[:100]!r}, which is not listed")
    server, ca_bundle = _cluster(_mapping(clusters[cluster_name], f"cluster {cluster_name!r}"), cluster_name)
    token = _token(_mapping(users[user_name], f"user {user_name!r}"), user_name)
    return server, {"token": token, "ca_bundle": ca_bundle}


def _named(config: dict[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` (a list of ``{name, <kind>}``) as name -> the entry's inner mapping."""
    entries = config.get(key) or []
    if not isinstance(entries, list):
        raise KubeconfigRefused(f"{key} is not a list")
    inner = key[:-1]  # "clusters" -> "cluster"
    found: dict[str, Any] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found[entry["name"]] = entry.get(inner)
    return found


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise KubeconfigRefused(f"{what} has no settings")
    return value


def _cluster(cluster: dict[str, Any], name: str) -> tuple[str, str]:
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigRefused(f"cluster {name!r} has no server URL")
    server_problem = api_server_url_problem(server)
    if server_problem:
        raise KubeconfigRefused(f"cluster {name!r}: {server_problem}")
    if cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigRefused(f"cluster {name!r} skips TLS verification; give its certificate-authority-data instead")
    for unsupported in ("proxy-url", "tls-server-name"):
        if cluster.get(unsupported):
            raise KubeconfigRefused(f"cluster {name!r} sets {unsupported}, which the broker does not support")
    if cluster.get("certificate-authority") and not cluster.get("certificate-authority-data"):
        raise KubeconfigRefused(
            f"cluster {name!r} names a CA file on your machine; give certificate-authority-data (kubectl config "
            "view --raw --flatten writes it)"
        )
    data = cluster.get("certificate-authority-data")
    if not data:
        return server.rstrip("/"), ""
    if not isinstance(data, str) or len(data) > MAX_CA_BUNDLE_CHARS * 2:
        raise KubeconfigRefused(f"cluster {name!r}: certificate-authority-data is not base64 text")
    try:
        pem = base64.b64decode("".join(data.split()), validate=True).decode("ascii")
    except (binascii.Error, ValueError):
        raise KubeconfigRefused(f"cluster {name!r}: certificate-authority-data is not base64 of a PEM") from None
    problem = ca_bundle_problem(pem)
    if problem:
        raise KubeconfigRefused(f"cluster {name!r}: {problem}")
    return server.rstrip("/"), pem


def _token(user: dict[str, Any], name: str) -> str:
    for field, what in _OTHER_AUTH.items():
        if user.get(field):
            raise KubeconfigRefused(
                f"user {name!r} authenticates with {what}; the broker takes a service account token only "
                "(kubectl create token <service account>)"
            )
    token = user.get("token")
    if not isinstance(token, str) or not token.strip():
        raise KubeconfigRefused(f"user {name!r} has no token; give a service account token")
    problem = token_problem(token.strip())
    if problem:
        raise KubeconfigRefused(f"user {name!r}: {problem}")
    return token.strip()


def api_server_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an API server URL the broker sends a bearer token to, or None: https, a host, no
    user information, query or fragment."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        return f"the server URL is malformed ({exc})"
    if parts.scheme != "https" or not parts.hostname:
        return "the server URL must be https:// with a host: a token is never sent in the clear"
    if parts.username or parts.password or parts.query or parts.fragment:
        return "the server URL must carry no user, query or fragment"
    return None


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token, or None."""
    if len(token) > MAX_TOKEN_CHARS:
        return f"the token is longer than {MAX_TOKEN_CHARS} characters"
    if not token.isascii() or not token.isprintable() or " " in token:
        return "the token holds characters a bearer token cannot"
    return None


def ca_bundle_problem(pem: str) -> str | None:
    """Why ``pem`` is not a CA bundle of PEM certificates, or None."""
    if len(pem) > MAX_CA_BUNDLE_CHARS:
        return f"the CA bundle is larger than {MAX_CA_BUNDLE_CHARS // 1024} KiB"
    if PEM_CERTIFICATE not in pem:
        return "the CA bundle holds no PEM certificate"
    return None
