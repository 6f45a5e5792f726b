"""How long ``kvbench --version``, ``kvbench --help`` and a few commands' help take to start: wall and CPU time.

    python benchmarks/bench_cli_startup.py [--rounds 15]

Goal: ``--version`` and ``--help`` under 0.3 s on a quiet machine. Each case runs as the installed entry point
does (``from kvbench.cli import main``), in a fresh interpreter, with the cases interleaved in every round and
their order alternating, so load that drifts over the run hits all of them alike; reported are medians (and
min) of wall and CPU (user + system of the child) seconds. CPU time is what a quiet machine's wall time comes
close to: on a shared, loaded machine wall time also counts the waits for a core.

Beside kvbench's cases it times two floors: the interpreter alone (``python -c pass``) and the same root help
drawn with every command module imported first, as the CLI did before commands were loaded lazily.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ENTRY = "import sys; from kvbench.cli import main; sys.exit(main(sys.argv[1:]))"
EAGER = (
    "import sys, importlib; from kvbench import cli; "
    "[importlib.import_module(entry.module) for entry in cli.COMMANDS.values()]; sys.exit(cli.main(sys.argv[1:]))"
)

CASES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "kvbench --version": ["-c", ENTRY, "--version"],
    "kvbench --help": ["-c", ENTRY, "--help"],
    "kvbench capacity --help": ["-c", ENTRY, "capacity", "--help"],
    "kvbench diagnose --help": ["-c", ENTRY, "diagnose", "--help"],
    "kvbench sweep --help": ["-c", ENTRY, "sweep", "--help"],
    "--help, every command imported (before)": ["-c", EAGER, "--help"],
}


def timed(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``python ARGS`` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", nargs="*", help="Case names to run (default: all).")
    args = parser.parse_args()
    cases = {name: argv for name, argv in CASES.items() if not args.only or name in args.only}
    for argv in cases.values():  # warm the file cache and the bytecode of every case once
        timed(argv)
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    load_before = os.getloadavg()
    for index in range(args.rounds):
        for name in order if index % 2 == 0 else order[::-1]:
            wall, cpu = timed(cases[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    load_after = os.getloadavg()
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after; {args.rounds} rounds"
    )
    print(f"{'case':<42} {'wall median':>12} {'wall min':>9} {'CPU median':>11} {'CPU min':>8}")
    for name in cases:
        print(
            f"{name:<42} {statistics.median(walls[name]):>10.3f} s {min(walls[name]):>7.3f} s "
            f"{statistics.median(cpus[name]):>9.3f} s {min(cpus[name]):>6.3f} s"
        )


if __name__ == "__main__":
    main()
