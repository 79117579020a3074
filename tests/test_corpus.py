"""Training files of any size: a memory-mapped Arrow cache, bad rows named or skipped."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import write_recipe
from torch.utils.data import RandomSampler
from transformers import AutoTokenizer

from simcse_kit.cli import main as cli_main
from simcse_kit.data import corpus, tokens
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
    # Few, large record batches: opening the file touches each one's header (and the pages around it).
    chunks = [len(chunk) for chunk in dataset.data.table.column("sent0").chunks]
    assert len(chunks) <= -(-len(dataset) // corpus.RECORD_ROWS) and min(chunks[:-1]) >= corpus.RECORD_ROWS, chunks


def test_a_second_read_is_the_cache_and_an_edit_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("sent0,sent1\na,b\nc,d\n", encoding="utf-8")
    first = read_train_file(path, "sup", cache_dir=tmp_path)
    again = read_train_file(path, "sup", cache_dir=tmp_path)
    assert not first.cache_hit and again.cache_hit and again.cache_files[0] == first.cache_files[0]
    assert again.dataset["sent1"] == ["b", "d"]
    # Same size and modification time, other bytes: the head hash tells them apart.
    stat = path.stat()
    path.write_text("sent0,sent1\nx,b\nc,d\n", encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited = read_train_file(path, "sup", cache_dir=tmp_path)
    assert not edited.cache_hit and edited.dataset["sent0"] == ["x", "c"]
    # Read as another mode, the same file is another cache.
    assert not read_train_file(path, "unsup", cache_dir=tmp_path).cache_hit


@pytest.mark.parametrize("damage", ["truncated arrow", "broken sidecar", "sidecar of another shape", "rows lost"])
def test_a_damaged_cache_is_named_once_and_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 48: a truncated .arrow (pyarrow OSError) or a broken sidecar (JSONDecodeError) was a
    traceback on every later run of the file. Now one warning names the cache and it is rebuilt."""
    import logging

    path = tmp_path / "pairs.csv"
    rows = [(f"a man {i}", f"a dog {i}") for i in range(300)]
    path.write_text("sent0,sent1\n" + "".join(f"{a},{b}\n" for a, b in rows), encoding="utf-8")
    first = read_train_file(path, "sup", cache_dir=tmp_path)
    arrow, sidecar = first.cache_files[0], first.cache_files[0].with_suffix(".json")
    if damage == "truncated arrow":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif damage == "broken sidecar":
        sidecar.write_text(sidecar.read_text()[:20])
    elif damage == "sidecar of another shape":
        sidecar.write_text("[1, 2]")
    else:  # a valid Arrow stream of the first rows only: the sidecar's row count tells
        sidecar.write_text(sidecar.read_text().replace('"rows": 300', '"rows": 301'))
    with caplog.at_level(logging.WARNING, logger="simcse_kit.data.corpus"):
        again = read_train_file(path, "sup", cache_dir=tmp_path)
    damaged = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(damaged) == 1 and f"the training data's cache {arrow} is damaged" in damaged[0], caplog.text
    assert f"rebuilding it from {path}" in damaged[0]
    assert not again.cache_hit and again.cache_files[0] == arrow
    assert list(zip(again.dataset["sent0"], again.dataset["sent1"], strict=True)) == rows and again.report.rows == 300
    caplog.clear()
    assert read_train_file(path, "sup", cache_dir=tmp_path).cache_hit and not caplog.records  # whole again


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


