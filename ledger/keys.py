"""The broker's checkpoint signing keys: the current one, the one retiring during a rotation, the verifier keys
auditors check signatures with, and the history of which key signed which checkpoints (``key_history``).

Below ``ledger.services`` and ``ledger.checkpoints``: the signer uses the keys, the verifier checks against them.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import itertools
import logging
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import F, Value, Window
from django.db.models.functions import Coalesce, Lag

from ledger import note
from ledger.models import Checkpoint

log = logging.getLogger(__name__)


@cache
def signing_key() -> Ed25519PrivateKey:
    """The checkpoint key: ``LEDGER_SIGNING_KEY``, else the seed in ``LEDGER_SIGNING_KEY_FILE``, which is created
    (mode 0600) on first use when missing, so a fresh machine signs without setup."""
    encoded = settings.LEDGER_SIGNING_KEY
    source = "LEDGER_SIGNING_KEY"
    if not encoded:
        path = Path(settings.LEDGER_SIGNING_KEY_FILE)
        source = f"LEDGER_SIGNING_KEY_FILE ({path.name})"
        if not path.exists():
            seed = Ed25519PrivateKey.generate().private_bytes_raw()
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(base64.b64encode(seed).decode() + "\n")
            log.warning("made a new ledger signing key in %s; keep it safe, checkpoints are signed with it", path)
        encoded = path.read_text().strip()
    try:
        seed = base64.b64decode(encoded, validate=True)
        return Ed25519PrivateKey.from_private_bytes(seed)
    except (ValueError, binascii.Error):
        raise ImproperlyConfigured(f"{source} is not base64 of a 32-byte Ed25519 seed") from None


def previous_signing_key() -> Ed25519PrivateKey | None:
    """The retiring key during a rotation (``LEDGER_PREVIOUS_SIGNING_KEY`` or the seed in its ``_FILE``), or
    None. It cosigns the new key's first checkpoint (``checkpoint_create``) and nothing else."""
    encoded, source = settings.LEDGER_PREVIOUS_SIGNING_KEY, "LEDGER_PREVIOUS_SIGNING_KEY"
    if not encoded and settings.LEDGER_PREVIOUS_SIGNING_KEY_FILE:
        source = "LEDGER_PREVIOUS_SIGNING_KEY_FILE"
        encoded = Path(settings.LEDGER_PREVIOUS_SIGNING_KEY_FILE).read_text().strip()
    if not encoded:
        return None
    try:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        raise ImproperlyConfigured(f"{source} is not base64 of a 32-byte Ed25519 seed") from None


def verifier_key() -> str:
    """The public key auditors check checkpoint signatures with (``ledger.note`` format)."""
    return note.verifier_key(settings.LEDGER_ORIGIN, signing_key().public_key())


def _configured_keys() -> dict[str, str]:
    """The verifier keys the configuration vouches for, by key id (hex): the current key, the retiring one and
    ``LEDGER_PREVIOUS_VERIFIER_KEYS``."""
    keys = {}
    previous = previous_signing_key()
    configured = [*settings.LEDGER_PREVIOUS_VERIFIER_KEYS, verifier_key()]
    if previous is not None:
        configured.insert(0, note.verifier_key(settings.LEDGER_ORIGIN, previous.public_key()))
    for vkey in configured:
        try:
            _name, key_id, _public = note.parse_verifier_key(vkey)
        except note.NoteError as exc:
            raise ImproperlyConfigured(f"LEDGER_PREVIOUS_VERIFIER_KEYS holds a bad key: {exc}") from None
        keys[key_id.hex()] = vkey.strip()
    return keys


def verifier_keys() -> dict[str, str]:
    """Every verifier key a checkpoint may have been signed with, by key id (hex): the configured keys and every
    key a verified handover checkpoint links to one of them (``key_history``)."""
    return {p.key_id: p.verifier_key for p in key_history() if p.verifier_key and p.trusted} | _configured_keys()


@dataclass(frozen=True)
class KeyPeriod:
    """One signing key's turn: the checkpoints of sizes ``first_size``..``last_size`` (None for the current key
    before its first checkpoint). ``handover`` is the note of its first checkpoint when the key before cosigned
    it, naming this key (``ledger.note``); None for the first key and for a rotation the old key did not sign.
    ``trusted``: the configuration holds this key, or a verified handover links it to one that is."""

    key_id: str
    verifier_key: str | None
    first_size: int | None
    last_size: int | None
    first_signed_at: dt.datetime | None
    last_signed_at: dt.datetime | None
    handover: str | None
    trusted: bool


