"""A lease's login and image on a shared host (issue 19, item 1): the buyer's keys reach the lease's own account
and nobody else's, restricted so the login cannot tunnel to other leases; a container image is pulled with the
lease's own registry login, every time, so one lease's private image never starts for another.

Sources: sshd(8), "AUTHORIZED_KEYS FILE FORMAT" (https://man.openbsd.org/sshd.8#AUTHORIZED_KEYS_FILE_FORMAT:
``restrict`` disables port, agent and X11 forwarding and pty allocation; ``pty`` permits the tty again);
sshd_config(5) ``StrictModes`` (the home and ``~/.ssh`` not writable by others); the Docker CLI reference
(https://docs.docker.com/reference/cli/docker/: ``docker [OPTIONS] COMMAND``, ``--config`` "Location of client
config files"; ``docker login --password-stdin``; ``docker run --user <uid>[:<gid>]`` and ``--mount
type=bind,source=,target=,readonly``); Kubernetes' AlwaysPullImages admission controller
(https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#alwayspullimages: in a
multi-tenant cluster, private images can only be used by those who have the credentials to pull them).

Docker is not installed here, so the container tests run the executor's real code against a stand-in ``docker``
program that keeps a registry's one rule: a private image is pulled only with a login that the registry
accepted, in the configuration directory the call names.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.test import Client

from providers.boot import render_boot_script
from providers.community import protocol
from providers.community.agent import Agent
from providers.community.devices import FakeDevices
from providers.community.executor import LeaseExecutor
from providers.community.executor_base import ExecutorError
from providers.community.host_gpus import parse_simulated
from providers.community.lease_plan import LeasePlan, UserPlan
from providers.launch import BootSpec, IngressRule
from providers.sshkeys import SshPublicKey
from tests.sshkeys import ed25519_public, parsed

KEY_ID, SECRET = "mk_h100host", "s3cret-of-the-machine"
H100 = ("H100", 80)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="agent-data-") as made:
        yield Path(made)


@pytest.fixture
def host(data_dir) -> Iterator[Agent]:
    agent = Agent(broker_url="http://127.0.0.1:9", key_id=KEY_ID, secret=SECRET, simulated=parse_simulated("H100:80x8"),
                  launch_seconds=0, lease_threads=False, data_dir=data_dir, grace_s=30, disk_poll_s=None)  # fmt: skip
    agent.public_url = "http://127.0.0.1:7070"
    yield agent
    for instance in list(agent.instances.values()):
        agent._end_lease(instance)


def _boot(keys: tuple[SshPublicKey, ...]) -> str:
    spec = BootSpec(broker_url="http://127.0.0.1:9", boot_token="bt", agent_sha256="0" * 64, ssh_keys=keys,
                    ingress=(IngressRule(8000, ("10.0.0.0/8",)),), workload={"kind": "none"})  # fmt: skip
    return render_boot_script(spec, login_user="lease").decode()


def _launch(agent: Agent, token: str, boot: str) -> tuple[int, dict]:
    body = json.dumps({"client_token": token, "order_ref": "ord-1", "gpus": 1, "boot": boot}).encode()
    headers = protocol.sign(KEY_ID, SECRET, "POST", "/v1/instances", body)
    answer = Client(agent).open("/v1/instances", method="POST", data=body, headers=headers)
    return answer.status_code, answer.get_json()


# --- The buyer's keys -----------------------------------------------------------------------------------------


def test_the_buyers_keys_reach_only_their_own_lease_restricted_and_go_with_it(host):
    alice, bob = parsed(ed25519_public()), parsed(ed25519_public())
    _, first = _launch(host, "ord-1-a1", _boot(alice))
    _, second = _launch(host, "ord-2-a1", _boot(bob))
    leases = [host.instances[first["id"]].executor, host.instances[second["id"]].executor]
    for executor in leases:
        assert executor is not None
        executor.start({"kind": "none"}, {}, "lease")

    files = [executor.plan.work_dir / ".ssh" / "authorized_keys" for executor in leases]
    assert files[0].read_text() == f"restrict,pty {alice[0].public_key}\n"
    assert files[1].read_text() == f"restrict,pty {bob[0].public_key}\n"
    # StrictModes: nothing in the login's path is open to other accounts.
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(leases[0].plan.work_dir.stat().st_mode) == 0o700

    leases[0].stop()

    assert not files[0].exists() and files[1].exists()


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ("ssh-ed25519 AAAA", "too short"),
        # A second line would be a second authorized_keys entry, with options of the sender's choosing.
        (f'{parsed(ed25519_public())[0].public_key}\ncommand="sh" ssh-ed25519 AAAA', "several lines"),
    ],
)
def test_a_lease_file_whose_key_is_not_one_key_is_refused_naming_it(host, key, named):
    forged = SshPublicKey(key_type="ssh-ed25519", public_key=key, fingerprint="SHA256:x", bits=256)

    status, answer = _launch(host, "ord-1-a1", _boot((forged,)))

    assert status == 400 and "ssh_keys[0]" in answer["message"] and named in answer["message"]
    assert host.instances == {}


# --- The image: the lease's own registry login, pulled every time -----------------------------------------------

_STAND_IN_DOCKER = r"""
import json, os, sys
argv = sys.argv[1:]
config = argv[argv.index("--config") + 1] if "--config" in argv else os.path.expanduser("~/.docker")
command = [a for a in argv if a != "--config" and a != config]
stdin = sys.stdin.read() if "--password-stdin" in command else ""
with open(os.environ["STAND_IN_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
verb = command[0]
if verb == "login":
    if stdin != "the-right-token":
        sys.stderr.write("Error response from daemon: unauthorized: incorrect username or password\n")
        sys.exit(1)
    open(os.path.join(config, "config.json"), "w").write('{"auths": {"registry.example": {}}}')
elif verb == "pull":
    image = command[1]
    if image.startswith("registry.example/") and not os.path.exists(os.path.join(config, "config.json")):
        sys.stderr.write(f"Error response from daemon: pull access denied for {image}\n")
        sys.exit(1)
elif verb == "run":
    print("0123456789abcdef0123")
"""

PRIVATE = {"kind": "container", "image": "registry.example/acme/model:1",
           "registry": {"server": "registry.example", "username": "acme"}}  # fmt: skip


@pytest.fixture
def docker(tmp_path, monkeypatch) -> Path:
    program = tmp_path / "docker"
    program.write_text(f"#!{sys.executable}\n{_STAND_IN_DOCKER}")
    program.chmod(0o755)
    monkeypatch.setenv("STAND_IN_DOCKER_LOG", str(tmp_path / "calls.jsonl"))
    return program


def _calls(docker: Path) -> list[dict]:
    log = docker.parent / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _lease(data_dir: Path, docker: Path, name: str) -> LeaseExecutor:
    # An existing unprivileged account stands for the one a root agent would create (no useradd here).
    account = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    work = data_dir / "leases" / name
    plan = LeasePlan(lease_id=name, gpu_indexes=(0,), host_ports=(40000, 40001), work_dir=work,
                     disk_quota_bytes=10**9, user=UserPlan(account, ("true",), ("true",)),
                     authorized_keys=(parsed(ed25519_public())[0].public_key,))  # fmt: skip
    return LeaseExecutor(plan, FakeDevices([H100] * 2), simulate=False, docker=str(docker), disk_poll_s=None)


def test_a_private_image_is_pulled_with_the_leases_own_login_and_its_password_never_in_argv(data_dir, docker):
    executor = _lease(data_dir, docker, "i-first")

    detail = executor.start(PRIVATE, {"registry_password": "the-right-token"}, "lease")

    login, pull, run = _calls(docker)
    config = str(executor.plan.work_dir / ".docker")
    assert login["argv"] == ["--config", config, "login", "registry.example", "-u", "acme", "--password-stdin"]
    assert login["stdin"] == "the-right-token" and all("the-right-token" not in a for a in login["argv"])
    assert pull["argv"] == ["--config", config, "pull", "registry.example/acme/model:1"]
    assert run["argv"][:3] == ["--config", config, "run"]
    uid = pwd.getpwnam(executor.plan.user.name).pw_uid
    assert run["argv"][run["argv"].index("--user") + 1] == f"{uid}:{pwd.getpwuid(uid).pw_gid}"
    keys = executor.plan.work_dir / ".ssh" / "authorized_keys"
    assert f"type=bind,source={keys},target=/etc/gpu-broker/authorized_keys,readonly" in run["argv"]
    assert detail == "container 0123456789ab running registry.example/acme/model:1"
    assert not (executor.plan.work_dir / "workload.env").exists()  # the secrets' file is gone once started

    executor.stop()

    assert not Path(config).exists() and executor.cleanup["container_removed"] == "gpu-broker-i-first"


def test_another_lease_cannot_start_a_private_image_the_host_already_pulled(data_dir, docker):
    _lease(data_dir, docker, "i-first").start(PRIVATE, {"registry_password": "the-right-token"}, "lease")
    stranger = _lease(data_dir, docker, "i-second")

    with pytest.raises(ExecutorError, match=r"could not pull registry\.example/acme/model:1: .*pull access denied"):
        stranger.start({"kind": "container", "image": PRIVATE["image"]}, {}, "lease")

    assert [c["argv"][2] for c in _calls(docker)] == ["login", "pull", "run", "pull"]  # no second run


def test_a_refused_registry_login_fails_the_lease_naming_the_registry(data_dir, docker):
    executor = _lease(data_dir, docker, "i-first")

    with pytest.raises(ExecutorError, match=r"registry login to registry\.example failed: .*incorrect username"):
        executor.start(PRIVATE, {"registry_password": "a-wrong-token"}, "lease")

    assert [c["argv"][2] for c in _calls(docker)] == ["login"]
