"""What an ECS launch brings with it: the key pair and security group a boot creates (named and tagged for
the order, so they can be found and removed), their ingress permissions, the system disk and image, and the
user data with its GPU driver prelude. Pure functions over plain dicts.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from providers import sshkeys
from providers.alibaba.catalog import parse_time
from providers.alibaba.errors import malformed
from providers.alibaba.mapping import ORDER_TAG, tags_dict
from providers.launch import IngressRule, OrderResource

# RunInstances UserData: "The size of instance user data cannot exceed 32 KB before Base64 encoding" (RunInstances
# API reference; "Instance user data", https://www.alibabacloud.com/help/en/ecs/user-guide/overview-of-ecs-instance-
# user-data). Older pages still say 16 KB: the current reference is the one followed.
USER_DATA_MAX_BYTES = 32 * 1024
# RunInstances SystemDisk.Size (GiB): 20 to 2048 for the default categories (cloud_efficiency, cloud_ssd, ESSD PL1),
# and never below the image's size.
SYSTEM_DISK_MIN_GB = 20
SYSTEM_DISK_MAX_GB = 2048
# AuthorizeSecurityGroup: "The total number of inbound security group rules in each security group cannot exceed 200";
# one call takes Permissions.N with N from 1 to 100.
INGRESS_RULES_MAX = 200
PERMISSIONS_PER_CALL = 100
# ImportKeyPair takes rsa, dsa, ssh-rsa, ssh-dss and ecdsa public keys (and their OpenSSH certificates); ED25519 and
# the security-key types are not listed, so those reach the machine through the boot script only.
NATIVE_KEY_TYPES = frozenset({sshkeys.RSA, *sshkeys.ECDSA_TYPES})
# Alibaba publishes its public images in families ("acs:<os>_<version>_<arch>"): DescribeImages with ImageFamily
# answers every build of the family, and ECS itself launches the newest Available one when given the family
# ("Image family overview", https://www.alibabacloud.com/help/en/elastic-compute-service/latest/image-family-overview).
DEFAULT_IMAGE_FAMILY = "acs:ubuntu_22_04_x64"
RESOURCE_PREFIX = "gpu-broker-"
NAME_MAX = 128
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9:_.\-]")

# The GPU driver: ECS public images carry none. Alibaba's documented way to have it at creation is user data that
# fetches its installer from the region's internal mirror (the address comes from the instance metadata item
# ``source-address``) and runs it with the driver, CUDA and cuDNN versions. The script name, path, arguments and
# these versions are the ones Alibaba's own quickstarts pass (aliyun-computenest/quickstart-LobeChat,
# lobe-chat-gpu/init_gpu.sh); the guard skips it on an image that already has a working driver.
GPU_DRIVER_VERSION = "550.127.08"
CUDA_VERSION = "12.4.1"
CUDNN_VERSION = "9.2.0.82"
GPU_INSTALLER = "auto_install_v4.0.sh"
GPU_INSTALLER_PATH = "/opsx/ecs/linux/binary/script/"
METADATA_SOURCE_ADDRESS = "http://100.100.100.200/latest/meta-data/source-address"


def gpu_driver_prelude() -> str:
    """Shell lines installing the NVIDIA driver the way Alibaba documents it, unless ``nvidia-smi`` already works."""
    return "\n".join(
        [
            "if ! nvidia-smi >/dev/null 2>&1; then",
            f"  mirror=$(curl -fsS --max-time 10 {METADATA_SOURCE_ADDRESS} | head -n 1)",
            "  install -d -m 700 /root/auto_install",
            f"  if curl -fsS --max-time 300 -o /root/auto_install/{GPU_INSTALLER} "
            f'"$mirror{GPU_INSTALLER_PATH}{GPU_INSTALLER}"; then',
            f"    (cd /root/auto_install && bash {GPU_INSTALLER} {GPU_DRIVER_VERSION} {CUDA_VERSION} {CUDNN_VERSION} "
            "FALSE FALSE) >>/var/log/gpu-broker-driver.log 2>&1",
            "  fi",
            "fi",
        ]
    )


def order_resource_name(order_ref: str) -> str:
    """The name of the key pair and the security group an order's launches share in a region.

    ImportKeyPair and CreateSecurityGroup take 2-128 characters starting with a letter: letters, digits, ``:``,
    ``_``, ``.`` and ``-``. Anything else in the reference becomes ``-``.
    """
    return (RESOURCE_PREFIX + _NAME_UNSAFE.sub("-", order_ref))[:NAME_MAX]


def security_group_token(order_ref: str, region: str, vpc_id: str) -> str:
    """CreateSecurityGroup's ClientToken (at most 64 ASCII characters): one per order, region and VPC, so two
    attempts racing to create the group get the same one back."""
    return "sg-" + hashlib.sha256(f"{order_ref}|{region}|{vpc_id}".encode()).hexdigest()[:40]


def order_tags(order_ref: str) -> list[dict[str, str]]:
    """``Tag.N`` for everything a launch creates besides the instance."""
    return [{"Key": ORDER_TAG, "Value": order_ref}]


def native_key(keys: Sequence[sshkeys.SshPublicKey]) -> sshkeys.SshPublicKey | None:
    """The key ECS's own key pair gets: the first of a type ImportKeyPair takes. An instance binds one key pair
    holding one key, so the others (and every ED25519 key) are installed by the boot script alone."""
    return next((key for key in keys if key.key_type in NATIVE_KEY_TYPES), None)


def encode_user_data(script: bytes) -> str:
    """RunInstances UserData is the script Base64-encoded."""
    return base64.b64encode(script).decode("ascii")


def ingress_permissions(rules: Iterable[IngressRule], description: str) -> list[dict[str, str]]:
    """AuthorizeSecurityGroup ``Permissions.N``: one accept rule per (port, address range), IPv4 ranges in
    ``SourceCidrIp`` and IPv6 ranges in ``Ipv6SourceCidrIp`` (one rule cannot carry both)."""
    permissions: list[dict[str, str]] = []
    seen: set[tuple[str, int, str]] = set()
    for rule in rules:
        for cidr in rule.cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            if (rule.protocol, rule.port, str(network)) in seen:
                continue
            seen.add((rule.protocol, rule.port, str(network)))
            source = "SourceCidrIp" if network.version == 4 else "Ipv6SourceCidrIp"
            permissions.append(
                {
                    "IpProtocol": rule.protocol,
                    "PortRange": f"{rule.port}/{rule.port}",
                    source: str(network),
                    "Policy": "accept",
                    "Priority": "1",
                    "Description": description,
                }
            )
    return permissions


def _port_range(value: str, protocol: str) -> range:
    start, _, end = value.partition("/")
    low, high = int(start), int(end or start)
    if low == -1 or protocol.lower() == "all":  # ICMP, GRE and "all" rules name -1/-1: every port
        return range(1, 65536)
    return range(low, high + 1)


def ingress_pairs(permissions: Iterable[Mapping[str, Any]]) -> set[tuple[int, str]]:
    """Every (port, address range) that ``Permissions.Permission`` of DescribeSecurityGroupAttribute lets in:
    inbound accept rules with an address source; a port range counts every port in it."""
    pairs: set[tuple[int, str]] = set()
    try:
        for item in permissions:
            if str(item.get("Direction") or "ingress").lower() != "ingress":
                continue
            if str(item.get("Policy") or "accept").lower() != "accept":
                continue
            cidr = str(item.get("SourceCidrIp") or item.get("Ipv6SourceCidrIp") or "")
            if not cidr:
                continue
            network = str(ipaddress.ip_network(cidr, strict=False))
            pairs.update((port, network) for port in _port_range(str(item["PortRange"]), str(item["IpProtocol"])))
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"unreadable security group rule ({exc!r})") from None
    return pairs


def newest_image(items: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest Available image of a DescribeImages answer: what ECS launches for the family."""
    available = [item for item in items if str(item.get("Status") or "Available") == "Available"]
    try:
        return max(available, key=lambda item: parse_time(str(item["CreationTime"])), default=None)
    except (KeyError, ValueError) as exc:
        raise malformed(f"unreadable image entry ({exc!r})") from None


