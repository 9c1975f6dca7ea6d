"""The AWS adapter under the contract suite."""

from __future__ import annotations

from typing import Any

from providers.aws.adapter import AwsAdapter
from providers.sandbox.aws import AwsSandbox, start_aws_sandbox
from providers.types import Credentials
from tests.providers.contract import ContractTarget

KIND = "aws"
# moto keeps its state per process, so the contract suite reuses the session sandbox instead of a second one.
SESSION_FIXTURE = "aws_sandbox_server"


def start_sandbox() -> AwsSandbox:
    return start_aws_sandbox()


def target(sandbox: AwsSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> AwsAdapter:
        key = "AKIDCONTRACT0001" if valid else "bad-key-0001"
        credentials = Credentials(
            kind=KIND, values={"access_key_id": key, "secret_access_key": "s"}, endpoint_url=sandbox.url
        )
        return AwsAdapter(credentials, ["us-east-1"], options)

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=["us-east-1"],
        launch_action="RunInstances",
        read_action="DescribeInstanceTypes",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
    )
