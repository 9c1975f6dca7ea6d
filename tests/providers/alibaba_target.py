"""The Alibaba Cloud ECS adapter under the contract suite."""

from __future__ import annotations

from typing import Any

from providers.alibaba.adapter import AlibabaAdapter
from providers.sandbox.alibaba import AlibabaSandbox, start_alibaba_sandbox
from providers.types import Credentials
from tests.providers.contract import ContractTarget

KIND = "alibaba"
VALID_KEY = "LTAI5tContract0001"
VALID_SECRET = "contract-secret"


def start_sandbox() -> AlibabaSandbox:
    return start_alibaba_sandbox()


def target(sandbox: AlibabaSandbox) -> ContractTarget:
    # Registered after the suite's reset: every contract request then has its ACS3 signature verified in full.
    sandbox.register_key(VALID_KEY, VALID_SECRET)

    def make_adapter(valid: bool, options: dict[str, str]) -> AlibabaAdapter:
        key = VALID_KEY if valid else "bad-LTAI-0001"
        credentials = Credentials(
            kind=KIND, values={"access_key_id": key, "access_key_secret": VALID_SECRET}, endpoint_url=sandbox.url
        )
        return AlibabaAdapter(credentials, ["cn-shanghai"], options)

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=["cn-shanghai"],
        launch_action="RunInstances",
        read_action="DescribeInstanceTypes",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
    )
