"""The boot script every cloud launch carries as user data, and how a sandbox or a host agent reads it back.

The script is plain bash, so it runs under cloud-init on every image the clouds publish. In order it:

1. runs the cloud's prelude (e.g. the GPU driver installation Alibaba and Tencent leave to the buyer), and
   for a container workload on an image without them, installs Docker and the NVIDIA Container Toolkit;
2. appends the buyer's public keys to the login user's ``authorized_keys`` (also given to the cloud's own key
   mechanism where it takes them, so a console login works too);
3. writes the lease file ``/opt/gpu-broker/lease.json``: where to phone home, the one-time boot token, the
   login user, the keys and the non-secret workload (container or script);
4. checks that the image has the Python the agent needs (``python3`` 3.9 or newer); if not, it tells the broker
   why with the boot token (``/agent/v1/lease/boot-failed``, a reason code and the version seen) and stops, so
   the order shows the reason instead of a boot timeout;
5. fetches the lease agent from the broker, checks it against the SHA-256 this script was made with, and
   starts it: as the systemd unit ``gpu-broker-agent.service`` where systemd runs the machine, else in the
   background under ``flock -n``. The agent spends the token, fetches the buyer's secrets over the signed agent
   protocol, starts the workload and reports ready (``providers/community/lease.py``).

Every step is safe to run again, because some clouds run user data at every boot (GCP's startup scripts) and
an operator may run it by hand: a key line is added only when it is absent, the lease file is written once
(its token is spent by then; the agent re-attaches with the key it kept), a fetched agent whose hash matches
is kept, and the unit or the lock lets only one agent run.

The lease file sits between two fixed heredoc markers, on one line of JSON, so ``lease_file_from_script``
finds it in the bytes a cloud stored; that is how the sandboxes "boot" an instance from its user data.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from providers.launch import BootSpec, LaunchLimits, LaunchProblem, UserDataMeasure, WorkloadKind
from providers.sshkeys import SshKeyInvalid, ssh_key_parse

LEASE_FILE_VERSION = 1
LEASE_MARKER = "BROKER_LEASE_JSON"
KEYS_MARKER = "BROKER_AUTHORIZED_KEYS"
UNIT_MARKER = "BROKER_AGENT_UNIT"
AGENT_PATH = "/agent/v1/lease/agent.pyz"
BOOT_FAILED_PATH = "/agent/v1/lease/boot-failed"
BROKER_DIR = "/opt/gpu-broker"
AGENT_UNIT = "gpu-broker-agent.service"
# The oldest Python the lease agent runs on (lease.py's own promise).
AGENT_PYTHON = (3, 9)
# What the boot script may report through BOOT_FAILED_PATH: a code, never free text from the machine.
BOOT_FAILURE_CODES = frozenset({"no_python", "python_too_old", "python_incomplete"})
# Standard library modules the agent imports that a trimmed Python lacks (Debian's python3-minimal has none of
# them: the full python3 package brings them).
AGENT_MODULES = "json, ssl, urllib.request"
_LOGIN_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_BOOT_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Docker and the NVIDIA Container Toolkit where the image lacks them (Deep Learning images ship both), on
# Debian-family images, following NVIDIA's install guide for the toolkit's apt repository:
# https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html
CONTAINER_RUNTIME = """if command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  command -v docker >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q docker.io; }
  if ! command -v nvidia-ctk >/dev/null 2>&1; then
    keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor -o "$keyring"
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \\
      | sed "s#deb https://#deb [signed-by=$keyring] https://#g" > /etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt-get update -q && apt-get install -y -q nvidia-container-toolkit
  fi
  # Once: at a later boot Docker is already configured, and restarting it would restart the workload.
  [ -e "$BROKER_DIR/runtime-configured" ] || { nvidia-ctk runtime configure --runtime=docker \
    && systemctl restart docker && touch "$BROKER_DIR/runtime-configured"; }
fi"""
# The agent as a service (systemd.service(5)): started at every boot, restarted after a crash; not after it
# exits 0 (the broker ended the lease) or 3 (the lease is over otherwise: lease.py's EXIT_OVER). Ten seconds
# between restarts stays under systemd's default start rate limit (5 starts in 10 s), past which it gives up.
AGENT_UNIT_FILE = f"""[Unit]
Description=gpu-broker lease agent
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/env python3 {BROKER_DIR}/agent.pyz lease --spec {BROKER_DIR}/lease.json
Restart=always
RestartSec=10
RestartPreventExitStatus=0 3

[Install]
WantedBy=multi-user.target"""
_LEASE_BLOCK = re.compile(rf"<<'{LEASE_MARKER}'\n(.*?)\n{LEASE_MARKER}\n", re.DOTALL)
MAX_LEASE_FILE = 1024 * 1024  # what a reader will parse; every cloud's user data limit is far below
MAX_LEASE_KEYS = 200  # an organisation keeps at most this many keys (marketplace/launch/keys.py)


class BootScriptUnreadable(ValueError):
    """The bytes hold no lease file this module wrote."""


def lease_file(boot: BootSpec, *, login_user: str) -> dict[str, Any]:
    """What the lease agent reads on the machine: everything but the buyer's secrets."""
    return {
        "v": LEASE_FILE_VERSION,
        "broker_url": boot.broker_url,
        "boot_token": boot.boot_token,
        "login_user": login_user,
        "ssh_keys": [key.public_key for key in boot.ssh_keys],
        "ports": sorted({rule.port for rule in boot.ingress}),
        "workload": boot.workload,
    }


