"""The Alibaba Cloud RPC wire format, as the sandbox speaks it: ACS3-HMAC-SHA256 signatures, the flattened
query parameters (``InstanceId.1``, ``Tag.1.Key``), the error body and opaque ``NextToken`` values.

Written from the signing rules the SDK follows (``alibabacloud_tea_openapi.utils``): canonical request =
method, path, sorted query (values percent-encoded, ``~`` kept), the signed headers lower-cased and sorted,
their names, and the hex SHA-256 of the body; the signature is the hex HMAC-SHA256 of
``"ACS3-HMAC-SHA256\\n" + hex(sha256(canonical request))`` keyed with the access key secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from werkzeug.wrappers import Response

API_VERSION = "2014-05-26"
SIGNATURE_ALGORITHM = "ACS3-HMAC-SHA256"
# What the SDK always signs; a request signing less could be altered in transit without detection.
REQUIRED_SIGNED_HEADERS = frozenset(
    {"host", "x-acs-action", "x-acs-version", "x-acs-date", "x-acs-signature-nonce", "x-acs-content-sha256"}
)
_AUTHORIZATION = re.compile(
    r"^ACS3-HMAC-SHA256 Credential=(?P<key>[^,\s]+),SignedHeaders=(?P<headers>[a-z0-9;\-]+),"
    r"Signature=(?P<signature>[0-9a-f]{64})$"
)
_INDEXED = re.compile(r"^(?P<prefix>[A-Za-z]+)\.(?P<index>\d+)(?:\.(?P<field>[A-Za-z]+))?$")
# ``Permissions.1.Ipv6SourceCidrIp``: record fields may hold digits.
_RECORD = re.compile(r"^(?P<prefix>[A-Za-z]+)\.(?P<index>\d+)\.(?P<field>[A-Za-z][A-Za-z0-9]*)$")
RESERVED_TAG_PREFIXES = ("aliyun", "acs:", "http://", "https://")
MAX_TAGS = 20


class WireError(Exception):
    """An ECS error answer: ``Code``, ``Message`` and the HTTP status it comes with."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Authorization:
    access_key_id: str
    signed_headers: tuple[str, ...]
    signature: str


def request_id() -> str:
    return str(uuid.uuid4()).upper()


def host_id(region: str) -> str:
    return f"ecs.{region}.aliyuncs.com" if region else "ecs.aliyuncs.com"


def json_ok(body: Mapping[str, Any]) -> Response:
    return Response(json.dumps({"RequestId": request_id(), **body}), status=200, mimetype="application/json")


def error_response(error: WireError, region: str) -> Response:
    """The body ECS sends with every error: RequestId, HostId, Code, Message, Recommend."""
    rid = request_id()
    body = {
        "RequestId": rid,
        "HostId": host_id(region),
        "Code": error.code,
        "Message": error.message,
        "Recommend": f"https://api.aliyun.com/troubleshoot?q={error.code}&product=Ecs&requestId={rid}",
    }
    return Response(json.dumps(body), status=error.status, mimetype="application/json")


# ----------------------------------------------------------------------------------------------- signing


def parse_authorization(header: str) -> Authorization:
    match = _AUTHORIZATION.match(header.strip())
    if match is None:
        raise WireError("IncompleteSignature", "The request signature does not conform to Aliyun standards.", 400)
    signed = tuple(match.group("headers").split(";"))
    if list(signed) != sorted(set(signed)):
        raise WireError("IncompleteSignature", "SignedHeaders must be sorted, lower-case and unique.", 400)
    missing = REQUIRED_SIGNED_HEADERS - set(signed)
    if missing:
        raise WireError("IncompleteSignature", f"The request must sign the headers {', '.join(sorted(missing))}.", 400)
    return Authorization(match.group("key"), signed, match.group("signature"))


def canonical_query(params: Mapping[str, str]) -> str:
    return "&".join(f"{key}={quote(params[key], safe='~')}" for key in sorted(params))


def canonical_request(
    method: str,
    path: str,
    params: Mapping[str, str],
    header: Callable[[str], str],
    signed_headers: tuple[str, ...],
    payload_hash: str,
) -> str:
    headers = "".join(f"{name}:{header(name).strip()}\n" for name in signed_headers)
    return "\n".join([method, path or "/", canonical_query(params), headers, ";".join(signed_headers), payload_hash])


