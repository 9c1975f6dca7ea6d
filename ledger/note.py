"""Signed checkpoints as plain text, in the format of C2SP's tlog-checkpoint inside a C2SP signed note.

Standard library and ``cryptography`` only (no Django), so an auditor's tool can check them. A checkpoint's
body is three lines: the log's origin, the tree size in decimal, and the base64 Merkle root. The note is the
body, a blank line, and one signature line per signer::

    gpu-broker/ledger
    1234
    x4Kz...=

    — gpu-broker/ledger AAAAAb...==

A signature line is an em dash, the key's name, and base64 of the 4-byte key id followed by the Ed25519
signature of the body. The key id is the first four bytes of SHA-256(name || 0x0A || 0x01 || public key),
so a verifier picks the right key without trying them all. A verifier key is written
``<name>+<key id hex>+<base64(0x01 || public key)>``.

A key rotation is a *handover checkpoint*: the new key's first checkpoint carries one extension line after the
root, ``key-rotation <old verifier key> <new verifier key>``, and is signed by the new key (first line) and the
old one. The old key's signature over a text naming its successor is what lets an auditor who trusts the old
key trust the new one (``ledger.audit``); signing only the same size and root would not bind the new key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

_ED25519 = b"\x01"  # the signed-note algorithm byte for Ed25519
_DASH = "\u2014"
ROTATION = "key-rotation"  # the extension line of a handover checkpoint


class NoteError(ValueError):
    """A note, key or signature that is malformed or does not verify."""


@dataclass(frozen=True)
class CheckpointBody:
    """A checkpoint's text; ``extensions`` are the lines after the root (C2SP tlog-checkpoint allows them)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "".join(line + "\n" for line in lines)

    def rotation(self) -> tuple[str, str] | None:
        """(old verifier key, new verifier key) when this is a handover checkpoint, else None."""
        for line in self.extensions:
            parts = line.split(" ")
            if parts[0] == ROTATION and len(parts) == 3:
                return parts[1], parts[2]
        return None


def rotation_line(old_vkey: str, new_vkey: str) -> str:
    """The extension line a handover checkpoint carries."""
    return f"{ROTATION} {old_vkey.strip()} {new_vkey.strip()}"


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, public_key: Ed25519PublicKey) -> bytes:
    """The 4-byte id a signature line carries for ``name``'s key."""
    return hashlib.sha256(name.encode() + b"\n" + _ED25519 + _raw_public(public_key)).digest()[:4]


def verifier_key(name: str, public_key: Ed25519PublicKey) -> str:
    """The public half, as one line an auditor can be given: ``name+keyid+base64(0x01 || key)``."""
    encoded = base64.b64encode(_ED25519 + _raw_public(public_key)).decode()
    return f"{name}+{key_id(name, public_key).hex()}+{encoded}"


def parse_verifier_key(vkey: str) -> tuple[str, bytes, Ed25519PublicKey]:
    """(name, key id, public key) from a verifier key line; raises ``NoteError`` if it is malformed."""
    try:
        name, id_hex, encoded = vkey.strip().split("+", 2)  # a name has no "+", base64 may
        raw = base64.b64decode(encoded, validate=True)
        expected_id = bytes.fromhex(id_hex)
    except (ValueError, binascii.Error) as exc:
        raise NoteError(f"verifier key is malformed: {exc}") from None
    if not name or len(raw) != 33 or raw[:1] != _ED25519:
        raise NoteError("verifier key is not an Ed25519 signed-note key")
    public_key = Ed25519PublicKey.from_public_bytes(raw[1:])
    if key_id(name, public_key) != expected_id:
        raise NoteError("verifier key's id does not match its name and key")
    return name, expected_id, public_key


def sign(body: CheckpointBody, name: str, private_key: Ed25519PrivateKey, *cosigners: Ed25519PrivateKey) -> str:
    """The signed note for ``body``: a signature line by ``private_key``, then one per cosigner (same name).

    The first line is the signer's: a verifier that takes the first line with the key's name (the storefront's
    receipt page does) then checks the current key."""
    text = body.text()
    lines = []
    for key in (private_key, *cosigners):
        stamp = base64.b64encode(key_id(name, key.public_key()) + key.sign(text.encode())).decode()
        lines.append(f"{_DASH} {name} {stamp}\n")
    return f"{text}\n{''.join(lines)}"


def parse_body(text: str) -> CheckpointBody:
    """The checkpoint in a note's body (origin, size, root); raises ``NoteError`` if it is malformed."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise NoteError("checkpoint body must be origin, size and root lines, each ending in a newline")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    # ASCII only: str.isdigit() would accept other scripts' digits and superscripts, which int() mangles.
    if not origin or not re.fullmatch(r"0|[1-9][0-9]*", size_text):
        raise NoteError("checkpoint body has no origin or a size that is not a decimal number")
    try:
        root = base64.b64decode(root_text, validate=True)
    except binascii.Error:
        raise NoteError("checkpoint root is not base64") from None
    if len(root) != 32:
        raise NoteError("checkpoint root is not 32 bytes")
    return CheckpointBody(origin, int(size_text), root, tuple(lines[3:-1]))


def open_note(note: str, vkey: str) -> CheckpointBody:
    """The checkpoint a note states, after checking its signature by ``vkey``'s key.

    Raises ``NoteError`` when the note is malformed, carries no signature by that key, or the signature does
    not verify. Signatures by other keys are ignored, as the signed-note format allows.
    """
    name, expected_id, public_key = parse_verifier_key(vkey)
    text, separator, signatures = note.partition("\n\n")
    if not separator:
        raise NoteError("note has no blank line between its text and its signatures")
    text += "\n"
    body = parse_body(text)
    for line in signatures.split("\n"):
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != _DASH:
            raise NoteError(f"malformed signature line: {line!r}")
        if parts[1] != name:
            continue
        try:
            stamp = base64.b64decode(parts[2], validate=True)
        except binascii.Error:
            raise NoteError("signature is not base64") from None
        if stamp[:4] != expected_id:
            continue
        try:
            public_key.verify(stamp[4:], text.encode())
        except InvalidSignature:
            raise NoteError(f"signature by {name} does not verify") from None
        return body
    raise NoteError(f"note carries no signature by {name}")
