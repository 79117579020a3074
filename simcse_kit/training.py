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
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.architectures import max_tokens
from simcse_kit.batch import VIEW_COLUMNS, view_prompts, views_per_example
from simcse_kit.config import RunConfig, load_config, save_config
from simcse_kit.data import ContrastiveCollator, load_train_dataset, mix_datasets
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import DevEvaluator, RetrievalDevEvaluator, STSEvaluator, format_table, plot_trajectory
from simcse_kit.evaluation.encoding import prompted
from simcse_kit.evaluation.readers import PAIR_READERS
from simcse_kit.fastpath import enable_fast_dropout
from simcse_kit.fileio import folder_contents, remove_dir, write_json_atomic
from simcse_kit.guards import LOCK_FILE, RunLock, StopSignals
from simcse_kit.heap import apply_mmap_threshold
from simcse_kit.inference import Encoder
from simcse_kit.model_checks import check_tokenizer, check_tokenizer_files, check_weights
from simcse_kit.modeling import SimCSEModel, resolve_model_path
from simcse_kit.negatives import MomentumQueue
from simcse_kit.objectives import SimCSEObjective, TeacherTargets
from simcse_kit.pipeline import loader_options
from simcse_kit.plots import plot_training_curves
from simcse_kit.precision import check_cuda_flags, set_tf32
from simcse_kit.steps import GradCacheStep, MomentumQueueStep, Step
from simcse_kit.teacher import TeacherTable, load_teacher_table, pca_projection, teacher_texts
from simcse_kit.tracking import start_tracking, stop_tracking, tracker_names
from simcse_kit.trainer import Checkpoints, LoopState, fit, latest_checkpoint, make_accelerator, with_concrete_precision

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
    "loss.teacher_cache_dir",
)
CHECKPOINTS = "checkpoints"
LOGS = "logs"  # the experiment trackers' folder in the run folder
BEST_MODEL = "best_model"


