"""The anchor chain's node (``python -m ledger.chainnode``) as tests run it: a subprocess on a free port, found by
the URL it writes to its ready file once it serves; stopped with SIGTERM as the run command stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ledger.chain import Web3

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0  # py-evm's import and the journal's replay


@dataclass
class Node:
    url: str
    process: subprocess.Popen[str]

    def web3(self) -> Web3:
        """A reader as the auditor makes one: web3's plain HTTP provider."""
        return Web3(Web3.HTTPProvider(self.url, request_kwargs={"timeout": 30}))


def node_command(data: Path, ready: Path, *fund: str) -> list[str]:
    command = [sys.executable, "-m", "ledger.chainnode", "--port", "0", "--data", str(data), "--ready-file", str(ready)]
    for address in fund:
        command += ["--fund", address]
    return command


@contextmanager
def chain_node(data: Path, *fund: str) -> Iterator[Node]:
    """The node on ``data`` funding ``fund``, serving until the block ends; it must exit cleanly when stopped."""
    ready = data.parent / f"{data.name}-ready.json"
    ready.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    process = subprocess.Popen(
        node_command(data, ready, *fund), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():  # the node writes it once it listens, after replaying its journal
            if process.poll() is not None:
                raise AssertionError(f"the chain node exited {process.returncode}: {process.communicate()[1]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the chain node did not serve within {START_TIMEOUT_S:g} s")
            time.sleep(0.05)
        yield Node(json.loads(ready.read_text())["url"], process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
            raise AssertionError("the chain node did not stop on SIGTERM") from None


def run_node(data: Path, *fund: str) -> subprocess.CompletedProcess[str]:
    """Start the node expecting it to refuse: its exit status and messages."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    ready = data.parent / f"{data.name}-ready.json"
    return subprocess.run(
        node_command(data, ready, *fund), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
