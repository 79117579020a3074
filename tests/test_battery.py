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
from simcse_kit.data import read_rows, read_sentences
from simcse_kit.errors import DataError

# --------------------------------------------------------------------------- helpers


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str, rc: int = 2) -> str:
    """Run the CLI in-process; it must exit ``rc`` with one short error line holding
    ``needles`` and no traceback."""
    code = cli_main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == rc, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert len(lines[0]) < 400, lines[0]
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
    ],
)
def test_out_of_range_settings_are_one_line_before_the_run_folder(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], overrides: list[str], needles: list[str]
) -> None:
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), *overrides], capsys, *needles)
    assert not (tiny_run.folder / "run").exists()


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
    fails(["train", str(bomb)], capsys, str(bomb), "aliases expand to", "at most 10,000")


def test_output_dir_under_a_file_and_a_teacher_cache_that_is_a_file(
    tiny_run: TinyRun, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tiny_run.recipe("run")
    afile = tiny_run.folder / "afile"
    afile.write_text("x\n")
    fails(
        ["train", str(recipe), "--output-dir", str(afile / "sub")], capsys, "train.output_dir", f"under {afile}, which is a file"
    )
    overrides = ["--teacher", str(tiny_model_dir), "--teacher-cache-dir", str(afile)]
    fails(["train", str(recipe), *overrides], capsys, "loss.teacher_cache_dir", "is a file")
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
    before = pairs.read_bytes()
    fails([*mine[:2], str(pairs), *mine[2:]], capsys, "the output is the input file")
    assert pairs.read_bytes() == before
