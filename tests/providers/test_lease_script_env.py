"""A script workload's environment is data, never shell (issue 33, point 6): the lease agent's ``HostExecutor``
starts ``bash workload.sh`` as the login user for real on this machine, and the script sees every byte of every
value as the buyer gave it; nothing in a value runs.

The values reach the process through ``execve``'s environment (``subprocess.Popen(env=...)``), which holds any
byte string but NUL: https://man7.org/linux/man-pages/man2/execve.2.html."""

from __future__ import annotations

import os
import pwd
import uuid
from pathlib import Path

import pytest

from providers.community.executor_base import ExecutorError
from providers.community.lease_executors import HostExecutor

USER = "nobody"  # an unprivileged account every Debian-family system has


def _executor(tmp_path: Path) -> HostExecutor:
    if os.geteuid() != 0:
        pytest.skip("starting a script as another user needs root, as the agent has on a cloud machine")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"this machine has no {USER} account")
    work_dir = tmp_path / "machine"
    work_dir.mkdir(mode=0o700)
    return HostExecutor(work_dir=work_dir)


def _environment(executor: HostExecutor) -> dict[bytes, bytes]:
    """What the script printed with ``env -0``: its whole environment, byte for byte."""
    assert executor._script is not None
    assert executor._script.wait(timeout=30) == 0, (executor.work_dir / "workload.log").read_bytes()
    dumped = (executor.work_dir / "workload.log").read_bytes()
    return dict(entry.split(b"=", 1) for entry in dumped.split(b"\0") if entry)


def test_every_byte_of_every_value_reaches_the_script_and_nothing_in_them_runs(tmp_path):
    executor = _executor(tmp_path)
    marker = Path(f"/tmp/gpu-broker-env-{uuid.uuid4().hex}")  # noqa: S108 - where nobody could write, if it ran
    values = {
        "SINGLE": "it's",
        "DOUBLE": 'say "hi"',
        "SUBSTITUTION": f"$(touch {marker})",
        "BACKTICKS": f"`touch {marker}-backticks`",
        "SPACES": "hello world  and  more ",
        "HOME_REF": "$HOME and ${PATH}",
        "UNICODE": "naïve \u2013 東京 🚀",
        "EQUALS": "a=b=c",
        "EMPTY": "",
        "BACKSLASH": "C:\\path\\n",
    }
    plain = [{"name": name, "value": value} for name, value in values.items() if name != "SINGLE"]
    workload = {"kind": "script", "script": "#!/bin/bash\nexec env -0\n", "env": plain}

    detail = executor.start(workload, {"env": {"SINGLE": values["SINGLE"]}}, USER)
    seen = _environment(executor)

    assert detail.startswith("script started")
    for name, value in values.items():
        assert seen[name.encode()] == value.encode(), name
    assert not marker.exists() and not Path(f"{marker}-backticks").exists()
    # Its own account, not the agent's: the login user's home and name, and no group of root's.
    account = pwd.getpwnam(USER)
    assert seen[b"USER"] == USER.encode() and seen[b"HOME"] == account.pw_dir.encode()


def test_the_script_runs_as_the_login_user_without_roots_groups(tmp_path):
    executor = _executor(tmp_path)
    workload = {"kind": "script", "script": '#!/bin/bash\nprintf "%s\\0" "$(id -u)" "$(id -G)"\n', "env": []}

    executor.start(workload, {}, USER)
    assert executor._script is not None and executor._script.wait(timeout=30) == 0
    uid, groups = (executor.work_dir / "workload.log").read_bytes().split(b"\0")[:2]

    account = pwd.getpwnam(USER)
    assert int(uid) == account.pw_uid
    assert groups.split() == [str(account.pw_gid).encode()]


def test_a_login_user_the_image_lacks_is_named_in_the_failure(tmp_path):
    executor = _executor(tmp_path)

    with pytest.raises(ExecutorError, match="'no-such-user' does not exist"):
        executor.start({"kind": "script", "script": "true\n", "env": []}, {}, "no-such-user")
