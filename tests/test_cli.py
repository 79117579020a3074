"""The console script end to end on a tiny model: run folder, metrics, evaluate JSON, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import toy_sentences

from simcse_kit.cli import main, parse_overrides
from simcse_kit.errors import ConfigError


def recipe(tmp_path: Path, model_dir: Path, data_dir: Path, mode: str = "unsup") -> Path:
    train_file = tmp_path / "train.txt"
    train_file.write_text("\n".join(toy_sentences(40)) + "\n", encoding="utf-8")
    cfg = {
        "model": {"name_or_path": str(model_dir), "pooler": "cls", "mlp": "train", "max_seq_len": 16, "eval_max_seq_len": 32},
        "data": {"mode": mode, "train_file": str(train_file), "eval_data_dir": str(data_dir / "senteval")},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "batch_size": 8,
            "max_steps": 4,
            "eval_steps": 2,
            "progress_bar": False,
            "mixed_precision": "no",
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_train_then_evaluate(tmp_path: Path, tiny_model_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = recipe(tmp_path, tiny_model_dir, data_dir)
    assert main(["train", str(path), "--seed", "7", "--learning-rate", "1e-4"]) == 0
    run = tmp_path / "run"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["seed"] == 7 and saved["train"]["learning_rate"] == 1e-4  # overrides recorded
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 4
    assert [e["step"] for e in metrics["evals"]] == [0.0, 2.0, 4.0]  # step 0: the untouched model
    assert metrics["best_dev_score"] == max(e["stsb_dev"] for e in metrics["evals"])
    assert metrics["examples_per_second"] > 0 and metrics["train_seconds"] > 0
    assert set(metrics["sts"]) >= {"STS12", "STS16", "STSBenchmark", "SICKRelatedness", "avg"}
    meta = json.loads((run / "best_model" / "simcse_config.json").read_text())
    assert meta["pooler"] == "cls" and meta["mlp"] == "train" and meta["mlp_at_inference"] is False
    assert meta["step"] == metrics["best_step"]
    out = capsys.readouterr().out
    assert "STS-B" in out and "Avg." in out

    # evaluate the run folder: same numbers as the run's own final table.
    assert main(["evaluate", str(run), "--data-dir", str(data_dir / "senteval"), "--json", str(tmp_path / "e.json")]) == 0
    again = json.loads((tmp_path / "e.json").read_text())
    for key in ("STS12", "STSBenchmark", "SICKRelatedness", "avg"):
        assert again[key] == pytest.approx(metrics["sts"][key], abs=1e-6)

    # A finished run is not overwritten by accident.
    assert main(["train", str(path)]) == 2
    assert "already holds a finished run" in capsys.readouterr().err


def test_errors_name_the_file_and_line(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = recipe(tmp_path, tiny_model_dir, data_dir)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a good line\nanother\nbad \xff byte\n")
    assert main(["train", str(path), "--train-file", str(bad)]) == 2
    assert f"{bad}, line 3: not valid UTF-8" in capsys.readouterr().err

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(["train", str(path), "--train-file", str(empty)]) == 2
    assert "no sentences" in capsys.readouterr().err

    csv = tmp_path / "pairs.csv"
    csv.write_text("sent0,sent1\na,b\nc,d\n")
    assert main(["train", str(path), "--train-file", str(csv), "--mode", "hardneg"]) == 2
    wanted = f"{csv}, line 1: header ['sent0', 'sent1'] lacks column(s) ['hard_neg (or hard_neg_1 .. hard_neg_k)']"
    assert wanted in capsys.readouterr().err

    assert main(["train", str(path), "--pooler", "max"]) == 2
    assert "model.pooler" in capsys.readouterr().err
    assert main(["train", str(path), "--batch-sise", "8"]) == 2
    assert "unknown option --batch-sise" in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "a failed start must not create the run folder"


def test_parse_overrides() -> None:
    """The command line's ``--key value`` pairs; what load_config does with them is in test_config.py."""
    assert parse_overrides(["--seed", "3", "--model.pooler=avg"]) == {"seed": "3", "model.pooler": "avg"}
    with pytest.raises(ConfigError, match="needs a value"):
        parse_overrides(["--seed"])


# --------------------------------------------------------------------------- rough edges a new user hit


def test_output_dir_that_is_a_file_is_a_clear_error(
    tmp_path: Path, tiny_model_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = recipe(tmp_path, tiny_model_dir, data_dir)
    (tmp_path / "taken").write_text("a file, not a folder")
    assert main(["train", str(path), "--output-dir", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "train.output_dir" in err and "exists and is not a folder" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "a file, not a folder"


def test_train_help_lists_every_config_key(capsys: pytest.CaptureFixture[str]) -> None:
    from simcse_kit.config.run import key_help

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for dotted, kind, default, meaning in key_help():
        flag = "--" + dotted.split(".")[1].replace("_", "-")
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [flag]), None)
        assert line is not None, flag
        assert kind in line and repr(default) in line, line
        assert meaning, f"{dotted} has no comment in config.py to explain it"
    assert "--mixed-precision" in out and "'auto'" in out


def test_progress_bar_shows_small_losses() -> None:
    from simcse_kit.training.engine.loop import loss_text

    assert loss_text(1.234e-4) == "0.000123"  # four fixed decimals showed 0.0001 / 0.0000
    assert loss_text(3.2e-6) == "3.2e-06"
    assert loss_text(2.71828) == "2.72"


def test_paper_recipes_use_the_paper_loss() -> None:
    from simcse_kit.config.run import load_config

    repo = Path(__file__).resolve().parents[1]
    for name in ("unsup_bert_base.yaml", "unsup_bert_large.yaml"):
        assert load_config(repo / "train" / "paper" / name).loss.unsup_loss == "paper", name


def test_the_cli_log_leaves_out_faiss_trying_its_simd_builds() -> None:
    """faiss logs each SIMD build it tries on import at INFO ("Could not load library with AVX2 support due to:
    ModuleNotFoundError" where the wheel ships one dispatching library): under the CLI's log, which `mine` and
    `evaluate --precision` import faiss into, none of it shows; under a plain INFO log it does."""
    import subprocess
    import sys

    plain = "import logging; logging.basicConfig(level=logging.INFO); import faiss"
    ours = "from simcse_kit.cli import configure_logging; configure_logging(False); import faiss, logging"
    ours += "; logging.getLogger('simcse_kit').info('still logging')"
    logs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr for code in (plain, ours)
    ]
    assert "faiss.loader" in logs[0]
    assert "faiss.loader" not in logs[1] and "INFO simcse_kit: still logging" in logs[1]
