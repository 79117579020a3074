"""Recipes that work from any folder and ship with the package (issue 13): paths in a recipe
read from its folder, the data root (``--data-root`` > ``SIMCSE_KIT_DATA`` > the recipe's >
the checkout default), built-in recipes by name, and a wheel that carries them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, toy_sentences, write_tiny_senteval

from simcse_kit.cli import main
from simcse_kit.config.recipes import DATA_ENV, builtin_recipes, describe, find_recipe
from simcse_kit.config.run import load_config
from simcse_kit.errors import ConfigError

CHECKOUT_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def no_data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the data root itself: a user's SIMCSE_KIT_DATA must not leak in."""
    monkeypatch.delenv(DATA_ENV, raising=False)


def write(path: Path, recipe: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def test_train_from_another_folder_with_relative_paths_in_the_recipe(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``simcse-kit train /ABS/recipes/tiny.yaml`` from an unrelated folder: the model and the
    data are found beside the recipe, the run folder lands where the user is, and the saved
    config holds absolute paths."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.txt").write_text("\n".join(toy_sentences(16)) + "\n", encoding="utf-8")
    write_tiny_senteval(project / "data" / "senteval", pairs=6)
    model = os.path.relpath(tiny_model_dir, project / "recipes")  # e.g. ../../../tiny-bert0
    recipe = write(
        project / "recipes" / "tiny.yaml",
        {
            "model": {"name_or_path": model, "pooler": "cls", "mlp": "train", "max_seq_len": 16, "eval_max_seq_len": 32},
            "data": {"mode": "unsup", "train_file": "../data/train.txt", "eval_data_dir": "../data/senteval"},
            "train": {"output_dir": "runs/tiny", "batch_size": 8, "max_steps": 2, "eval_steps": 0, "eval_at_start": False}
            | {"progress_bar": False, "mixed_precision": "no"},
        },
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["train", str(recipe)]) == 0
    run = elsewhere / "runs" / "tiny"  # train.output_dir stays relative to the current folder
    assert json.loads((run / "metrics.json").read_text())["steps"] == 2
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["train_file"] == str(project / "data" / "train.txt")
    assert saved["data"]["eval_data_dir"] == str(project / "data" / "senteval")
    assert saved["model"]["name_or_path"] == str(tiny_model_dir)
    assert saved["data"]["data_root"] is None  # no {data_root} in this recipe: none needed


def test_data_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--data-root > SIMCSE_KIT_DATA > the recipe's data_root (read from its folder) > the
    checkout default; --train-file on the command line stays relative to the current folder."""
    recipe = write(
        tmp_path / "recipes" / "r.yaml",
        {"data": {"train_file": "{data_root}/train/x.txt", "eval_data_dir": "{data_root}/senteval", "data_root": "../d"}},
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert load_config(recipe).data.train_file == str(tmp_path / "d" / "train" / "x.txt")
    monkeypatch.setenv(DATA_ENV, "env-root")
    cfg = load_config(recipe)
    assert (cfg.data.data_root, cfg.data.eval_data_dir) == (str(cwd / "env-root"), str(cwd / "env-root" / "senteval"))
    cfg = load_config(recipe, {"data-root": "/cli/root", "train-file": "mine.txt"})
    assert (cfg.data.data_root, cfg.data.eval_data_dir) == ("/cli/root", "/cli/root/senteval")
    assert cfg.data.train_file == str(cwd / "mine.txt")
    monkeypatch.delenv(DATA_ENV)
    # No root anywhere: the repo default, ../shared/data beside the checkout.
    assert load_config(None).data.train_file == str(CHECKOUT_DATA / "train" / "wiki1m_head.txt")
    assert load_config(None, {"train_file": "hub:someone/set"}).data.train_file == "hub:someone/set"


def test_repo_recipes_resolve_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's ``simcse-kit train train/unsup.yaml`` from the repo root, an absolute path
    from elsewhere and the built-in name ``unsup`` all read the same data."""
    expected = str(CHECKOUT_DATA / "train" / "wiki1m_head.txt")
    monkeypatch.chdir(REPO)
    assert load_config(find_recipe("train/unsup.yaml")).data.train_file == expected
    monkeypatch.chdir(tmp_path)
    assert find_recipe("unsup") == REPO / "train" / "unsup.yaml"
    assert find_recipe("paper/unsup_bert_base") == REPO / "train" / "paper" / "unsup_bert_base.yaml"
    for name in ("unsup", str(REPO / "train" / "unsup.yaml")):
        cfg = load_config(find_recipe(name)).check_data()
        assert cfg.data.train_file == expected and cfg.data.eval_data_dir == str(CHECKOUT_DATA / "senteval")
    assert find_recipe("nope.yaml") == Path("nope.yaml")  # a file name: reading it says "not found"
    with pytest.raises(ConfigError, match=r"'nope': no such file and no built-in recipe .*'unsup'"):
        find_recipe("nope")


def test_missing_data_names_the_key_the_path_and_the_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "unsup", "--data-root", "empty"]) == 2
    err = capsys.readouterr().err
    assert f"config key 'data.train_file': {tmp_path}/empty/train/wiki1m_head.txt: file not found" in err
    assert f"the data root is {tmp_path}/empty: set it with --data-root DIR or the {DATA_ENV} environment variable" in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match=r"'data.train_file' = '\{data_root\}/x.txt' needs a data root, and none is set"):
        from simcse_kit.config import run as config

        monkeypatch.setattr(config, "default_data_root", lambda: None)  # as in an installed wheel
        load_config(None, {"train_file": "{data_root}/x.txt"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  train_file: {data_root}/x.txt\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"(?s)not valid YAML: .* \(quote values that start with \{data_root\}"):
        load_config(bad)


def test_evaluate_finds_its_data_under_the_data_root(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tiny_senteval(tmp_path / "root" / "senteval", pairs=6)
    monkeypatch.chdir(tmp_path)
    base = ["evaluate", str(tiny_model_dir), "--pooler", "avg", "--tasks", "STSBenchmark"]
    assert main([*base, "--data-root", "root", "--json", "a.json"]) == 0
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "root"))
    assert main([*base, "--suite", "sts", "--json", "b.json"]) == 0  # a built-in suite by name
    first, second = (json.loads((tmp_path / f).read_text())["STSBenchmark"] for f in ("a.json", "b.json"))
    assert first == second
    capsys.readouterr()
    assert main(["align-uniform", str(tiny_model_dir), "--pooler", "avg", "--data-root", "nowhere"]) == 2
    assert f"{tmp_path}/nowhere/senteval/STS/STSBenchmark/sts-dev.csv: file not found" in capsys.readouterr().err


