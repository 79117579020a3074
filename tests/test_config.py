"""Typed configs: the loop's settings apart from the run's, YAML + command-line overrides,
every recipe loading, the resolved config round-tripping, errors naming the key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from simcse_kit.config.run import (
    DEV_FORMATS,
    GUIDE_MARGIN_STRATEGIES,
    MLP_MODES,
    MODES,
    POOLERS,
    PRECISIONS,
    TEACHER_LOSSES,
    TEACHER_PROJECTIONS,
    DataConfig,
    LoopConfig,
    LossConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    key_help,
    load_config,
    save_config,
)
from simcse_kit.core import modes
from simcse_kit.errors import ConfigError

RECIPES = sorted((REPO / "train").rglob("*.yaml"))


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_train_section_is_the_loop_plus_the_run() -> None:
    """``fit`` takes a LoopConfig; the YAML ``train:`` section is a TrainConfig, i.e. the
    loop's settings plus the run's own (where it writes, batch size, model speed-ups)."""
    assert issubclass(TrainConfig, LoopConfig)
    assert names(TrainConfig) - names(LoopConfig) == {
        "output_dir",
        "batch_size",
        "gradient_checkpointing",
        "fast_dropout",
        "grad_cache_chunk",
        "final_eval",
        "mmap_threshold_mib",
        "compile",
        "selection_precision",
    }
    assert "output_dir" not in names(LoopConfig)
    assert LoopConfig(mixed_precision="bf16", bf16_weights=True).bf16_model
    assert not LoopConfig(mixed_precision="no", bf16_weights=True).bf16_model  # ignored off bf16
    assert not TrainConfig(mixed_precision="bf16").bf16_model


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(p.relative_to(REPO)) for p in RECIPES])
def test_every_recipe_loads_with_its_values(recipe: Path) -> None:
    raw = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    cfg = load_config(recipe)
    for section, values in raw.items():
        for key, value in values.items():
            if isinstance(value, str) and "{data_root}" in value:  # data paths: the data root put in, absolute
                assert cfg.data.data_root == str(REPO.parent / "shared" / "data")
                value = value.replace("{data_root}", cfg.data.data_root)
            if f"{section}.{key}" == "train.output_dir":  # read from the current folder, recorded absolute
                value = str(Path.cwd() / value)
            if f"{section}.{key}" == "data.datasets":  # name -> spec, each file resolved like train_file
                root = str(REPO.parent / "shared" / "data")
                value = {name: spec | {"file": spec["file"].replace("{data_root}", root)} for name, spec in value.items()}
                got = {spec.name: {k: getattr(spec, k) for k in value[spec.name]} for spec in cfg.data.datasets}
                assert got == value
                continue
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"


def test_save_then_load_gives_the_same_config(tmp_path: Path) -> None:
    cfg = load_config(REPO / "train" / "unsup.yaml", {"seed": "3", "max_steps": "10", "model.dropout": "0.2"})
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left behind


def test_overrides_by_leaf_or_dotted_name(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  dropout: 0.2\ntrain:\n  max_steps: null\n")
    cfg = load_config(path, {"max_grad_norm": "1.0", "progress-bar": "false", "--train.seed": "5", "model.pooler": "cls"})
    assert cfg.model.dropout == 0.2 and cfg.train.max_steps is None
    assert cfg.train.max_grad_norm == 1.0 and cfg.train.progress_bar is False
    assert cfg.train.seed == 5 and cfg.model.pooler == "cls"
    assert load_config(None, {"max_steps": "none"}).train.max_steps is None
    assert load_config(None, {"grad_accum": 4.0}).train.grad_accum == 4  # a whole float is an int


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("train:\n  batch_size: many\n", {}, r"c.yaml: config key 'train.batch_size' = 'many' is not a valid"),
        ("train:\n  batch_size: 8.5\n", {}, r"'train.batch_size' = 8.5 is not a valid"),
        ("train:\n  batchsize: 8\n", {}, r"unknown key train.batchsize; valid keys: \[.*'batch_size'"),
        ("trainer:\n  seed: 1\n", {}, r"unknown section 'trainer'"),
        ("- a\n", {}, r"top level must be a mapping"),
        ("train: [1\n", {}, r"not valid YAML"),
        ("", {}, r"c.yaml: empty recipe \(no sections\)"),
        ("# only a comment\n\n", {}, r"c.yaml: empty recipe"),
        ("{}\n", {"batch-sise": "8"}, r"unknown option --batch-sise"),
        ("{}\n", {"progress_bar": "maybe"}, r"command line: config key 'train.progress_bar' = 'maybe'"),
        ("{}\n", {"pooler": "max"}, r"'model.pooler' = 'max': must be one of"),
        ("{}\n", {"warmup_ratio": "1"}, r"'train.warmup_ratio' = 1.0: must be in \[0, 1\)"),
        ("{}\n", {"batch_size": "1"}, r"'train.batch_size' = 1: must be >= 2"),
        ("{}\n", {"queue_size": "8", "momentum": "1"}, r"'loss.momentum' = 1.0: must be in \[0, 1\)"),
        ("{}\n", {"false_negative_threshold": "1.5"}, r"'loss.false_negative_threshold' = 1.5: must be in \(-1, 1\] or null"),
        ("{}\n", {"queue_size": "8", "grad_cache_chunk": "4"}, r"'train.grad_cache_chunk' = 4: must be 0 with loss.queue_size"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, yaml_text: str, overrides: dict[str, str], message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config("nope.yaml")


def test_momentum_is_free_without_a_queue() -> None:
    assert load_config(None, {"momentum": "1"}).loss.momentum == 1.0  # unused: no queue


def test_defaults_are_valid() -> None:
    assert RunConfig().validate() == RunConfig()


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("learning_rate", "1e-4", 1e-4),  # YAML 1.1 reads 1e-4 (no dot) as text; the float key takes it
        ("grad_accum", "4.0", 4),  # a whole float is an int
        ("seed", "010", 8),  # YAML 1.1's octal, as in a recipe
        ("progress_bar", "yes", True),
        ("bf16_weights", "auto", "auto"),
        ("bf16_weights", "false", False),
        ("max_steps", "null", None),
        ("matryoshka_dims", "[64, 32]", [64, 32]),
        ("report_to", "tensorboard", ["tensorboard"]),
        ("prompts", "{query: 'q: '}", {"query": "q: "}),
    ],
)
def test_a_value_means_the_same_in_a_recipe_and_on_the_command_line(tmp_path: Path, key: str, text: str, value: object) -> None:
    """One parser for both: YAML's own scalar rules, then the key's type."""
    cfg = load_config(None, {key: text})
    section = next(s for s in ("model", "data", "loss", "train") if hasattr(getattr(cfg, s), key))
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {key}: {text}\n")
    assert getattr(getattr(cfg, section), key) == value
    assert getattr(getattr(load_config(path), section), key) == value


def test_a_text_key_keeps_its_text_on_the_command_line(tmp_path: Path) -> None:
    assert load_config(None, {"mixed_precision": "no"}).train.mixed_precision == "no"  # not YAML's false
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  mixed_precision: no\n")  # in a recipe YAML reads false: the error says to quote it
    with pytest.raises(ConfigError, match=r"'train.mixed_precision' = False is not a valid str \(quote it"):
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"progress_bar": "1"}, r"command line: config key 'train.progress_bar' = '1' is not a valid bool"),
        ({"bf16_weights": "maybe"}, r"config key 'train.bf16_weights' = 'maybe' must be true, false or auto"),
        ({"max_steps": "[1]"}, r"config key 'train.max_steps' = '\[1\]' is not a valid int \| None"),
        ({"matryoshka_dims": "64,x"}, r"'loss.matryoshka_dims' = '64,x' must be a list of ints"),
        ({"prompts": "[a]"}, r"'data.prompts' = '\[a\]' must be a mapping of names to texts"),
    ],
)
def test_type_errors_name_the_key_and_the_type(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_each_section_checks_its_own_keys() -> None:
    """A section's rules are its own ``check()``: a bad value is refused by the section that
    holds it, the loop's keys by the LoopConfig the image demo trains with too; the run
    adds only the rules that span sections."""
    bad = [
        (ModelConfig(pooler="max"), "'model.pooler' = 'max'"),
        (DataConfig(mix_ratio=0.5), "'data.mix_file' = None: must be set with data.mix_ratio > 0"),
        (LossConfig(teacher="t", teacher_loss="kl"), "'loss.teacher_loss' = 'kl': must be 'similarity' or 'embedding'"),
        (LoopConfig(learning_rate=0.0), "'train.learning_rate' = 0.0: must be > 0 and finite"),
        (TrainConfig(batch_size=1), "'train.batch_size' = 1"),
        (TrainConfig(mmap_threshold_mib=64), "'train.mmap_threshold_mib' = 64"),
    ]
    for section, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            section.check()
    # A queue and GradCache: each section is fine alone, the run refuses the pair.
    loss, train = LossConfig(queue_size=8), TrainConfig(grad_cache_chunk=4)
    loss.check()
    train.check()
    with pytest.raises(ConfigError, match=re.escape("'train.grad_cache_chunk' = 4: must be 0 with loss.queue_size > 0")):
        RunConfig(loss=loss, train=train).validate()


# Each key with a fixed set of values, that set, and what else the check needs to see it.
ENUMERATED = [
    ("model.pooler", POOLERS, {}),
    ("model.mlp", MLP_MODES, {"pooler": "cls"}),
    ("data.mode", MODES, {}),
    ("data.dev_format", DEV_FORMATS, {"dev_file": "."}),
    ("loss.unsup_loss", modes.UNSUP_LOSSES, {}),
    ("loss.teacher_loss", TEACHER_LOSSES, {"teacher": "t"}),
    ("loss.teacher_projection", TEACHER_PROJECTIONS, {"teacher": "t"}),
    ("loss.guide_margin_strategy", GUIDE_MARGIN_STRATEGIES, {"guide": "g"}),
    ("train.mixed_precision", PRECISIONS, {}),
]


@pytest.mark.parametrize(("key", "allowed", "context"), ENUMERATED, ids=[key for key, _, _ in ENUMERATED])
def test_a_keys_help_names_the_values_its_check_allows(key: str, allowed: tuple[str, ...], context: dict[str, str]) -> None:
    """One list per key: ``--help`` names every value the check takes, each one passes and
    anything else is refused naming the key."""
    meaning = {dotted: meaning for dotted, _, _, meaning in key_help()}[key]
    for value in allowed:
        assert f'"{value}"' in meaning or repr(value) in meaning, (key, value, meaning)
        section, name = key.split(".")
        cfg = RunConfig()
        for field, setting in {**context, name: value}.items():
            target = next(s for s in (cfg.model, cfg.data, cfg.loss, cfg.train) if hasattr(s, field))
            setattr(target, field, setting)
        cfg.validate()
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}' = 'nope': must be")):
        load_config(None, {**context, key: "nope"})


def test_allowed_values_have_one_definition() -> None:
    """The modules that act on a key's values read the config's list (or the config reads
    theirs, where they sit below it), not a copy that could drift."""
    from simcse_kit.core import batch
    from simcse_kit.model import precision

    assert modes.TEACHER_LOSSES is TEACHER_LOSSES  # the objective's TeacherTargets reads modes'
    assert precision.PRECISIONS is PRECISIONS
    assert batch.PROMPT_NAMES is modes.PROMPT_NAMES
    assert MODES == tuple(modes.TABLE)


def test_a_pairs_or_beir_dev_split_needs_its_file() -> None:
    """``data.dev_format: pairs`` (a user's table) and ``beir`` have no default file to fall back on."""
    for fmt, what in (("pairs", "a table of sent0, sent1, score"), ("beir", "a BEIR-format folder")):
        with pytest.raises(ConfigError, match=re.escape(f"config key 'data.dev_file' = None: must be {what}")):
            load_config(None, {"dev_format": fmt})
