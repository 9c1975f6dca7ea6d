"""``python -m sandboxes serve [--host H] [--port P] [--only aws,...] [--boot thread|hold|off] [--boot-delay S]``

Starts every registered sandbox in one process: the first on ``--port``, the next ones on the following
ports, and prints one ``<kind> sandbox listening on <url>`` line each. Ctrl-C (or SIGTERM) stops them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from sandboxes.boot import BootMode, sandbox_runtime
from sandboxes.demo import write_manifest
from sandboxes.server import SandboxApp, serve_forever

# kind -> "module:class"; imported lazily so a sandbox's emulator loads only when it is served.
SANDBOXES: dict[str, str] = {
    "aws": "sandboxes.aws.app:AwsSandbox",
    "azure": "sandboxes.azure.app:AzureSandbox",
    "tencent": "sandboxes.tencent.app:TencentSandbox",
    "alibaba": "sandboxes.alibaba.app:AlibabaSandbox",
    "gcp": "sandboxes.gcp.app:GcpSandbox",
    "kubernetes": "sandboxes.kubernetes.app:KubernetesSandbox",
    "stripe": "sandboxes.stripe.app:StripeSandbox",
}


def build(kind: str) -> SandboxApp:
    module_name, _, class_name = SANDBOXES[kind].partition(":")
    app = getattr(importlib.import_module(module_name), class_name)()
    assert isinstance(app, SandboxApp)
    return app


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the sandboxes until interrupted")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8701, help="port of the first sandbox; the others follow")
    serve.add_argument("--only", default=",".join(SANDBOXES), help=f"comma-separated kinds ({', '.join(SANDBOXES)})")
    serve.add_argument("--verbose", action="store_true", help="log every request")
    serve.add_argument("--manifest", help="write how to reach each sandbox (endpoint, credentials) to this JSON file")
    serve.add_argument("--containers", action="store_true", help="boot machines as real walled containers")
    serve.add_argument(
        "--boot",
        choices=[m.value for m in BootMode],
        default=BootMode.THREAD.value,
        help="what a launched machine does: its agent phones home (thread), it waits to be told (hold), or nothing",
    )
    serve.add_argument(
        "--boot-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long a launched machine takes before its agent starts (default 0: at once)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.boot_delay <= 3600:
        parser.error("--boot-delay: from 0 to 3600 seconds")

    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SANDBOXES]
    if unknown:
        parser.error(f"unknown sandbox kind(s): {', '.join(unknown)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    # Explicit for SIGINT too: a process started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    def on_started(apps: list[SandboxApp]) -> None:
        if args.manifest:
            # Written only once every sandbox listens: a reader that sees the file can connect at once.
            write_manifest(Path(args.manifest), {app.kind: app for app in apps})

    ports = [args.port + offset if args.port else 0 for offset in range(len(kinds))]  # 0: any free port each
    apps = [build(kind) for kind in kinds]
    runtime = sandbox_runtime("sandbox-clouds") if args.containers else None
    for index, app in enumerate(apps):
        app.booter.containers = runtime
        app.booter.uid_first += 10_000 * index  # each cloud's machines a range of lease uids of their own
        app.booter.start_delay_s = args.boot_delay
    served = [(app, args.host, port) for app, port in zip(apps, ports, strict=True)]
    serve_forever(served, on_started, boot=BootMode(args.boot))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The servers are stopped and all state is in memory: skip the ~2 s interpreter teardown of moto's objects.
    os._exit(code)
