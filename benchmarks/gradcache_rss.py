"""Where a GradCache run's resident memory goes: RSS around each step, per allocator setting.

Variants ``default`` and ``mmapN`` (``train.mmap_threshold_mib`` N); RSS sampled every 5 ms (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import WIKI, emit, kit_recipe_run, paired_ratios, run_rounds, setup_threads
from benchmarks._harness import add_options, chosen, difference, forwarded, keep, start, summary_of, values

VARIANTS: dict[str, int | None] = {"default": None, "mmap1": 1, "mmap2": 2, "mmap4": 4}  # -> train.mmap_threshold_mib
DEFAULT_VARIANTS = ",".join(VARIANTS)


def rss_mib() -> float:
    """Resident set size now (Linux ``/proc/self/statm``, pages of 4 KiB)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


class PeakSampler:
    """The highest RSS seen since the last :meth:`reset`, sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mib())
            time.sleep(0.005)

    def reset(self) -> None:
        self.peak = rss_mib()


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    from simcse_kit.training.loop import fit

    sampler = PeakSampler()
    overrides = {
        "batch_size": args.batch_size, "grad_cache_chunk": args.chunk, "max_steps": args.steps,
        "mmap_threshold_mib": VARIANTS[args.worker],
    }
    sentences = WIKI.read_text(encoding="utf-8").splitlines()[: args.batch_size * args.steps]
    run = kit_recipe_run("unsup", overrides, sentences)
    steps: list[dict[str, float]] = []

    def measured(model: Any, batch: Any, backward: Any = None) -> Any:
        before, tick = rss_mib(), time.perf_counter()
        sampler.reset()
        loss = run.step(model, batch, backward)
        steps.append({"before": before, "peak": sampler.peak, "after": rss_mib(), "seconds": time.perf_counter() - tick})
        return loss

    start = rss_mib()
    fit(run, measured, run.cfg.train)
    heap = {"mmap_threshold_mib": run.heap.mmap_threshold_mib, "reason": run.heap.reason}
    later = [x["seconds"] for x in steps[1:]] or [steps[0]["seconds"]]
    emit(
        {
            "variant": args.worker,
            "start": start,
            "steps": steps,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "max_step_peak_mib": max(x["peak"] for x in steps),
            "after_last_mib": steps[-1]["after"],
            "s_per_step": sum(later) / len(later),  # after the first step
            "heap": heap,
        }
    )


def comparisons(runs: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Each variant against ``default``."""
    if "default" not in names:
        return {}
    out = {}
    for name in (n for n in names if n != "default"):
        out[name] = {
            key: difference(values(runs, name, key), values(runs, "default", key)) for key in ("peak_rss_mib", "after_last_mib")
        } | {"s_per_step_ratio": paired_ratios(runs, name, "default", "s_per_step")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128, help="GradCache rows per forward pass")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {list(VARIANTS)}")
    add_options(parser, "gradcache_rss")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    names = chosen(parser, args.variants, list(VARIANTS))
    env = start(args)
    shared = forwarded(args, "batch-size", "chunk", "steps", "threads")
    runs = run_rounds(Path(__file__), names, shared, args.rounds, args.threads, env=env, metric="peak_rss_mib")
    summary = summary_of(runs, names, ("peak_rss_mib", "max_step_peak_mib", "after_last_mib", "s_per_step"))
    diffs = comparisons(runs, names)
    keep("gradcache_rss", args, {"runs": runs, "summary": summary, "comparisons": diffs})


if __name__ == "__main__":
    main()
