"""A text training run: config -> data -> model -> loop -> best model + metrics.

The run folder holds ``config.yaml`` (resolved), ``metrics.json`` (per-eval dev
scores, final STS table, train time, throughput), ``best_model/`` (the checkpoint
with the best STS-B dev score, self-describing), ``training_curves.png`` (loss and dev
score against the step, best step marked), ``alignment_uniformity.png``, with
``train.report_to`` the trackers' files under ``logs/`` (:mod:`simcse_kit.tracking`) and,
with ``train.save_steps``, ``checkpoints/`` for ``--resume``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.architectures import max_tokens
from simcse_kit.batch import views_per_example
from simcse_kit.config import RunConfig, load_config, save_config
from simcse_kit.data import ContrastiveCollator, load_train_dataset, mix_datasets
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import DevEvaluator, STSEvaluator, format_table, plot_trajectory
from simcse_kit.evaluation.readers import PAIR_READERS
from simcse_kit.fastpath import enable_fast_dropout
from simcse_kit.fileio import remove_dir, write_json_atomic
from simcse_kit.gradcache import GradCacheStep
from simcse_kit.heap import apply_mmap_threshold
from simcse_kit.inference import Encoder
from simcse_kit.modeling import SimCSEModel, resolve_model_path
from simcse_kit.negatives import MomentumQueue, MomentumQueueStep
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.pipeline import loader_options
from simcse_kit.plots import plot_training_curves
from simcse_kit.precision import check_cuda_flags, set_tf32
from simcse_kit.tracking import start_tracking, stop_tracking, tracker_names
from simcse_kit.trainer import Checkpoints, LoopState, Step, fit, latest_checkpoint, make_accelerator, with_concrete_precision

logger = logging.getLogger(__name__)

# The same batching as `simcse-kit evaluate`, so the run's table and a later evaluate agree
# to the last digit (different padding changes fp32 sums in the last bits).
EVAL_BATCH_SIZE = 128

# Settings that may change between a run and its --resume: they do not change what is
# computed (where files go, progress display, loader workers, checkpoint frequency,
# trackers, the allocator's mmap threshold).
RESUME_MAY_DIFFER = (
    "train.output_dir",
    "train.progress_bar",
    "data.num_workers",
    "train.save_steps",
    "train.report_to",
    "train.mmap_threshold_mib",
)
CHECKPOINTS = "checkpoints"
LOGS = "logs"  # the experiment trackers' folder in the run folder
BEST_MODEL = "best_model"


def train(cfg: RunConfig, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run one training job as configured; return the metrics written to metrics.json.

    With ``cfg.train.save_steps`` the full training state is saved every that many
    steps under ``output_dir/checkpoints``; ``resume=True`` continues from the newest
    one and ends with the same model and metrics as an uninterrupted run.
    """
    # Everything that can be wrong with the inputs fails here, before the run folder is
    # written: the training data, the dev and final STS files, the model folder.
    dataset = load_training_data(cfg)
    dev = DevEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=cfg.data.dev_file, fmt=cfg.data.dev_format)
    final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE) if cfg.train.final_eval else None
    tokenizer = load_checked_tokenizer(cfg)
    tracker_names(cfg.train.report_to)  # an unknown or uninstalled tracker
    # "auto" precision becomes what this machine computes fastest, before the run folder
    # records the config: config.yaml says what ran, and a resume on another machine that
    # would decide differently is refused rather than silently mixed.
    train_cfg, precision = with_concrete_precision(cfg.train)
    cfg = replace(cfg, train=train_cfg)
    out = prepare_run_dir(cfg, overwrite, resume)
    heap = apply_mmap_threshold(cfg.train.mmap_threshold_mib)
    logger.info("memory: %s", heap.reason)

    accelerator = make_accelerator(cfg.train, logging_dir=out / LOGS)
    tf32 = set_tf32(accelerator.device)
    check_cuda_flags(accelerator.device, fast_dropout=cfg.train.fast_dropout is True, bf16_weights=cfg.train.bf16_weights is True)
    start_tracking(accelerator, cfg, run_name=out.name)  # the whole resolved config as hyper-parameters
    model = build_model(cfg)
    objective = SimCSEObjective(cfg.data.mode, cfg.loss)
    loader = make_loader(cfg, dataset, tokenizer, accelerator.num_processes, accelerator.device)
    step = make_step(cfg, model, objective, accelerator)
    extra = {"base_model": cfg.model.name_or_path, "mode": cfg.data.mode, "train_file": cfg.data.train_file}
    checkpoints = Checkpoints(out / CHECKPOINTS, out / BEST_MODEL, partial(save_best_model, tokenizer=tokenizer, extra=extra))
    evaluator = ModelEvaluator(dev, tokenizer, cfg.model.eval_max_seq_len, accelerator.device, cfg.train.mixed_precision)

    state = fit(
        model, step, loader, cfg.train, accelerator=accelerator, evaluator=evaluator, checkpoints=checkpoints, resume=resume
    )

    metrics = run_metrics(state, views_per_example(cfg.data.mode), objective.masked_negatives)
    metrics["precision"] = (
        asdict(precision)
        if precision is not None
        else {
            "mixed_precision": cfg.train.mixed_precision,
            "bf16_weights": cfg.train.bf16_weights,
            "fast_dropout": cfg.train.fast_dropout,
            "reason": "set in the config",
        }
    )
    metrics["memory"] = asdict(heap)
    metrics["speed"] = {"tf32": tf32, "compile": cfg.train.compile, "num_workers": cfg.data.num_workers}
    if objective.masking:
        logger.info("false-negative masking removed %d (anchor, candidate) entries", objective.masked_negatives)
    if accelerator.is_main_process:
        if final_sts is not None:
            best = Encoder(SimCSEModel.load(out / BEST_MODEL), tokenizer, cfg.model.eval_max_seq_len, accelerator.device)
            metrics["sts"] = final_sts(best.encode)
            accelerator.log(
                {f"test/{task}": score for task, score in metrics["sts"].items() if "/" not in task}, step=state.global_step
            )
        plot_trajectory(metrics["evals"], out / "alignment_uniformity.png", f"STS-B dev, {cfg.data.mode}")
        plot_training_curves(
            state.losses,
            state.evals,
            out / "training_curves.png",
            evaluator.primary_metric,
            state.best_step,
            f"{out.name}: {cfg.data.mode}, {Path(cfg.model.name_or_path).name}",
        )
        write_json_atomic(out / "metrics.json", metrics)
        best_at = (state.best_step, state.best_score, dev.path.name, out / BEST_MODEL)
        logger.info("best model (step %d, dev %.2f on %s) at %s", *best_at)
        if final_sts is not None:
            print(format_table(metrics["sts"]))
    stop_tracking(accelerator)
    return metrics


