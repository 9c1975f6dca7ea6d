"""Anchors: each checkpoint's (size, root) written to a chain (``ledger.chain``) from the broker's account,
and the record of that transaction. Which chain and which account come from the settings.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.chain import Web3, recursion_limit_kept, send_anchor
from ledger.models import Anchor, Checkpoint


@cache
def _embedded_chain() -> Web3:
    """The in-process test chain: one per process, gone when the process ends (development and tests only)."""
    # Imported here, not at the top: the test chain (eth-tester, py-evm) is for development and tests only, slow
    # to import, and py-evm's import raises the process's recursion limit.
    with recursion_limit_kept():
        from web3 import EthereumTesterProvider

        return Web3(EthereumTesterProvider())


def chain() -> Web3:
    """The chain anchors go to: ``LEDGER_CHAIN_RPC_URL`` if set, else the embedded test chain."""
    if settings.LEDGER_CHAIN_RPC_URL:
        return Web3(Web3.HTTPProvider(settings.LEDGER_CHAIN_RPC_URL, request_kwargs={"timeout": 30}))
    return _embedded_chain()


def _chain_private_key() -> str:
    if settings.LEDGER_CHAIN_PRIVATE_KEY:
        return str(settings.LEDGER_CHAIN_PRIVATE_KEY)
    if settings.LEDGER_CHAIN_PRIVATE_KEY_FILE:
        return Path(settings.LEDGER_CHAIN_PRIVATE_KEY_FILE).read_text().strip()
    if settings.LEDGER_CHAIN_RPC_URL:
        raise ImproperlyConfigured("LEDGER_CHAIN_RPC_URL needs LEDGER_CHAIN_PRIVATE_KEY or its _FILE to sign anchors")
    return ""


def anchor_sender(w3: Web3) -> str:
    """The address the broker's anchors come from on ``w3``: the configured key's, or the test chain's first
    account."""
    private_key = _chain_private_key()
    return str(w3.eth.account.from_key(private_key).address if private_key else w3.eth.accounts[0])


def checkpoint_anchor(checkpoint: Checkpoint) -> Anchor:
    """Write ``checkpoint``'s (size, root) to the chain and record the transaction. Returns the existing anchor
    if there is one. A crash between sending and recording leaves a second anchor of the same checkpoint on
    the chain when retried: harmless, both state the same root."""
    existing = Anchor.objects.filter(checkpoint=checkpoint).first()
    if existing is not None:
        return existing
    record = send_anchor(
        chain(), checkpoint.size, bytes.fromhex(checkpoint.root_hash), private_key=_chain_private_key()
    )
    try:
        with transaction.atomic():
            return Anchor.objects.create(
                checkpoint=checkpoint,
                chain_id=record.chain_id,
                tx_hash=record.tx_hash,
                block_number=record.block_number,
                block_hash=record.block_hash,
                sender=record.sender,
                anchored_at=timezone.now(),
            )
    except IntegrityError:
        return Anchor.objects.get(checkpoint=checkpoint)
