"""Anchors on an Ethereum-compatible chain: a checkpoint's (size, root) in the data of a plain transaction.

No contract: the anchor is a zero-value transaction from the broker's address to itself whose input is
``b"broker-ledger/1" || size (8 bytes, big-endian) || root (32 bytes)``. That needs no deployment, no ABI and
no compiler to audit; any node's ``eth_getTransactionByHash`` shows it, and it costs the 21,000 base gas plus
calldata. What a contract would add (an on-chain index of anchors, a size that must grow) an auditor checks
anyway from the anchors themselves.

Django-free, so the auditor's tool uses the same reader as the broker's writer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@contextmanager
def recursion_limit_kept() -> Iterator[None]:
    """Import web3 and its dependencies inside this: ``py_ecc`` raises the process's recursion limit to 100,000
    on import (py-evm's ``eth`` to 12,288), which lets C code such as the JSON decoder recurse until it
    overflows the C stack (a SIGSEGV) instead of raising ``RecursionError``. The limit is put back as it was."""
    limit = sys.getrecursionlimit()
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


with recursion_limit_kept():
    from web3 import Web3
    from web3.exceptions import TransactionNotFound
    from web3.types import Wei

ANCHOR_PREFIX = b"broker-ledger/1"
_DATA_LENGTH = len(ANCHOR_PREFIX) + 8 + 32


class AnchorError(ValueError):
    """An anchor transaction that is missing, failed, or does not carry an anchor."""


@dataclass(frozen=True)
class AnchorRecord:
    chain_id: int
    tx_hash: str
    block_number: int
    block_hash: str
    sender: str
    size: int
    root: bytes


def anchor_data(size: int, root: bytes) -> bytes:
    if len(root) != 32 or not 0 < size < 2**64:
        raise ValueError("an anchor carries a size in 1..2^64-1 and a 32-byte root")
    return ANCHOR_PREFIX + size.to_bytes(8, "big") + root


def parse_anchor_data(data: bytes) -> tuple[int, bytes]:
    if len(data) != _DATA_LENGTH or not data.startswith(ANCHOR_PREFIX):
        raise AnchorError("transaction input is not a broker ledger anchor")
    body = data[len(ANCHOR_PREFIX) :]
    return int.from_bytes(body[:8], "big"), body[8:]


def _hex(value: Any) -> str:
    text = value.hex() if isinstance(value, bytes | bytearray) else str(value)
    return text if text.startswith("0x") else "0x" + text


def send_anchor(w3: Web3, size: int, root: bytes, *, private_key: str = "", timeout: float = 120.0) -> AnchorRecord:
    """Write the anchor and wait for its receipt. With ``private_key`` the transaction is signed locally and sent
    raw (any JSON-RPC node); without, the node's first account sends it (the in-process test chain)."""
    data = anchor_data(size, root)
    if private_key:
        account = w3.eth.account.from_key(private_key)
        sender = account.address
        tx: dict[str, Any] = {
            "from": sender,
            "to": sender,
            "value": 0,
            "data": data,
            "nonce": w3.eth.get_transaction_count(sender, "pending"),
            "chainId": w3.eth.chain_id,
        }
        tx["gas"] = w3.eth.estimate_gas(tx)  # type: ignore[arg-type]
        tx.update(maxFeePerGas=w3.eth.gas_price * 2, maxPriorityFeePerGas=w3.eth.max_priority_fee)
        tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    else:
        sender = w3.eth.accounts[0]
        tx_hash = w3.eth.send_transaction({"from": sender, "to": sender, "value": Wei(0), "data": data})
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout)
    if receipt["status"] != 1:
        raise AnchorError(f"anchor transaction {_hex(tx_hash)} failed on chain")
    return AnchorRecord(
        chain_id=int(w3.eth.chain_id),
        tx_hash=_hex(tx_hash),
        block_number=int(receipt["blockNumber"]),
        block_hash=_hex(receipt["blockHash"]),
        sender=str(sender),
        size=size,
        root=root,
    )


def read_anchor(w3: Web3, tx_hash: str) -> AnchorRecord:
    """What the chain holds for ``tx_hash``: raises ``AnchorError`` if the transaction is unknown, failed, or
    carries no anchor."""
    try:
        chain_id = int(w3.eth.chain_id)
        tx = w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
        receipt = w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
    except (TransactionNotFound, ValueError) as exc:  # unknown hash; a malformed one is a ValueError
        raise AnchorError(f"the chain has no transaction {tx_hash}: {exc}") from None
    except Exception as exc:  # the node could not be asked: each provider raises its own transport errors
        raise AnchorError(f"the chain could not be asked about {tx_hash}: {type(exc).__name__}: {exc}") from None
    if receipt["status"] != 1:
        raise AnchorError(f"transaction {tx_hash} failed on chain")
    size, root = parse_anchor_data(bytes(tx["input"]))
    if tx["to"] != tx["from"]:
        raise AnchorError(f"transaction {tx_hash} is not sent to its own sender")
    return AnchorRecord(
        chain_id=chain_id,
        tx_hash=_hex(tx["hash"]),
        block_number=int(receipt["blockNumber"]),
        block_hash=_hex(receipt["blockHash"]),
        sender=str(tx["from"]),
        size=size,
        root=root,
    )
