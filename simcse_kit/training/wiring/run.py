"""A text training run: config -> data -> model -> loop -> best model + metrics.

The run folder holds ``config.yaml`` (resolved), ``metrics.json`` (per-eval dev
scores under the dev evaluator's own metric name, final STS table, train time,
throughput), ``best_model/`` (the checkpoint with the best dev score: STS-B dev
Spearman unless the recipe names another dev split; self-describing),
``training_curves.png`` (loss and dev score against the step, best step marked),
``alignment_uniformity.png``, with
``train.report_to`` the trackers' files under ``logs/`` (:mod:`simcse_kit.training.engine.tracking`) and,
with ``train.save_steps``, ``checkpoints/`` for ``--resume``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader

from simcse_kit.config.run import RunConfig, files_label
from simcse_kit.data.readers import negatives_of, skipped_rows
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import DevEvaluator, RetrievalDevEvaluator, STSEvaluator, plot_trajectory, run_evaluator
from simcse_kit.evaluation.contamination import Guard, format_marked_table
from simcse_kit.evaluation.encoding import Encode, encode_once, prompted
from simcse_kit.evaluation.plots import plot_training_curves
from simcse_kit.evaluation.quantization import VectorPrecision, calibration_ranges
from simcse_kit.files import write_json_atomic
from simcse_kit.model.checkpointing import enable_gradient_checkpointing
from simcse_kit.model.fastpath import enable_fast_dropout
from simcse_kit.model.heap import HeapChoice, apply_mmap_threshold
from simcse_kit.model.inference import Encoder
from simcse_kit.model.modeling import SimCSEModel, base_encoder
from simcse_kit.model.precision import PrecisionChoice, check_cuda_flags, set_tf32
from simcse_kit.training.engine.checkpoints import Checkpoints, LoopState
from simcse_kit.training.engine.engines import check_engine, engine_of
from simcse_kit.training.engine.guards import AfterTrainingSignals, StopSignals
from simcse_kit.training.engine.loop import Prepared, fit, make_accelerator, prepare, start_processes
from simcse_kit.training.engine.peers import Peers
from simcse_kit.training.engine.selection import LEGACY_DEV_LABEL, LEGACY_DEV_METRIC, metric_label
from simcse_kit.training.engine.steps import GradCacheStep, MomentumQueueStep, Step
from simcse_kit.training.engine.tracking import start_tracking, stop_tracking, tracker_names
from simcse_kit.training.objective.mixture import MixtureObjective
from simcse_kit.training.objective.momentum_queue import MomentumQueue
from simcse_kit.training.objective.objectives import GuideFilter, SimCSEObjective, TeacherTargets
from simcse_kit.training.objective.teacher import TeacherTable
from simcse_kit.training.wiring.folder import (
    BEST_MODEL,
    CHECKPOINTS,
    LOGS,
    prepare_run_dir_once,
    with_concrete_precision,
    with_device_defaults,
)
from simcse_kit.training.wiring.inputs import (
    contamination_guard,
    load_checked_tokenizer,
    load_guide,
    load_teacher,
    load_training_sets,
    training_texts,
)
from simcse_kit.training.wiring.loaders import make_loader, warn_if_a_batch_is_a_whole_set

logger = logging.getLogger(__name__)

# The same batching as `simcse-kit evaluate`, so the run's table and a later evaluate agree
# to the last digit (different padding changes fp32 sums in the last bits).
EVAL_BATCH_SIZE = 128


@dataclass
class Run(Prepared):
    """A text run wired and not yet run (:func:`build_run`).

    The accelerator with the prepared model, AdamW, schedule and loader (the fields of
    :class:`~simcse_kit.training.engine.loop.Prepared`: ``fit(run, run.step, run.cfg.train)`` trains
    it), plus what a text run adds around the loop.

    Attributes:
        cfg: the config as the run uses it: ``auto`` precision and the device's ``null``
            (auto) settings decided (:func:`with_device_defaults`).
        recorded: the config as ``config.yaml`` records it: ``auto`` precision decided, the
            device's auto settings left auto (a resume on another device decides them there).
        precision: how ``auto`` was decided; None where the config decided.
        heap: the allocator setting applied (``train.mmap_threshold_mib``).
        tokenizer: the model's tokenizer, checked against the model and the lengths.
        objective: the loss (its ``masked_negatives`` count goes to metrics.json).
        step: the loop's step: the objective, or GradCache or the momentum queue around it.
        evaluator: dev selection (``evaluator(model) -> metrics``); None: built without.
        final_sts: the STS table scored on the best model at the end; None: not scored.
        checkpoints: the run folder's checkpoints and best model.
        teacher: the teacher's vectors of the training sentences; None: no teacher.
        guide: the guide's vectors of the training sentences (``loss.guide``; the teacher's
            table itself for ``teacher``); None: no guide.
        tf32: whether fp32 matmuls run on TF32 tensor cores.
        skipped_rows: bad rows of the training files left out (``data.bad_rows: skip``).
    """

    cfg: RunConfig
    recorded: RunConfig
    precision: PrecisionChoice | None
    heap: HeapChoice
    tokenizer: Any
    objective: MixtureObjective
    step: Step
    evaluator: ModelEvaluator | None
    final_sts: STSEvaluator | None
    checkpoints: Checkpoints
    teacher: TeacherTable | None
    tf32: bool
    skipped_rows: int = 0
    guide: TeacherTable | None = None
    contamination: dict[str, Any] | None = None


def train(cfg: RunConfig, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run one training job as configured; return the metrics written to metrics.json.

    With ``cfg.train.save_steps`` the full training state is saved every that many
    steps under ``output_dir/checkpoints``; ``resume=True`` continues from the newest
    one and ends with the same model and metrics as an uninterrupted run. The run folder
    is locked (:class:`~simcse_kit.training.engine.guards.RunLock`) from before anything in it changes
    until this returns or raises.
    """
    # A collective failed by a lost peer (killed, crashed, its node down, or silent past
    # train.collective_timeout_s) leaves as errors.PeerLost: one line naming it.
    with ExitStack() as held, Peers() as peers:
        run = build_run(cfg)  # every input checked before the run folder is touched
        peers.meet()  # who runs where, for that line
        out = prepare_run_dir_once(run.accelerator, run.recorded, overwrite, resume, held)  # the main process writes
        start_tracking(run.accelerator, run.cfg, run_name=out.name)  # the whole resolved config as hyper-parameters
        # SIGTERM/SIGUSR1/SIGINT during training: a checkpoint, then guards.Stopped. During the
        # final STS table there is nothing left to checkpoint: finish writes metrics.json first
        # and a stop there says so (guards.AfterTrainingSignals).
        with StopSignals() as signals:
            state = fit(
                run, run.step, run.cfg.train, evaluator=run.evaluator, checkpoints=run.checkpoints, resume=resume, signals=signals
            )
        return finish(run, state, out)


