"""What the contract suite needs from each provider: a sandbox and a way to build the adapter against it.

Each provider adds ``tests/providers/<kind>_target.py`` with a ``target(sandbox)`` function returning a
``ContractTarget`` and a ``start_sandbox()`` function; ``test_contract.py`` discovers them and runs the same
scenarios against every one.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers import gpu_names
from providers.base import ProviderAdapter
from providers.errors import (
    CapacityUnavailable,
    CredentialsRejected,
    ProviderError,
    QuotaExceeded,
    TransientProviderError,
)
from providers.launch import BootSpec, IngressRule, WorkloadKind
from providers.types import InstanceHandle, InstanceState, LaunchSpec, OfferQuote, PricingModel
from tests.sshkeys import ed25519_public, parsed, rsa_public


@dataclass
class LaunchedView:
    """What a sandbox holds for one launched instance, read back from the state it keeps in its cloud's own
    wire format (not from anything the adapter returned): the proof that the launch carried the boot.

    ``user_data`` is the boot script as the machine would run it (decoded from the wire's encoding);
    ``public_keys`` the keys the cloud's own key mechanism installs (``"<type> <base64>"``); ``ingress`` each
    (port, CIDR) the instance's firewall lets in; ``resource_tags`` the order reference found on every
    resource the launch created besides the instance (key pairs, security groups, firewall rules)."""

    image: str
    disk_gb: int | None
    user_data: bytes
    public_keys: list[str]
    ingress: set[tuple[int, str]]
    resource_tags: list[str]


@dataclass
class ContractTarget:
    """One provider under contract test.

    ``make_adapter(valid_credentials, options)`` builds the real adapter pointed at ``sandbox``, with
    credentials the sandbox accepts (True) or rejects (False). ``launch_action`` / ``read_action`` are the
    provider API actions the sandbox's fault registry matches for a launch and for a read that
    ``list_offers`` makes. ``short_timeout`` are adapter options that make the client give up after about
    half a second. ``instances()`` lists what the sandbox holds (objects with ``instance_id``).
    """

    kind: str
    sandbox: Any
    make_adapter: Callable[[bool, dict[str, str]], ProviderAdapter]
    regions: list[str]
    launch_action: str
    read_action: str
    short_timeout: dict[str, str]
    instances: Callable[[], list[Any]]
    extra: dict[str, Any] = field(default_factory=dict)
    # The sandbox's own record of a launched instance (``LaunchedView``); None until the provider's boot is built.
    launched: Callable[[Any], LaunchedView] | None = None


def target_modules() -> list[str]:
    """Every ``*_target`` module beside this file, sorted by kind."""
    import tests.providers as package

    return sorted(
        f"tests.providers.{m.name}" for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_target")
    )


def load(module: str) -> Any:
    return importlib.import_module(module)


_offers: dict[str, list[OfferQuote]] = {}


def offers(target: ContractTarget) -> list[OfferQuote]:
    """The sandbox catalogue, read once per kind (the scenarios below do not change it)."""
    if target.kind not in _offers:
        _offers[target.kind] = target.make_adapter(True, {}).list_offers()
    return _offers[target.kind]


def launchable(target: ContractTarget) -> OfferQuote:
    """The cheapest on-demand offer with a canonical GPU model: the one every scenario launches."""
    candidates = [
        q for q in offers(target) if q.pricing_model == PricingModel.ON_DEMAND and q.gpu_model in gpu_names.ALL
    ]
    return min(candidates, key=lambda q: (q.price, q.zone, q.instance_type))


def spec_for(offer: OfferQuote, token: str | None = None) -> LaunchSpec:
    order_ref = f"ord-{uuid.uuid4().hex}"
    return LaunchSpec(
        region=offer.region,
        zone=offer.zone,
        instance_type=offer.instance_type,
        pricing_model=offer.pricing_model,
        client_token=token or f"{order_ref}-a1",
        order_ref=order_ref,
    )


def settle(adapter: ProviderAdapter, spec: LaunchSpec, *, polls: int = 50) -> InstanceHandle | ProviderError:
    """Launch and poll until the provider has decided: a provider error, raised at once or reported later
    (asynchronous clouds), or the instance no longer pending."""
    try:
        handle = adapter.launch(spec)
    except ProviderError as exc:
        return exc
    for _ in range(polls):
        if handle.state != InstanceState.PENDING:
            break
        time.sleep(0.1)
        try:
            handle = adapter.describe(spec.region, handle.instance_id)
        except ProviderError as exc:
            return exc
    if handle.state == InstanceState.FAILED:
        return _async_error(handle)
    return handle


def _async_error(handle: InstanceHandle) -> ProviderError:
    classes = {
        c.error_class: c for c in (CapacityUnavailable, QuotaExceeded, TransientProviderError, CredentialsRejected)
    }
    cls = classes.get(str(handle.extra.get("error_class", "")), ProviderError)
    return cls(str(handle.extra.get("error_message", "launch failed")), code=str(handle.extra.get("error_code", "")))


def live(target: ContractTarget) -> list[Any]:
    return [i for i in target.instances() if str(getattr(i, "state", "")).lower() not in {"terminated", "deleted"}]


AGENT_SHA256 = "ab" * 32


def contract_boot(
    *, script: str | None = None, disk_gb: int | None = 120, cidrs: tuple[str, ...] = ("203.0.113.0/24",)
) -> BootSpec:
    """A boot as the broker would send it: two keys, SSH and one service port from a documentation range, a
    disk size, and a container workload (or ``script``)."""
    workload = (
        {"kind": WorkloadKind.SCRIPT.value, "script": script, "env": []}
        if script is not None
        else {"kind": "container", "image": "vllm/vllm-openai:v0.6.3", "ports": [8000], "env": [],
              # The image's own entrypoint, given (vLLM's Dockerfile): a Kubernetes pod runs the command itself.
              "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m"]}
    )  # fmt: skip
    return BootSpec(
        broker_url="https://broker.example",
        boot_token="bt_contract-token-0123456789abcdefghijklmnopqrstuvw",
        agent_sha256=AGENT_SHA256,
        ssh_keys=parsed(ed25519_public(), rsa_public()),
        ingress=(IngressRule(port=22, cidrs=cidrs), IngressRule(port=8000, cidrs=cidrs)),
        disk_gb=disk_gb,
        workload=workload,
    )
