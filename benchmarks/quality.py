"""The quality tables (BENCHMARKS.md: quality, domain, mining, negatives, guide, multi, teacher scores,
distillation, scored pairs, LoRA), each a spec in :data:`TABLES`.

Each row (a recipe, or its sentence-transformers peer: ``st_peers.py``) runs every learning rate for one
seed, dev only; the best dev rate (never test) then runs ``--seeds``. Finished runs are reused.

    python -m benchmarks.quality domain --data-root DATA --parallel 10 --threads 1 --keep-going
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import REPO, add_allow_dirty, machine, refuse_dirty, save_results, setup_run
from benchmarks.st_peers import (
    MADE_AT,
    PREDICTIONS,
    TRANSFER_BATCHES,
    TRANSFER_NORMALIZE,
    dev_curve,
    make_once,
    resolve_precision,
    retrieval_row,
    run_settings,
    run_st,
    save_sts_pairs,
    settle_stamp,
    stamp_start,
    training_settings,
    transfer_owed,
    transfer_row,
)
from benchmarks.stats import save_rows
from simcse_kit.config.run import DEFAULT_MODEL
from simcse_kit.training.engine.selection import dev_selection

DEV_KEY, TIE_KEY = "best_stsb_dev", "dev_trained"  # the only keys the learning-rate choice reads
TARGET = {"sick": "SICKRelatedness", "stsb": "STSBenchmark", "": "STSBenchmark"}  # each domain's test column
SNLI = "train/snli_triplets.csv"
WIKI = "{data_root}/train/wiki1m_head.txt"  # resolved against the data root by load_config
logger = logging.getLogger("quality")


@dataclasses.dataclass(frozen=True)
class Row:
    """A table row: ``train/<recipe>.yaml`` (``{d}``: the domain) with ``overrides``, or a
    sentence-transformers ``peer`` of it; ``teacher``/``guide``: learns from ``--teacher`` / with ``--guide``
    vetting its negatives; ``mined``: trains on the SNLI pairs re-mined with that many negatives each
    (``first``: only each row's first of them); ``learning_rates``: its own sweep ("": the table's);
    ``datasets``: of a mixture recipe, only these datasets (empty: all)."""

    recipe: str
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    peer: str = ""
    teacher: bool = False
    mined: int = 0
    first: bool = False
    guide: bool = False
    learning_rates: str = ""
    datasets: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Table:
    """A quality table: its rows (``default`` run unless ``--rows``), the learning rates swept on
    dev, the domains (``""``: one table scored on STS-B) and the untouched models scored beside;
    ``scored``: its ``mined`` rows' negatives are scored by ``--teacher``."""

    rows: Mapping[str, Row]
    default: Sequence[str]
    learning_rates: str = "3e-5"
    domains: Sequence[str] = ("",)
    untouched: Sequence[str] = ("base",)
    trains_on: Sequence[str] = ()
    scored: bool = False


_QUEUE = {"queue_size": "160", "momentum": "0.995"}
_FN = {"mask_false_negatives": "true"}
_STS_ROWS = {"st-unsup": Row("unsup", peer="mnrl"), "st-hardneg": Row("hardneg", peer="mnrl")}
for _mode in ("unsup", "sup", "hardneg"):
    for _suffix, _extra in (("", {}), ("-fn", _FN), ("-queue", _QUEUE), ("-fn-queue", _FN | _QUEUE)):
        _STS_ROWS[f"kit-{_mode}{_suffix}"] = Row(_mode, _extra)
