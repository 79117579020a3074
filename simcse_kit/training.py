"""A text training run: config -> data -> model -> loop -> best model + metrics.

The run folder holds ``config.yaml`` (resolved), ``metrics.json`` (per-eval dev
scores, final STS table, train time, throughput) and ``best_model/`` (the checkpoint
with the best STS-B dev score, self-describing).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.config import RunConfig, load_config, save_config
from simcse_kit.data import ContrastiveCollator, load_train_dataset
from simcse_kit.demos.align_uniform import plot_trajectory
from simcse_kit.errors import ConfigError
from simcse_kit.fastpath import use_fast_dropout
from simcse_kit.fileio import write_json_atomic
from simcse_kit.geometry import EmbeddingRecorder
from simcse_kit.modeling import Encoder, SimCSEModel, replace_dir, resolve_model_path
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.trainer import fit, latest_checkpoint, make_accelerator

logger = logging.getLogger(__name__)

# The same batching as `simcse-kit evaluate`, so the run's table and a later evaluate agree
# to the last digit (different padding changes fp32 sums in the last bits).
EVAL_BATCH_SIZE = 128


# Settings that may change between a run and its --resume: they do not change what is
# computed (where files go, progress display, loader workers, checkpoint frequency).
RESUME_MAY_DIFFER = ("train.output_dir", "train.progress_bar", "data.num_workers", "train.save_steps")
CHECKPOINTS = "checkpoints"


def config_differences(saved: RunConfig, requested: RunConfig) -> list[str]:
    """``'section.key: saved -> requested'`` for each setting that would change the run."""
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
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)  # a fresh run must never resume into the old one's state
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    return out


def link_tree(src: Path, dst: Path) -> None:
    """Copy folder ``src`` to ``dst`` as hard links (a copy where linking fails).

    Model folders are only ever replaced whole (written elsewhere, then renamed), never
    edited in place, so files shared by links cannot change under a checkpoint.
    """

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


def momentum_queue_step(cfg: RunConfig, model: SimCSEModel, objective: SimCSEObjective, accelerator: Any) -> Any:
    """The trainer step with a momentum encoder + queue of ``cfg.loss.queue_size`` negatives.

    Built from the model *before* ``accelerator.prepare`` (a copy of a prepared model
    would carry its autocast wrapper), and registered for checkpointing so that
    ``--resume`` restores the queue and the momentum encoder with the rest.
    """
    from simcse_kit.negatives import MomentumQueue, MomentumQueueStep

    if cfg.train.grad_cache_chunk > 0:
        raise ConfigError("loss.queue_size > 0 does not combine with train.grad_cache_chunk; use one of them")
    if not 0.0 <= cfg.loss.momentum < 1.0:
        raise ConfigError(f"config key 'loss.momentum' = {cfg.loss.momentum!r}: must be in [0, 1)")
    queue = MomentumQueue(model, cfg.loss.queue_size, cfg.loss.momentum, model.encoder.config.hidden_size)
    accelerator.register_for_checkpointing(queue)
    logger.info("momentum queue: %d negatives, momentum %.4f", cfg.loss.queue_size, cfg.loss.momentum)
    return MomentumQueueStep(objective, queue, accelerator)


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
    limit = getattr(hf_config, "max_position_embeddings", None)
    for key in ("max_seq_len", "eval_max_seq_len"):
        value = getattr(cfg.model, key)
        if isinstance(limit, int) and value > limit:
            raise ConfigError(f"config key 'model.{key}' = {value}: the model takes at most {limit} positions")
    return tokenizer


def train(cfg: RunConfig, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Run one training job as configured; return the metrics written to metrics.json.

    With ``cfg.train.save_steps`` the full training state is saved every that many
    steps under ``output_dir/checkpoints``; ``resume=True`` continues from the newest
    one and ends with the same model and metrics as an uninterrupted run.
    """
    from simcse_kit.sts import STSBDevEvaluator, STSEvaluator, format_table

    # Fail on bad data and a bad eval folder *before* the model loads and the run starts.
    dataset = load_train_dataset(cfg.data.train_file, cfg.data.mode, cfg.data.max_train_samples)
    dev = STSBDevEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    # The final STS table's files too: a bad STS12 file must not surface after training.
    final_sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)
    tokenizer = load_checked_tokenizer(cfg)  # a bad model path fails before the run folder is written
    out = prepare_run_dir(cfg, overwrite, resume)

    accelerator = make_accelerator(cfg.train)
    # Seed before the model is built: a fresh MLP head is initialised at random, and a
    # run (or its resume) must be reproducible from its config alone.
    set_seed(cfg.train.seed)
    model = SimCSEModel.from_config(cfg.model)
    # The transformer's own pooler (BERT's dense + tanh on [CLS]) feeds none of our
    # poolers; DDP stops on parameters that never get a gradient, so it is frozen (it
    # would not change anyway: AdamW skips parameters without a gradient).
    hf_pooler = getattr(model.encoder, "pooler", None)
    if isinstance(hf_pooler, torch.nn.Module):
        hf_pooler.requires_grad_(False)
    if cfg.train.fast_dropout:
        use_fast_dropout(model)
    objective = SimCSEObjective(cfg.data.mode, cfg.loss)
    collator = ContrastiveCollator(tokenizer, cfg.data.mode, cfg.model.max_seq_len, with_text_ids=cfg.loss.mask_false_negatives)
    generator = torch.Generator().manual_seed(cfg.train.seed)
    per_process = cfg.train.batch_size // accelerator.num_processes
    loader = DataLoader(
        dataset,
        batch_size=per_process,
        shuffle=True,
        drop_last=len(dataset) >= per_process,
        collate_fn=collator,
        generator=generator,
        num_workers=cfg.data.num_workers,
    )
    views = objective.views_per_example()

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        encoder = Encoder(m, tokenizer, cfg.model.eval_max_seq_len, accelerator.device, cfg.train.mixed_precision)
        # One encoding of the dev sentences gives the score and the geometry (SimCSE, Figure 2).
        recorder = EmbeddingRecorder(encoder.encode)
        score = dev(recorder)
        geo = recorder.pair_alignment_uniformity(dev.pairs.sentences1, dev.pairs.sentences2, dev.pairs.scores)
        logger.info("STS-B dev alignment %.4f, uniformity %.4f", geo["alignment"], geo["uniformity"])
        return {"stsb_dev": score, "alignment": geo["alignment"], "uniformity": geo["uniformity"]}

    best_dir = out / "best_model"
    extra = {"base_model": cfg.model.name_or_path, "mode": cfg.data.mode, "train_file": cfg.data.train_file}

    def on_improve(m: torch.nn.Module, metrics: dict[str, float]) -> None:
        m.save(best_dir, tokenizer, extra | {"step": int(metrics["step"]), "stsb_dev": metrics["stsb_dev"]})

    # A checkpoint carries a (hard-linked) snapshot of best_model/ as it was at that
    # step: after a kill, best_model/ may come from steps the resumed run redoes, and
    # must be put back to the checkpoint's best-so-far.
    def snapshot_best(ckpt: Path) -> None:
        if best_dir.is_dir():
            link_tree(best_dir, ckpt / "best_model")

    def restore_best(ckpt: Path, _state: object) -> None:
        snapshot = ckpt / "best_model"
        if snapshot.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=".best_model.tmp-", dir=out))
            shutil.rmtree(tmp)
            link_tree(snapshot, tmp)
            replace_dir(tmp, best_dir)
        elif best_dir.exists():
            doomed = out / ".best_model.stale"
            shutil.rmtree(doomed, ignore_errors=True)
            os.replace(best_dir, doomed)
            shutil.rmtree(doomed)

    step = objective.step
    if cfg.train.grad_cache_chunk > 0:  # big batches: chunk-wise encoder backward, same gradients
        from simcse_kit.gradcache import GradCacheStep

        step = GradCacheStep(objective, cfg.train.grad_cache_chunk, accelerator)
    if cfg.loss.queue_size > 0:  # MoCo-style negatives (simcse_kit.negatives)
        step = momentum_queue_step(cfg, model, objective, accelerator)
    state = fit(
        model,
        step,
        loader,
        cfg.train,
        accelerator=accelerator,
        evaluate=evaluate,
        metric="stsb_dev",
        on_improve=on_improve,
        examples_in=lambda batch: batch["input_ids"].shape[0] // views,
        checkpoint_dir=out / CHECKPOINTS,
        resume=resume,
        on_checkpoint=snapshot_best,
        on_resume=restore_best,
    )
    metrics: dict[str, Any] = {
        "best_step": state.best_step,
        "best_stsb_dev": state.best_score,
        "steps": state.global_step,
        "train_seconds": state.train_seconds,
        "examples_per_second": state.examples_seen / max(state.train_seconds, 1e-9),
        "sentences_per_second": state.examples_seen * views / max(state.train_seconds, 1e-9),
        "losses": state.losses,
        "evals": state.evals,
        "masked_negatives": objective.masked_negatives,
    }
    if cfg.loss.mask_false_negatives:
        logger.info("false-negative masking removed %d (anchor, candidate) entries", objective.masked_negatives)
    if accelerator.is_main_process:
        best = Encoder(SimCSEModel.load(best_dir), tokenizer, cfg.model.eval_max_seq_len, accelerator.device)
        sts = final_sts(best.encode)
        metrics["sts"] = sts
        plot_trajectory(metrics["evals"], out / "alignment_uniformity.png", f"STS-B dev, {cfg.data.mode}")
        write_json_atomic(out / "metrics.json", metrics)
        logger.info("best model (step %d, STS-B dev %.2f) at %s", state.best_step, state.best_score, best_dir)
        print(format_table(sts))
    return metrics
