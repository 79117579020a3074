"""Compact vectors (issue 51): quality, size and search time of float32, int8, binary and
binary + rescoring, at the full dimension and at a Matryoshka prefix, for several models.

Each model (``--models NAME=PATH``; e.g. the base model, the main job read post hoc, the same
job trained with ``loss.quantization``; ``--seed`` labels the trained ones) is evaluated on:

* bytes per vector;
* the 7 STS tasks (Spearman x 100 and their average), each pair scored at the precision: the
  cosine of the float vectors, of the int8 codes, of the +-1 binary codes (``1 - 2 x Hamming /
  D``), and for binary + rescore the float vector of one sentence against the binary code of the
  other (the rescoring score, ``cos(q, sign(d))``), averaged over the two directions. int8
  ranges come from the model folder's ``quantization.json`` if it ships one, else from
  ``--calibration-lines`` sentences of the Wikipedia file (``docs/quantization.md``). The
  per-pair scores go to a sidecar (``<record>.npz``, :mod:`benchmarks.stats`): the report's
  intervals over seeds and pairs;
* nDCG@10 x 100 on the retrieval tasks the BM25 baseline keeps sound (``--retrieval-tasks``,
  default ``stsb-similar`` and ``sick-related``: BENCHMARKS.md, Retrieval), searched at the
  precision as ``simcse-kit evaluate --precision`` searches (binary + rescore: ``--rescore``
  Hamming candidates re-ranked by the float query);
* recall@10 against the model's own float32 top 10, ``--queries`` queries over ``--recall-corpus``
  documents (search at the precision as ``simcse-kit evaluate --precision`` does it);
* search time per 1,000 queries over ``--search-corpus`` vectors (100,000 by default; the first
  model's vectors: a flat index's time depends on the count and the dimension, not the model),
  ``--rounds`` rounds: faiss ``IndexFlatIP`` on floats, ``IndexScalarQuantizer`` (8-bit direct,
  signed) on int8 codes, ``IndexBinaryFlat`` on binary codes, and binary + rescoring of
  ``--rescore`` Hamming candidates by the float query.

Queries and documents are distinct sentences past the calibration lines: the Wikipedia file,
then SentEval's single-sentence transfer files (MR, CR, SUBJ, MPQA, SNLI, SST); never an STS
or SICK sentence. A run asking for more than there are stops and says how many there are.

The QAT job is the main job's recipe with ``--loss.quantization binary`` (docs/quantization.md).
``--train DIR`` trains both at ``--seed`` into ``DIR/main-<seed>`` and ``DIR/qat-<seed>`` (a finished run
there is reused) and compares them, after the ``--models`` given::

    python -m benchmarks.compact --seed 1 --train runs/compact --search-corpus 0

Each trained model's run carries the commit, clean-tree flag and CPU it was made at (``made_at.json``,
written as it starts); the record lists them, and the report marks a record whose models were made at
another commit or carry no stamp (a run trained by hand and named with ``--models``).

One record per invocation (machine, commit, clean-tree flag, threads, arguments, every figure)
goes to ``--json`` (default ``benchmarks/results/compact-<cpu class>-seed<seed>.json``, ``-base``
without ``--seed``). A smoke run: ``--recall-corpus 2000 --search-corpus 2000 --queries 100
--tasks STSBenchmark --json /tmp/c.json --allow-dirty``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import DATA, REPO, SOUND_TASKS, WIKI, cpu_class, cpu_flags, machine, refuse_dirty, save_results, setup_run
from benchmarks.quality import runs_stamps
from benchmarks.st_peers import make_once
from benchmarks.stats import save_rows

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "int8", "binary", "binary+rescore")
# SentEval's files of one sentence a line (SST's: "sentence<TAB>label"): the search corpus past Wikipedia's lines.
SENTENCE_FILES = (
    "MR/rt-polarity.pos", "MR/rt-polarity.neg", "CR/custrev.pos", "CR/custrev.neg", "SUBJ/subj.objective",
    "SUBJ/subj.subjective", "MPQA/mpqa.pos", "MPQA/mpqa.neg", "SNLI/s1.dev", "SNLI/s2.dev", "SNLI/s1.test",
    "SNLI/s2.test", "SST/binary/sentiment-train", "SST/binary/sentiment-dev", "SST/binary/sentiment-test",
)  # fmt: skip


RECIPE = REPO / "train" / "unsup.yaml"  # the main job
TRAINED = {"main": (), "qat": ("--loss.quantization", "binary")}  # --train: each model's overrides of the recipe


def train_models(out: Path, seed: int, threads: int) -> list[tuple[str, str]]:
    """The main job and its QAT twin (:data:`TRAINED`) at ``seed``, each trained in a fresh interpreter with
    ``threads`` threads into ``out/<name>-<seed>`` and stamped as it starts; a finished run there is reused (its stamp
    says where it was made), an unfinished one removed (the kit refuses to train into a folder that exists)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "SIMCSE_KIT_DATA": str(DATA)}
    specs = []
    for name, overrides in TRAINED.items():
        folder = out / f"{name}-{seed}"
        command = [sys.executable, "-m", "simcse_kit.cli", "train", str(RECIPE), "--seed", str(seed)]
        command += ["--output-dir", str(folder), *overrides]
        make_once(folder, functools.partial(subprocess.run, command, cwd=REPO, env=env, check=True))
        specs.append((name, str(folder)))
    return specs


