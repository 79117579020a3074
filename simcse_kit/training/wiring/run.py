"""A text training run: config -> data -> model -> loop -> best model + metrics.

The run folder holds ``config.yaml`` (resolved), ``metrics.json`` (per-eval dev
scores under the dev evaluator's own metric name, final STS table, train time,
throughput), ``best_model/`` (the checkpoint with the best dev score: STS-B dev
Spearman unless the recipe names another dev split; self-describing),
``training_curves.png`` (loss and dev score against the step, best step marked),
``alignment_uniformity.png``, with
``train.report_to`` the trackers' files under ``logs/`` (:mod:`simcse_kit.training.tracking`) and,
with ``train.save_steps``, ``checkpoints/`` for ``--resume``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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
from simcse_kit.core.batch import view_prompts, views_per_example
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.mixture import Mixture, MixtureBatches, MixtureCollator
from simcse_kit.data.pipeline import ShuffledIndices, loader_options
from simcse_kit.data.readers import negatives_of, skipped_rows
from simcse_kit.data.tokens import Tokenization, id_columns, with_tokens
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import DevEvaluator, RetrievalDevEvaluator, STSEvaluator, plot_trajectory
from simcse_kit.evaluation.contamination import format_marked_table
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
from simcse_kit.training.checkpoints import Checkpoints, LoopState
from simcse_kit.training.engines import check_engine, engine_of
from simcse_kit.training.folder import (
    BEST_MODEL,
    CHECKPOINTS,
    LOGS,
    prepare_run_dir_once,
    with_concrete_precision,
    with_device_defaults,
)
from simcse_kit.training.guards import AfterTrainingSignals, StopSignals
from simcse_kit.training.inputs import (
    contamination_guard,
    load_checked_tokenizer,
    load_guide,
    load_teacher,
    load_training_data,
    load_training_sets,
    training_texts,
)
from simcse_kit.training.loop import Prepared, fit, make_accelerator, prepare, start_processes
from simcse_kit.training.mixture import MixtureObjective
from simcse_kit.training.momentum_queue import MomentumQueue
from simcse_kit.training.objectives import SimCSEObjective
from simcse_kit.training.peers import Peers
from simcse_kit.training.selection import LEGACY_DEV_LABEL, LEGACY_DEV_METRIC, metric_label
from simcse_kit.training.steps import GradCacheStep, MomentumQueueStep, Step
from simcse_kit.training.teacher import TeacherTable
from simcse_kit.training.tracking import start_tracking, stop_tracking, tracker_names

logger = logging.getLogger(__name__)

# The same batching as `simcse-kit evaluate`, so the run's table and a later evaluate agree
# to the last digit (different padding changes fp32 sums in the last bits).
EVAL_BATCH_SIZE = 128


@dataclass
class Run(Prepared):
    """A text run wired and not yet run (:func:`build_run`).

    The accelerator with the prepared model, AdamW, schedule and loader (the fields of
    :class:`~simcse_kit.training.loop.Prepared`: ``fit(run, run.step, run.cfg.train)`` trains
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
    objective: SimCSEObjective | MixtureObjective
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
    is locked (:class:`~simcse_kit.training.guards.RunLock`) from before anything in it changes
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
    from_files = dataset is None
    tokenizer = load_checked_tokenizer(cfg)
    # Every text trained on against every evaluation set reported (data.decontaminate).
    guard = contamination_guard(cfg) if evaluate and from_files else None
    # With each file's token table: tokenised once, ahead of the loader (simcse_kit.data.tokens).
    sets = load_training_sets(cfg, tokenizer, guard) if from_files and cfg.data.datasets is not None else None
    dataset = (load_training_data(cfg, tokenizer, guard) if sets is None else None) if dataset is None else dataset
    # Legal, but every step would be the whole set: surely a typo. (A dataset given in code,
    # a benchmark's few sentences repeated in one batch, is the caller's choice.) Of a mixture,
    # every dataset must fill a batch: each batch is one dataset's.
    sizes = {name: len(part) for name, part in sets.items()} if sets is not None else {}
    for name, size in sizes.items():
        if cfg.train.batch_size > size:
            raise ConfigError(
                f"config key 'train.batch_size' = {cfg.train.batch_size}: larger than data.datasets entry {name!r} "
                f"({size} example(s)); each batch is drawn from one dataset: use a batch of at most {min(sizes.values())}"
            )
    if dataset is not None and from_files and cfg.train.batch_size > len(dataset):
        raise ConfigError(
            f"config key 'train.batch_size' = {cfg.train.batch_size}: larger than the training set "
            f"({len(dataset)} example(s) in {cfg.data.train_file}); use a batch of at most {len(dataset)}"
        )
    dev: DevScorer | None = None
    final_sts = None
    if evaluate:
        if cfg.data.dev_format == "beir":
            assert cfg.data.dev_file is not None  # RunConfig.validate: dev_format beir needs a dev_file
            dev = RetrievalDevEvaluator(cfg.data.dev_file, batch_size=EVAL_BATCH_SIZE, prompts=cfg.data.prompts)
        else:
            data = cfg.data
            dev = DevEvaluator(data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=data.dev_file, fmt=data.dev_format)
        final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE) if cfg.train.final_eval else None
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
    # One table of every training sentence, a mixture's datasets' together.
    texts = training_texts(cfg, dataset, sets) if cfg.loss.teacher is not None or cfg.loss.guide is not None else []
    teacher = load_teacher(cfg, texts)
    guide = load_guide(cfg, texts, teacher[1] if teacher else None)  # vets negatives
    if guard is not None and texts:
        guard.add_texts("the teacher's and the guide's sentences", texts)
    contamination = guard.report() if guard is not None else None
    out = Path(cfg.train.output_dir)
    heap = apply_mmap_threshold(cfg.train.mmap_threshold_mib)
    logger.info("memory: %s", heap.reason)

    accelerator = make_accelerator(cfg.train, cpu, logging_dir=out / LOGS)
    recorded = cfg  # config.yaml: the device's auto settings stay auto (each machine decides them)
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
    model = build_model(cfg)
    if from_files:  # a dataset given in code, a benchmark's few sentences in one batch, is the caller's choice
        parts = sets or {files_label(cfg.data.train_file): dataset}
        warn_if_a_batch_is_a_whole_set(cfg, base_encoder(model.encoder).config, parts)
    objective: SimCSEObjective | MixtureObjective
    if dataset is not None:
        negatives = negatives_of(dataset.column_names)  # k hard negatives per example: the data's
        objective = SimCSEObjective(
            cfg.data.mode,
            cfg.loss,
            teacher=teacher[0] if teacher else None,
            negatives=negatives,
            guide=guide[0] if guide else None,
        )
        loader = make_loader(
            cfg,
            dataset,
            tokenizer,
            accelerator.num_processes,
            accelerator.device,
            teacher[1].index if teacher else None,
            guide[1].index if guide else None,
            decoder=model.is_decoder,
        )
        extra: dict[str, Any] = {"base_model": cfg.model.name_or_path, "mode": cfg.data.mode, "train_file": cfg.data.train_file}
    else:
        assert sets is not None and cfg.data.datasets is not None
        modes_of = {spec.name: spec.mode for spec in cfg.data.datasets}
        per_dataset = {
            name: SimCSEObjective(
                modes_of[name],
                cfg.loss,
                teacher=teacher[0] if teacher else None,
                negatives=negatives_of(part.column_names),
                guide=guide[0] if guide else None,
            )
            for name, part in sets.items()
        }
        objective = MixtureObjective(per_dataset, accelerator.num_processes)
        accelerator.register_for_checkpointing(objective.tally)  # --resume reports what an uninterrupted run does
        loader = make_mixture_loader(
            cfg,
            sets,
            tokenizer,
            accelerator.num_processes,
            accelerator.device,
            model.is_decoder,
            teacher[1].index if teacher else None,
            guide[1].index if guide else None,
        )
        files = {spec.name: spec.file for spec in cfg.data.datasets}
        extra = {"base_model": cfg.model.name_or_path, "mode": "mixture", "datasets": modes_of, "train_file": files}
    if wrap_collate is not None:
        loader.collate_fn = wrap_collate(loader.collate_fn)
    step = make_step(cfg, model, objective, accelerator)
    if cfg.data.prompts:  # recorded with the model: evaluation and the export use them
        extra["prompts"] = cfg.data.prompts
    # STS dev reads its sentences as queries; a retrieval dev split applies both prompts itself.
    query_prompt = (cfg.data.prompts or {}).get("query", "") if cfg.data.dev_format != "beir" else ""
    evaluator = (
        ModelEvaluator(
            dev,
            tokenizer,
            cfg.model.eval_max_seq_len,
            accelerator.device,
            cfg.train.mixed_precision,
            query_prompt,
            cfg.train.selection_precision,
            selection_calibration(cfg, dataset, sets),
        )
        if dev is not None
        else None
    )
    # The best model records what selected it (no evaluator, evaluate=False: never saved).
    metric, label = (
        (evaluator.primary_metric, evaluator.metric_label) if evaluator is not None else (LEGACY_DEV_METRIC, LEGACY_DEV_LABEL)
    )
    save_best = partial(save_best_model, tokenizer=tokenizer, extra=extra, metric=metric, label=label)
    checkpoints = Checkpoints(out / CHECKPOINTS, out / BEST_MODEL, save_best)
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
        checkpoints=checkpoints,
        teacher=teacher[1] if teacher else None,
        tf32=tf32,
        skipped_rows=sum(skipped_rows(part) for part in (sets or {}).values()) if dataset is None else skipped_rows(dataset),
        guide=guide[1] if guide else None, contamination=contamination,
    )


