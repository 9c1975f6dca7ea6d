"""What the auditor reads, read as untrusted: the formats it accepts, the bounds on a file, and the readers that
turn a bundle's, a receipt's or a state file's JSON into small typed records, or raise ``_Malformed`` naming the
field. Nothing here checks a hash or a signature: that is the checks' work."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

BUNDLE_FORMAT = "broker-ledger-audit/1"
RECEIPT_FORMAT = "broker-ledger-receipt/1"
STATE_FORMAT = "broker-ledger-audit-state/1"

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

# What the tool reads: bundles, receipts and its state file, nesting a handful of levels. A file beyond these
# bounds is refused before the decoder recurses through it.
MAX_INPUT_BYTES = 512 * 1024 * 1024
MAX_INPUT_DEPTH = 64


class _Malformed(ValueError):
    """A field missing or of the wrong type or form; ``path`` names it (``bundle.checkpoints[1].root``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path


def _get(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _Malformed(f"{path}.{key}", "is missing")
    return obj[key]


def _dict(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(path, f"is {_kind(value)}, not an object")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Malformed(path, f"is {_kind(value)}, not a list")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _Malformed(path, f"is {_kind(value)}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Malformed(path, "is not valid Unicode text (a lone surrogate)") from None
    return value


def _int(value: Any, path: str, *, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Malformed(path, f"is {_kind(value)}, not an integer")
    if value < minimum:
        raise _Malformed(path, f"is {value}, less than {minimum}")
    return value


def _hash(value: Any, path: str) -> bytes:
    """A 32-byte hash written as 64 hex digits."""
    text = _str(value, path)
    if len(text) != 64 or not set(text) <= _HEX_DIGITS:
        raise _Malformed(path, f"is not 64 hex digits: {_short(text)!r}")
    return bytes.fromhex(text)


def _hashes(value: Any, path: str) -> list[bytes]:
    return [_hash(item, f"{path}[{i}]") for i, item in enumerate(_list(value, path))]


def _tx_hash(value: Any, path: str) -> str:
    text = _str(value, path)
    digits = text[2:] if text[:2] in ("0x", "0X") else text
    if len(digits) != 64 or not set(digits) <= _HEX_DIGITS:
        raise _Malformed(path, f"is not a 32-byte hex hash: {_short(text)!r}")
    return "0x" + digits.lower()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}.get(
        type(value), "an object" if isinstance(value, dict) else type(value).__name__
    )


def _short(text: str, n: int = 16) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _hex(data: bytes) -> str:
    return _short(data.hex())


@dataclass(frozen=True)
class _Anchor:
    chain_id: int
    tx_hash: str
    block_number: int
    block_hash: str
    sender: str


@dataclass(frozen=True)
class _Checkpoint:
    size: int
    root: bytes
    note: str
    key_id: str
    anchor: _Anchor | None


@dataclass(frozen=True)
class _Entry:
    sequence: int
    kind: str
    subject: str
    created_at: str
    payload: str
    payload_hash: str
    prev_hash: str
    entry_hash: str
    leaf_hash: str
    inclusion_proof: list[bytes] | None


def _parse_checkpoint(value: Any, path: str) -> _Checkpoint:
    obj = _dict(value, path)
    anchor_value = _get(obj, "anchor", path)
    anchor = None
    if anchor_value is not None:
        apath = f"{path}.anchor"
        a = _dict(anchor_value, apath)
        anchor = _Anchor(
            chain_id=_int(_get(a, "chain_id", apath), f"{apath}.chain_id"),
            tx_hash=_tx_hash(_get(a, "tx_hash", apath), f"{apath}.tx_hash"),
            block_number=_int(_get(a, "block_number", apath), f"{apath}.block_number"),
            block_hash=_tx_hash(_get(a, "block_hash", apath), f"{apath}.block_hash"),
            sender=_str(_get(a, "sender", apath), f"{apath}.sender"),
        )
    return _Checkpoint(
        size=_int(_get(obj, "size", path), f"{path}.size", minimum=1),
        root=_hash(_get(obj, "root", path), f"{path}.root"),
        note=_str(_get(obj, "note", path), f"{path}.note"),
        key_id=_str(_get(obj, "key_id", path), f"{path}.key_id"),
        anchor=anchor,
    )


def _parse_entry(value: Any, path: str, *, with_proof: bool = False) -> _Entry:
    obj = _dict(value, path)
    fields = {name: _str(_get(obj, name, path), f"{path}.{name}") for name in _ENTRY_TEXT_FIELDS}
    proof = _hashes(_get(obj, "inclusion_proof", path), f"{path}.inclusion_proof") if with_proof else None
    return _Entry(
        sequence=_int(_get(obj, "sequence", path), f"{path}.sequence", minimum=1), inclusion_proof=proof, **fields
    )


_ENTRY_TEXT_FIELDS = (
    "kind",
    "subject",
    "created_at",
    "payload",
    "payload_hash",
    "prev_hash",
    "entry_hash",
    "leaf_hash",
)


@dataclass(frozen=True)
class _KeyPeriod:
    """One entry of the bundle's key history: a key and the sizes of the first and last checkpoint it signed
    (None for a current key that has signed none yet), and the handover note linking it to the key before."""

    verifier_key: str | None
    key_id: str
    first_size: int | None
    last_size: int | None
    handover: str | None

    def range(self) -> str:
        return "none yet" if self.first_size is None else f"{self.first_size}..{self.last_size}"

    def covers(self, size: int) -> bool:
        return self.first_size is not None and self.last_size is not None and self.first_size <= size <= self.last_size


def _parse_key_period(value: Any, path: str) -> _KeyPeriod:
    obj = _dict(value, path)

    def optional_str(name: str) -> str | None:
        return None if obj.get(name) is None else _str(obj[name], f"{path}.{name}")

    def optional_int(name: str) -> int | None:
        return None if obj.get(name) is None else _int(obj[name], f"{path}.{name}", minimum=1)

    key_id = _str(_get(obj, "key_id", path), f"{path}.key_id")
    if len(key_id) != 8 or not set(key_id) <= _HEX_DIGITS:
        raise _Malformed(f"{path}.key_id", f"is not 8 hex digits: {_short(key_id)!r}")
    first, last = optional_int("first_size"), optional_int("last_size")
    if (first is None) != (last is None):
        raise _Malformed(path, "has only one of first_size and last_size")
    return _KeyPeriod(optional_str("verifier_key"), key_id.lower(), first, last, optional_str("handover"))


def _note_key_ids(text: str) -> list[str]:
    """The key ids a note's signature lines name (hex), for saying who did sign a note that does not verify."""
    ids = []
    for line in text.partition("\n\n")[2].split("\n"):
        parts = line.split(" ")
        if len(parts) == 3:
            try:
                ids.append(base64.b64decode(parts[2], validate=True)[:4].hex())
            except ValueError:
                continue
    return ids


@dataclass(frozen=True)
class _State:
    size: int
    root: bytes
    origin: str | None
    verifier_key: str | None
    anchor_sender: str | None


def _parse_state(value: Any) -> _State:
    obj = _dict(value, "state")

    def optional(name: str) -> str | None:
        return None if obj.get(name) is None else _str(obj[name], f"state.{name}")

    return _State(
        size=_int(_get(obj, "size", "state"), "state.size", minimum=1),
        root=_hash(_get(obj, "root", "state"), "state.root"),
        origin=optional("origin"),
        verifier_key=optional("verifier_key"),
        anchor_sender=optional("anchor_sender"),
    )
