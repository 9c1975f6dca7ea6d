"""Independent verification of a broker ledger receipt (format ``broker-ledger-receipt/1``).

Written from the published definitions, not from the broker's code, so that it is a second opinion on what
the broker claims. A receipt holds one order's ledger entries, each with an RFC 9162 inclusion proof against
the newest checkpoint, and that checkpoint as a C2SP signed note. Verifying it means:

1. **signature**: the checkpoint note carries an Ed25519 signature, in the C2SP signed-note format, by the
   verifier key, and its body (origin, tree size, root) is what the receipt says the checkpoint is;
2. for each entry, **payload**: SHA-256 of the payload text (UTF-8) is its ``payload_hash``;
3. **leaf**: the entry's leaf hash, recomputed as SHA-256(0x00 || envelope) where the envelope is the canonical
   JSON of ``{"created_at", "kind", "prev", "payload_sha256", "sequence", "subject"}`` (keys sorted, no
   whitespace, UTF-8, non-ASCII left as is; ``sequence`` a number, the rest strings), equals the published
   ``leaf_hash``, and SHA-256(envelope) equals the published ``entry_hash``;
4. **inclusion**: the inclusion proof leads from that recomputed leaf, at index ``sequence - 1``, to the
   signed root of a tree of the signed size.

Entries newer than the newest checkpoint are *pending*: the receipt lists them without proofs until the
broker signs a checkpoint that covers them. Pending is not a failure: the result's verdict is ``pending`` when
no check failed and some entry is still pending (everything covered was verified in full), ``verified`` when
every entry is proven, ``failed`` otherwise. An entry listed as pending that the signed checkpoint does cover is
a failure: the broker owes its proof. Entries listed as *queued* are written but not yet sequenced into the
chain (they have no sequence or hashes yet): they too make the verdict ``pending``.

Which key is trusted matters. A receipt carries the server's verifier key, and so does
``GET /api/v1/ledger/key``: checking against a key from the same server only shows that whoever answered
signed it. Pin the key you obtained out of band (``trusted_key``) to show it was the broker's key you trust.

Keys rotate. A receipt also carries the key history: each key in turn, and for each key after the first its
*handover*, the note of its first checkpoint, whose text ends with the line ``key-rotation <old key> <new key>``
and which both keys signed. A pinned key reaches the key that signed the receipt's checkpoint only through
handovers that verify (forwards: the old key named its successor; backwards: the new key named its
predecessor); the history's other claims are not needed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "RECEIPT_FORMAT",
    "Check",
    "CheckpointStatement",
    "ReceiptInvalid",
    "ReceiptPending",
    "RememberedCheckpoint",
    "VerificationResult",
    "VerifierKey",
    "canonical_json",
    "checkpoint_open",
    "consistency_verify",
    "envelope_bytes",
    "inclusion_verify",
    "keys_reached",
    "leaf_hash",
    "remembered_check",
    "verifier_key_parse",
    "verify_receipt",
]

RECEIPT_FORMAT = "broker-ledger-receipt/1"
HASH_SIZE = 32
_ED25519_ALG = 0x01  # the signed-note signature type byte for Ed25519
_DASH = "\u2014"  # signature lines start with an em dash
_MAX_TREE_SIZE = 2**64 - 1  # RFC 9162 sizes are uint64
_HEX64 = re.compile(r"[0-9a-f]{64}")


# --- Results ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check: ``name`` is ``format``, ``subject``, ``key``, ``checkpoint``, ``signature``, ``payload``,
    ``leaf``, ``inclusion`` or ``pending``; ``entry`` the entry's sequence number when it is about one."""

    name: str
    ok: bool
    message: str
    entry: int | None = None

    def line(self) -> str:
        where = f"entry #{self.entry} " if self.entry is not None else ""
        return f"{'ok' if self.ok else 'FAILED':<7}{self.name:<11}{where}{self.message}"


VERIFIED, PENDING, FAILED = "verified", "pending", "failed"


