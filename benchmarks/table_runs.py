"""The runs behind the quality tables (``domain.py``, ``mining.py``): jobs, workers, choices.

A *job* is one training run: a row of a table (a simcse-kit recipe with overrides, or a
sentence-transformers peer of it, or the untouched model) at one learning rate and one
seed, into its own folder. Jobs do not depend on each other, so :func:`execute` runs them
in this process (``--parallel 1``) or as N concurrent fresh interpreters
(``python -m benchmarks.table_runs --job FILE``; each logs to ``LOGS/<job>.log``; on CUDA
each trains on the GPU, on the CPU each with ``--threads`` threads). Either way the
results are then read back from the run folders by :func:`run_job`, which reuses a
finished run (the kit's ``run_seeds`` and ``st_peers.run_st`` already do), so a command
that was stopped continues where it was.

Also here: the learning rate chosen on dev (:func:`choose_learning_rate`, which never
sees a test score), the retrieval columns (nDCG@10 of the selected model of every run on
the built-in retrieval tasks, built from the data root into the output folder:
:func:`build_tasks`) and the untouched model's row (:func:`base_scores`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, machine, setup_run
from benchmarks.st_peers import dev_curve, retrieval_row, run_settings, run_st

LEARNING_RATES = "5e-6,1e-5,2e-5,3e-5,5e-5"
"""The sweep's default: the kit recipes' 3e-5, sentence-transformers' default 5e-5, and below."""
# The only keys the learning-rate choice reads. DEV_KEY holds each run's best dev score,
# whatever its dev split (the kit's best_dev_score; the name is the tables' own, kept so
# results written before still read).
DEV_KEY, TIE_KEY = "best_stsb_dev", "dev_trained"
BASE_MODEL = "all-MiniLM-L6-v2"

logger = logging.getLogger("table_runs")


@dataclasses.dataclass(frozen=True)
class Job:
    """One run, JSON-serialisable (a worker reads it from a file).

    Attributes:
        name: unique, used for the log file (``/`` becomes ``_``).
        kind: ``kit`` (a simcse-kit recipe), ``st`` (a sentence-transformers peer of the
            recipe, ``st_peers.py``) or ``base`` (the untouched default model).
        recipe: the recipe's YAML file (unused for ``base``).
        overrides: command-line style overrides of the recipe (``output_dir`` is set here).
        seed: the run's seed.
        out: the row's folder (the run goes to ``out/seed-N``; ``base``: ``out`` itself).
        model: the model ``base`` scores untouched (default: the default model; a teacher
            is scored the same way, as the ceiling of a distillation table).
        loss: the peer's loss (``st`` only).
        precision: the peer's precision, ``fp32`` or ``bf16`` (``st`` only).
        retrieval: BEIR folders scored on the selected model (not with ``dev_only``).
        dev_only: training and dev evaluations only (no final STS table, no retrieval).
        eval_data_dir: the STS folder of ``base``'s table.
    """

    name: str
    kind: str
    recipe: str = ""
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    seed: int = 0
    out: str = ""
    model: str = BASE_MODEL
    loss: str = ""
    precision: str = ""
    retrieval: tuple[str, ...] = ()
    dev_only: bool = False
    eval_data_dir: str = ""

    @classmethod
    def from_json(cls, text: str) -> Job:
        fields = json.loads(text)
        return cls(**fields | {"retrieval": tuple(fields.get("retrieval", ()))})


def lr_tag(lr: float) -> str:
    """A learning rate as a folder name: ``lr3e-05``."""
    return f"lr{lr:.0e}"


def choose_learning_rate(sweep: Mapping[float, Sequence[Mapping[str, float]]]) -> float:
    """The learning rate whose runs have the best mean dev score of the selected model.

    Args:
        sweep: learning rate -> its runs' tables (one per seed); only ``best_stsb_dev``
            (the dev score checkpoint selection kept, the untouched model at step 0
            included) and, for ties, ``dev_trained`` (the best trained checkpoint's dev
            score) are read: never a test column.

    Returns:
        The best learning rate; a tie on the first key (every rate keeping the untouched
        model, as on SICK) goes to the better trained checkpoint, then to the earlier rate.
    """
    if not sweep:
        raise ValueError("no learning rate to choose from")

    def mean(runs: Sequence[Mapping[str, float]], key: str) -> float:
        values = [float(run[key]) for run in runs if key in run]
        return sum(values) / len(values) if values else float("-inf")

    order = list(sweep)
    return max(order, key=lambda lr: (mean(sweep[lr], DEV_KEY), mean(sweep[lr], TIE_KEY), -order.index(lr)))


