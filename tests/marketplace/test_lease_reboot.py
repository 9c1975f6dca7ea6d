"""The lease agent survives a reboot (issue 33, point 4, cloud machines): it keeps the key it claimed in a
root-only file and re-attaches with it, never spending the boot token twice; the boot script is safe to run at
every boot, as GCP runs startup scripts at every boot, not the first alone (a startup script holds "commands
that run when a virtual machine (VM) instance boots": https://cloud.google.com/compute/docs/instances/startup-scripts
and .../startup-scripts/linux); on a machine with systemd the agent is a unit started at boot and restarted after
a crash (systemd.service(5), ``Restart=``, ``RestartPreventExitStatus=``:
https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html).

The first tests drive the agent in process; the last boots a real container from the user data EC2 stored,
reboots it (every process killed, the disks kept) and runs the same user data again, as the cloud would."""

from __future__ import annotations

import base64
import json
import stat

import boto3
import pytest

from marketplace.launch.config import LaunchChoice
from marketplace.models import Lease, LeaseHeartbeat, LeaseState, Order, OrderState
from marketplace.orders.services import PlaceRequest, order_place, order_terminate
from providers.boot import lease_file_from_script
from providers.community.lease import EXIT_BUSY, LeaseAgent, hold_lock, main
from providers.community.lease_executors import SimulatedExecutor, parse_simulated
from sandboxes.aws import keys as aws_keys
from tests.leases import LAUNCH, ClientTransport, held_agent
from tests.machines import Machine
from tests.waiting import wait_for

SCRIPT_LAUNCH = LaunchChoice(
    data={
        "allowed_cidrs": ["127.0.0.1/32"],
        "workload": {"kind": "script", "script": "#!/bin/bash\nsleep infinity\n",
                     "env": [{"name": "PLAIN", "value": "p"}, {"name": "TOKEN", "value": "s3cret", "secret": True}]},
    }
)  # fmt: skip


class RecordingExecutor(SimulatedExecutor):
    """A simulated machine that remembers how its workload was started."""

    def __init__(self) -> None:
        super().__init__(parse_simulated("Tesla T4:16x1"))
        self.started: list[tuple[str, dict]] = []

    def start(self, workload, secrets, login_user):
        self.started.append(("start", secrets))
        return super().start(workload, secrets, login_user)

    def resume(self, workload, secrets, login_user):
        self.started.append(("resume", secrets))
        return super().start(workload, secrets, login_user)


def _order(acme, alice, aws_account, capture, launch: LaunchChoice = LAUNCH) -> Order:
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    with capture(execute=True):
        order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=launch, offer_id=offer.pk)).order
    order.refresh_from_db()
    assert order.state == OrderState.PROVISIONING
    return order


@pytest.mark.django_db
def _agent_log(machine: Machine) -> str:
    return f"the agent's log:\n{machine.log()[-3000:]}"


def test_the_claimed_key_is_kept_root_only_and_a_restarted_agent_reattaches_without_the_token(
    acme, alice, aws_account, aws_sandbox, tmp_path, django_capture_on_commit_callbacks
):
    order = _order(acme, alice, aws_account, django_capture_on_commit_callbacks, SCRIPT_LAUNCH)
    lease_file = held_agent(order, aws_sandbox).lease
    key_file = tmp_path / "agent.key"
    first = LeaseAgent(lease_file, RecordingExecutor(), transport=ClientTransport(), key_file=key_file)
    with django_capture_on_commit_callbacks(execute=True):
        assert first.boot() == "running"
    lease = Lease.objects.get(order=order)
    beats = LeaseHeartbeat.objects.filter(lease=lease).count()

    executor, transport = RecordingExecutor(), ClientTransport()
    again = LeaseAgent(lease_file, executor, transport=transport, key_file=key_file)
    state = again.reattach()

    assert state == "running"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    kept = json.loads(key_file.read_text())
    assert kept["key_id"] == lease.key_id and kept["secrets"] == {"env": {"TOKEN": "s3cret"}}
    assert [target for _, target, _ in transport.calls] == ["/agent/v1/lease/heartbeat"]
    assert executor.started == [("resume", {"env": {"TOKEN": "s3cret"}})]
    after = Lease.objects.get(pk=lease.pk)
    assert (after.state, after.key_id, after.claimed_at) == (LeaseState.READY, lease.key_id, lease.claimed_at)
    assert LeaseHeartbeat.objects.filter(lease=lease).count() == beats + 1


