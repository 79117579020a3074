"""Distillation from a stronger teacher (issue 29): the table of gains a user can see.

Per domain (``--domains``: ``sick``, ``stsb``), rows:

* ``base``: the default model (all-MiniLM-L6-v2) untouched;
* ``teacher``: the teacher itself (``--teacher``, all-mpnet-base-v2: the ceiling);
* ``kit-unsup``: simcse-kit's unsupervised SimCSE on the same sentences (``train/domain/<d>.yaml``);
* ``kit-similarity``: ``train/teacher/<d>.yaml`` (the student's in-batch softmax matched to the teacher's);
* ``kit-embedding``: the same with ``loss.teacher_loss: embedding`` (MSE, PCA of the teacher to 384);
* ``kit-similarity+simcse``: ``loss.teacher_weight: 0.5`` (half distillation, half SimCSE);
* ``st-mse``: sentence-transformers' ``MSELoss`` distillation on the same sentences and budget
  (``st_peers.py``: PCA of the teacher's vectors to 384, its documented recipe; the same
  cached teacher vectors the kit rows learn from).

The protocol is the domain table's (``table_runs.sweep_and_run``): every trained row, kit or
peer, at each of ``--learning-rates`` for one seed, dev only; the rate with the best dev score
of the selected model (the untouched model, step 0, is a candidate) is chosen, never on test;
then the row runs ``--seeds`` at that rate. Columns: the domain's test score, the 7-task
average, the dev score of the selected model, the best step, nDCG@10 on the built-in retrieval
tasks and training seconds (without evaluations). Below each domain's table: the kit row
chosen on dev against the issue's goals (+1.0 over base, +0.5 over the peer, a 7-task average
of 80.0).

The teacher's vectors are encoded once per domain before any run starts (so parallel workers
never encode them twice) into ``--teacher-cache-dir`` (default: the kit's cache). A finished
run is reused, so the table can be built over several sessions; ``--parallel N`` makes N runs
at once (``--threads`` each), logs in ``OUTPUT_DIR/logs``; the table lands in
``OUTPUT_DIR/teacher.{md,json}``.

Usage::

    .venv/bin/python -m benchmarks.teacher --teacher /path/to/all-mpnet-base-v2 --parallel 2 --threads 1   # hours on 2 cores
    .venv/bin/python -m benchmarks.teacher --teacher DIR --domains stsb --seeds 1 --learning-rates 3e-5 --rows kit-similarity
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, setup_run
from benchmarks.domain import TARGET, domain_overrides, markdown, sweep_markdown
from benchmarks.st_peers import resolve_precision
from benchmarks.table_runs import (
    BASE_MODEL,
    Job,
    add_sweep_options,
    add_table_options,
    prepare_tables,
    sweep_and_run,
    table_job,
    table_meta,
)

logger = logging.getLogger("teacher")

KIT_ROWS: dict[str, tuple[str, dict[str, str]]] = {
    "kit-unsup": ("domain", {}),
    "kit-similarity": ("teacher", {}),
    "kit-embedding": ("teacher", {"teacher_loss": "embedding"}),
    "kit-similarity+simcse": ("teacher", {"teacher_weight": "0.5"}),
}
ROWS = ("base", "teacher", *KIT_ROWS, "st-mse")
LEARNING_RATES = "1e-5,3e-5,1e-4"
GOAL_AVG = 80.0  # issue 29: the student's 7-task average


def recipe(domain: str, kind: str) -> Path:
    return REPO / "train" / kind / f"{domain}.yaml"


def teacher_overrides(args: argparse.Namespace) -> dict[str, str]:
    opts = {"teacher": str(args.teacher)}
    if args.teacher_cache_dir is not None:
        opts["teacher_cache_dir"] = str(args.teacher_cache_dir)
    return opts


def row_job(domain: str, row: str, lr: float, seed: int, sweep: bool, args: argparse.Namespace) -> Job:
    """The run of ``row`` on ``domain`` at ``lr`` and ``seed`` (dev only in the sweep)."""
    peer = "mse" if row == "st-mse" else ""
    kind, overrides = ("teacher", {}) if peer else KIT_ROWS[row]
    overrides = overrides | (teacher_overrides(args) if kind == "teacher" else {}) | {"learning_rate": str(lr)}
    return table_job(f"{domain}-{row}", lr, seed, sweep, args, recipe(domain, kind), domain_overrides(overrides, args), peer)


def encode_teacher(domain: str, args: argparse.Namespace) -> None:
    """The teacher's vectors of ``domain``'s training sentences, into the cache (read back
    in a second when cached): before the workers start, so none encodes them twice."""
    from simcse_kit.config.run import load_config
    from simcse_kit.training.inputs import load_teacher, load_training_data

    cfg = load_config(recipe(domain, "teacher"), domain_overrides(teacher_overrides(args), args))
    load_teacher(cfg, load_training_data(cfg))


def goals(domain: str, stats: dict[str, Any]) -> str:
    """The 7-task average goal of the kit row chosen on dev (``markdown`` states the others)."""
    summary = stats.get(f"selection_{domain}")
    if not summary:
        return ""
    avg = stats[summary["best_on_dev"]]["mean"]["avg"]
    teacher = stats.get(f"{domain}-teacher")
    ceiling = f"; the teacher's own is {teacher['mean']['avg']:.2f}" if teacher else ""
    verdict = "meets" if avg >= GOAL_AVG else "does NOT meet"
    return f"{domain}: 7-task average of `{summary['best_on_dev']}` {avg:.2f} ({verdict} the {GOAL_AVG:.1f} goal{ceiling})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher: a sentence-transformers folder or hub id")
    parser.add_argument("--teacher-cache-dir", type=Path, default=None, help="where its vectors are cached (default: the kit's)")
    parser.add_argument("--domains", nargs="+", default=list(TARGET), choices=list(TARGET))
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    add_sweep_options(parser, LEARNING_RATES)
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "benchmarks" / "teacher")
    add_table_options(parser)
    args = parser.parse_args()
    setup_run(args.threads)

    from simcse_kit.training.experiments import parse_seeds, parse_values

    prepare_tables(args)
    args.seeds = parse_seeds(args.seeds)
    lrs = parse_values("learning rate", args.learning_rates)
    start = time.perf_counter()
    trained = [r for r in args.rows if r not in ("base", "teacher")]
    if any(r != "kit-unsup" for r in trained):
        for domain in args.domains:
            encode_teacher(domain, args)
    senteval = str(args.eval_data_dir or args.data_root / "senteval")
    tasks = tuple(args.tasks)
    untouched = {
        row: Job(name=row, kind="base", out=str(args.output_dir / row), model=model, retrieval=tasks, eval_data_dir=senteval)
        for row, model in (("base", BASE_MODEL), ("teacher", str(args.teacher)))
        if row in args.rows
    }
    rows = {f"{d}-{r}": functools.partial(row_job, d, r, args=args) for d in args.domains for r in trained}
    made = sweep_and_run(rows, lrs, args, list(untouched.values()))

    report, record = [], {}
    for domain in args.domains:
        table_rows = {f"{domain}-{row}": (domain, row, {0: made.extra[row]}) for row in untouched if row in made.extra}
        for name, per_seed in made.rows.items():
            if name.startswith(f"{domain}-"):
                table_rows[name] = (domain, "st" if name.endswith("st-mse") else "kit", per_seed)
        text, stats = markdown(table_rows, made.chosen)
        goal = goals(domain, stats)
        report.append(text + (f"\n{goal}" if goal else ""))
        record[domain] = stats
    if len(lrs) > 1:
        report.append(
            f"The learning-rate sweep (seed {args.sweep_seed}; dev of the selected model, in brackets of the best trained "
            "checkpoint):\n\n" + sweep_markdown(made.sweep, made.chosen)
        )
    if made.lost:
        report.append(f"Runs that FAILED, left out (logs in {args.output_dir / 'logs'}): {', '.join(made.lost)}")
    budget = f"steps={args.steps or 'one epoch'}, eval_steps={args.eval_steps}, st-mse in {resolve_precision(args.st_precision)}"
    header = (
        f"Teacher {args.teacher}; STS Spearman x 100 and nDCG@10 x 100 ({', '.join(args.task_names) or 'no task'}), "
        f"mean ± sample std over seeds {args.seeds} ({budget}); learning rates {[f'{lr:g}' for lr in lrs]} chosen on dev; "
        f"{time.perf_counter() - start:.0f} s"
    )
    text = "\n\n".join([header, *report])
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "teacher.md").write_text(text + "\n", encoding="utf-8")
    meta = table_meta(args) | {"teacher": str(args.teacher), "learning_rates": lrs, "chosen_learning_rates": made.chosen}
    meta["sweep"] = {name: {f"{lr:g}": t for lr, t in by_lr.items()} for name, by_lr in made.sweep.items()}
    (args.output_dir / "teacher.json").write_text(json.dumps(meta | {"results": record}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