def build_tasks(out: Path, data_root: Path, names: Sequence[str], train_files: Sequence[str]) -> list[str]:
    """The built-in retrieval tasks ``names`` built from ``data_root`` into ``out``
    (deterministic: the same data give the same files); their folders.

    Raises:
        ValueError: a task built from SNLI while a run trains on ``snli_triplets.csv``
            (built from SNLI's dev and test files: it would be scored on its own training data).
    """
    from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks

    if any("snli" in Path(f).name.lower() for f in train_files) and any("snli" in n.lower() for n in names):
        raise ValueError(f"retrieval tasks {list(names)}: never evaluate on SNLI with a model trained on snli_triplets.csv")
    if not names:
        return []
    return [str(p) for p in build_retrieval_tasks(out, data_root, names).values()]


def score_retrieval(model: str | Path, tasks: Sequence[str], max_seq_len: int, cache: Path) -> dict[str, float]:
    """:func:`retrieval_row` of ``model`` (a kit run's ``best_model`` or the base model),
    on CUDA when there is one; cached in ``cache`` with the tasks it was scored on."""
    from simcse_kit.devices import resolve_device
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator
    from simcse_kit.fileio import write_json_atomic
    from simcse_kit.inference import load_encoder

    names = [Path(t).name for t in tasks]
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    if saved.get("tasks") == names and saved.get("max_seq_len") == max_seq_len:
        return saved["row"]
    device = str(resolve_device("auto"))
    encoder = load_encoder(str(model), max_seq_len=max_seq_len, device=device)
    evaluator = RetrievalEvaluator(tasks, device=device, prompts=encoder.prompts)
    row = retrieval_row(evaluator(encoder.encode), tasks)
    write_json_atomic(cache, {"tasks": names, "max_seq_len": max_seq_len, "row": row})
    return row


def table_job(
    name: str,
    lr: float,
    seed: int,
    sweep: bool,
    args: argparse.Namespace,
    recipe: Path,
    overrides: dict[str, str],
    peer: str = "",
) -> Job:
    """The run of table row ``name`` at learning rate ``lr`` and ``seed``: a dev-only sweep
    run (under ``OUTPUT_DIR/sweep``, no retrieval) or a table run (scored on ``args.tasks``).

    Args:
        recipe: the row's recipe.
        overrides: its complete overrides (budget, data root, learning rate).
        peer: a sentence-transformers loss (``st_peers.py``; the peer runs in
            ``args.st_precision``), or empty for the kit recipe itself.
    """
    sweep_dir = "sweep" if sweep else ""
    return Job(
        name=str(Path(sweep_dir, name, lr_tag(lr), f"seed-{seed}")),
        kind="st" if peer else "kit",
        recipe=str(recipe),
        overrides=overrides,
        seed=seed,
        out=str(args.output_dir / sweep_dir / name / lr_tag(lr)),
        loss=peer,
        precision=args.st_precision if peer else "",
        retrieval=() if sweep else tuple(args.tasks),
        dev_only=sweep,
    )


def base_scores(job: Job) -> dict[str, float]:
    """The untouched ``job.model``: its STS table on ``job.eval_data_dir`` and its retrieval
    row, cached in ``job.out/metrics.json`` (recomputed when the model, folder or tasks change)."""
    from simcse_kit.devices import resolve_device
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.fileio import write_json_atomic
    from simcse_kit.inference import load_encoder

    out = Path(job.out)
    done = out / "metrics.json"
    saved = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {}
    if saved.get("eval_data_dir") != job.eval_data_dir or saved.get("model", BASE_MODEL) != job.model or "sts" not in saved:
        encoder = load_encoder(job.model, device=str(resolve_device("auto")))
        sts = STSEvaluator(job.eval_data_dir)(encoder.encode)
        saved = {"sts": sts, "eval_data_dir": job.eval_data_dir, "model": job.model}
        write_json_atomic(done, saved)
    row = dict(saved["sts"])
    if job.retrieval:
        row |= score_retrieval(job.model, job.retrieval, 256, out / "retrieval.json")
    return row


def kit_config(job: Job) -> Any:
    from simcse_kit.config import load_config

    extra = {"final_eval": "false"} if job.dev_only else {}
    return load_config(job.recipe, job.overrides | extra | {"output_dir": job.out})


PRECISION_KEYS = ("mixed_precision", "bf16_weights", "fast_dropout")