def train(cfg: RunConfig, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run one training job as configured; return the metrics written to metrics.json.

    With ``cfg.train.save_steps`` the full training state is saved every that many
    steps under ``output_dir/checkpoints``; ``resume=True`` continues from the newest
    one and ends with the same model and metrics as an uninterrupted run. The run folder
    is locked (:class:`~simcse_kit.guards.RunLock`) from before anything in it changes
    until this returns or raises.
    """
    with ExitStack() as held:
        return _train(cfg, overwrite, resume, held)


def _train(cfg: RunConfig, overwrite: bool, resume: bool, held: ExitStack) -> dict[str, Any]:
    # Everything that can be wrong with the inputs fails here, before the run folder is
    # written: the training data, the dev and final STS files, the model folder.
    dataset = load_training_data(cfg)
    dev = (
        RetrievalDevEvaluator(cfg.data.dev_file, batch_size=EVAL_BATCH_SIZE, prompts=cfg.data.prompts)  # type: ignore[arg-type]
        if cfg.data.dev_format == "beir"
        else DevEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE, path=cfg.data.dev_file, fmt=cfg.data.dev_format)
    )
    final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE) if cfg.train.final_eval else None
    tokenizer = load_checked_tokenizer(cfg)
    tracker_names(cfg.train.report_to)  # an unknown or uninstalled tracker
    # "auto" precision becomes what this machine computes fastest, before the run folder
    # records the config: config.yaml says what ran, and a resume on another machine that
    # would decide differently is refused rather than silently mixed.
    train_cfg, precision = with_concrete_precision(cfg.train)
    cfg = replace(cfg, train=train_cfg)
    # The teacher's vectors too (encoded once, or read from the cache): a teacher that
    # does not load, or cannot match the student, fails before the run folder exists.
    teacher = load_teacher(cfg, dataset)
    out = prepare_run_dir(cfg, overwrite, resume, held)
    heap = apply_mmap_threshold(cfg.train.mmap_threshold_mib)
    logger.info("memory: %s", heap.reason)

    accelerator = make_accelerator(cfg.train, logging_dir=out / LOGS)
    cfg = with_device_defaults(cfg, accelerator.device, accelerator.num_processes)
    tf32 = set_tf32(accelerator.device)
    check_cuda_flags(accelerator.device, fast_dropout=cfg.train.fast_dropout is True, bf16_weights=cfg.train.bf16_weights is True)
    start_tracking(accelerator, cfg, run_name=out.name)  # the whole resolved config as hyper-parameters
    model = build_model(cfg)
    objective = SimCSEObjective(cfg.data.mode, cfg.loss, teacher=teacher[0] if teacher else None)
    loader = make_loader(
        cfg, dataset, tokenizer, accelerator.num_processes, accelerator.device, teacher[1].index if teacher else None
    )
    step = make_step(cfg, model, objective, accelerator)
    extra = {"base_model": cfg.model.name_or_path, "mode": cfg.data.mode, "train_file": cfg.data.train_file}
    if cfg.data.prompts:  # recorded with the model: evaluation and the export use them
        extra["prompts"] = cfg.data.prompts
    checkpoints = Checkpoints(out / CHECKPOINTS, out / BEST_MODEL, partial(save_best_model, tokenizer=tokenizer, extra=extra))
    # STS dev reads its sentences as queries; a retrieval dev split applies both prompts itself.
    query_prompt = (cfg.data.prompts or {}).get("query", "") if cfg.data.dev_format != "beir" else ""
    evaluator = ModelEvaluator(
        dev, tokenizer, cfg.model.eval_max_seq_len, accelerator.device, cfg.train.mixed_precision, query_prompt
    )

    # SIGTERM/SIGUSR1/SIGINT during training: a checkpoint, then guards.Stopped. The default
    # handlers are back for the final evaluation: there is nothing left to checkpoint.
    with StopSignals() as signals:
        state = fit(
            model,
            step,
            loader,
            cfg.train,
            accelerator=accelerator,
            evaluator=evaluator,
            checkpoints=checkpoints,
            resume=resume,
            signals=signals,
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
    if teacher is not None:
        table = teacher[1]
        metrics["teacher"] = {
            "model": cfg.loss.teacher,
            "loss": cfg.loss.teacher_loss,
            "sentences": int(table.vectors.shape[0]),
            "width": table.width,
            "cache_key": table.key,
            "cache_hit": table.cache_hit,
            "seconds": table.seconds,
        }
    metrics["speed"] = {
        "tf32": tf32,
        "compile": cfg.train.compile,
        "num_workers": cfg.data.num_workers,
        "packing": cfg.model.packing,
    }
    if objective.masking:
        logger.info("false-negative masking removed %d (anchor, candidate) entries", objective.masked_negatives)
    have_best = (out / BEST_MODEL).is_dir()
    if accelerator.is_main_process:
        if not have_best:  # every evaluation non-finite or collapsed (warned at each)
            logger.warning(
                "no best model was saved: no evaluation gave a usable %s; no final STS table", evaluator.primary_metric
            )
        if final_sts is not None and have_best:
            best = Encoder(SimCSEModel.load(out / BEST_MODEL), tokenizer, cfg.model.eval_max_seq_len, accelerator.device)
            metrics["sts"] = final_sts(prompted(best.encode, (cfg.data.prompts or {}).get("query", "")))
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
        if have_best:  # the last line names only a folder that exists
            best_at = (state.best_step, state.best_score, dev.path.name, out / BEST_MODEL)
            logger.info("best model (step %d, dev %.2f on %s) at %s", *best_at)
        else:
            logger.info("run finished without a best model: see the warnings above; metrics at %s", out / "metrics.json")
        if final_sts is not None and have_best:
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


def prepare_run_dir(cfg: RunConfig, overwrite: bool = False, resume: bool = False, held: ExitStack | None = None) -> Path:
    """Create the run folder; refuse to clobber a finished or unfinished run unless asked.

    With ``resume`` the folder's saved ``config.yaml`` must match ``cfg`` in everything
    but :data:`RESUME_MAY_DIFFER`; a folder with nothing in it yet starts afresh (so a
    restart script may always pass ``--resume``). With ``held`` the folder is locked
    first (:class:`~simcse_kit.guards.RunLock`, released when ``held`` closes): a second
    run into it fails here, before it changes anything.
    """
    out = Path(cfg.train.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config key 'train.output_dir' = {str(out)!r}: exists and is not a folder")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    if held is not None:
        held.enter_context(RunLock(out))
    finished = (out / "metrics.json").exists()
    if resume:
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
    if overwrite and not (out / "config.yaml").is_file() and folder_contents(out, ignore=(LOCK_FILE,)):
        # --overwrite starts over in a run folder; a folder that is not one (no config.yaml) is left alone.
        raise ConfigError(
            f"{out}: --overwrite replaces only a simcse-kit run folder (with config.yaml) or an empty one; "
            f"this one holds {', '.join(folder_contents(out, ignore=(LOCK_FILE,)))}: choose another --output-dir"
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
    check_weights(path)  # truncated weights or a corrupt JSON file, named before the run folder exists
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        hf_config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        key = f"config key 'model.name_or_path' = {cfg.model.name_or_path!r}"
        raise ConfigError(f"{key}: cannot load a model there ({reason})") from None
    check_tokenizer_files(path)  # without them transformers builds a 5-token placeholder vocabulary
    check_tokenizer(tokenizer, getattr(hf_config, "vocab_size", None), path)
    limit = max_tokens(hf_config)  # RoBERTa-style offset positions take two fewer tokens
    # A max_length below the special tokens' count is not applied at all: the tokenizer
    # logs an error and returns the whole sentence (--max-seq-len 1 trained on full
    # sentences); exactly that count leaves no word. So: at least one word's room.
    least = tokenizer.num_special_tokens_to_add() + 1
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if value < least:
            raise ConfigError(
                f"config key 'model.{key}' = {value}: must be at least {least} "
                f"(the tokenizer adds {least - 1} special tokens; below that it would not truncate at all)"
            )
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if isinstance(limit, int) and value > limit:
            raise ConfigError(f"config key 'model.{key}' = {value}: the model takes at most {limit} positions")
    hidden, dims = getattr(hf_config, "hidden_size", None), cfg.loss.matryoshka_dims or []
    if isinstance(hidden, int) and any(d > hidden for d in dims):
        raise ConfigError(f"config key 'loss.matryoshka_dims' = {dims}: the model's embeddings have {hidden} dimensions")
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


def load_teacher(cfg: RunConfig, dataset: datasets.Dataset) -> tuple[TeacherTargets, TeacherTable] | None:
    """With ``loss.teacher``: its vectors of every distinct training sentence (cached) and
    the objective's teacher term; None without a teacher.

    Several processes: the main process encodes (or reads the cache) first, the others
    then read its cache. A wider teacher for ``embedding`` distillation is projected to
    the student's width by PCA (``loss.teacher_projection: pca``) or refused.
    """
    loss = cfg.loss
    if loss.teacher is None:
        return None
    texts = teacher_texts({name: dataset[name] for name in set(VIEW_COLUMNS[cfg.data.mode])}, cfg.data.mode)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    order = nullcontext()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        state = PartialState()
        device, order = str(state.device), state.main_process_first()
    with order:
        table = load_teacher_table(
            loss.teacher, texts, cache_dir=loss.teacher_cache_dir, device=device, show_progress=cfg.train.progress_bar
        )
    width = AutoConfig.from_pretrained(resolve_model_path(cfg.model.name_or_path)).hidden_size
    projection = None
    if loss.teacher_loss == "embedding" and table.width != width:
        if loss.teacher_projection == "none":
            raise ConfigError(
                f"config key 'loss.teacher' = {loss.teacher!r}: its vectors are {table.width} wide and the student's {width}; "
                "embedding distillation needs a projection (loss.teacher_projection: pca) or use loss.teacher_loss: similarity"
            )
        projection = pca_projection(table.vectors, width)
    what = (loss.teacher_loss, loss.teacher, len(texts), table.width, loss.teacher_weight)
    logger.info("teacher: %s distillation from %s (%d sentences, %d wide), weight %g", *what)
    targets = TeacherTargets(table.vectors, loss.teacher_loss, loss.teacher_temperature, loss.teacher_weight, projection)
    return targets, table


# benchmarks/gpu.py on an H100 (BENCHMARKS.md, the main job's model at batch 512, length
# 32): the collator's tokenisation in 4 worker processes gave 4.5x the sentences/s of none,
# 8 workers another 1.4x.
CUDA_WORKERS = 8


def with_device_defaults(cfg: RunConfig, device: torch.device | str, num_processes: int = 1) -> RunConfig:
    """``cfg`` with its device-dependent ``null`` (auto) settings made concrete, each
    choice logged: ``data.num_workers`` (0 on the CPU, :data:`CUDA_WORKERS` on CUDA, at
    most this process's share of the cores less one) and ``model.packing`` (on for the CPU; off on CUDA, where
    ``benchmarks/gpu.py`` measured padded batches faster at every shape it ran)."""
    cuda = torch.device(device).type == "cuda"
    workers = cfg.data.num_workers
    if workers is None:
        share = (os.cpu_count() or 1) // max(1, num_processes)
        workers = min(CUDA_WORKERS, max(0, share - 1)) if cuda else 0
        logger.info("data.num_workers auto -> %d on %s", workers, torch.device(device).type)
    packing = cfg.model.packing
    if packing is None:
        packing = not cuda
        logger.info(
            "model.packing auto -> %s on %s%s",
            packing,
            torch.device(device).type,
            " (padding measured faster there: BENCHMARKS.md, GPU section)" if cuda else "",
        )
    return replace(cfg, data=replace(cfg.data, num_workers=workers), model=replace(cfg.model, packing=packing))


def make_loader(
    cfg: RunConfig,
    dataset: datasets.Dataset,
    tokenizer: Any,
    num_processes: int,
    device: torch.device | str = "cpu",
    teacher_index: dict[str, int] | None = None,
) -> DataLoader:
    """Shuffled batches of ``train.batch_size`` examples over all processes; a seeded
    generator of its own, which the loop checkpoints so a resume redraws the order.
    Pinned memory on CUDA (:func:`simcse_kit.pipeline.loader_options`); the packing plan
    made in the collator, so in the workers with ``data.num_workers > 0``.
    ``teacher_index``: with a teacher, each batch also carries its rows' ``teacher_rows``."""
    options = loader_options(device)
    logger.info(
        "input pipeline: %s worker process(es); pinned memory and asynchronous copies %s",
        cfg.data.num_workers,
        "on" if options.pin_memory else "off (not CUDA)",
    )
    per_process = cfg.train.batch_size // num_processes
    collator = ContrastiveCollator(
        tokenizer,
        cfg.data.mode,
        cfg.model.max_seq_len,
        with_text_ids=cfg.loss.mask_false_negatives,
        prompts=view_prompts(cfg.data.prompts, cfg.data.mode),
        word_repetition=cfg.data.word_repetition,
        seed=cfg.train.seed,
        teacher_index=teacher_index,
        packing_plan=cfg.model.packing is not False,  # auto (None) means on, as in SimCSEModel.from_config
    )
    return DataLoader(
        dataset,
        batch_size=per_process,
        shuffle=True,
        drop_last=len(dataset) >= per_process,  # a short last batch has too few negatives
        collate_fn=collator,
        generator=torch.Generator().manual_seed(cfg.train.seed),
        num_workers=cfg.data.num_workers or 0,  # auto (None) not made concrete: the CPU's 0
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
    prompt: str = ""  # put before every sentence (the model's query prompt, for STS dev)

    @property
    def primary_metric(self) -> str:
        return self.evaluator.primary_metric  # type: ignore[attr-defined]

    def __call__(self, model: nn.Module) -> dict[str, float]:
        encoder = Encoder(model, self.tokenizer, self.max_seq_len, self.device, self.precision)
        return self.evaluator(prompted(encoder.encode, self.prompt))


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
