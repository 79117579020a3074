"""Typed run configuration: one dataclass per concern, loaded from YAML, overridable
from the command line, saved resolved in every run folder.

YAML is nested by concern (``model:``, ``data:``, ``loss:``, ``train:``). On the
command line any key may be given by its leaf name (``--pooler avg``) or dotted
(``--model.pooler avg``); dashes and underscores are interchangeable.
"""

from __future__ import annotations

import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from simcse_kit.errors import ConfigError
from simcse_kit.fileio import write_text_atomic

DEFAULT_MODEL = "all-MiniLM-L6-v2"
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
MLP_MODES = ("none", "train", "always")
MODES = ("unsup", "sup", "hardneg")
PRECISIONS = ("auto", "no", "fp16", "bf16")
AUTO = "auto"  # decided at start-up from the hardware (simcse_kit.precision)


@dataclass
class ModelConfig:
    """The encoder and how a sentence vector is read off it."""

    name_or_path: str = DEFAULT_MODEL  # the bundled default, a local folder or a hub id
    pooler: str = "avg"  # one of POOLERS
    mlp: str = "none"  # "train": SimCSE's MLP only while training; "always": kept at inference
    max_seq_len: int = 32  # training truncation (SimCSE: 32)
    eval_max_seq_len: int = 256  # inference/evaluation truncation, saved with the model
    # Sets every dropout of the encoder, whatever its family calls the keys (the unsup
    # augmentation; simcse_kit.architectures); None keeps the model's own rates.
    dropout: float | None = None
    # "auto": SDPA where the architecture has it, else eager (MPNet, DeBERTa-v2); any
    # other value ("sdpa", "eager", "flash_attention_2") is required, and recorded.
    attn_implementation: str = "auto"
    # Run the encoder on packed rows instead of padded ones where the model is verified
    # to give the same token states (simcse_kit.packing): same loss, about a third less
    # work at max_seq_len 32 on Wikipedia sentences.
    packing: bool = True


@dataclass
class DataConfig:
    """Training data and the STS data used for dev selection."""

    mode: str = "unsup"  # one of MODES
    train_file: str = "../shared/data/train/wiki1m_head.txt"  # file path, or "hub:<dataset id>"
    eval_data_dir: str = "../shared/data/senteval"
    max_train_samples: int | None = None
    num_workers: int = 0


@dataclass
class LossConfig:
    """The contrastive objective."""

    temperature: float = 0.05
    hard_negative_weight: float = 1.0  # the paper's alpha on each anchor's own hard negative
    unsup_loss: str = "views"  # "views": 2N-view InfoNCE; "paper": z1 . z2^T as in SimCSE's code
    gather: bool = True  # use other processes' embeddings as negatives (multi-process runs)
    mask_false_negatives: bool = False  # drop in-batch candidates whose text equals the anchor's positive
    queue_size: int = 0  # MoCo-style queue of past embeddings as extra negatives (0: off)
    momentum: float = 0.999  # momentum encoder update rate when queue_size > 0


@dataclass
class LoopConfig:
    """The optimisation loop (:func:`simcse_kit.trainer.fit`): what any model trained by
    it needs, text or image."""

    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    num_epochs: int = 1
    max_steps: int | None = None
    grad_accum: int = 1
    max_grad_norm: float | None = None
    mixed_precision: str = "no"  # one of PRECISIONS (the text run defaults to "auto")
    # With mixed_precision bf16: bf16 weights, activations and gradients with fp32 master
    # weights in AdamW, instead of autocast (simcse_kit.fastpath.bf16). Ignored at other
    # precisions, so `--mixed-precision no` on a bf16 recipe simply trains in fp32.
    bf16_weights: bool | str = False  # True, False or "auto" (on where bf16 is native on CPU)
    seed: int = 42
    eval_steps: int = 125  # evaluate every N optimiser steps (0: only at the end)
    # Evaluate the untouched model too (step 0), so best-checkpoint selection can keep it:
    # training must never hand back a model worse on dev than the one it started from.
    eval_at_start: bool = True
    log_steps: int = 10
    save_steps: int = 0  # full training state every N steps for --resume (0: off)
    progress_bar: bool = True

    @property
    def bf16_model(self) -> bool:
        """Whether the model itself runs in bf16 (``bf16_weights`` at bf16 precision)."""
        return self.bf16_weights is True and self.mixed_precision == "bf16"


@dataclass
class TrainConfig(LoopConfig):
    """The YAML ``train:`` section: the loop's settings plus the text run's own (where
    it writes, how big a batch is, how the model is made faster)."""

    output_dir: str = "runs/unsup"
    # A text run picks its precision from the hardware unless told: bf16 (with bf16 weights
    # and fast dropout) on a CPU that computes bf16 natively, bf16/fp16 on CUDA, else fp32.
    mixed_precision: str = AUTO
    bf16_weights: bool | str = AUTO
    batch_size: int = 64  # examples per optimiser micro-step, over all processes
    fast_dropout: bool | str = AUTO  # cheaper dropout RNG, same distribution (simcse_kit.fastpath); "auto": CPU with native bf16
    grad_cache_chunk: int = 0  # GradCache: encode the batch in chunks of this many rows (0: off)


