"""GradCache side by side: simcse-kit's GradCache vs sentence-transformers' CachedMNRL.

The job: unsupervised SimCSE on the default model (all-MiniLM-L6-v2), sentences from
../shared/data/train/wiki1m_head.txt, batch ``--batch-size`` examples (default 1024),
max length 32, temperature 0.05 (scale 20), lr 3e-5, both toolkits caching gradients so
that only one mini-batch's activations live at a time:

* simcse-kit: the unsup recipe (train/unsup.yaml) with ``train.grad_cache_chunk`` =
  ``--chunk`` rows, built as a run builds it (``simcse_kit.training.run.build_run``, through
  ``_common.kit_recipe_run``: the step is a ``GradCacheStep``), then ``loop.fit``;
* sentence-transformers: ``SentenceTransformerTrainer`` with
  ``CachedMultipleNegativesRankingLoss(scale=20, mini_batch_size=--chunk)`` on
  ``(anchor, positive)`` = the same sentence twice (its documented unsupervised-SimCSE
  recipe), its other defaults kept (fused AdamW, gradient clipping at 1.0).

Same mini-batch, counted in sequences per forward pass: simcse-kit's chunk counts rows of
the ``[a, a, b, b, ...]`` batch (2 rows per example in unsup), so a chunk of 128 rows is
64 examples x 2 views; CachedMNRL embeds each column (anchors, then positives) separately
in mini-batches of ``mini_batch_size`` sequences, so ``mini_batch_size`` 128 is 128
anchors or 128 positives. Both thus encode 2 x batch sequences a step in forward passes
of 128 sequences, each twice (once without a graph, once replayed with it). Both trim a
mini-batch's all-padding columns; simcse-kit also packs its rows (``model.packing``).
The losses differ as in ``train_throughput.py`` (2N-view InfoNCE vs z1 . z2^T); at this
batch the loss is still a small part of the step.

Variants, each in a fresh interpreter (clean RSS), alternating over ``--rounds`` (default 3):
``st-fp32`` (CachedMNRL, its default precision), ``kit-fp32`` (``mixed_precision no``),
``st-bf16`` (``bf16=True``), ``kit-auto`` (the recipe's ``mixed_precision auto``: on a
native-bf16 CPU, bf16 weights with fp32 master weights and fast dropout; the resolved
choice is recorded). Per variant: sentences (rows) per second over ``--steps`` optimiser
steps after ``--warmup``, timed by the collate calls (``_common.TimedCollator``, as in
``train_throughput.py``), and the process's peak RSS (start-up, model, optimiser state and
all). wiki1m_head has 11,914 sentences, fewer than 25 batches of 1024 need, so each run
reads it in several shuffled passes (duplicates across passes do not change the work of a
step).

The harness (``_harness``): the run refuses a busy machine unless ``--allow-busy``;
``--isa avx2`` limits the kernels to AVX2; every round is kept in
``benchmarks/results/gradcache_vs_cmnrl-<cpu class>.json`` with the machine. Speed ratios
are taken within each round and summarised by median and range; a peak-RSS difference is
claimed only when it exceeds the run-to-run spread (``_harness.difference``), "within
spread" otherwise.

Usage::

    .venv/bin/python -m benchmarks.gradcache_vs_cmnrl            # batch 1024: ~2.5 h on 2 cores
    .venv/bin/python -m benchmarks.gradcache_vs_cmnrl --rounds 1 --batch-size 64 --steps 2 --warmup 1 --allow-busy \
        --json /tmp/g.json   # smoke
"""

from __future__ import annotations

import argparse
import json
import random
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
    st_pair_throughput,
)
from benchmarks._harness import add_options, chosen, difference, forwarded, keep, start, summary_of, values
from benchmarks.report import gradcache_vs_cmnrl_table

VARIANTS = ("st-fp32", "kit-fp32", "st-bf16", "kit-auto")
# kit-auto with train.mmap_threshold_mib 2 (freed blocks of 2 MiB or more go back to the OS).
ABLATIONS = ("kit-auto-mmap2",)
# (simcse-kit, sentence-transformers) pairs whose speed and memory the summary compares.
PAIRS = (
    ("kit-auto", "st-fp32"),
    ("kit-auto", "st-bf16"),
    ("kit-fp32", "st-fp32"),
    ("kit-auto-mmap2", "st-bf16"),
    ("kit-auto-mmap2", "st-fp32"),
    ("kit-auto-mmap2", "kit-auto"),
)


