"""Training throughput: simcse-kit vs sentence-transformers on the same job.

The job: unsupervised SimCSE on the default model (all-MiniLM-L6-v2), sentences
from ../shared/data/train/wiki1m_head.txt, batch 64, max length 32, temperature
0.05, AdamW lr 3e-5. simcse-kit runs its own loop (``simcse_kit.trainer.fit`` with
``SimCSEObjective``); sentence-transformers runs ``SentenceTransformerTrainer`` with
``MultipleNegativesRankingLoss(scale=20)`` on ``(anchor, positive)`` = the same
sentence twice, its documented unsupervised-SimCSE recipe. Both encode 2 x 64
sentences per step.

Each measurement runs in a fresh interpreter; the variants alternate
(ST fp32, kit fp32, ST bf16, kit bf16, then again) so a load change on the machine
hits all of them. Throughput is sentences encoded per second over the measured
steps, timed by the collate calls (start-up and warm-up excluded).

Usage::

    .venv/bin/python benchmarks/train_throughput.py              # ~5 min on 2 cores
    .venv/bin/python benchmarks/train_throughput.py --rounds 1 --steps 5 --variants kit-bf16
    .venv/bin/python benchmarks/train_throughput.py --variants kit-bf16 --batch-size 1024 --grad-cache-chunk 128
    .venv/bin/python benchmarks/train_throughput.py --variants kit-fast,kit-fast-padded   # what packing buys
    .venv/bin/python benchmarks/train_throughput.py --variants kit-fast,kit-fast-densegrad   # what sparse_embedding_grad buys
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import WIKI, TimedCollator, emit, machine, peak_rss_mib, run_rounds, setup_threads, st_pair_throughput  # noqa: E402

# kit-bf16: autocast, like ST's bf16=True; kit-fast: the recipes' setting (bf16 weights
# with fp32 master weights + fast dropout, simcse_kit.fastpath.bf16 / simcse_kit.fastpath).
# Every kit variant packs sequences (simcse_kit.packing). The ablations, not in the default
# run: kit-fast-padded does not pack; kit-fast-densegrad gives the embedding tables a fresh
# dense gradient every backward (sparse_embedding_grad: false).
VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-bf16", "kit-fast")
ABLATIONS = ("kit-fast-padded", "kit-fast-densegrad")


def sentences_for(args: argparse.Namespace) -> list[str]:
    from simcse_kit.data import read_sentences

    need = (args.warmup + args.steps + 3) * args.batch_size
    sents = read_sentences(WIKI)
    start = (args.offset * need) % max(1, len(sents) - need)
    out = sents[start : start + need]
    if len(out) < need:
        raise SystemExit(f"{WIKI} has too few sentences for {need} per run")
    return out


def worker_kit(args: argparse.Namespace, sents: list[str]) -> dict[str, Any]:
    import datasets
    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    from simcse_kit.config import LossConfig, ModelConfig, TrainConfig
    from simcse_kit.data import ContrastiveCollator
    from simcse_kit.fastpath import enable_fast_dropout
    from simcse_kit.gradcache import GradCacheStep
    from simcse_kit.modeling import SimCSEModel, resolve_model_path
    from simcse_kit.objectives import SimCSEObjective
    from simcse_kit.trainer import fit, make_accelerator

    steps = args.warmup + args.steps + 2
    cfg = TrainConfig(
        output_dir=tempfile.mkdtemp(),
        batch_size=args.batch_size,
        learning_rate=3e-5,
        max_steps=steps,
        mixed_precision="bf16" if args.precision in ("bf16", "fast") else "no",
        bf16_weights=args.precision == "fast",
        eval_steps=0,
        log_steps=10**9,
        progress_bar=False,
        grad_cache_chunk=args.grad_cache_chunk,
        sparse_embedding_grad=args.sparse_embedding_grad,
    )
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    model = SimCSEModel.from_config(ModelConfig(max_seq_len=args.max_seq_len, packing=args.packing))
    if args.precision == "fast":
        enable_fast_dropout(model)
    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    collator = TimedCollator(
        ContrastiveCollator(tokenizer, "unsup", args.max_seq_len),
        lambda b: (b["input_ids"].shape[0], b["input_ids"].numel()),
    )
    loader = DataLoader(
        datasets.Dataset.from_dict({"sent0": sents}),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=collator,
        generator=torch.Generator().manual_seed(42),
    )
    accelerator = make_accelerator(cfg, cpu=True)
    step = GradCacheStep(objective, args.grad_cache_chunk, accelerator) if args.grad_cache_chunk > 0 else objective.step
    fit(model, step, loader, cfg, accelerator=accelerator)
    return collator.rate(args.warmup, args.steps)


def worker_st(args: argparse.Namespace, sents: list[str]) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    # scale = 1 / temperature 0.05
    return st_pair_throughput(args, sents, lambda model: MultipleNegativesRankingLoss(model, scale=20.0))


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    sents = sentences_for(args)
    framework, precision, *rest = args.worker.split("-")
    args.precision = precision
    args.packing = "padded" not in rest
    args.sparse_embedding_grad = "densegrad" not in rest
    result = (worker_kit if framework == "kit" else worker_st)(args, sents)
    emit(result | {"variant": args.worker, "peak_rss_mib": peak_rss_mib()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per variant per round")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--rounds", type=int, default=2, help="A/B alternations")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grad-cache-chunk", type=int, default=0, help="kit only: GradCache chunk rows (0: off)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS) - set(ABLATIONS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS + ABLATIONS}")
    common = [
        f"--{k}={getattr(args, k.replace('-', '_'))}"
        for k in ("steps", "warmup", "batch-size", "max-seq-len", "threads", "grad-cache-chunk")
    ]
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads)

    summary: dict[str, dict[str, float]] = {}
    for v in variants:
        mine = [x for x in runs if x["variant"] == v]
        seconds = sum(x["seconds"] for x in mine)
        summary[v] = {
            "sentences_per_s": sum(x["sentences"] for x in mine) / seconds,
            "padded_tokens_per_s": sum(x["padded_tokens_per_s"] * x["seconds"] for x in mine) / seconds,
            "peak_rss_mib": max(x["peak_rss_mib"] for x in mine),
        }
    print(
        f"\nbatch {args.batch_size}, max len {args.max_seq_len}, {args.threads} threads, "
        f"{args.rounds} x {args.steps} measured steps"
    )
    print(f"{'variant':15s} {'sent/s':>9s} {'tok/s':>9s} {'RSS MiB':>8s}")
    for v, s in summary.items():
        print(f"{v:15s} {s['sentences_per_s']:9.1f} {s['padded_tokens_per_s']:9.0f} {s['peak_rss_mib']:8.0f}")
    ratios = {}
    pairs = [("kit-fast", "st-fp32"), ("kit-fast", "st-bf16"), ("kit-bf16", "st-bf16"), ("kit-fp32", "st-fp32")]
    pairs += [("kit-bf16", "st-fp32"), ("kit-fast", "kit-bf16"), ("kit-fast", "kit-fp32"), ("kit-fast", "kit-fast-padded")]
    pairs += [("kit-fast", "kit-fast-densegrad")]
    for ours, theirs in pairs:
        if ours in summary and theirs in summary:
            ratios[f"{ours}/{theirs}"] = summary[ours]["sentences_per_s"] / summary[theirs]["sentences_per_s"]
            print(f"{ours} / {theirs} = {ratios[f'{ours}/{theirs}']:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine(), "args": vars(args), "runs": runs, "summary": summary, "ratios": ratios},
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
