"""A load generator for a fleet's demo: it plays the buyer's workload, posting the fleet's metric (say, the
requests waiting in its queue) as a rise and a fall, so the fleet grows and shrinks on its own.

    .venv/bin/python -m sandboxes.loadgen --url http://127.0.0.1:8000 --fleet ID --token fmt_... \\
        --name queue_depth --peak 40 --period 900

It posts ``peak * (1 - |2t/period - 1|)`` every ``--interval`` seconds (a triangle from 0 to ``peak`` and back,
repeated) through the fleet's own metrics endpoint, exactly as a replica's workload would with its
``BROKER_FLEET_METRICS_TOKEN``. Nothing but 127.0.0.1 is a sensible target for it.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import requests


def level(elapsed_s: float, *, peak: float, period_s: float) -> float:
    """The load at ``elapsed_s`` into the run: a triangle wave from 0 up to ``peak`` and back each period."""
    phase = (elapsed_s % period_s) / period_s
    return round(peak * (1 - abs(2 * phase - 1)), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the broker")
    parser.add_argument("--fleet", required=True, help="the fleet's id")
    parser.add_argument("--token", required=True, help="the fleet's metrics token (fmt_...)")
    parser.add_argument("--name", default="queue_depth", help="the metric the fleet's rule follows")
    parser.add_argument("--peak", type=float, default=40.0, help="the highest value posted")
    parser.add_argument("--period", type=float, default=900.0, help="seconds from 0 to the peak and back")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between posts")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: never)")
    args = parser.parse_args(argv)
    if args.period <= 0 or args.interval <= 0:
        parser.error("--period and --interval must be positive")
    endpoint = f"{args.url.rstrip('/')}/api/v1/fleets/{args.fleet}/metrics"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {args.token}"
    started = time.monotonic()
    while args.duration is None or time.monotonic() - started < args.duration:
        value = level(time.monotonic() - started, peak=args.peak, period_s=args.period)
        try:
            answer = session.post(
                endpoint,
                json={"name": args.name, "value": value},
                headers={"Idempotency-Key": str(uuid.uuid4())},
                timeout=10,
            )
            said = "ok" if answer.ok else f"HTTP {answer.status_code}: {answer.text[:200]}"
        except requests.RequestException as exc:
            said = f"no answer: {exc}"
        print(f"{time.strftime('%H:%M:%S')} {args.name}={value:g} {said}", flush=True)
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
