"""A local Ethereum JSON-RPC node for the run command: the anchor chain in a process of its own, surviving restarts.

The broker anchors checkpoints through JSON-RPC and the auditor reads them back through JSON-RPC, the way both do
against a public chain. In the demo nobody runs a public chain, so the run command starts this node
(``python -m ledger.chainnode --port 8545 --data var/chain --fund 0xBroker...``): py-evm (through eth-tester)
behind a plain HTTP JSON-RPC endpoint serving the standard ``eth_*`` methods that web3's ``HTTPProvider`` calls
to write and read an anchor. It accepts only signed transactions (``eth_sendRawTransaction``), as a public node
does: the node holds no account of its own, and the addresses given with ``--fund`` are funded in the genesis.

Surviving restarts
------------------
py-evm keeps its state in memory. The node keeps, in ``--data``, the genesis (``genesis.json``: its time and the
funded addresses) and a journal (``journal.jsonl``): one line per block, holding the raw signed transaction and
everything else that makes its block (timestamp, ``mixHash``), with the transaction and block hashes it got.
Every block is mined from one transaction and journalled, flushed to disk, before the sender hears its hash.
On start the node rebuilds the chain from the genesis and replays the journal, and refuses to start if any
transaction or block hash comes out different: a chain that replays differently is not the chain the
broker's anchors were recorded on. A last line cut short by a crash is dropped: its sender never got an answer.

Not a consensus client: one process, one writer, no peers. The replay takes about 10 ms a block, so a demo
that anchors every minute for a day starts in some 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ledger.chain import recursion_limit_kept
from untrusted.jsonbody import bounded_json

with recursion_limit_kept():
    from eth.exceptions import TransactionNotFound as UnknownTransaction
    from eth_tester import EthereumTester  # type: ignore[import-untyped]
    from eth_tester.backends.pyevm import PyEVMBackend  # type: ignore[import-untyped]
    from eth_tester.backends.pyevm.serializers import (  # type: ignore[import-untyped]
        serialize_transaction,
        serialize_transaction_receipt,
    )
    from eth_tester.exceptions import TransactionNotFound  # type: ignore[import-untyped]
    from eth_utils import to_canonical_address, to_checksum_address
    from web3.providers.eth_tester import EthereumTesterProvider
    from web3.providers.eth_tester.middleware import request_formatters, result_formatters

GENESIS_FORMAT = "broker-chainnode-genesis/1"
JOURNAL_FORMAT = "broker-chainnode-block/1"
# What a funded address starts with: 1,000,000 ether, enough for millions of anchors at the node's gas price.
FUNDED_BALANCE_WEI = 10**24
MAX_REQUEST_BYTES = 1024 * 1024  # a signed anchor is a few hundred bytes
MAX_REQUEST_DEPTH = 16

# The methods web3 needs to write an anchor (nonce, fees, gas estimate, send, receipt) and to read one back,
# and the usual harmless reads. Nothing that changes state but a signed transaction: no eth_sendTransaction,
# no evm_* time travel or snapshots, which would make the chain unreplayable.
READ_METHODS = frozenset(
    {
        "eth_blockNumber",
        "eth_call",
        "eth_chainId",
        "eth_estimateGas",
        "eth_feeHistory",
        "eth_gasPrice",
        "eth_getBalance",
        "eth_getBlockByHash",
        "eth_getBlockByNumber",
        "eth_getCode",
        "eth_getTransactionByHash",
        "eth_getTransactionCount",
        "eth_getTransactionReceipt",
        "eth_maxPriorityFeePerGas",
        "net_version",
    }
)

_SNAKE = re.compile(r"_([a-z])")


class ChainNodeError(Exception):
    """The data directory cannot be used: unreadable, or its journal does not replay to the chain it recorded."""


class RpcError(Exception):
    """A JSON-RPC error answer: ``code`` per JSON-RPC 2.0 (-32601 unknown method, -32602 bad params, -32000 a
    transaction the chain refuses)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _JournalledBackend(PyEVMBackend):
    """py-evm with blocks mined only as the node says: at the timestamp and ``mixHash`` it chose (or recorded),
    never with eth-tester's fresh random ``mixHash``, so replaying the journal gives the same block hashes."""

    next_block: tuple[int, bytes] | None = None

    def mine_blocks(self, num_blocks: int = 1, coinbase: bytes = b"\x00" * 20) -> tuple[bytes, ...]:
        if num_blocks != 1 or self.next_block is None:
            raise RpcError(-32601, "this node mines a block only for a signed transaction")
        timestamp, mix_hash = self.next_block
        self.next_block = None
        block = self.chain.mine_block(coinbase=coinbase, mix_hash=mix_hash, timestamp=timestamp, blob_gas_used=0)
        return (bytes(block.hash),)

    # eth-tester finds a transaction by reading every block back from the head: an audit of n anchors would read
    # n^2 / 2 blocks. py-evm indexes the canonical chain's transactions by hash; these two lookups use it. (Every
    # transaction is mined at once, so none is ever pending.)
    def _mined(self, transaction_hash: bytes) -> tuple[Any, Any, int]:
        try:
            number, index = self.chain.chaindb.get_transaction_index(transaction_hash)
        except UnknownTransaction:
            raise TransactionNotFound(f"no transaction 0x{bytes(transaction_hash).hex()}") from None
        block = self.chain.get_canonical_block_by_number(number)
        return block, block.transactions[index], index

    def get_transaction_by_hash(self, transaction_hash: bytes) -> Any:
        block, transaction, index = self._mined(transaction_hash)
        return serialize_transaction(block, transaction, index, False)

    def get_transaction_receipt(self, transaction_hash: bytes) -> Any:
        block, transaction, index = self._mined(transaction_hash)
        receipts = block.get_receipts(self.chain.chaindb)
        return serialize_transaction_receipt(block, receipts, transaction, index, False, self.chain.get_vm())


