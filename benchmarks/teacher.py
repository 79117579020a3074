"""Distillation from a stronger teacher (issue 29): the table of gains a user can see.

Per domain (``--domains``: ``sick``, ``stsb``, ``general``), rows:

* ``base``: the default model (all-MiniLM-L6-v2) untouched;
* ``teacher``: the teacher itself (``--teacher``, all-mpnet-base-v2: the ceiling);
* ``kit-unsup``: simcse-kit's unsupervised SimCSE on the same sentences (``train/domain/<d>.yaml``;
  ``train/unsup.yaml`` for ``general``);
* ``kit-similarity``: ``train/teacher/<d>.yaml`` (the student's in-batch softmax matched to the teacher's);
* ``kit-embedding``: the same with ``loss.teacher_loss: embedding`` (MSE, PCA of the teacher to 384);
* ``kit-similarity+simcse``: ``loss.teacher_weight: 0.5``;
* ``st-mse``: sentence-transformers' ``MSELoss`` distillation on the same sentences and budget
  (``st_peers.py --losses mse``: PCA of the teacher's vectors to 384, its documented recipe).

Every trained row runs each learning rate of ``--lrs`` for every seed of ``--seeds`` with the same
dev selection (the untouched model, step 0, included); the row reports the learning rate with the
best mean dev score, chosen on dev and never on test. Columns: the domain's test score, the 7-task
average, the dev score, training seconds. Runs land in ``OUTPUT_DIR/<domain>/<row>/lr<lr>/seed-N``
and a finished seed is reused, so the table can be built over several sessions.

Usage::

    .venv/bin/python -m benchmarks.teacher --teacher /path/to/all-mpnet-base-v2          # hours on 2 cores
    .venv/bin/python -m benchmarks.teacher --teacher DIR --domains stsb --seeds 1 --lrs 3e-5 --rows kit-similarity
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from benchmarks._common import DATA, REPO, machine, setup_run
from benchmarks.domain import TARGET
from benchmarks.st_peers import run_st

logger = logging.getLogger("teacher")

TARGETS = TARGET | {"general": "STSBenchmark"}
KIT_ROWS: dict[str, tuple[str, dict[str, str]]] = {
    "kit-unsup": ("domain", {}),
    "kit-similarity": ("teacher", {}),
    "kit-embedding": ("teacher", {"teacher_loss": "embedding"}),
    "kit-similarity+simcse": ("teacher", {"teacher_weight": "0.5"}),
}
ROWS = ("base", "teacher", *KIT_ROWS, "st-mse")


def recipe(domain: str, kind: str) -> Path:
    if domain == "general":
        return REPO / "train" / ("unsup.yaml" if kind == "domain" else "teacher/general.yaml")
    return REPO / "train" / kind / f"{domain}.yaml"


def config(domain: str, kind: str, overrides: dict[str, str], lr: str, args: argparse.Namespace, out: Path) -> Any:
    from simcse_kit.config import load_config

    opts = overrides | {"output_dir": str(out), "learning_rate": lr, "progress_bar": "false", "teacher": args.teacher}
    if kind == "domain":
        opts.pop("teacher")
    if args.teacher_cache_dir is not None and kind == "teacher":
        opts["teacher_cache_dir"] = str(args.teacher_cache_dir)
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    return load_config(recipe(domain, kind), opts)


def per_seed_tables(out: Path, seeds: list[int]) -> dict[int, dict[str, float]]:
    tables = {}
    for seed in seeds:
        metrics = json.loads((out / f"seed-{seed}" / "metrics.json").read_text(encoding="utf-8"))
        tables[seed] = {**metrics["sts"], "best_stsb_dev": metrics["best_stsb_dev"], "train_seconds": metrics["train_seconds"]}
    return tables


def run_row(domain: str, row: str, lr: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    from simcse_kit.experiments import run_seeds

    out = args.output_dir / domain / row / f"lr{lr}"
    if row == "st-mse":
        cfg = config(domain, "teacher", {}, lr, args, out)
        return run_st(cfg, args.seeds, "mse", "fp32", out)
    kind, overrides = KIT_ROWS[row]
    run_seeds(config(domain, kind, overrides, lr, args, out), args.seeds, quiet=True)
    return per_seed_tables(out, args.seeds)


def untrained(path: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """A model's 7-task table, scored once and kept in ``out/metrics.json``."""
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.fileio import write_json_atomic
    from simcse_kit.inference import load_encoder

    done = out / "metrics.json"
    if done.is_file():
        return json.loads(done.read_text())["sts"]
    sts = STSEvaluator(str(DATA / "senteval"))(load_encoder(path).encode)
    write_json_atomic(done, {"model": path, "sts": sts})
    return sts


def table(results: dict[str, dict[str, Any]], domain: str) -> str:
    from simcse_kit.experiments import aggregate

    target = TARGETS[domain]
    lines = [
        f"| {domain}: row | lr (chosen on dev) | seeds | {target} | 7-task avg | dev | train s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row, res in results.items():
        mean, std = aggregate(list(res["per_seed"].values()))
        n = len(res["per_seed"])

        def cell(key: str, mean: dict[str, float] = mean, std: dict[str, float] = std, n: int = n) -> str:
            if key not in mean:
                return "–"
            return f"{mean[key]:.2f} ± {std[key]:.2f}" if n > 1 else f"{mean[key]:.2f}"

        lines.append(
            f"| {row} | {res.get('lr', '–')} | {n} | {cell(target)} | {cell('avg')} | {cell('best_stsb_dev')} | "
            f"{cell('train_seconds')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher: a sentence-transformers folder or hub id")
    parser.add_argument("--teacher-cache-dir", type=Path, default=None)
    parser.add_argument("--domains", nargs="+", default=["sick", "stsb"], choices=sorted(TARGETS))
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--lrs", default="1e-5,3e-5,1e-4", help="learning rates every trained row is swept over (dev selects)")
    parser.add_argument("--steps", type=int, default=None, help="max optimiser steps per run (default: the recipe's epoch)")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "teacher")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    setup_run(args.threads)

    record: dict[str, Any] = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "domains": {}}
    report = []
    for domain in args.domains:
        results: dict[str, dict[str, Any]] = {}
        for row in args.rows:
            if row in ("base", "teacher"):
                path = "all-MiniLM-L6-v2" if row == "base" else args.teacher
                results[row] = {"per_seed": {0: untrained(path, args, args.output_dir / row)}}
                continue
            sweep = {lr: run_row(domain, row, lr, args) for lr in args.lrs.split(",")}
            dev = {lr: sum(t["best_stsb_dev"] for t in s.values()) / len(s) for lr, s in sweep.items()}
            best = max(dev, key=dev.get)
            results[row] = {"lr": best, "dev_by_lr": dev, "per_seed": sweep[best]}
            logger.info("%s %s: dev by learning rate %s -> %s", domain, row, dev, best)
        report.append(table(results, domain))
        record["domains"][domain] = results
    text = "\n\n".join(report)
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "teacher.md").write_text(text + "\n")
    (args.output_dir / "teacher.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