def image_size_gb(item: Mapping[str, Any]) -> int:
    try:
        return int(item.get("Size") or 0)
    except (TypeError, ValueError):
        raise malformed(f"unreadable image size {item.get('Size')!r}") from None


def _order_of(tags: Mapping[str, Any] | None) -> str:
    return tags_dict(tags).get(ORDER_TAG, "")


def key_pair_resources(items: Iterable[Mapping[str, Any]], region: str) -> list[OrderResource]:
    """DescribeKeyPairs ``KeyPairs.KeyPair`` entries tagged with an order."""
    found: list[OrderResource] = []
    for item in items:
        order_ref = _order_of(item.get("Tags"))
        if order_ref:
            found.append(
                OrderResource(
                    kind="key_pair",
                    resource_id=str(item["KeyPairName"]),
                    region=region,
                    order_ref=order_ref,
                    extra={"fingerprint": str(item.get("KeyPairFingerPrint") or "")},
                )
            )
    return found


def security_group_resources(items: Iterable[Mapping[str, Any]], region: str) -> list[OrderResource]:
    """DescribeSecurityGroups ``SecurityGroups.SecurityGroup`` entries tagged with an order."""
    found: list[OrderResource] = []
    for item in items:
        order_ref = _order_of(item.get("Tags"))
        if order_ref:
            found.append(
                OrderResource(
                    kind="security_group",
                    resource_id=str(item["SecurityGroupId"]),
                    region=region,
                    order_ref=order_ref,
                    extra={"vpc_id": str(item.get("VpcId") or ""), "name": str(item.get("SecurityGroupName") or "")},
                )
            )
    return found