def sentences_for(args: argparse.Namespace) -> list[str]:
    """Enough sentences for one epoch of the run: wiki1m_head in shuffled passes, the
    same list for every variant of a round (``--offset`` picks the round's shuffles)."""
    from simcse_kit.data.readers import read_sentences

    need = (args.warmup + args.steps + 3) * args.batch_size
    corpus = read_sentences(WIKI)
    out: list[str] = []
    passes = 0
    while len(out) < need:
        shuffled = corpus[:]
        random.Random(1000 * args.offset + passes).shuffle(shuffled)
        out += shuffled
        passes += 1
    return out[:need]


def worker_kit(args: argparse.Namespace, sents: list[str]) -> dict[str, Any]:
    from simcse_kit.training.loop import fit

    overrides = {
        "batch_size": args.batch_size,
        "grad_cache_chunk": args.chunk,
        "max_seq_len": args.max_seq_len,
        "mixed_precision": "auto" if args.precision == "auto" else "no",
        "mmap_threshold_mib": args.mmap_threshold_mib,
        "max_steps": args.warmup + args.steps + 2,
    }
    collator = TimedCollator(None, lambda b: (b["input_ids"].shape[0], b["input_ids"].numel()))
    run = kit_recipe_run("unsup", overrides, sents, timer=collator)
    fit(run, run.step, run.cfg.train)
    train = run.cfg.train
    precision = {
        "mixed_precision": train.mixed_precision,
        "bf16_weights": train.bf16_weights,
        "fast_dropout": train.fast_dropout,
        "reason": run.precision.reason if run.precision is not None else "set in the config",
        "mmap_threshold_mib": run.heap.mmap_threshold_mib,
    }
    return collator.rate(args.warmup, args.steps) | {"precision": precision}


def worker_st(args: argparse.Namespace, sents: list[str]) -> dict[str, Any]:
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    # scale = 1 / temperature 0.05; mini_batch_size in sequences of one column (see the docstring).
    rate = st_pair_throughput(
        args, sents, lambda model: CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=args.chunk)
    )
    precision = {
        "mixed_precision": "bf16" if args.precision == "bf16" else "no",
        "reason": "bf16=True" if args.precision == "bf16" else "its default (fp32)",
    }
    return rate | {"precision": precision}


def worker(args: argparse.Namespace) -> None:
    setup_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    framework, args.precision, *rest = args.worker.split("-")
    args.mmap_threshold_mib = int(rest[0].removeprefix("mmap")) if rest else None
    result = (worker_kit if framework == "kit" else worker_st)(args, sentences_for(args))
    emit(result | {"variant": args.worker, "peak_rss_mib": peak_rss_mib()})


def summarise(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, dict[str, Any]]:
    """Per variant: median and range of sentences/s and of peak RSS over the rounds."""
    summary = summary_of(runs, variants, ("sentences_per_s", "peak_rss_mib"))
    for v in variants:
        summary[v]["precision"] = values(runs, v, "precision")[-1]["reason"]
    return summary


def compare(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, dict[str, Any]]:
    """Per (simcse-kit, CachedMNRL) pair: the speed ratio paired by round, and the peak-RSS
    difference judged against the run-to-run spread."""
    out = {}
    for kit, st in PAIRS:
        if kit in variants and st in variants:
            rss = difference(values(runs, kit, "peak_rss_mib"), values(runs, st, "peak_rss_mib"))
            out[f"{kit}/{st}"] = {"speed_ratio": paired_ratios(runs, kit, st), "rss": rss}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps per variant per round")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--batch-size", type=int, default=1024, help="examples per step")
    parser.add_argument("--chunk", type=int, default=128, help="sequences per forward pass, both toolkits")
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS + ABLATIONS}")
    add_options(parser, "gradcache_vs_cmnrl")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    variants = chosen(parser, args.variants, VARIANTS + ABLATIONS)
    if args.chunk % 2:
        parser.error("--chunk must be even: simcse-kit's chunks hold whole examples (2 rows each)")
    env = start(args)
    common = forwarded(args, "steps", "warmup", "batch-size", "chunk", "max-seq-len", "threads")
    runs = run_rounds(Path(__file__), variants, common, args.rounds, args.threads, env=env)
    summary = summarise(runs, variants)
    comparisons = compare(runs, variants)
    out = keep("gradcache_vs_cmnrl", args, {"runs": runs, "summary": summary, "comparisons": comparisons})
    print(gradcache_vs_cmnrl_table([json.loads(out.read_text())]))  # the table BENCHMARKS.md's block will show


if __name__ == "__main__":
    main()
