"""The Tencent Cloud adapter under the contract suite."""

from __future__ import annotations

from typing import Any

from providers.sandbox.tencent import TencentSandbox, start_tencent_sandbox
from providers.tencent.adapter import TencentAdapter
from providers.types import Credentials
from tests.providers.contract import ContractTarget

KIND = "tencent"
REGIONS = ["ap-guangzhou", "ap-shanghai"]
SECRET_ID = "AKIDcontract00000001"
SECRET_KEY = "contract-secret-key"


def start_sandbox() -> TencentSandbox:
    return start_tencent_sandbox()


def target(sandbox: TencentSandbox) -> ContractTarget:
    # Registered, so every contract request must carry a valid TC3 signature for this key.
    sandbox.register_secret(SECRET_ID, SECRET_KEY)

    def make_adapter(valid: bool, options: dict[str, str]) -> TencentAdapter:
        secret_id = SECRET_ID if valid else "bad-secret-id-0001"
        credentials = Credentials(
            kind=KIND, values={"secret_id": secret_id, "secret_key": SECRET_KEY}, endpoint_url=sandbox.url
        )
        return TencentAdapter(credentials, REGIONS, options)

    def instances() -> list[Any]:
        # CVM keeps describing a LAUNCH_FAILED instance (until recycled) and a terminated one (SHUTDOWN, in the
        # recycle bin) for a while; neither holds capacity or bills, so neither counts as live.
        return [i for i in sandbox.instances() if i.holds_resources]

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=REGIONS,
        launch_action="RunInstances",
        read_action="DescribeZoneInstanceConfigInfos",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
    )
