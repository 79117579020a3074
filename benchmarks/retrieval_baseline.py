"""Which built-in retrieval tasks measure something: BM25 against the untouched model, per task.

    python -m benchmarks.retrieval_baseline --threads 2

Builds the tasks (:mod:`simcse_kit.evaluation.retrieval_tasks`) from the shared data, scores
each with BM25 (:mod:`simcse_kit.evaluation.bm25`) and with the model (all-MiniLM-L6-v2,
exact search, fp32), and keeps a task as **sound** only where the model's nDCG@10 is at
least :data:`MARGIN` points above BM25's and the 95% interval of that difference (a paired
bootstrap over the queries, :func:`benchmarks.stats.mean_difference`) excludes 0; any
other task is a **smoke test**, on which no retrieval claim rests. The record goes to
``benchmarks/results/retrieval_baseline-cpu.json``; docs/retrieval.md quotes it.

``--also MODEL...`` scores more models on the same tasks (all-mpnet-base-v2, the distillation
recipes' teacher), each against BM25 and against ``--model``, with the same paired bootstrap; they
are shown beside the rule, never judged by it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import DATA, REPO, add_allow_dirty, machine, refuse_dirty, save_results, setup_run
from benchmarks.stats import mean_difference

MARGIN = 2.0
"""nDCG@10 points (x 100) the model must lead BM25 by, on top of an interval that excludes 0."""


def task_verdict(difference: float, low: float) -> str:
    """``sound`` where the model leads BM25 by :data:`MARGIN` points and the interval excludes 0, else ``smoke test``."""
    return "sound" if difference >= MARGIN and low > 0 else "smoke test"


def _scores(task: Any, run: Any) -> tuple[dict[str, float], dict[str, float]]:
    """``run``'s nDCG@10 x 100 per query id, and the mean of every metric x 100."""
    from simcse_kit.evaluation.retrieval import METRICS, retrieval_metrics

    per_query = retrieval_metrics(task.qrels, run, per_query=True)
    means = {m: 100 * float(np.mean([r[m] for r in per_query.values()])) for m in METRICS}
    return {q: 100 * r["ndcg@10"] for q, r in per_query.items()}, means


def _difference(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """mean(a) - mean(b) of per-query nDCG@10, paired over the queries (:func:`benchmarks.stats.mean_difference`)."""
    queries = sorted(a)
    interval = mean_difference(np.array([a[q] for q in queries]), np.array([b[q] for q in queries]))
    return {"ndcg@10": interval.difference, "low": interval.low, "high": interval.high, "replicates": interval.replicates}


def measure(model: str, data_root: Path, out: Path, also: Sequence[str] = ()) -> dict[str, Any]:
    """Each task's metrics for BM25 and the model, the per-query nDCG@10 difference and the verdict; for each
    of ``also``, its metrics and its differences from BM25 and from ``model`` (under ``also``, by folder name)."""
    from simcse_kit.evaluation.beir import read_beir
    from simcse_kit.evaluation.bm25 import bm25_run
    from simcse_kit.evaluation.retrieval import search_task
    from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks
    from simcse_kit.model.inference import load_encoder

    names = [Path(m).name for m in also]  # the record keys each by its folder name
    if clash := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"--also: several models in folders named {clash}; the record keys each model by its folder name")
    encoders = {name: load_encoder(name, device="cpu") for name in (model, *also)}
    tasks: dict[str, Any] = {}
    for name, folder in build_retrieval_tasks(out, data_root).items():
        task = read_beir(folder)
        runs = {"bm25": bm25_run(task), **{m: search_task(task, e.encode)[0] for m, e in encoders.items()}}
        scored = {side: _scores(task, run) for side, run in runs.items()}
        ndcg, means = {side: s[0] for side, s in scored.items()}, {side: s[1] for side, s in scored.items()}
        difference = _difference(ndcg[model], ndcg["bm25"])
        tasks[name] = {
            "documents": len(task.corpus), "queries": len(task.queries),
            "judgements": sum(len(d) for d in task.qrels.values()),
            "bm25": means["bm25"], "model": means[model],
            "difference": difference,
            "verdict": task_verdict(difference["ndcg@10"], difference["low"]),
            "also": {n: {**means[m], "minus_bm25": _difference(ndcg[m], ndcg["bm25"]),
                         "minus_model": _difference(ndcg[m], ndcg[model])} for n, m in zip(names, also, strict=True)},
        }  # fmt: skip
        print(f"{name}: BM25 {tasks[name]['bm25']['ndcg@10']:.2f}, model {tasks[name]['model']['ndcg@10']:.2f}, "
              f"{difference['ndcg@10']:+.2f} ({difference['low']:+.2f} to {difference['high']:+.2f}): "
              f"{tasks[name]['verdict']}", flush=True)  # fmt: skip
        for label, scores in tasks[name]["also"].items():
            print(f"  {label}: {scores['ndcg@10']:.2f}, minus the model {scores['minus_model']['ndcg@10']:+.2f}", flush=True)
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="the untouched model the rule judges tasks by")
    parser.add_argument("--also", nargs="*", default=[], metavar="MODEL", help="models scored beside it, not judged")
    parser.add_argument("--data-root", type=Path, default=DATA)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "retrieval_baseline-cpu.json")
    add_allow_dirty(parser)
    args = parser.parse_args()
    refuse_dirty(args.allow_dirty)
    setup_run(args.threads)
    with tempfile.TemporaryDirectory() as out:
        tasks = measure(args.model, args.data_root, Path(out), args.also)
    record = {
        "command": " ".join(["python -m benchmarks.retrieval_baseline", *sys.argv[1:]]),
        "machine": machine() | {"torch_threads": args.threads},
        "args": {"model": args.model, "also": [Path(m).name for m in args.also], "threads": args.threads, "margin": MARGIN},
        "tasks": tasks,
    }
    save_results(args.output, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