# --------------------------------------------------------------------------- the run folder


def config_differences(saved: RunConfig, requested: RunConfig) -> list[str]:
    """``'section.key: saved -> requested'`` for each setting that would change the run.

    A saved config records what ran, so ``auto`` precision settings in ``requested`` are
    decided for this machine before comparing (a recipe's ``auto`` matches a run that
    chose bf16 here, and not one that chose it on another machine's hardware)."""
    saved, requested = (replace(c, train=with_concrete_precision(c.train)[0]) for c in (saved, requested))
    out = []
    old, new = saved.to_dict(), requested.to_dict()
    for section, values in new.items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if dotted not in RESUME_MAY_DIFFER and old[section][key] != value:
                out.append(f"{dotted}: {old[section][key]!r} -> {value!r}")
    return out


def prepare_run_dir(cfg: RunConfig, overwrite: bool = False, resume: bool = False) -> Path:
    """Create the run folder; refuse to clobber a finished or unfinished run unless asked.

    With ``resume`` the folder's saved ``config.yaml`` must match ``cfg`` in everything
    but :data:`RESUME_MAY_DIFFER`; a folder with nothing in it yet starts afresh (so a
    restart script may always pass ``--resume``).
    """
    out = Path(cfg.train.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config key 'train.output_dir' = {str(out)!r}: exists and is not a folder")
    finished = (out / "metrics.json").exists()
    if resume:
        if overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        if finished:
            raise ConfigError(f"{out} holds a finished run (metrics.json); nothing to resume")
        saved_path = out / "config.yaml"
        if saved_path.is_file():
            diffs = config_differences(load_config(saved_path), cfg)
            if diffs:
                raise ConfigError(
                    f"--resume: the requested config differs from {saved_path} in {'; '.join(diffs)}; "
                    "resume with the same settings, or start a new run in another --output-dir"
                )
            return out
        logger.warning("--resume: %s holds no run yet; starting from the beginning", out)
    elif finished and not overwrite:
        raise ConfigError(f"{out} already holds a finished run; choose another --output-dir or pass --overwrite")
    elif not overwrite and latest_checkpoint(out / CHECKPOINTS) is not None:
        raise ConfigError(
            f"{out} holds an unfinished run ({latest_checkpoint(out / CHECKPOINTS)}); "
            "pass --resume to continue it or --overwrite to start over"
        )
    if overwrite and (out / CHECKPOINTS).exists():
        remove_dir(out / CHECKPOINTS)  # a fresh run must never resume into the old one's state
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    return out


def save_best_model(
    model: SimCSEModel, folder: Path, metrics: dict[str, float], *, tokenizer: Any, extra: dict[str, Any]
) -> None:
    """The run's ``best_model/``: the model, its tokenizer, where it came from and its dev score."""
    model.save(folder, tokenizer, extra | {"step": int(metrics["step"]), "stsb_dev": metrics["stsb_dev"]})


# --------------------------------------------------------------------------- the pieces


def load_checked_tokenizer(cfg: RunConfig) -> Any:
    """The model's tokenizer, after checking that the model folder loads and takes the
    configured lengths; raises ConfigError naming the key instead of a library trace."""
    path = resolve_model_path(cfg.model.name_or_path)
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1  # a hub id is "org/name"
    if looks_local and not Path(path).expanduser().is_dir():
        raise ConfigError(f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}: no such folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        hf_config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        key = f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}"
        raise ConfigError(f"{key}: cannot load a model there ({reason})") from None
    limit = max_tokens(hf_config)  # RoBERTa-style offset positions take two fewer tokens
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if isinstance(limit, int) and value > limit:
            raise ConfigError(f"config key 'model.{key}' = {value}: the model takes at most {limit} positions")
    return tokenizer


