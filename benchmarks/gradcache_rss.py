"""Where a GradCache run's resident memory goes: RSS around each step, per allocator setting.

simcse-kit's unsup recipe at batch 1024 with ``--grad-cache-chunk 128`` (the setting of
``gradcache_vs_cmnrl.py``), in a fresh process per variant; a thread samples the RSS
every 5 ms, so each step's peak is seen, not only its end. Variants are environment
settings read when the process starts:

* ``default``: glibc malloc and oneDNN as they come;
* ``mmap1m``: ``MALLOC_MMAP_THRESHOLD_=1048576``: every allocation of 1 MiB or more is its
  own mapping, returned to the OS when freed. By default glibc raises this threshold as
  large blocks are freed (up to 32 MiB), so the step's many transient tensors, whose
  sizes change with every packed batch, are served from a heap that never shrinks;
* ``mmap1m-nocache``: the same plus ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` (oneDNN keeps no
  compiled kernels, with their scratch buffers, per matmul shape).

Usage::

    .venv/bin/python benchmarks/gradcache_rss.py                  # ~5 min on 2 cores
    .venv/bin/python benchmarks/gradcache_rss.py --batch-size 64 --chunk 32 --steps 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import WIKI, emit, machine, run_worker, setup_threads  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "mmap1m": {"MALLOC_MMAP_THRESHOLD_": "1048576"},
    "mmap1m-nocache": {"MALLOC_MMAP_THRESHOLD_": "1048576", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"},
}


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
    import datasets

    from simcse_kit.config import load_config
    from simcse_kit.objectives import SimCSEObjective
    from simcse_kit.recipes import find_recipe
    from simcse_kit.trainer import fit, make_accelerator, with_concrete_precision
    from simcse_kit.training import build_model, load_checked_tokenizer, make_loader, make_step

    sampler = PeakSampler()
    overrides = {
        "batch_size": args.batch_size,
        "grad_cache_chunk": args.chunk,
        "max_steps": args.steps,
        "eval_steps": 0,
        "eval_at_start": False,
        "log_steps": 10**9,
        "progress_bar": False,
        "report_to": "none",
        "output_dir": tempfile.mkdtemp(),
    }
    cfg = load_config(find_recipe("unsup"), {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in overrides.items()})
    train_cfg, _ = with_concrete_precision(cfg.train, cpu=True)  # as training.train does
    cfg = replace(cfg, train=train_cfg)
    accelerator = make_accelerator(cfg.train, cpu=True)
    model = build_model(cfg)
    sentences = WIKI.read_text(encoding="utf-8").splitlines()[: args.batch_size * args.steps]
    tokenizer = load_checked_tokenizer(cfg)
    loader = make_loader(cfg, datasets.Dataset.from_dict({"sent0": sentences}), tokenizer, accelerator.num_processes)
    step = make_step(cfg, model, SimCSEObjective(cfg.data.mode, cfg.loss), accelerator)
    steps: list[dict[str, float]] = []

    def measured(model: Any, batch: Any, backward: Any = None) -> Any:
        before = rss_mib()
        sampler.reset()
        loss = step(model, batch, backward)
        steps.append({"before": before, "peak": sampler.peak, "after": rss_mib()})
        return loss

    start = rss_mib()
    fit(model, measured, loader, cfg.train, accelerator=accelerator)
    emit({"start": start, "steps": steps, "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128, help="GradCache rows per forward pass")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = {}
    shared = ["--worker", f"--batch-size={args.batch_size}", f"--chunk={args.chunk}", f"--steps={args.steps}"]
    for name in args.variants.split(","):
        results[name] = run_worker(Path(__file__), [*shared, f"--threads={args.threads}"], args.threads, env=VARIANTS[name])
    print(f"batch {args.batch_size}, GradCache chunks of {args.chunk} rows, {args.steps} steps, {args.threads} threads\n")
    print("| variant | RSS after model MiB | each step: peak / after MiB | peak RSS MiB |")
    print("|---|---:|---|---:|")
    for name, r in results.items():
        per_step = ", ".join(f"{s['peak']:.0f} / {s['after']:.0f}" for s in r["steps"])
        print(f"| {name} | {r['start']:.0f} | {per_step} | {r['ru_maxrss']:.0f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine(), "args": vars(args), "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
