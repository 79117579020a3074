"""Typed run configuration: one dataclass per concern, loaded from YAML, overridable
from the command line, saved resolved in every run folder.

YAML is nested by concern (``model:``, ``data:``, ``loss:``, ``train:``). On the
command line any key may be given by its leaf name (``--pooler avg``) or dotted
(``--model.pooler avg``); dashes and underscores are interchangeable.
"""

from __future__ import annotations

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
    DEV_FORMATS,
    DISTILL_LOSSES,
    GUIDE_IS_TEACHER,
    GUIDE_MARGIN_STRATEGIES,
    HUB_PREFIX,
    MLP_MODES,
    MODES,
    OPTIONAL_DATA_PATHS,
    PAIR_FORMATS,
    POOLERS,
    PRECISIONS,
    SCORE_LOSSES,
    TEACHER_LOSSES,
    TEACHER_PROJECTIONS,
    TEMPERATURE_RANGE,
    DataConfig,
    LoopConfig,
    LossConfig,
    ModelConfig,
    TrainConfig,
    check_pooling,
    files_label,
    is_hub,
    option,
    raise_first,
)
from simcse_kit.config.values import RecipeShapeError, UniqueKeyLoader, parse_value
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.files import is_glob, shard_paths, write_text_atomic

# The sections (simcse_kit.config.sections) are imported from here, with the run they make up.
__all__ = [
    "AUTO",
    "DEFAULT_MODEL",
    "DEV_FORMATS",
    "DISTILL_LOSSES",
    "GUIDE_IS_TEACHER",
    "GUIDE_MARGIN_STRATEGIES",
    "HUB_PREFIX",
    "files_label",
    "is_hub",
    "MLP_MODES",
    "MODES",
    "OPTIONAL_DATA_PATHS",
    "PAIR_FORMATS",
    "POOLERS",
    "PRECISIONS",
    "SCORE_LOSSES",
    "SECTIONS",
    "TEACHER_LOSSES",
    "TEACHER_PROJECTIONS",
    "TEMPERATURE_RANGE",
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

DATA_ROOT = "{data_root}"  # stands for the data root in the data paths (train_file, eval_data_dir, ...)


def file_in_the_way(folder: Path) -> Path | None:
    """``folder`` itself or the nearest of its parents that exists, where that is not a
    folder (so ``folder`` cannot be created or used as one); None where nothing blocks it."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


@dataclass
class RunConfig:
    """Everything a training run needs; saved as ``config.yaml`` in the run folder."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> RunConfig:
        """Check every key's value; raise ConfigError naming the first key that is wrong.

        Each section checks its own keys (``ModelConfig.check``, ..., beside their help in
        :mod:`simcse_kit.config.sections`); the rules here are the ones that span sections.
        """
        self.model.check()
        self.data.check()
        self.loss.check()
        self.train.check()
        if self.loss.queue_size > 0:  # the momentum queue and GradCache each own the step
            ok = self.train.grad_cache_chunk == 0
            raise_first("train", self.train, [("grad_cache_chunk", ok, "0 with loss.queue_size > 0 (use one of them)")])
        specs = self.data.training_sets()
        if any(spec.mode == "scored" for spec in specs) and self.loss.score_weight == 1:
            # No InfoNCE term then: what only feeds it would be silently unused.
            unused = [
                ("queue_size", self.loss.queue_size == 0, "0 with loss.score_weight 1 (the queue feeds InfoNCE)"),
                ("teacher", self.loss.teacher is None, "null with loss.score_weight 1 (it joins InfoNCE)"),
                ("guide", self.loss.guide is None, "null with loss.score_weight 1 (it vets InfoNCE's negatives)"),
            ]
            raise_first("loss", self.loss, unused)
        if self.loss.distill is not None:  # the scores are of each row's positive and hard negatives
            unscored = [spec for spec in specs if spec.mode != "hardneg"]
            if self.data.datasets is None:
                raise_first("data", self.data, [("mode", not unscored, "'hardneg' with loss.distill")])
            elif unscored:
                where = f"config key 'data.datasets' entry {unscored[0].name!r}: mode {unscored[0].mode!r}"
                raise ConfigError(f"{where}: must be 'hardneg' with loss.distill (its rows' candidates carry the scores)")
            if self.loss.distill_weight == 1:  # the distill term alone: what only feeds InfoNCE would be unused
                unused = [
                    ("queue_size", self.loss.queue_size == 0, "0 with loss.distill_weight 1 (the queue feeds InfoNCE)"),
                    ("teacher", self.loss.teacher is None, "null with loss.distill_weight 1 (it joins InfoNCE)"),
                ]
                raise_first("loss", self.loss, unused)
        return self

    def check_data(self) -> RunConfig:
        """Check the data paths exist before anything is loaded; raise ConfigError naming
        the key, the path tried and how the data root is set."""
        for key in self.data.path_keys():
            if key == "train_file" and self.data.datasets is not None:  # unused: the datasets' files are checked below
                continue
            value = getattr(self.data, key)
            if key in SHARDED_PATHS and (isinstance(value, list) or is_glob(value)):  # shards (docs/data.md)
                _check_shards(f"config key 'data.{key}'", value)
                continue
            path = Path(value)
            folder = key == "eval_data_dir"
            if not (path.is_dir() if folder else path.exists()):
                hint = (
                    f"the data root is {self.data.data_root}: {DATA_ROOT_HINT}"
                    if self.data.data_root
                    else "relative paths in a recipe are read from its folder, on the command line from the current one"
                )
                raise ConfigError(f"config key 'data.{key}': {path}: {'folder' if folder else 'file'} not found ({hint})")
        for spec in self.data.datasets or []:
            if not is_hub(spec.file):
                _check_shards(f"config key 'data.datasets' entry {spec.name!r}", spec.file)
        # Folders the run will create: one under a file could never be made (NotADirectoryError
        # after the data and model were loaded), and a cache folder that is a file never written.
        for key, value in (
            ("train.output_dir", self.train.output_dir),
            ("loss.teacher_cache_dir", self.loss.teacher_cache_dir if self.loss.teacher else None),
        ):
            if value is not None and (blocker := file_in_the_way(Path(value))) is not None:
                what = "exists and is not a folder" if blocker == Path(value) else f"is under {blocker}, not a folder"
                raise ConfigError(f"config key {key!r} = {value!r}: {what}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The data keys that name a training dataset: a file, or its shards (a glob pattern or a folder).
SHARDED_PATHS = ("train_file", "mix_file")


def _check_shards(what: str, source: str | list[str]) -> None:
    """Raise a ConfigError naming ``what`` where ``source`` names no readable training file or shards."""
    try:
        shard_paths(source)
    except DataError as exc:
        raise ConfigError(f"{what}: {exc}") from None


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(RunConfig)[f.name] for f in fields(RunConfig)}


def key_help() -> list[tuple[str, str, Any, str]]:
    """``(dotted key, type, default, meaning)`` for every config key, for ``--help``.

    The meaning is the field's own ``help`` (:func:`option`); a subclass's field
    replaces its base's (TrainConfig re-declares some of LoopConfig's keys).
    """
    rows = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            default = f.default if f.default_factory is MISSING else f.default_factory()
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
            raw = yaml.load(text, Loader=UniqueKeyLoader)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except RecipeShapeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            hint = f' (quote values that start with {DATA_ROOT}: "{DATA_ROOT}/...")' if DATA_ROOT in text else ""
            raise ConfigError(f"{path}: not valid YAML: {exc}{hint}") from None
        # An empty file is more often a failed save or a half-written copy than a wish for the defaults;
        # trained as the defaults, it would spend a run on a model nobody asked for.
        if raw is None:
            raise ConfigError(f"{path}: empty recipe (no sections); write sections {list(SECTIONS)}, or '{{}}' for every default")
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
    try:
        return cfg.validate()
    except ConfigError as exc:
        if path is None or "data.datasets" not in from_recipe or not str(exc).startswith("config key 'data.datasets'"):
            raise
        raise ConfigError(f"{path}: {exc}") from None  # a dataset entry is the recipe's: name the file too


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
        if not files_label(getattr(data, key)).strip():  # "" would resolve to the current folder
            raise ConfigError(f"config key 'data.{key}' = '': an empty path; give a file or folder")
    # data.datasets' files are resolved as train_file is, from the recipe's folder where it lists them.
    specs = [spec for spec in data.datasets or [] if not is_hub(spec.file)]
    given = [files_label(getattr(data, key)) for key in keys] + [files_label(spec.file) for spec in specs]
    if any(DATA_ROOT in value for value in given):
        # --data-root (a command-line override) > SIMCSE_KIT_DATA > the recipe's > the default.
        root: Path | None
        if data.data_root is not None and "data.data_root" not in recipe_keys:
            root = absolute(data.data_root)
        elif os.environ.get(DATA_ENV):
            root = absolute(os.environ[DATA_ENV])
        elif data.data_root is not None:
            root = absolute(data.data_root, base("data.data_root"))
        else:
            root = default_data_root()
        named = [(f"data.{key}", files_label(getattr(data, key))) for key in keys]
        named += [(f"data.datasets' entry {spec.name!r} file", files_label(spec.file)) for spec in specs]
        for what, value in named:
            if DATA_ROOT in value and root is None:
                raise ConfigError(f"config key '{what}' = {value!r} needs a data root, and none is set: {DATA_ROOT_HINT}")
        data.data_root = str(root)
    elif data.data_root is not None:
        data.data_root = str(absolute(data.data_root, base("data.data_root")))

    def resolved(value: str, folder: Path | None) -> str:
        return str(absolute(value.replace(DATA_ROOT, data.data_root or ""), folder))

    for key in keys:
        value = getattr(data, key)
        folder = base(f"data.{key}")
        setattr(data, key, [resolved(v, folder) for v in value] if isinstance(value, list) else resolved(value, folder))
    for spec in specs:
        folder = base("data.datasets")
        spec.file = [resolved(v, folder) for v in spec.file] if isinstance(spec.file, list) else resolved(spec.file, folder)
    name = cfg.model.name_or_path
    folder = base("model.name_or_path") or Path.cwd()
    if name.startswith((".", "~")) or (folder / name).exists():
        cfg.model.name_or_path = str(absolute(name, folder))
    for key in ("teacher", "guide"):  # a path only where it names one, as model.name_or_path
        other = getattr(cfg.loss, key)
        folder = base(f"loss.{key}") or Path.cwd()
        if other is None or (key == "guide" and other == GUIDE_IS_TEACHER):
            continue
        if other.startswith((".", "~")) or (folder / other).exists():
            setattr(cfg.loss, key, str(absolute(other, folder)))
    if cfg.loss.teacher_cache_dir is not None:
        cfg.loss.teacher_cache_dir = str(absolute(cfg.loss.teacher_cache_dir, base("loss.teacher_cache_dir")))
    # The run folder is read from the current folder wherever it is given (`runs/` is where
    # you are), and recorded absolute like every other path (README, config.yaml).
    if cfg.train.output_dir.strip():
        cfg.train.output_dir = str(absolute(cfg.train.output_dir))


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