def _handover_keys(handover: str) -> tuple[str, str] | None:
    """(old, new) verifier keys of a handover note whose signatures by both verify, else None."""
    try:
        text = handover.partition("\n\n")[0] + "\n"
        named = note.parse_body(text).rotation()
        if named is None:
            return None
        for vkey in named:
            note.open_note(handover, vkey)
    except note.NoteError:
        return None
    return named


def _key_runs() -> tuple[list[list[Any]], dict[int, str]]:
    """[key_id, first_size, last_size, first_at, last_at] for each run of checkpoints by one key, and the note of
    each run's first checkpoint. The database finds where the key changes (LAG over the size order), so Python
    reads a row per rotation, not one per checkpoint (a checkpoint a minute is half a million a year)."""
    starts = list(
        Checkpoint.objects.annotate(before=Coalesce(Window(Lag("key_id"), order_by=F("size").asc()), Value("")))
        .exclude(before=F("key_id"))
        .order_by("size")
        .values_list("key_id", "size", "created_at", "note")
    )
    runs: list[list[Any]] = []
    for index, (key_id, size, created_at, _note) in enumerate(starts):
        later = (
            Checkpoint.objects.filter(size__lt=starts[index + 1][1]) if index + 1 < len(starts) else Checkpoint.objects
        )
        last_size, last_at = later.order_by("-size").values_list("size", "created_at")[0]
        runs.append([key_id, size, last_size, created_at, last_at])
    return runs, {size: text for _id, size, _at, text in starts}


_history_memo: dict[tuple[Any, ...], list[KeyPeriod]] = {}


def key_history() -> list[KeyPeriod]:
    """Every key that signed checkpoints, in size order, each with the range it signed, then the current key if
    it has signed none yet. Keys are named from the configuration and from the handover notes; a key is
    ``trusted`` only when configured or reached from a configured key through verified handovers.

    Public endpoints serve it, so it is computed once per new checkpoint: checkpoint rows are append-only, so the
    newest one's size and root stand for the whole table, and the configured keys for the rest."""
    newest = Checkpoint.objects.order_by("-size").values_list("size", "root_hash").first()
    memo_key = (newest, tuple(sorted(_configured_keys().items())))
    if newest is not None and memo_key in _history_memo:
        return _history_memo[memo_key]
    periods = _key_history()
    if newest is not None:
        _history_memo.clear()  # only the newest is ever asked for again
        _history_memo[memo_key] = periods
    return periods


def _key_history() -> list[KeyPeriod]:
    runs, notes = _key_runs()
    handovers: list[str | None] = [None]
    named: dict[str, str] = {}
    for previous, run in itertools.pairwise(runs):
        keys = _handover_keys(notes[run[1]])
        ids = None if keys is None else [note.parse_verifier_key(k)[1].hex() for k in keys]
        linked = keys is not None and ids == [previous[0], run[0]]
        handovers.append(notes[run[1]] if linked else None)
        if keys is not None and linked:
            named.update({previous[0]: keys[0], run[0]: keys[1]})
    configured = _configured_keys()
    trusted = {i for i, run in enumerate(runs) if run[0] in configured}
    grew = True
    while grew:  # a handover links both ways: the old key named its successor, the new key its predecessor
        before = len(trusted)
        trusted |= {i for i in range(1, len(runs)) if handovers[i] and i - 1 in trusted}
        trusted |= {i - 1 for i in range(1, len(runs)) if handovers[i] and i in trusted}
        grew = len(trusted) > before
    periods = []
    for i, (key_id, first, last, first_at, last_at) in enumerate(runs):
        vkey = configured.get(key_id) or named.get(key_id)
        periods.append(KeyPeriod(key_id, vkey, first, last, first_at, last_at, handovers[i], i in trusted))
    current = note.key_id(settings.LEDGER_ORIGIN, signing_key().public_key()).hex()
    if not periods or periods[-1].key_id != current:
        periods.append(KeyPeriod(current, verifier_key(), None, None, None, None, None, True))
    return periods
