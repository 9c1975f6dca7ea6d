"""Fixtures for provider tests; the session's AWS sandbox itself comes from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from providers.aws.adapter import AwsAdapter
from providers.sandbox.aws import AwsSandbox
from providers.types import Credentials

AdapterFactory = Callable[..., AwsAdapter]


@pytest.fixture
def aws_adapter(aws_sandbox: AwsSandbox) -> AdapterFactory:
    """``aws_adapter(regions=[...], access_key_id=..., **options)`` -> an ``AwsAdapter`` on the sandbox."""

    def build(regions: list[str] | None = None, access_key_id: str = "AKIDALICE", **options: str) -> AwsAdapter:
        credentials = Credentials(
            kind="aws",
            values={"access_key_id": access_key_id, "secret_access_key": "alice-secret"},
            endpoint_url=aws_sandbox.url,
        )
        return AwsAdapter(credentials, regions or ["us-east-1"], options)

    return build
