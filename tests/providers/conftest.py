"""Fixtures for provider tests; the session's AWS sandbox itself comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import requests
from django.conf import settings as django_settings

from providers.aws.adapter import AwsAdapter
from providers.types import Credentials
from sandboxes.alibaba.app import AlibabaSandbox, start_alibaba_sandbox
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import ALICE
from sandboxes.azure.app import AzureSandbox, start_azure_sandbox
from sandboxes.gcp.app import GcpSandbox, start_gcp_sandbox
from sandboxes.tencent.app import TencentSandbox, start_tencent_sandbox
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


@pytest.fixture(scope="module")
def store() -> redis.Redis:
    """The Redis the provider rate limiter's shared buckets live in; the test is skipped without one."""
    url = django_settings.PROVIDER_RATE_LIMIT_REDIS_URL
    if not url:
        pytest.skip("the shared buckets need Redis: set REDIS_URL (.ci/run does)")
    return redis.Redis.from_url(url)


# One sandbox of each cloud per test module (the AWS one is the session's): a module resets it as it needs.


@pytest.fixture(scope="module")
def azure_server() -> Iterator[AzureSandbox]:
    sandbox = start_azure_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def arm(sandbox: AzureSandbox) -> Iterator[requests.Session]:
    """A session signed in to the module's Azure sandbox (its ``sandbox`` fixture) as Alice's app, for tests
    that speak ARM's wire directly."""
    with requests.Session() as session:
        session.verify = str(sandbox.cert_path)
        session.trust_env = False  # else REQUESTS_CA_BUNDLE from the environment overrides the session's CA
        token = session.post(
            f"{sandbox.url}/tenant-1/oauth2/v2.0/token",
            data={
                "grant_type": "client_credentials",
                "client_id": "alice-app",
                "client_secret": "s",
                "scope": "https://management.azure.com/.default",
            },
            timeout=5,
        ).json()["access_token"]
        session.headers["Authorization"] = f"Bearer {token}"
        yield session


@pytest.fixture(scope="module")
def gcp_server() -> Iterator[GcpSandbox]:
    sandbox = start_gcp_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture(scope="module")
def alibaba_server() -> Iterator[AlibabaSandbox]:
    sandbox = start_alibaba_sandbox()
    yield sandbox
    sandbox.stop()


@pytest.fixture(scope="module")
def tencent_server() -> Iterator[TencentSandbox]:
    sandbox = start_tencent_sandbox()
    yield sandbox
    sandbox.stop()


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
