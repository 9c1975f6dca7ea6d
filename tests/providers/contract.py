"""What the contract suite needs from each provider: a sandbox and a way to build the adapter against it.

Each provider adds ``tests/providers/<kind>_target.py`` with a ``target(sandbox)`` function returning a
``ContractTarget`` and a ``start_sandbox()`` function; ``test_contract.py`` discovers them and runs the same
scenarios against every one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers.base import ProviderAdapter


@dataclass
class ContractTarget:
    """One provider under contract test.

    ``make_adapter(valid_credentials, options)`` builds the real adapter pointed at ``sandbox``, with
    credentials the sandbox accepts (True) or rejects (False). ``launch_action`` / ``read_action`` are the
    provider API actions the sandbox's fault registry matches for a launch and for a read that
    ``list_offers`` makes. ``short_timeout`` are adapter options that make the client give up after about
    half a second. ``instances()`` lists what the sandbox holds (objects with ``instance_id``).
    """

    kind: str
    sandbox: Any
    make_adapter: Callable[[bool, dict[str, str]], ProviderAdapter]
    regions: list[str]
    launch_action: str
    read_action: str
    short_timeout: dict[str, str]
    instances: Callable[[], list[Any]]
    extra: dict[str, Any] = field(default_factory=dict)


def target_modules() -> list[str]:
    """Every ``*_target`` module beside this file, sorted by kind."""
    import tests.providers as package

    return sorted(
        f"tests.providers.{m.name}" for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_target")
    )


def load(module: str) -> Any:
    return importlib.import_module(module)
