"""Faults: broken model folders, two writers, divergence, clobbering, settings that would do
nothing, full or read-only disks, corrupt checkpoints, empty mining output, preemption and
misleading messages. Each numbered fault of issue 25 has its test here; the table of what
the user sees is the "Faults" section of docs/bad_inputs.md.

Full and read-only disks are simulated by patching the writer to raise the OSError the
kernel would (the tests run as root, which chmod does not stop).
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from conftest import TinyRun, write_tiny_senteval
from transformers import AutoTokenizer, BertModel

from simcse_kit.cli import main as cli_main
from simcse_kit.errors import ConfigError
from simcse_kit.modeling import SimCSEModel

# --------------------------------------------------------------------------- helpers


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str, rc: int = 2) -> str:
    """Run the CLI in-process; it must exit ``rc`` with one error line holding ``needles``
    and no traceback."""
    code = cli_main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == rc, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def simcse_folder(folder: Path, tiny_model_dir: Path) -> Path:
    """A saved simcse-kit model (tiny BERT, cls pooler) with its tokenizer."""
    model = SimCSEModel(BertModel.from_pretrained(tiny_model_dir), "cls", "none", 32)
    model.save(folder, AutoTokenizer.from_pretrained(tiny_model_dir), {"step": 0, "stsb_dev": 0.0})
    return folder


def truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:-keep])


# --------------------------------------------------------------------------- 1. model folders


def test_model_folder_without_tokenizer_or_with_truncated_weights_is_one_clear_error(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    broken = simcse_folder(tmp_path / "no-tokenizer", tiny_model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (broken / name).unlink(missing_ok=True)
    # transformers would build a 5-token vocabulary here and every word would be [UNK].
    fails(["evaluate", str(broken), "--data-dir", str(senteval)], capsys, str(broken), "no tokenizer files")
    fails(["export", str(broken), str(tmp_path / "exported")], capsys, "no tokenizer files")
    assert not (tmp_path / "exported").exists()

    # A truncated model.safetensors: the file is named, in evaluate and export alike.
    cut = simcse_folder(tmp_path / "truncated", tiny_model_dir)
    truncate(cut / "model.safetensors")
    fails(["evaluate", str(cut), "--data-dir", str(senteval)], capsys, str(cut / "model.safetensors"), "truncated")
    fails(["export", str(cut), str(tmp_path / "exported")], capsys, str(cut / "model.safetensors"))

    # A tokenizer of another model: more ids than the embedding table has rows.
    small = simcse_folder(tmp_path / "small-table", tiny_model_dir)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps(config | {"vocab_size": 20}))
    with pytest.raises(ConfigError, match="tokenizer has 53 tokens but the model's embedding table only 20"):
        from simcse_kit.model_checks import load_checked_tokenizer

        load_checked_tokenizer(small)


def test_export_checks_token_ids_against_an_independent_tokenizer_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    from simcse_kit.model_checks import tokenization_problem

    good = AutoTokenizer.from_pretrained(tiny_model_dir)
    probes = ["a man plays the guitar .", "two dogs run in the park"]
    assert tokenization_problem(good, AutoTokenizer.from_pretrained(tiny_model_dir), probes, 32) is None
    # The placeholder transformers builds without tokenizer files: 5 tokens, all words [UNK].
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (bare / name).unlink(missing_ok=True)
    placeholder = AutoTokenizer.from_pretrained(bare)
    assert len(placeholder) == 5
    assert "other ids" in tokenization_problem(good, placeholder, probes, 32)
    assert "lost its vocabulary" in tokenization_problem(placeholder, placeholder, probes, 32)


# --------------------------------------------------------------------------- 2. one writer per run folder


def test_a_second_run_into_a_locked_run_folder_fails_at_once_naming_the_holder(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from simcse_kit.guards import RunLock

    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=0, save_steps=0)
    out = tiny_run.folder / "run"
    with RunLock(out):  # run A, as another process would hold it (flock locks per open file)
        line = fails(["train", str(recipe), "--final-eval", "false"], capsys, str(out), "another run is writing")
        assert f"pid {os.getpid()} on " in line and "started" in line
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # run B changed nothing
    # Released with run A: the same command now trains, and releases the lock on its way out.
    assert cli_main(["train", str(recipe), "--final-eval", "false"]) == 0
    assert (out / "metrics.json").is_file()
    RunLock(out).acquire().release()