def finish(run: Run, state: LoopState, out: Path) -> dict[str, Any]:
    """After the loop: metrics.json, the best model's STS table, the figures; the metrics."""
    cfg, accelerator, evaluator = run.cfg, run.accelerator, run.evaluator
    if evaluator is None:
        raise ValueError("finish: the run was built without its dev evaluator (build_run(evaluate=False))")
    objective = run.objective
    if isinstance(objective, MixtureObjective):
        examples = objective.examples_seen()  # the views per example differ between the datasets
    else:
        examples = state.rows_seen // objective.views_per_example()
    metrics = run_metrics(state, examples, objective.masked_negatives, evaluator)
    if isinstance(objective, MixtureObjective):
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
        table = run.teacher
        metrics["teacher"] = {
            "model": cfg.loss.teacher,
            "loss": cfg.loss.teacher_loss,
            "sentences": int(table.vectors.shape[0]),
            "width": table.width,
            "cache_key": table.key,
            "cache_hit": table.cache_hit,
            "seconds": table.seconds,
        }
    if run.guide is not None:
        loss = cfg.loss
        metrics["guide"] = {
            "model": loss.guide,
            "margin": loss.guide_margin,
            "margin_strategy": loss.guide_margin_strategy,
            "masked": run.objective.guided_total,  # (anchor, candidate) entries it dropped, all steps, all datasets
            "sentences": int(run.guide.vectors.shape[0]),
            "width": run.guide.width,
            "cache_key": run.guide.key,
            "cache_hit": run.guide.cache_hit,
        }
        logger.info("the guide dropped %d (anchor, candidate) entries", run.objective.guided_total)
    speed = {"tf32": run.tf32, "compile": cfg.train.compile, "num_workers": cfg.data.num_workers}
    metrics["speed"] = speed | {"packing": cfg.model.packing}
    if run.objective.masking:
        logger.info("false-negative masking removed %d (anchor, candidate) entries", run.objective.masked_negatives)
    trained = cfg.data.mode if cfg.data.datasets is None else " + ".join(dict.fromkeys(d.mode for d in cfg.data.datasets))
    have_best = (out / BEST_MODEL).is_dir()
    if accelerator.is_main_process:
        if not have_best:  # every evaluation non-finite or collapsed (warned at each)
            logger.warning(
                "no best model was saved: no evaluation gave a usable %s; no final STS table", evaluator.primary_metric
            )
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
        # The training's results first: the final table takes minutes on a CPU, and a stop
        # signal there (no handler left: nothing to checkpoint) lost them, exit 143 without a word.
        write_json_atomic(out / "metrics.json", metrics)
        if run.final_sts is not None and have_best:
            what = (
                f"the final STS table; training had finished and {out / 'metrics.json'} holds its results without the "
                f"table: score the best model with simcse-kit evaluate {out}"
            )
            with AfterTrainingSignals(what):
                model = SimCSEModel.load(out / BEST_MODEL, trust_remote_code=cfg.model.trust_remote_code)
                best = Encoder(model, run.tokenizer, cfg.model.eval_max_seq_len, accelerator.device)
                metrics["sts"] = run.final_sts(prompted(best.encode, (cfg.data.prompts or {}).get("query", "")))
            accelerator.log(
                {f"test/{task}": score for task, score in metrics["sts"].items() if "/" not in task}, step=state.global_step
            )
            write_json_atomic(out / "metrics.json", metrics)
            marked = format_marked_table(metrics["sts"], metrics.get("contamination"))
            logger.info("STS table of the best model:\n%s", marked)  # the CLI prints it too
        if have_best:  # the last line names only a folder that exists
            best_at = (state.best_step, evaluator.metric_label, state.best_score, evaluator.evaluator.path.name, out / BEST_MODEL)
            logger.info("best model (step %d, %s %.2f on %s) at %s", *best_at)
        else:
            logger.info("run finished without a best model: see the warnings above; metrics at %s", out / "metrics.json")
    stop_tracking(accelerator)
    return metrics


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


