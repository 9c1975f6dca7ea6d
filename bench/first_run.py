"""Benchmark: a fresh clone's ``bin/run``, from nothing to its banner, twice, and the memory it holds once up.

    python3 bench/first_run.py [--ref HEAD] [--baseline-ref main] [--no-old-run | --no-baseline] [--settle 20]

Clones ``--ref`` of this repository into a temporary directory and, with an empty package cache (uv's and pip's
pointed at empty directories), times ``bin/run`` from its start to its banner; samples the resident memory of
its whole process tree (every descendant's VmRSS and, for comparison, PSS, which counts pages shared between
processes once) every second for ``--settle`` seconds after the banner; stops it with SIGINT as Ctrl-C would;
then times a second ``bin/run`` of the same clone, as a developer's next start.

Absolute times drift on a shared two-core machine, so the old way is measured in the same run as the baseline:
the old install (pip, the full set with the test tools, no cache) against the new one (``bin/bootstrap run``,
empty cache), each in a clone of its own, and, unless ``--no-old-run``, the old ``bin/run`` of
``--baseline-ref`` end to end, first and second run and memory, in a third clone. The load average is printed
at the start and the end: other work on the machine makes every figure pessimistic.

Lease containers (Docker) are off (``BROKER_LEASE_CONTAINERS=0``) unless ``--containers``: starting dockerd
and building the lease image are the machine's, not the clone's, and would be left running.

Goals (issue 39): the first run's banner under 60 s, the second under 20 s, the run's processes under 1.5 GB
resident together (summed RSS, 1 GB = 10^9 bytes).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_GOAL_S = 60.0
SECOND_GOAL_S = 20.0
MEMORY_GOAL_BYTES = 1.5e9
BANNER_END = "Press Ctrl-C to stop everything."
STARTED_IN = re.compile(r"started in ([0-9.]+) s")


@dataclass
class RunResult:
    """One ``bin/run`` to its banner: seconds to the banner, as the bench saw it and as the banner says."""

    seconds: float
    banner_says: float | None
    rss_bytes: list[int] = field(default_factory=list)
    pss_bytes: list[int] = field(default_factory=list)
    processes: int = 0
    steps: list[str] = field(default_factory=list)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1: the sandbox serves each cloud on the port after
    the one before. Below Linux's ephemeral range (32768 up), which other processes' connections draw from
    while a run installs for minutes."""
    for _ in range(200):
        base = random.randrange(12000, 32000 - count)
        probes = [socket.socket() for _ in range(count)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise SystemExit(f"no {count} consecutive free ports found on 127.0.0.1")


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, read from /proc (no psutil in the broker's dependencies)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # it exited while we looked
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    tree, index = [root], 0
    while index < len(tree):
        tree += children.get(tree[index], [])
        index += 1
    return tree


def _kib(path: str, key: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # it exited while we looked
    return 0


def tree_memory(root: int) -> tuple[int, int, int]:
    """(summed RSS, summed PSS, processes) of ``root``'s tree, in bytes."""
    pids = descendants(root)
    rss = sum(_kib(f"/proc/{pid}/status", "VmRSS") for pid in pids)
    pss = sum(_kib(f"/proc/{pid}/smaps_rollup", "Pss") for pid in pids)
    return rss, pss, len(pids)


def run_to_banner(
    clone: Path, env: dict[str, str], log: Path, *, settle: float, timeout: float, extra: list[str]
) -> RunResult:
    """Start ``bin/run`` in ``clone``, wait for its banner, sample its memory for ``settle`` s, stop it."""
    base = free_ports(12)  # the web app, the chain node, then the sandbox's clouds and services
    ports = ["--port", str(base), "--chain-port", str(base + 1), "--sandbox-port", str(base + 2), *extra]
    log_from = log.stat().st_size if log.exists() else 0
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["bin/run", *ports], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=out, start_new_session=True
        )
    assert proc.stdout is not None
    text = ""
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            with log.open("a") as out:
                out.write(line)
            text += line
            if BANNER_END in line:
                break
            if time.monotonic() - started > timeout:
                raise SystemExit(f"no banner within {timeout:.0f} s: see {log}")
        else:
            raise SystemExit(f"bin/run exited with code {proc.wait()} before its banner: see {log}")
        found = STARTED_IN.search(text)
        result = RunResult(time.monotonic() - started, float(found.group(1)) if found else None)
        with log.open(errors="replace") as written:
            written.seek(log_from)
            result.steps = [line.strip() for line in written if line.startswith("[start-up]")]
        until = time.monotonic() + settle
        while True:
            rss, pss, count = tree_memory(proc.pid)
            result.rss_bytes.append(rss)
            result.pss_bytes.append(pss)
            result.processes = max(result.processes, count)
            if time.monotonic() >= until:
                break
            time.sleep(1.0)
        return result
    finally:
        # bin/run has exec'd into broker.devrun: SIGINT is Ctrl-C, and it stops its parts in order.
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        proc.stdout.close()


def clone(ref: str, into: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(into)], check=True)
    subprocess.run(["git", "checkout", "--quiet", ref], cwd=into, check=True)
    return into


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def old_install(into: Path, env: dict[str, str]) -> float:
    """The install the old bin/bootstrap did, by pip, without a cache: pip upgraded, then the full set (runtime
    and the dev extra) and the client, in three pip calls."""
    pip = [str(into / ".venv" / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", ".venv"], cwd=into, env=env, check=True)
    for args in (["--upgrade", "pip"], ["-e", ".[dev]"], ["-e", "./client"]):
        subprocess.run([*pip, *args], cwd=into, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def gb(value: float) -> str:
    return f"{value / 1e9:.2f} GB"


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def resolve(ref: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="HEAD", help="what to clone and run (committed work only)")
    parser.add_argument("--baseline-ref", default="main", help="the old way, for the baseline run")
    parser.add_argument("--no-old-run", action="store_true", help="measure the old install only, not its bin/run")
    parser.add_argument("--no-baseline", action="store_true", help="measure the new way only (no ratios)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of memory samples after the banner")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on a banner after this long")
    parser.add_argument("--containers", action="store_true", help="let bin/run start Docker lease containers")
    parser.add_argument("--keep", action="store_true", help="keep the clones and logs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="broker-first-run-"))
    # A clean shell's environment: no virtualenv or path of the caller's, and bytecode written as a user's is.
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "BROKER_RUN_STARTED")
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env["BROKER_LEASE_CONTAINERS"] = "1" if args.containers else "0"
    new_ref, old_ref = resolve(args.ref), resolve(args.baseline_ref)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores; other work makes every figure slower)")
    print(f"new: {new_ref} ({args.ref}); old: {old_ref} ({args.baseline_ref}); work in {work}", flush=True)
    try:
        # The install alone, new way against old, each in a clone of its own with an empty cache.
        install_env = {**env, "UV_CACHE_DIR": str(work / "cache-install-uv"), "PIP_NO_CACHE_DIR": "1"}
        new_install_s = timed(["bin/bootstrap", "run"], clone(args.ref, work / "install-new"), install_env)
        print(f"install, new (uv, runtime only, empty cache): {new_install_s:.1f} s", flush=True)
        old_install_s = None
        if not args.no_baseline:
            old_install_s = old_install(clone(args.baseline_ref, work / "install-old"), install_env)
            print(f"install, old (pip, runtime + dev, no cache): {old_install_s:.1f} s", flush=True)

        runs: dict[str, tuple[RunResult, RunResult]] = {}
        plans = [("new", args.ref)] + ([] if args.no_old_run or args.no_baseline else [("old", args.baseline_ref)])
        for name, ref in plans:
            checkout = clone(ref, work / f"run-{name}")
            run_env = {**env, "UV_CACHE_DIR": str(work / f"cache-{name}-uv"), "PIP_NO_CACHE_DIR": "1"}
            log = work / f"run-{name}.log"
            # Only the new devrun knows --timings (each step's seconds, on stderr).
            extra = ["--timings"] if name == "new" else []
            try:
                first = run_to_banner(checkout, run_env, log, settle=args.settle, timeout=args.timeout, extra=extra)
                print(f"{name}: first run {first.seconds:.1f} s to the banner, peak {gb(max(first.rss_bytes))} RSS "
                      f"in {first.processes} processes; {'; '.join(first.steps)}", flush=True)  # fmt: skip
                second = run_to_banner(checkout, run_env, log, settle=args.settle, timeout=args.timeout, extra=extra)
                print(f"{name}: second run {second.seconds:.1f} s to the banner, peak {gb(max(second.rss_bytes))} RSS; "
                      f"{'; '.join(second.steps)}", flush=True)  # fmt: skip
            except SystemExit as failed:
                if name == "new":
                    raise
                print(f"{name}: no figures, the run failed: {failed}", flush=True)  # the baseline is a nicety
                continue
            runs[name] = (first, second)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    if old_install_s is not None:
        print(
            f"install: new {new_install_s:.1f} s, old {old_install_s:.1f} s, ratio {old_install_s / new_install_s:.1f}x"
        )
    first, second = runs["new"]
    peak_rss, peak_pss = max(first.rss_bytes + second.rss_bytes), max(first.pss_bytes + second.pss_bytes)
    if "old" in runs:
        old_first, old_second = runs["old"]
        old_rss = max(old_first.rss_bytes + old_second.rss_bytes)
        old_pss = max(old_first.pss_bytes + old_second.pss_bytes)
        print(f"first run:  new {first.seconds:.1f} s, old {old_first.seconds:.1f} s, "
              f"ratio {old_first.seconds / first.seconds:.1f}x")  # fmt: skip
        print(f"second run: new {second.seconds:.1f} s, old {old_second.seconds:.1f} s, "
              f"ratio {old_second.seconds / second.seconds:.1f}x")  # fmt: skip
        print(f"memory (peak summed RSS): new {gb(peak_rss)} in {first.processes} processes, "
              f"old {gb(old_rss)} in {old_first.processes}, ratio {old_rss / peak_rss:.1f}x; "
              f"PSS new {gb(peak_pss)}, old {gb(old_pss)}")  # fmt: skip
    said = ", ".join(f"{r.banner_says:.1f} s" for r in (first, second) if r.banner_says is not None)
    print(f"the banners said: {said or 'nothing'}")
    print(
        f"memory samples (summed RSS) after the banners: {', '.join(gb(b) for b in first.rss_bytes + second.rss_bytes)}"
    )
    goals = [
        (f"first run to the banner < {FIRST_GOAL_S:.0f} s", f"{first.seconds:.1f} s", first.seconds < FIRST_GOAL_S),
        (f"second run to the banner < {SECOND_GOAL_S:.0f} s", f"{second.seconds:.1f} s",
         second.seconds < SECOND_GOAL_S),
        (f"run's processes < {gb(MEMORY_GOAL_BYTES)} (peak summed RSS)", f"{gb(peak_rss)} (PSS {gb(peak_pss)})",
         peak_rss < MEMORY_GOAL_BYTES),
    ]  # fmt: skip
    print()
    for goal, figure, met in goals:
        print(f"goal: {goal:<48} {figure:<24} {verdict(met)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