def check_same_run(cfg: Any, folder: Path) -> None:
    """Refuse a finished run in ``folder`` made with another config than ``cfg``.

    As ``simcse_kit.experiments.run_seeds`` does, except that an ``auto`` precision setting
    matches whatever the run decided: on a CPU the decision comes from a short bf16 probe,
    which another process on a busy machine may decide the other way.

    Raises:
        ConfigError: a setting that changes what is computed differs.
    """
    from simcse_kit.config import load_config
    from simcse_kit.errors import ConfigError
    from simcse_kit.run_folder import config_differences

    auto = {f"train.{k}" for k in PRECISION_KEYS if getattr(cfg.train, k) == "auto"}
    saved = load_config(folder / "config.yaml")
    diffs = [d for d in config_differences(saved, dataclasses.replace(cfg)) if d.split(":")[0] not in auto | {"train.seed"}]
    if saved.train.seed != int(folder.name.removeprefix("seed-")):
        diffs.append(f"train.seed: {saved.train.seed} in {folder.name}")
    if diffs:
        raise ConfigError(
            f"{folder} holds a finished run with another config ({'; '.join(diffs)}); remove it or use another --output-dir"
        )
    logger.info("reusing the finished run in %s", folder)


def run_job(job: Job) -> dict[str, float]:
    """Run ``job`` (or reuse its finished run); its table: the STS columns (not with
    ``dev_only``), ``best_stsb_dev``, ``best_step``, the dev curve and the retrieval row."""
    if job.kind == "base":
        return base_scores(job)
    if job.kind == "st":
        from simcse_kit.config import load_config

        cfg = load_config(job.recipe, job.overrides | {"output_dir": job.out})
        runs = run_st(cfg, [job.seed], job.loss, job.precision, Path(job.out), retrieval=job.retrieval, dev_only=job.dev_only)
        return runs[job.seed]
    if job.kind != "kit":
        raise ValueError(f"unknown job kind {job.kind!r}")
    from simcse_kit.experiments import run_seeds

    cfg = kit_config(job)
    folder = Path(job.out) / f"seed-{job.seed}"
    if (folder / "metrics.json").is_file():
        check_same_run(cfg, folder)
    else:
        if folder.is_dir():
            # A run stopped part-way (a time limit): the kit refuses to write over it; start it afresh.
            logger.warning("removing the unfinished run in %s", folder)
            shutil.rmtree(folder)
        run_seeds(cfg, [job.seed])
    from simcse_kit.selection import dev_selection

    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    best = dev_selection(metrics).best  # the run's dev metric (older folders: best_stsb_dev)
    row = {**metrics.get("sts", {}), DEV_KEY: float("nan") if best is None else best, "best_step": float(metrics["best_step"])}
    row["train_seconds"] = float(metrics["train_seconds"])
    row |= dev_curve(metrics)
    if job.retrieval and not job.dev_only:
        row |= score_retrieval(folder / "best_model", job.retrieval, cfg.model.eval_max_seq_len, folder / "retrieval.json")
    return row


def finished(job: Job) -> bool:
    """Whether ``job``'s run is done (a worker would only read it back): no fresh
    interpreter is started for it."""
    out = Path(job.out)
    if job.kind == "base":
        return (out / "metrics.json").is_file() and (not job.retrieval or (out / "retrieval.json").is_file())
    done = out / f"seed-{job.seed}" / "metrics.json"
    if not done.is_file():
        return False
    if job.kind == "st":
        from simcse_kit.config import load_config

        cfg = load_config(job.recipe, job.overrides | {"output_dir": job.out})
        saved = json.loads(done.read_text(encoding="utf-8")).get("settings")
        return saved == run_settings(cfg, job.loss, job.precision, job.retrieval, job.dev_only)
    return job.dev_only or not job.retrieval or (done.parent / "retrieval.json").is_file()


def log_name(job: Job) -> str:
    return job.name.replace("/", "_")


