"""The direction of imports between the top-level packages (issue 23, point 7): broker -> marketplace ->
providers, ledger; providers and ledger import neither marketplace nor each other; no app imports broker."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What each app may not import (its own name and the standard library are always fine).
FORBIDDEN = {
    "marketplace": {"broker"},
    "providers": {"broker", "marketplace", "ledger"},
    "ledger": {"broker", "marketplace", "providers"},
}
# Known crossings still to be moved below (issue 23, point 7); a new one fails the test, and one that is fixed
# must leave this list.
KNOWN = {
    ("providers/community/services.py", "marketplace"),  # the GPU spec table
    ("ledger/chainnode.py", "providers"),  # bounded_json
    ("ledger/audit.py", "providers"),  # bounded_json
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_app_imports_upwards_or_sideways():
    crossings = set()
    for app, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for top in _imports(path) & forbidden:
                crossings.add((str(path.relative_to(ROOT)), top))
    assert crossings - KNOWN == set(), "an app imports a package above or beside it: move the helper below"
    assert KNOWN - crossings == set(), "a known crossing is gone: take it off KNOWN"