@dataclass
class VerificationResult:
    """Every check made, in order. ``ok`` when none failed and at least one entry was proven; ``verdict`` is
    ``verified`` (every entry proven), ``pending`` (none failed, some entry not yet in a signed checkpoint) or
    ``failed``."""

    checks: list[Check] = field(default_factory=list)
    key_pinned: bool = False
    key_handed_over: bool = False  # the checkpoint's key is not the pinned one but follows from it by handovers
    verified_entries: int = 0
    pending_entries: int = 0
    first_pending: int | None = None  # the sequence of the first entry no signed checkpoint covers yet
    queued_entries: int = 0  # entries written but not yet given their place in the chain by the sequencer
    signed_size: int = 0  # the size of the receipt's checkpoint once its signature verified (0 without one)
    checkpoint: CheckpointStatement | None = None  # the signed checkpoint, once its signature verified

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return not self.failures and self.verified_entries > 0

    @property
    def pending(self) -> bool:
        """No check failed, and some entry waits for a checkpoint: ask again later (``broker receipt --wait``)."""
        waiting = (self.pending_entries > 0 and self.first_pending is not None) or self.queued_entries > 0
        return not self.failures and waiting

    @property
    def verdict(self) -> str:
        if self.pending:
            return PENDING
        return VERIFIED if self.ok else FAILED

    def pending_message(self) -> str:
        parts = []
        if self.first_pending is not None:
            parts.append(
                f"entry {self.first_pending} is not yet in a signed checkpoint (newest signed size {self.signed_size})"
            )
        if self.queued_entries:
            parts.append(f"{self.queued_entries} newer entries are queued, not yet sequenced into the chain")
        return "; ".join(parts)

    def summary(self) -> str:
        how = "the pinned key" if self.key_pinned else "the key the receipt carries (not pinned)"
        how = "a key the pinned key handed over to" if self.key_handed_over else how
        if self.pending:
            text = f"receipt PENDING: {self.pending_message()}"
            if self.verified_entries:
                text += f"; the {self.verified_entries} entries before it proven against a checkpoint signed by {how}"
            return text
        if self.ok:
            return f"receipt VERIFIED: {self.verified_entries} entries proven against a checkpoint signed by {how}"
        first = self.failures[0] if self.failures else None
        if first is None:
            return "receipt FAILED: checkpoint: the receipt proves no entry"
        where = f" (entry #{first.entry})" if first.entry is not None else ""
        return f"receipt FAILED: {first.name}{where}: {first.message}"

    def text(self) -> str:
        return "\n".join([*(c.line() for c in self.checks), self.summary()])

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "key_pinned": self.key_pinned,
            "verified_entries": self.verified_entries,
            "pending_entries": self.pending_entries,
            "first_pending": self.first_pending if self.pending else None,
            "queued_entries": self.queued_entries,
            "signed_size": self.signed_size,
            "checks": [{"name": c.name, "entry": c.entry, "ok": c.ok, "message": c.message} for c in self.checks],
            "summary": self.summary(),
        }

    def raise_if_failed(self) -> None:
        """``ReceiptInvalid`` when a check failed; ``ReceiptPending`` when none did but no entry is proven yet.
        A receipt that proves some entries and has newer ones pending raises nothing: see ``pending``."""
        if self.verdict == FAILED:
            raise ReceiptInvalid(self)
        if not self.ok:
            raise ReceiptPending(self)


class ReceiptInvalid(Exception):
    """A receipt that did not verify; ``result`` names every failed check."""

    def __init__(self, result: VerificationResult) -> None:
        super().__init__(result.summary())
        self.result = result

    @property
    def failures(self) -> list[Check]:
        return self.result.failures


class ReceiptPending(Exception):
    """A receipt none of whose checks failed but whose entries no signed checkpoint covers yet: not evidence of
    tampering; ask again once the broker has signed one. ``result`` has ``first_pending`` and ``signed_size``."""

    def __init__(self, result: VerificationResult) -> None:
        super().__init__(result.summary())
        self.result = result