def execute(
    jobs: Sequence[Job], parallel: int, threads: int, logs: Path, keep_going: bool = False
) -> dict[str, dict[str, float]]:
    """Every job's table (:func:`run_job`), the runs made ``parallel`` at a time.

    With ``parallel`` > 1 each job runs in a fresh interpreter (its own Accelerate and CUDA
    state, ``threads`` threads) logging to ``logs/<job>.log``; then the tables are read back
    here from the run folders (every run finished: nothing trains twice). With
    ``keep_going`` a failed run is logged and left out of the tables (one chance on a lent
    machine: the other rows still come back).

    Raises:
        RuntimeError: a run failed, without ``keep_going`` (the message names its log).
    """
    failed: list[Job] = []
    if parallel > 1:
        logs.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}

        def work(job: Job) -> tuple[Job, int]:
            spec = logs / f"{log_name(job)}.json"
            spec.write_text(json.dumps(dataclasses.asdict(job)), encoding="utf-8")
            command = [sys.executable, "-m", "benchmarks.table_runs", "--job", str(spec), "--threads", str(threads)]
            with (logs / f"{log_name(job)}.log").open("w", encoding="utf-8") as log:
                status = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            logger.info("%s: %s", job.name, "done" if status == 0 else f"FAILED (status {status})")
            return job, status

        todo = [job for job in jobs if not finished(job)]
        logger.info("%d runs to make (%d finished), %d at a time", len(todo), len(jobs) - len(todo), parallel)
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            failed = [job for job, status in pool.map(work, todo) if status != 0]
        if failed and not keep_going:
            names = ", ".join(str(logs / f"{log_name(j)}.log") for j in failed)
            raise RuntimeError(f"{len(failed)} of {len(todo)} runs failed; see {names}")
    tables = {}
    for job in (j for j in jobs if j not in failed):
        logger.info("=== %s", job.name)
        try:
            tables[job.name] = run_job(job)
        except Exception:
            if not keep_going:
                raise
            logger.exception("%s failed; left out of the table", job.name)
    return tables


@dataclasses.dataclass
class TableResults:
    """What :func:`sweep_and_run` made.

    Attributes:
        sweep: row -> learning rate -> the dev-only sweep run's table.
        chosen: row -> its learning rate, chosen on dev.
        rows: row -> seed -> the table at the chosen rate (rows whose runs all failed are absent).
        extra: job name -> table of the jobs run beside the rows (the untouched models).
        lost: the runs that failed (``keep_going``), by name.
    """

    sweep: dict[str, dict[float, dict[str, float]]]
    chosen: dict[str, float]
    rows: dict[str, dict[int, dict[str, float]]]
    extra: dict[str, dict[str, float]]
    lost: list[str]


def sweep_and_run(
    rows: Mapping[str, Callable[[float, int, bool], Job]],
    lrs: Sequence[float],
    args: argparse.Namespace,
    extra: Sequence[Job] = (),
) -> TableResults:
    """The protocol every quality table shares (issue 22): each row at each learning rate
    of ``lrs`` for one seed (``args.sweep_seed``), dev only; the rate chosen on dev
    (:func:`choose_learning_rate`); then each row over ``args.seeds`` at its rate, with
    the ``extra`` jobs. A single rate skips the sweep.

    Args:
        rows: row name -> ``job(lr, seed, sweep)``, the row's run at that rate and seed (a
            dev-only sweep run when ``sweep``).
        lrs: the learning rates.
        args: ``seeds``, ``sweep_seed``, ``parallel``, ``threads``, ``keep_going`` and
            ``output_dir`` (the logs go to ``output_dir/logs``).
        extra: jobs run once beside the rows' seeds (the untouched models).
    """
    logs = args.output_dir / "logs"
    sweep: dict[str, dict[float, dict[str, float]]] = {name: {} for name in rows}
    lost: list[str] = []
    if len(lrs) > 1:
        jobs = {(name, lr): job(lr, args.sweep_seed, True) for name, job in rows.items() for lr in lrs}
        tables = execute(list(jobs.values()), args.parallel, args.threads, logs, args.keep_going)
        for (name, lr), run in jobs.items():
            if run.name in tables:
                sweep[name][lr] = tables[run.name]
        lost += [f"sweep of {name}" for name, by_lr in sweep.items() if not by_lr]  # --keep-going: no run finished
    kept = {name: job for name, job in rows.items() if sweep[name] or len(lrs) == 1}
    chosen = {name: choose_learning_rate({lr: [t] for lr, t in sweep[name].items()}) if sweep[name] else lrs[0] for name in kept}
    # Seed by seed across the rows: a table cut short by a time limit has whole seeds of every row.
    jobs = {(name, seed): job(chosen[name], seed, False) for seed in args.seeds for name, job in kept.items()}
    tables = execute([*extra, *jobs.values()], args.parallel, args.threads, logs, args.keep_going)
    done = {name: {s: tables[jobs[name, s].name] for s in args.seeds if jobs[name, s].name in tables} for name in kept}
    lost += [j.name for j in [*extra, *jobs.values()] if j.name not in tables]
    return TableResults(
        sweep={name: sweep[name] for name in kept},
        chosen=chosen,
        rows={name: per_seed for name, per_seed in done.items() if per_seed},
        extra={j.name: tables[j.name] for j in extra if j.name in tables},
        lost=lost,
    )


