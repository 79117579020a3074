"""Training files of any size: a memory-mapped Arrow cache, bad rows named or skipped."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import write_recipe
from torch.utils.data import RandomSampler

from simcse_kit.cli import main as cli_main
from simcse_kit.data import corpus, pipeline
from simcse_kit.data.readers import load_train_dataset, read_train_file, skipped_rows
from simcse_kit.errors import DataError

N_LINES = 200_000


def test_a_corpus_is_memory_mapped_not_held_in_python(tmp_path: Path) -> None:
    # 200k lines, 11 MB: the old reader (whole file -> lists -> Dataset.from_dict) peaked at
    # 65 MB of Python allocations; the stream holds one block of lines (about 1 MB of text).
    path = tmp_path / "big.txt"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(N_LINES):
            fh.write(f"sentence number {i} of a synthetic corpus, with a few more words\n" if i % 1000 else "\n")
    tracemalloc.start()
    try:
        dataset = load_train_dataset(str(path), "unsup", cache_dir=tmp_path / "cache")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB of Python allocations while loading"
    assert dataset.cache_files and Path(dataset.cache_files[0]["filename"]).parent == tmp_path / "cache" / corpus.SUBFOLDER
    assert len(dataset) == N_LINES - N_LINES // 1000  # blank lines skipped
    assert dataset[0]["sent0"] == "sentence number 1 of a synthetic corpus, with a few more words"
    assert dataset[-1]["sent0"] == f"sentence number {N_LINES - 1} of a synthetic corpus, with a few more words"


def test_a_second_read_is_the_cache_and_an_edit_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("sent0,sent1\na,b\nc,d\n", encoding="utf-8")
    first = read_train_file(path, "sup", cache_dir=tmp_path)
    again = read_train_file(path, "sup", cache_dir=tmp_path)
    assert not first.cache_hit and again.cache_hit and again.cache_file == first.cache_file
    assert again.dataset["sent1"] == ["b", "d"]
    # Same size and modification time, other bytes: the head hash tells them apart.
    stat = path.stat()
    path.write_text("sent0,sent1\nx,b\nc,d\n", encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited = read_train_file(path, "sup", cache_dir=tmp_path)
    assert not edited.cache_hit and edited.dataset["sent0"] == ["x", "c"]
    # Read as another mode, the same file is another cache.
    assert not read_train_file(path, "unsup", cache_dir=tmp_path).cache_hit


BAD_CSV = (
    b"sent0,sent1\n"
    b"a,b\n"
    b"c\n"  # line 3: 1 field
    b"d,  \n"  # line 4: empty value
    b"e\xff,f\n"  # line 5: not UTF-8
    b"x\ry,z\n"  # line 6: not valid CSV
    b"g,h\n"
    b"i,j,k\n"  # line 8: 3 fields
    b"l,m\n"
)
BAD_JSONL = (
    b'{"sent0": "a", "sent1": "b"}\n'
    b'{"sent0": \n'  # line 2: not JSON
    b'["a", "b"]\n'  # line 3: not an object
    b'{"sent0": "c", "sent1": 1}\n'  # line 4: not text
    b'{"sent0": "d", "sent1": "e"}\n'
)


@pytest.mark.parametrize(
    ("name", "content", "first_error", "kept", "skipped"),
    [
        ("bad.csv", BAD_CSV, "bad.csv, line 3: 1 fields, header has 2", ["a", "g", "l"], 5),
        ("bad.jsonl", BAD_JSONL, "bad.jsonl, line 2: not valid JSON", ["a", "d"], 3),
        ("bad.txt", b"one\n\xff two\nthree\n", "bad.txt, line 2: not valid UTF-8 (byte 0xff)", ["one", "three"], 1),
    ],
)
def test_bad_rows_are_named_or_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, content: bytes, first_error: str, kept: list[str], skipped: int
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    mode = "unsup" if name.endswith(".txt") else "sup"
    with pytest.raises(DataError, match=first_error.replace("(", r"\(").replace(")", r"\)")):
        load_train_dataset(str(path), mode, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.arrow")), "a refused file left a cache"
    with caplog.at_level(logging.WARNING):
        dataset = load_train_dataset(str(path), mode, bad_rows="skip", cache_dir=tmp_path / "cache")
    assert dataset["sent0"] == kept and skipped_rows(dataset) == skipped
    assert first_error in caplog.text and f"{skipped} bad row(s) skipped" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # from the cache: the same rows, the same report
        again = read_train_file(path, mode, bad_rows="skip", cache_dir=tmp_path / "cache")
    assert again.cache_hit and again.dataset["sent0"] == kept and first_error in caplog.text


def test_k_negatives_read_through_the_cache_and_a_short_row_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "mined.jsonl"
    rows = [{"sent0": f"a{i}", "sent1": f"p{i}", "hard_neg": [f"n{i}_1", f"n{i}_2"]} for i in range(3)]
    rows.insert(2, {"sent0": "s", "sent1": "t", "hard_neg": ["only one"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"mined.jsonl, line 3: 1 hard negative\(s\), the file's first row has 2"):
        load_train_dataset(str(path), "hardneg", cache_dir=tmp_path)
    dataset = load_train_dataset(str(path), "hardneg", bad_rows="skip", cache_dir=tmp_path)
    assert dataset.column_names == ["sent0", "sent1", "hard_neg_1", "hard_neg_2"]
    assert dataset["hard_neg_2"] == ["n0_2", "n1_2", "n2_2"] and skipped_rows(dataset) == 1


def test_skipping_leaves_too_few_rows_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_bytes(b"sent0,sent1\na,b\nc\n")
    with pytest.raises(DataError, match=r"p.csv: 1 usable row\(s\)"):
        load_train_dataset(str(path), "sup", bad_rows="skip", cache_dir=tmp_path)


def test_a_run_records_its_skipped_rows(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = write_recipe(tmp_path, tiny_model_dir, tmp_path / "run", num_epochs=1, eval_steps=8, save_steps=0)
    lines = (tmp_path / "train.txt").read_bytes().splitlines(keepends=True)
    data = tmp_path / "dirty.txt"
    data.write_bytes(b"".join(lines[:10]) + b"caf\xe9\n" + b"".join(lines[10:]) + b"\xff\xfe\n")
    rc = cli_main(["train", str(recipe), "--train-file", str(data)])
    assert rc == 2 and "dirty.txt, line 11: not valid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert cli_main(["train", str(recipe), "--train-file", str(data), "--bad-rows", "skip"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["skipped_rows"] == 2


def test_shuffled_indices_are_random_samplers_order_without_its_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "INDEX_CHUNK", 7)  # several chunks, one cut mid-way
    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(2):  # two epochs: the generator must move on exactly as RandomSampler's does
        assert list(pipeline.ShuffledIndices(range(100), generator=ours)) == list(RandomSampler(range(100), generator=theirs))
        assert torch.equal(ours.get_state(), theirs.get_state())
    monkeypatch.setattr(pipeline, "INDEX_CHUNK", 65_536)
    n = 1_000_000
    peaks = []
    for sampler in (pipeline.ShuffledIndices(range(n), generator=ours), RandomSampler(range(n), generator=theirs)):
        tracemalloc.start()
        try:
            first = next(iter(sampler))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert 0 <= first < n
    assert peaks[0] < 8 * 2**20 < peaks[1], peaks  # RandomSampler holds n Python ints (~36 MB here)


@pytest.mark.slow  # two spawned processes (~12 s CPU)
def test_processes_reading_at_once_build_one_cache(tmp_path: Path) -> None:
    # The processes of a run start together: one builds, the others wait for it and map its file.
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"sentence {i}\n" for i in range(100_000)), encoding="utf-8")
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(read_train_file, path, "unsup", "error", tmp_path / "cache") for _ in range(2)]
        results = [future.result() for future in futures]
    assert sorted(r.cache_hit for r in results) == [False, True]
    assert len({r.cache_file for r in results}) == 1 and len(list((tmp_path / "cache").rglob("*.arrow"))) == 1
    assert all(len(r.dataset) == 100_000 for r in results)


def test_a_cache_folder_that_cannot_be_written_is_named_before_the_run(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, tiny_model_dir, tmp_path / "run")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    assert cli_main(["train", str(recipe), "--cache-dir", str(blocker)]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"data.cache_dir {blocker}" in errors[0] and "cannot write" in errors[0], errors
    assert not (tmp_path / "run").exists()
