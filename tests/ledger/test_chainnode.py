"""The run command's anchor chain (ledger.chainnode): a JSON-RPC node in its own process that the broker's writer
and the auditor's reader reach through web3's HTTP provider, as they would a public chain, and whose blocks
survive a restart.

The methods and formats are Ethereum's JSON-RPC API ("Ethereum JSON-RPC Specification",
https://ethereum.github.io/execution-apis/api-documentation/, and https://ethereum.org/en/developers/docs/apis/json-rpc/):
quantities and data as ``0x`` hex strings, ``eth_sendRawTransaction`` returning the transaction hash.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import requests

from ledger.chain import AnchorRecord, Web3, read_anchor, send_anchor
from tests.ledger.chainnode_process import chain_node, run_node

ROOT_A = bytes(range(32))
ROOT_B = bytes(range(32, 64))


@pytest.fixture
def anchor_key() -> tuple[str, str]:
    key = "0x" + secrets.token_hex(32)
    return key, str(Web3().eth.account.from_key(key).address)


def _rpc(url: str, method: str, *params: object) -> dict[str, object]:
    answer = requests.post(url, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": list(params)}, timeout=30)
    assert answer.status_code == 200
    body: dict[str, object] = answer.json()
    return body


def test_an_anchor_reads_back_the_same_after_the_node_restarts(tmp_path, anchor_key):
    key, address = anchor_key
    data = tmp_path / "chain"
    with chain_node(data, address) as node:
        first = send_anchor(node.web3(), 12, ROOT_A, private_key=key, timeout=30)
        second = send_anchor(node.web3(), 20, ROOT_B, private_key=key, timeout=30)
        block = node.web3().eth.get_block(second.block_number)

    # The process is gone; a new one on the same data directory is the same chain.
    with chain_node(data, address) as node:
        w3 = node.web3()
        assert read_anchor(w3, first.tx_hash) == first
        assert read_anchor(w3, second.tx_hash) == second
        again = w3.eth.get_block(second.block_number)
        assert (again["hash"], again["timestamp"], again["parentHash"]) == (
            block["hash"],
            block["timestamp"],
            block["parentHash"],
        )
        # ... and it goes on from there: the sender's nonce and the block numbers continue.
        third = send_anchor(w3, 21, ROOT_A, private_key=key, timeout=30)
        assert third.block_number == second.block_number + 1 == 3
        assert w3.eth.get_transaction_count(address) == 3

    assert first == AnchorRecord(
        chain_id=first.chain_id,
        tx_hash=first.tx_hash,
        block_number=1,
        block_hash=first.block_hash,
        sender=address,
        size=12,
        root=ROOT_A,
    )
    journal = [json.loads(line) for line in (data / "journal.jsonl").read_text().splitlines()]
    assert [(r["tx_hash"], r["block_number"], r["block_hash"]) for r in journal] == [
        (r.tx_hash, r.block_number, r.block_hash) for r in (first, second, third)
    ]


def test_a_journal_that_replays_differently_stops_the_node(tmp_path, anchor_key):
    key, address = anchor_key
    data = tmp_path / "chain"
    with chain_node(data, address) as node:
        send_anchor(node.web3(), 12, ROOT_A, private_key=key, timeout=30)
        send_anchor(node.web3(), 20, ROOT_B, private_key=key, timeout=30)
    journal = data / "journal.jsonl"
    lines = journal.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["timestamp"] += 1  # another block time: another block hash than the one the broker recorded
    journal.write_text(lines[0] + "\n" + json.dumps(edited) + "\n")

    refused = run_node(data, address)

    assert refused.returncode == 2, refused.stderr
    assert "line 2 replays to transaction" in refused.stderr and "the journal is not this chain's" in refused.stderr
    assert journal.read_text().splitlines()[1] == json.dumps(edited)  # nothing was rewritten


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_rest_replays(tmp_path, anchor_key):
    key, address = anchor_key
    data = tmp_path / "chain"
    with chain_node(data, address) as node:
        kept = send_anchor(node.web3(), 12, ROOT_A, private_key=key, timeout=30)
    journal = data / "journal.jsonl"
    journal.write_text(journal.read_text() + '{"raw": "0x02f8')  # the node died writing the next block

    with chain_node(data, address) as node:
        assert read_anchor(node.web3(), kept.tx_hash) == kept
        assert node.web3().eth.block_number == 1

    assert journal.read_text().count("\n") == 1 and journal.read_text().endswith("\n")


def test_a_data_directory_funds_only_the_addresses_it_was_made_for(tmp_path, anchor_key):
    _key, address = anchor_key
    data = tmp_path / "chain"
    with chain_node(data, address) as node:
        assert node.web3().eth.get_balance(address) == 10**24
    stranger = str(Web3().eth.account.create().address)

    refused = run_node(data, stranger)

    assert refused.returncode == 2
    assert f"does not fund {stranger}" in refused.stderr and address in refused.stderr


def test_the_node_takes_only_signed_transactions_and_holds_no_accounts(tmp_path, anchor_key):
    key, address = anchor_key
    with chain_node(tmp_path / "chain", address) as node:
        w3 = node.web3()
        assert _rpc(node.url, "eth_accounts")["result"] == []
        unsigned = _rpc(node.url, "eth_sendTransaction", {"from": address, "to": address, "value": "0x0"})
        assert unsigned["error"] == {"code": -32601, "message": "method eth_sendTransaction is not served by this node"}
        assert _rpc(node.url, "evm_mine")["error"]["code"] == -32601  # type: ignore[index]
        garbage = _rpc(node.url, "eth_sendRawTransaction", "0x02f8")
        assert garbage["error"]["code"] == -32000  # type: ignore[index]
        # A transaction replayed (same nonce) is refused, and neither refusal made a block or a journal line.
        record = send_anchor(w3, 12, ROOT_A, private_key=key, timeout=30)
        raw = json.loads((tmp_path / "chain" / "journal.jsonl").read_text())["raw"]
        replayed = _rpc(node.url, "eth_sendRawTransaction", raw)
        assert replayed["error"]["code"] == -32000  # type: ignore[index]
        assert w3.eth.block_number == record.block_number == 1
        assert _rpc(node.url, "eth_chainId")["result"] == hex(record.chain_id)
        bad = requests.post(node.url, data=b"[" * 100 + b"]" * 100, timeout=30).json()
        assert bad["error"]["code"] == -32700 and "deeper" in bad["error"]["message"]
    assert len((tmp_path / "chain" / "journal.jsonl").read_text().splitlines()) == 1


def test_the_run_command_starts_the_node_with_a_key_made_once(tmp_path):
    from broker.devrun import chain_key, chain_node_command

    key_file = tmp_path / "var" / "chain-anchor.key"
    key, address = chain_key(key_file)

    assert chain_key(key_file) == (key, address)  # made once, read back after
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert Web3().eth.account.from_key(key).address == address
    command = chain_node_command(data=tmp_path / "chain", port=8545, fund=address, ready_file=Path("r.json"))
    assert command[1:4] == ["-m", "ledger.chainnode", "--host"] and ["--fund", address] == command[-4:-2]