def build_model(cfg: RunConfig) -> SimCSEModel:
    """The training model, seeded: a fresh MLP head is initialised at random, and a run
    (or its resume) must be reproducible from its config alone."""
    set_seed(cfg.train.seed)
    model = SimCSEModel.from_config(cfg.model)
    # The transformer's own pooler (BERT's dense + tanh on [CLS]) feeds none of our
    # poolers; DDP stops on parameters that never get a gradient, so it is frozen (it
    # would not change anyway: AdamW skips parameters without a gradient).
    hf_pooler = getattr(model.encoder, "pooler", None)
    if isinstance(hf_pooler, nn.Module):
        hf_pooler.requires_grad_(False)
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


def load_training_data(cfg: RunConfig) -> datasets.Dataset:
    """The training set as configured: ``train_file`` (or, with ``train_format`` stsb/sick,
    the distinct sentences of that scored pair file, scores unused: a domain's unlabelled
    text), plus ``mix_ratio`` of it from ``mix_file`` (the general corpus)."""
    data = cfg.data
    sentences = None
    if data.train_format != "auto":
        pairs = PAIR_READERS[data.train_format](data.train_file)
        sentences = list(dict.fromkeys(s for pair in zip(pairs.sentences1, pairs.sentences2, strict=True) for s in pair))
    dataset = load_train_dataset(data.train_file, data.mode, data.max_train_samples, sentences=sentences)
    if data.mix_file is not None and data.mix_ratio > 0:
        general = load_train_dataset(data.mix_file, data.mode)
        dataset = mix_datasets(dataset, general, data.mix_ratio, cfg.train.seed)
    return dataset


