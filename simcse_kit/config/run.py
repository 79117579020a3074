"""Typed run configuration: one dataclass per concern, loaded from YAML, overridable
from the command line, saved resolved in every run folder.

YAML is nested by concern (``model:``, ``data:``, ``loss:``, ``train:``). On the
command line any key may be given by its leaf name (``--pooler avg``) or dotted
(``--model.pooler avg``); dashes and underscores are interchangeable.
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from simcse_kit.config.recipes import DATA_ENV, DATA_ROOT_HINT, absolute, default_data_root
from simcse_kit.config.sections import (
    AUTO,
    DEFAULT_MODEL,
    HUB_PREFIX,
    OPTIONAL_DATA_PATHS,
    DataConfig,
    LoopConfig,
    LossConfig,
    ModelConfig,
    TrainConfig,
    option,
)
from simcse_kit.config.values import DuplicateKeyError, UniqueKeyLoader, parse_value
from simcse_kit.core import modes
from simcse_kit.errors import ConfigError
from simcse_kit.files import write_text_atomic

# The sections (simcse_kit.config.sections) are imported from here, with the run they make up.
__all__ = [
    "AUTO",
    "DEFAULT_MODEL",
    "HUB_PREFIX",
    "MLP_MODES",
    "MODES",
    "OPTIONAL_DATA_PATHS",
    "PAIR_FORMATS",
    "POOLERS",
    "PRECISIONS",
    "SECTIONS",
    "DataConfig",
    "LoopConfig",
    "LossConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "check_pooling",
    "flat_params",
    "key_help",
    "load_config",
    "option",
    "save_config",
]

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "last")
MLP_MODES = ("none", "train", "always")
MODES = tuple(modes.TABLE)  # simcse_kit.core.modes: one row per mode
PAIR_FORMATS = ("stsb", "sick")  # scored-pair files a run reads; evaluation.readers.PAIR_READERS maps each to its reader
PRECISIONS = ("auto", "no", "fp16", "bf16")
DATA_ROOT = "{data_root}"  # stands for the data root in the data paths (train_file, eval_data_dir, ...)
# The temperature's range. Logits are cos / tau in fp32, so any tau > 3e-39 keeps them finite;
# the real floor is where learning stops: below 1e-3 a cosine gap of 0.1 between the positive
# and a negative is a logit gap over 100, past where fp32's exp underflows (exp(-104) = 0), so
# the softmax is one-hot, the loss exactly 0 and no gradient flows (tau 1e-6: loss 0.0 from
# step 1). Above 10 every logit lies within 0.2 of the others and the loss is log(N), flat.
TEMPERATURE_RANGE = (1e-3, 10.0)
TEMPERATURE_WHY = "lower, fp32's exp underflows: loss 0 and no gradient; higher, all logits are alike: a flat loss"


def check_pooling(pooler: str, mlp: str = "none") -> None:
    """The one check of a pooler and an MLP mode: a recipe's (:meth:`RunConfig.validate`) and
    a model's built in code (:class:`simcse_kit.model.modeling.SimCSEModel`, ``Pooler``).

    Raises:
        ConfigError: naming the key, its value and what it must be.
    """
    rules = (
        ("model.pooler", pooler, pooler in POOLERS, f"one of {POOLERS}"),
        ("model.mlp", mlp, mlp in MLP_MODES, f"one of {MLP_MODES}"),
        # SimCSE's MLP replaces BERT's own pooler layer, which cls_before_pooler reads past.
        ("model.mlp", mlp, pooler != "cls_before_pooler" or mlp == "none", "'none' with pooler cls_before_pooler"),
    )
    for key, value, ok, expected in rules:
        if not ok:
            raise ConfigError(f"config key {key!r} = {value!r}: must be {expected}")


@dataclass
class RunConfig:
    """Everything a training run needs; saved as ``config.yaml`` in the run folder."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> RunConfig:
        """Check enumerations and ranges; raise ConfigError naming the key.

        Rules another module owns are its checks, called here (:func:`check_pooling`); the
        others are the config's own (a usable temperature range, a batch with a negative).
        """
        check_pooling(self.model.pooler, self.model.mlp)
        low, high = TEMPERATURE_RANGE
        checks: list[tuple[str, bool, str]] = [
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
        checks.append(("data.bad_rows", self.data.bad_rows in ("error", "skip"), "'error' or 'skip'"))
        checks.append(("data.mix_ratio", 0 <= self.data.mix_ratio < 1, "in [0, 1)"))
        if self.data.mix_ratio > 0:
            checks.append(("data.mix_file", self.data.mix_file is not None, "set with data.mix_ratio > 0"))
        if self.data.max_train_samples is not None:
            # One example would make batches without a single negative: a zero loss.
            checks.append(("data.max_train_samples", self.data.max_train_samples >= 2, ">= 2 (or null for all)"))
        if self.loss.false_negative_threshold is not None:
            checks.append(("loss.false_negative_threshold", -1 < self.loss.false_negative_threshold <= 1, "in (-1, 1] or null"))
        if self.data.prompts is not None:
            names = ("query", "document")  # simcse_kit.core.batch.PROMPT_NAMES
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
            student_tau = self.loss.teacher_student_temperature
            student_tau_ok = student_tau is None or low <= student_tau <= high
            checks.append(("loss.teacher_student_temperature", student_tau_ok, f"null or in [{low:g}, {high:g}]"))
            projection_ok = self.loss.teacher_projection in ("pca", "aligned", "none")
            checks.append(("loss.teacher_projection", projection_ok, "'pca', 'aligned' or 'none'"))
        if self.train.mmap_threshold_mib is not None:
            # glibc's mallopt takes 0..32 MiB on 64-bit; below 1 MiB every activation would be a mapping.
            checks.append(("train.mmap_threshold_mib", 1 <= self.train.mmap_threshold_mib <= 32, "in [1, 32] or null"))
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

    The meaning is the field's own ``help`` (:func:`option`); a subclass's field
    replaces its base's (TrainConfig re-declares some of LoopConfig's keys).
    """
    rows = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            rows.append((f"{section}.{f.name}", str(f.type), default, f.metadata.get("help", "")))
    return rows


def _leaf_index() -> dict[str, str]:
    """Map each leaf name (and dotted name) to its dotted key; leaf names are unique."""
    index: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            index[f.name] = f"{section}.{f.name}"
            index[f"{section}.{f.name}"] = f"{section}.{f.name}"
    return index


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse(value: Any, key: str, source: str) -> Any:
    """``value`` for the dotted ``key``, checked against its field's type (:func:`parse_value`)."""
    section, name = key.split(".")
    declared = {f.name: f.type for f in fields(SECTIONS[section])}[name]  # as written: "int | None"
    return parse_value(value, _type_hints(SECTIONS[section])[name], str(declared), key, source)


def _set(cfg: RunConfig, dotted: str, value: Any, source: str) -> None:
    section, name = dotted.split(".")
    setattr(getattr(cfg, section), name, _parse(value, dotted, source))


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
