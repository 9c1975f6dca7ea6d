"""One boot contract, every cloud: a launch carries the buyer's keys, firewall, disk, image and boot script in
the cloud's own mechanisms; the sandbox keeps them in its wire format and boots the lease agent from the user
data; over-limit configurations are refused before any launch; what a launch creates is tagged with the order
and released; a missing image fails the launch before any instance exists.

Each cloud's mechanism, field names and limits are cited in its adapter and its own tests; these scenarios
only hold every adapter to the same promises.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from providers.boot import lease_file
from providers.errors import ImageUnavailable, ProviderRequestRejected
from providers.launch import BootSpec
from providers.types import InstanceHandle, InstanceState, LaunchSpec
from sandboxes.boot import BootMode
from tests.providers.contract import ContractTarget, contract_boot, launchable, live, settle, spec_for
from tests.sshkeys import ecdsa_public, parsed


def booted_spec(target: ContractTarget, boot_spec: BootSpec | None = None, token: str | None = None) -> LaunchSpec:
    from dataclasses import replace

    return replace(spec_for(launchable(target), token), boot=boot_spec or contract_boot())


@pytest.fixture
def held(target):
    """The target's sandbox with booted machines held for the test instead of phoning home."""
    booter = target.sandbox.booter
    mode = booter.mode
    booter.mode = BootMode.HOLD
    yield target
    booter.reset()
    booter.mode = mode


def _launched(target: ContractTarget, spec: LaunchSpec) -> InstanceHandle:
    result = settle(target.make_adapter(True, {}), spec)
    assert isinstance(result, InstanceHandle), result
    return result


def test_a_launch_carries_the_boot_in_the_clouds_own_mechanisms(held):
    assert held.launched is not None, f"{held.kind}: the sandbox does not yet show what a launch carried"
    spec = booted_spec(held)

    handle = _launched(held, spec)
    view = held.launched(handle)

    assert view.user_data == held.make_adapter(True, {}).user_data(spec)
    assert lease_file(spec.boot, login_user=held.make_adapter(True, {}).login_user)["boot_token"] in (
        view.user_data.decode()
    )
    assert view.disk_gb == 120
    assert {(22, "203.0.113.0/24"), (8000, "203.0.113.0/24")} <= view.ingress
    assert not any(cidr in ("0.0.0.0/0", "::/0") for _, cidr in view.ingress)
    native = held.make_adapter(True, {}).launch_limits.native_key_types
    # A cloud may bind one key pair per instance (ECS): at least one native key through the cloud's own
    # mechanism, and every key through the boot script.
    assert view.public_keys and set(view.public_keys) <= {
        k.public_key for k in spec.boot.ssh_keys if k.key_type in native
    }
    assert all(k.public_key.split()[1] in view.user_data.decode() for k in spec.boot.ssh_keys)
    assert view.resource_tags and set(view.resource_tags) == {spec.order_ref}
    assert view.image


def test_the_sandbox_boots_the_lease_agent_from_the_user_data(held):
    spec = booted_spec(held)
    adapter = held.make_adapter(True, {})

    handle = _launched(held, spec)
    for _ in range(50):
        if handle.state == InstanceState.RUNNING:
            break
        handle = adapter.describe(spec.region, handle.instance_id)
    machine = held.sandbox.booter.machine(handle.instance_id)

    # What the broker asked for, as this cloud's machine runs it (a cluster runs a container's command in place).
    boot = spec.boot
    if held.extra.get("workload_in_place") is not None:
        boot = dataclasses.replace(boot, workload=held.extra["workload_in_place"](boot.workload))
    assert machine.lease == lease_file(boot, login_user=adapter.login_user)
    assert len(machine.executor.gpus()) == launchable(held).gpu_count


def test_a_repeated_launch_makes_one_instance_and_one_set_of_resources(held):
    spec = booted_spec(held)
    adapter = held.make_adapter(True, {})

    first = adapter.launch(spec)
    again = adapter.launch(spec)

    assert again.instance_id == first.instance_id
    assert len(live(held)) == 1
    mine = [r for r in adapter.list_order_resources() if r.order_ref == spec.order_ref]
    assert len(mine) == len({(r.kind, r.region) for r in mine}), mine


def test_a_configuration_over_the_clouds_user_data_limit_is_refused_before_launch(held):
    adapter = held.make_adapter(True, {})
    limit = adapter.launch_limits.user_data_max_bytes
    small = booted_spec(held, contract_boot(script="#!/bin/bash\necho hello\n"))
    large = booted_spec(held, contract_boot(script="#!/bin/bash\n" + "echo 0123456789abcdef\n" * (limit // 20 + 1)))

    assert adapter.launch_problems(small) == []
    problems = adapter.launch_problems(large)

    assert [p.field for p in problems] == ["launch.workload"]
    assert str(limit) in problems[0].message
    assert adapter.launch_limits.source in problems[0].message


def test_a_disk_outside_the_clouds_range_is_refused_before_launch(held):
    adapter = held.make_adapter(True, {})
    limits = adapter.launch_limits

    problems = adapter.launch_problems(booted_spec(held, contract_boot(disk_gb=limits.disk_gb_max + 1)))

    assert [p.field for p in problems] == ["launch.disk_gb"]


def test_what_a_launch_created_is_listed_by_its_order_and_released(held):
    spec = booted_spec(held)
    adapter = held.make_adapter(True, {})
    handle = _launched(held, spec)

    mine = [r for r in adapter.list_order_resources() if r.order_ref == spec.order_ref]
    stopped = adapter.terminate(spec.region, handle.instance_id)
    for _ in range(100):  # until the provider says it is gone (some clouds take a moment to shut down)
        if stopped.state == InstanceState.TERMINATED:
            break
        time.sleep(0.1)
        try:
            stopped = adapter.describe(spec.region, handle.instance_id)
        except ProviderRequestRejected:  # a cloud that forgets a released instance at once (ECS)
            break
    remaining = adapter.release_order_resources(spec.order_ref)
    if remaining:  # a cloud that holds a security group until the instance is gone: the next sweep gets it
        remaining = adapter.release_order_resources(spec.order_ref)
    again = adapter.release_order_resources(spec.order_ref)

    assert mine, f"{held.kind}: a booted launch created nothing to release (no firewall, no key?)"
    assert remaining == []
    assert again == []
    assert [r for r in adapter.list_order_resources() if r.order_ref == spec.order_ref] == []


def test_a_missing_image_fails_the_launch_before_any_instance_exists(held):
    if held.extra.get("images_checked_before_launch") is False:
        pytest.skip(f"{held.kind} has no image catalogue to ask: a pull failure shows after the launch")
    spec = booted_spec(held)
    held.sandbox.faults.inject("image_missing", region=spec.region)

    with pytest.raises(ImageUnavailable) as raised:
        held.make_adapter(True, {}).launch(spec)

    assert spec.region in str(raised.value)
    assert live(held) == []


def test_a_key_the_clouds_own_mechanism_refuses_still_reaches_the_machine(held):
    """ECDSA: not every cloud's key import takes it; the boot script installs every key regardless."""
    boot_spec = contract_boot()
    from dataclasses import replace

    spec = booted_spec(held, replace(boot_spec, ssh_keys=parsed(ecdsa_public())))

    handle = _launched(held, spec)

    assert ecdsa_public().split()[1] in held.launched(handle).user_data.decode()
