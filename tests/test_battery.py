"""Issue 35's battery of bad inputs: each case here was a traceback, a silent acceptance,
lost work or a misleading message before its fix, and is now one clear line (exit 2, or
1 for the machine's faults) or a documented handling. The table of what the user sees is
docs/bad_inputs.md ("Battery" rows name their test here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TinyRun, write_tiny_senteval

from simcse_kit.cli import main as cli_main
from simcse_kit.data.readers import read_rows, read_sentences
from simcse_kit.errors import DataError

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


# --------------------------------------------------------------------------- config values


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["--seed", "99999999999999999999"], ["train.seed", "2**32 - 1"]),
        (["--seed", "-1"], ["train.seed"]),
        (["--num-workers", "-3"], ["data.num_workers", ">= 0"]),
        (["--weight-decay", "-1"], ["train.weight_decay", ">= 0"]),
        (["--queue-size", "-5"], ["loss.queue_size", ">= 0"]),
        (["--grad-cache-chunk", "-1"], ["train.grad_cache_chunk", ">= 0"]),
        (["--batch-size", "10000000"], ["train.batch_size", "10000000", "larger than the training set", "64 example(s)"]),
        # Issue 48: -1 trained every weight, 1e9 died in the allocator, -16 was accepted and 1.5 was
        # blamed on model.lora_target_modules.
        (["--lora-r", "-1"], ["model.lora_r", "= -1", ">= 0"]),
        (["--lora-r", "1000000000"], ["model.lora_r", "1000000000", "at most 32, the width of the model"]),
        (["--lora-r", "4", "--lora-alpha", "-16"], ["model.lora_alpha", "= -16", "> 0"]),
        (["--lora-r", "4", "--lora-dropout", "1.5"], ["model.lora_dropout", "= 1.5", "in [0, 1)"]),
    ],
)
def test_out_of_range_settings_are_one_line_before_the_run_folder(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], overrides: list[str], needles: list[str]
) -> None:
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), *overrides], capsys, *needles)
    assert not (tiny_run.folder / "run").exists()


def test_a_batch_of_the_whole_training_set_is_warned_about_with_its_memory(
    tiny_run: TinyRun, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48: a batch exactly the size of the training set built one set-wide batch without a
    word. 64 sentences, unsup: 128 rows of 16 tokens through 2 layers of 32 units, 86 bytes each."""
    import logging

    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.loaders import ACTIVATION_BYTES
    from simcse_kit.training.wiring.run import build_run

    assert ACTIVATION_BYTES == 86
    expected = 128 * 16 * 32 * 2 * 86 / 1e9
    with caplog.at_level(logging.WARNING, logger="simcse_kit.training.wiring.run"):
        build_run(load_config(tiny_run.recipe("whole", batch_size=64)), evaluate=False)
    data = tiny_run.folder / "train.txt"
    want = f"train.batch_size 64 is the whole of train (64 examples in {data}): every step is one batch of all of it; "
    want += f"up to about {expected:.3g} GB"
    assert want in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="simcse_kit.training.wiring.run"):
        build_run(load_config(tiny_run.recipe("half", batch_size=32)), evaluate=False)
    assert "is the whole of" not in caplog.text