@pytest.mark.django_db
def test_an_agent_restarted_after_the_order_ended_stops_without_starting_the_workload(
    acme, alice, aws_account, aws_sandbox, tmp_path, django_capture_on_commit_callbacks
):
    order = _order(acme, alice, aws_account, django_capture_on_commit_callbacks)
    lease_file = held_agent(order, aws_sandbox).lease
    key_file = tmp_path / "agent.key"
    with django_capture_on_commit_callbacks(execute=True):
        LeaseAgent(lease_file, RecordingExecutor(), transport=ClientTransport(), key_file=key_file).boot()
        order_terminate(order=Order.objects.get(pk=order.pk))

    executor = RecordingExecutor()
    state = LeaseAgent(lease_file, executor, transport=ClientTransport(), key_file=key_file).run()

    assert state == "ended"
    assert executor.started == []


def test_a_second_agent_on_the_machine_exits_at_once(tmp_path):
    held = hold_lock(tmp_path / "agent.lock")
    assert held is not None

    code = main(["lease", "--spec", str(tmp_path / "lease.json"), "--lock-file", str(tmp_path / "agent.lock")])

    assert code == EXIT_BUSY
    assert hold_lock(tmp_path / "agent.lock") is None


def _ec2(sandbox, region: str):
    return boto3.client("ec2", region_name=region, endpoint_url=sandbox.url,
                        aws_access_key_id=aws_keys.PETRA.access_key_id,
                        aws_secret_access_key=aws_keys.PETRA.secret_access_key)  # fmt: skip


def _user_data(sandbox, order: Order) -> bytes:
    """The boot script exactly as EC2 stored it for the order's instance."""
    instance = order.instances.get(active=True)
    answer = _ec2(sandbox, instance.region).describe_instance_attribute(
        InstanceId=instance.provider_instance_id, Attribute="userData"
    )
    return base64.b64decode(answer["UserData"]["Value"])


@pytest.mark.django_db(transaction=True)
def test_a_rebooted_machine_heartbeats_again_with_no_buyer_action(
    live_server, settings, acme, alice, aws_account, aws_sandbox, tmp_path
):
    settings.PUBLIC_URL = live_server.url
    settings.LEASE_HEARTBEAT_S = 0.3
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("zone")[0]
    order = order_place(organization=acme, user=alice, request=PlaceRequest(launch=LAUNCH, offer_id=offer.pk)).order
    user_data = _user_data(aws_sandbox, order)
    keys = lease_file_from_script(user_data)["ssh_keys"]
    machine = Machine(tmp_path, login_user=lease_file_from_script(user_data)["login_user"])
    authorized_keys = tmp_path / "home" / machine.login_user / ".ssh" / "authorized_keys"
    try:
        machine.power_on()
        booted = machine.boot(user_data)
        assert booted.returncode == 0, booted.stderr.decode(errors="replace")
        wait_for(
            lambda: Order.objects.get(pk=order.pk).state == OrderState.RUNNING,
            "the order to run",
            detail=lambda: _agent_log(machine),
        )
        wait_for(
            lambda: LeaseHeartbeat.objects.filter(lease__order=order).exists(),
            "a heartbeat",
            detail=lambda: _agent_log(machine),
        )
        claimed = Lease.objects.get(order=order)

        # The script run again on the running machine (by hand, or a second startup-script pass).
        again = machine.boot(user_data)
        assert again.returncode == 0, again.stderr.decode(errors="replace")
        assert len(machine.agents()) == 1, machine.agents()

        # A reboot: every process gone, the disks kept; the cloud runs the same user data at boot.
        machine.power_off()
        silent_since = Lease.objects.get(pk=claimed.pk).last_heartbeat_at
        machine.power_on()
        rebooted = machine.boot(user_data)
        assert rebooted.returncode == 0, rebooted.stderr.decode(errors="replace")
        wait_for(
            lambda: Lease.objects.get(pk=claimed.pk).last_heartbeat_at > silent_since,
            "heartbeats again",
            detail=lambda: _agent_log(machine),
        )

        agents = machine.agents()
        log = machine.log()
    finally:
        machine.power_off()

    assert authorized_keys.read_text().splitlines() == keys  # each key once, after three runs
    assert len(agents) == 1, agents
    assert "re-attached" in log and "refused the boot token" not in log, log
    after = Lease.objects.get(pk=claimed.pk)
    assert (after.state, after.key_id, after.claimed_at) == (LeaseState.READY, claimed.key_id, claimed.claimed_at)
    assert Order.objects.get(pk=order.pk).state == OrderState.RUNNING
    key_file = tmp_path / "opt" / "agent.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.stat().st_uid == 0