def make_loader(
    cfg: RunConfig,
    dataset: datasets.Dataset,
    tokenizer: Any,
    num_processes: int,
    device: torch.device | str = "cpu",
    teacher_index: Mapping[str, int] | None = None,
    guide_index: Mapping[str, int] | None = None,
    decoder: bool = False,
) -> DataLoader:
    """Shuffled batches of ``train.batch_size`` examples over all processes; a seeded
    generator of its own, which the loop checkpoints so a resume redraws the order.
    Pinned memory on CUDA (:func:`simcse_kit.data.pipeline.loader_options`); batches collated
    from the token table's ids (:mod:`simcse_kit.data.tokens`; a dataset given in memory is
    tokenised here) and the packing plan made in the collator, so in the workers with
    ``data.num_workers > 0``.
    ``teacher_index``: with a teacher, each batch also carries its rows' ``teacher_rows``;
    ``guide_index``: with a guide, their ``guide_rows``.
    ``decoder``: the model is a decoder, whose left-padded batches pack too."""
    options = loader_options(device)
    negatives = negatives_of(dataset.column_names)
    tokenization = Tokenization(tokenizer, cfg.model.max_seq_len, cfg.data.prompts)
    if not dataset.cache_files:  # a training set given in memory (in code, a scored pair file): tokenised here
        dataset = with_tokens(dataset, tokenization, cfg.data.mode)
    from_table = all(name in dataset.column_names for name in id_columns(tokenization.sources(cfg.data.mode, negatives)))
    logger.info(
        "input pipeline: %s; %s worker process(es); pinned memory and asynchronous copies %s",
        "token ids from the token table" if from_table else "texts tokenised in the collator",
        cfg.data.num_workers,
        "on" if options.pin_memory else "off (not CUDA)",
    )
    per_process = cfg.train.batch_size // num_processes
    collator = make_collator(
        cfg,
        tokenizer,
        cfg.data.mode,
        cfg.data.prompts,
        negatives,
        teacher_index,
        guide_index,
        decoder=decoder,
    )
    generator = torch.Generator().manual_seed(cfg.train.seed)
    return DataLoader(
        dataset,
        batch_size=per_process,
        sampler=ShuffledIndices(dataset, generator=generator),  # shuffle=True's order, without a list of every index
        drop_last=len(dataset) >= per_process,  # a short last batch has too few negatives
        collate_fn=collator,
        generator=generator,
        num_workers=cfg.data.num_workers or 0,  # auto (None) not made concrete: the CPU's 0
        pin_memory=options.pin_memory,
    )