_STS_ROWS["kit-unsup-fp32"] = Row("unsup", {"mixed_precision": "no", "bf16_weights": "false"})
_DOMAIN_ROWS = {
    "domain": Row("domain/{d}"),
    "wiki": Row("domain/{d}", {"train_file": WIKI, "train_format": "auto"}),
    "domain-rep": Row("domain/{d}", {"word_repetition": "0.32"}),
    "mix50": Row("domain/{d}", {"mix_file": WIKI, "mix_ratio": "0.5"}),
    "tau0.1": Row("domain/{d}", {"temperature": "0.1"}),
    "fnt0.8": Row("domain/{d}", {"false_negative_threshold": "0.8"}),
    **{f"st-{loss}": Row("domain/{d}", peer=loss) for loss in ("mnrl", "tsdae", "ct")},
}
_TEACHER_ROWS = {
    "kit-unsup": Row("domain/{d}"),
    "kit-similarity": Row("teacher/{d}", teacher=True),
    "kit-embedding": Row("teacher/{d}", {"teacher_loss": "embedding"}, teacher=True),
    "kit-similarity+simcse": Row("teacher/{d}", {"teacher_weight": "0.5"}, teacher=True),
    "st-mse": Row("teacher/{d}", peer="mse", teacher=True),
}
# train/teacher/general.yaml (Wikipedia only: no STS or SICK file) beside sentence-transformers' distillation from
# the same teacher (MSELoss, the teacher's vectors reduced by PCA) on the same sentences, the same sweep for both.
_TEACHER_GENERAL_ROWS = {
    "kit-similarity": Row("teacher/general", teacher=True),
    "st-mse": Row("teacher/general", peer="mse", teacher=True),
}
_GUIDE_ROWS = {
    "kit-hardneg": Row("hardneg"),
    "kit-hardneg-guide": Row("hardneg", guide=True),
    "st-gist": Row("hardneg", peer="gist", guide=True),
}
_MINING_ROWS = {"sup": Row("sup"), "sup-4509": Row("sup", mined=1), "sup+mined": Row("hardneg", mined=1)}
# k = 1 and k = 3 on the same rows: those with three qualifying candidates, the k = 1 run on each one's first
_NEGATIVE_ROWS = {"hardneg-k1": Row("hardneg", mined=3, first=True), "hardneg-k3": Row("hardneg", mined=3)}
_MULTI_ROWS = {"kit-unsup": Row("unsup"), "kit-hardneg": Row("hardneg"), "kit-multi": Row("multi")}  # one dataset, four
# The four datasets with --teacher over all their sentences (train/teacher/*.yaml's similarity
# distillation at tau 0.5), alone and beside InfoNCE: `--rows kit-multi-teacher kit-multi-teacher+simcse`.
_TAUGHT = {"teacher_loss": "similarity", "teacher_temperature": "0.5", "teacher_student_temperature": "0.5"}
_MULTI_ROWS |= {
    f"kit-multi-teacher{suffix}": Row("multi", _TAUGHT | {"teacher_weight": weight}, teacher=True)
    for suffix, weight in (("", "1.0"), ("+simcse", "0.5"))
}
_TAUS = ("teacher_temperature", "teacher_student_temperature")
# Sharper teacher distributions: the same rows at a lower tau, the teacher's and the student's alike.
_MULTI_ROWS |= {
    f"kit-multi-teacher-t{tau}": Row("multi", _TAUGHT | {"teacher_weight": "1.0"} | dict.fromkeys(_TAUS, tau), teacher=True)
    for tau in ("0.1", "0.05")
}
# The tau-0.1 row on part of the mixture: which datasets the teacher should see (chosen on STS-B
# dev; train/teacher/multi.yaml ships the choice, Wikipedia and the STS-B training sentences).
_MULTI_ROWS |= {
    f"kit-multi-teacher-t0.1-{label}": dataclasses.replace(_MULTI_ROWS["kit-multi-teacher-t0.1"], datasets=keep)
    for label, keep in (
        ("no-sick", ("wiki", "snli", "stsb")),
        ("no-snli", ("wiki", "stsb", "sick")),
        ("wiki+stsb", ("wiki", "stsb")),
        ("wiki+snli", ("wiki", "snli")),
    )
}
# The general-purpose recipe on clean data (train/teacher/multi.yaml: Wikipedia and the SNLI triplets, no
# STS or SICK file) beside the sentence-transformers recipes on the same rows: distillation from the
# same teacher (MSELoss, the teacher's vectors reduced by PCA) and MNRL over both datasets.
_CLEAN = ("wiki", "snli")
_MULTI_ROWS |= {
    "st-mse-wiki+snli": Row("multi", peer="mse", teacher=True, datasets=_CLEAN),
    "st-mnrl-wiki+snli": Row("multi", peer="mnrl", datasets=_CLEAN),
}
# The same mined rows (3 negatives each, scored by --teacher) without and with their scores.
_SCORES_ROWS = {"hardneg-k3": Row("hardneg", mined=3)} | {
    f"{loss}{suffix}": Row("hardneg", {"distill": loss, "distill_weight": weight}, mined=3)
    for loss in ("kl", "margin_mse")
    for suffix, weight in (("", "1"), ("+infonce", "0.5"))
}
# STS-B train's scored pairs, each score loss by the kit and by the sentence-transformers trainer.
_SCORED_ROWS = {
    f"{side}-{loss}": Row("scored/stsb", {"score_loss": loss}, peer=loss if side == "st" else "")
    for loss in ("cosent", "angle")
    for side in ("kit", "st")
}
# The kit's rows in fp32, as the peer trains on a CPU (`--st-precision auto`): `--rows kit-cosent-fp32
# kit-angle-fp32`. Each precision gets the table's own rate sweep, as every peer row does.
_SCORED_ROWS |= {
    f"kit-{loss}-fp32": Row("scored/stsb", {"score_loss": loss, "mixed_precision": "no", "bf16_weights": "false"})
    for loss in ("cosent", "angle")
}
# LoRA (r 8, alpha 16, dropout 0.1: the kit's defaults; the peer gets the same LoraConfig) beside full
# fine-tuning at the recipes' rate; an adapter of 0.3% of the weights wants a larger rate: swept on dev.
_LORA_ROWS: dict[str, Row] = {}
for _mode in ("unsup", "hardneg"):
    for _lora, _extra, _rates in (("", {}, ""), ("lora-", {"lora_r": "8"}, "1e-4,3e-4,1e-3")):
        _LORA_ROWS[f"kit-{_lora}{_mode}"] = Row(_mode, _extra, learning_rates=_rates)
        _LORA_ROWS[f"st-{_lora}{_mode}"] = Row(_mode, _extra, peer="mnrl", learning_rates=_rates)
TABLES = {
    "sts": Table(_STS_ROWS, list(_STS_ROWS), trains_on=(SNLI,)),
    "domain": Table(_DOMAIN_ROWS, ["domain", "st-mnrl", "st-tsdae", "st-ct"], "5e-6,1e-5,2e-5,3e-5,5e-5", ("sick", "stsb")),
    "teacher": Table(_TEACHER_ROWS, list(_TEACHER_ROWS), "1e-5,3e-5,1e-4", ("sick", "stsb"), ("base", "teacher")),
    "teacher_general": Table(_TEACHER_GENERAL_ROWS, list(_TEACHER_GENERAL_ROWS), "1e-5,3e-5,1e-4", untouched=("base", "teacher")),
    "mining": Table(_MINING_ROWS | {"hardneg": Row("hardneg")}, ["sup", "sup-4509", "sup+mined", "hardneg"], trains_on=(SNLI,)),
    "negatives": Table(_NEGATIVE_ROWS, list(_NEGATIVE_ROWS), trains_on=(SNLI,)),
    "guide": Table(_GUIDE_ROWS, list(_GUIDE_ROWS), trains_on=(SNLI,)),
    "multi": Table(_MULTI_ROWS, ["kit-unsup", "kit-hardneg", "kit-multi"], trains_on=(SNLI,)),
    "scores": Table(_SCORES_ROWS, list(_SCORES_ROWS), untouched=("base", "teacher"), trains_on=(SNLI,), scored=True),
    "lora": Table(_LORA_ROWS, list(_LORA_ROWS), trains_on=(SNLI,)),
    "scored": Table(_SCORED_ROWS, ["kit-cosent", "st-cosent", "kit-angle", "st-angle"], "1e-5,2e-5,5e-5"),
}


