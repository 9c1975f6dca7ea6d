"""The Tencent Cloud adapter under the contract suite."""

from __future__ import annotations

import base64
from typing import Any

from providers.tencent.adapter import TencentAdapter
from providers.tencent.mapping import ORDER_TAG
from providers.types import Credentials, InstanceHandle
from sandboxes.tencent.app import TencentSandbox, start_tencent_sandbox
from tests.providers.contract import ContractTarget, LaunchedView

KIND = "tencent"
REGIONS = ["ap-guangzhou", "ap-shanghai"]
SECRET_ID = "AKIDcontract00000001"
SECRET_KEY = "contract-secret-key"


def start_sandbox() -> TencentSandbox:
    # Terminated instances shut down at once: the boot contract releases an order's security group right after
    # the instance reads TERMINATED, and CVM holds a group while its instance is still TERMINATING.
    return start_tencent_sandbox(terminate_seconds=0)


def policy_ports(port: str) -> list[int]:
    """The ports a SecurityGroupPolicy ``Port`` names: one port, ``a,b`` or ``a-b``."""
    ports: list[int] = []
    for part in port.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            ports.extend(range(int(low), int(high or low) + 1))
    return ports


def launched_view(sandbox: TencentSandbox, handle: InstanceHandle) -> LaunchedView:
    """What the sandbox keeps for the instance, in CVM's and VPC's wire shapes: RunInstances' ImageId,
    SystemDisk.DiskSize and base64 UserData, the key pairs of LoginSettings.KeyIds, and the ACCEPT ingress
    policies of its security groups."""
    record = sandbox.launched(handle.instance_id)
    ingress: set[tuple[int, str]] = set()
    for group in record.security_groups:
        for policy in group["SecurityGroupPolicySet"]["Ingress"]:
            if policy["Action"] == "ACCEPT":
                cidr = policy.get("CidrBlock") or policy.get("Ipv6CidrBlock")
                ingress.update((port, cidr) for port in policy_ports(policy["Port"]))
    tagged = [kp["Tags"] for kp in record.key_pairs] + [g["TagSet"] for g in record.security_groups]
    return LaunchedView(
        image=record.image_id,
        disk_gb=record.system_disk.get("DiskSize"),
        user_data=base64.b64decode(record.user_data or ""),
        public_keys=[kp["PublicKey"] for kp in record.key_pairs],
        ingress=ingress,
        resource_tags=[next((t["Value"] for t in tags if t["Key"] == ORDER_TAG), "") for tags in tagged],
    )


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
        launched=lambda handle: launched_view(sandbox, handle),
        extra={"start_action": "StartInstances"},
    )