def make_collator(
    cfg: RunConfig,
    tokenizer: Any,
    mode: str,
    prompts: Mapping[str, str] | None,
    negatives: int,
    teacher_index: Mapping[str, int] | None = None,
    guide_index: Mapping[str, int] | None = None,
    decoder: bool = False,
) -> ContrastiveCollator:
    """The collator of a dataset in ``mode`` with ``negatives`` hard negatives per example and
    these ``prompts``; the rest (lengths, text ids, the packing plan) from ``cfg``."""
    return ContrastiveCollator(
        tokenizer,
        mode,
        cfg.model.max_seq_len,
        with_text_ids=cfg.loss.mask_false_negatives,
        prompts=view_prompts(prompts, mode, negatives),
        negatives=negatives,
        word_repetition=cfg.data.word_repetition,
        seed=cfg.train.seed,
        teacher_index=teacher_index,
        guide_index=guide_index,
        teacher_scores=cfg.loss.distill is not None,
        packing_plan=cfg.model.packing is not False,  # auto (None) means on, as in SimCSEModel.from_config
        pack_left_padded=decoder,  # a decoder's left-padded rows pack too
    )


def make_mixture_loader(
    cfg: RunConfig,
    sets: Mapping[str, datasets.Dataset],
    tokenizer: Any,
    num_processes: int,
    device: torch.device | str = "cpu",
    decoder: bool = False,
    teacher_index: Mapping[str, int] | None = None,
    guide_index: Mapping[str, int] | None = None,
) -> DataLoader:
    """:func:`make_loader` for ``data.datasets``: each global batch from one dataset, drawn by
    ``data.sampling`` (:class:`~simcse_kit.data.mixture.MixtureBatches`, from the loader's
    seeded generator, which the loop checkpoints) and collated in that dataset's mode with its
    prompts (``data.prompts`` where it has none); ``teacher_index``/``guide_index``: the one
    table of every dataset's sentences (:func:`~simcse_kit.training.inputs.training_texts`)."""
    assert cfg.data.datasets is not None
    specs = {spec.name: spec for spec in cfg.data.datasets}
    options = loader_options(device)
    collators = {
        name: make_collator(
            cfg,
            tokenizer,
            specs[name].mode,
            specs[name].prompts or cfg.data.prompts,
            negatives_of(part.column_names),
            teacher_index,
            guide_index,
            decoder=decoder,
        )
        for name, part in sets.items()
    }
    mixture = Mixture(sets)
    generator = torch.Generator().manual_seed(cfg.train.seed)
    weights = [specs[name].weight or 1.0 for name in sets] if cfg.data.sampling == "weighted" else None
    batches = MixtureBatches(mixture.sizes, cfg.train.batch_size, num_processes, cfg.data.sampling, generator, weights)
    counts = ", ".join(f"{name} {n}" for name, n in zip(sets, batches.counts, strict=True))
    logger.info("datasets, %s: batches an epoch: %s", cfg.data.sampling, counts)
    check_every_dataset_trains(list(sets), batches.counts, weights)
    return DataLoader(
        mixture,
        batch_sampler=batches,
        collate_fn=MixtureCollator(collators),
        generator=generator,
        num_workers=cfg.data.num_workers or 0,
        pin_memory=options.pin_memory,
    )