@dataclasses.dataclass(frozen=True)
class Job:
    """One run, JSON-serialisable for a worker."""

    name: str
    kind: str
    recipe: str = ""
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    seed: int = 0
    out: str = ""
    model: str = DEFAULT_MODEL
    loss: str = ""
    precision: str = ""
    retrieval: tuple[str, ...] = ()
    dev_only: bool = False
    eval_data_dir: str = ""
    datasets: tuple[str, ...] = ()
    transfer: int = 0  # the SentEval transfer tasks' folds (0: not scored)

    @classmethod
    def from_json(cls, text: str) -> Job:
        fields = json.loads(text)
        return cls(**fields | {key: tuple(fields.get(key, ())) for key in ("retrieval", "datasets")})


def lr_tag(lr: float) -> str:
    return f"lr{lr:.0e}"


def choose_learning_rate(sweep: Mapping[float, Sequence[Mapping[str, float]]]) -> float:
    """The rate with the best mean ``best_stsb_dev``; ties: the better mean ``dev_trained``, then
    the earlier rate. Never a test column."""
    if not sweep:
        raise ValueError("no learning rate to choose from")

    def mean(runs: Sequence[Mapping[str, float]], key: str) -> float:
        values = [float(run[key]) for run in runs if key in run]
        return sum(values) / len(values) if values else float("-inf")

    order = list(sweep)
    return max(order, key=lambda lr: (mean(sweep[lr], DEV_KEY), mean(sweep[lr], TIE_KEY), -order.index(lr)))


def build_tasks(out: Path, data_root: Path, names: Sequence[str], train_files: Sequence[str]) -> list[str]:
    """The built-in retrieval tasks ``names`` built from ``data_root`` into ``out``; SNLI's refused
    when a run trains on ``snli_triplets.csv`` (built from SNLI's dev and test)."""
    from simcse_kit.evaluation.retrieval_tasks import build_retrieval_tasks

    if any("snli" in Path(f).name.lower() for f in train_files) and any("snli" in n.lower() for n in names):
        raise ValueError(f"retrieval tasks {list(names)}: never evaluate on SNLI with a model trained on snli_triplets.csv")
    return [str(p) for p in build_retrieval_tasks(out, data_root, names).values()] if names else []


def score_retrieval(model: str | Path, tasks: Sequence[str], max_seq_len: int, cache: Path) -> dict[str, float]:
    """:func:`st_peers.retrieval_row` of ``model``, cached in ``cache`` with the tasks it was scored on."""
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator
    from simcse_kit.files import write_json_atomic
    from simcse_kit.model.devices import resolve_device
    from simcse_kit.model.inference import load_encoder

    names = [Path(t).name for t in tasks]
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    if saved.get("tasks") == names and saved.get("max_seq_len") == max_seq_len:
        return saved["row"]
    device = str(resolve_device("auto"))
    encoder = load_encoder(str(model), max_seq_len=max_seq_len, device=device)
    row = retrieval_row(RetrievalEvaluator(tasks, device=device, prompts=encoder.prompts)(encoder.encode), tasks)
    write_json_atomic(cache, {"tasks": names, "max_seq_len": max_seq_len, "row": row})
    return row


def transfer_cache_key(model: str | Path, kfold: int) -> dict[str, Any]:
    """What a ``transfer.json`` holds its row for: the model, the folds and the probe's settings. The one source of
    what :func:`score_transfer` writes and :func:`cached_transfer` asks of a cache."""
    return {"kfold": kfold, "model": str(model), "normalize": TRANSFER_NORMALIZE, "batches": TRANSFER_BATCHES}


def score_transfer(model: str | Path, data_dir: str | Path, kfold: int, folder: Path) -> dict[str, float]:
    """:func:`st_peers.transfer_row` of ``model``, cached in ``folder/transfer.json`` with its folds."""
    from simcse_kit.files import write_json_atomic
    from simcse_kit.model.devices import resolve_device
    from simcse_kit.model.inference import load_encoder

    if (saved := cached_transfer(model, kfold, folder)) is not None:
        return saved
    row = transfer_row(load_encoder(str(model), device=str(resolve_device("auto"))).encode, str(data_dir), kfold)
    write_json_atomic(folder / "transfer.json", transfer_cache_key(model, kfold) | {"row": row})
    return row


def cached_transfer(model: str | Path, kfold: int, folder: Path) -> dict[str, float] | None:
    """The transfer row :func:`score_transfer` cached in ``folder`` for ``model`` at ``kfold`` folds, else None.

    A cache without ``normalize`` was probed on the raw vectors of a simcse-kit folder, before the probe took unit
    vectors for every model (:class:`~simcse_kit.evaluation.TransferEvaluator`), and one without ``batches`` on
    alphabetical batches (:data:`~benchmarks.st_peers.TRANSFER_BATCHES`): either is scored again."""
    cache = folder / "transfer.json"
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    # Each value of its own type too: a normalize of 1 is not True.
    fresh = all(type(saved.get(k)) is type(v) and saved.get(k) == v for k, v in transfer_cache_key(model, kfold).items())
    return saved["row"] if fresh else None


def base_scores(job: Job) -> dict[str, float]:
    """The untouched ``job.model``'s STS table and retrieval row, cached in ``job.out``."""
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.files import write_json_atomic
    from simcse_kit.model.devices import resolve_device
    from simcse_kit.model.inference import load_encoder

    out = Path(job.out)
    done = out / "metrics.json"
    saved = json.loads(done.read_text(encoding="utf-8")) if done.is_file() else {}
    fresh = saved.get("eval_data_dir") == job.eval_data_dir and saved.get("model") == job.model and "sts" in saved
    if not fresh or not (out / PREDICTIONS).is_file():
        stamp_start(out)
        evaluator = STSEvaluator(job.eval_data_dir)
        sts = evaluator(load_encoder(job.model, device=str(resolve_device("auto"))).encode)
        save_sts_pairs(out / PREDICTIONS, evaluator)
        saved = {"sts": sts, "eval_data_dir": job.eval_data_dir, "model": job.model}
        (out / MADE_AT).unlink(missing_ok=True)  # an earlier scoring's
        write_json_atomic(done, saved)
    settle_stamp(out)
    row = dict(saved["sts"])
    if job.retrieval:
        row |= score_retrieval(job.model, job.retrieval, 256, out / "retrieval.json")
    if job.transfer:
        row |= score_transfer(job.model, job.eval_data_dir, job.transfer, out)
    return row