def signature(secret: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return hmac.new(secret.encode(), f"{SIGNATURE_ALGORITHM}\n{digest}".encode(), hashlib.sha256).hexdigest()


# ------------------------------------------------------------------------------------------- parameters


def indexed_list(params: Mapping[str, str], prefix: str) -> list[str]:
    """``InstanceId.1``, ``InstanceId.2`` ... in index order."""
    found: list[tuple[int, str]] = []
    for key, value in params.items():
        match = _INDEXED.match(key)
        if match and match.group("prefix") == prefix and match.group("field") is None:
            found.append((int(match.group("index")), value))
    return [value for _, value in sorted(found)]


def indexed_pairs(params: Mapping[str, str], prefix: str = "Tag") -> list[tuple[str, str | None]]:
    """``Tag.1.Key``/``Tag.1.Value`` ... as (key, value-or-None) in index order."""
    entries: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        match = _INDEXED.match(key)
        if match and match.group("prefix") == prefix and match.group("field") in ("Key", "Value"):
            entries.setdefault(int(match.group("index")), {})[str(match.group("field"))] = value
    pairs: list[tuple[str, str | None]] = []
    for index in sorted(entries):
        if "Key" not in entries[index]:
            raise WireError("InvalidTagKey.Malformed", f"The specified {prefix}.{index}.Key is not valid.", 400)
        pairs.append((entries[index]["Key"], entries[index].get("Value")))
    return pairs


def indexed_records(params: Mapping[str, str], prefix: str) -> list[dict[str, str]]:
    """``Permissions.1.PortRange``, ``Permissions.1.SourceCidrIp``, ``Permissions.2...`` as one dict per index,
    in index order."""
    entries: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        match = _RECORD.match(key)
        if match and match.group("prefix") == prefix:
            entries.setdefault(int(match.group("index")), {})[match.group("field")] = value
    return [entries[index] for index in sorted(entries)]


def tags(params: Mapping[str, str], prefix: str = "Tag") -> dict[str, str]:
    """``Tag.N`` of a creating request, checked as ECS checks them: at most 20, unique keys, no key starting
    with ``aliyun``/``acs:`` or holding a URL scheme, keys and values at most 128 characters."""
    pairs = indexed_pairs(params, prefix)
    if len(pairs) > MAX_TAGS:
        raise WireError("InvalidTagCount", "The specified tags are beyond the permitted range.", 400)
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise WireError("Duplicate.TagKey", "The Tag.N.Key contain duplicate key.", 400)
    for tag_key, tag_value in pairs:
        if not tag_key or len(tag_key) > 128 or tag_key.startswith(RESERVED_TAG_PREFIXES):
            raise WireError("InvalidTagKey.Malformed", "The specified Tag.n.Key is not valid.", 400)
        if tag_value is not None and (len(tag_value) > 128 or tag_value.startswith(("http://", "https://"))):
            raise WireError("InvalidTagValue.Malformed", "The specified Tag.n.Value is not valid.", 400)
    return {k: v or "" for k, v in pairs}


def tags_match(held: Mapping[str, str], wanted: list[tuple[str, str | None]]) -> bool:
    """A ``Tag.N`` filter of a Describe call: every key present, with the value when one is given."""
    return all(k in held and (v is None or v == "" or held[k] == v) for k, v in wanted)


def tag_list(held: Mapping[str, str]) -> dict[str, Any]:
    """Tags as Describe answers show them."""
    return {"Tag": [{"TagKey": k, "TagValue": v} for k, v in sorted(held.items())]}


def json_list(params: Mapping[str, str], name: str, limit: int, code: str) -> list[str] | None:
    """A parameter that is a JSON array of strings (``InstanceIds``, ``KeyPairNames``); None when absent."""
    raw = params.get(name)
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed) or len(parsed) > limit:
        raise WireError(code, f'The specified parameter "{name}" is not valid.', 400)
    return parsed


def boolean(params: Mapping[str, str], name: str, default: bool = False) -> bool:
    # The Python SDK sends str(True) = "True"; other SDKs send "true".
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise WireError("InvalidParameter", f'The specified parameter "{name}" is not valid.', 400)


def integer(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise WireError("InvalidParameter", f'The specified parameter "{name}" is not valid.', 400) from None
    if not low <= value <= high:
        raise WireError("InvalidParameter", f'The specified parameter "{name}" must be in [{low}, {high}].', 400)
    return value


def required(params: Mapping[str, str], name: str) -> str:
    value = params.get(name, "")
    if not value:
        raise WireError(
            "MissingParameter",
            f'The input parameter "{name}" that is mandatory for processing this request is not supplied.',
            400,
        )
    return value


# ------------------------------------------------------------------------------------------- pagination


def query_fingerprint(params: Mapping[str, str], skip: frozenset[str]) -> str:
    canonical = json.dumps(sorted((k, v) for k, v in params.items() if k not in skip))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode_token(offset: int, fingerprint: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "q": fingerprint}).encode()).decode()


def decode_token(token: str, fingerprint: str) -> int:
    """The offset in ``token``; ``InvalidNextToken`` if this sandbox did not issue it for the same query."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset = int(data["o"])
    except (ValueError, KeyError, TypeError):
        raise WireError("InvalidNextToken.Malformed", "The specified NextToken is not valid.", 400) from None
    if data.get("q") != fingerprint or offset < 0:
        raise WireError("InvalidNextToken.Malformed", "The specified NextToken does not belong to this query.", 400)
    return offset


def token_page(items: list[Any], params: Mapping[str, str], size: int) -> tuple[list[Any], str]:
    """One ``MaxResults``/``NextToken`` page of ``items`` and the token of the next ("" after the last)."""
    fingerprint = query_fingerprint(params, frozenset({"NextToken", "MaxResults"}))
    offset = decode_token(params["NextToken"], fingerprint) if params.get("NextToken") else 0
    end = offset + size
    return items[offset:end], encode_token(end, fingerprint) if end < len(items) else ""


def number_page(items: list[Any], params: Mapping[str, str], default: int, most: int) -> tuple[list[Any], int, int]:
    """One ``PageNumber``/``PageSize`` page of ``items``, with the page number and size it used."""
    size = integer(params, "PageSize", default, 1, most)
    number = integer(params, "PageNumber", 1, 1, 1_000_000)
    return items[(number - 1) * size : number * size], number, size
