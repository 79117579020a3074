"""Typed run configuration: one dataclass per concern, loaded from YAML, overridable
from the command line, saved resolved in every run folder.

YAML is nested by concern (``model:``, ``data:``, ``loss:``, ``train:``). On the
command line any key may be given by its leaf name (``--pooler avg``) or dotted
(``--model.pooler avg``); dashes and underscores are interchangeable.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from simcse_kit.errors import ConfigError
from simcse_kit.fileio import write_text_atomic
from simcse_kit.recipes import DATA_ENV, DATA_ROOT_HINT, absolute, default_data_root

DEFAULT_MODEL = "all-MiniLM-L6-v2"
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")
MLP_MODES = ("none", "train", "always")
MODES = ("unsup", "sup", "hardneg")
PAIR_FORMATS = ("stsb", "sick")  # scored-pair files a run reads (simcse_kit.evaluation.readers.PAIR_READERS)
PRECISIONS = ("auto", "no", "fp16", "bf16")
AUTO = "auto"  # decided at start-up from the hardware (simcse_kit.precision)
DATA_ROOT = "{data_root}"  # stands for the data root in the data paths (train_file, eval_data_dir, ...)
OPTIONAL_DATA_PATHS = ("mix_file", "dev_file")  # data keys that are paths when set, resolved as train_file
HUB_PREFIX = "hub:"  # data.train_file naming a hub dataset, not a path
# The temperature's range. Logits are cos / tau in fp32, so any tau > 3e-39 keeps them finite;
# the real floor is where learning stops: below 1e-3 a cosine gap of 0.1 between the positive
# and a negative is a logit gap over 100, past where fp32's exp underflows (exp(-104) = 0), so
# the softmax is one-hot, the loss exactly 0 and no gradient flows (tau 1e-6: loss 0.0 from
# step 1). Above 10 every logit lies within 0.2 of the others and the loss is log(N), flat.
TEMPERATURE_RANGE = (1e-3, 10.0)
TEMPERATURE_WHY = "lower, fp32's exp underflows: loss 0 and no gradient; higher, all logits are alike: a flat loss"


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
    # work at max_seq_len 32 on Wikipedia sentences. null (auto): on the CPU, off on CUDA
    # (where benchmarks/gpu.py measured padding faster); true/false: as set, on any device.
    packing: bool | None = None


@dataclass
class DataConfig:
    """Training data and the STS data used for dev selection."""

    mode: str = "unsup"  # one of MODES
    # Data paths: "{data_root}" stands for the data root; other relative paths are read from
    # the recipe's folder (on the command line, from the current one). Saved absolute.
    train_file: str = "{data_root}/train/wiki1m_head.txt"  # file path, or "hub:<dataset id>"
    eval_data_dir: str = "{data_root}/senteval"  # SentEval-layout STS folder: STS-B dev selection and the final table
    # The folder "{data_root}" stands for. --data-root and SIMCSE_KIT_DATA win over a recipe's;
    # default: ../shared/data beside a source checkout (simcse_kit.recipes).
    data_root: str | None = None
    max_train_samples: int | None = None  # use only the first N training examples (None: all)
    # DataLoader worker processes for tokenisation (0: in the training process). null (auto):
    # 0 on the CPU (workers take the step's cores), 8 on CUDA (measured: benchmarks/gpu.py).
    num_workers: int | None = None
    # "auto": by mode and file suffix (simcse_kit.data); "stsb" / "sick": train_file is a scored
    # pair file of that format whose distinct sentences become the unsup corpus (scores unused).
    train_format: str = "auto"
    # ESimCSE word repetition (unsup): one view of each sentence gets a few tokens doubled in
    # place, so the two views differ in length (0: off; ESimCSE: 0.32).
    word_repetition: float = 0.0
    mix_file: str | None = None  # a second (general) corpus mixed into train_file, in data.mode's format
    mix_ratio: float = 0.0  # share of the mixed training set drawn from mix_file, in [0, 1)
    dev_file: str | None = None  # dev split for checkpoint selection (None: STS-B dev of eval_data_dir)
    # dev_file's format: "stsb" (sts-dev.csv), "sick" (SICK_trial.txt) or "beir" (a BEIR-format
    # retrieval folder: selects on its qrels/dev.tsv nDCG@10, docs/retrieval.md)
    dev_format: str = "stsb"
    # Prompts put before the texts, e5/bge-style: {query: "query: ", document: "passage: "}.
    # In training view 0 (the anchor) is the query and the other views are documents; they are
    # saved with the model, used by evaluation and written into the export (docs/retrieval.md).
    prompts: dict[str, str] | None = None

    def path_keys(self) -> list[str]:
        """The keys holding a data path, where set (a ``hub:`` dataset is not a path)."""
        keys = ("train_file", "eval_data_dir", *OPTIONAL_DATA_PATHS)
        return [key for key in keys if getattr(self, key) is not None and not getattr(self, key).startswith(HUB_PREFIX)]


@dataclass
class LossConfig:
    """The contrastive objective."""

    temperature: float = 0.05  # tau: logits are cos / tau (SimCSE: 0.05)
    hard_negative_weight: float = 1.0  # the paper's alpha on each anchor's own hard negative
    unsup_loss: str = "views"  # "views": 2N-view InfoNCE; "paper": z1 . z2^T as in SimCSE's code
    gather: bool = True  # use other processes' embeddings as negatives (multi-process runs)
    mask_false_negatives: bool = False  # drop in-batch candidates whose text equals the anchor's positive
    false_negative_threshold: float | None = None  # drop candidates whose cosine with the anchor exceeds this (None: off)
    queue_size: int = 0  # MoCo-style queue of past embeddings as extra negatives (0: off)
    momentum: float = 0.999  # momentum encoder update rate when queue_size > 0
    teacher: str | None = None  # distil from this model (a sentence-transformers/simcse-kit folder or hub id; None: off)
    teacher_loss: str = "similarity"  # "similarity": match the teacher's in-batch softmax; "embedding": MSE to its vectors
    teacher_weight: float = 1.0  # loss = (1 - w) * SimCSE + w * teacher term
    teacher_temperature: float = 0.05  # the teacher's own tau for similarity distillation
    teacher_projection: str = "pca"  # embedding distillation with a wider teacher: "pca" to the student's width, or "none"
    teacher_cache_dir: str | None = None  # where teacher vectors are cached (None: $SIMCSE_KIT_CACHE or ~/.cache/simcse-kit)
    # Matryoshka: the loss summed over these prefix sizes of the embedding, e.g. [384, 256, 128, 64]
    # (None: the full embedding only); each prefix is re-normalised, so it works truncated.
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None  # one weight per matryoshka_dims entry (None: all 1)


@dataclass
class LoopConfig:
    """The optimisation loop (:func:`simcse_kit.trainer.fit`): what any model trained by
    it needs, text or image."""

    learning_rate: float = 3e-5  # AdamW peak learning rate (linear decay to 0)
    weight_decay: float = 0.0  # AdamW weight decay (never on biases and norms)
    warmup_ratio: float = 0.0  # share of the steps with a linear warm-up
    num_epochs: int = 1  # passes over the training data
    max_steps: int | None = None  # stop after N optimiser steps (None or 0: all epochs)
    grad_accum: int = 1  # micro-batches per optimiser step (negatives stay per micro-batch)
    max_grad_norm: float | None = None  # clip the gradient norm to this (> 0; None: no clipping)
    mixed_precision: str = "no"  # one of PRECISIONS (the text run defaults to "auto")
    # With mixed_precision bf16: bf16 weights, activations and gradients with fp32 master
    # weights in AdamW, instead of autocast (simcse_kit.fastpath.bf16). Ignored at other
    # precisions, so `--mixed-precision no` on a bf16 recipe simply trains in fp32.
    bf16_weights: bool | str = False  # True, False or "auto" (on where bf16 is native on CPU)
    # With bf16 weights: embedding tables get their gradient as the looked-up rows, added
    # into a dense buffer kept across steps, instead of a freshly allocated table-sized
    # gradient every backward (simcse_kit.fastpath.bf16). "auto": in a single process
    # (DistributedDataParallel expects a sparse module's gradient to be sparse).
    sparse_embedding_grad: bool | str = AUTO
    seed: int = 42  # model head init, shuffling and dropout
    eval_steps: int = 125  # evaluate every N optimiser steps (0: only at the end)
    # Evaluate the untouched model too (step 0), so best-checkpoint selection can keep it:
    # training must never hand back a model worse on dev than the one it started from.
    eval_at_start: bool = True
    log_steps: int = 10  # record the loss every N steps
    save_steps: int = 0  # full training state every N steps for --resume (0: off)
    progress_bar: bool = True  # tqdm bar on the main process
    # Experiment trackers (Accelerate's names: tensorboard, wandb, mlflow, ...; a list, or
    # comma-separated on the command line) that get loss, learning rate, gradient norm,
    # throughput and every evaluation against the step ([] or none: no tracking).
    report_to: list[str] = field(default_factory=list)

    @property
    def bf16_model(self) -> bool:
        """Whether the model itself runs in bf16 (``bf16_weights`` at bf16 precision)."""
        return self.bf16_weights is True and self.mixed_precision == "bf16"


@dataclass
class TrainConfig(LoopConfig):
    """The YAML ``train:`` section: the loop's settings plus the text run's own (where
    it writes, how big a batch is, how the model is made faster)."""

    output_dir: str = "runs/unsup"  # the run folder (config.yaml, metrics.json, best_model/)
    # A text run picks its precision from the hardware unless told: bf16 (with bf16 weights
    # and fast dropout) on a CPU that computes bf16 natively, bf16/fp16 on CUDA, else fp32.
    mixed_precision: str = AUTO
    bf16_weights: bool | str = AUTO  # True, False or "auto": bf16 weights with fp32 masters (native-bf16 CPU)
    batch_size: int = 64  # examples per optimiser micro-step, over all processes
    fast_dropout: bool | str = AUTO  # cheaper dropout RNG, same distribution (simcse_kit.fastpath); "auto": CPU with native bf16
    grad_cache_chunk: int = 0  # GradCache: encode the batch in chunks of this many rows (0: off)
    # glibc only: blocks of this many MiB or more get their own mapping, given back to the OS
    # when freed (simcse_kit.heap). Less resident memory for more page faults: 2 trims a
    # GradCache run's peak RSS by ~1/6 for a 1.2-1.3x slower step. None: malloc as it comes.
    mmap_threshold_mib: int | None = None
    final_eval: bool = True  # score the best model on the 7 STS tasks at the end (false: dev-only sweeps)
    # torch.compile the encoder (dynamic shapes: padded and packed batches change shape every
    # step); recorded in metrics.json. Not with fast_dropout. Off by default: unmeasured on GPU.
    compile: bool = False


@dataclass
class RunConfig:
    """Everything a training run needs; saved as ``config.yaml`` in the run folder."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> RunConfig:
        """Check enumerations and ranges; raise ConfigError naming the key."""
        low, high = TEMPERATURE_RANGE
        checks: list[tuple[str, bool, str]] = [
            ("model.pooler", self.model.pooler in POOLERS, f"one of {POOLERS}"),
            ("model.mlp", self.model.mlp in MLP_MODES, f"one of {MLP_MODES}"),
            ("model.max_seq_len", self.model.max_seq_len > 0, "> 0"),
            ("data.mode", self.data.mode in MODES, f"one of {MODES}"),
            ("loss.temperature", low <= self.loss.temperature <= high, f"in [{low:g}, {high:g}] ({TEMPERATURE_WHY})"),
            ("loss.hard_negative_weight", self.loss.hard_negative_weight > 0, "> 0"),
            ("loss.unsup_loss", self.loss.unsup_loss in ("views", "paper"), "'views' or 'paper'"),
            ("train.batch_size", self.train.batch_size >= 2, ">= 2 (in-batch negatives need a second example)"),
            ("train.learning_rate", 0 < self.train.learning_rate < math.inf, "> 0 and finite"),
            ("train.grad_accum", self.train.grad_accum >= 1, ">= 1"),
            ("train.num_epochs", self.train.num_epochs >= 1, ">= 1"),
            ("train.mixed_precision", self.train.mixed_precision in PRECISIONS, f"one of {PRECISIONS}"),
            ("train.warmup_ratio", 0 <= self.train.warmup_ratio < 1, "in [0, 1)"),
            ("train.eval_steps", self.train.eval_steps >= 0, ">= 0 (0: evaluate only at the end)"),
            ("train.save_steps", self.train.save_steps >= 0, ">= 0 (0: no periodic checkpoints)"),
            ("train.log_steps", self.train.log_steps >= 1, ">= 1"),
            (
                "train.output_dir",
                self.train.output_dir.strip() != "",
                "a folder ('' would write into the current one)",
            ),
            ("model.name_or_path", self.model.name_or_path.strip() != "", "a model folder, hub id or the default's name"),
        ]
        if self.train.max_steps is not None:
            checks.append(("train.max_steps", self.train.max_steps >= 0, ">= 0 or null (0 or null: all epochs)"))
        if self.train.max_grad_norm is not None:
            # 0 would clip every update to nothing: the model would silently never change.
            ok = math.isfinite(self.train.max_grad_norm) and self.train.max_grad_norm > 0
            checks.append(("train.max_grad_norm", ok, "> 0, or null for no clipping"))
        if self.model.dropout is not None:
            checks.append(("model.dropout", 0 <= self.model.dropout < 1, "in [0, 1)"))
        checks.append(
            ("data.train_format", self.data.train_format in ("auto", *PAIR_FORMATS), f"'auto' or one of {PAIR_FORMATS}")
        )
        dev_formats = (*PAIR_FORMATS, "beir")
        checks.append(("data.dev_format", self.data.dev_format in dev_formats, f"one of {dev_formats}"))
        if self.data.dev_format == "beir":
            checks.append(("data.dev_file", self.data.dev_file is not None, "a BEIR-format folder with data.dev_format beir"))
        checks.append(("data.word_repetition", 0 <= self.data.word_repetition <= 1, "in [0, 1]"))
        if self.data.word_repetition or self.data.train_format != "auto":
            checks.append(("data.mode", self.data.mode == "unsup", "'unsup' with data.word_repetition or data.train_format"))
        checks.append(("data.mix_ratio", 0 <= self.data.mix_ratio < 1, "in [0, 1)"))
        if self.data.mix_ratio > 0:
            checks.append(("data.mix_file", self.data.mix_file is not None, "set with data.mix_ratio > 0"))
        if self.data.max_train_samples is not None:
            # One example would make batches without a single negative: a zero loss.
            checks.append(("data.max_train_samples", self.data.max_train_samples >= 2, ">= 2 (or null for all)"))
        if self.loss.false_negative_threshold is not None:
            checks.append(("loss.false_negative_threshold", -1 < self.loss.false_negative_threshold <= 1, "in (-1, 1] or null"))
        if self.data.prompts is not None:
            names = ("query", "document")  # simcse_kit.batch.PROMPT_NAMES
            ok = set(self.data.prompts) <= set(names)
            checks.append(("data.prompts", ok, f"a mapping with keys among {names}, e.g. {{query: 'query: '}}"))
        if self.loss.matryoshka_dims is not None:
            dims = self.loss.matryoshka_dims
            ok = bool(dims) and all(d > 0 for d in dims) and len(set(dims)) == len(dims)
            checks.append(("loss.matryoshka_dims", ok, "distinct sizes > 0, e.g. [384, 256, 128, 64] (or null)"))
        if self.loss.matryoshka_weights is not None:
            n = len(self.loss.matryoshka_dims or [])
            ok = len(self.loss.matryoshka_weights) == n and all(w > 0 for w in self.loss.matryoshka_weights)
            checks.append(("loss.matryoshka_weights", ok, f"{n} weights > 0, one per loss.matryoshka_dims entry"))
        if self.loss.queue_size > 0:
            checks.append(("loss.momentum", 0 <= self.loss.momentum < 1, "in [0, 1) with loss.queue_size > 0"))
            checks.append(
                ("train.grad_cache_chunk", self.train.grad_cache_chunk == 0, "0 with loss.queue_size > 0 (use one of them)")
            )
        if self.loss.teacher is not None:
            kinds = ("similarity", "embedding")
            checks.append(("loss.teacher_loss", self.loss.teacher_loss in kinds, "'similarity' or 'embedding'"))
            checks.append(("loss.teacher_weight", 0 <= self.loss.teacher_weight <= 1, "in [0, 1]"))
            teacher_tau_ok = low <= self.loss.teacher_temperature <= high  # the same bounds, for the teacher's softmax
            checks.append(("loss.teacher_temperature", teacher_tau_ok, f"in [{low:g}, {high:g}] ({TEMPERATURE_WHY})"))
            checks.append(("loss.teacher_projection", self.loss.teacher_projection in ("pca", "none"), "'pca' or 'none'"))
        if self.train.mmap_threshold_mib is not None:
            # glibc's mallopt takes 0..32 MiB on 64-bit; below 1 MiB every activation would be a mapping.
            checks.append(("train.mmap_threshold_mib", 1 <= self.train.mmap_threshold_mib <= 32, "in [1, 32] or null"))
        if self.model.pooler == "cls_before_pooler":
            checks.append(("model.mlp", self.model.mlp == "none", "'none' with pooler cls_before_pooler"))
        for key, ok, expected in checks:
            if not ok:
                section, name = key.split(".")
                value = getattr(getattr(self, section), name)
                raise ConfigError(f"config key {key!r} = {value!r}: must be {expected}")
        return self

    def check_data(self) -> RunConfig:
        """Check the data paths exist before anything is loaded; raise ConfigError naming
        the key, the path tried and how the data root is set."""
        for key in self.data.path_keys():
            path = Path(getattr(self.data, key))
            folder = key == "eval_data_dir"
            if not (path.is_dir() if folder else path.exists()):
                hint = (
                    f"the data root is {self.data.data_root}: {DATA_ROOT_HINT}"
                    if self.data.data_root
                    else "relative paths in a recipe are read from its folder, on the command line from the current one"
                )
                raise ConfigError(f"config key 'data.{key}': {path}: {'folder' if folder else 'file'} not found ({hint})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(RunConfig)}  # type: ignore[misc]


def key_help() -> list[tuple[str, str, Any, str]]:
    """``(dotted key, type, default, meaning)`` for every config key, for ``--help``.

    The meaning is the field's own comment in this file (trailing, or the comment lines
    just above it), so the help cannot drift from the code.
    """
    notes: dict[str, str] = {}
    # A subclass's comment wins (TrainConfig re-declares some of LoopConfig's keys).
    for cls in [c for section in SECTIONS.values() for c in section.__mro__ if is_dataclass(c)]:
        pending: list[str] = []
        for line in inspect.getsource(cls).splitlines()[1:]:
            stripped = line.strip()
            if stripped.startswith("#"):
                pending.append(stripped.lstrip("# "))
                continue
            match = re.match(r"(\w+): [^=]+= .*?(?:  # (.*))?$", stripped)
            if match:
                notes.setdefault(match.group(1), match.group(2) or " ".join(pending))
            pending = []
    rows = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            rows.append((f"{section}.{f.name}", str(f.type), default, notes.get(f.name, "")))
    return rows


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
    if typing.get_origin(base) is dict:  # a YAML mapping, or one written inline on the command line
        try:
            mapping = yaml.safe_load(value) if isinstance(value, str) else value
        except yaml.YAMLError:
            mapping = None
        if isinstance(mapping, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
            return dict(mapping)
        example = "{query: 'query: '}"
        raise ConfigError(f"{source}: config key {key!r} = {value!r} must be a mapping of names to texts, e.g. {example}")
    if typing.get_origin(base) is list:  # a YAML list, a YAML string, or "a,b" on the command line
        (item,) = typing.get_args(base)
        items = value.strip().strip("[]").split(",") if isinstance(value, str) else value
        if item is not str and isinstance(items, list) and items:  # numbers: each checked as the item type
            return [_coerce(v.strip() if isinstance(v, str) else v, item, key, source) for v in items]
        if isinstance(items, list) and all(isinstance(v, str) for v in items):
            return [v.strip() for v in items if v.strip()]
        what = "names" if item is str else f"{item.__name__}s"
        raise ConfigError(f"{source}: config key {key!r} = {value!r} must be a list of {what} (or a comma-separated string)")
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


_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list[str]": list[str],
    "list[int]": list[int],
    "list[float]": list[float],
    "dict[str, str]": dict[str, str],
}


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


class DuplicateKeyError(yaml.YAMLError):
    """A mapping key given twice (:class:`UniqueKeyLoader`)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error naming the key
    and both lines (PyYAML keeps the last silently: a recipe's earlier setting vanishes)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} is given twice, on lines {seen[key]} and {line}; keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Build a RunConfig from a YAML file plus overrides (leaf or dotted keys).

    Raises:
        ConfigError: unreadable YAML, unknown key (with the valid ones listed), wrong type.
    """
    cfg = RunConfig()
    from_recipe: set[str] = set()  # keys whose relative paths are read from the recipe's folder
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            raw = yaml.load(text, Loader=UniqueKeyLoader) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except DuplicateKeyError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            hint = f' (quote values that start with {DATA_ROOT}: "{DATA_ROOT}/...")' if DATA_ROOT in text else ""
            raise ConfigError(f"{path}: not valid YAML: {exc}{hint}") from None
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
                from_recipe.add(f"{section}.{name}")
    index = _leaf_index()
    for key, value in (overrides or {}).items():
        norm = key.lstrip("-").replace("-", "_")
        if norm not in index:
            raise ConfigError(f"unknown option --{key.lstrip('-')}; valid keys: {sorted(k for k in index if '.' not in k)}")
        _set(cfg, index[norm], value, "command line")
        from_recipe.discard(index[norm])
    recipe_dir = path.resolve().parent if path is not None else None
    _resolve_paths(cfg, {key: recipe_dir for key in from_recipe})
    return cfg.validate()


def _resolve_paths(cfg: RunConfig, recipe_keys: dict[str, Path | None]) -> None:
    """Make the path keys absolute, in place: ``{data_root}`` expanded, relative paths read
    from the recipe's folder for ``recipe_keys`` and from the current folder otherwise (the
    command line, the defaults), so a recipe runs the same from any folder.

    ``model.name_or_path`` counts as a path only where it names one (starts with ``.`` or
    ``~``, or exists there); a hub id or the bundled model's name stays as it is.
    """
    data = cfg.data

    base = recipe_keys.get
    keys = data.path_keys()
    for key in keys:
        if not getattr(data, key).strip():  # "" would resolve to the current folder
            raise ConfigError(f"config key 'data.{key}' = '': an empty path; give a file or folder")
    if any(DATA_ROOT in getattr(data, key) for key in keys):
        # --data-root (a command-line override) > SIMCSE_KIT_DATA > the recipe's > the default.
        if data.data_root is not None and "data.data_root" not in recipe_keys:
            root = absolute(data.data_root)
        elif os.environ.get(DATA_ENV):
            root = absolute(os.environ[DATA_ENV])
        elif data.data_root is not None:
            root = absolute(data.data_root, base("data.data_root"))
        else:
            root = default_data_root()
        for key in keys:
            value = getattr(data, key)
            if DATA_ROOT in value and root is None:
                raise ConfigError(f"config key 'data.{key}' = {value!r} needs a data root, and none is set: {DATA_ROOT_HINT}")
        data.data_root = str(root)
    elif data.data_root is not None:
        data.data_root = str(absolute(data.data_root, base("data.data_root")))
    for key in keys:
        setattr(data, key, str(absolute(getattr(data, key).replace(DATA_ROOT, data.data_root or ""), base(f"data.{key}"))))
    name = cfg.model.name_or_path
    folder = base("model.name_or_path") or Path.cwd()
    if name.startswith((".", "~")) or (folder / name).exists():
        cfg.model.name_or_path = str(absolute(name, folder))
    teacher = cfg.loss.teacher  # a path only where it names one, as model.name_or_path
    folder = base("loss.teacher") or Path.cwd()
    if teacher is not None and (teacher.startswith((".", "~")) or (folder / teacher).exists()):
        cfg.loss.teacher = str(absolute(teacher, folder))
    if cfg.loss.teacher_cache_dir is not None:
        cfg.loss.teacher_cache_dir = str(absolute(cfg.loss.teacher_cache_dir, base("loss.teacher_cache_dir")))


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (the run folder's record of what ran).

    Written to a temp file and renamed, so a kill never leaves half a config that a
    ``--resume`` would then read.
    """
    write_text_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def flat_params(cfg: Any) -> dict[str, bool | int | float | str]:
    """A config dataclass as one flat mapping for experiment trackers' hyper-parameters:
    dotted keys (``train.learning_rate``), None as ``"none"`` and lists comma-joined,
    since TensorBoard's hparams take only numbers, strings and booleans."""

    def flat(values: dict[str, Any], prefix: str) -> dict[str, bool | int | float | str]:
        out: dict[str, bool | int | float | str] = {}
        for key, value in values.items():
            if isinstance(value, dict):
                out |= flat(value, f"{prefix}{key}.")
            elif isinstance(value, list):
                out[prefix + key] = ",".join(map(str, value))
            else:
                out[prefix + key] = "none" if value is None else value
        return out

    return flat(asdict(cfg), "")