class ChainNode:
    """The chain of one data directory. ``request(method, params)`` answers one JSON-RPC call (thread-safe);
    ``send_raw_transaction`` mines the transaction into a block of its own and journals it before returning."""

    def __init__(self, data_dir: Path, *, fund: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.genesis = self._genesis(fund)
        self.journal_path = self.data_dir / "journal.jsonl"
        self._lock = threading.Lock()
        state = {
            to_canonical_address(address): {"balance": int(balance), "nonce": 0, "code": b"", "storage": {}}
            for address, balance in self.genesis["alloc"].items()
        }
        params = PyEVMBackend.generate_genesis_params(overrides={"timestamp": int(self.genesis["timestamp"])})
        self.backend = _JournalledBackend(genesis_parameters=params, genesis_state=state)
        self.provider = EthereumTesterProvider(EthereumTester(backend=self.backend, auto_mine_transactions=True))
        self.replayed = self._replay()

    # -- the data directory

    def _genesis(self, fund: Sequence[str]) -> dict[str, Any]:
        """The stored genesis, or a new one funding ``fund``. An address to fund that the stored genesis does not
        fund is refused: the chain cannot be given money after the fact without rewriting it."""
        path = self.data_dir / "genesis.json"
        wanted = {to_checksum_address(address) for address in fund}
        if path.exists():
            try:
                genesis = bounded_json(path.read_bytes(), max_bytes=MAX_REQUEST_BYTES, max_depth=4)
                alloc = genesis["alloc"]
                int(genesis["timestamp"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ChainNodeError(f"{path} is not a chain node genesis: {exc}") from None
            missing = wanted - set(alloc)
            if missing:
                raise ChainNodeError(
                    f"{path} does not fund {', '.join(sorted(missing))}: this data directory was made for "
                    f"{', '.join(sorted(alloc)) or 'no address'}; use another --data for another key"
                )
            return dict(genesis)
        genesis = {
            "format": GENESIS_FORMAT,
            "timestamp": int(time.time()),
            "alloc": {address: str(FUNDED_BALANCE_WEI) for address in sorted(wanted)},
        }
        _write_atomically(path, json.dumps(genesis, indent=1, sort_keys=True) + "\n")
        return genesis

    def _replay(self) -> int:
        """Mine every journalled block again, checking each comes out as recorded. The number of blocks."""
        if not self.journal_path.exists():
            return 0
        data = self.journal_path.read_bytes()
        complete, _, torn = data.rpartition(b"\n")
        if torn:  # a crash mid-line: that sender never got its hash
            with self.journal_path.open("r+b") as handle:
                handle.truncate(len(complete) + 1 if complete else 0)
        count = 0
        for number, line in enumerate(complete.split(b"\n") if complete else [], start=1):
            where = f"{self.journal_path} line {number}"
            try:
                record = bounded_json(line, max_bytes=MAX_REQUEST_BYTES, max_depth=4)
                raw, timestamp = str(record["raw"]), int(record["timestamp"])
                mix_hash = bytes.fromhex(str(record["mix_hash"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ChainNodeError(f"{where} is not a journalled block: {exc}") from None
            mined = self._mine(raw, timestamp, mix_hash)
            expected = (record.get("tx_hash"), record.get("block_number"), record.get("block_hash"))
            if mined != expected:
                raise ChainNodeError(
                    f"{where} replays to transaction {mined[0]} in block {mined[1]} ({mined[2]}), but was recorded "
                    f"as {expected[0]} in block {expected[1]} ({expected[2]}): the journal is not this chain's"
                )
            count += 1
        return count

    def _mine(self, raw: str, timestamp: int, mix_hash: bytes) -> tuple[str, int, str]:
        """Apply the signed transaction ``raw`` to a new block at ``timestamp`` and mine it: (tx hash, block
        number, block hash). The block's time is set before the transaction runs, as a producer's is."""
        chain = self.backend.chain
        chain.header = chain.header.copy(timestamp=timestamp)
        self.backend.next_block = (timestamp, mix_hash)
        try:
            answer = self.provider.make_request("eth_sendRawTransaction", [raw])  # type: ignore[arg-type]
        finally:
            self.backend.next_block = None
        if "error" in answer:
            raise RpcError(-32000, str(answer["error"].get("message", answer["error"])))
        head = chain.get_canonical_head()
        return str(answer["result"]), int(head.block_number), "0x" + bytes(head.hash).hex()

    # -- JSON-RPC

    def request(self, method: str, params: list[Any]) -> Any:
        """The result of one JSON-RPC call, in the standard JSON-RPC format (camelCase keys, hex quantities and
        data). Raises ``RpcError``."""
        if method == "eth_sendRawTransaction":
            if len(params) != 1 or not isinstance(params[0], str):
                raise RpcError(-32602, "eth_sendRawTransaction takes one hex string: the signed transaction")
            return self.send_raw_transaction(params[0])
        if method == "eth_accounts":
            return []  # the node holds no keys: every sender signs its own transactions
        if method == "eth_syncing":
            return False
        if method == "web3_clientVersion":
            return "broker-chainnode/1 (py-evm via eth-tester)"
        if method not in READ_METHODS:
            raise RpcError(-32601, f"method {method} is not served by this node")
        formatter: Callable[[Any], Any] | None = request_formatters.get(method)  # type: ignore[call-overload]
        if formatter is not None:
            try:
                params = formatter(params)
            except (TypeError, ValueError) as exc:
                raise RpcError(-32602, f"invalid params: {exc}") from None
        with self._lock:
            try:
                answer = self.provider.make_request(method, params)  # type: ignore[arg-type]
            except Exception as exc:  # eth-tester's validation and lookup errors, each its own class
                raise RpcError(-32000, f"{type(exc).__name__}: {exc}") from None
        if "error" in answer:
            error = answer["error"]
            raise RpcError(-32000, str(error.get("message", error) if isinstance(error, dict) else error))
        result = answer.get("result")
        if method == "eth_getTransactionReceipt" and isinstance(result, dict):
            result = {k: v for k, v in result.items() if k != "state_root"}  # a pre-Byzantium field, not sent
        shape = result_formatters.get(method) if result_formatters else None  # type: ignore[call-overload]
        return _rpc_value(shape(result) if shape is not None else result)

    def send_raw_transaction(self, raw: str) -> str:
        with self._lock:
            parent = self.backend.chain.get_canonical_head()
            timestamp = max(int(time.time()), int(parent.timestamp) + 1)
            mix_hash = os.urandom(32)  # post-merge "prevrandao": random, and journalled so it replays
            try:
                tx_hash, number, block_hash = self._mine(raw, timestamp, mix_hash)
            except RpcError:
                raise
            except Exception as exc:  # a malformed or unacceptable transaction: eth-tester's validators
                raise RpcError(-32000, f"transaction refused: {type(exc).__name__}: {exc}") from None
            record = {
                "format": JOURNAL_FORMAT,
                "raw": raw,
                "timestamp": timestamp,
                "mix_hash": mix_hash.hex(),
                "tx_hash": tx_hash,
                "block_number": number,
                "block_hash": block_hash,
            }
            with self.journal_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            return tx_hash


def _camel(key: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), key)


def _rpc_value(value: Any, key: str = "") -> Any:
    """eth-tester's Python values as JSON-RPC writes them: quantities as ``0x`` hex numbers, byte strings as
    ``0x`` hex data, keys in camelCase."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if key == "logsBloom":
            return "0x" + value.to_bytes(256, "big").hex()
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, dict):
        return {_camel(str(k)): _rpc_value(v, _camel(str(k))) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rpc_value(v) for v in value]
    return value


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


# --- HTTP ----------------------------------------------------------------------------------------------------------


def _answer(request_id: Any, *, result: Any = None, error: RpcError | None = None) -> dict[str, Any]:
    if error is not None:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": error.code, "message": str(error)}}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _handler(node: ChainNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "broker-chainnode/1"
        timeout = 30  # a client that stops sending mid-request does not hold its thread for ever

        def do_POST(self) -> None:  # the name http.server calls
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._send(411, {"error": "a Content-Length is required"})
                return
            if not 0 <= length <= MAX_REQUEST_BYTES:
                self._send(413, {"error": f"a request is at most {MAX_REQUEST_BYTES} bytes"})
                return
            try:
                call = bounded_json(self.rfile.read(length), max_bytes=MAX_REQUEST_BYTES, max_depth=MAX_REQUEST_DEPTH)
            except ValueError as exc:
                self._send(200, _answer(None, error=RpcError(-32700, f"parse error: {exc}")))
                return
            if not isinstance(call, dict) or not isinstance(call.get("method"), str):
                self._send(200, _answer(None, error=RpcError(-32600, "one JSON-RPC request object is served")))
                return
            params = call.get("params", [])
            if not isinstance(params, list):
                self._send(200, _answer(call.get("id"), error=RpcError(-32602, "params must be a list")))
                return
            try:
                answer = _answer(call.get("id"), result=node.request(call["method"], params))
            except RpcError as exc:
                answer = _answer(call.get("id"), error=exc)
            self._send(200, answer)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per anchor poll would drown the run command's output

    return Handler


def serve(node: ChainNode, *, host: str, port: int, ready_file: Path | None = None) -> None:
    """Serve ``node`` until SIGTERM or SIGINT. With ``ready_file``, write ``{"url": ...}`` there once listening
    (after the replay), so whoever started the node waits for that file rather than guessing."""
    server = ThreadingHTTPServer((host, port), _handler(node))
    server.daemon_threads = True
    url = f"http://{host}:{server.server_address[1]}"

    def stop(signum: int, _frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if ready_file is not None:
        _write_atomically(ready_file, json.dumps({"url": url, "blocks": node.replayed}) + "\n")
    print(f"chain node at {url}: {node.replayed} blocks replayed from {node.data_dir}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ledger.chainnode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8545, help="the port (0: any free one; see --ready-file)")
    parser.add_argument("--data", required=True, metavar="DIR", help="the genesis and journal: the chain itself")
    parser.add_argument(
        "--fund", action="append", default=[], metavar="ADDR", help="an address the genesis funds (repeat)"
    )
    parser.add_argument("--ready-file", metavar="F", help="write {'url': ...} here once serving")
    args = parser.parse_args(argv)
    try:
        node = ChainNode(Path(args.data), fund=args.fund)
    except (ChainNodeError, RpcError, ValueError) as exc:
        print(f"chainnode: {exc}", file=sys.stderr)
        return 2
    serve(node, host=args.host, port=args.port, ready_file=Path(args.ready_file) if args.ready_file else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