# Bytes autograd keeps for the backward pass per token, hidden unit and layer of the encoder,
# in fp32 with SDPA attention: 86 measured on all-MiniLM-L6-v2 (64 and 128 rows of 32 tokens,
# the saved tensors' storage less the weights it also keeps).
ACTIVATION_BYTES = 86


def warn_if_a_batch_is_a_whole_set(cfg: RunConfig, encoder_config: Any, parts: Mapping[str, datasets.Dataset | None]) -> None:
    """Warn, with an estimate of the memory, where one batch holds a whole training set (of
    ``parts``, by name): every step is then one batch of all of it, legal and surely a typo
    (more than the set is refused above; a 12k-sentence set was one such batch)."""
    mode_of = {spec.name: spec.mode for spec in cfg.data.datasets or []}
    hidden, layers = getattr(encoder_config, "hidden_size", None), getattr(encoder_config, "num_hidden_layers", None)
    for name, part in parts.items():
        if part is None or cfg.train.batch_size != len(part):
            continue
        rows = len(part) * views_per_example(mode_of.get(name, cfg.data.mode), negatives_of(part.column_names))
        size = ""
        if isinstance(hidden, int) and isinstance(layers, int):
            gb = rows * cfg.model.max_seq_len * hidden * layers * ACTIVATION_BYTES / 1e9
            size = f"; up to about {gb:.3g} GB of activations for its {rows} rows of {cfg.model.max_seq_len} tokens in fp32"
        logger.warning(
            "train.batch_size %d is the whole of %s (%d examples): every step is one batch of all of it%s; "
            "a smaller batch gives more steps for the same data",
            cfg.train.batch_size,
            name,
            len(part),
            size,
        )