def render_boot_script(boot: BootSpec, *, login_user: str, prelude: str = "") -> bytes:
    """The user data for one attempt. Deterministic in its inputs: a resumed attempt sends the same bytes,
    which idempotent launch APIs (EC2's ``ClientToken``) require of a repeated request."""
    if not _LOGIN_USER.match(login_user):
        raise ValueError(f"login user {login_user!r} is not a plain user name")
    if "'" in boot.broker_url or not boot.broker_url.startswith(("http://", "https://")):
        raise ValueError("the broker URL must be a plain http(s) URL")
    if not re.fullmatch(r"[0-9a-f]{64}", boot.agent_sha256):
        raise ValueError("agent_sha256 must be a hex SHA-256")
    if not _BOOT_TOKEN.match(boot.boot_token):
        raise ValueError("the boot token must be URL-safe base64")
    lease = json.dumps(lease_file(boot, login_user=login_user), sort_keys=True, separators=(",", ":"))
    keys = "\n".join(key.public_key for key in boot.ssh_keys)
    lines = [
        "#!/bin/bash",
        "# gpu-broker boot script: makes this machine usable for one order, then hands over to the lease agent.",
        "# It carries no lasting secret: the boot token below works once, for this order only, and expires.",
        "# Safe to run again, as GCP does at every boot.",
        "set -u",
        f"BROKER_URL='{boot.broker_url}'",
        f"BROKER_LOGIN_USER='{login_user}'",
        f"BROKER_TOKEN='{boot.boot_token}'",
        f"BROKER_DIR={BROKER_DIR}",
        'mkdir -p "$BROKER_DIR" && chmod 700 "$BROKER_DIR"',
    ]
    if prelude.strip():
        lines += ["# --- the cloud's prelude", prelude.strip(), "# --- end of prelude"]
    if boot.workload_kind is WorkloadKind.CONTAINER:
        lines += ["# --- a container runtime with GPU access, where the image has none", CONTAINER_RUNTIME]
    if keys:
        lines += [
            'home=$(getent passwd "$BROKER_LOGIN_USER" | cut -d: -f6)',
            'if [ -n "$home" ]; then',
            '  install -d -m 700 -o "$BROKER_LOGIN_USER" "$home/.ssh"',
            '  ak="$home/.ssh/authorized_keys"',
            '  touch "$ak" && { [ ! -s "$ak" ] || [ -z "$(tail -c 1 "$ak")" ] || echo >>"$ak"; }',
            # Each key once: not again at a later boot, nor when the cloud's own key mechanism added it.
            "  while IFS= read -r key; do",
            '    grep -qxF -- "$key" "$ak" || printf \'%s\\n\' "$key" >>"$ak"',
            f"  done <<'{KEYS_MARKER}'",
            keys,
            KEYS_MARKER,
            '  chown "$BROKER_LOGIN_USER" "$ak" && chmod 600 "$ak"',
            "fi",
        ]
    # Below, the comments stay here rather than in the script: every byte counts against the smallest user data
    # limits (16 KB on EC2, base64-encoded on Tencent), which the buyer's script shares.
    # - The lease file is written once: at a later boot its token is spent, and the agent re-attaches with the
    #   key it kept beside it.
    # - No python3, one older than the agent's, or one without the standard library the agent imports: the
    #   broker hears the reason code (and the version), rather than waiting for a boot timeout.
    # - A fetched agent whose hash matches is kept; a download lands under another name first.
    # - Without systemd (a container), the agent starts in the background under ``flock -n``: a second run
    #   finds the lock held and starts nothing. ``GPU_BROKER_SIMULATE`` (for a test machine without GPUs) is
    #   read from the environment of whoever runs the script, who is root there and could run that anyway.
    oldest = AGENT_PYTHON[0] * 1000 + AGENT_PYTHON[1]
    lines += [
        'if [ ! -s "$BROKER_DIR/lease.json" ]; then',
        f"(umask 077 && cat >\"$BROKER_DIR/lease.json.new\" <<'{LEASE_MARKER}'",
        lease,
        LEASE_MARKER,
        ') && mv -f "$BROKER_DIR/lease.json.new" "$BROKER_DIR/lease.json"',
        "fi",
        "pyver=$(python3 -V 2>&1 | sed -n 's/^Python \\([0-9]*\\.[0-9]*\\).*/\\1/p')",
        "maj=${pyver%%.*} min=${pyver#*.} reason=",
        "if ! command -v python3 >/dev/null; then reason=no_python",
        f'elif [ -z "$pyver" ] || [ $((10#$maj * 1000 + 10#$min)) -lt {oldest} ]; then',
        "  reason=python_too_old",
        f"elif ! python3 -c 'import {AGENT_MODULES}' 2>/dev/null; then reason=python_incomplete",
        "fi",
        'if [ -n "$reason" ]; then',
        "  for attempt in 1 2 3 4 5 6; do",
        "    code=$(curl -sS -o /dev/null -w '%{http_code}' -m 30 -H 'Content-Type: application/json' -d "
        f'"{{\\"boot_token\\":\\"$BROKER_TOKEN\\",\\"reason\\":\\"$reason\\",\\"version\\":\\"$pyver\\"}}" '
        f'"$BROKER_URL{BOOT_FAILED_PATH}")',
        '    case "$code" in [24]*) break ;; esac',
        "    sleep 10",
        "  done",
        "  exit 1",
        "fi",
        f'agent_ok() {{ echo "{boot.agent_sha256}  $BROKER_DIR/agent.pyz" | sha256sum -c --status -; }}',
        "agent_ok 2>/dev/null || for attempt in 1 2 3 4 5 6 7 8 9 10; do",
        f'  curl -fsS -m 60 "$BROKER_URL{AGENT_PATH}" -o "$BROKER_DIR/a.new" && mv -f "$BROKER_DIR/a.new" '
        '"$BROKER_DIR/agent.pyz" && agent_ok && break',
        "  sleep 10",
        "done",
        "agent_ok || exit 1",
        "if [ -d /run/systemd/system ]; then",
        f"  cat >/etc/systemd/system/{AGENT_UNIT} <<'{UNIT_MARKER}'",
        AGENT_UNIT_FILE,
        UNIT_MARKER,
        f"  systemctl daemon-reload && systemctl enable --now --no-block {AGENT_UNIT}",
        "else",
        '  set -- python3 "$BROKER_DIR/agent.pyz" lease --spec "$BROKER_DIR/lease.json"',
        '  [ -z "${GPU_BROKER_SIMULATE:-}" ] || set -- "$@" --simulate "$GPU_BROKER_SIMULATE"',
        '  nohup flock -n "$BROKER_DIR/boot.lock" "$@" </dev/null >>/var/log/gpu-broker-agent.log 2>&1 &',
        "fi",
        "",
    ]
    return "\n".join(lines).encode()


