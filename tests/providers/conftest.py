"""Fixtures for provider tests; the session's AWS sandbox itself comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from providers.aws.adapter import AwsAdapter
from providers.sandbox.aws import AwsSandbox
from providers.sandbox.aws_keys import ALICE
from providers.types import Credentials
from tests.providers.contract import ContractTarget, load, target_modules

AdapterFactory = Callable[..., AwsAdapter]


@pytest.fixture
def aws_adapter(aws_sandbox: AwsSandbox) -> AdapterFactory:
    """``aws_adapter(regions=[...], access_key_id=..., **options)`` -> an ``AwsAdapter`` on the sandbox."""

    def build(regions: list[str] | None = None, access_key_id: str = ALICE.access_key_id, **options: str) -> AwsAdapter:
        credentials = Credentials(
            kind="aws",
            values={"access_key_id": access_key_id, "secret_access_key": ALICE.secret_access_key},
            endpoint_url=aws_sandbox.url,
        )
        return AwsAdapter(credentials, regions or ["us-east-1"], options)

    return build


# --- The contract suite: every provider's sandbox and adapter (tests/providers/contract.py) ---------------

MODULES = target_modules()
_started: dict[str, Any] = {}


@pytest.fixture(params=MODULES, ids=[m.rsplit(".", 1)[1].removesuffix("_target") for m in MODULES])
def target(request) -> ContractTarget:
    module = load(request.param)
    fixture = getattr(module, "SESSION_FIXTURE", None)
    if fixture:
        sandbox = request.getfixturevalue(fixture)
    else:
        if request.param not in _started:
            _started[request.param] = module.start_sandbox()
            request.session.addfinalizer(_started[request.param].stop)  # type: ignore[attr-defined]
        sandbox = _started[request.param]
    sandbox.reset()
    yield module.target(sandbox)
    sandbox.reset()
