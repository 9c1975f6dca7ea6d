"""Provider kind -> adapter class, imported lazily so an unused SDK is never imported."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from providers.base import ProviderAdapter
from providers.types import Credentials

ADAPTERS: dict[str, str] = {
    "aws": "providers.aws.adapter.AwsAdapter",
    "azure": "providers.azure.adapter.AzureAdapter",
    "tencent": "providers.tencent.adapter.TencentAdapter",
    "alibaba": "providers.alibaba.adapter.AlibabaAdapter",
    "gcp": "providers.gcp.adapter.GcpAdapter",
    "community": "providers.community.adapter.CommunityAdapter",
    "kubernetes": "providers.kubernetes.adapter.KubernetesAdapter",
}


def adapter_class(kind: str) -> type[ProviderAdapter]:
    try:
        dotted = ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r}; known kinds: {', '.join(sorted(ADAPTERS))}") from None
    module_name, _, class_name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(cls, ProviderAdapter)
    return cls


def build_adapter(
    kind: str, credentials: Credentials, regions: Sequence[str], options: dict[str, str] | None = None
) -> ProviderAdapter:
    return adapter_class(kind)(credentials, regions, options)
