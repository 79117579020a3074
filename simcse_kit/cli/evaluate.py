"""``simcse-kit evaluate``: the STS tables (SentEval files or the hub), or retrieval on
BEIR-format folders with ``--retrieval``; the library side is
:mod:`simcse_kit.evaluation.api`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simcse_kit.cli.options import (
    add_batch_size,
    add_data_options,
    add_device,
    add_json,
    add_model,
    add_trust,
    check_output,
    show,
)
from simcse_kit.config.recipes import find_recipe, senteval_dir
from simcse_kit.errors import ConfigError


def shared(args: argparse.Namespace) -> dict[str, Any]:
    """The options the STS and the retrieval evaluation both take: how to load and run the
    model, and where MTEB-format results go."""
    from simcse_kit.evaluation.api import Quantized

    keys = ("pooler", "batch_size", "precision", "device", "mteb_results", "truncate_dim", "trust_remote_code")
    quantized = Quantized(args.embedding_precision, args.calibration, args.rescore, args.batch_size)
    return {key: getattr(args, key) for key in keys} | {"quantized": quantized}


def cmd_evaluate(args: argparse.Namespace, extra: list[str]) -> int:
    if args.retrieval:
        return cmd_retrieval(args)
    from simcse_kit.evaluation import default_suite, evaluate_model, load_suite
    from simcse_kit.evaluation.hub import HUB_SUITE
    from simcse_kit.evaluation.tables import format_table, suite_columns

    hub = args.source == "hub"
    if hub and args.suite is not None:
        raise ConfigError("--suite selects SentEval-layout files; it does not apply to --source hub")
    if not hub and args.hub_root is not None:
        raise ConfigError("--hub-root only applies to --source hub")
    suite = None if args.suite is None else load_suite(find_recipe(args.suite, "evaluate"))
    known = suite or (HUB_SUITE if hub else default_suite())
    unknown = [t for t in args.tasks or () if t not in known]
    if unknown:
        raise ConfigError(f"--tasks: unknown task(s) {unknown}; choose from {list(known)}")
    data_dir = None if hub else senteval_dir(args.data_dir, args.data_root)  # hub tasks read no SentEval folder
    check_output(args.mteb_results, "--mteb-results", folder=True)
    check_output(args.json)
    results = evaluate_model(
        args.model, data_dir=data_dir, tasks=args.tasks, suite=suite, source=args.source, hub_root=args.hub_root, **shared(args)
    )
    show(format_table(results, suite_columns(args.tasks or list(known))), results, args.json)
    return 0


def cmd_retrieval(args: argparse.Namespace) -> int:
    """``evaluate --retrieval DIR ...``: one row per task folder."""
    from simcse_kit.evaluation import evaluate_retrieval
    from simcse_kit.evaluation.tables import RETRIEVAL_COLUMNS, format_rows

    sts_only = [f"--{k.replace('_', '-')}" for k in ("suite", "tasks", "hub_root") if getattr(args, k) is not None]
    if sts_only or args.source != "senteval":
        raise ConfigError(f"--retrieval evaluates BEIR folders; {sts_only or ['--source']} only apply to the STS tasks")
    check_output(args.json)
    results = evaluate_retrieval(args.model, args.retrieval, split=args.retrieval_split, index=args.index, **shared(args))
    tasks = [key for key in results if "/" not in key and key != "avg"]  # nDCG@10 under each task's name
    rows: list[dict[str, float | str]] = [
        {"task": name, **{m: results[f"{name}/{m}"] for m in RETRIEVAL_COLUMNS if m != "task"}} for name in tasks
    ]
    show(format_rows(rows, RETRIEVAL_COLUMNS), results, args.json)
    return 0


def add_vector_precision(p: argparse.ArgumentParser) -> None:
    """``--embedding-precision``, ``--calibration``, ``--rescore``: score quantized vectors."""
    from simcse_kit.evaluation.quantization import PRECISIONS

    p.add_argument(
        "--embedding-precision",
        choices=PRECISIONS,
        default="float32",
        help="score quantized vectors (sentence-transformers' quantize_embeddings): int8/uint8 codes by cosine, "
        "binary/ubinary codes by D - 2 x Hamming distance (retrieval: faiss IndexBinaryFlat); with --truncate-dim, "
        "the prefix is quantized",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="int8/uint8 ranges: a quantization.json, or sentences one a line to encode "
        "(default: the model folder's quantization.json, which an export ships)",
    )
    p.add_argument(
        "--rescore",
        type=int,
        default=0,
        metavar="K",
        help="with --retrieval and a binary precision: re-rank the K nearest by Hamming distance with the float query",
    )


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("evaluate", help="STS12-16, STS-B, SICK-R Spearman x 100 (SimCSE protocol)")
    add_model(
        p,
        "a simcse-kit run or model folder, a sentence-transformers folder, an HF folder, or 'all-MiniLM-L6-v2'",
        "pooler for a plain HF model (simcse-kit and ST folders record theirs)",
    )
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument(
        "--suite", default=None, help="YAML task table, or a built-in suite's name (default: the paper's 7, = the suite sts)"
    )
    p.add_argument(
        "--source",
        choices=("senteval", "hub"),
        default="senteval",
        help="senteval = the tokenised files in --data-dir; hub = MTEB's copies of the 7 tasks through 'datasets' "
        "(untokenised text; needs internet or --hub-root)",
    )
    p.add_argument("--hub-root", type=Path, default=None, help="with --source hub: a local folder of <dataset id>/ copies")
    p.add_argument("--mteb-results", type=Path, default=None, help="also write one MTEB-format JSON per task here")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of the suite's tasks (default: all)")
    p.add_argument(
        "--retrieval",
        action="append",
        type=Path,
        default=None,
        metavar="DIR",
        help="evaluate retrieval on this BEIR-format folder instead of STS (repeatable): nDCG@10, MRR@10, R@1/10/100, MAP@100",
    )
    p.add_argument("--retrieval-split", default="test", help="with --retrieval: the qrels split (qrels/SPLIT.tsv)")
    p.add_argument(
        "--truncate-dim", type=int, default=None, metavar="N", help="use the first N dimensions of each embedding (Matryoshka)"
    )
    p.add_argument(
        "--index", choices=("exact", "faiss"), default="exact", help="with --retrieval: exact chunked search, or a faiss index"
    )
    add_json(p)
    add_batch_size(p)
    p.add_argument(
        "--precision",
        choices=("no", "bf16", "fp16", "auto"),
        default="no",
        help="inference precision: no = fp32 (the default, so reported numbers do not depend on the CPU); "
        "auto = bf16 where this device computes it natively, else fp32",
    )
    add_device(p)
    add_vector_precision(p)
    add_trust(p)
    p.set_defaults(func=cmd_evaluate, extra_ok=False)
