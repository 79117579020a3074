"""Share of the matmul peak that a real training run reaches (model FLOP utilisation).

The unsup recipe's own loop on fresh batches, FLOPs counted on exactly the measured batches,
against the bf16 / fp32 matmul peak of the same round. Results: BENCHMARKS.md, "Training speed per CPU class".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    emit,
    kit_recipe_run,
    matmul_gflops,
    paired_ratios,
    peak_rss_mib,
    run_rounds,
    setup_threads,
    spread,
    step_flops,
)
from benchmarks._harness import add_options, chosen, forwarded, keep, print_spread, start, summary_of, values

PEAKS = ("peak-bf16", "peak-fp32")
KITS = ("kit-auto", "kit-fp32", "kit-bf16")
DEFAULT_VARIANTS = "peak-bf16,peak-fp32,kit-auto,kit-fp32"


def peak_result(variant: str, n: int) -> dict[str, Any]:
    """A ``peak-bf16`` / ``peak-fp32`` worker's result: ``gflops`` of the ``n``-square matmul."""
    import torch

    dtype = {"peak-bf16": torch.bfloat16, "peak-fp32": torch.float32}[variant]
    return {"variant": variant, "gflops": matmul_gflops(n, n, n, dtype), "n": n}


class StampedStep:
    """The loop's step, wrapped: the time of each call and the batch it got."""

    def __init__(self, step: Any) -> None:
        self.step = step
        self.stamps: list[float] = []
        self.batches: list[dict[str, Any]] = []

    def __call__(self, model: Any, batch: dict[str, Any], backward: Any) -> Any:
        self.stamps.append(time.perf_counter())
        self.batches.append(batch)
        return self.step(model, batch, backward)


def kit_result(args: argparse.Namespace) -> dict[str, Any]:
    """A ``kit-*`` worker's result: the recipe's loop on fresh batches, its achieved GFLOP/s."""
    from benchmarks.train_throughput import KIT_PRECISION, sentences_for
    from simcse_kit.loop import fit

    overrides = {
        "batch_size": args.batch_size,
        "max_seq_len": args.max_seq_len,
        "max_steps": args.warmup + args.steps + 2,
        **KIT_PRECISION[args.worker.removeprefix("kit-")],
    }
    run = kit_recipe_run("unsup", overrides, sentences_for(args))
    probe = StampedStep(run.step)
    fit(run, probe, run.cfg.train)
    w, s = args.warmup, args.steps
    if len(probe.stamps) <= w + s:
        raise RuntimeError(f"only {len(probe.stamps)} steps ran; need {w + s + 1}")
    seconds = probe.stamps[w + s] - probe.stamps[w]
    measured = probe.batches[w : w + s]
    flops = step_flops(run.model, run.objective, measured) * len(measured)
    train = run.cfg.train
    bf16 = train.mixed_precision == "bf16" or train.bf16_weights
    return {
        "variant": args.worker,
        "gflops": flops / seconds / 1e9,
        "flops": flops,
        "seconds": seconds,
        "steps": s,
        "padded_tokens": sum(int(b["input_ids"].numel()) for b in measured),
        "real_tokens": sum(int(b["attention_mask"].sum()) for b in measured),
        "own_peak": "peak-bf16" if bf16 else "peak-fp32",
        "precision": {
            "mixed_precision": train.mixed_precision,
            "bf16_weights": train.bf16_weights,
            "fast_dropout": train.fast_dropout,
            "reason": getattr(run.precision, "reason", None) or "set in the config",
        },
        "peak_rss_mib": peak_rss_mib(),
    }


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    emit(peak_result(args.worker, args.n) if args.worker in PEAKS else kit_result(args))


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    """GFLOP/s per variant; per kit variant its share of each peak and of its own, paired by round."""
    summary: dict[str, Any] = summary_of(runs, variants, ("gflops",))
    for v in (v for v in variants if v in KITS):
        own = values(runs, v, "own_peak")[-1]
        for peak in PEAKS:
            if peak in variants:
                summary[v][f"share_of_{peak}"] = paired_ratios(runs, v, peak, "gflops")
        summary[v] |= {
            "own_peak": own,
            "share_of_own_peak": summary[v].get(f"share_of_{own}"),
            "gflop_per_step": spread([x["flops"] / x["steps"] / 1e9 for x in runs if x["variant"] == v]),
            "precision": values(runs, v, "precision")[-1],
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per kit variant per round")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=2048, help="matmul size for the peaks")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated subset of {PEAKS + KITS}")
    add_options(parser, "flops")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    variants = chosen(parser, args.variants, PEAKS + KITS)
    env = start(args)
    common = forwarded(args, "steps", "warmup", "batch-size", "max-seq-len", "threads", "n")
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env, metric="gflops")
    summary = summarise(runs, variants)
    print(f"\nunsup recipe, batch {args.batch_size}, max len {args.max_seq_len}, {args.threads} threads, fresh batches")
    for v, s in summary.items():
        print_spread(f"{v} GFLOP/s", s["gflops"], "GFLOP/s")
        if s.get("share_of_own_peak"):
            print_spread(f"  share of {s['own_peak']}", s["share_of_own_peak"], "", digits=3)
    keep("flops", args, {"figure": "real run: fresh batches, the run's packed shapes", "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
