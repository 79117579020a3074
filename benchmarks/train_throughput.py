"""Training throughput: simcse-kit vs sentence-transformers on the same job.

Unsup SimCSE on all-MiniLM-L6-v2, batch 64, max length 32, clipping at 1.0; variants ``st-fp32``, ``st-bf16``,
``kit-fp32``, ``kit-bf16``, ``kit-auto`` (the recipe as shipped). Results: BENCHMARKS.md, "Training speed".
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks._common import (
    WIKI,
    TimedCollator,
    emit,
    kit_recipe_run,
    paired_ratios,
    peak_rss_mib,
    run_rounds,
    setup_threads,
    spread,
    st_pair_throughput,
)
from benchmarks._harness import add_options, chosen, forwarded, keep, start

VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-bf16", "kit-auto")
# Precision overrides of the recipe per kit variant ("auto" keeps the recipe's own).
KIT_PRECISION = {
    "fp32": {"mixed_precision": "no", "bf16_weights": False, "fast_dropout": False},
    "bf16": {"mixed_precision": "bf16", "bf16_weights": False, "fast_dropout": False}, "auto": {},
}
MAX_GRAD_NORM = 1.0  # sentence-transformers' default, applied to both


def sentences_for(args: argparse.Namespace) -> list[str]:
    from simcse_kit.data.readers import read_sentences

    need = (args.warmup + args.steps + 3) * args.batch_size
    sents = read_sentences(WIKI)
    start = (args.offset * need) % max(1, len(sents) - need)
    out = sents[start : start + need]
    if len(out) < need:
        raise SystemExit(f"{WIKI} has too few sentences for {need} per run")
    return out


def worker_kit(args: argparse.Namespace, sents: list[str], precision: str) -> dict[str, Any]:
    from simcse_kit.training.loop import fit

    overrides: dict[str, Any] = {
        "batch_size": args.batch_size, "max_seq_len": args.max_seq_len, "max_steps": (args.warmup + args.steps + 2),
        "max_grad_norm": MAX_GRAD_NORM, "grad_cache_chunk": args.grad_cache_chunk, **KIT_PRECISION[precision],
    }
    collator = TimedCollator(None, lambda b: (b["input_ids"].shape[0], b["input_ids"].numel()))
    run = kit_recipe_run("unsup", overrides, sents, timer=collator)
    fit(run, run.step, run.cfg.train)
    decided = {
        "mixed_precision": run.cfg.train.mixed_precision, "bf16_weights": run.cfg.train.bf16_weights,
        "fast_dropout": run.cfg.train.fast_dropout, "reason": getattr(run.precision, "reason", None),
    }
    return collator.rate(args.warmup, args.steps) | {"precision": decided}


def worker_st(args: argparse.Namespace, sents: list[str], precision: str) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    args.precision = precision
    # scale = 1 / temperature 0.05; clipping at 1.0 is the trainer's default (max_grad_norm)
    return st_pair_throughput(args, sents, lambda model: MultipleNegativesRankingLoss(model, scale=20.0))


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    sents = sentences_for(args)
    framework, precision = args.worker.split("-")
    if framework == "kit":
        result = worker_kit(args, sents, precision)
    else:
        result = worker_st(args, sents, precision)
    emit(result | {"variant": args.worker, "peak_rss_mib": peak_rss_mib()})


def summarise(variants: list[str], runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Median and range per variant."""
    summary = {
        v: {
            "sentences_per_s": spread([x["sentences_per_s"] for x in runs if x["variant"] == v]),
            "peak_rss_mib": spread([x["peak_rss_mib"] for x in runs if x["variant"] == v]),
        }
        for v in variants
    }
    ratios: dict[str, Any] = {}
    st = [v for v in variants if v.startswith("st-")]
    for ours in (v for v in variants if v.startswith("kit-")):
        for theirs in st:
            ratios[f"{ours}/{theirs}"] = paired_ratios(runs, ours, theirs)
    if st:
        best = max(st, key=lambda v: summary[v]["sentences_per_s"]["median"])
        ratios["st-best"] = best
        for ours in ("kit-auto", "kit-fp32"):
            if ours in variants:
                ratios[f"{ours}/st-best"] = paired_ratios(runs, ours, best)
    return summary, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per variant per round")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grad-cache-chunk", type=int, default=0, help="kit only: GradCache chunk rows (0: off)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    add_options(parser, "train_throughput")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    variants = chosen(parser, args.variants, VARIANTS)
    env = start(args)
    common = forwarded(args, "steps", "warmup", "batch-size", "max-seq-len", "threads", "grad-cache-chunk")
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env)
    summary, ratios = summarise(variants, runs)
    keep("train_throughput", args, {"runs": runs, "summary": summary, "ratios": ratios})


if __name__ == "__main__":
    main()