def sentence_pool() -> Iterator[str]:
    """Distinct-to-be sentences in a fixed order: the Wikipedia file's lines, then :data:`SENTENCE_FILES`."""
    with WIKI.open(encoding="utf-8") as fh:
        yield from fh
    for name in SENTENCE_FILES:
        with (DATA / "senteval" / name).open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                yield line.split("\t", 1)[0]


def pool_lines(first: int, count: int) -> list[str]:
    """``count`` distinct sentences of :func:`sentence_pool` after its first ``first`` distinct ones.

    Raises:
        SystemExit: the pool has fewer than ``first + count``.
    """
    seen: dict[str, None] = {}
    for line in sentence_pool():
        if text := line.strip():
            seen.setdefault(text)
        if len(seen) >= first + count:
            return list(seen)[first : first + count]
    raise SystemExit(f"asked for {count} sentences past the first {first}; the pool has {len(seen)} distinct ones")


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


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine (0 for a zero row, as the STS evaluator's)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.einsum("ij,ij->i", a, b) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-8)


def pair_scores(a: np.ndarray, b: np.ndarray, precision: str, ranges: np.ndarray) -> np.ndarray:
    """The score of each pair ``(a[i], b[i])`` of float vectors at ``precision``."""
    from simcse_kit.evaluation.quantization import VectorPrecision

    kind = precision.split("+")[0]
    if kind == "float32":
        return cosines(a, b)
    codes = VectorPrecision(kind, ranges if kind == "int8" else None).scored
    if precision == "binary+rescore":  # the float query against the stored code, both ways round
        return (cosines(a, codes(b)) + cosines(codes(a), b)) / 2
    return cosines(codes(a), codes(b))


def sts_rows(sts: Any, vectors: Callable[[list[str]], np.ndarray], precision: str, ranges: np.ndarray) -> dict[str, np.ndarray]:
    """Task -> per-pair scores of its main figure (all subsets of an STS year, else test)."""
    from simcse_kit.evaluation.sts import main_split

    out = {}
    for task, spec in sts.specs.items():
        splits = sts.data[task]
        scored = {
            name: (pair_scores(vectors(p.sentences1), vectors(p.sentences2), precision, ranges), p.scores)
            for name, p in splits.items()
        }
        out[task] = main_split(spec, scored)[0]
    return out


def gold_of(sts: Any) -> dict[str, np.ndarray]:
    """Task -> gold scores of its main figure, in :func:`sts_rows`' order."""
    from simcse_kit.evaluation.sts import main_split

    def gold(task: str) -> np.ndarray:
        return main_split(sts.specs[task], {n: (p.scores, p.scores) for n, p in sts.data[task].items()})[1]

    return {task: gold(task) for task in sts.specs}


def searched(
    queries: np.ndarray, corpus: np.ndarray, precision: str, ranges: np.ndarray, rescore: int, timing: bool = False
) -> tuple[Callable[[], np.ndarray], np.ndarray]:
    """``(search, truth)``: a function returning the top-10 rows per query at ``precision`` (the
    index built beforehand, as from stored vectors), and the float32 top 10. int8: the cosine of
    the codes (recall, as ``evaluate``), or with ``timing`` faiss's 8-bit index of the codes."""
    import faiss

    from simcse_kit.evaluation.quantization import comparable, hamming_search, quantize, rescored_search

    def normalized(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), dtype=np.float32)

    dim = corpus.shape[1]
    exact = faiss.IndexFlatIP(dim)
    exact.add(normalized(corpus))
    truth = exact.search(normalized(queries), 10)[1]
    if precision == "float32":
        return (lambda: exact.search(normalized(queries), 10)[1]), truth
    if precision == "int8" and timing:  # the codes stored one byte each, scored by their inner product
        eight_bit = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit_direct_signed, faiss.METRIC_INNER_PRODUCT)
        eight_bit.add(quantize(corpus, "int8", ranges).astype(np.float32))
        q = quantize(queries, "int8", ranges).astype(np.float32)
        return (lambda: eight_bit.search(q, 10)[1]), truth
    if precision == "int8":  # the cosine of the codes, as evaluate's and mine's int8 search
        index = faiss.IndexFlatIP(dim)
        index.add(normalized(comparable(quantize(corpus, "int8", ranges), "int8", dim)))
        q = normalized(comparable(quantize(queries, "int8", ranges), "int8", dim))
        return (lambda: index.search(q, 10)[1]), truth
    codes = quantize(corpus, "ubinary")
    if precision == "binary":
        return (lambda: hamming_search(quantize(queries, "ubinary"), codes, 10)[1]), truth
    return (lambda: rescored_search(queries, codes, 10, rescore, dim)[1]), truth


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of the float top 10 found, x 100."""
    return 100 * float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found.tolist(), truth.tolist(), strict=True)]))


def timed(search: Callable[[], np.ndarray], rounds: int, queries: int) -> dict[str, Any]:
    """Seconds per 1,000 queries of each of ``rounds`` searches, and their median."""
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        search()
        seconds.append(1000 * (time.perf_counter() - start) / queries)
    return {"seconds_per_1000_queries": statistics.median(seconds), "rounds": seconds}


def model_ranges(path: str, encode: Callable[[list[str]], np.ndarray], lines: int) -> tuple[np.ndarray, str]:
    """int8 ranges: the folder's shipped ``quantization.json``, else calibrated on ``lines`` Wikipedia lines."""
    from simcse_kit.evaluation.quantization import QUANTIZATION_FILE, calibration_ranges, read_ranges

    shipped = Path(path) / QUANTIZATION_FILE
    if shipped.is_file():
        return read_ranges(shipped), "shipped"
    return calibration_ranges(encode(pool_lines(0, lines))), f"{lines} Wikipedia lines"


