"""Public keys as buyers paste them: accepted types and sizes, fingerprints as ssh-keygen prints them, and every
refusal naming the problem without repeating the text (a private key must not travel twice)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess

import pytest

from providers.sshkeys import RSA_MIN_BITS, SshKeyInvalid, fingerprint_sha256, ssh_key_parse
from tests.sshkeys import ecdsa_public, ed25519_pair, ed25519_public, rsa_public


def test_ed25519_ecdsa_and_rsa_3072_are_accepted_in_canonical_form():
    ed = ssh_key_parse(ed25519_public("me@laptop"))
    ec = ssh_key_parse(ecdsa_public())
    rsa = ssh_key_parse(rsa_public(RSA_MIN_BITS))

    assert (ed.key_type, ed.bits, ed.comment) == ("ssh-ed25519", 256, "me@laptop")
    assert ed.public_key == " ".join(ed25519_public("me@laptop").split()[:2])
    assert (ec.key_type, ec.bits) == ("ecdsa-sha2-nistp256", 256)
    assert (rsa.key_type, rsa.bits) == ("ssh-rsa", 3072)


def test_the_fingerprint_is_sha256_of_the_blob_in_unpadded_base64():
    line = ed25519_public()
    blob = base64.b64decode(line.split()[1])

    expected = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    assert ssh_key_parse(line).fingerprint == expected == fingerprint_sha256(blob)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="OpenSSH's ssh-keygen is not installed")
def test_the_fingerprint_matches_ssh_keygen(tmp_path):
    path = tmp_path / "key.pub"
    path.write_text(ed25519_public() + "\n")

    printed = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout

    assert printed.split()[1] == ssh_key_parse(ed25519_public()).fingerprint


def test_an_rfc4716_block_is_accepted():
    line = ed25519_public()
    data = line.split()[1]
    block = "\n".join(
        ["---- BEGIN SSH2 PUBLIC KEY ----", 'Comment: "256-bit ED25519, converted by me"', data[:40], data[40:],
         "---- END SSH2 PUBLIC KEY ----"]
    )  # fmt: skip

    assert ssh_key_parse(block).public_key == " ".join(line.split()[:2])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "paste one public key"),
        ("ssh-ed25519", "a public key reads"),
        ("ssh-ed25519 not-base64!!", "not valid base64"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA keys are refused"),
        ("ssh-ed25519-cert-v01@openssh.com AAAA", "SSH certificates are not accepted"),
        ("ssh-foo AAAA", "unknown key type"),
        ("ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==", "names another key type"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA==", "does not parse"),
        ("a\nb", "one key per entry"),
        ("ssh-rsa " + "A" * 20000, "at most"),
    ],
)
def test_bad_keys_are_refused_naming_the_problem(text, message):
    with pytest.raises(SshKeyInvalid) as refused:
        ssh_key_parse(text)

    assert message in str(refused.value)


def test_a_short_rsa_key_is_too_weak_and_says_how_many_bits_it_has():
    with pytest.raises(SshKeyInvalid, match="at least 3072 bits, this one has 2048"):
        ssh_key_parse(rsa_public(2048))


def test_a_private_key_is_refused_without_repeating_any_of_it():
    _, private = ed25519_pair("leaky")

    with pytest.raises(SshKeyInvalid) as refused:
        ssh_key_parse(private)

    message = str(refused.value)
    assert "this is a private key: it was not stored" in message
    body = [line for line in private.splitlines() if "PRIVATE" not in line]
    assert not any(chunk[:16] in message for chunk in body if chunk)
