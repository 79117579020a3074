"""A text training run: config -> data -> model -> loop -> best model + metrics.

The run folder holds ``config.yaml`` (resolved), ``metrics.json`` (per-eval dev
scores, final STS table, train time, throughput) and ``best_model/`` (the checkpoint
with the best STS-B dev score, self-describing).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from simcse_kit.config import RunConfig, save_config
from simcse_kit.data import ContrastiveCollator, load_train_dataset
from simcse_kit.errors import ConfigError
from simcse_kit.modeling import Encoder, SimCSEModel, resolve_model_path
from simcse_kit.objectives import SimCSEObjective
from simcse_kit.trainer import fit, make_accelerator

logger = logging.getLogger(__name__)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file + rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
    os.replace(tmp, path)


def prepare_run_dir(cfg: RunConfig, overwrite: bool = False) -> Path:
    """Create the run folder; refuse to clobber a finished run unless asked."""
    out = Path(cfg.train.output_dir)
    if (out / "metrics.json").exists() and not overwrite:
        raise ConfigError(f"{out} already holds a finished run; choose another --output-dir or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    return out


def train(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run one training job as configured; return the metrics written to metrics.json."""
    from simcse_kit.sts import STSBDevEvaluator, STSEvaluator, format_table

    # Fail on bad data and a bad eval folder *before* the model loads and the run starts.
    dataset = load_train_dataset(cfg.data.train_file, cfg.data.mode, cfg.data.max_train_samples)
    dev = STSBDevEvaluator(cfg.data.eval_data_dir)
    out = prepare_run_dir(cfg, overwrite)

    accelerator = make_accelerator(cfg.train)
    base_path = resolve_model_path(cfg.model.name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = SimCSEModel.from_config(cfg.model)
    objective = SimCSEObjective(cfg.data.mode, cfg.loss)
    collator = ContrastiveCollator(tokenizer, cfg.data.mode, cfg.model.max_seq_len)
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
        return {"stsb_dev": dev(encoder.encode)}

    best_dir = out / "best_model"
    extra = {"base_model": cfg.model.name_or_path, "mode": cfg.data.mode, "train_file": cfg.data.train_file}

    def on_improve(m: torch.nn.Module, metrics: dict[str, float]) -> None:
        m.save(best_dir, tokenizer, extra | {"step": int(metrics["step"]), "stsb_dev": metrics["stsb_dev"]})

    state = fit(
        model,
        objective.step,
        loader,
        cfg.train,
        accelerator=accelerator,
        evaluate=evaluate,
        metric="stsb_dev",
        on_improve=on_improve,
        examples_in=lambda batch: batch["input_ids"].shape[0] // views,
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
    }
    if accelerator.is_main_process:
        best = Encoder(SimCSEModel.load(best_dir), tokenizer, cfg.model.eval_max_seq_len, accelerator.device)
        sts = STSEvaluator(cfg.data.eval_data_dir)(best.encode)
        metrics["sts"] = sts
        write_json_atomic(out / "metrics.json", metrics)
        logger.info("best model (step %d, STS-B dev %.2f) at %s", state.best_step, state.best_score, best_dir)
        print(format_table(sts))
    return metrics
