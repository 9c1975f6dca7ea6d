"""SSH public keys as buyers paste them: parsed, checked for strength, and fingerprinted as OpenSSH does.

``ssh_key_parse`` accepts one key in OpenSSH's one-line form (``ssh-ed25519 AAAA... comment``, what
``~/.ssh/id_ed25519.pub`` holds) or RFC 4716's ``---- BEGIN SSH2 PUBLIC KEY ----`` block, and answers the
canonical one-line form (type and base64 blob, no comment), the key type, its size in bits and the SHA256
fingerprint ``ssh-keygen -lf`` prints. Refusals (``SshKeyInvalid``) name the problem and never repeat the
text they were given: a private key pasted by mistake must not reach a log line or an error answer.

Accepted: Ed25519, ECDSA (NIST P-256, P-384, P-521), RSA of at least ``RSA_MIN_BITS`` bits, and the
security-key variants of Ed25519 and ECDSA. Refused: DSA (OpenSSH dropped it in 7.0 for its 1024-bit limit),
short RSA, certificates, private keys and anything that does not parse.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

RSA_MIN_BITS = 3072  # NIST SP 800-57 part 1: 3072-bit RSA for security beyond 2030
MAX_KEY_TEXT = 16 * 1024  # a 16384-bit RSA key is under 3 KB in OpenSSH form
MAX_NAME = 80

ED25519 = "ssh-ed25519"
RSA = "ssh-rsa"
ECDSA_TYPES = frozenset({"ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"})
SECURITY_KEY_TYPES = frozenset({"sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"})
KEY_TYPES = frozenset({ED25519, RSA, *ECDSA_TYPES, *SECURITY_KEY_TYPES})

_PRIVATE_MARKERS = ("PRIVATE KEY", "OPENSSH PRIVATE", "PuTTY-User-Key-File", "openssh-key-v1", "b3BlbnNzaC1rZXktdjE")
_RFC4716_BEGIN = "---- BEGIN SSH2 PUBLIC KEY ----"
_RFC4716_END = "---- END SSH2 PUBLIC KEY ----"
_COMMENT = re.compile(r"[^\x20-\x7e]")


class SshKeyInvalid(ValueError):
    """The text is not an acceptable public key; the message says why without quoting it."""


@dataclass(frozen=True, slots=True)
class SshPublicKey:
    """One validated public key. ``public_key`` is ``"<type> <base64>"``, the form every cloud accepts."""

    key_type: str
    public_key: str
    fingerprint: str  # "SHA256:<base64 without padding>", as ``ssh-keygen -lf`` prints it
    bits: int
    comment: str = ""

    @property
    def blob(self) -> bytes:
        return base64.b64decode(self.public_key.split(" ", 1)[1])


def fingerprint_sha256(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key's wire-format blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def looks_private(text: str) -> bool:
    """Does the text hold a private key (PEM, OpenSSH's own format, PuTTY's)? Checked before anything else."""
    return any(marker in text for marker in _PRIVATE_MARKERS)


def _wire_type(blob: bytes) -> str:
    """The key type named inside the blob (its first SSH string), which must agree with the line's."""
    if len(blob) < 4:
        raise SshKeyInvalid("the key's base64 data is too short to be a public key")
    (length,) = struct.unpack(">I", blob[:4])
    if length > 64 or len(blob) < 4 + length:
        raise SshKeyInvalid("the key's base64 data does not start with a key type")
    return blob[4 : 4 + length].decode("ascii", "replace")


def _from_rfc4716(text: str) -> tuple[str, str]:
    """(type, base64) from an RFC 4716 block; header lines (``Comment: ...``) and their continuations are skipped."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if lines[-1] != _RFC4716_END:
        raise SshKeyInvalid(f"an RFC 4716 key must end with {_RFC4716_END!r}")
    body: list[str] = []
    continuing = False
    for line in lines[1:-1]:
        if continuing or ":" in line:
            continuing = line.endswith("\\")
            continue
        body.append(line)
    data = "".join(body)
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise SshKeyInvalid("the RFC 4716 key's body is not base64") from None
    return _wire_type(blob), data


def ssh_key_parse(text: str) -> SshPublicKey:
    """Parse and check one public key; raises ``SshKeyInvalid`` naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise SshKeyInvalid("paste one public key, e.g. the contents of ~/.ssh/id_ed25519.pub")
    if len(text) > MAX_KEY_TEXT:
        raise SshKeyInvalid(f"a public key is at most {MAX_KEY_TEXT} characters; this text is longer")
    if looks_private(text):
        raise SshKeyInvalid(
            "this is a private key: it was not stored. Paste the public half (the .pub file) and keep the "
            "private key to yourself; if it was shared anywhere, replace it"
        )
    stripped = text.strip()
    comment = ""
    if stripped.startswith(_RFC4716_BEGIN):
        key_type, data = _from_rfc4716(stripped)
    else:
        if "\n" in stripped:
            raise SshKeyInvalid("one key per entry: the text has several lines")
        parts = stripped.split(None, 2)
        if len(parts) < 2:
            raise SshKeyInvalid("a public key reads '<type> <base64> [comment]', e.g. 'ssh-ed25519 AAAA... me@laptop'")
        key_type, data = parts[0], parts[1]
        comment = _COMMENT.sub("", parts[2])[:MAX_NAME] if len(parts) == 3 else ""
    if key_type == "ssh-dss":
        raise SshKeyInvalid("DSA keys are refused (1024-bit, disabled since OpenSSH 7.0): use ssh-keygen -t ed25519")
    if key_type.endswith("-cert-v01@openssh.com"):
        raise SshKeyInvalid("SSH certificates are not accepted: paste the plain public key")
    if key_type not in KEY_TYPES:
        raise SshKeyInvalid(
            f"unknown key type {key_type[:40]!r}: use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa (3072+ bits)"
        )
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise SshKeyInvalid("the key's data is not valid base64") from None
    if _wire_type(blob) != key_type:
        raise SshKeyInvalid("the key's data names another key type than the line does")
    line = f"{key_type} {base64.b64encode(blob).decode()}"
    try:
        loaded = serialization.load_ssh_public_key(line.encode())
    except (ValueError, TypeError, struct.error, binascii.Error):
        raise SshKeyInvalid(f"the {key_type} key does not parse: it is damaged or truncated") from None
    except Exception:  # cryptography's Rust parser raises its own types for some malformed blobs
        raise SshKeyInvalid(f"the {key_type} key does not parse: it is damaged or truncated") from None
    if isinstance(loaded, rsa.RSAPublicKey):
        bits = loaded.key_size
        if bits < RSA_MIN_BITS:
            raise SshKeyInvalid(
                f"too weak: RSA keys need at least {RSA_MIN_BITS} bits, this one has {bits}; "
                "use ssh-keygen -t ed25519 (or -t rsa -b 4096)"
            )
    elif isinstance(loaded, ec.EllipticCurvePublicKey):
        bits = loaded.curve.key_size
    elif isinstance(loaded, ed25519.Ed25519PublicKey):
        bits = 256
    else:
        raise SshKeyInvalid(f"unsupported {key_type} key")
    return SshPublicKey(
        key_type=key_type, public_key=line, fingerprint=fingerprint_sha256(blob), bits=bits, comment=comment
    )
