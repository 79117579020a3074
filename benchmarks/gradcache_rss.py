"""Where a GradCache run's resident memory goes: RSS around each step, per allocator setting.

simcse-kit's unsup recipe at batch 1024 with ``--grad-cache-chunk 128`` (the setting of
``gradcache_vs_cmnrl.py``), in a fresh process per variant; a thread samples the RSS
every 5 ms, so each step's peak is seen, not only its end. Variants:

* ``default``: glibc malloc and oneDNN as they come (``train.mmap_threshold_mib: null``);
* ``mmap1``, ``mmap2``, ``mmap4``: ``train.mmap_threshold_mib`` 1, 2, 4, which fixes
  glibc's mmap threshold (``simcse_kit.heap``): every allocation of that size or more is
  its own mapping, returned to the OS when freed. By default glibc raises this threshold
  as large blocks are freed (up to 32 MiB), so the step's many transient tensors, whose
  sizes change with every packed batch, are served from a heap that never shrinks;
* ``mmap1-nocache``: ``mmap1`` plus ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` (oneDNN keeps
  no compiled kernels, with their scratch buffers, per matmul shape).

Each step's wall time is recorded too (the price of fresh mappings). ``--chunk 0`` measures
a plain (non-GradCache) run the same way.

Usage::

    .venv/bin/python benchmarks/gradcache_rss.py                  # ~5 min on 2 cores
    .venv/bin/python benchmarks/gradcache_rss.py --batch-size 64 --chunk 32 --steps 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import WIKI, emit, kit_recipe_run, machine, run_worker, setup_threads  # noqa: E402

# name -> (train.mmap_threshold_mib, extra environment variables)
VARIANTS: dict[str, tuple[int | None, dict[str, str]]] = {
    "default": (None, {}),
    "mmap1": (1, {}),
    "mmap2": (2, {}),
    "mmap4": (4, {}),
    "mmap1-nocache": (1, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}),
}
DEFAULT_VARIANTS = "default,mmap1,mmap2,mmap4"


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
    from simcse_kit.trainer import fit

    sampler = PeakSampler()
    overrides = {
        "batch_size": args.batch_size,
        "grad_cache_chunk": args.chunk,
        "max_steps": args.steps,
        "mmap_threshold_mib": VARIANTS[args.worker][0],
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
    emit({"start": start, "steps": steps, "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "heap": heap})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128, help="GradCache rows per forward pass")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {list(VARIANTS)}")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    names = args.variants.split(",")
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:  # before any variant runs: each costs minutes
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    results = {}
    shared = [f"--batch-size={args.batch_size}", f"--chunk={args.chunk}", f"--steps={args.steps}", f"--threads={args.threads}"]
    for name in names:
        results[name] = run_worker(Path(__file__), [*shared, f"--worker={name}"], args.threads, env=VARIANTS[name][1])
    chunks = f"GradCache chunks of {args.chunk} rows" if args.chunk else "no GradCache"
    print(f"batch {args.batch_size}, {chunks}, {args.steps} steps, {args.threads} threads\n")
    print("| variant | RSS after model MiB | each step: peak / after MiB | peak RSS MiB | s/step after the first |")
    print("|---|---:|---|---:|---:|")
    for name, r in results.items():
        per_step = ", ".join(f"{s['peak']:.0f} / {s['after']:.0f}" for s in r["steps"])
        later = [s["seconds"] for s in r["steps"][1:]] or [r["steps"][0]["seconds"]]
        print(f"| {name} | {r['start']:.0f} | {per_step} | {r['ru_maxrss']:.0f} | {sum(later) / len(later):.3f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
