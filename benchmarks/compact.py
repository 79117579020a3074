"""Compact vectors (issue 51): quality, size and search time of float32, int8, binary and
binary + rescoring, at the full dimension and at a Matryoshka prefix, for several models.

Each model (``--models NAME=PATH``; e.g. the base model, the main job read post hoc, the same
job trained with ``loss.quantization``) is evaluated on:

* bytes per vector;
* the 7 STS tasks (Spearman x 100, their average) on its vectors at each precision (int8: the
  cosine of the codes; binary: ``1 - 2 x Hamming / D``), int8 ranges from the model folder's
  ``quantization.json`` if it ships one, else from ``--calibration-lines`` sentences of the
  Wikipedia file (``docs/quantization.md``);
* search over ``--corpus`` Wikipedia sentences with ``--queries`` others as queries: seconds per
  1,000 queries (faiss ``IndexFlatIP`` on floats or int8 codes, ``IndexBinaryFlat`` on binary
  codes, and binary + rescoring of ``--rescore`` candidates by the float query), and recall@10
  against the exact float32 top 10.

The QAT job is trained with the recipe and ``--loss.quantization binary`` (docs/quantization.md)::

    simcse-kit train train/unsup.yaml --seed 1 --output-dir runs/compact/main-1
    simcse-kit train train/unsup.yaml --seed 1 --loss.quantization binary --output-dir runs/compact/qat-1
    python -m benchmarks.compact --models base=all-MiniLM-L6-v2 main=runs/compact/main-1 qat=runs/compact/qat-1

One record per invocation (machine, commit, clean-tree flag, threads, arguments, every figure)
goes to ``--json`` (default ``benchmarks/results/compact-<cpu class>.json``); run it once per seed
and keep each record. A smoke run: ``--corpus 2000 --queries 100 --tasks STSBenchmark``.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import REPO, WIKI, cpu_class, cpu_flags, machine, save_results, setup_run

PRECISIONS = ("float32", "int8", "binary", "binary+rescore")


def clean_tree() -> bool:
    """No uncommitted change to a tracked file: the commit in the record is what ran."""
    out = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=REPO, capture_output=True, text=True).stdout
    return not out.strip()


def wiki_lines(first: int, count: int) -> list[str]:
    """``count`` distinct lines of the Wikipedia file after the first ``first`` distinct ones."""
    seen: dict[str, None] = {}
    with WIKI.open(encoding="utf-8") as fh:
        for line in fh:
            text = line.strip()
            if text:
                seen.setdefault(text)
            if len(seen) >= first + count:
                break
    return list(seen)[first : first + count]


def memo_encode(encode: Callable[[list[str]], Any], batch_size: int) -> Callable[[list[str]], np.ndarray]:
    """``encode`` that computes each sentence once (every precision re-reads the same vectors)."""
    from simcse_kit.evaluation.encoding import encode_once

    cache: dict[str, np.ndarray] = {}

    def encode_cached(sentences: list[str]) -> np.ndarray:
        todo = [s for s in dict.fromkeys(sentences) if s not in cache]
        if todo:
            cache.update(zip(todo, encode_once(encode, todo, batch_size).vectors, strict=True))
        return np.stack([cache[s] for s in sentences])

    return encode_cached


def search_row(queries: np.ndarray, corpus: np.ndarray, precision: str, ranges: np.ndarray, rescore: int) -> dict[str, float]:
    """Seconds per 1,000 queries and recall@10 against the float top 10, for one precision."""
    import faiss

    from simcse_kit.evaluation.quantization import comparable, hamming_search, quantize, rescored_search

    def normalized(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), dtype=np.float32)

    exact = faiss.IndexFlatIP(corpus.shape[1])
    exact.add(normalized(corpus))
    truth = exact.search(normalized(queries), 10)[1]
    dim = corpus.shape[1]
    start = time.perf_counter()
    if precision in ("float32", "int8"):
        q, c = (
            (queries, corpus)
            if precision == "float32"
            else (comparable(quantize(x, "int8", ranges), "int8", dim) for x in (queries, corpus))
        )
        index = faiss.IndexFlatIP(dim)
        index.add(normalized(c))
        found = index.search(normalized(q), 10)[1]
    else:
        codes = quantize(corpus, "ubinary")
        start = time.perf_counter()  # the index is built from stored codes: not timed, as for floats below
        if precision == "binary":
            found = hamming_search(quantize(queries, "ubinary"), codes, 10)[1]
        else:
            found = rescored_search(queries, codes, 10, rescore, dim)[1]
    seconds = time.perf_counter() - start
    recall = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found.tolist(), truth.tolist(), strict=True)]))
    return {"seconds_per_1000_queries": 1000 * seconds / len(queries), "recall@10_vs_float": 100 * recall}


def evaluate_model(name: str, path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (dimension, precision) row of one model."""
    from simcse_kit.config.recipes import senteval_dir
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.evaluation.quantization import QUANTIZATION_FILE, VectorPrecision, calibration_ranges, read_ranges
    from simcse_kit.model.inference import load_encoder

    encoder = load_encoder(path, device="cpu")
    encode = memo_encode(encoder.encode, args.batch_size)
    shipped = Path(path) / QUANTIZATION_FILE
    calibration = "shipped" if shipped.is_file() else f"{args.calibration_lines} Wikipedia lines"
    ranges = read_ranges(shipped) if shipped.is_file() else calibration_ranges(encode(wiki_lines(0, args.calibration_lines)))
    # Queries and documents from past the calibration lines: none of them calibrated the ranges.
    texts = wiki_lines(args.calibration_lines, args.queries + args.corpus)
    vectors = encode(texts)
    queries, corpus = vectors[: args.queries], vectors[args.queries :]
    sts = STSEvaluator(senteval_dir(None, None), tasks=args.tasks, batch_size=args.batch_size)
    full = vectors.shape[1]
    rows = []
    for dim_name, precision in itertools.product(args.dims.split(","), PRECISIONS):
        dim = full if dim_name == "full" else int(dim_name)
        kind = precision.split("+")[0]
        vector_precision = VectorPrecision(kind, ranges[:, :dim] if kind == "int8" else None)

        def prefix(sentences: list[str], dim: int = dim) -> np.ndarray:
            return encode(sentences)[:, :dim]

        scores = sts(vector_precision.encode(prefix))
        tasks = {k: v for k, v in scores.items() if "/" not in k and k != "avg"}
        average = scores.get("avg", float(np.mean(list(tasks.values()))))  # a subset of the tasks has no "avg"
        size = {"float32": 4 * dim, "int8": dim}.get(kind, (dim + 7) // 8)
        search = search_row(queries[:, :dim], corpus[:, :dim], precision, ranges[:, :dim], args.rescore)
        rows.append(
            {"model": name, "path": path, "dim": dim, "precision": precision, "bytes_per_vector": size}
            | {"sts_avg": average, "sts": tasks}
            | search
            | {"int8_calibration": calibration, "corpus": len(corpus), "queries": len(queries)}
        )
        print(f"{name} {dim} {precision}: STS avg {average:.2f}, {search}", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models", nargs="+", required=True, metavar="NAME=PATH", help="models to compare (a run, export or hub name)"
    )
    p.add_argument("--dims", default="full,128", help="comma-separated: 'full' and Matryoshka prefix sizes")
    p.add_argument("--tasks", nargs="+", default=None, help="STS tasks (default: the 7)")
    p.add_argument("--corpus", type=int, default=100_000, help="documents searched")
    p.add_argument("--queries", type=int, default=1000, help="queries searched")
    p.add_argument("--rescore", type=int, default=40, help="binary + rescore: Hamming candidates per query re-ranked")
    p.add_argument("--calibration-lines", type=int, default=10_000, help="int8 ranges where a model ships none")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", type=Path, default=None, help="where the record goes")
    args = p.parse_args(argv)
    setup_run(args.threads)
    specs = [spec.split("=", 1) for spec in args.models]
    if any(len(spec) != 2 for spec in specs):
        p.error("--models: give NAME=PATH pairs, e.g. base=all-MiniLM-L6-v2")
    rows = [row for name, path in specs for row in evaluate_model(name, path, args)]
    _, flags = cpu_flags()
    out = args.json or REPO / "benchmarks" / "results" / f"compact-{cpu_class(flags)}.json"
    save_results(out, {"machine": machine() | {"clean_tree": clean_tree()}, "args": vars(args), "rows": rows})
    for row in rows:
        print(
            f"{row['model']:>10} {row['dim']:>4} {row['precision']:>15} {row['bytes_per_vector']:>6} B  "
            f"STS avg {row['sts_avg']:6.2f}  {row['seconds_per_1000_queries']:.4f} s/1k queries  "
            f"R@10 vs float {row['recall@10_vs_float']:6.2f}"
        )


if __name__ == "__main__":
    main()
