"""An order being configured, kept in the session between its configure, confirm and place steps.

The draft holds the buyer's secret values (secret environment variables, a registry password), so it is
encrypted with the broker's secrets key before it goes into the session row, and pages only ever render the
configuration without them. It is keyed by the form's nonce, which is also the order's idempotency key: a
confirmation sent twice finds the draft marked placed and leads to the same order.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from django.http import HttpRequest

from providers.secrets import SecretUnreadable, decrypt_secret, encrypt_secret
from untrusted.jsonbody import bounded_json

SESSION_KEY = "launch_drafts"
MAX_DRAFTS = 8  # a few tabs configuring orders at once; older drafts are dropped
MAX_NONCE = 64
# A draft is the form's fields and a validated launch configuration (a script of at most 256 K characters, each
# at most a 6-character \uXXXX escape, nesting a few levels): read back within these bounds, so a session row
# never feeds the decoder something unbounded.
MAX_DRAFT_BYTES = 4 * 1024 * 1024
MAX_DRAFT_DEPTH = 16


@dataclass
class Draft:
    nonce: str
    organization: int
    offer: int | None = None
    quote: str | None = None
    start: str = ""  # the launch template the form started from, if any
    form: dict[str, Any] = field(default_factory=dict)  # the posted fields, secret values left out
    secrets: dict[str, Any] = field(default_factory=dict)  # {"env": {name: value}, "registry_password": ...}
    launch: dict[str, Any] | None = None  # the whole configuration, secrets in; None until the form was valid
    duration_hours: str | None = None
    allow_failover: bool = True
    max_price_per_hour: str | None = None
    bid_per_gpu_hour: str | None = None  # an independent host's interruptible offer only
    template_saved: str = ""
    placed: str = ""  # the order's id once confirmed


def _all(request: HttpRequest) -> dict[str, str]:
    stored = request.session.get(SESSION_KEY)
    return dict(stored) if isinstance(stored, dict) else {}


def draft_load(request: HttpRequest, nonce: str, *, organization: int) -> Draft | None:
    """The session's draft for ``nonce`` if it was made for ``organization``; None otherwise."""
    token = _all(request).get(nonce[:MAX_NONCE]) if nonce else None
    if not token:
        return None
    try:
        body = bounded_json(decrypt_secret(token)["draft"], max_bytes=MAX_DRAFT_BYTES, max_depth=MAX_DRAFT_DEPTH)
        draft = Draft(**body)
    except (SecretUnreadable, KeyError, TypeError, ValueError):
        return None
    # Switching organisation between the steps must not place the order for the other one.
    return draft if draft.organization == organization else None


def draft_save(request: HttpRequest, draft: Draft) -> None:
    drafts = _all(request)
    drafts.pop(draft.nonce, None)
    drafts[draft.nonce] = encrypt_secret({"draft": json.dumps(asdict(draft))})
    while len(drafts) > MAX_DRAFTS:
        drafts.pop(next(iter(drafts)))
    request.session[SESSION_KEY] = drafts
