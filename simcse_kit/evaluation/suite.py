"""The STS suite: which tasks run, where their files are and how to read them.

The paper's seven tasks have one home, the shipped suite file ``evaluate/sts.yaml``
(a wheel installs it as ``simcse_kit/suite_files/sts.yaml``: ``pyproject.toml`` maps the
folder, nothing is copied; :func:`simcse_kit.config.recipes.recipe_folder` finds either).
:func:`default_suite` reads it; :func:`load_suite` reads and checks any suite file, so a
recipe (``simcse-kit evaluate MODEL --suite FILE``) can evaluate on another selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml

from simcse_kit.config.recipes import recipe_folder
from simcse_kit.errors import ConfigError

__all__ = ["MAIN_TASKS", "SUITE_NAME", "TaskSpec", "default_suite", "load_suite", "stsb_split_path"]

# "hub": one test split from a Hugging Face dataset (simcse_kit.evaluation.hub), never in a YAML suite.
TaskFormat = Literal["sts", "stsb", "sick", "pairs", "hub"]
FORMATS: tuple[str, ...] = ("sts", "stsb", "sick", "pairs")

SUITE_NAME = "sts"
"""The built-in suite of the paper's seven tasks (``evaluate/sts.yaml``)."""

# Detail keys a task reports besides its subsets; subsets may not use these names.
_RESERVED_SUBSETS = frozenset({"all", "mean", "wmean"})


@dataclass(frozen=True)
class TaskSpec:
    """Where one STS task's files are and how to read them.

    Attributes:
        format: ``"sts"`` (STS12-16 input/gold file pairs, one per subset),
            ``"stsb"`` (STS Benchmark ``sts-dev.csv`` and ``sts-test.csv``) or
            ``"sick"`` (one SICK file with a header row), ``"pairs"`` (a table of
            ``sent0, sent1, score``: CSV, TSV, JSONL, Parquet...) or ``"hub"`` (one
            ``test`` split read through ``datasets``, see
            :mod:`simcse_kit.evaluation.hub`).
        path: Relative to the data folder: the task's folder for ``sts`` and
            ``stsb``, the annotated test file for ``sick``, the table for ``pairs``
            (an absolute path is taken as it is); the dataset id for ``hub``.
        subsets: The subset names for ``sts`` (``STS.input.<subset>.txt``);
            empty for the other formats.
    """

    format: TaskFormat
    path: str
    subsets: tuple[str, ...] = ()


def load_suite(path: Path | str) -> dict[str, TaskSpec]:
    """Loads and checks a YAML suite definition such as ``evaluate/sts.yaml``.

    The file holds one key, ``tasks``, mapping each task name to ``format``
    (``sts``, ``stsb``, ``sick`` or ``pairs``), ``path`` (relative to the data folder) and,
    for ``sts`` only, a non-empty list ``subsets``::

        tasks:
          STS13: {format: sts, path: STS/STS13-en-test, subsets: [FNWN, headlines, OnWN]}
          STSBenchmark: {format: stsb, path: STS/STSBenchmark}

    Returns:
        Task name -> spec, in file order.

    Raises:
        ConfigError: The file is missing, not YAML, or breaks the rules above;
            the message names the file and the offending task or key.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: suite file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a valid YAML file ({e})") from None
    if not isinstance(raw, dict) or set(raw) != {"tasks"}:
        raise ConfigError(f"{path}: expected a mapping with the single key 'tasks'")
    tasks = raw["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        raise ConfigError(f"{path}: 'tasks' must be a non-empty mapping of task name -> spec")
    suite: dict[str, TaskSpec] = {}
    for name, entry in tasks.items():
        ctx = f"{path}: task {name!r}"
        if not isinstance(name, str) or not name or "/" in name or name == "avg":
            raise ConfigError(f"{ctx}: task names must be non-empty strings without '/', not 'avg'")
        if not isinstance(entry, dict):
            raise ConfigError(f"{ctx}: expected a mapping with format, path[, subsets]")
        unknown = set(entry) - {"format", "path", "subsets"}
        if unknown:
            raise ConfigError(f"{ctx}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        fmt, rel, subsets = entry.get("format"), entry.get("path"), entry.get("subsets")
        if fmt not in FORMATS:
            raise ConfigError(f"{ctx}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if not isinstance(rel, str) or not rel:
            raise ConfigError(f"{ctx}: 'path' must be a non-empty string")
        if fmt == "sts":
            if not isinstance(subsets, list) or not subsets or not all(isinstance(s, str) and s for s in subsets):
                raise ConfigError(f"{ctx}: format sts needs 'subsets', a non-empty list of names")
            bad = sorted(set(subsets) & _RESERVED_SUBSETS)
            if bad or len(set(subsets)) != len(subsets):
                raise ConfigError(f"{ctx}: subset names must be unique and not all/mean/wmean")
            suite[name] = TaskSpec("sts", rel, tuple(subsets))
        else:
            if subsets is not None:
                raise ConfigError(f"{ctx}: 'subsets' is only for format sts")
            suite[name] = TaskSpec(fmt, rel)
    return suite


def suite_file() -> Path:
    """The shipped suite file of the paper's seven tasks: ``evaluate/sts.yaml`` in a
    checkout, ``simcse_kit/suite_files/sts.yaml`` in a wheel.

    Raises:
        ConfigError: Neither exists (a broken install).
    """
    folder = recipe_folder("evaluate")
    if folder is None or not (folder / f"{SUITE_NAME}.yaml").is_file():
        raise ConfigError(f"the built-in suite {SUITE_NAME}.yaml is missing from this install (looked in {folder})")
    return folder / f"{SUITE_NAME}.yaml"


@cache
def _shipped_suite() -> tuple[tuple[str, TaskSpec], ...]:
    return tuple(load_suite(suite_file()).items())  # immutable: the cache hands out one copy


def default_suite() -> dict[str, TaskSpec]:
    """The seven tasks of the SimCSE paper, in table order, read from the shipped
    ``evaluate/sts.yaml`` (read once; each call returns a fresh dict)."""
    return dict(_shipped_suite())


MAIN_TASKS: tuple[str, ...] = tuple(default_suite())
"""The paper's seven task names, in table order (``STS12`` ... ``SICKRelatedness``)."""


def stsb_split_path(data_dir: Path | str, split: str) -> Path:
    """``<data_dir>/STS/STSBenchmark/sts-<split>.csv``, the STS-B file of one split."""
    return Path(data_dir) / default_suite()["STSBenchmark"].path / f"sts-{split}.csv"