def make_loader(
    cfg: RunConfig, dataset: datasets.Dataset, tokenizer: Any, num_processes: int, device: torch.device | str = "cpu"
) -> DataLoader:
    """Shuffled batches of ``train.batch_size`` examples over all processes; a seeded
    generator of its own, which the loop checkpoints so a resume redraws the order.
    Pinned memory on CUDA (:func:`simcse_kit.pipeline.loader_options`); the packing plan
    made in the collator, so in the workers with ``data.num_workers > 0``."""
    options = loader_options(device)
    logger.info(
        "input pipeline: %d worker process(es); pinned memory and asynchronous copies %s",
        cfg.data.num_workers,
        "on" if options.pin_memory else "off (not CUDA)",
    )
    per_process = cfg.train.batch_size // num_processes
    collator = ContrastiveCollator(
        tokenizer,
        cfg.data.mode,
        cfg.model.max_seq_len,
        with_text_ids=cfg.loss.mask_false_negatives,
        word_repetition=cfg.data.word_repetition,
        seed=cfg.train.seed,
        packing_plan=cfg.model.packing,
    )
    return DataLoader(
        dataset,
        batch_size=per_process,
        shuffle=True,
        drop_last=len(dataset) >= per_process,  # a short last batch has too few negatives
        collate_fn=collator,
        generator=torch.Generator().manual_seed(cfg.train.seed),
        num_workers=cfg.data.num_workers,
        pin_memory=options.pin_memory,
    )


def make_step(cfg: RunConfig, model: SimCSEModel, objective: SimCSEObjective, accelerator: Accelerator) -> Step:
    """The loop's step: the objective itself, or GradCache or the momentum queue around it.

    The queue's momentum encoder is copied from the model *before* ``accelerator.prepare``
    (a copy of a prepared model would carry its autocast wrapper) and registered for
    checkpointing, so ``--resume`` restores the queue with the rest.
    """
    if cfg.train.grad_cache_chunk > 0:  # big batches: chunk-wise encoder backward, same gradients
        return GradCacheStep(objective, cfg.train.grad_cache_chunk, accelerator)
    if cfg.loss.queue_size > 0:  # MoCo-style negatives (simcse_kit.negatives)
        queue = MomentumQueue(model, cfg.loss.queue_size, cfg.loss.momentum, model.encoder.config.hidden_size)
        accelerator.register_for_checkpointing(queue)
        logger.info("momentum queue: %d negatives, momentum %.4f", cfg.loss.queue_size, cfg.loss.momentum)
        return MomentumQueueStep(objective, queue, accelerator)
    return objective


@dataclass
class ModelEvaluator:
    """The loop's ``evaluator(model) -> metrics`` from an evaluator of an encode function
    (here the dev evaluator: STS-B dev score, alignment and uniformity from one encoding)."""

    evaluator: Callable[[Callable[[Sequence[str]], torch.Tensor]], dict[str, float]]
    tokenizer: Any
    max_seq_len: int
    device: torch.device
    precision: str

    @property
    def primary_metric(self) -> str:
        return self.evaluator.primary_metric  # type: ignore[attr-defined]

    def __call__(self, model: nn.Module) -> dict[str, float]:
        encoder = Encoder(model, self.tokenizer, self.max_seq_len, self.device, self.precision)
        return self.evaluator(encoder.encode)


def run_metrics(state: LoopState, views: int, masked_negatives: int) -> dict[str, Any]:
    """metrics.json's training part: best dev score and step, time, throughput, curves."""
    seconds = max(state.train_seconds, 1e-9)
    return {
        "best_step": state.best_step,
        "best_stsb_dev": state.best_score,
        "steps": state.global_step,
        "train_seconds": state.train_seconds,
        "examples_per_second": state.rows_seen / views / seconds,
        "sentences_per_second": state.rows_seen / seconds,
        "losses": state.losses,
        "evals": state.evals,
        "masked_negatives": masked_negatives,
    }