def check_every_dataset_trains(names: list[str], counts: list[int], weights: list[float] | None) -> None:
    """Refuse a listed dataset that gets no batch an epoch (a tiny ``weight`` under weighted
    sampling: 1e-9 was said only at INFO), naming the weight that would give it one.

    Raises:
        ConfigError: naming the ``data.datasets`` entry, its weight and its 0 batches.
    """
    total = sum(counts)
    for d, (name, count) in enumerate(zip(names, counts, strict=True)):
        if count:
            continue
        weight = weights[d] if weights is not None else 1.0
        others = sum(weights or []) - weight
        # Its quota total * w / (others + w) reaches one batch at w = others / (total - 1) (a largest
        # remainder may give it one below that).
        sure = weights is not None and total > 1
        enough = f"a weight of {others / max(1, total - 1):.3g} is sure to give it one; or " if sure else ""
        raise ConfigError(
            f"config key 'data.datasets' entry {name!r}: weight {weight:g} gives it 0 of the epoch's {total} batches, "
            f"so it would never be trained on: {enough}leave it out"
        )


def make_step(
    cfg: RunConfig, model: SimCSEModel, objective: SimCSEObjective | MixtureObjective, accelerator: Accelerator
) -> Step:
    """The loop's step: the objective itself, or GradCache or the momentum queue around it.

    The queue's momentum encoder is copied from the model *before* ``accelerator.prepare``
    (a copy of a prepared model would carry its autocast wrapper) and registered for
    checkpointing, so ``--resume`` restores the queue with the rest. A mixture's objective is
    its own step (RunConfig.validate refuses GradCache and the queue with data.datasets).
    """
    if isinstance(objective, MixtureObjective):
        return objective
    if cfg.train.grad_cache_chunk > 0:  # big batches: chunk-wise encoder backward, same gradients
        return GradCacheStep(objective, cfg.train.grad_cache_chunk, accelerator)
    if cfg.loss.queue_size > 0:  # MoCo-style negatives (simcse_kit.training.momentum_queue)
        guide = cfg.loss.guide is not None  # the queue keeps its keys' guide rows
        queue = MomentumQueue(model, cfg.loss.queue_size, cfg.loss.momentum, model.encoder.config.hidden_size, guide)
        accelerator.register_for_checkpointing(queue)
        logger.info("momentum queue: %d negatives, momentum %.4f", cfg.loss.queue_size, cfg.loss.momentum)
        return MomentumQueueStep(objective, queue, accelerator)
    return objective


SELECTION_CALIBRATION = 1000
"""Training sentences whose ranges quantize the dev vectors under ``train.selection_precision: int8``."""


def selection_calibration(
    cfg: RunConfig, dataset: datasets.Dataset | None, sets: dict[str, datasets.Dataset] | None
) -> list[str]:
    """The first :data:`SELECTION_CALIBRATION` distinct training sentences with an int8/uint8
    ``train.selection_precision``; none otherwise."""
    if cfg.train.selection_precision not in ("int8", "uint8"):
        return []

    def head(part: datasets.Dataset) -> datasets.Dataset:
        return part.select(range(min(len(part), SELECTION_CALIBRATION)))

    heads = None if sets is None else {name: head(part) for name, part in sets.items()}
    return training_texts(cfg, None if dataset is None else head(dataset), heads)[:SELECTION_CALIBRATION]


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
