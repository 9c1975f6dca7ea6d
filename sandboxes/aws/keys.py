"""The access keys the AWS sandbox knows. It refuses every other key, as AWS refuses a key it has no record of.

The one table the demo (``sandboxes/demo.py``, docs/SELLERS.md), the tests and the benchmarks take their
keys from. The sandbox reads the key id from the SigV4 ``Authorization`` header's credential scope and does not
verify the signature, so the secrets listed here are the ones to type, not ones the sandbox checks.

Kept free of moto so that importing a key does not load the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SandboxKey:
    """One access key pair the sandbox accepts."""

    access_key_id: str
    secret_access_key: str

    def credentials(self) -> dict[str, str]:
        """The ``Credentials.values`` of a ProviderAccount using this key (what the portal's AWS form takes)."""
        return {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key}


# 20 characters, as AWS's own key ids are; AKIA marks a long-term IAM user key.
DEMO = SandboxKey("AKIASANDBOXDEMO00001", "sandbox-demo-secret")
ALICE = SandboxKey("AKIASANDBOXALICE0001", "alice-secret")
BOB = SandboxKey("AKIASANDBOXBOB000001", "bob-secret")
CHARLIE = SandboxKey("AKIASANDBOXCHARLIE01", "charlie-secret")
PETRA = SandboxKey("AKIASANDBOXPETRA0001", "petra-secret")
CONTRACT = SandboxKey("AKIASANDBOXCONTRACT1", "contract-secret")

KNOWN_KEYS: dict[str, SandboxKey] = {key.access_key_id: key for key in (DEMO, ALICE, BOB, CHARLIE, PETRA, CONTRACT)}
# An id shaped like the others that the sandbox does not know: what a test uses for a refused key.
UNKNOWN_ACCESS_KEY_ID = "AKIASANDBOXUNKNOWN01"
