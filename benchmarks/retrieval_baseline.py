"""Which built-in retrieval tasks measure something: BM25 against the untouched model, per task.

    python -m benchmarks.retrieval_baseline --threads 2

Builds the tasks (:mod:`simcse_kit.evaluation.retrieval_tasks`) from the shared data, scores
each with BM25 (:mod:`simcse_kit.evaluation.bm25`) and with the model (all-MiniLM-L6-v2,
exact search, fp32), and keeps a task as **sound** only where the model's nDCG@10 is at
least :data:`MARGIN` points above BM25's and the 95% interval of that difference (a paired
bootstrap over the queries, :func:`benchmarks.stats.mean_difference`) excludes 0; any
other task is a **smoke test**, on which no retrieval claim rests. The record goes to
``benchmarks/results/retrieval_baseline-cpu.json``; docs/retrieval.md quotes it.
"""

from __future__ import annotations

import argparse
import tempfile
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


def measure(model: str, data_root: Path, out: Path) -> dict[str, Any]:
    """Each task's metrics for BM25 and the model, the per-query nDCG@10 difference and the verdict."""
    from simcse_kit.evaluation.beir import read_beir
    from simcse_kit.evaluation.bm25 import bm25_run
    from simcse_kit.evaluation.retrieval import METRICS, retrieval_metrics, search_task
    from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks
    from simcse_kit.model.inference import load_encoder

    encoder = load_encoder(model, device="cpu")
    tasks: dict[str, Any] = {}
    for name, folder in build_retrieval_tasks(out, data_root).items():
        task = read_beir(folder)
        runs = {"bm25": bm25_run(task), "model": search_task(task, encoder.encode)[0]}
        per_query = {side: retrieval_metrics(task.qrels, run, per_query=True) for side, run in runs.items()}
        queries = sorted(per_query["model"])
        ndcg = {side: np.array([100 * per_query[side][q]["ndcg@10"] for q in queries]) for side in runs}
        interval = mean_difference(ndcg["model"], ndcg["bm25"])
        tasks[name] = {
            "documents": len(task.corpus), "queries": len(task.queries),
            "judgements": sum(len(d) for d in task.qrels.values()),
            **{side: {m: 100 * float(np.mean([r[m] for r in per_query[side].values()])) for m in METRICS} for side in runs},
            "difference": {"ndcg@10": interval.difference, "low": interval.low, "high": interval.high,
                           "replicates": interval.replicates},
            "verdict": task_verdict(interval.difference, interval.low),
        }  # fmt: skip
        print(f"{name}: BM25 {tasks[name]['bm25']['ndcg@10']:.2f}, model {tasks[name]['model']['ndcg@10']:.2f}, "
              f"{interval}: {tasks[name]['verdict']}", flush=True)  # fmt: skip
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--data-root", type=Path, default=DATA)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "retrieval_baseline-cpu.json")
    add_allow_dirty(parser)
    args = parser.parse_args()
    refuse_dirty(args.allow_dirty)
    setup_run(args.threads)
    with tempfile.TemporaryDirectory() as out:
        tasks = measure(args.model, args.data_root, Path(out))
    record = {
        "command": f"python -m benchmarks.retrieval_baseline --threads {args.threads}",
        "machine": machine() | {"torch_threads": args.threads},
        "args": {"model": args.model, "threads": args.threads, "margin": MARGIN},
        "tasks": tasks,
    }
    save_results(args.output, record, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