def test_a_yaml_key_that_is_a_list_and_nested_aliases_are_one_short_line(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tiny_run.recipe("run")
    text = recipe.read_text()
    bad = tiny_run.folder / "listkey.yaml"
    bad.write_text(text.replace("train:\n", "train:\n  ? [a, b]\n  : 3\n", 1))
    line_no = bad.read_text().splitlines().index("  ? [a, b]") + 1
    fails(["train", str(bad)], capsys, str(bad), f"line {line_no}: a key is a list")
    # 9 levels of 9 aliases: 387 million values; quoting or walking them never finishes.
    laughs = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tiny_run.folder / "laughs.yaml"
    bomb.write_text("\n".join(laughs) + "\n" + text.replace("train:\n", "train:\n  report_to: *l8\n", 1))
    line = fails(["train", str(bomb)], capsys, str(bomb), "aliases expand to", "at most 10,000")
    assert len(line) < len(str(bomb)) + 150, line  # short: the expanded value is never quoted


def test_output_dir_under_a_file_and_a_teacher_cache_that_is_a_file(
    tiny_run: TinyRun, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tiny_run.recipe("run")
    afile = tiny_run.folder / "afile"
    afile.write_text("x\n")
    fails(
        ["train", str(recipe), "--output-dir", str(afile / "sub")], capsys, "train.output_dir", f"is under {afile}, not a folder"
    )
    overrides = ["--teacher", str(tiny_model_dir), "--teacher-cache-dir", str(afile)]
    fails(["train", str(recipe), *overrides], capsys, "loss.teacher_cache_dir", "exists and is not a folder")
    assert not (tiny_run.folder / "run").exists()


# --------------------------------------------------------------------------- training data


@pytest.mark.parametrize(
    ("name", "data", "needles"),
    [
        ("utf16.txt", "a man plays\na dog runs\n".encode("utf-16-le"), ["utf16.txt, line 1: holds NUL characters", "UTF-16"]),
        ("mac.txt", b"a man plays\ra dog runs\ra cat sleeps\r", ["mac.txt: its lines end in a bare carriage return"]),
    ],
)
def test_utf16_without_bom_and_cr_only_line_ends_are_named(tmp_path: Path, name: str, data: bytes, needles: list[str]) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        read_sentences(path)
    for needle in needles:
        assert needle in str(info.value)


def test_a_repeated_csv_column_is_refused_naming_line_1(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("sent0,sent1,sent1\na b,c d,e f\ng h,i j,k l\n")
    with pytest.raises(DataError, match=r"dup\.csv, line 1: header .* repeats column\(s\) \['sent1'\]"):
        read_rows(path, ("sent0", "sent1"))


def test_a_401_digit_json_score_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    """Issue 48: float() of a JSON integer past float's range raised OverflowError."""
    path = tmp_path / "scored.jsonl"
    first = '{"sent0": "a b", "sent1": "c d", "score": 3}\n'
    path.write_text(first + '{"sent0": "e f", "sent1": "g h", "score": ' + "9" * 401 + "}\n")
    with pytest.raises(DataError, match=r"scored\.jsonl, line 2: score \(column 'score'\) is an integer of 401 digits"):
        read_rows(path, ("sent0", "sent1"), score_column="score")
    teacher = tmp_path / "teacher.jsonl"
    teacher.write_text('{"sent0": "a b", "sent1": "c d", "hard_neg": ["e f"], "scores": [1, -' + "1" * 401 + "]}\n")
    with pytest.raises(DataError, match=r"teacher\.jsonl, line 1: score \(column 'scores\[1\]'\) is an integer of 401 digits"):
        read_rows(teacher, ("sent0", "sent1"), hard_negatives=True, teacher_scores=True)


def test_zero_padded_hard_negative_columns_read_as_their_numbers(tmp_path: Path) -> None:
    """Issue 48: a header hard_neg_02 raised KeyError: 'hard_neg_2'. Zero-padded numbers are read
    as the numbers they are (docs/data.md), with their score columns; a number twice is refused."""
    path = tmp_path / "padded.csv"
    header = "sent0,sent1,hard_neg_02,hard_neg_01,score_pos,score_neg_01,score_neg_02"
    path.write_text(f"{header}\na b,c d,n2,n1,0.9,0.1,0.2\ne f,g h,m2,m1,0.8,0.3,0.4\n")
    row, _ = read_rows(path, ("sent0", "sent1"), hard_negatives=True, teacher_scores=True)
    assert row == {"sent0": "a b", "sent1": "c d", "hard_neg_1": "n1", "hard_neg_2": "n2", "scores": [0.9, 0.1, 0.2]}
    jsonl = tmp_path / "padded.jsonl"
    jsonl.write_text('{"sent0": "a b", "sent1": "c d", "hard_neg_01": "n1", "hard_neg_02": "n2"}\n' * 2)
    row, _ = read_rows(jsonl, ("sent0", "sent1"), hard_negatives=True)
    assert (row["hard_neg_1"], row["hard_neg_2"]) == ("n1", "n2")
    twice = tmp_path / "twice.csv"
    twice.write_text("sent0,sent1,hard_neg_1,hard_neg_2,hard_neg_02\na b,c d,n1,n2,n3\n")
    got = r"got \['hard_neg_1', 'hard_neg_02', 'hard_neg_2'\]"
    with pytest.raises(DataError, match=rf"twice\.csv, line 1: .* each number once and without gaps, {got}"):
        read_rows(twice, ("sent0", "sent1"), hard_negatives=True)


def test_an_empty_query_in_a_retrieval_folder_is_refused(tmp_path: Path) -> None:
    from simcse_kit.evaluation.beir import read_beir, write_beir

    folder = tmp_path / "task"
    write_beir(
        folder,
        {"d0": "a dog runs", "d1": "a cat sleeps"},
        {"q0": "dog", "q1": "   "},
        {"test": {"q0": {"d0": 1}, "q1": {"d1": 1}}},
    )
    with pytest.raises(DataError, match=r"queries\.jsonl, line 2: empty 'text' for _id 'q1'"):
        read_beir(folder)


# --------------------------------------------------------------------------- evaluate / mine outputs and counts


def test_outputs_that_are_folders_and_zero_batches_fail_before_the_model_loads(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\na man plays,a man plays guitar\na dog runs,the dog is running\n")
    model = ["--pooler", "cls"]
    evaluate = ["evaluate", str(tiny_model_dir), "--data-dir", str(senteval), *model]
    fails([*evaluate, "--json", str(tmp_path)], capsys, f"--json {tmp_path}: is a folder")
    fails([*evaluate, "--batch-size", "0"], capsys, "--batch-size 0: must be >= 1")
    mine = ["mine", str(pairs), "--model", str(tiny_model_dir), *model]
    fails([*mine[:2], str(tmp_path), *mine[2:]], capsys, f"{tmp_path}: is a folder")
    fails([*mine[:2], str(tmp_path / "m.csv"), *mine[2:], "--batch-size", "0"], capsys, "--batch-size 0")
    fails([*mine[:2], str(tmp_path / "m.csv"), *mine[2:], "--top-k", "0"], capsys, "--range-max 0: must be >= 1")
    before = pairs.read_bytes()
    fails([*mine[:2], str(pairs), *mine[2:]], capsys, "the output is the input file")
    assert pairs.read_bytes() == before


# --------------------------------------------------------------------------- model folders


def broken_model(tmp_path: Path, tiny_model_dir: Path, how: str) -> Path:
    """A copy of the tiny BERT broken one way (``how``)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / how
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    weights = folder / "model.safetensors"
    if how == "remote":  # an unknown model_type whose classes are the folder's own Python files
        config |= {"model_type": "mystery", "auto_map": {"AutoConfig": "configuration_mystery.MysteryConfig"}}
        ran = tmp_path / "RAN"
        (folder / "configuration_mystery.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
        (folder / "config.json").write_text(json.dumps(config))
    elif how == "list":
        (folder / "config.json").write_text("[1, 2]")
    elif how == "no-config":
        (folder / "config.json").unlink()
    elif how == "shape":
        (folder / "config.json").write_text(json.dumps(config | {"intermediate_size": config["intermediate_size"] + 4}))
    elif how == "nan":
        state = load_file(str(weights))
        save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}, str(weights))
    elif how == "pickle":  # weights torch's weights_only unpickler refuses (an object that is not a tensor)
        state = load_file(str(weights))
        weights.unlink()
        torch.save({**state, "extra": Path("x")}, folder / "pytorch_model.bin")
    elif how == "not-a-model":
        shutil.rmtree(folder)
        folder.mkdir()
        (folder / "notes.txt").write_text("hello\n")
    return folder


MODEL_FOLDER_CASES = [
    ("remote", ["config.json: model_type 'mystery' is not a transformers model", "refused", "model.trust_remote_code: true"]),
    ("list", ["config.json: corrupt model file: expected a JSON object, got list"]),
    ("no-config", ["not a model folder (no config.json"]),
    ("shape", ["the weights do not fit its config.json"]),
    ("nan", ["the weights hold NaN or infinite values", "embeddings.word_embeddings.weight"]),
    ("pickle", ["pytorch_model.bin: a pickle that torch refuses to load with weights_only"]),
]


@pytest.mark.parametrize(("how", "needles"), MODEL_FOLDER_CASES)
def test_broken_model_folders_are_one_line_in_train_and_evaluate(
    tmp_path: Path,
    tiny_run: TinyRun,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    needles: list[str],
) -> None:
    def no_question(prompt: str = "") -> str:  # transformers asks y/N on stdin for custom code it was not told about
        raise AssertionError(f"asked on stdin: {prompt[:80]}")

    monkeypatch.setattr("builtins.input", no_question)
    (tmp_path / "models").mkdir()
    model = broken_model(tmp_path / "models", tiny_model_dir, how)
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), "--name-or-path", str(model)], capsys, str(model), *needles)
    assert not (tiny_run.folder / "run").exists()
    senteval = tiny_run.folder / "senteval"
    fails(["evaluate", str(model), "--data-dir", str(senteval), "--pooler", "cls"], capsys, str(model), *needles)
    assert not (tmp_path / "models" / "RAN").exists()  # the folder's own code never ran


def test_a_folder_that_is_not_a_model_says_so_for_mine_and_the_teacher(
    tmp_path: Path, tiny_run: TinyRun, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = broken_model(tmp_path, tiny_model_dir, "not-a-model")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\na man plays,a man plays guitar\na dog runs,the dog is running\n")
    # Was: "a plain transformers model records no pooler; pass --pooler".
    fails(["mine", str(pairs), str(tmp_path / "m.csv"), "--model", str(folder)], capsys, f"{folder}: not a model folder")
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), "--teacher", str(folder)], capsys, "loss.teacher", f"{folder}: not a model folder")


def test_trust_remote_code_is_a_recorded_switch_passed_to_the_check(tmp_path: Path, tiny_model_dir: Path) -> None:
    from simcse_kit.config.run import ModelConfig
    from simcse_kit.errors import ConfigError
    from simcse_kit.model.checks import check_weights

    folder = broken_model(tmp_path, tiny_model_dir, "remote")
    assert ModelConfig().trust_remote_code is False
    with pytest.raises(ConfigError, match="refused"):
        check_weights(folder)
    check_weights(folder, trust_remote_code=True)  # trusted: left to transformers
    check_weights(tiny_model_dir)  # a known model_type is never refused


# --------------------------------------------------------------------------- resume that is not what it says


def test_resume_refuses_edited_data_and_checkpoints_no_run_writes(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import json

    import torch

    from simcse_kit.training.engine.checkpoints import checkpoint_problem

    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=4, save_steps=2)  # 8 steps; checkpoints 4 and 6 kept
    out = tiny_run.folder / "run"
    assert cli_main(["train", str(recipe), "--final-eval", "false"]) == 0
    (out / "metrics.json").unlink()  # as if killed after step 6
    resume = ["train", str(recipe), "--final-eval", "false", "--resume"]

    # The training file edited in place (same size: one word for another of equal length).
    data = tiny_run.folder / "train.txt"
    original = data.read_text()
    data.write_text(original.replace("man", "dog", 1))
    assert data.stat().st_size == len(original.encode())
    fails(resume, capsys, f"--resume: {data} changed since the run started (same size, other content")
    data.write_text(original + "one more line\n")
    fails(resume, capsys, f"{data} changed since the run started ({len(original)} -> {len(original) + 14} bytes)")
    data.write_text(original)

    checkpoints = out / "checkpoints"
    step4, step6 = checkpoints / "step-4", checkpoints / "step-6"
    assert checkpoint_problem(step6) is None
    (step6 / "loop_state.json").write_text("[1, 2]")
    state = json.loads((step4 / "loop_state.json").read_text())
    (step4 / "loop_state.json").write_text(json.dumps(state | {"global_step": -5}))
    assert "expected a JSON object, got list" in str(checkpoint_problem(step6))
    assert "global_step = -5: must be a whole number >= 0" in str(checkpoint_problem(step4))
    (step4 / "loop_state.json").write_text(json.dumps(state | {"global_step": 6}))
    assert "global_step = 6 but the folder is step-4" in str(checkpoint_problem(step4))
    fails(resume, capsys, "--resume: no intact checkpoint", "got list", "but the folder is step-4")
    (step4 / "loop_state.json").write_text(json.dumps(state))

    # Random states replaced by another torch file: Accelerate would log INFO and go on with fresh RNG.
    torch.save({"something": torch.zeros(2)}, step4 / "random_states_0.pkl")
    assert "random_states_0.pkl: not a random-state file" in str(checkpoint_problem(step4))
    fails(resume, capsys, "--resume: no intact checkpoint", "random_states_0.pkl: not a random-state file")


def test_resume_checks_every_dataset_by_content_even_with_the_time_put_back(tiny_run: TinyRun) -> None:
    """Issue 48: a mixture's record held only the unused default data.train_file, and a digest
    remembered by path, size and modification time let an edit with its time restored pass."""
    import json
    import os

    import yaml

    from simcse_kit.config.run import load_config
    from simcse_kit.errors import ConfigError
    from simcse_kit.training.wiring.folder import DATA_FINGERPRINTS, prepare_run_dir

    recipe = tiny_run.recipe("mix")
    nli = tiny_run.folder / "nli.csv"
    nli.write_text("sent0,sent1,hard_neg\n" + "".join(f"a man {i},a man {i} .,a dog {i}\n" for i in range(300)))
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["datasets"] = {"wiki": {"file": "train.txt"}, "nli": {"file": "nli.csv", "mode": "hardneg"}}
    raw["data"]["train_file"] = str(tiny_run.folder / "unused.txt")
    recipe.write_text(yaml.safe_dump(raw))
    cfg = load_config(recipe)
    out = prepare_run_dir(cfg)
    recorded = json.loads((out / DATA_FINGERPRINTS).read_text())
    assert set(recorded) == {str(tiny_run.folder / "train.txt"), str(nli)}  # not the unused train_file
    original = nli.read_bytes()

    def resume() -> None:
        prepare_run_dir(load_config(recipe), resume=True)

    lines = original.decode().splitlines(keepends=True)
    nli.write_text("".join(lines[:151]))  # the header and 150 of its 300 rows
    with pytest.raises(ConfigError, match=rf"--resume: {nli} changed since the run started \({len(original)} -> "):
        resume()
    # One character for another, the modification time put back (touch -r): same size, same stat.
    nli.write_bytes(original)
    stamp = nli.stat()
    nli.write_bytes(original.replace(b"a man 150,", b"a man 151,", 1))
    os.utime(nli, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (nli.stat().st_size, nli.stat().st_mtime_ns) == (stamp.st_size, stamp.st_mtime_ns)
    with pytest.raises(ConfigError, match=rf"--resume: {nli} changed since the run started \(same size, other content"):
        resume()
    nli.write_bytes(original)
    resume()  # the same bytes again: resumes


def test_resume_with_a_record_from_before_every_dataset_was_fingerprinted_warns(
    tiny_run: TinyRun, caplog: pytest.LogCaptureFixture
) -> None:
    """An older record lists the unused data.train_file and none of the datasets: the unused file
    is not the run's (no 'is gone'), and each unrecorded dataset is named in a warning."""
    import json
    import logging

    import yaml

    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.folder import DATA_FINGERPRINTS, prepare_run_dir

    recipe = tiny_run.recipe("old")
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["datasets"] = {"wiki": {"file": "train.txt"}}
    recipe.write_text(yaml.safe_dump(raw))
    out = prepare_run_dir(load_config(recipe))
    (out / DATA_FINGERPRINTS).write_text(json.dumps({str(tiny_run.folder / "gone.txt"): {"bytes": 3, "sha256": "0"}}))
    with caplog.at_level(logging.WARNING):
        prepare_run_dir(load_config(recipe), resume=True)
    assert f"does not record {tiny_run.folder / 'train.txt'}; that file is not checked" in caplog.text


# --------------------------------------------------------------------------- a full disk in safetensors


def test_a_full_disk_while_writing_the_best_model_is_one_line_and_nothing_half_written(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def save_pretrained(self: PreTrainedModel, folder: str | Path, **kwargs: object) -> None:
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 4096)  # the part that fit
        # What safetensors' Rust writer raises when the disk fills.
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    model = saved_model(tiny_run.folder / "model", tiny_run.model_dir)  # before the disk fills
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_pretrained)
    recipe = tiny_run.recipe("run", save_steps=0)
    out = tiny_run.folder / "run"
    # The folder the user asked for, not the hidden temp folder it was built in (issue 48).
    fails(["train", str(recipe)], capsys, f"{out / 'best_model'}: no space left on device", "nothing half-written", rc=1)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".best_model")) == []
    assert not (out / "best_model").exists()
    # The export's folder likewise.
    export = tiny_run.folder / "st"
    fails(["export", str(model), str(export)], capsys, "no space left on device", rc=1)
    assert sorted(p.name for p in tiny_run.folder.iterdir() if p.name.startswith((".st", "st"))) == []


def test_config_records_output_dir_absolute(tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from simcse_kit.config.run import load_config, save_config

    monkeypatch.chdir(tiny_run.folder)
    recipe = tiny_run.recipe("run")
    cfg = load_config(recipe, {"output_dir": "runs/rel"})
    assert cfg.train.output_dir == str(tiny_run.folder / "runs" / "rel")  # read from the current folder
    save_config(cfg, tiny_run.folder / "saved.yaml")
    saved = yaml.safe_load((tiny_run.folder / "saved.yaml").read_text())
    assert saved["train"]["output_dir"] == str(tiny_run.folder / "runs" / "rel")


# --------------------------------------------------------------------------- export


def saved_model(folder: Path, tiny_model_dir: Path) -> Path:
    """A saved simcse-kit model (tiny BERT, cls pooler) with its tokenizer."""
    from transformers import AutoTokenizer, BertModel

    from simcse_kit.model.modeling import SimCSEModel

    model = SimCSEModel(BertModel.from_pretrained(tiny_model_dir), "cls", "none", 32)
    model.save(folder, AutoTokenizer.from_pretrained(tiny_model_dir), {"step": 0, "stsb_dev": 0.0})
    return folder


def test_export_options_that_would_fail_after_the_work_fail_first(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    model = saved_model(tmp_path / "model", tiny_model_dir)
    out = tmp_path / "st"
    # The dynamo exporter wrote opset 18 for --opset 5, and the record said 18: not what was asked.
    fails(["export", str(model), str(out), "--onnx", "--opset", "5"], capsys, "--opset 5: must be in [17, ")
    fails(["export", str(model), str(out), "--onnx", "--opset", "16"], capsys, "--opset 16: must be in [17, ")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fails(["export", str(model), str(out), "--push-to-hub", "me/model"], capsys, "--push-to-hub me/model: the hub is offline")
    assert not out.exists()


def test_export_overwrite_keeps_files_it_did_not_write_and_a_live_run_is_not_exported(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from simcse_kit.training.engine.guards import RunLock

    model = saved_model(tmp_path / "model", tiny_model_dir)
    out = tmp_path / "st"
    assert cli_main(["export", str(model), str(out)]) == 0
    recorded = json.loads((out / "simcse_export.json").read_text())["files"]
    assert "model.safetensors" in recorded and "simcse_export.json" in recorded
    assert cli_main(["export", str(model), str(out), "--overwrite"]) == 0  # its own files only: replaced
    (out / "notes.txt").write_text("my evaluation notes\n")
    fails(["export", str(model), str(out), "--overwrite"], capsys, f"{out}: --overwrite would delete notes.txt")
    assert (out / "notes.txt").read_text() == "my evaluation notes\n"

    run = tmp_path / "run"
    saved_model(run / "best_model", tiny_model_dir)
    (run / "config.yaml").write_text("train: {}\n")
    lock = RunLock(run).acquire()
    try:
        fails(["export", str(run), str(tmp_path / "st2")], capsys, "a training run is still writing into", "pid")
    finally:
        lock.release()
    assert not (tmp_path / "st2").exists()


# --------------------------------------------------------------------------- a stop during the final table


def test_sigterm_during_the_final_table_keeps_the_training_results_and_says_so(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import signal

    from simcse_kit.evaluation import STSEvaluator

    def scheduler_kills(self: STSEvaluator, encode: object) -> dict[str, float]:
        signal.raise_signal(signal.SIGTERM)  # the scheduler's SIGTERM, minutes into the 7-task table
        raise AssertionError("the signal did not stop the table")

    monkeypatch.setattr(STSEvaluator, "__call__", scheduler_kills)
    recipe = tiny_run.recipe("run", num_epochs=1, save_steps=0)
    out = tiny_run.folder / "run"
    assert cli_main(["train", str(recipe)]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "stopped by SIGTERM during the final STS table; training had finished" in err, err
    assert f"simcse-kit evaluate {out}" in err and "Traceback" not in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 8 and metrics["evals"] and "sts" not in metrics
    assert (out / "best_model").is_dir()