def job_config(job: Job, extra: Mapping[str, str] | None = None) -> Any:
    """``job``'s recipe with its overrides (and ``extra``), keeping only its ``datasets`` of a mixture."""
    from simcse_kit.config.run import load_config

    cfg = load_config(job.recipe, job.overrides | dict(extra or {}))
    if job.datasets:
        have = [spec.name for spec in cfg.data.datasets or []]
        if not set(job.datasets) <= set(have):
            raise ValueError(f"{job.recipe}: datasets {sorted(set(job.datasets) - set(have))} not among {have}")
        cfg.data.datasets = [spec for spec in cfg.data.datasets or [] if spec.name in job.datasets]
    return cfg


def kit_config(job: Job) -> Any:
    extra = {"final_eval": "false"} if job.dev_only else {}
    return job_config(job, extra | {"output_dir": job.out})


PRECISION_KEYS = ("mixed_precision", "bf16_weights", "fast_dropout")


def check_same_run(cfg: Any, folder: Path) -> None:
    """Refuse a finished run in ``folder`` made with another config than ``cfg`` (an ``auto``
    precision key matches whatever the run decided from the hardware: another machine may differ)."""
    from simcse_kit.config.run import load_config
    from simcse_kit.errors import ConfigError
    from simcse_kit.training.wiring.folder import config_differences

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
    """Run ``job`` (or reuse its finished run); its table: STS columns, dev scores, best step, retrieval."""
    if job.kind == "base":
        return base_scores(job)
    if job.kind == "st":
        cfg = job_config(job, {"output_dir": job.out})
        runs = run_st(cfg, [job.seed], job.loss, job.precision, Path(job.out), retrieval=job.retrieval,
                      dev_only=job.dev_only, transfer=job.transfer)  # fmt: skip
        return runs[job.seed]
    if job.kind != "kit":
        raise ValueError(f"unknown job kind {job.kind!r}")
    from simcse_kit.training.wiring.experiments import run_seeds

    cfg = kit_config(job)
    folder = Path(job.out) / f"seed-{job.seed}"
    make_once(folder, lambda: run_seeds(cfg, [job.seed]), check=lambda: check_same_run(cfg, folder))
    done = folder / "metrics.json"
    metrics = json.loads(done.read_text(encoding="utf-8")) if job.dev_only else table_owed(folder, cfg)
    row = {
        **metrics.get("sts", {}),
        DEV_KEY: float(dev_selection(metrics).best or float("nan")),
        "best_step": float(metrics["best_step"]),
    }
    row |= {"train_seconds": float(metrics["train_seconds"])} | dev_curve(metrics)
    if "guide" in metrics:  # (anchor, candidate) entries the guide masked, over the run
        row["guide_masked"] = float(metrics["guide"]["masked"])
    if job.retrieval and not job.dev_only:
        row |= score_retrieval(folder / "best_model", job.retrieval, cfg.model.eval_max_seq_len, folder / "retrieval.json")
    if job.transfer and not job.dev_only and not takes_base_transfer(folder, cfg.model.name_or_path):
        row |= score_transfer(folder / "best_model", cfg.data.eval_data_dir, job.transfer, folder)
    if not job.dev_only and not (folder / PREDICTIONS).is_file():
        kit_sts_pairs(folder, cfg)
    return row


def kit_sts_pairs(folder: Path, cfg: Any) -> dict[str, float]:
    """The STS table of the kit run in ``folder``, its best model scored as the kit scores its final table
    (:func:`~simcse_kit.training.wiring.run.owed_table`), with the per-pair cosines saved beside it."""
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.training.wiring.run import EVAL_BATCH_SIZE, owed_table

    evaluator = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    table = owed_table(cfg, folder, evaluator)
    save_sts_pairs(folder / PREDICTIONS, evaluator)
    return table


def lacks_table(folder: Path, metrics: Mapping[str, Any] | None = None) -> bool:
    """Whether the kit run in ``folder`` (its ``metrics``, read if not given) finished training but not its final STS
    table (the kit's own check, :func:`~simcse_kit.training.wiring.folder.lacks_final_table`)."""
    from simcse_kit.training.wiring.folder import lacks_final_table

    if metrics is None:
        metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    return lacks_final_table(folder, metrics)


def table_owed(folder: Path, cfg: Any) -> dict[str, Any]:
    """The metrics of the finished kit run in ``folder``; where it stopped before its final STS table
    (:func:`lacks_table`), the table is scored from its best model, as the kit's message says, and written into its
    metrics.json with the per-pair cosines beside it."""
    from simcse_kit.files import write_json_atomic

    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    if lacks_table(folder, metrics):
        logger.info("%s: training finished without its final STS table; scoring its best model", folder)
        metrics["sts"] = kit_sts_pairs(folder, cfg)
        write_json_atomic(folder / "metrics.json", metrics)
    return metrics


