"""Fresh SSH key pairs for tests, made with ``cryptography`` (as ``ssh-keygen`` would make them)."""

from __future__ import annotations

import functools

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from providers.sshkeys import SshPublicKey, ssh_key_parse

_OPENSSH = (serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def _public(private: object, comment: str) -> str:
    line = private.public_key().public_bytes(*_OPENSSH).decode()  # type: ignore[attr-defined]
    return f"{line} {comment}" if comment else line


def _private(private: object) -> str:
    return private.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


@functools.cache
def ed25519_pair(comment: str = "alice@laptop") -> tuple[str, str]:
    """(public line, private key in OpenSSH's format); cached per comment, so a test run makes each once."""
    key = ed25519.Ed25519PrivateKey.generate()
    return _public(key, comment), _private(key)


@functools.cache
def ecdsa_public(comment: str = "alice@desktop") -> str:
    return _public(ec.generate_private_key(ec.SECP256R1()), comment)


@functools.cache
def rsa_public(bits: int = 3072, comment: str = "alice@old-laptop") -> str:
    return _public(rsa.generate_private_key(public_exponent=65537, key_size=bits), comment)


def ed25519_public(comment: str = "alice@laptop") -> str:
    return ed25519_pair(comment)[0]


def parsed(*lines: str) -> tuple[SshPublicKey, ...]:
    return tuple(ssh_key_parse(line) for line in lines)
