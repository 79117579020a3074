"""Does ``auto`` precision decide the same on a loaded machine? (issue 48)

Starts ``--busy-per-core`` busy Python loops per core, then starts the main job
(``simcse-kit train train/unsup.yaml``, one step, no evaluation before it) ``--runs`` times,
``--parallel`` at a time, and reads each run's start-up line ``precision: ... -> <choice>
(auto)``. A run is stopped once it has logged its decision (the decision is all that is
measured; ``--full-step`` lets each finish its first step instead). The busy loops are
ended on the way out. Prints the count of each decision and keeps the record in
``benchmarks/results/precision_under_load-<cpu class>.json``.

Before the fix a timed matmul decided, and under this load 4 of 10 such runs trained in
fp32 on a bf16 CPU; from the CPU's declared flags every run should decide the same.

    python -m benchmarks.precision_under_load --runs 20 --busy-per-core 2
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._common import DATA, ISA_LIMITS, REPO, cpu_class, cpu_flags, machine, save_results

logger = logging.getLogger("benchmarks.precision_under_load")

RESULTS = REPO / "benchmarks" / "results"
RECIPE = REPO / "train" / "unsup.yaml"
DECISION = re.compile(r"INFO simcse_kit\.model\.precision: precision: (?P<facts>.*) -> (?P<choice>.*) \(auto\)$")
BUSY = "while True: pass"
DEV_ROWS = 40  # the dev split a --full-step run scores once at its last step: a few pairs of STS-B dev


@contextmanager
def busy_loops(per_core: int) -> Iterator[int]:
    """``per_core`` busy Python processes per core while the block runs; yields their count."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        time.sleep(1.0)  # every loop spinning before the first run starts
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def train_command(out: Path, dev_file: Path, data_root: Path) -> list[str]:
    """The main job, one step, no step-0 evaluation, nothing saved but the run folder."""
    return [
        sys.executable, "-m", "simcse_kit.cli", "train", str(RECIPE), "--data-root", str(data_root),
        "--output-dir", str(out), "--max-steps", "1", "--eval-at-start", "false", "--final-eval", "false",
        "--save-steps", "0", "--report-to", "none", "--dev-file", str(dev_file), "--progress-bar", "false",
    ]  # fmt: skip


def run_batch(commands: list[list[str]], env: dict[str, str], full_step: bool) -> list[dict[str, Any]]:
    """Starts every command at once and reads their logs side by side, a thread each.

    A run's ``seconds_to_decision`` is when its own line came, counted from its own start.
    Read in turn, each run of a batch would get the time the reader reached it (the runs
    before it, to their end under ``full_step``), and its output would wait in a full pipe.
    """
    procs, starts = [], []
    for command in commands:
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        starts.append(time.monotonic())
    with ThreadPoolExecutor(max_workers=len(procs)) as pool:
        return list(pool.map(read_decision, procs, starts, [full_step] * len(procs)))


def read_decision(proc: subprocess.Popen[str], started: float, full_step: bool) -> dict[str, Any]:
    """The run's decision from its log (``started``: its start, on ``time.monotonic``); it is stopped after
    the decision unless ``full_step``."""
    assert proc.stdout is not None
    found: dict[str, Any] = {"choice": None, "facts": None, "probe_warning": False}
    tail: collections.deque[str] = collections.deque(maxlen=20)
    for line in proc.stdout:
        tail.append(line.rstrip())
        match = DECISION.search(line.rstrip())
        if "measured" in line and "simcse_kit.model.precision" in line and "WARNING" in line:
            found["probe_warning"] = True
        if match and found["choice"] is None:
            found |= {"choice": match["choice"], "facts": match["facts"], "seconds_to_decision": time.monotonic() - started}
            if not full_step:
                break
    if proc.poll() is None and not full_step:
        proc.terminate()
    proc.stdout.close()  # a run still writing gets SIGPIPE rather than a full pipe
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if found["choice"] is None:
        found["log_tail"] = list(tail)
    found["returncode"] = proc.returncode
    return found


def measure(args: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    """``args.runs`` runs, ``args.parallel`` at a time, under the busy loops."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="precision-under-load-") as tmp:
        folder = Path(tmp)
        dev_file = folder / "sts-dev.csv"
        lines = (args.data_root / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv").read_text(encoding="utf-8").splitlines()
        dev_file.write_text("\n".join(lines[:DEV_ROWS]) + "\n", encoding="utf-8")
        with busy_loops(args.busy_per_core) as busy:
            logger.info("%d busy loops on %d cores", busy, os.cpu_count() or 1)
            deadline = time.monotonic() + args.budget_s
            for first in range(0, args.runs, args.parallel):
                if time.monotonic() > deadline:
                    logger.warning("--budget-s %d spent: %d of %d runs made", args.budget_s, first, args.runs)
                    break
                batch = range(first, min(args.runs, first + args.parallel))
                commands = [train_command(folder / f"run-{i}", dev_file, args.data_root) for i in batch]
                for i, found in zip(batch, run_batch(commands, env, args.full_step), strict=True):
                    results.append({"run": i} | found)
                    logger.info("run %d: %s after %.1f s", i, found["choice"], found.get("seconds_to_decision", float("nan")))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="Does auto precision decide the same on a loaded machine? (issue 48)")
    parser.add_argument("--runs", type=int, default=20, help="runs of the main job's first step")
    parser.add_argument("--parallel", type=int, default=2, help="runs started together (they load the machine too)")
    parser.add_argument("--budget-s", type=int, default=480, help="start no more runs after this many seconds")
    parser.add_argument("--busy-per-core", type=int, default=2, help="busy Python loops per core")
    parser.add_argument("--full-step", action="store_true", help="let each run finish its step (default: stop it once decided)")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native", help="avx2: limit the kernels to AVX2")
    parser.add_argument("--data-root", type=Path, default=DATA, help="the shared data folder")
    parser.add_argument(
        "--json", type=Path, default=None, help="default: benchmarks/results/precision_under_load-<cpu class>.json"
    )
    args = parser.parse_args()
    if args.runs < 1 or args.parallel < 1 or args.busy_per_core < 0:
        parser.error("--runs and --parallel must be at least 1, --busy-per-core at least 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    env = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env |= ISA_LIMITS if args.isa == "avx2" else {}
    started = time.monotonic()
    runs = measure(args, env)
    counts = collections.Counter(str(r["choice"]) for r in runs)
    _, flags = cpu_flags()
    klass = "avx2-limited" if args.isa == "avx2" else cpu_class(flags)
    info = machine() | ({"cpu_class": klass, "kernel_limits": ISA_LIMITS} if args.isa == "avx2" else {})
    record = {
        "machine": info, "args": vars(args), "command": "python -m benchmarks.precision_under_load " + " ".join(sys.argv[1:]),
        "counts": dict(counts), "same_everywhere": len(counts) == 1, "seconds": round(time.monotonic() - started, 1),
        "runs": runs,
    }  # fmt: skip
    save_results(args.json or RESULTS / f"precision_under_load-{klass}.json", record)
    for choice, n in counts.most_common():
        print(f"{n}/{len(runs)} runs: {choice}")


if __name__ == "__main__":
    main()