def runs_stamps(folders: Mapping[str, Mapping[int, Path]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each row's commits and CPUs its runs were made at, from one read of their stamps. A commit is "unknown"
    for a run made before runs were stamped and ends "+dirty" for one from a dirty tree; a CPU is "unknown" for
    a run stamped before runs named their CPU. The report marks a record that reuses runs of another commit, or
    whose table was resumed on another machine."""
    commits, cpus = {}, {}
    for row, seeds in folders.items():
        stamps = [json.loads((f / MADE_AT).read_text(encoding="utf-8")) if (f / MADE_AT).is_file() else None
                  for f in seeds.values()]  # fmt: skip
        commits[row] = sorted({"unknown" if s is None else s["commit"] + ("+dirty" if s["dirty"] else "") for s in stamps})
        cpus[row] = sorted({(s or {}).get("cpu", "unknown") for s in stamps})
    return commits, cpus


# Sentences of every shape the probe meets (short, long, punctuation, digits): two models that embed them alike
# to fp32 rounding are one encoder (same weights, pooling and normalisation).
PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "the movie was n't worth the ticket , sadly .",
    "How many people live in Tokyo as of 2020?",
    "Revenue rose 4.5% in the third quarter, the company said on Tuesday, beating analysts' forecasts.",
)


def encodes_as(model: str | Path, base: str | Path, atol: float = 1e-4) -> bool:
    """Whether ``model`` embeds :data:`PROBE_SENTENCES` as ``base`` does, as the transfer probe reads them
    (unit vectors: :data:`TRANSFER_NORMALIZE`): a run that kept the untouched model (best step 0) saves
    the base's weights, yet a recipe may pool otherwise than the base model's own folder, and then its step-0
    model is another encoder."""
    import torch

    from simcse_kit.model.inference import load_encoder

    def vectors(m: str | Path) -> torch.Tensor:
        x = torch.as_tensor(load_encoder(str(m), device="cpu").encode(list(PROBE_SENTENCES)))
        return torch.nn.functional.normalize(x, dim=-1) if TRANSFER_NORMALIZE else x

    a, b = vectors(model), vectors(base)
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0)


def takes_base_transfer(folder: Path, base: str | Path) -> bool:
    """Whether the kit run in ``folder`` kept the untouched model as the same encoder (:func:`encodes_as`): it is
    not probed on the transfer tasks but takes the base's scores (:func:`fill_kept_base_transfer`)."""
    return kept_base(folder) and encodes_as(folder / "best_model", base)


def kept_base(folder: Path) -> bool:
    """Whether the run in ``folder`` kept the untouched model (best step 0): a peer's such run scores the
    base model's table and writes no ``predictions.npz`` of its own."""
    done = folder / "metrics.json"
    return done.is_file() and json.loads(done.read_text(encoding="utf-8")).get("best_step") == 0


def sidecar(
    folders: Mapping[str, Mapping[int, Path]], bases: Mapping[str, Path] | None = None
) -> tuple[dict[str, dict[int, dict[str, Any]]], dict[str, Any]]:
    """Each row's per-seed cosines and the gold, from the runs' ``predictions.npz``. A seed that kept the
    untouched model (:func:`kept_base`) takes the cosines of its row's base run in ``bases`` (the same
    weights); a row with any other seed without them is left out (its verdicts then say they have no
    interval)."""
    import numpy as np

    rows: dict[str, dict[int, dict[str, Any]]] = {}
    gold: dict[str, Any] = {}
    bases = bases or {}
    for row, seeds in folders.items():
        files, base = {}, bases.get(row)
        for seed, folder in seeds.items():
            if (folder / PREDICTIONS).is_file():
                files[seed] = folder / PREDICTIONS
            elif base is not None and kept_base(folder) and (base / PREDICTIONS).is_file():
                logger.info("%s seed %d kept the untouched model: its cosines are the base run's", row, seed)
                files[seed] = base / PREDICTIONS
        if len(files) < len(seeds):
            logger.warning("%s: a seed has no %s: no interval for this row", row, PREDICTIONS)
            continue
        for seed, path in files.items():
            with np.load(path) as data:
                rows.setdefault(row, {})[seed] = {k[4:]: data[k] for k in data.files if k.startswith("cos/")}
                gold |= {k[5:]: data[k] for k in data.files if k.startswith("gold/")}
    return rows, gold


def finished(job: Job) -> bool:
    """Whether ``job``'s run is done (no worker is started for it)."""
    out = Path(job.out)
    # A run whose transfer scores are still to compute is not finished: they are computed in a worker,
    # not one after another in this coordinating process (~15 min a model on one busy thread).
    if job.kind == "base":
        transferred = not job.transfer or cached_transfer(job.model, job.transfer, out) is not None
        return (out / "metrics.json").is_file() and (not job.retrieval or (out / "retrieval.json").is_file()) and transferred
    done = out / f"seed-{job.seed}" / "metrics.json"
    if not done.is_file():
        return False
    if job.kind == "st":
        cfg = job_config(job, {"output_dir": job.out})
        metrics = json.loads(done.read_text(encoding="utf-8"))
        if training_settings(metrics.get("settings")) != run_settings(cfg, job.loss, job.precision, job.retrieval, job.dev_only):
            return False
        # A seed that kept the untouched model takes the base's transfer scores (fill_kept_base_transfer); a trained
        # one whose scores are missing is scored in its worker, from its kept best weights.
        return not transfer_owed(metrics, job.transfer, job.dev_only)
    if job.dev_only:
        return True
    if lacks_table(done.parent):  # its worker scores the table
        return False
    transferred = (
        not job.transfer
        or cached_transfer(done.parent / "best_model", job.transfer, done.parent) is not None
        or takes_base_transfer(done.parent, job_config(job).model.name_or_path)
    )
    return (not job.retrieval or (done.parent / "retrieval.json").is_file()) and transferred


def log_name(job: Job) -> str:
    return job.name.replace("/", "_")


def execute(
    jobs: Sequence[Job], parallel: int, threads: int, logs: Path, keep_going: bool = False
) -> dict[str, dict[str, float]]:
    """Every job's table; with ``parallel`` > 1 the runs are made first in fresh interpreters
    (logs in ``logs``); ``keep_going``: a failed run is left out, not fatal."""
    failed: list[Job] = []
    if parallel > 1:
        logs.mkdir(parents=True, exist_ok=True)
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}

        def work(job: Job) -> tuple[Job, int]:
            spec = logs / f"{log_name(job)}.json"
            spec.write_text(json.dumps(dataclasses.asdict(job)), encoding="utf-8")
            command = [sys.executable, "-m", "benchmarks.quality", "worker", "--job", str(spec), "--threads", str(threads)]
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
        try:
            tables[job.name] = run_job(job)
        except Exception:
            if not keep_going:
                raise
            logger.exception("%s failed; left out of the table", job.name)
    return tables


@dataclasses.dataclass
class TableResults:
    """What :func:`sweep_and_run` made."""

    sweep: dict[str, dict[float, dict[str, float]]]
    chosen: dict[str, float]
    rows: dict[str, dict[int, dict[str, float]]]
    extra: dict[str, dict[str, float]]
    lost: list[str]


def sweep_and_run(
    rows: Mapping[str, Callable[[float, int, bool], Job]],
    lrs: Mapping[str, Sequence[float]],
    args: argparse.Namespace,
    extra: Sequence[Job] = (),
) -> TableResults:
    """Each row (``job(lr, seed, sweep)``) at each of its ``lrs`` for ``args.sweep_seed``, dev only
    (a row with one rate is not swept), then every seed at the rate chosen on dev."""
    logs = args.output_dir / "logs"
    sweep: dict[str, dict[float, dict[str, float]]] = {name: {} for name in rows}
    swept = [name for name in rows if len(lrs[name]) > 1]
    jobs = {(name, lr): rows[name](lr, args.sweep_seed, True) for name in swept for lr in lrs[name]}
    tables = execute(list(jobs.values()), args.parallel, args.threads, logs, args.keep_going) if jobs else {}
    for (name, lr), run in jobs.items():
        if run.name in tables:
            sweep[name][lr] = tables[run.name]
    lost = [f"sweep of {name}" for name in swept if not sweep[name]]
    kept = {name: job for name, job in rows.items() if sweep[name] or name not in swept}
    chosen = {
        name: choose_learning_rate({lr: [t] for lr, t in sweep[name].items()}) if sweep[name] else lrs[name][0] for name in kept
    }
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


def fill_kept_base_transfer(made: TableResults) -> None:
    """A seed that kept the untouched model (best step 0) is not scored on the transfer tasks (a peer's:
    ``st_peers.st_train``; a kit run's: :func:`run_job`, where :func:`encodes_as` finds it the base's
    encoder): it takes the untouched ``base``'s scores, the same encoder's."""
    base = {k: v for k, v in made.extra.get("base", {}).items() if k.startswith("transfer:")}
    for per_seed in made.rows.values():
        for row in per_seed.values():
            if base and row.get("best_step") == 0 and "transfer:avg" not in row:
                row |= base


# --------------------------------------------------------------------------- the tables' rows


def row_overrides(overrides: Mapping[str, str], args: argparse.Namespace) -> dict[str, str]:
    """``overrides`` with this command's budget, data root and STS folder."""
    opts = dict(overrides) | {"eval_steps": str(args.eval_steps), "progress_bar": "false", "data_root": str(args.data_root)}
    if args.model is not None:  # only when set: finished runs' configs stay equal
        opts["name_or_path"] = args.model
    if args.steps is not None:
        opts["max_steps"] = str(args.steps)
    if args.eval_data_dir is not None:  # only when set: finished runs' configs stay equal
        opts["eval_data_dir"] = str(args.eval_data_dir)
    return opts


def recipe_path(row: Row, domain: str) -> Path:
    return REPO / "train" / f"{row.recipe.format(d=domain)}.yaml"


def row_job(table: str, domain: str, name: str, lr: float, seed: int, sweep: bool, args: argparse.Namespace) -> Job:
    """The run of row ``name`` of ``table`` on ``domain`` at ``lr`` and ``seed``."""
    row = TABLES[table].rows[name]
    opts = dict(row.overrides) | {"learning_rate": str(lr)}
    if row.teacher:
        opts["teacher"] = str(args.teacher)
    if row.guide:
        opts["guide"] = str(args.guide)
    if (row.teacher or row.guide) and args.teacher_cache_dir is not None:
        opts["teacher_cache_dir"] = str(args.teacher_cache_dir)
    if row.mined:
        opts["train_file"] = str(args.mined[row.mined, row.first])
    label, sweep_dir = f"{domain}-{name}" if domain else name, "sweep" if sweep else ""
    return Job(
        name=str(Path(sweep_dir, label, lr_tag(lr), f"seed-{seed}")),
        kind="st" if row.peer else "kit",
        recipe=str(recipe_path(row, domain)),
        overrides=row_overrides(opts, args),
        seed=seed,
        out=str(args.output_dir / sweep_dir / label / lr_tag(lr)),
        loss=row.peer,
        precision=args.st_precision if row.peer else "",
        retrieval=() if sweep else tuple(args.tasks),
        dev_only=sweep,
        datasets=row.datasets,
        transfer=0 if sweep else args.transfer_kfold,
    )


def mined_file(out: Path, triplets: Path, k: int = 1, first: bool = False, teacher: str | None = None) -> Path:
    """``triplets`` without its contradictions, re-mined by ``simcse-kit mine`` with ``k`` negatives
    (cached in ``out``); ``first``: those rows with only their first negative; ``teacher``: the rows
    scored by ``simcse-kit score --model teacher``."""
    from simcse_kit.data.readers import read_rows
    from simcse_kit.files import write_text_atomic
    from simcse_kit.tools.mining import mine_file
    from simcse_kit.tools.scoring import score_file

    target = out / f"snli_pairs_mined{k if k > 1 else ''}.csv"
    if first:
        firsts = target.with_name(f"{target.stem}_first.csv")
        if not firsts.is_file():
            with mined_file(out, triplets, k).open(encoding="utf-8", newline="") as fh:
                rows = list(csv.DictReader(fh))
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            writer.writerows([("sent0", "sent1", "hard_neg"), *((r["sent0"], r["sent1"], r["hard_neg_1"]) for r in rows)])
            write_text_atomic(firsts, text.getvalue())
        return firsts
    if not target.is_file():
        text = io.StringIO()
        pairs = csv.DictWriter(text, fieldnames=("sent0", "sent1"), lineterminator="\n")
        pairs.writeheader()
        pairs.writerows(read_rows(triplets, ("sent0", "sent1")))
        write_text_atomic(out / "snli_pairs.csv", text.getvalue())
        mine_file(out / "snli_pairs.csv", target, num_negatives=k)
    if teacher is None:
        return target
    scored = target.with_name(f"{target.stem}_scored.csv")
    if not scored.is_file():
        score_file(target, scored, model=teacher)
    return scored


def training_rows(job: Job) -> int:
    """How many examples ``job`` trains on, read as its run reads them."""
    from simcse_kit.training.wiring.inputs import load_training_sets

    return sum(len(part) for part in load_training_sets(job_config(job)).values())


def seen_test_pairs(job: Job) -> dict[str, list[int]]:
    """Per test task, ``[pairs with both sentences in training, pairs]`` for what ``job`` trains on:
    the run's own contamination guard (``data.decontaminate``) over every dataset it reads (the
    teacher's and guide's texts are those datasets' sentences), as ``metrics.json`` reports it."""
    from simcse_kit.training.wiring.inputs import contamination_guard, load_training_sets

    cfg = job_config(job)
    guard = contamination_guard(cfg)
    load_training_sets(cfg, guard=guard)
    tasks = guard.report()["tasks"].values()
    return {o["task"]: [o["pairs_seen"], o["pairs"]] for o in tasks if o["kind"] == "test"}


def encode_vectors(table: str, domain: str, row: str, args: argparse.Namespace) -> None:
    """The teacher's and guide's vectors of ``row``'s training sentences on ``domain``, cached before any worker starts."""
    from simcse_kit.training.wiring.inputs import load_guide, load_teacher, load_training_sets, training_texts

    job = row_job(table, domain, row, 3e-5, 0, True, args)
    cfg = job_config(job)
    texts = training_texts(cfg, load_training_sets(cfg))  # one table of every dataset's sentences
    teacher = load_teacher(cfg, texts)
    load_guide(cfg, texts, teacher[1] if teacher else None)


def stats(name: str, domain: str, kind: str, per_seed: Mapping[int, Mapping[str, float]], lr: float | None) -> dict[str, Any]:
    """A row as ``report.py`` reads it: mean and sample std over the seeds, and each seed's table."""
    from simcse_kit.training.wiring.experiments import aggregate

    mean, std = aggregate(list(per_seed.values()))
    seeds = {str(k): dict(v) for k, v in per_seed.items()}
    return {"domain": domain, "kind": kind, "target": TARGET[domain], "learning_rate": lr, "n": len(per_seed)} | {
        "mean": mean, "std": std, "per_seed": seeds}  # fmt: skip


def build(table: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``table``'s rows (``args.rows``) and untouched models; the record ``report.py`` renders."""
    from simcse_kit.training.wiring.experiments import parse_values

    spec = TABLES[table]
    rates = {r: parse_values("learning rate", args.learning_rates or spec.rows[r].learning_rates or spec.learning_rates)
             for r in args.rows}  # fmt: skip
    args.mined = {}
    for row in (spec.rows[r] for r in args.rows if spec.rows[r].mined):
        args.output_dir.mkdir(parents=True, exist_ok=True)
        args.mined[row.mined, row.first] = mined_file(
            args.output_dir, args.data_root / SNLI, row.mined, row.first, args.teacher if spec.scored else None
        )
    vectors = [r for r in args.rows if (spec.rows[r].teacher or spec.rows[r].guide) and not spec.rows[r].peer]
    for domain in spec.domains if vectors else ():
        encode_vectors(table, domain, vectors[0], args)
    senteval = str(args.eval_data_dir or args.data_root / "senteval")
    models = {"base": args.model or DEFAULT_MODEL, "teacher": str(getattr(args, "teacher", None))}
    tasks = tuple(args.tasks)
    untouched = [Job(u, "base", out=str(args.output_dir / u), model=models[u], retrieval=tasks, eval_data_dir=senteval,
                     transfer=args.transfer_kfold if u == "base" or args.transfer_teacher else 0)
                 for u in spec.untouched]  # fmt: skip
    rows = {(d, r): (lambda lr, s, sw, d=d, r=r: row_job(table, d, r, lr, s, sw, args)) for d in spec.domains for r in args.rows}
    labels = {(d, r): f"{d}-{r}" if d else r for d, r in rows}
    made = sweep_and_run({labels[k]: job for k, job in rows.items()}, {labels[d, r]: rates[r] for d, r in rows}, args, untouched)
    fill_kept_base_transfer(made)
    results: dict[str, Any] = {}
    for domain in spec.domains:
        for u in untouched:
            if u.name in made.extra:
                results[f"{domain}-{u.name}" if domain else u.name] = stats(u.name, domain, u.name, {0: made.extra[u.name]}, None)
        for d, r in rows:
            label = f"{d}-{r}" if d else r
            if d == domain and label in made.rows:
                kind = "st" if spec.rows[r].peer else "kit"
                results[label] = stats(label, d, kind, made.rows[label], made.chosen[label])
                chosen = rows[d, r](made.chosen[label], args.seeds[0], False)
                if table in ("mining", "negatives", "scores"):
                    results[label]["rows"] = training_rows(chosen)
                results[label]["test_pairs_seen"] = seen_test_pairs(chosen)
    folders = {f"{domain}-{u.name}" if domain else u.name: {0: Path(u.out)} for domain in spec.domains for u in untouched}
    folders |= {label: {seed: Path(rows[d, r](made.chosen[label], seed, False).out) / f"seed-{seed}" for seed in made.rows[label]}
                for (d, r), label in labels.items() if label in made.rows}  # fmt: skip
    base = next((Path(u.out) for u in untouched if u.name == "base"), None)  # what a kept-base seed scored
    bases = dict.fromkeys(labels.values(), base) if base is not None else {}
    kept = {name: f for name, f in folders.items() if name in results}
    args.sidecar = sidecar(kept, bases)
    made_at, made_on = runs_stamps(kept)
    sweep = {name: {f"{lr:g}": t for lr, t in by_lr.items()} for name, by_lr in made.sweep.items()}
    # The runs' threads (--threads), not this coordinating process's (it encodes on all the workers' cores).
    where = machine() | {"torch_threads": args.threads}
    return {"command": " ".join(["python -m benchmarks.quality", *sys.argv[1:]]), "machine": where} | {
        "model": args.model or DEFAULT_MODEL,
        "data_root": str(args.data_root),
        "seeds": args.seeds,
        "steps": args.steps,
        "transfer_kfold": args.transfer_kfold,
        # Records without this key probed simcse-kit rows raw and the Normalize-ended models unit.
        "transfer_normalize": TRANSFER_NORMALIZE,
        "transfer_batches": TRANSFER_BATCHES,  # records without it batched the probe's sentences alphabetically
        "transfer_teacher": args.transfer_teacher,
        "retrieval_tasks": args.task_names,
        "st_precision": resolve_precision(args.st_precision),
        "learning_rates": {r: rates[r] for r in args.rows},
        "chosen_learning_rates": made.chosen,
        "sweep": sweep,
        "lost": made.lost,
        "results": results,
        "predictions": "per-pair cosines of each row's seeds: the .npz of the same name beside this record",
        "runs_made_at": made_at,
        "runs_made_on": made_on,
    }


def prepare(args: argparse.Namespace, table: Table) -> None:
    """Resolve the data root (also as ``SIMCSE_KIT_DATA`` for the workers), the output folder,
    the seeds and the retrieval tasks (built under the output folder) in place."""
    from simcse_kit.config.recipes import DATA_ENV, data_root
    from simcse_kit.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from simcse_kit.training.wiring.experiments import parse_seeds

    args.data_root = data_root(args.data_root)
    if args.data_root is None or not args.data_root.is_dir():
        raise SystemExit(f"no data root at {args.data_root}: pass --data-root DIR or set {DATA_ENV}")
    os.environ[DATA_ENV] = str(args.data_root)
    args.output_dir = args.output_dir.resolve()
    args.seeds = parse_seeds(args.seeds)
    args.task_names = [] if args.retrieval_tasks == ["none"] else (args.retrieval_tasks or list(RETRIEVAL_TASKS))
    trained = [str(args.data_root / f) for f in table.trains_on]
    args.tasks = build_tasks(args.output_dir / "retrieval-tasks", args.data_root, args.task_names, trained)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", choices=[*TABLES, "worker"], help="the table to build (worker: run one --job FILE)")
    p.add_argument("--rows", "--configs", nargs="+", default=None, help="the rows to run (default: the table's)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated")
    p.add_argument("--learning-rates", default=None, help="comma-separated, swept on dev (default: each row's, else the table's)")
    p.add_argument("--model", default=None, help="the backbone of every row and of the base row (default: the recipes')")
    p.add_argument("--sweep-seed", type=int, default=1, help="the seed of the dev-only learning-rate sweep")
    p.add_argument("--steps", "--max-steps", type=int, default=None, help="max optimiser steps per run (default: one epoch)")
    p.add_argument("--eval-steps", type=int, default=25, help="dev every N steps (and at the end)")
    p.add_argument("--eval-data-dir", type=Path, default=None, help="STS folder of the final table (smoke tests)")
    p.add_argument("--st-precision", choices=("fp32", "bf16", "auto"), default="auto", help="auto: bf16 on a GPU, else fp32")
    p.add_argument("--teacher", default=None, help="the teacher (tables teacher, scores): a sentence-transformers folder")
    p.add_argument("--guide", default=None, help="the guide (table guide): a sentence-transformers folder")
    p.add_argument("--teacher-cache-dir", type=Path, default=None, help="where their vectors are cached (default: the kit's)")
    p.add_argument("--data-root", type=Path, default=None, help="default: $SIMCSE_KIT_DATA, else ../shared/data")
    p.add_argument("--retrieval-tasks", nargs="+", default=None, help="built-in retrieval tasks (default: all; none: skip)")
    p.add_argument("--transfer-kfold", type=int, default=0, choices=(0, 5, 10),
                   help="score each seed's model on the SentEval transfer tasks with this many folds (SentEval: 10; "
                   "its quick setting: 5; 0: not scored)")  # fmt: skip
    p.add_argument("--transfer-teacher", action="store_true",
                   help="score the teacher too (without it: the student models only; the teacher is larger)")  # fmt: skip
    p.add_argument("--parallel", type=int, default=1, help="runs at once, each in a fresh interpreter (1: in this one)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per run")
    p.add_argument("--keep-going", action="store_true", help="a failed run is left out of the table, not fatal")
    p.add_argument("--output-dir", type=Path, default=None, help="default: runs/benchmarks/<table>")
    p.add_argument("--job", type=Path, default=None, help=argparse.SUPPRESS)
    add_allow_dirty(p)
    return p


def main() -> None:
    from benchmarks import report

    args = parser().parse_args()
    # Before any worker starts, this process alone encodes (teacher, guide) and mines: all the
    # cores the workers will share are its.
    setup_run(args.threads if args.table == "worker" else args.threads * args.parallel)
    if args.table == "worker":
        run_job(Job.from_json(args.job.read_text(encoding="utf-8")))
        return
    spec = TABLES[args.table]
    args.rows = args.rows or list(spec.default)
    unknown = [r for r in args.rows if r not in spec.rows]
    if unknown:
        raise SystemExit(f"--rows {unknown} not in {list(spec.rows)}")
    rows = [spec.rows[r] for r in args.rows]
    for flag, value, wanted in (
        ("--teacher", args.teacher, spec.scored or any(r.teacher for r in rows)),
        ("--guide", args.guide, any(r.guide for r in rows)),  # the gist peer's rows are guide rows too
    ):
        if wanted and not value:
            raise SystemExit(f"the {args.table} table's rows {args.rows} need {flag}")
    args.output_dir = args.output_dir or REPO / "runs" / "benchmarks" / args.table
    refuse_dirty(args.allow_dirty)  # before hours of runs, not after them
    prepare(args, spec)
    start = time.perf_counter()
    record = build(args.table, args)
    out = args.output_dir / f"{args.table}.json"
    save_results(out, record, allow_dirty=args.allow_dirty)
    save_rows(out.with_suffix(".npz"), *args.sidecar)  # report.py's intervals (benchmarks.stats)
    views = {"sts": report.QUALITY, "mining": report.MINING, "negatives": report.NEGATIVES, "guide": report.GUIDE}
    views |= {"multi": report.MULTI, "scores": report.SCORES, "lora": report.LORA, "scored": report.SCORED}
    views |= {"teacher_general": report.TEACHER_GENERAL}
    spec_view = views.get(args.table, report.DOMAIN)
    print("\n".join(report.md_table(spec_view.head, spec_view.rows(record))))
    print(f"{time.perf_counter() - start:.0f} s; kept in {out} and {out.with_suffix('.npz').name} (copy both to "
          "benchmarks/results/ under one name for BENCHMARKS.md)")  # fmt: skip


if __name__ == "__main__":
    main()
