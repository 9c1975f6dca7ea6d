"""The auditor's tool: check what the broker publishes about its ledger, without Django and without its database.

What an auditor needs
---------------------
1. The broker's URL, or an audit bundle (format ``broker-ledger-audit/1``). With ``--url`` the tool reads the
   broker's public ledger endpoints (``/api/v1/ledger/key``, every page of ``ledger/checkpoints`` with their
   anchors, ``ledger/consistency`` between successive checkpoints and from the one the state remembers,
   ``ledger/leaves`` up to the newest checkpoint) and assembles the same bundle the operator would export
   (``bundle_from_api``); nothing from the operator is needed. Each request has a total deadline (``--timeout``,
   30 s: a watchdog shuts the socket, so a peer trickling bytes cannot stretch it), all of them one more
   (``--deadline``, 600 s); an answer is at most 64 MiB and 16 levels deep; a redirect is followed only to the
   same scheme, host and port. A broker that cannot be read is an unreadable input (exit 2) naming the URL and
   what failed. A bundle is exported by the operator with::

       python manage.py ledger export --out bundle.json            # checkpoints, consistency proofs, leaf hashes
       python manage.py ledger export --out bundle.json --entries  # the same and every entry (trusted auditors)

2. Receipts, optionally (format ``broker-ledger-receipt/1``): a buyer saves the JSON of
   ``GET /api/v1/orders/<id>/receipt`` for each order they want to check.
3. The broker's verifier key, obtained out of band: not from the bundle, which the broker writes. The operator
   prints it with ``python manage.py ledger verify`` (the line ``verifier key: gpu-broker/ledger+1a2b3c4d+AX...``)
   and publishes it somewhere the broker cannot quietly rewrite. Without a key the tool uses the bundle's own
   and says so (trust on first use), then remembers it in the state file. One key is enough across rotations:
   the bundle's ``key_history`` lists every key with the checkpoints it signed, and each key after the first
   is linked to the one before by its *handover*, its first checkpoint, signed by both and naming both
   (``ledger.note``). The tool follows verified handovers from the trusted key in both directions. A rotation
   the old key could not cosign (a lost key) needs the new key out of band as well: ``--key OLD --key NEW``.
4. For the anchors: the JSON-RPC URL of a node of the chain the broker anchors to, and optionally the broker's
   anchor address (the sender of its anchor transactions); without it, the first audit's sender is remembered.

Running it
----------
From a checkout of the broker's source (only ``ledger/audit/``, ``merkle.py``, ``note.py``, ``canonical.py``
and, for anchors, ``chain.py`` are used; they need Python 3.11+, ``cryptography`` and, for ``--rpc-url``,
``web3``)::

    python -m ledger.audit --url https://broker.example --key-file broker.vkey --rpc-url https://node.example:8545 \\
        --state audit-state.json
    python -m ledger.audit bundle.json --key-file broker.vkey --state audit-state.json
    python -m ledger.audit bundle.json --key 'gpu-broker/ledger+1a2b3c4d+AX...' --receipt receipt.json \\
        --rpc-url https://node.example:8545 --state audit-state.json [--anchor-sender 0xBroker...]

It prints one line per check (``ok``, ``FAILED`` or ``--`` for not checked) and a summary. Exit status: 0 when
everything that was checked passed, 1 when a check failed, 2 when an input could not be read (a missing file,
JSON that does not parse, a malformed key or state file, a broker that cannot be read). The run command's
chain node (``ledger.chainnode``) serves its anchors over JSON-RPC, so the demo is audited the same way:
``--url http://127.0.0.1:8000 --rpc-url http://127.0.0.1:8545``.

What it checks: that the key history chains (consecutive, disjoint ranges, no key twice, every handover signed by
both keys and naming both); every checkpoint's signed note against the key whose range holds it, and that it
states the row's size and root; that each checkpoint extends the one before (consistency proofs); with leaf
hashes, the Merkle root at every checkpoint; with entries, that they are gapless, chained, and that every hash
recomputes from the published fields; each receipt's entries and their inclusion proofs; with ``--rpc-url``, that
each anchor transaction on the chain states its checkpoint's size and root; and, with ``--state``, that the log
still contains what an earlier audit saw.

The state file
--------------
Keep it between audits (``--state``; it is created by the first successful one). It records the newest
checkpoint the audit verified (size and root), the verifier key and the anchor sender. The next audit requires
the new bundle to contain that checkpoint unchanged, or to prove the new log extends it: that is what catches a
log rewritten wholesale after an earlier audit, even one re-signed with a stolen key. It is rewritten only when
the audit passes.

Library use: ``audit(bundle, receipts=[...], w3=Web3(...), trusted_key=..., state=...)`` returns an
``AuditReport``; its ``state`` is what to save when it is ``ok``.

This package imports only the standard library (``http.client`` for ``--url``), ``ledger.merkle``, ``ledger.note``
and ``ledger.canonical``, and ``ledger.chain`` (hence web3) only when anchors are checked: keep it free of Django.

Its modules, each importing only those listed before it: ``report`` (the checks and the summary), ``inputs``
(the formats, read as untrusted into records), ``run`` (one run's shared state), the families of checks
``signatures``, ``proofs``, ``anchors`` and ``state``, ``checks`` (``audit``: them all, in order), ``fetch``
(``bundle_from_api``: the broker's public endpoints over HTTP) and ``cli`` (``python -m ledger.audit``). This
file exposes the names outside code uses; a name with a leading underscore is private to the package.
"""

from ledger.audit.checks import audit
from ledger.audit.cli import main
from ledger.audit.fetch import FetchError, bundle_from_api
from ledger.audit.inputs import BUNDLE_FORMAT, RECEIPT_FORMAT, STATE_FORMAT
from ledger.audit.report import FAILED, NOT_CHECKED, OK, AuditReport, Check

__all__ = [
    "BUNDLE_FORMAT",
    "FAILED",
    "NOT_CHECKED",
    "OK",
    "RECEIPT_FORMAT",
    "STATE_FORMAT",
    "AuditReport",
    "Check",
    "FetchError",
    "audit",
    "bundle_from_api",
    "main",
]