def add_sweep_options(parser: argparse.ArgumentParser, learning_rates: str = LEARNING_RATES) -> None:
    """The options of a table built by :func:`sweep_and_run`: seeds, the learning-rate sweep,
    the run budget, the final STS folder and the peers' precision."""
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument(
        "--learning-rates",
        default=learning_rates,
        help="comma-separated; every row (kit and peers) is swept over them on dev, one seed, and its best kept",
    )
    parser.add_argument("--sweep-seed", type=int, default=1, help="the seed of the dev-only learning-rate sweep")
    parser.add_argument(
        "--steps", "--max-steps", type=int, default=None, help="max optimiser steps per run (default: the recipe's epoch)"
    )
    parser.add_argument("--eval-steps", type=int, default=25, help="dev every N steps (and at the end)")
    parser.add_argument(
        "--eval-data-dir", type=Path, default=None, help="STS folder of the final table (default: the recipe's; for smoke tests)"
    )
    parser.add_argument(
        "--st-precision",
        choices=("fp32", "bf16", "auto"),
        default="auto",
        help="sentence-transformers' training precision (auto: bf16=True on a GPU, fp32 (its default) on a CPU)",
    )


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """The options every table driver shares: data root, retrieval tasks, workers."""
    parser.add_argument(
        "--data-root", type=Path, default=None, help="the data folder (default: $SIMCSE_KIT_DATA, else ../shared/data)"
    )
    parser.add_argument(
        "--retrieval-tasks",
        nargs="+",
        default=None,
        help="built-in retrieval tasks scored on every selected model (default: all; none: skip)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at once, each in a fresh interpreter (1: in this one)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument("--keep-going", action="store_true", help="a failed run is left out of the table, not fatal")


def prepare_tables(args: argparse.Namespace, train_files: Sequence[str] = ()) -> None:
    """Resolve :func:`add_table_options`' options in place: ``args.data_root`` (also set as
    ``SIMCSE_KIT_DATA``, so the workers and every reader agree), ``args.output_dir``
    absolute, ``args.task_names`` and ``args.tasks`` (their folders, built under the output
    folder). ``train_files``: the data the runs train on, relative to the data root."""
    from simcse_kit.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from simcse_kit.recipes import DATA_ENV, data_root

    args.data_root = data_root(args.data_root)
    if args.data_root is None or not args.data_root.is_dir():
        raise SystemExit(f"no data root at {args.data_root}: pass --data-root DIR or set {DATA_ENV}")
    os.environ[DATA_ENV] = str(args.data_root)
    args.output_dir = args.output_dir.resolve()
    args.task_names = [] if args.retrieval_tasks == ["none"] else (args.retrieval_tasks or list(RETRIEVAL_TASKS))
    trained = [str(args.data_root / f) for f in train_files]
    args.tasks = build_tasks(args.output_dir / "retrieval-tasks", args.data_root, args.task_names, trained)


def retrieval_keys(stats: Mapping[str, Any]) -> list[str]:
    """The retrieval columns present in the rows' means (``retrieval:<task>``, ``retrieval:avg`` last)."""
    keys = dict.fromkeys(k for row in stats.values() for k in row["mean"] if k.startswith("retrieval:") and "/" not in k)
    return sorted(keys, key=lambda k: (k == "retrieval:avg", k))


def table_meta(args: argparse.Namespace) -> dict[str, Any]:
    """What a table's JSON records beside its results: the machine and the device, the
    data root, the seeds, the step cap and the retrieval tasks."""
    return {
        "machine": machine() | device_record(),
        "data_root": str(args.data_root),
        "seeds": args.seeds,
        "steps": args.steps,
        "retrieval_tasks": args.task_names,
    }


def device_record() -> dict[str, Any]:
    """The accelerator the runs used (the tables' JSON keeps it beside ``machine()``)."""
    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "torch_cuda": torch.version.cuda}
    return {"device": "cpu"}


def main() -> None:
    """A worker: run one job (``--job FILE``) in this fresh interpreter."""
    parser = argparse.ArgumentParser(description="run one job of a quality table (a worker of execute())")
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_run(args.threads)
    job = Job.from_json(args.job.read_text(encoding="utf-8"))
    logger.info("job %s", job)
    run_job(job)


if __name__ == "__main__":
    main()