class _Bad(ValueError):
    """Malformed input, raised inside and turned into a failed check."""


# --- Canonical form and hashes ---------------------------------------------------------------------------------


def _no_floats(value: Any) -> Any:
    if isinstance(value, float):
        raise _Bad("a float has no canonical form here")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Bad("object keys must be strings")
            _no_floats(item)
    elif isinstance(value, list):
        for item in value:
            _no_floats(item)
    elif not (value is None or isinstance(value, str | int | bool)):
        raise _Bad(f"{type(value).__name__} has no canonical JSON form")
    return value


def canonical_json(value: Any) -> bytes:
    """The broker's canonical JSON: keys sorted, no insignificant whitespace, UTF-8 with non-ASCII characters
    written as themselves, and no floats (the broker writes money and measurements as strings)."""
    text = json.dumps(_no_floats(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad("text is not valid Unicode (a lone surrogate)") from None


def envelope_bytes(
    *, sequence: int, kind: str, subject: str, created_at: str, payload_hash: str, prev_hash: str
) -> bytes:
    """The bytes an entry's ``entry_hash`` is taken over, which are also its Merkle leaf."""
    return canonical_json(
        {
            "created_at": created_at,
            "kind": kind,
            "payload_sha256": payload_hash,
            "prev": prev_hash,
            "sequence": sequence,
            "subject": subject,
        }
    )


def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 leaf hash: SHA-256(0x00 || data)."""
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


# --- Inclusion proofs ------------------------------------------------------------------------------------------


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_TREE_SIZE


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def inclusion_verify(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether ``proof`` is the audit path of the leaf hash ``leaf`` at ``index`` in the tree of ``size`` leaves
    whose root is ``root``. Never raises: anything that is not such a proof is ``False``.

    Follows the definition of the path (RFC 6962 section 2.1.1) rather than the bit-walking verifier of
    RFC 9162 section 2.1.3.2: a tree of n > 1 leaves splits at k, the largest power of two below n; the path
    of a leaf in the left part is its path there followed by the right part's root, and vice versa. So the
    proof's last element is the sibling at the top, its first the sibling next to the leaf. Walking down from
    the top fixes which side each sibling is on and how many there must be; folding up from the leaf gives
    the root.
    """
    if not (_is_hash(leaf) and _is_hash(root) and _is_count(index) and _is_count(size)) or index >= size:
        return False
    if isinstance(proof, str | bytes | bytearray) or not isinstance(proof, Sequence):
        return False
    siblings = list(proof)
    if len(siblings) > 64 or not all(_is_hash(p) for p in siblings):
        return False
    sibling_on_left: list[bool] = []  # top of the tree first
    position, width = index, size
    while width > 1:
        split = 1 << ((width - 1).bit_length() - 1)
        if position < split:
            sibling_on_left.append(False)
            width = split
        else:
            sibling_on_left.append(True)
            position, width = position - split, width - split
    if len(siblings) != len(sibling_on_left):
        return False
    node = leaf
    for sibling, on_left in zip(siblings, reversed(sibling_on_left), strict=True):
        node = _node(sibling, node) if on_left else _node(node, sibling)
    return node == root


def consistency_verify(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """Whether ``proof`` shows that the tree of ``old_size`` leaves with root ``old_root`` is the prefix of the
    tree of ``new_size`` leaves with root ``new_root`` (0 < old_size <= new_size). Never raises.

    Follows the definition of the proof (RFC 6962 section 2.1.2), as ``inclusion_verify`` does for paths:
    walking down from the whole tree towards the old tree's last leaf, a range that holds the old size splits
    at k; when the old tree ends in the left part, the right part is new and its root is in the proof; when it
    ends in the right part, the left part is wholly old and its root is in the proof too. Where the walk stops,
    the node that ends the old tree is either the old tree itself (left out of the proof: the verifier has it)
    or the proof's first element. Folding back up rebuilds both roots.
    """
    if not (_is_count(old_size) and _is_count(new_size)) or not 0 < old_size <= new_size:
        return False
    if isinstance(proof, str | bytes | bytearray) or not isinstance(proof, Sequence):
        return False
    if old_size == new_size:  # one tree: nothing to prove but that the roots are the same
        return len(proof) == 0 and isinstance(old_root, bytes) and old_root == new_root
    if not (_is_hash(old_root) and _is_hash(new_root)):
        return False
    elements = list(proof)
    if len(elements) > 64 or not all(_is_hash(p) for p in elements):
        return False
    old_part_on_left: list[bool] = []  # top of the tree first: True when the sibling is a wholly old left part
    low, high, whole_old_tree = 0, new_size, True
    while old_size != high:
        split = low + (1 << ((high - low - 1).bit_length() - 1))
        if old_size <= split:
            old_part_on_left.append(False)
            high = split
        else:
            old_part_on_left.append(True)
            low = split
            whole_old_tree = False
    expected = len(old_part_on_left) + (0 if whole_old_tree else 1)
    if len(elements) != expected:
        return False
    if whole_old_tree:
        old_node = new_node = old_root
    else:
        old_node = new_node = elements.pop(0)
    for sibling, on_left in zip(elements, reversed(old_part_on_left), strict=True):
        if on_left:
            old_node, new_node = _node(sibling, old_node), _node(sibling, new_node)
        else:
            new_node = _node(new_node, sibling)  # a part of the new tree only
    return old_node == old_root and new_node == new_root


@dataclass(frozen=True)
class RememberedCheckpoint:
    """The newest checkpoint a reader has verified, kept between runs (``broker receipt --verify --state``) so
    that every later checkpoint can be checked to extend it: a ledger rewritten after the fact, or shown
    differently to different readers, cannot extend what was seen before."""

    origin: str
    size: int
    root: bytes

    @classmethod
    def from_json(cls, data: Any) -> RememberedCheckpoint:
        """Raises ``ValueError`` for anything but ``{"origin", "size", "root" (64 hex digits)}``."""
        if not isinstance(data, dict) or not isinstance(data.get("origin"), str) or not _is_count(data.get("size")):
            raise ValueError('expected {"origin": text, "size": count, "root": 64 hex digits}')
        if not isinstance(data.get("root"), str) or not _HEX64.fullmatch(data["root"]) or data["size"] == 0:
            raise ValueError("the root must be 64 lower-case hex digits and the size positive")
        return cls(data["origin"], data["size"], bytes.fromhex(data["root"]))

    @classmethod
    def of(cls, statement: CheckpointStatement) -> RememberedCheckpoint:
        return cls(statement.origin, statement.size, statement.root)

    def as_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "size": self.size, "root": self.root.hex()}


def remembered_check(remembered: RememberedCheckpoint, signed: CheckpointStatement, proof: Sequence[bytes]) -> Check:
    """Whether ``signed`` and ``remembered`` are one history: ``proof`` (the ledger's consistency proof from the
    smaller size to the larger; empty for equal sizes) must show the smaller tree is a prefix of the larger."""
    if remembered.origin != signed.origin:
        return Check("consistency", False, f"the checkpoint is of log {signed.origin!r}, not the remembered "
                     f"{remembered.origin!r}")  # fmt: skip
    older, newer = (remembered, signed) if remembered.size <= signed.size else (signed, remembered)
    if consistency_verify(older.size, newer.size, older.root, newer.root, proof):
        if signed.size == remembered.size:
            return Check("consistency", True, f"checkpoint {signed.size} is the remembered checkpoint")
        relation = "extends" if signed.size > remembered.size else "precedes"
        return Check("consistency", True, f"checkpoint {signed.size} {relation} the remembered {remembered.size}")
    message = (
        f"checkpoint {signed.size} and the remembered checkpoint {remembered.size} are not one history: "
        "the ledger was rewritten, or is shown differently to different readers"
    )
    return Check("consistency", False, message)


# --- Signed notes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifierKey:
    """A C2SP signed-note verifier key ``<name>+<key id, 8 hex digits>+<base64(0x01 || Ed25519 key)>``."""

    name: str
    key_id: bytes
    public_key: Ed25519PublicKey
    text: str


def _key_id(name: str, raw_public: bytes) -> bytes:
    # C2SP signed-note: the first four bytes of SHA-256(name || "\n" || signature type || public key).
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([_ED25519_ALG]) + raw_public).digest()[:4]


def verifier_key_parse(text: str) -> VerifierKey:
    """Parse a verifier key; raises ``ValueError`` naming what is wrong."""
    parts = text.strip().split("+")
    if len(parts) < 3:
        raise ValueError("a verifier key is <name>+<key id>+<key>")
    # A name never holds "+" (the format forbids it); base64 may, so everything after the second "+" is key.
    name, id_hex, encoded = parts[0], parts[1], "+".join(parts[2:])
    if not name or any(ch.isspace() for ch in name):
        raise ValueError("the key's name is empty or has white space")
    if not re.fullmatch(r"[0-9a-fA-F]{8}", id_hex):
        raise ValueError("the key id is not 8 hex digits")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key is not base64") from None
    if len(raw) != 33 or raw[0] != _ED25519_ALG:
        raise ValueError("the key is not an Ed25519 signed-note key")
    if _key_id(name, raw[1:]) != bytes.fromhex(id_hex):
        raise ValueError("the key id does not match the name and key")
    return VerifierKey(name, bytes.fromhex(id_hex), Ed25519PublicKey.from_public_bytes(raw[1:]), text.strip())


@dataclass(frozen=True)
class CheckpointStatement:
    origin: str
    size: int
    root: bytes


def checkpoint_open(note: str, key: VerifierKey) -> CheckpointStatement:
    """The checkpoint a signed note states, once a signature by ``key`` on it verifies; raises ``ValueError``.

    The note is its text (lines ending in a newline), a blank line, and signature lines
    ``— <name> <base64(key id || signature)>``, each ending in a newline. Signatures by other keys are
    skipped, as the format allows. The text is a C2SP checkpoint: origin, decimal size, base64 root, then
    optional extension lines, which are signed but carry nothing this verifier needs.
    """
    if not note.endswith("\n"):
        raise ValueError("the note does not end in a newline")
    cut = note.find("\n\n")
    if cut < 0:
        raise ValueError("the note has no blank line before its signatures")
    text, signature_block = note[: cut + 1], note[cut + 2 :]
    signed = text.encode("utf-8")
    found = False
    for line in signature_block[:-1].split("\n"):
        match = re.fullmatch(f"{_DASH} (\\S+) (\\S+)", line)
        if match is None:
            raise ValueError(f"malformed signature line {line[:60]!r}")
        if match.group(1) != key.name:
            continue
        try:
            stamp = base64.b64decode(match.group(2), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a signature is not base64") from None
        if len(stamp) != 4 + 64 or stamp[:4] != key.key_id:
            continue
        try:
            key.public_key.verify(stamp[4:], signed)
        except InvalidSignature:
            raise ValueError(f"the signature by {key.name} ({key.key_id.hex()}) does not verify") from None
        found = True
        break
    if not found:
        raise ValueError(f"the note carries no signature by the key {key.name}+{key.key_id.hex()}")
    lines = text.split("\n")[:-1]
    if len(lines) < 3:
        raise ValueError("the checkpoint needs an origin, a size and a root line")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    if not origin or not re.fullmatch(r"0|[1-9][0-9]{0,19}", size_text) or int(size_text) > _MAX_TREE_SIZE:
        raise ValueError("the checkpoint's origin is empty or its size is not a decimal number")
    try:
        root = base64.b64decode(root_text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the checkpoint's root is not base64") from None
    if len(root) != HASH_SIZE:
        raise ValueError("the checkpoint's root is not 32 bytes")
    return CheckpointStatement(origin, int(size_text), root)


def _rotation_named(note: str) -> tuple[str, str] | None:
    """The (old, new) verifier keys a handover note's ``key-rotation`` extension line names, if it has one."""
    text = note.split("\n\n", 1)[0]
    for line in text.split("\n")[3:]:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "key-rotation":
            return parts[1], parts[2]
    return None


def _handover_problem(history: list[Any], index: int, keys: list[VerifierKey | None]) -> str:
    """Why ``keys[index]`` is not linked to the key before it in ``history``, or "" when its handover verifies."""
    old, new, period = keys[index - 1], keys[index], history[index]
    if old is None or new is None:
        return f"key_history[{index - 1}] or [{index}] has no usable verifier key"
    where = f"the rotation from {old.key_id.hex()} to {new.key_id.hex()}"
    handover = period.get("handover")
    if not isinstance(handover, str):
        return f"{where} has no handover: the old key did not cosign the new key's first checkpoint"
    try:
        statement = checkpoint_open(handover, new)
        checkpoint_open(handover, old)
    except ValueError as exc:
        return f"{where}: its handover is not signed by both keys: {exc}"
    if _rotation_named(handover) != (old.text, new.text):
        return f"{where}: its handover does not name the old key handing over to the new one"
    if statement.size != period.get("first_size"):
        return f"{where}: its handover is checkpoint {statement.size}, not the new key's first"
    return ""


def keys_reached(history: Any, pinned: VerifierKey) -> tuple[dict[bytes, VerifierKey], str]:
    """The keys of a key history (``receipt["key_history"]``) that verified handovers link to ``pinned``, by key
    id (``pinned`` included), and why the chain stops where it does ("" when it reaches every key)."""
    reached = {pinned.key_id: pinned}
    if not isinstance(history, list) or not all(isinstance(p, dict) for p in history):
        return reached, "the receipt has no usable key history"
    keys: list[VerifierKey | None] = []
    for period in history:
        try:
            keys.append(verifier_key_parse(str(period.get("verifier_key") or "")))
        except ValueError:
            keys.append(None)
    start = next((i for i, k in enumerate(keys) if k is not None and k.text == pinned.text), None)
    if start is None:
        return reached, "the pinned key is not in the receipt's key history"
    stops = []
    for step in (1, -1):
        i = start
        while 0 <= i + step < len(keys):
            problem = _handover_problem(history, max(i, i + step), keys)
            if problem:
                stops.append(problem)
                break
            i += step
            found = keys[i]
            assert found is not None  # a verified handover parsed both keys
            reached[found.key_id] = found
    return reached, "; ".join(stops)


# --- The receipt -----------------------------------------------------------------------------------------------


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise _Bad(f"{name} is missing or not a string")
    return value


def _hex_hash(obj: dict[str, Any], name: str) -> bytes:
    value = _text(obj, name)
    if not _HEX64.fullmatch(value):
        raise _Bad(f"{name} is not 64 lowercase hex digits")
    return bytes.fromhex(value)


def verify_receipt(receipt: Any, *, trusted_key: str | None = None, order_id: str | None = None) -> VerificationResult:
    """Verify ``receipt`` (the JSON of ``GET /api/v1/orders/<id>/receipt``) and return every check made.

    ``trusted_key`` pins the verifier key (recommended: one obtained out of band); without it the receipt's own
    key is used and the result says the key was not pinned. ``order_id`` also checks that the receipt is that
    order's. Never raises for bad input: a malformed receipt is a failed check. Call ``raise_if_failed()`` on
    the result to get a ``ReceiptInvalid``.
    """
    result = VerificationResult(key_pinned=trusted_key is not None)
    checks = result.checks

    def fail(name: str, message: str, entry: int | None = None) -> VerificationResult:
        checks.append(Check(name, False, message, entry))
        return result

    if not isinstance(receipt, dict):
        return fail("format", "the receipt is not a JSON object")
    if receipt.get("format") != RECEIPT_FORMAT:
        return fail("format", f"format is {receipt.get('format')!r}, not {RECEIPT_FORMAT!r}")
    subject = receipt.get("subject")
    if not isinstance(subject, str):
        return fail("subject", "the receipt names no subject")
    if order_id is not None and subject != f"order:{order_id}":
        return fail("subject", f"the receipt is for {subject!r}, not order {order_id}")
    if isinstance(receipt.get("problem"), str):
        fail("checkpoint", f"the server reports a problem: {receipt['problem']}")

    try:
        key = verifier_key_parse(trusted_key if trusted_key is not None else str(receipt.get("verifier_key", "")))
    except ValueError as exc:
        return fail("key", f"{'the pinned key' if trusted_key is not None else 'the receipt key'} is unusable: {exc}")
    stated_key = str(receipt.get("verifier_key", "")).strip()
    pinned, broken = key, ""
    checkpoint = receipt.get("checkpoint")
    signer_id = checkpoint.get("key_id") if isinstance(checkpoint, dict) else None
    if trusted_key is not None and isinstance(signer_id, str) and signer_id != key.key_id.hex():
        # The checkpoint is another key's: follow the key history's handovers from the pinned key to it.
        reached, broken = keys_reached(receipt.get("key_history"), key)
        key = next((k for k in reached.values() if k.key_id.hex() == signer_id), key)
    if trusted_key is None:
        checks.append(Check("key", True, f"using the receipt's own key {key.name}+{key.key_id.hex()} (not pinned)"))
    elif key is not pinned:
        result.key_handed_over = True
        message = f"pinned {pinned.name}+{pinned.key_id.hex()}; the checkpoint's key {key.key_id.hex()} follows "
        checks.append(Check("key", True, message + "from it by handovers both keys signed"))
    elif stated_key != key.text:
        checks.append(Check("key", True, f"pinned {key.name}+{key.key_id.hex()}; the receipt names another key"))
    else:
        checks.append(Check("key", True, f"pinned {key.name}+{key.key_id.hex()}, the key the receipt names"))

    pending = _pending_sequences(receipt.get("pending"))
    if isinstance(pending, str):
        return fail("format", pending)
    result.pending_entries = len(pending)
    result.first_pending = min(pending, default=None)
    queued = receipt.get("queued", [])
    if not isinstance(queued, list) or not all(isinstance(e, dict) and e.get("sequence") is None for e in queued):
        return fail("format", "queued is not a list of entries without a sequence")
    result.queued_entries = len(queued)
    entries = receipt.get("entries")
    if not isinstance(entries, list):
        return fail("format", "entries is not a list")
    if checkpoint is None:
        if entries:
            return fail("checkpoint", "the receipt lists proven entries but no checkpoint")
        if not pending and not queued:
            return fail("checkpoint", "the receipt has neither a checkpoint nor an entry")
        checks.append(Check("pending", True, f"no checkpoint yet: {result.pending_message()}"))
        return result
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("note"), str):
        return fail("checkpoint", "the checkpoint has no signed note")

    try:
        signed = checkpoint_open(checkpoint["note"], key)
    except ValueError as exc:
        return fail("signature", f"{exc}; the key history does not lead there: {broken}" if broken else str(exc))
    checks.append(Check("signature", True, f"checkpoint of size {signed.size} signed by {key.name}"))
    result.checkpoint, result.signed_size = signed, signed.size
    differences = []
    if signed.origin != receipt.get("origin"):
        differences.append(f"origin {signed.origin!r} is not the receipt's {receipt.get('origin')!r}")
    if signed.size != checkpoint.get("size"):
        differences.append(f"size {signed.size} is not the stated {checkpoint.get('size')!r}")
    if signed.root.hex() != checkpoint.get("root"):
        differences.append("root differs from the stated root")
    if differences:
        return fail("checkpoint", "the signed note disagrees with the receipt: " + "; ".join(differences))

    for position, entry in enumerate(entries):
        _verify_entry(result, position, entry, subject, signed)
    if not entries and not pending and not queued:
        fail("checkpoint", "the receipt proves no entry")
    # A server could call a changed entry "pending" to keep it from being checked: one the signed checkpoint
    # covers must come with its proof.
    owed = sorted(s for s in pending if s <= signed.size)
    for sequence in owed:
        fail("pending", f"listed as pending, but the signed checkpoint of size {signed.size} covers it", sequence)
    if (pending or queued) and not owed:
        checks.append(Check("pending", True, result.pending_message()))
    return result


def _pending_sequences(pending: Any) -> list[int] | str:
    """The sequences of the receipt's pending entries, or what is wrong with the list."""
    if pending is None:
        return []
    if not isinstance(pending, list):
        return "pending is not a list"
    sequences = [entry.get("sequence") if isinstance(entry, dict) else None for entry in pending]
    if not all(_is_count(s) and s for s in sequences):
        return "a pending entry has no positive sequence"
    return [s for s in sequences if isinstance(s, int)]


def _verify_entry(
    result: VerificationResult, position: int, entry: Any, subject: str, signed: CheckpointStatement
) -> None:
    checks = result.checks
    sequence = entry.get("sequence") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not _is_count(sequence) or sequence == 0:
        checks.append(Check("format", False, f"entries[{position}] is not an entry with a positive sequence"))
        return
    assert isinstance(sequence, int)
    try:
        if _text(entry, "subject") != subject:
            raise _Bad(f"subject {entry['subject']!r} is not the receipt's")
        payload = _text(entry, "payload")
        payload_hash = _hex_hash(entry, "payload_hash")
        envelope = envelope_bytes(
            sequence=sequence,
            kind=_text(entry, "kind"),
            subject=subject,
            created_at=_text(entry, "created_at"),
            payload_hash=_text(entry, "payload_hash"),
            prev_hash=_text(entry, "prev_hash"),
        )
        stated_entry_hash, stated_leaf = _hex_hash(entry, "entry_hash"), _hex_hash(entry, "leaf_hash")
        raw_proof = entry.get("inclusion_proof")
        if not isinstance(raw_proof, list) or not all(isinstance(p, str) and _HEX64.fullmatch(p) for p in raw_proof):
            raise _Bad("its inclusion_proof is missing or not a list of 64-hex-digit hashes")
        proof = [bytes.fromhex(p) for p in raw_proof]
        payload_bytes = payload.encode("utf-8")
    except (_Bad, UnicodeEncodeError) as exc:
        checks.append(Check("format", False, str(exc), sequence))
        return
    ok = True
    if hashlib.sha256(payload_bytes).digest() != payload_hash:
        checks.append(Check("payload", False, "the payload does not hash to its payload_hash", sequence))
        ok = False
    leaf = leaf_hash(envelope)
    if leaf != stated_leaf or hashlib.sha256(envelope).digest() != stated_entry_hash:
        what = "leaf_hash" if leaf != stated_leaf else "entry_hash"
        checks.append(Check("leaf", False, f"the {what} differs from the one recomputed from its fields", sequence))
        ok = False
    if sequence > signed.size:
        checks.append(Check("inclusion", False, f"beyond the checkpoint's {signed.size} entries", sequence))
        ok = False
    elif not inclusion_verify(leaf, sequence - 1, signed.size, proof, signed.root):
        message = f"the inclusion proof does not lead to the signed root of size {signed.size}"
        checks.append(Check("inclusion", False, message, sequence))
        ok = False
    if ok:
        kind = entry.get("kind")
        checks.append(Check("inclusion", True, f"{kind} recomputed and included in checkpoint {signed.size}", sequence))
        result.verified_entries += 1