def user_data_size(script: bytes, measure: UserDataMeasure) -> int:
    """The script's size as the cloud counts it against its limit."""
    return len(script) if measure is UserDataMeasure.RAW else len(base64.b64encode(script))


def user_data_problems(script: bytes, limits: LaunchLimits, *, field: str = "launch.workload") -> list[LaunchProblem]:
    """The script measured against the cloud's user data limit, as a field error naming both figures."""
    size = user_data_size(script, limits.user_data_measure)
    if size <= limits.user_data_max_bytes:
        return []
    counted = "bytes" if limits.user_data_measure is UserDataMeasure.RAW else "bytes once base64-encoded"
    return [
        LaunchProblem(
            field,
            f"the boot script with this workload is {size} {counted}; {limits.user_data_field} takes at most "
            f"{limits.user_data_max_bytes} ({limits.source}). Shorten the script, or move it into the container "
            "image",
        )
    ]


def lease_file_from_script(data: bytes) -> dict[str, Any]:
    """The lease file inside a boot script, given raw or base64-encoded (as clouds store user data)."""
    text = _text(data)
    match = _LEASE_BLOCK.search(text)
    if match is None:
        raise BootScriptUnreadable("no broker lease file in this user data")
    try:
        lease = json.loads(match.group(1))
    except ValueError as exc:
        raise BootScriptUnreadable(f"the lease file is not JSON: {exc}") from None
    if not isinstance(lease, dict) or lease.get("v") != LEASE_FILE_VERSION:
        raise BootScriptUnreadable("the lease file is not version 1")
    for key in ("broker_url", "boot_token", "login_user"):
        if not isinstance(lease.get(key), str):
            raise BootScriptUnreadable(f"the lease file lacks {key}")
    keys = lease.get("ssh_keys", [])
    if not isinstance(keys, list) or len(keys) > MAX_LEASE_KEYS:
        raise BootScriptUnreadable(f"the lease file's ssh_keys is not a list of at most {MAX_LEASE_KEYS} keys")
    for i, key in enumerate(keys):
        # A host agent writes these into a login's authorized_keys: one line each, nothing but a key.
        try:
            ssh_key_parse(key if isinstance(key, str) else "")
        except SshKeyInvalid as exc:
            raise BootScriptUnreadable(f"ssh_keys[{i}]: {exc}") from None
    return lease


def _text(data: bytes) -> str:
    if len(data) > MAX_LEASE_FILE * 2:
        raise BootScriptUnreadable("the user data is larger than any cloud accepts")
    if data.startswith(b"#!"):
        return data.decode("utf-8", "replace")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BootScriptUnreadable("the user data is neither a script nor base64") from None
    if not decoded.startswith(b"#!"):
        raise BootScriptUnreadable("the user data is not a boot script")
    return decoded.decode("utf-8", "replace")
