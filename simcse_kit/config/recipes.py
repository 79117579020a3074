"""Recipes that ship with the package, and where the data lives.

The recipes in the repo's ``train/`` (training) and ``evaluate/`` (STS suites) are the
readable source; a wheel installs the same files as ``simcse_kit/recipe_files`` and
``simcse_kit/suite_files`` (``pyproject.toml`` maps the folders, nothing is copied). From a
source checkout (an editable install) the repo's folders are read directly. A built-in
recipe is named by its path under ``train/`` without ``.yaml``: ``unsup``,
``paper/unsup_bert_base``.

The data root is the folder that ``{data_root}`` stands for in a recipe's data paths.
Precedence: ``--data-root`` > the ``SIMCSE_KIT_DATA`` environment variable > the recipe's
``data.data_root`` > the default, which in a source checkout is ``../shared/data`` beside
it (where this project keeps its data) and in an installed wheel does not exist.

Standard library only: ``simcse-kit recipes`` works without torch being imported.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from simcse_kit.errors import ConfigError

logger = logging.getLogger(__name__)

DATA_ENV = "SIMCSE_KIT_DATA"
DATA_ROOT_HINT = f"set it with --data-root DIR or the {DATA_ENV} environment variable"
# simcse_kit/, two folders up from simcse_kit/config/recipes.py.
PACKAGE = Path(__file__).resolve().parents[1]
# Repo folder -> the package folder a wheel installs it as (pyproject.toml's package-dir).
SHIPPED = {"train": "recipe_files", "evaluate": "suite_files"}


def checkout() -> Path | None:
    """The source checkout this package runs from, or None when it is installed."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "train").is_dir() else None


def recipe_folder(kind: str = "train") -> Path | None:
    """Where the built-in recipes of ``kind`` (``train`` or ``evaluate``) are: inside the
    installed package, else the checkout's folder; None if neither exists."""
    installed = PACKAGE / SHIPPED[kind]
    if installed.is_dir():
        return installed
    repo = checkout()
    return repo / kind if repo is not None and (repo / kind).is_dir() else None


def builtin_recipes(kind: str = "train") -> dict[str, Path]:
    """Built-in recipe name (``paper/unsup_bert_base``) -> its file, sorted by name."""
    folder = recipe_folder(kind)
    if folder is None:
        return {}
    found = {p.relative_to(folder).with_suffix("").as_posix(): p for p in folder.rglob("*.yaml")}
    return dict(sorted(found.items()))


def find_recipe(name: str | Path, kind: str = "train") -> Path:
    """A recipe file: ``name`` itself when such a file exists, else the built-in recipe of
    that name.

    A name that looks like a file (``.yaml`` or a folder in it) but is neither is handed
    back as is, so that reading it reports the missing file.

    Raises:
        ConfigError: ``name`` is neither a file nor a built-in recipe.
    """
    path = Path(name)
    if path.is_file():
        return path
    known = builtin_recipes(kind)
    key = path.as_posix().removesuffix(".yaml")
    if key in known:
        logger.info("built-in %s %r: %s", "recipe" if kind == "train" else "suite", key, known[key])
        return known[key]
    if path.suffix in (".yaml", ".yml"):
        return path
    what = "recipe" if kind == "train" else "suite"
    raise ConfigError(f"{str(name)!r}: no such file and no built-in {what} of that name; built-in: {list(known)}")


def describe(path: Path) -> str:
    """A recipe's one-line description: its first comment line."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def default_data_root() -> Path | None:
    """``../shared/data`` beside a source checkout; None for an installed package."""
    repo = checkout()
    return repo.parent / "shared" / "data" if repo is not None else None


def absolute(path: str | Path, base: Path | None = None) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base`` (default: the current
    folder) and normalised."""
    full = Path(path).expanduser()
    return Path(os.path.abspath((base or Path.cwd()) / full))


def data_root(explicit: str | Path | None = None) -> Path | None:
    """The data root without a recipe: ``explicit`` (``--data-root``, relative to the current
    folder) > ``SIMCSE_KIT_DATA`` > the checkout default; None if none applies."""
    if explicit is not None:
        return absolute(explicit)
    if os.environ.get(DATA_ENV):
        return absolute(os.environ[DATA_ENV])
    return default_data_root()


def senteval_dir(data_dir: str | Path | None, root: str | Path | None) -> Path:
    """The SentEval-layout folder of an evaluation command: ``--data-dir`` as given, else
    ``senteval`` under the data root.

    Raises:
        ConfigError: neither is given and no data root is set.
    """
    if data_dir is not None:
        return Path(data_dir)
    found = data_root(root)
    if found is None:
        raise ConfigError(f"no data folder: pass --data-dir DIR, or a data root holding senteval/ ({DATA_ROOT_HINT})")
    return found / "senteval"
