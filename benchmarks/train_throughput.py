"""Training throughput: simcse-kit vs sentence-transformers on the same job.

Unsup SimCSE on all-MiniLM-L6-v2, batch 64, max length 32, clipping at 1.0; variants ``st-fp32``, ``st-bf16``,
``kit-fp32``, ``kit-bf16``, ``kit-auto`` (the recipe as shipped). Results: BENCHMARKS.md, "Training speed".

``--lora``: full fine-tuning against LoRA (``model.lora_r``; the peer: ``st_peers.add_lora``, the same
``LoraConfig``), simcse-kit and sentence-transformers in fp32, for each of ``--backbones`` and the unsup and
hardneg recipes: variants ``<backbone>:<mode>:<kit|st>-<full|lora>``, trained parameters, peak RSS, step time.
Results: BENCHMARKS.md, "Backbones: LoRA".
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks._common import (
    DATA,
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
from benchmarks._harness import add_options, chosen, forwarded, keep, start, summary_of

VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-bf16", "kit-auto")
# Precision overrides of the recipe per kit variant ("auto" keeps the recipe's own).
KIT_PRECISION = {
    "fp32": {"mixed_precision": "no", "bf16_weights": False, "fast_dropout": False},
    "bf16": {"mixed_precision": "bf16", "bf16_weights": False, "fast_dropout": False},
    "auto": {},
}
MAX_GRAD_NORM = 1.0  # sentence-transformers' default, applied to both
LORA_SIDES = ("kit-full", "kit-lora", "st-full", "st-lora")
SNLI = DATA / "train" / "snli_triplets.csv"


def sentences_for(args: argparse.Namespace) -> list[str]:
    from simcse_kit.data.readers import read_sentences

    need = (args.warmup + args.steps + 3) * args.batch_size
    sents = read_sentences(WIKI)
    start = (args.offset * need) % max(1, len(sents) - need)
    out = sents[start : start + need]
    if len(out) < need:
        raise SystemExit(f"{WIKI} has too few sentences for {need} per run")
    return out


def triplets_for(args: argparse.Namespace) -> dict[str, list[str]]:
    """The hardneg recipe's columns, as many rows as :func:`sentences_for` gives sentences."""
    from simcse_kit.data.readers import read_rows

    need = (args.warmup + args.steps + 3) * args.batch_size
    rows = list(read_rows(SNLI, ("sent0", "sent1", "hard_neg")))[:need]
    if len(rows) < need:
        raise SystemExit(f"{SNLI} has too few rows for {need} per run")
    return {column: [row[column] for row in rows] for column in ("sent0", "sent1", "hard_neg")}


def worker_kit(
    args: argparse.Namespace, sents: list[str] | dict[str, list[str]], precision: str, recipe: str = "unsup", **extra: Any
) -> dict[str, Any]:
    """The recipe's run (``extra``: more overrides) timed; ``trainable``: the weights it trains."""
    from simcse_kit.training.engine.loop import fit

    overrides: dict[str, Any] = {
        "batch_size": args.batch_size,
        "max_seq_len": args.max_seq_len,
        "max_steps": (args.warmup + args.steps + 2),
        "max_grad_norm": MAX_GRAD_NORM,
        "grad_cache_chunk": args.grad_cache_chunk,
        **KIT_PRECISION[precision],
        **extra,
    }
    collator = TimedCollator(None, lambda b: (b["input_ids"].shape[0], b["input_ids"].numel()))
    run = kit_recipe_run(recipe, overrides, sents, timer=collator)
    fit(run, run.step, run.cfg.train)
    decided = {
        "mixed_precision": run.cfg.train.mixed_precision,
        "bf16_weights": run.cfg.train.bf16_weights,
        "fast_dropout": run.cfg.train.fast_dropout,
        "reason": getattr(run.precision, "reason", None),
    }
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    return collator.rate(args.warmup, args.steps) | {"precision": decided, "trainable": trainable}


def worker_st(args: argparse.Namespace, sents: list[str], precision: str) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    args.precision = precision
    # scale = 1 / temperature 0.05; clipping at 1.0 is the trainer's default (max_grad_norm)
    return st_pair_throughput(args, sents, lambda model: MultipleNegativesRankingLoss(model, scale=20.0))


def worker_lora(args: argparse.Namespace, backbone: str, mode: str, side: str) -> dict[str, Any]:
    """One ``--lora`` variant: ``side`` (``kit-full`` ...) trains ``backbone`` on ``mode``'s recipe, fp32."""
    import datasets
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from benchmarks.st_peers import add_lora, peer_dataset
    from simcse_kit.config.run import ModelConfig

    data = sentences_for(args) if mode == "unsup" else triplets_for(args)
    framework, kind = side.split("-")
    lora = args.lora_r if kind == "lora" else 0
    if framework == "kit":
        return worker_kit(args, data, "fp32", mode, name_or_path=backbone, lora_r=lora, packing=False)
    columns = datasets.Dataset.from_dict(data if isinstance(data, dict) else {"sent0": data})
    args.precision = "fp32"
    adapt = (lambda model: add_lora(model, ModelConfig(lora_r=lora))) if lora else None  # the kit's defaults otherwise
    mnrl = lambda model: MultipleNegativesRankingLoss(model, scale=20.0)  # noqa: E731 - scale = 1 / temperature 0.05
    return st_pair_throughput(args, peer_dataset(columns, "mnrl", mode, 0), mnrl, backbone, adapt)


def lora_variants(args: argparse.Namespace) -> list[str]:
    return [f"{b}:{m}:{side}" for b in args.backbones.split(",") for m in ("unsup", "hardneg") for side in LORA_SIDES]


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    if args.lora:
        backbone, mode, side = args.worker.split(":")
        result = worker_lora(args, backbone, mode, side)
        result["s_per_step"] = result["seconds"] / args.steps
    else:
        framework, precision = args.worker.split("-")
        sents = sentences_for(args)
        result = worker_kit(args, sents, precision) if framework == "kit" else worker_st(args, sents, precision)
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
    parser.add_argument("--lora", action="store_true", help="full fine-tuning against LoRA, kit and peer (kept as train_lora-*)")
    parser.add_argument("--backbones", default="all-MiniLM-L6-v2", help="--lora: comma-separated model names or folders")
    parser.add_argument("--lora-r", type=int, default=8, help="--lora: the adapter's rank (the rest: the kit's defaults)")
    add_options(parser, "train_throughput")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    variants = lora_variants(args) if args.lora else chosen(parser, args.variants, VARIANTS)
    env = start(args)
    common = forwarded(args, "steps", "warmup", "batch-size", "max-seq-len", "threads", "grad-cache-chunk")
    common += [*forwarded(args, "backbones", "lora-r"), "--lora"] if args.lora else []
    metric = "s_per_step" if args.lora else "sentences_per_s"
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env, metric=metric)
    if args.lora:
        keys = ("s_per_step", "peak_rss_mib", "trainable")
        keep("train_throughput", args, {"runs": runs, "summary": summary_of(runs, variants, keys)}, stem="train_lora")
        return
    summary, ratios = summarise(variants, runs)
    keep("train_throughput", args, {"runs": runs, "summary": summary, "ratios": ratios})


if __name__ == "__main__":
    main()