def build_run(
    cfg: RunConfig,
    *,
    dataset: datasets.Dataset | None = None,
    evaluate: bool = True,
    cpu: bool | None = None,
    wrap_collate: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> Run:
    """Everything :func:`train` wires, built and prepared, nothing run and nothing written.

    Everything that can be wrong with the inputs fails here: the training data, the dev
    and final STS files, the model folder, the trackers' names, the teacher. ``auto``
    precision is decided for this machine (``run.recorded``: what ``config.yaml`` records),
    then the device's ``null`` settings (``run.cfg``: what the run uses).

    Args:
        cfg: the run's config.
        dataset: train on this instead of ``cfg.data``'s files (columns as
            :func:`~simcse_kit.data.readers.load_train_dataset` makes them: ``sent0``, ...).
        evaluate: build the dev evaluator and the final STS table; False: neither (no
            dev selection, no STS files read).
        cpu: train on the CPU; default: the CPU when CUDA is unavailable.
        wrap_collate: ``wrap_collate(collate) -> collate``, applied before the loader is
            prepared (Accelerate's loader calls the function it was given), e.g. to time
            each batch.
    """
    tokenizer = load_checked_tokenizer(cfg)
    data = read_training_data(cfg, tokenizer, dataset, evaluate)
    dev, final_sts = make_dev_and_final(cfg) if evaluate else (None, None)
    tracker_names(cfg.train.report_to)  # an unknown or uninstalled tracker
    # "auto" precision becomes what this machine computes natively (rank 0's hardware for
    # every process), before the run folder records the config: config.yaml says what ran,
    # and a resume on another machine that would decide differently is refused rather than
    # silently mixed.
    start_processes(cfg.train, cpu)  # the collectives' timeout is set where the process group starts
    train_cfg, precision = with_concrete_precision(cfg.train, cpu)
    cfg = replace(cfg, train=train_cfg)
    # The teacher's vectors too (encoded once, or read from the cache): a teacher that
    # does not load, or cannot match the student, fails before the run folder exists.
    teacher, guide = load_vectors(cfg, data)
    contamination = data.guard.report() if data.guard is not None else None
    heap = apply_mmap_threshold(cfg.train.mmap_threshold_mib)
    logger.info("memory: %s", heap.reason)
    recorded = cfg  # config.yaml: the device's auto settings stay auto (each machine decides them)
    accelerator, cfg, tf32 = make_device(cfg, cpu)
    model = build_model(cfg)
    if data.from_files:  # a dataset given in code, a benchmark's few sentences in one batch, is the caller's choice
        warn_if_a_batch_is_a_whole_set(cfg, base_encoder(model.encoder).config, data.sets)
    objective, loader, extra = make_objective_and_loader(cfg, data, tokenizer, accelerator, model.is_decoder, teacher, guide)
    if wrap_collate is not None:
        loader.collate_fn = wrap_collate(loader.collate_fn)
    step = make_step(cfg, model, objective, accelerator)
    evaluator = make_model_evaluator(cfg, dev, tokenizer, accelerator.device, data) if dev is not None else None
    return Run(
        **vars(prepare(model, loader, cfg.train, accelerator)),
        cfg=cfg,
        recorded=recorded,
        precision=precision,
        heap=heap,
        tokenizer=tokenizer,
        objective=objective,
        step=step,
        evaluator=evaluator,
        final_sts=final_sts,
        checkpoints=make_checkpoints(cfg, tokenizer, evaluator, extra),
        teacher=teacher[1] if teacher else None,
        tf32=tf32,
        skipped_rows=data.skipped_rows(),
        guide=guide[1] if guide else None,
        contamination=contamination,
    )


# --------------------------------------------------------------------------- build_run's steps


@dataclass
class TrainingData:
    """What a run trains on, read and checked.

    Attributes:
        sets: the run's datasets by name (:meth:`~simcse_kit.config.sections.DataConfig.training_sets`;
            one given in code under its one spec's name).
        from_files: read from the config's files (not given in code).
        guard: the contamination guard the files were read through; None: none (no
            evaluation, or a dataset given in code).
    """

    sets: dict[str, datasets.Dataset]
    from_files: bool
    guard: Guard | None

    def texts(self, cfg: RunConfig) -> list[str]:
        """The distinct training sentences a teacher or guide scores (:func:`training_texts`)."""
        return training_texts(cfg, self.sets)

    def skipped_rows(self) -> int:
        """Bad rows of the training files left out (``data.bad_rows: skip``)."""
        return sum(skipped_rows(part) for part in self.sets.values())


def read_training_data(cfg: RunConfig, tokenizer: Any, dataset: datasets.Dataset | None, evaluate: bool) -> TrainingData:
    """The training data: ``dataset`` if given (in place of the config's one dataset), else the
    config's datasets (each with its token table, through the contamination guard when the run
    evaluates), each at least a batch.

    Raises:
        ConfigError: ``train.batch_size`` larger than a training set read from files.
        ValueError: ``dataset`` given for a config that lists several.
    """
    if dataset is not None:
        # A dataset given in code, a benchmark's few sentences repeated in one batch, is the
        # caller's choice: no guard and no size check.
        specs = cfg.data.training_sets()
        if len(specs) != 1:
            raise ValueError(f"build_run(dataset=...): the config lists {len(specs)} datasets; give it one")
        return TrainingData({specs[0].name: dataset}, from_files=False, guard=None)
    # Every text trained on against every evaluation set reported (data.decontaminate).
    guard = contamination_guard(cfg) if evaluate else None
    # With each file's token table: tokenised once, ahead of the loader (simcse_kit.data.tokens).
    sets = load_training_sets(cfg, tokenizer, guard)
    # Legal, but every step would be the whole set: surely a typo. Each batch is one
    # dataset's, so every dataset must fill one.
    files = {spec.name: files_label(spec.file) for spec in cfg.data.training_sets()}
    for name, part in sets.items():
        if cfg.train.batch_size > len(part):
            raise ConfigError(
                f"config key 'train.batch_size' = {cfg.train.batch_size}: larger than the training set {name!r} "
                f"({len(part)} example(s) in {files[name]}); each batch is drawn from one dataset: use a batch of at "
                f"most {min(len(part) for part in sets.values())}"
            )
    return TrainingData(sets, from_files=True, guard=guard)


def make_dev_and_final(cfg: RunConfig) -> tuple[DevScorer, STSEvaluator | None]:
    """The dev evaluator (STS or a retrieval split, ``data.dev_format``) and, with
    ``train.final_eval``, the final STS table: both read their files now."""
    data = cfg.data
    dev: DevScorer
    if data.dev_format == "beir":
        assert data.dev_file is not None  # RunConfig.validate: dev_format beir needs a dev_file
        dev = RetrievalDevEvaluator(data.dev_file, batch_size=EVAL_BATCH_SIZE, prompts=data.prompts)
    else:
        dev = DevEvaluator(data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=data.dev_file, fmt=data.dev_format)
    return dev, STSEvaluator(data.eval_data_dir, batch_size=EVAL_BATCH_SIZE) if cfg.train.final_eval else None


def load_vectors(
    cfg: RunConfig, data: TrainingData
) -> tuple[tuple[TeacherTargets, TeacherTable] | None, tuple[GuideFilter, TeacherTable] | None]:
    """The teacher's and the guide's vectors of every training sentence (one table of a
    mixture's datasets' together), and the objective's terms of them; None for either not configured."""
    texts = data.texts(cfg) if cfg.loss.teacher is not None or cfg.loss.guide is not None else []
    teacher = load_teacher(cfg, texts)
    guide = load_guide(cfg, texts, teacher[1] if teacher else None)  # vets negatives
    if data.guard is not None and texts:
        data.guard.add_texts("the teacher's and the guide's sentences", texts)
    return teacher, guide


def make_device(cfg: RunConfig, cpu: bool | None) -> tuple[Accelerator, RunConfig, bool]:
    """The accelerator, the config with the device's ``null`` settings decided, and whether
    fp32 matmuls run on TF32; flags the device or the engine cannot honour refused."""
    accelerator = make_accelerator(cfg.train, cpu, logging_dir=Path(cfg.train.output_dir) / LOGS)
    cfg = with_device_defaults(cfg, accelerator.device, accelerator.num_processes)
    tf32 = set_tf32(accelerator.device)
    check_cuda_flags(
        accelerator.device,
        fast_dropout=cfg.train.fast_dropout is True,
        bf16_weights=cfg.train.bf16_weights is True,
        adapter=cfg.model.lora_r > 0,
    )
    check_engine(
        engine_of(accelerator),
        {
            "train.bf16_weights": cfg.train.bf16_weights,
            "train.fast_dropout": cfg.train.fast_dropout,
            "train.grad_cache_chunk": cfg.train.grad_cache_chunk,
            "loss.queue_size": cfg.loss.queue_size,
        },
    )
    return accelerator, cfg, tf32


def make_objective_and_loader(
    cfg: RunConfig,
    data: TrainingData,
    tokenizer: Any,
    accelerator: Accelerator,
    decoder: bool,
    teacher: tuple[TeacherTargets, TeacherTable] | None,
    guide: tuple[GuideFilter, TeacherTable] | None,
) -> tuple[MixtureObjective, DataLoader, dict[str, Any]]:
    """The objective (one per dataset, each in its mode with its ``k`` hard negatives), the
    loader and what the saved model records of its training data (``extra``)."""
    targets, table = teacher if teacher else (None, None)
    vetting, guide_table = guide if guide else (None, None)
    teacher_index, guide_index = (table.index if table else None), (guide_table.index if guide_table else None)
    specs = {spec.name: spec for spec in cfg.data.training_sets()}

    def objective_of(name: str, part: datasets.Dataset) -> SimCSEObjective:
        # k hard negatives per example: the data's
        negatives = negatives_of(part.column_names)
        return SimCSEObjective(specs[name].mode, cfg.loss, teacher=targets, negatives=negatives, guide=vetting)

    processes = accelerator.num_processes
    objective = MixtureObjective({name: objective_of(name, part) for name, part in data.sets.items()}, processes)
    accelerator.register_for_checkpointing(objective.tally)  # --resume reports what an uninterrupted run does
    loader = make_loader(cfg, data.sets, tokenizer, processes, accelerator.device, decoder, teacher_index, guide_index)
    modes_of = {name: specs[name].mode for name in data.sets}
    extra = {
        "base_model": cfg.model.name_or_path,
        "mode": " + ".join(dict.fromkeys(modes_of.values())),
        "datasets": modes_of,
        "train_file": {name: specs[name].file for name in data.sets},
    }
    return objective, loader, extra


def make_model_evaluator(
    cfg: RunConfig, dev: DevScorer, tokenizer: Any, device: torch.device, data: TrainingData
) -> ModelEvaluator:
    """Dev selection's ``evaluator(model) -> metrics``: ``dev`` on the model's vectors (at
    ``train.selection_precision``), STS dev sentences read as queries (with the query prompt)."""
    # STS dev reads its sentences as queries; a retrieval dev split applies both prompts itself.
    query_prompt = (cfg.data.prompts or {}).get("query", "") if cfg.data.dev_format != "beir" else ""
    return ModelEvaluator(
        dev,
        tokenizer,
        cfg.model.eval_max_seq_len,
        device,
        cfg.train.mixed_precision,
        query_prompt,
        cfg.train.selection_precision,
        selection_calibration(cfg, data.sets),
    )


def make_checkpoints(cfg: RunConfig, tokenizer: Any, evaluator: ModelEvaluator | None, extra: dict[str, Any]) -> Checkpoints:
    """The run folder's checkpoints and best model; the best model records what selected it
    (no evaluator, evaluate=False: never saved) and ``extra`` (its training data, the prompts)."""
    if cfg.data.prompts:  # recorded with the model: evaluation and the export use them
        extra = extra | {"prompts": cfg.data.prompts}
    metric, label = (
        (evaluator.primary_metric, evaluator.metric_label) if evaluator is not None else (LEGACY_DEV_METRIC, LEGACY_DEV_LABEL)
    )
    save_best = partial(save_best_model, tokenizer=tokenizer, extra=extra, metric=metric, label=label)
    out = Path(cfg.train.output_dir)
    return Checkpoints(out / CHECKPOINTS, out / BEST_MODEL, save_best)


def finish(run: Run, state: LoopState, out: Path) -> dict[str, Any]:
    """After the loop: metrics.json, the best model's STS table, the figures; the metrics."""
    if run.evaluator is None:
        raise ValueError("finish: the run was built without its dev evaluator (build_run(evaluate=False))")
    metrics = training_metrics(run, state, run.evaluator)
    if run.objective.masking:
        logger.info("false-negative masking removed %d (anchor, candidate) entries", run.objective.masked_negatives)
    if run.accelerator.is_main_process:
        have_best = (out / BEST_MODEL).is_dir()
        if not have_best:  # every evaluation non-finite or collapsed (warned at each)
            logger.warning(
                "no best model was saved: no evaluation gave a usable %s; no final STS table", run.evaluator.primary_metric
            )
        plot_run(run, state, out, metrics)
        # The training's results first: the final table takes minutes on a CPU, and a stop
        # signal there (no handler left: nothing to checkpoint) lost them, exit 143 without a word.
        write_json_atomic(out / "metrics.json", metrics)
        if run.final_sts is not None and have_best:
            final_table(run, state, out, metrics)
        if have_best:  # the last line names only a folder that exists
            evaluator = run.evaluator
            best_at = (state.best_step, evaluator.metric_label, state.best_score, evaluator.evaluator.path.name, out / BEST_MODEL)
            logger.info("best model (step %d, %s %.2f on %s) at %s", *best_at)
        else:
            logger.info("run finished without a best model: see the warnings above; metrics at %s", out / "metrics.json")
    stop_tracking(run.accelerator)
    return metrics


# --------------------------------------------------------------------------- finish's steps


def training_metrics(run: Run, state: LoopState, evaluator: ModelEvaluator) -> dict[str, Any]:
    """metrics.json before the final table: the loop's figures (:func:`run_metrics`), a
    mixture's per-dataset tally, how precision and memory were decided, skipped rows, the
    contamination report, the teacher and the guide, the speed settings."""
    cfg, objective = run.cfg, run.objective
    # The views per example differ between the datasets: each counts its own.
    metrics = run_metrics(state, objective.examples_seen(), objective.masked_negatives, evaluator)
    metrics["datasets"] = objective.tally.report()  # per dataset: batches, examples, mean loss
    metrics["sampling"] = cfg.data.sampling
    metrics["precision"] = (
        asdict(run.precision)
        if run.precision is not None
        else {
            "mixed_precision": cfg.train.mixed_precision,
            "bf16_weights": cfg.train.bf16_weights,
            "fast_dropout": cfg.train.fast_dropout,
            "reason": "set in the config",
            "decided_by": "set in the config",
        }
    )
    metrics["memory"] = asdict(run.heap)
    metrics["skipped_rows"] = run.skipped_rows  # data.bad_rows: skip (0 otherwise: a bad row stops the run)
    if run.contamination is not None:
        metrics["contamination"] = run.contamination
    if run.teacher is not None:
        metrics["teacher"] = {"model": cfg.loss.teacher, "loss": cfg.loss.teacher_loss} | table_metrics(run.teacher)
        metrics["teacher"]["seconds"] = run.teacher.seconds
    if run.guide is not None:
        loss = cfg.loss
        metrics["guide"] = {
            "model": loss.guide,
            "margin": loss.guide_margin,
            "margin_strategy": loss.guide_margin_strategy,
            "masked": objective.guided_total,  # (anchor, candidate) entries it dropped, all steps, all datasets
        } | table_metrics(run.guide)
        logger.info("the guide dropped %d (anchor, candidate) entries", objective.guided_total)
    speed = {"tf32": run.tf32, "compile": cfg.train.compile, "num_workers": cfg.data.num_workers}
    metrics["speed"] = speed | {"packing": cfg.model.packing}
    return metrics


def table_metrics(table: TeacherTable) -> dict[str, Any]:
    """What metrics.json says of a teacher's or a guide's vectors."""
    return {
        "sentences": int(table.vectors.shape[0]),
        "width": table.width,
        "cache_key": table.key,
        "cache_hit": table.cache_hit,
    }


def plot_run(run: Run, state: LoopState, out: Path, metrics: dict[str, Any]) -> None:
    """The run folder's figures: the alignment/uniformity trajectory and the training curves."""
    cfg, evaluator = run.cfg, run.evaluator
    assert evaluator is not None  # finish checked it
    trained = " + ".join(dict.fromkeys(spec.mode for spec in cfg.data.training_sets()))
    plot_trajectory(metrics["evals"], out / "alignment_uniformity.png", f"{evaluator.dev_name}, {trained}")
    plot_training_curves(
        state.losses,
        state.evals,
        out / "training_curves.png",
        evaluator.primary_metric,
        state.best_step,
        f"{out.name}: {trained}, {Path(cfg.model.name_or_path).name}",
        label=evaluator.metric_label,
    )


def final_table(run: Run, state: LoopState, out: Path, metrics: dict[str, Any]) -> None:
    """The best model's STS table into ``metrics`` (and metrics.json, and the trackers), logged
    with the tasks the training data touched marked."""
    cfg, accelerator = run.cfg, run.accelerator
    assert run.final_sts is not None  # finish checked it
    what = (
        f"the final STS table; training had finished and {out / 'metrics.json'} holds its results without the "
        f"table: score the best model with simcse-kit evaluate {out} (a multi-seed run scores it when its command "
        "runs again)"
    )
    with AfterTrainingSignals(what):
        # accelerator.device, not its name: a CPU process of a launched run is "cpu:0", which no --device names
        metrics["sts"] = score_best_model(run.final_sts, cfg, out, accelerator.device)
    accelerator.log({f"test/{task}": score for task, score in metrics["sts"].items() if "/" not in task}, step=state.global_step)
    write_json_atomic(out / "metrics.json", metrics)
    marked = format_marked_table(metrics["sts"], metrics.get("contamination"))
    logger.info("STS table of the best model:\n%s", marked)  # the CLI prints it too


def owed_table(cfg: RunConfig, out: Path, evaluator: STSEvaluator | None = None) -> dict[str, float]:
    """The final STS table of the run in ``out`` that a stop cut off (:func:`finish` writes metrics.json
    first), on this machine's best device; ``evaluator``: the table's (a fresh one by default), which keeps
    the per-pair scores for a caller that wants them."""
    if evaluator is None:
        evaluator = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    return score_best_model(evaluator, cfg, out)


def score_best_model(
    evaluator: Callable[[Encode], dict[str, float]], cfg: RunConfig, out: Path, device: str | torch.device = "auto"
) -> dict[str, float]:
    """``evaluator`` on the best model of the run in ``out``, the one way its tables are scored (the final
    table, one a stop cut off, a benchmark's): fp32, at the evaluation length and with the query prompt the
    model was saved with."""
    return run_evaluator(evaluator, out / BEST_MODEL, device=device, trust_remote_code=cfg.model.trust_remote_code)


# --------------------------------------------------------------------------- the pieces


def save_best_model(
    model: SimCSEModel,
    folder: Path,
    metrics: dict[str, float],
    *,
    tokenizer: Any,
    extra: dict[str, Any],
    metric: str,
    label: str,
) -> None:
    """The run's ``best_model/``: the model, its tokenizer, where it came from and its dev
    score, named (``metric``: its key in ``metrics``; ``label``: what it measures)."""
    dev = {"dev_metric": metric, "dev_label": label, "dev_score": metrics[metric]}
    model.save(folder, tokenizer, extra | {"step": int(metrics["step"])} | dev)


def build_model(cfg: RunConfig) -> SimCSEModel:
    """The training model, seeded: a fresh MLP head is initialised at random, and a run
    (or its resume) must be reproducible from its config alone."""
    set_seed(cfg.train.seed)
    model = SimCSEModel.from_config(cfg.model)
    # The transformer's own pooler (BERT's dense + tanh on [CLS]) feeds none of our
    # poolers; DDP stops on parameters that never get a gradient, so it is frozen (it
    # would not change anyway: AdamW skips parameters without a gradient).
    hf_pooler = getattr(base_encoder(model.encoder), "pooler", None)
    if isinstance(hf_pooler, nn.Module):
        hf_pooler.requires_grad_(False)
    if cfg.train.gradient_checkpointing:
        # Non-reentrant: it needs no input that requires a gradient (a frozen base under
        # LoRA has none) and it replays dropout's random draws, so the gradients are the same.
        # transformers' own where the model has it, else each block (MPNet in transformers 5).
        encoder = base_encoder(model.encoder)
        try:
            how = enable_gradient_checkpointing(encoder)
        except ValueError as exc:
            raise ConfigError(f"config key 'train.gradient_checkpointing' = True: {exc}; set it false") from None
        logger.info("gradient checkpointing: %s (%s)", type(encoder).__name__, how)
    if cfg.train.fast_dropout:
        enable_fast_dropout(model)
    if cfg.train.compile:
        if cfg.train.fast_dropout:
            raise ConfigError(
                "train.compile with train.fast_dropout: the fast-dropout attention is not verified under "
                "torch.compile; set train.fast_dropout false (or train.compile false)"
            )
        # In place (nn.Module.compile), so the state dict and save_pretrained keep their keys.
        # dynamic=True: batches are padded to their longest sentence and packed into a varying
        # number of rows, so the shapes change every step (one graph serves them all).
        model.encoder.compile(dynamic=True)
        logger.info("torch.compile: the encoder, dynamic shapes")
    return model


def make_step(cfg: RunConfig, model: SimCSEModel, objective: MixtureObjective, accelerator: Accelerator) -> Step:
    """The loop's step: the objective itself, or GradCache or the momentum queue around it.

    The queue's momentum encoder is copied from the model *before* ``accelerator.prepare``
    (a copy of a prepared model would carry its autocast wrapper) and registered for
    checkpointing, so ``--resume`` restores the queue with the rest. Each takes a batch's loss
    from its dataset's objective.
    """
    if cfg.train.grad_cache_chunk > 0:  # big batches: chunk-wise encoder backward, same gradients
        return GradCacheStep(objective, cfg.train.grad_cache_chunk, accelerator)
    if cfg.loss.queue_size > 0:  # MoCo-style negatives (simcse_kit.training.objective.momentum_queue)
        guide = cfg.loss.guide is not None  # the queue keeps its keys' guide rows
        queue = MomentumQueue(model, cfg.loss.queue_size, cfg.loss.momentum, model.encoder.config.hidden_size, guide)
        accelerator.register_for_checkpointing(queue)
        logger.info("momentum queue: %d negatives, momentum %.4f", cfg.loss.queue_size, cfg.loss.momentum)
        return MomentumQueueStep(objective, queue, accelerator)
    return objective


SELECTION_CALIBRATION = 1000
"""Training sentences whose ranges quantize the dev vectors under ``train.selection_precision: int8``."""


def selection_calibration(cfg: RunConfig, sets: dict[str, datasets.Dataset]) -> list[str]:
    """The first :data:`SELECTION_CALIBRATION` distinct training sentences with an int8/uint8
    ``train.selection_precision``; none otherwise."""
    if cfg.train.selection_precision not in ("int8", "uint8"):
        return []
    heads = {name: part.select(range(min(len(part), SELECTION_CALIBRATION))) for name, part in sets.items()}
    return training_texts(cfg, heads)[:SELECTION_CALIBRATION]


class DevScorer(Protocol):
    """A dev evaluator (:class:`~simcse_kit.evaluation.DevEvaluator`, :class:`~simcse_kit.evaluation.RetrievalDevEvaluator`):
    ``scorer(encode) -> metrics``, the metric that selects, the file or folder it reads."""

    @property
    def primary_metric(self) -> str: ...

    @property
    def path(self) -> Path: ...

    def __call__(self, encode: Encode) -> dict[str, float]: ...


@dataclass
class ModelEvaluator:
    """The loop's ``evaluator(model) -> metrics`` from an evaluator of an encode function
    (here the dev evaluator: dev score, alignment and uniformity from one encoding)."""

    evaluator: DevScorer
    tokenizer: Any
    max_seq_len: int
    device: torch.device
    precision: str
    prompt: str = ""  # put before every sentence (the model's query prompt, for STS dev)
    vectors: str = "float32"  # train.selection_precision: dev scored on quantized vectors
    calibration: list[str] = field(default_factory=list)  # int8/uint8: sentences whose ranges quantize

    @property
    def primary_metric(self) -> str:
        return self.evaluator.primary_metric

    @property
    def metric_label(self) -> str:
        """What the primary metric measures, e.g. "SICK trial Spearman x 100" (with "(binary
        vectors)" when selection scores quantized vectors)."""
        label = metric_label(self.evaluator)
        return label if self.vectors == "float32" else f"{label} ({self.vectors} vectors)"

    @property
    def dev_name(self) -> str:
        """The dev split, e.g. "SICK trial" (the primary metric's key where unnamed)."""
        return str(getattr(self.evaluator, "dev_name", self.primary_metric))

    def __call__(self, model: nn.Module) -> dict[str, float]:
        encoder = Encoder(model, self.tokenizer, self.max_seq_len, self.device, self.precision)
        encode = prompted(encoder.encode, self.prompt)
        if self.vectors != "float32":
            # Ranges from this checkpoint's own vectors of the calibration sentences: its int8 codes as deployed.
            ranges = (
                calibration_ranges(encode_once(encode, self.calibration, EVAL_BATCH_SIZE).vectors) if self.calibration else None
            )
            encode = VectorPrecision(self.vectors, ranges).encode(encode)
        return self.evaluator(encode)


def run_metrics(state: LoopState, examples: int, masked_negatives: int, evaluator: Any) -> dict[str, Any]:
    """metrics.json's training part: the dev metric (its key in ``evals`` and what it
    measures), best dev score and step, time, throughput, curves."""
    seconds = max(state.train_seconds, 1e-9)
    return {
        "dev_metric": evaluator.primary_metric,
        "dev_label": metric_label(evaluator),
        "best_step": state.best_step,
        "best_dev_score": state.best_score,
        "steps": state.global_step,
        "train_seconds": state.train_seconds,
        "examples_per_second": examples / seconds,
        "sentences_per_second": state.rows_seen / seconds,
        "losses": state.losses,
        "evals": state.evals,
        "masked_negatives": masked_negatives,
    }
