"""Process-wide limits the broker relies on, checked when a process starts serving.

Python's recursion limit also bounds C code that recurses through the interpreter (the JSON decoder, ``repr``,
pickling): under it they raise ``RecursionError``; far above it they overflow the C stack and the process dies
with SIGSEGV. Some dependencies raise it on import (web3's ``py_ecc`` to 100,000, py-evm's ``eth`` to 12,288),
so ``ledger.chain`` imports them with ``recursion_limit_kept`` and every entry point (the WSGI application, each
Celery worker process) calls ``recursion_limit_ensure`` once everything is imported.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

# CPython's default (sys.getrecursionlimit() in a fresh interpreter): deep enough for Django, DRF and Celery,
# shallow enough that C recursion fails with RecursionError well inside an 8 MB thread stack.
RECURSION_LIMIT = 1000


def recursion_limit_ensure(expected: int = RECURSION_LIMIT) -> int:
    """Put the process's recursion limit back to ``expected`` if an import moved it; returns the limit found
    (a moved limit is logged as a warning, naming both values). Idempotent."""
    found = sys.getrecursionlimit()
    if found != expected:
        log.warning("the recursion limit was %d (an import raised it); restored to %d", found, expected)
        sys.setrecursionlimit(expected)
    return found