def test_skipped_rows_are_counted_once_beside_a_token_table_of_several_shards(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two map processes write two shards; the text table beside them is then cut into two
    # blocks, each naming the text cache: its sidecar's count was read once per block.
    monkeypatch.setattr(tokens, "map_processes", lambda rows, share=1: 2)
    data = tmp_path / "dirty.txt"
    data.write_bytes(b"".join(b"sentence number %d of a few words\n" % i for i in range(200)) + b"\xff\xfe\n")
    tokenization = tokens.Tokenization(AutoTokenizer.from_pretrained(tiny_model_dir), 16)
    ds = load_train_dataset(str(data), "unsup", bad_rows="skip", cache_dir=tmp_path / "cache", tokens=tokenization)
    shards = {Path(f["filename"]).name for f in ds.cache_files if ".tokens-" in f["filename"]}
    assert len(ds) == 200 and len(shards) == 2
    assert skipped_rows(ds) == 1


def test_one_datasets_batches_are_random_samplers_order_without_its_list() -> None:
    """The run's batch sampler over one dataset gives ``RandomSampler``'s order cut into
    batches and moves the generator exactly as it does, epoch after epoch, without its Python
    list of every index (about 36 bytes an example, per process and epoch)."""
    from simcse_kit.data.mixture import MixtureBatches

    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(2):  # two epochs: the generator must move on exactly as RandomSampler's does
        order = list(RandomSampler(range(100), generator=theirs))
        assert list(MixtureBatches([100], 8, 1, "proportional", ours)) == [order[i : i + 8] for i in range(0, 96, 8)]
        assert torch.equal(ours.get_state(), theirs.get_state())
    n = 1_000_000
    peaks = []
    for sampler in (MixtureBatches([n], 64, 1, "proportional", ours), RandomSampler(range(n), generator=theirs)):
        tracemalloc.start()
        try:
            first = next(iter(sampler))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert first
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
    assert len({r.cache_files for r in results}) == 1 and len(list((tmp_path / "cache").rglob("*.arrow"))) == 1
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


SHARE_SENTENCES = 48  # 6 global batches of 8 an epoch: 3 per process
SHARE_EPOCHS = 2


def _train_and_record(rank: int, recipe: str, folder: str, port: int) -> None:
    """One process of a 2-process CPU run (Accelerate reads the launcher's variables): ``fit``
    on the kit's own run, every batch's sentences recorded as its collator gets them."""
    os.environ |= {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    torch.set_num_threads(1)
    from simcse_kit.config.run import load_config
    from simcse_kit.training.engine.loop import fit
    from simcse_kit.training.wiring.run import build_run

    seen: list[list[str]] = []

    def record(collate: Callable[[list[dict[str, str]]], object]) -> Callable[[list[dict[str, str]]], object]:
        return lambda features: (seen.append([f["sent0"] for f in features]), collate(features))[1]

    cfg = load_config(Path(recipe), {"train_file": f"{folder}/corpus.txt", "cache_dir": f"{folder}/cache", "save_steps": "0"})
    run = build_run(cfg, evaluate=False, cpu=True, wrap_collate=record)
    assert run.accelerator.num_processes == 2
    fit(run, run.step, run.cfg.train)
    (Path(folder) / f"seen-{rank}.json").write_text(json.dumps(seen), encoding="utf-8")
    # Out without tearing down: the DDP reducer's gloo group joins a worker thread in its
    # destructor, which can wait forever on the peer that has already left (seen in CI).
    # What the test reads is on disk; mp.spawn sees exit status 0.
    os._exit(0)


def test_two_processes_see_every_example_once_an_epoch(tmp_path: Path, tiny_model_dir: Path) -> None:
    # The loader each process builds (the same seeded order, Accelerate's share of each batch)
    # over the memory-mapped corpus: the two shares of an epoch are the corpus, once, and
    # the next epoch is another order of it.
    sentences = [f"sentence number {i} of the corpus" for i in range(SHARE_SENTENCES)]
    (tmp_path / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Written once, before the processes start: written by each, one could read the other's half-written
    # recipe (seen in CI: a process ran with the default batch of 64, not the recipe's 8).
    recipe = write_recipe(tmp_path, tiny_model_dir, tmp_path / "run", num_epochs=SHARE_EPOCHS, eval_steps=0)
    mp.spawn(_train_and_record, args=(str(recipe), str(tmp_path), port), nprocs=2, join=True)
    seen = [json.loads((tmp_path / f"seen-{rank}.json").read_text(encoding="utf-8")) for rank in (0, 1)]
    per_epoch = SHARE_SENTENCES // 8
    assert [len(batches) for batches in seen] == [per_epoch * SHARE_EPOCHS] * 2
    assert all(len(batch) == 4 for batches in seen for batch in batches)  # the global batch of 8, halved
    orders = []
    for epoch in range(SHARE_EPOCHS):
        shares = [[s for batch in batches[epoch * per_epoch : (epoch + 1) * per_epoch] for s in batch] for batches in seen]
        assert sorted(shares[0] + shares[1]) == sorted(sentences), f"epoch {epoch}: not every example exactly once"
        orders.append(shares)
    assert orders[0] != orders[1]  # reshuffled each epoch


def test_a_training_files_digest_is_of_its_content_whatever_its_stat_says(tmp_path: Path) -> None:
    """--resume's data check hashes the whole content every time: an edit keeping the size with
    the modification time put back (``touch -r``) gives another digest (issue 48)."""
    import hashlib

    from simcse_kit.training.wiring.folder import file_sha256

    data = tmp_path / "train.txt"
    data.write_bytes(b"a man\nb\n")
    assert file_sha256(data) == hashlib.sha256(b"a man\nb\n").hexdigest()
    stamp = data.stat()
    data.write_bytes(b"a dog\nb\n")  # same size
    os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert file_sha256(data) == hashlib.sha256(b"a dog\nb\n").hexdigest()
    big = tmp_path / "big.txt"  # more than one 1 MiB block
    big.write_bytes(b"x" * (3 << 20) + b"tail")
    assert file_sha256(big) == hashlib.sha256(b"x" * (3 << 20) + b"tail").hexdigest()
