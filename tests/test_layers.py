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


# Every package of ours whose modules the two tests below walk.
PACKAGES = ("broker", "marketplace", "providers", "ledger", "untrusted", "sandboxes")

# Imports that may be written inside a function, and why. Anything else goes at the top of its module, so the
# reader sees which way each dependency runs; an import placed inside a function to dodge a circle is a circle.
LOCAL_IMPORTS_ALLOWED = {
    "web3": "web3 and the Ethereum stack take seconds to import; only anchoring and the audit need them",
    "ledger.chain": "imports web3 (above) at its top",
    "fpdf": "the PDF library, loaded only when someone downloads an invoice as a PDF",
    "matplotlib": "charts only: every process that loads the URLs (workers, beat, the sequencer) would carry 45 MB",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _our_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, str | None]]:
    """Every import that runs (not those under ``if TYPE_CHECKING``), with the function it is written in."""
    found: list[tuple[ast.Import | ast.ImportFrom, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, function))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
            else:
                visit(child, function)

    visit(tree, None)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The full names an import may refer to: ``from a.b import c`` may be module ``a.b.c`` or a name in ``a.b``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _import_graph() -> dict[str, set[str]]:
    modules = _our_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, _function in _import_nodes(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_module_imports_another_that_imports_it_back():
    """Every dependency runs one way (issue 34): a circle of modules, however long, fails here, whether its
    imports are at the top or inside functions. A package's ``__init__`` importing its own modules is no circle."""
    assert _circles(_import_graph()) == []


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_imports_inside_functions_are_only_the_listed_heavy_ones():
    """Django's ``AppConfig.ready`` is where an app must import what needs the models loaded; any other import
    inside a function must be one of ``LOCAL_IMPORTS_ALLOWED``."""
    stray = []
    for name, path in _our_modules().items():
        for node, function in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if function is None or (path.name == "apps.py" and function == "ready"):
                continue
            target = _targets(node, name, path.name == "__init__.py")[0]
            if not any(target == allowed or target.startswith(allowed + ".") for allowed in LOCAL_IMPORTS_ALLOWED):
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target} inside {function}()")
    assert stray == []


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