Rows = list[dict[str, Any]]
Pairs = dict[str, dict[str, np.ndarray]]  # row -> task -> per-pair scores


def evaluate_model(name: str, path: str, sts: Any, retrieval: Any, args: argparse.Namespace) -> tuple[Rows, Pairs, Any]:
    """Every (dimension, precision) row of one model, its per-pair STS scores by row, and its encode."""
    from simcse_kit.evaluation.quantization import VectorPrecision
    from simcse_kit.evaluation.sts import spearman100
    from simcse_kit.model.inference import load_encoder

    encode = memo_encode(load_encoder(path, device="cpu").encode, args.batch_size)
    ranges, calibration = model_ranges(path, encode, args.calibration_lines)
    # Queries and documents from past the calibration lines: none of them calibrated the ranges.
    vectors = encode(pool_lines(args.calibration_lines, args.queries + args.recall_corpus))
    queries, corpus = vectors[: args.queries], vectors[args.queries :]
    gold = gold_of(sts)
    full = vectors.shape[1]
    rows, pairs = [], {}
    for dim_name, precision in itertools.product(args.dims.split(","), PRECISIONS):
        dim = full if dim_name == "full" else int(dim_name)

        def prefix(sentences: list[str], dim: int = dim) -> np.ndarray:
            return encode(sentences)[:, :dim]

        per_pair = sts_rows(sts, prefix, precision, ranges[:, :dim])
        tasks = {t: spearman100(v, gold[t]) for t, v in per_pair.items()}
        pairs[f"{name} {dim} {precision}"] = per_pair
        search, truth = searched(queries[:, :dim], corpus[:, :dim], precision, ranges[:, :dim], args.rescore)
        kind = precision.split("+")[0]
        rescore = args.rescore if precision == "binary+rescore" else 0
        retrieval.vectors = VectorPrecision(kind, ranges[:, :dim] if kind == "int8" else None, rescore)
        ndcg = {t: v for t, v in retrieval(prefix).items() if "/" not in t}
        rows.append(
            {"model": name, "path": path, "seed": args.seed if name != "base" else None, "dim": dim, "precision": precision}
            | {"bytes_per_vector": {"float32": 4 * dim, "int8": dim}.get(kind, (dim + 7) // 8)}
            | {"sts_avg": float(np.mean(list(tasks.values()))), "sts": tasks}
            | {"retrieval_ndcg@10": ndcg}
            | {"recall@10_vs_float": recall(search(), truth), "recall_corpus": len(corpus), "queries": len(queries)}
            | {"int8_calibration": calibration}
        )
        row = rows[-1]
        print(f"{name} {dim} {precision}: STS avg {row['sts_avg']:.2f}, nDCG@10 {ndcg}, R@10 {row['recall@10_vs_float']:.2f}")
    return rows, pairs, encode


def search_times(encode: Callable[[list[str]], np.ndarray], path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Search time per 1,000 queries over ``--search-corpus`` vectors, each dimension and precision."""
    ranges, _ = model_ranges(path, encode, args.calibration_lines)
    vectors = encode(pool_lines(args.calibration_lines, args.queries + args.search_corpus))
    queries, corpus = vectors[: args.queries], vectors[args.queries :]
    out = []
    for dim_name, precision in itertools.product(args.dims.split(","), PRECISIONS):
        dim = vectors.shape[1] if dim_name == "full" else int(dim_name)
        search, _ = searched(queries[:, :dim], corpus[:, :dim], precision, ranges[:, :dim], args.rescore, timing=True)
        search()  # warm: the first call pays faiss's thread pool and page faults
        row = {"dim": dim, "precision": precision, "corpus": len(corpus), "queries": len(queries)}
        out.append(row | timed(search, args.rounds, len(queries)))
        print(f"search {dim} {precision}: {out[-1]['seconds_per_1000_queries']:.4f} s per 1k queries", flush=True)
    return out


class _NoRetrieval:
    """``--retrieval-tasks`` with none: no retrieval figures."""

    vectors: Any = None

    def __call__(self, encode: Any) -> dict[str, float]:
        return {}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=[], metavar="NAME=PATH", help="models to compare (a run, export or hub name)")
    p.add_argument("--seed", type=int, default=None, help="the training seed of the trained models (base has none)")
    p.add_argument("--train", type=Path, default=None, metavar="DIR", help="train main and qat at --seed into DIR first")
    p.add_argument("--dims", default="full,128", help="comma-separated: 'full' and Matryoshka prefix sizes")
    p.add_argument("--tasks", nargs="+", default=None, help="STS tasks (default: the 7)")
    p.add_argument("--queries", type=int, default=1000, help="queries searched")
    p.add_argument("--retrieval-tasks", nargs="*", default=list(SOUND_TASKS), help="built-in retrieval tasks (none: skip)")
    p.add_argument("--recall-corpus", type=int, default=10_000, help="documents of each model's recall@10")
    p.add_argument("--search-corpus", type=int, default=100_000, help="vectors the search is timed over (0: not timed)")
    p.add_argument("--search-only", action="store_true", help="only the search timing, on the first model's vectors")
    p.add_argument("--rounds", type=int, default=3, help="timed searches per row (the median is reported)")
    p.add_argument("--rescore", type=int, default=40, help="binary + rescore: Hamming candidates per query re-ranked")
    p.add_argument("--calibration-lines", type=int, default=10_000, help="int8 ranges where a model ships none")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--json", type=Path, default=None, help="where the record goes")
    p.add_argument("--allow-dirty", action="store_true", help="keep a record marked dirty (not evidence)")
    args = p.parse_args(argv)
    refuse_dirty(args.allow_dirty)
    setup_run(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)  # as torch's: the record's thread count is every library's
    given = [spec.split("=", 1) for spec in args.models]
    if any(len(spec) != 2 for spec in given):
        p.error("--models: give NAME=PATH pairs, e.g. base=all-MiniLM-L6-v2")
    specs = [(name, path) for name, path in given]
    if args.train is not None and args.seed is None:
        p.error("--train: give the --seed the models are trained at")
    if not specs and args.train is None:
        p.error("give --models NAME=PATH pairs, --train DIR, or both")
    from simcse_kit.config.recipes import senteval_dir
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator
    from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks

    if args.train is not None:
        specs += train_models(args.train, args.seed, args.threads)
    sts = STSEvaluator(senteval_dir(None, None), tasks=args.tasks, batch_size=args.batch_size)
    folders = build_retrieval_tasks(Path(tempfile.mkdtemp(prefix="compact-")), DATA, args.retrieval_tasks or [])
    retrieval = RetrievalEvaluator(list(folders.values()), batch_size=args.batch_size) if folders else _NoRetrieval()
    rows: list[dict[str, Any]] = []
    pairs: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    timing: list[dict[str, Any]] = []
    if args.search_only:  # the timing alone, on a quiet machine once the quality records are kept
        name, path = specs[0]
        from simcse_kit.model.inference import load_encoder

        timing = search_times(memo_encode(load_encoder(path, device="cpu").encode, args.batch_size), path, args)
    for i, (name, path) in enumerate([] if args.search_only else specs):
        model_rows, model_pairs, encode = evaluate_model(name, path, sts, retrieval, args)
        rows += model_rows
        pairs |= {row: {args.seed if name != "base" else 0: tasks} for row, tasks in model_pairs.items()}
        if i == 0 and args.search_corpus:
            timing = search_times(encode, path, args)
    _, flags = cpu_flags()
    tag = "search" if args.search_only else f"seed{args.seed}" if args.seed is not None else "base"
    out = args.json or REPO / "benchmarks" / "results" / f"compact-{cpu_class(flags)}-{tag}.json"
    record = {"machine": machine(), "args": vars(args), "rows": rows, "search": timing}
    # Where each trained model was made (a model without a stamp: "unknown"); the base is no run of ours.
    trained = {name: {args.seed or 0: Path(path)} for name, path in specs if name != "base"}
    record["runs_made_at"], record["runs_made_on"] = runs_stamps(trained) if not args.search_only else ({}, {})
    record["predictions"] = "per-pair STS scores of each row: the .npz of the same name beside this record"
    save_results(out, record, allow_dirty=args.allow_dirty)
    save_rows(out.with_suffix(".npz"), pairs, gold_of(sts))
    for row in rows:
        print(
            f"{row['model']:>6} {row['dim']:>4} {row['precision']:>15} {row['bytes_per_vector']:>5} B  "
            f"STS avg {row['sts_avg']:6.2f}  R@10 vs float {row['recall@10_vs_float']:6.2f}"
        )
    for row in timing:
        print(f"search {row['dim']:>4} {row['precision']:>15}: {row['seconds_per_1000_queries']:.4f} s per 1k queries")


if __name__ == "__main__":
    main()
