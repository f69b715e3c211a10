"""Issue 46's tail-latency target, batch by batch against running batches, side by side.

    python bench/open_loop.py --model checkpoints/en-de [--repeat 3] [--seconds 20]

For each worker mode (NMT_RUNNING_BATCH=false: a batch decoded as a whole; true: sentences join
the running batch at a step boundary and leave when done, model/running.py), bench/service.py
measures, in turn and alternating the modes, so that a slow spell of a noisy machine hits both:

- the capacity: sentences/s of 64 closed-loop clients;
- the unloaded tail: p99 of one client sending back to back for 30 s (each request alone on the
  server; several hundred samples, where Poisson arrivals at a few a second give ~90, whose
  p99 is their maximum and moved between 56 and 155 ms from run to run);
- the tail at half the capacity: p99 under open-loop arrivals at half the batch-by-batch
  capacity (the same rate for both modes).

A second table splits each request's time as the server's /metrics see it: the mean wait from
arrival to the start of its batch, and the mean decoding from there (a running batch's sentence
starts at once; a batch's decoding slows as the batch grows, on a compute-bound CPU).

The target: p99 at half the capacity within 2.5x the unloaded p99. Each cell is the median of the
--repeat runs, with every run's value after it. The server runs with its defaults otherwise
(`--extra` passes more bench/service.py options, e.g. "--workers 1").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {"batch by batch": "false", "running batches": "true"}


def service(args, mode: str, load: list[str], seconds: float) -> dict:
    """One bench/service.py run: its first row (the service), with the server's mean queue wait
    and compute per request."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [sys.executable, str(HERE / "service.py"), "--model", args.model, "--client", "raw", "--no-offline",
                   "--seconds", str(seconds), "--running-batch", MODES[mode], "--json", str(out), *load,
                   *args.extra.split()]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        run = json.loads(out.read_text())
        return {**run["rows"][0], "queue_wait_ms": run["queue_wait_ms"], "compute_ms": run["compute_ms"],
                "sentences": run["sentences"]}


def cell(values: list[float], digits: int = 0) -> str:
    every = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{statistics.median(values):.{digits}f} ({every})" if len(values) > 1 else f"{values[0]:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="checkpoints/en-de")
    p.add_argument("--repeat", type=int, default=3, help="runs of each mode and load")
    p.add_argument("--seconds", type=float, default=20, help="length of each loaded run")
    p.add_argument("--extra", default="", help="more bench/service.py options, for every run")
    p.add_argument("--running", choices=["both", "no"], default="both",
                   help="no: batch by batch only (e.g. to compare --extra settings, each run of this at half its own "
                   "capacity)")
    args = p.parse_args()

    modes = MODES if args.running == "both" else {"batch by batch": MODES["batch by batch"]}
    found: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}

    def note(mode: str, name: str, value: float) -> None:
        found[mode].setdefault(name, []).append(value)

    for _ in range(args.repeat):
        for mode in modes:
            run = service(args, mode, ["--clients", "64"], args.seconds)
            note(mode, "capacity", run["sentences_per_s"])
    used = run["sentences"]
    half = statistics.median(found["batch by batch"]["capacity"]) / 2
    for _ in range(args.repeat):
        for mode in modes:
            idle = service(args, mode, ["--clients", "1"], 30)
            note(mode, "unloaded p50", idle["p50_ms"])
            note(mode, "unloaded p99", idle["p99_ms"])
            loaded = service(args, mode, ["--rate", f"{half:.1f}"], args.seconds)
            note(mode, "half p50", loaded["p50_ms"])
            note(mode, "half p99", loaded["p99_ms"])
            for load, run in (("unloaded", idle), ("half", loaded)):
                note(mode, f"{load} queue", run["queue_wait_ms"])
                note(mode, f"{load} compute", run["compute_ms"])
            note(mode, "ratio", loaded["p99_ms"] / idle["p99_ms"])

    print(f"\nsentences: {used}; half the capacity: {half:.1f} requests/s (half the batch-by-batch median); "
          f"unloaded: one client; {args.repeat} runs each, alternating the modes")
    print("| workers | capacity, sentences/s | unloaded p50 / p99 ms | half capacity p50 / p99 ms "
          "| p99 ratio (target <= 2.5) |")
    print("|---|---:|---:|---:|---:|")
    for mode, f in found.items():
        print(f"| {mode} | {cell(f['capacity'], 1)} | {cell(f['unloaded p50'])} / {cell(f['unloaded p99'])} "
              f"| {cell(f['half p50'])} / {cell(f['half p99'])} | {cell(f['ratio'], 2)} |")
    print("\nWhere a request's time goes, in the server (its /metrics): the mean wait from arrival to the start of "
          "its batch, and the mean from there to its last result")
    print("| workers | unloaded: queue wait / compute ms | half capacity: queue wait / compute ms |")
    print("|---|---:|---:|")
    for mode, f in found.items():
        print(f"| {mode} | {cell(f['unloaded queue'])} / {cell(f['unloaded compute'])} "
              f"| {cell(f['half queue'])} / {cell(f['half compute'])} |")


if __name__ == "__main__":
    main()
