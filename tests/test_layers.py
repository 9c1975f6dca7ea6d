"""The direction of imports between the top-level packages (issue 23, point 7): broker -> marketplace ->
providers, ledger -> untrusted; providers and ledger import neither marketplace nor each other; no app imports
broker; untrusted imports only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What each app may not import (its own name and the standard library are always fine).
FORBIDDEN = {
    "marketplace": {"broker"},
    "providers": {"broker", "marketplace", "ledger"},
    "ledger": {"broker", "marketplace", "providers"},
    "untrusted": {"broker", "marketplace", "providers", "ledger"},
}
# Crossings not yet moved below; a new one fails the test, and one that is fixed must leave this list.
KNOWN: set[tuple[str, str]] = set()


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


def test_the_bottom_package_needs_only_the_standard_library():
    """``untrusted`` travels in the lease agent's bundle to machines that have only Python."""
    for path in sorted((ROOT / "untrusted").rglob("*.py")):
        assert _imports(path) - set(sys.stdlib_module_names) - {"__future__"} == set(), path


def _modules_imported(path: Path) -> set[str]:
    """Every module ``path`` imports by absolute name, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_only_task_modules_import_task_modules():
    """Tasks live beside the services they run and import them; services queue work by task name
    (``marketplace.taskkit.enqueue``), so no service imports a task module and no import circle runs through
    one (issue 23, point 1)."""
    offenders = []
    for app in ("marketplace", "providers", "ledger"):
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or path.name in ("tasks.py", "apps.py"):  # apps.py registers them
                continue
            tasks = {m for m in _modules_imported(path) if m.split(".")[-1] == "tasks" or ".tasks." in m}
            if tasks:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(tasks)}")
    assert offenders == []


def test_every_process_knows_the_tasks_services_queue_by_name():
    """A web process imports no task module, yet its services queue tasks by name: the apps register them at
    start-up. A fresh interpreter, as gunicorn's worker is, finds each one."""
    import subprocess
    import sys

    names = ["marketplace.order_provision", "marketplace.offers_sync_account", "marketplace.webhook_deliver",
             "marketplace.cluster_advance", "ledger.checkpoint_sign"]  # fmt: skip
    script = (
        "import django; django.setup(); from celery import current_app; "
        f"print(all(name in current_app.tasks for name in {names!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "broker.settings"},
    )  # fmt: skip
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_production_never_imports_the_sandboxes():
    """The sandboxes emulate the outside world for tests and the demo (issue 34, point 2): no production module
    imports them, at the top or inside a function; the run command starts them as a process of their own."""
    offenders = []
    for app in ("broker", "marketplace", "providers", "ledger", "untrusted"):
        for path in sorted((ROOT / app).rglob("*.py")):
            imported = set()
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module)
            if any(name == "sandboxes" or name.startswith("sandboxes.") for name in imported):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], f"production imports the sandboxes: {offenders}"