@dataclass
class RunConfig:
    """Everything a training run needs; saved as ``config.yaml`` in the run folder."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> RunConfig:
        """Check enumerations and ranges; raise ConfigError naming the key."""
        checks: list[tuple[str, bool, str]] = [
            ("model.pooler", self.model.pooler in POOLERS, f"one of {POOLERS}"),
            ("model.mlp", self.model.mlp in MLP_MODES, f"one of {MLP_MODES}"),
            ("model.max_seq_len", self.model.max_seq_len > 0, "> 0"),
            ("data.mode", self.data.mode in MODES, f"one of {MODES}"),
            ("loss.temperature", self.loss.temperature > 0, "> 0"),
            ("loss.hard_negative_weight", self.loss.hard_negative_weight > 0, "> 0"),
            ("loss.unsup_loss", self.loss.unsup_loss in ("views", "paper"), "'views' or 'paper'"),
            ("train.batch_size", self.train.batch_size >= 2, ">= 2 (in-batch negatives need a second example)"),
            ("train.learning_rate", self.train.learning_rate > 0, "> 0"),
            ("train.grad_accum", self.train.grad_accum >= 1, ">= 1"),
            ("train.num_epochs", self.train.num_epochs >= 1, ">= 1"),
            ("train.mixed_precision", self.train.mixed_precision in PRECISIONS, f"one of {PRECISIONS}"),
            ("train.warmup_ratio", 0 <= self.train.warmup_ratio < 1, "in [0, 1)"),
        ]
        if self.model.dropout is not None:
            checks.append(("model.dropout", 0 <= self.model.dropout < 1, "in [0, 1)"))
        if self.data.max_train_samples is not None:
            # One example would make batches without a single negative: a zero loss.
            checks.append(("data.max_train_samples", self.data.max_train_samples >= 2, ">= 2 (or null for all)"))
        if self.loss.queue_size > 0:
            checks.append(("loss.momentum", 0 <= self.loss.momentum < 1, "in [0, 1) with loss.queue_size > 0"))
            checks.append(
                ("train.grad_cache_chunk", self.train.grad_cache_chunk == 0, "0 with loss.queue_size > 0 (use one of them)")
            )
        if self.model.pooler == "cls_before_pooler":
            checks.append(("model.mlp", self.model.mlp == "none", "'none' with pooler cls_before_pooler"))
        for key, ok, expected in checks:
            if not ok:
                section, name = key.split(".")
                value = getattr(getattr(self, section), name)
                raise ConfigError(f"config key {key!r} = {value!r}: must be {expected}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(RunConfig)}  # type: ignore[misc]


def _leaf_index() -> dict[str, str]:
    """Map each leaf name (and dotted name) to its dotted key; leaf names are unique."""
    index: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            index[f.name] = f"{section}.{f.name}"
            index[f"{section}.{f.name}"] = f"{section}.{f.name}"
    return index


def _coerce(value: Any, annotation: Any, key: str, source: str) -> Any:
    """Convert ``value`` (from YAML or a CLI string) to the field's type, or raise."""
    tp = annotation
    args = typing.get_args(tp)
    is_optional = isinstance(tp, types.UnionType) and type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if is_optional else tp
    if is_optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    if base == bool | str:  # a switch: True, False or "auto"
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no", AUTO):
            return AUTO if value.lower() == AUTO else value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{source}: config key {key!r} = {value!r} must be true, false or auto")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        raise ConfigError(f"{source}: config key {key!r} has unsupported type {annotation}")
    raise ConfigError(f"{source}: config key {key!r} = {value!r} is not a valid {annotation}")


_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _annotation(section: str, name: str) -> Any:
    ann = {f.name: f.type for f in fields(SECTIONS[section])}[name]
    if isinstance(ann, str):
        parts = [p.strip() for p in ann.split("|")]
        resolved = [type(None) if p == "None" else _TYPES[p] for p in parts]
        if len(resolved) == 1:
            return resolved[0]
        return resolved[0] | resolved[1]
    return ann


def _set(cfg: RunConfig, dotted: str, value: Any, source: str) -> None:
    section, name = dotted.split(".")
    setattr(getattr(cfg, section), name, _coerce(value, _annotation(section, name), dotted, source))


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Build a RunConfig from a YAML file plus overrides (leaf or dotted keys).

    Raises:
        ConfigError: unreadable YAML, unknown key (with the valid ones listed), wrong type.
    """
    cfg = RunConfig()
    if path is not None:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections {list(SECTIONS)}")
        for section, values in raw.items():
            if section not in SECTIONS:
                raise ConfigError(f"{path}: unknown section {section!r}; expected one of {list(SECTIONS)}")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: section {section!r} must be a mapping")
            known = {f.name for f in fields(SECTIONS[section])}
            for name, value in values.items():
                if name not in known:
                    raise ConfigError(f"{path}: unknown key {section}.{name}; valid keys: {sorted(known)}")
                _set(cfg, f"{section}.{name}", value, str(path))
    index = _leaf_index()
    for key, value in (overrides or {}).items():
        norm = key.lstrip("-").replace("-", "_")
        if norm not in index:
            raise ConfigError(f"unknown option --{key.lstrip('-')}; valid keys: {sorted(k for k in index if '.' not in k)}")
        _set(cfg, index[norm], value, "command line")
    return cfg.validate()


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (the run folder's record of what ran).

    Written to a temp file and renamed, so a kill never leaves half a config that a
    ``--resume`` would then read.
    """
    write_text_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
