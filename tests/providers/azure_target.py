"""The Azure adapter under the contract suite."""

from __future__ import annotations

from typing import Any

from providers.azure.adapter import AzureAdapter
from providers.sandbox.azure import AzureSandbox, start_azure_sandbox
from providers.types import Credentials
from tests.providers.contract import ContractTarget

KIND = "azure"
REGIONS = ["eastus", "southcentralus", "westus", "westus3"]


def start_sandbox() -> AzureSandbox:
    return start_azure_sandbox()


def target(sandbox: AzureSandbox) -> ContractTarget:
    def make_adapter(valid: bool, options: dict[str, str]) -> AzureAdapter:
        values = dict(sandbox.demo_credentials)
        values["client_id"] = "contract-app" if valid else "bad-app-0001"
        credentials = Credentials(kind=KIND, values=values, endpoint_url=sandbox.url)
        return AzureAdapter(credentials, REGIONS, {**sandbox.account_options(), "polling_interval": "0.02", **options})

    def instances() -> list[Any]:
        return list(sandbox.instances())

    return ContractTarget(
        kind=KIND,
        sandbox=sandbox,
        make_adapter=make_adapter,
        regions=REGIONS,
        launch_action="VirtualMachines_CreateOrUpdate",
        read_action="ResourceSkus_List",
        short_timeout={"read_timeout": "0.5", "max_attempts": "1"},
        instances=instances,
    )