def test_recipes_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    on_disk = sorted(p.relative_to(REPO / "train").with_suffix("").as_posix() for p in (REPO / "train").rglob("*.yaml"))
    assert list(builtin_recipes()) == on_disk
    for name in on_disk:
        assert f"  {name} " in out
    assert "unsup                   Unsupervised SimCSE on the default model (all-MiniLM-L6-v2)" in out
    assert describe(REPO / "evaluate" / "sts.yaml") in out
    assert main(["recipes", "show", "unsup"]) == 0
    assert capsys.readouterr().out == (REPO / "train" / "unsup.yaml").read_text(encoding="utf-8")
    assert main(["recipes", "show", "sts"]) == 0
    assert capsys.readouterr().out == (REPO / "evaluate" / "sts.yaml").read_text(encoding="utf-8")
    assert main(["recipes", "show", "nope"]) == 2
    assert "'nope': no such file and no built-in recipe" in capsys.readouterr().err


WHEEL_CHECK = """
import io, json, sys, contextlib
import simcse_kit
from simcse_kit.cli import main
from simcse_kit.config.run import load_config
from simcse_kit.config.recipes import find_recipe
from simcse_kit.evaluation.suite import MAIN_TASKS, suite_file
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["recipes"])
cfg = load_config(find_recipe("paper/unsup_bert_base"), {"data_root": "/data"})
try:
    load_config(find_recipe("unsup"))
    no_root = ""
except Exception as exc:
    no_root = str(exc)
print(json.dumps({"package": simcse_kit.__file__, "rc": rc, "listing": out.getvalue(), "recipe": str(find_recipe("unsup")),
                  "train_file": cfg.data.train_file, "no_root": no_root, "suite": str(suite_file()), "tasks": MAIN_TASKS}))
"""


@pytest.mark.slow  # pip builds a wheel and installs it, two interpreters (~8 s CPU)
def test_wheel_ships_the_recipes(tmp_path: Path) -> None:
    """A wheel built from the repo holds every module and recipe; installed on its own (pip
    --target, outside the checkout) it lists the recipes and resolves one by name."""
    src = tmp_path / "src"  # build from a copy: a build in the checkout would write build/ there
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("simcse_kit", "train", "evaluate"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")], check=True)
    (wheel,) = (tmp_path / "dist").glob("simcse_kit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "simcse_kit").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules <= names, sorted(modules - names)  # every subpackage made it (the list in pyproject.toml)
    recipes = {f"simcse_kit/recipe_files/{p.relative_to(REPO / 'train').as_posix()}" for p in (REPO / "train").rglob("*.yaml")}
    assert recipes | {"simcse_kit/suite_files/sts.yaml", "simcse_kit/export/model_card.md"} <= names

    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != DATA_ENV} | {"PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", WHEEL_CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["package"] == str(site / "simcse_kit" / "__init__.py")  # not the checkout's editable install
    assert got["rc"] == 0 and "  unsup " in got["listing"] and "paper/unsup_bert_base" in got["listing"]
    assert got["recipe"] == str(site / "simcse_kit" / "recipe_files" / "unsup.yaml")
    assert got["train_file"] == "/data/train/wiki1m_for_simcse.txt"
    # The STS suite's one home is the shipped file, read from the wheel's copy of evaluate/.
    assert got["suite"] == str(site / "simcse_kit" / "suite_files" / "sts.yaml")
    assert got["tasks"] == ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    # Installed, there is no checkout beside the package, so no default data root: say how to set one.
    assert "needs a data root, and none is set: set it with --data-root DIR or the SIMCSE_KIT_DATA" in got["no_root"]
