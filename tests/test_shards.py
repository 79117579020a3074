"""Sharded and compressed training data (issue 50): a dataset's file may be a glob, a folder
or a list of shards, in text, CSV, TSV, JSONL or Parquet, text formats gzip- or zstd-compressed;
the shards are read in sorted order as one dataset, errors name the shard and its row, and
``--resume`` refuses a run whose shards changed."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TinyRun, toy_sentences

from simcse_kit.cli import main as cli_main
from simcse_kit.data import corpus as corpus_module
from simcse_kit.data import readers
from simcse_kit.data.corpus import BadRows, Corpus, Report, each_shard
from simcse_kit.data.readers import byte_ranges, read_rows, read_train_file, sentence_batches
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.files import shard_paths

N = 40  # examples: 5 batches of 8
REPORT = Report(rows=0, skipped=0, shown=[], duplicates=0, columns=[], seconds=0.0)


def pair_rows(n: int = N) -> list[dict[str, str]]:
    sents = toy_sentences(2 * n)
    return [{"sent0": sents[i], "sent1": sents[i + n]} for i in range(n)]


def jsonl_bytes(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")


def text_bytes(rows: list[dict[str, str]]) -> bytes:
    return "".join(row["sent0"] + "\n" for row in rows).encode("utf-8")


def csv_bytes(rows: list[dict[str, str]], delimiter: str = ",") -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), delimiter=delimiter, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def zstd(data: bytes, path: Path) -> None:
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        out.write(data)


def parquet(rows: list[dict[str, str]], path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def chunks(rows: list[dict[str, str]], n: int) -> list[list[dict[str, str]]]:
    size = -(-len(rows) // n)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def write_form(form: str, d: Path, rows: list[dict[str, str]]) -> str:
    """``rows`` written under folder ``d`` in ``form``; what ``data.train_file`` names them by."""
    if form == "parquet":
        parquet(rows, d / "train.parquet")
        return str(d / "train.parquet")
    if form == "arrow":  # an Arrow IPC file (Feather v2)
        pa.feather.write_feather(pa.Table.from_pylist(rows), d / "train.arrow")
        return str(d / "train.arrow")
    if form == "save_to_disk folder":  # datasets' data-*.arrow streams beside its two JSON files
        datasets.Dataset.from_list(rows).save_to_disk(str(d / "saved"), num_shards=4)
        return str(d / "saved")
    if form in ("jsonl.gz", "jsonl.zst", "txt.gz", "txt.zst"):
        data = jsonl_bytes(rows) if form.startswith("jsonl") else text_bytes(rows)
        path = d / f"train.{form}"
        if form.endswith(".gz"):
            path.write_bytes(gzip.compress(data))
        else:
            zstd(data, path)
        return str(path)
    if form == "tsv":
        (d / "train.tsv").write_bytes(csv_bytes(rows, "\t"))
        return str(d / "train.tsv")
    if form == "folder of parquet":
        # Written out of order, named so that their sorted order is the rows'; beside them the
        # marker a Spark job leaves.
        for i, part in reversed(list(enumerate(chunks(rows, 4)))):
            parquet(part, d / f"train-{i:05d}-of-00004.parquet")
        (d / "_SUCCESS").write_text("")
        return str(d)
    if form == "folder of txt":
        for i, part in enumerate(chunks(rows, 5)):
            (d / f"wiki-{i:02d}.txt").write_bytes(text_bytes(part))
        return str(d)
    assert form == "glob of csv.gz", form
    for i, part in enumerate(chunks(rows, 3)):
        (d / f"part-{i}.csv.gz").write_bytes(gzip.compress(csv_bytes(part)))
    (d / "notes.md").write_text("not a shard")
    return str(d / "part-*.csv.gz")


FORMS = ["parquet", "jsonl.gz", "jsonl.zst", "tsv", "folder of parquet", "glob of csv.gz", "arrow", "save_to_disk folder"]
TEXT_FORMS = ["txt.gz", "txt.zst", "folder of txt", "parquet", "save_to_disk folder"]


def batches(tiny_run: TinyRun, train_file: str, mode: str) -> list[dict[str, list]]:
    """One epoch of the run's loader over ``train_file``: each step's tensors as lists."""
    from simcse_kit.training.wiring.inputs import load_checked_tokenizer, load_training_sets
    from simcse_kit.training.wiring.loaders import make_loader

    cfg = tiny_run.config("shards", train_file=train_file, mode=mode, cache_dir=tiny_run.folder / "cache")
    tokenizer = load_checked_tokenizer(cfg)
    loader = make_loader(cfg, load_training_sets(cfg, tokenizer), tokenizer, 1)
    steps = [{k: v.tolist() for k, v in batch.items() if isinstance(v, torch.Tensor)} for batch in loader]
    assert len(steps) == N // 8 and all(steps)
    return steps


@pytest.mark.parametrize(("mode", "form"), [("sup", form) for form in FORMS] + [("unsup", form) for form in TEXT_FORMS])
def test_compressed_parquet_and_sharded_data_train_to_the_batches_of_one_plain_file(
    tiny_run: TinyRun, mode: str, form: str
) -> None:
    rows = pair_rows() if mode == "sup" else [{"sent0": s} for s in toy_sentences(N)]
    plain = tiny_run.folder / ("plain.jsonl" if mode == "sup" else "plain.txt")
    plain.write_bytes(jsonl_bytes(rows) if mode == "sup" else text_bytes(rows))
    folder = tiny_run.folder / "data"
    folder.mkdir()
    source = write_form(form, folder, rows)
    assert batches(tiny_run, source, mode) == batches(tiny_run, str(plain), mode)


def test_a_save_to_disk_folder_names_its_shard_and_row_and_a_dataset_dict_its_splits(tmp_path: Path) -> None:
    rows = pair_rows(30)
    rows[17]["sent1"] = " "  # the 8th row of the second of 3 shards
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    with pytest.raises(DataError, match=r"saved/data-00001-of-00003\.arrow, row 8: empty value in column 'sent1'"):
        read_train_file(tmp_path / "saved", "sup", cache_dir=tmp_path / "cache")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "dict")
    )
    with pytest.raises(DataError, match=r"dict: a DatasetDict saved by datasets' save_to_disk \(splits \['test', 'train'\]\); "
                       r"give the folder of one split, e.g. .*dict/train"):  # fmt: skip
        read_train_file(tmp_path / "dict", "sup", cache_dir=tmp_path / "cache")
    whole = (tmp_path / "saved" / "data-00000-of-00003.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(whole[: len(whole) - 40])  # cut short inside its last batch
    with pytest.raises(DataError, match=r"cut\.arrow: not an Arrow file"):
        read_train_file(tmp_path / "cut.arrow", "sup", cache_dir=tmp_path / "cache")


def test_shards_are_read_in_sorted_order_as_one_cached_dataset(tmp_path: Path) -> None:
    rows = pair_rows(30)
    for i, part in enumerate(chunks(rows, 3)):
        parquet(part, tmp_path / f"s-{i}.parquet")
    listed = [tmp_path / "s-2.parquet", str(tmp_path / "s-[01].parquet")]  # a list keeps its own order
    assert shard_paths(listed) == [tmp_path / f"s-{i}.parquet" for i in (2, 0, 1)]
    assert [r["sent0"] for r in read_rows(listed, ("sent0", "sent1"))] == [r["sent0"] for r in rows[20:] + rows[:20]]
    cache = tmp_path / "cache"
    first = read_train_file(tmp_path, "sup", cache_dir=cache)
    assert first.dataset.to_list() == rows and not first.cache_hit
    assert read_train_file(str(tmp_path / "s-*.parquet"), "sup", cache_dir=cache).cache_hit  # the same shards
    parquet(list(reversed(chunks(rows, 3)[1])), tmp_path / "s-1.parquet")  # one shard edited
    again = read_train_file(tmp_path, "sup", cache_dir=cache)
    assert not again.cache_hit and again.dataset["sent0"][10:20] == [r["sent0"] for r in reversed(rows[10:20])]


def test_each_shard_is_its_own_cache_and_an_edit_rebuilds_only_that_shard(tmp_path: Path) -> None:
    rows = pair_rows(30)
    for i, part in enumerate(chunks(rows, 3)):
        parquet(part, tmp_path / f"s-{i}.parquet")
    cache = tmp_path / "cache"
    first = read_train_file(tmp_path, "sup", cache_dir=cache)
    assert len(first.cache_files) == 3 and len(list(cache.rglob("*.arrow"))) == 3
    # Each shard's cache is the one the shard has read alone (the same key).
    assert first.cache_files[1] == read_train_file(tmp_path / "s-1.parquet", "sup", cache_dir=cache).cache_files[0]
    parquet(list(reversed(chunks(rows, 3)[2])), tmp_path / "s-2.parquet")
    again = read_train_file(tmp_path, "sup", cache_dir=cache)
    assert again.cache_files[:2] == first.cache_files[:2] and again.cache_files[2] != first.cache_files[2]
    assert len(list(cache.rglob("*.arrow"))) == 4 and again.dataset["sent0"][20:] == [r["sent0"] for r in rows[:19:-1]]


def test_duplicates_are_counted_across_shards(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a dog runs\nthe cat sleeps\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("A dog  runs.\na bird sings\nthe cat sleeps\n", encoding="utf-8")
    corpus = read_train_file(tmp_path, "unsup", cache_dir=tmp_path / "cache")
    # Each shard alone has none; across them, two (the guard's keys: case, punctuation and spaces aside).
    assert corpus.report.duplicates == 2 and corpus.report.rows == 5


def test_the_count_across_shards_is_kept_and_follows_an_edited_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_text("a dog runs\nthe cat sleeps\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("A dog  runs.\na bird sings\n", encoding="utf-8")
    cache = tmp_path / "cache"
    first = read_train_file(tmp_path, "unsup", cache_dir=cache)
    kept = corpus_module.repeats_file(first_parts(first), "sent0")
    assert first.report.duplicates == 1 and kept.read_text() == "1\n"
    counted: list[int] = []
    monkeypatch.setattr(corpus_module, "repeats", lambda keys: counted.append(len(keys)) or 0)
    # A warm start reads the kept count: no keys sorted.
    assert read_train_file(tmp_path, "unsup", cache_dir=cache).report.duplicates == 1 and counted == []
    kept.write_text("not a number", encoding="utf-8")  # damaged: counted again (here by the stub: 0)
    assert read_train_file(tmp_path, "unsup", cache_dir=cache).report.duplicates == 0 and counted == [4]
    monkeypatch.undo()
    (tmp_path / "b.txt").write_text("a bird sings\nthe cat sleeps\na dog runs\n", encoding="utf-8")
    edited = read_train_file(tmp_path, "unsup", cache_dir=cache)
    assert corpus_module.repeats_file(first_parts(edited), "sent0") != kept and edited.report.duplicates == 2


def first_parts(corpus: Corpus) -> list[Corpus]:
    """``corpus``'s parts as :func:`~simcse_kit.data.corpus.repeats_file` names them (only their cache files count)."""
    return [Corpus(corpus.dataset, REPORT, (f,), True) for f in corpus.cache_files]


def test_a_large_text_file_is_cut_into_byte_ranges_at_line_starts(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(b"aaaa\nbb\ncccccc\nd\n")  # lines at bytes 0, 5, 8 and 15; 17 bytes
    # Cuts asked at 5, 10, 15: 5 is a line start; 10 is inside "cccccc", so the next line's start, 15;
    # 15 is then no further cut.
    assert byte_ranges(path, 5) == [(0, 5), (5, 15), (15, 17)]
    assert byte_ranges(path, 100) == [(0, 17)]
    parts = [[s for b in sentence_batches(path, BadRows(), part) for s in b["sent0"]] for part in byte_ranges(path, 5)]
    assert parts == [["aaaa"], ["bb", "cccccc"], ["d"]]


def test_a_large_text_file_is_read_in_ranges_as_the_whole_file_and_names_a_bad_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentences = toy_sentences(300)
    path = tmp_path / "big.txt"
    lines = [s.encode() for s in sentences]
    lines[249] += b"\xff"  # line 250, in a range that starts far past the file's start
    path.write_bytes(b"\n".join(lines) + b"\n")
    whole = read_train_file(path, "unsup", "skip", cache_dir=tmp_path / "whole")
    monkeypatch.setattr(readers, "RANGE_BYTES", 1000)
    with pytest.raises(DataError, match=r"big\.txt, line 250: not valid UTF-8 \(byte 0xff\)"):
        read_train_file(path, "unsup", cache_dir=tmp_path / "ranges")
    ranged = read_train_file(path, "unsup", "skip", cache_dir=tmp_path / "ranges")
    assert len(whole.cache_files) == 1 and len(ranged.cache_files) == len(byte_ranges(path, 1000)) > 5
    assert ranged.dataset["sent0"] == whole.dataset["sent0"] == sentences[:249] + sentences[250:]
    assert ranged.report.skipped == 1 and "line 250" in ranged.report.shown[0]
    assert read_train_file(path, "unsup", "skip", cache_dir=tmp_path / "ranges").cache_hit


def test_a_bad_row_in_the_last_range_stops_the_read_before_any_token_table(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every range's rows are checked first: a bad last line of a 10M-line file was found only after the
    token tables of the 16 ranges before it (13 minutes on 2 cores)."""
    from transformers import AutoTokenizer

    from simcse_kit.data.tokens import Tokenization

    lines = [s.encode() for s in toy_sentences(300)]
    lines[-2] += b"\xff"
    path = tmp_path / "big.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(readers, "RANGE_BYTES", 1000)
    tokenization = Tokenization(AutoTokenizer.from_pretrained(tiny_model_dir), 16)
    with pytest.raises(DataError, match=r"big\.txt, line 299: not valid UTF-8"):
        read_train_file(path, "unsup", cache_dir=tmp_path / "cache", tokens=tokenization)
    built = list((tmp_path / "cache").rglob("*.arrow"))
    assert len(built) == len(byte_ranges(path, 1000)) - 1 > 5  # every text cache but the bad range's
    assert not [f for f in built if ".tokens-" in str(f)]  # and no token table
    skipped = read_train_file(path, "unsup", "skip", cache_dir=tmp_path / "cache", tokens=tokenization)
    assert len(skipped.dataset) == 299 and "input_ids.sent0" in skipped.dataset.column_names


def test_a_launchs_processes_start_at_their_own_share_then_wait_for_the_shards_others_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths = [Path(f"s-{i}") for i in range(5)]
    held = {Path("s-4"), Path("s-0")}  # another process is building these
    calls: list[tuple[str, bool]] = []

    def get(part: tuple[Path, tuple[int, int] | None], wait: bool) -> Corpus | None:
        path = part[0]
        calls.append((path.name, wait))
        return None if path in held and not wait else Corpus(datasets.Dataset.from_dict({}), REPORT, (path,), True)

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    found = each_shard([(path, None) for path in paths], get)
    assert [c.cache_files[0] for c in found] == paths  # the shards' order, whoever built them
    # Rank 1 of 2 starts at shard 5 * 1 // 2 = 2, wraps round, then waits for shards 4 and 0 in that order.
    assert calls == [("s-2", False), ("s-3", False), ("s-4", False), ("s-0", False), ("s-1", False)] + [
        ("s-4", True),
        ("s-0", True),
    ]


def test_two_processes_build_every_shard_once_into_the_same_dataset(tmp_path: Path) -> None:
    sentences = toy_sentences(400)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(8):
        (folder / f"part-{i}.txt.gz").write_bytes(gzip.compress("".join(s + "\n" for s in sentences[i::8]).encode()))
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from simcse_kit.data.readers import read_train_file\n"
        f"corpus = read_train_file({str(folder)!r}, 'unsup', cache_dir={str(tmp_path / 'cache')!r})\n"
        "print('ROWS', corpus.dataset['sent0'] == [l for i in range(8) for l in SENTENCES[i::8]])\n"
    ).replace("SENTENCES", repr(sentences))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=os.environ | {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    assert all("ROWS True" in out for out in outs), outs
    builds = sorted(m for out in outs for m in re.findall(r"part-(\d)\.txt\.gz: \d+ rows cached", out))
    assert builds == [str(i) for i in range(8)]  # each shard read once, by one of the two
    assert len(list((tmp_path / "cache").rglob("*.arrow"))) == 8


@pytest.mark.parametrize(
    ("suffix", "where"), [(".parquet", "row 3"), (".jsonl.gz", "line 3"), (".jsonl.zst", "line 3"), (".csv", "line 4")]
)
def test_a_bad_row_in_shard_17_of_20_is_named_by_its_shard_and_row(tmp_path: Path, suffix: str, where: str) -> None:
    rows = pair_rows(100)
    for i, part in enumerate(chunks(rows, 20)):
        if i == 16:
            part = [dict(row, sent1=" ") if j == 2 else row for j, row in enumerate(part)]
        path = tmp_path / "data" / f"train-{i:05d}-of-00020{suffix}"
        path.parent.mkdir(exist_ok=True)
        if suffix == ".parquet":
            parquet(part, path)
        elif suffix == ".csv":
            path.write_bytes(csv_bytes(part))  # the header is line 1
        else:
            write = gzip.compress if suffix.endswith(".gz") else None
            (path.write_bytes(write(jsonl_bytes(part))) if write else zstd(jsonl_bytes(part), path))
    bad = rf"train-00016-of-00020{suffix}, {where}: empty value in column 'sent1'"
    with pytest.raises(DataError, match=bad.replace(".", r"\.")):
        read_train_file(tmp_path / "data", "sup", cache_dir=tmp_path / "cache")
    skipped = read_train_file(str(tmp_path / "data" / f"*{suffix}"), "sup", "skip", cache_dir=tmp_path / "cache")
    assert skipped.report.skipped == 1 and len(skipped.dataset) == 99 and bad.split(":")[0] in skipped.report.shown[0]


def test_damaged_or_mixed_shards_are_named(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match=r"a\.jsonl\.gz: not a valid gzip file"):
        read_train_file(tmp_path / "a.jsonl.gz", "sup", cache_dir=tmp_path / "cache")
    whole = tmp_path / "whole.txt.zst"
    zstd(b"".join(b"line %d\n" % i for i in range(20_000)), whole)
    (tmp_path / "a.txt.zst").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # cut short: not a shorter corpus
    whole.unlink()
    with pytest.raises(DataError, match=r"a\.txt\.zst: not a valid zstd file \(Truncated compressed stream\)"):
        read_train_file(tmp_path / "a.txt.zst", "unsup", cache_dir=tmp_path / "cache")
    (tmp_path / "a.txt.zst").unlink()
    (tmp_path / "b.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"b\.parquet: not a Parquet file"):
        read_train_file(tmp_path / "b.parquet", "sup", cache_dir=tmp_path / "cache")
    (tmp_path / "c.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(DataError, match=r"c\.parquet\.gz: a Parquet file compresses its own columns"):
        read_train_file(tmp_path / "c.parquet.gz", "sup", cache_dir=tmp_path / "cache")
    (tmp_path / "c.parquet.gz").unlink()
    with pytest.raises(DataError, match=r"shards of two formats \(a\.jsonl\.gz and b\.parquet\)"):
        shard_paths(tmp_path)
    with pytest.raises(DataError, match=r"no file matches this pattern"):
        shard_paths(str(tmp_path / "train-*.parquet"))
    (tmp_path / "k").mkdir()
    parquet([{"sent0": "a", "sent1": "b", "hard_neg": "c"}] * 2, tmp_path / "k" / "0.parquet")
    parquet([{"sent0": "a", "sent1": "b", "hard_neg": ["c", "d"]}] * 2, tmp_path / "k" / "1.parquet")
    with pytest.raises(DataError, match=r"1\.parquet: 2 hard negative\(s\) a row, the first shard's rows have 1"):
        read_train_file(tmp_path / "k", "hardneg", cache_dir=tmp_path / "cache")


def test_resume_refuses_a_run_whose_shards_changed(tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.folder import prepare_run_dir

    shards = tiny_run.folder / "wiki"
    shards.mkdir()
    sents = toy_sentences(64)
    for i in range(4):
        (shards / f"wiki-{i:02d}.txt.gz").write_bytes(
            gzip.compress("".join(s + "\n" for s in sents[16 * i : 16 * i + 16]).encode())
        )
    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=4, save_steps=2)
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["train_file"] = str(shards / "wiki-*.txt.gz")
    recipe.write_text(yaml.safe_dump(raw))
    assert cli_main(["train", str(recipe), "--final-eval", "false"]) == 0
    out = tiny_run.folder / "run"
    (out / "metrics.json").unlink()  # as if killed after its last checkpoint
    resume = ["train", str(recipe), "--final-eval", "false", "--resume"]

    # Shard 2 rewritten with its modification time put back: same name, another content.
    shard = shards / "wiki-02.txt.gz"
    original, stamp = shard.read_bytes(), shard.stat()
    shard.write_bytes(gzip.compress("".join(s + "\n" for s in reversed(sents[32:48])).encode()))
    os.utime(shard, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert cli_main(resume) == 2
    err = capsys.readouterr().err
    assert f"--resume: {shards / 'wiki-*.txt.gz'} changed since the run started: shard {shard}" in err, err
    shard.write_bytes(original)

    def refused() -> str:
        with pytest.raises(ConfigError) as caught:
            prepare_run_dir(load_config(recipe, {"final_eval": "false"}), resume=True)
        return str(caught.value)

    extra = shards / "wiki-04.txt.gz"
    extra.write_bytes(gzip.compress(b"one more sentence\n"))
    assert f"shard {extra} is new (4 -> 5 shards)" in refused()
    extra.unlink()
    (shards / "wiki-03.txt.gz").rename(tiny_run.folder / "aside.gz")
    assert f"shard {shards / 'wiki-03.txt.gz'} is gone (4 -> 3 shards)" in refused()
    (tiny_run.folder / "aside.gz").rename(shards / "wiki-03.txt.gz")
    prepare_run_dir(load_config(recipe, {"final_eval": "false"}), resume=True)  # the same shards again: resumes


def test_a_recipe_names_a_datasets_shards_by_a_list_a_folder_or_a_pattern(tiny_run: TinyRun) -> None:
    import yaml

    from simcse_kit.config.run import load_config
    from simcse_kit.training.wiring.folder import DATA_FINGERPRINTS, prepare_run_dir
    from simcse_kit.training.wiring.inputs import load_training_data, load_training_sets

    sents = toy_sentences(48)
    (tiny_run.folder / "more").mkdir()
    for i in range(3):
        (tiny_run.folder / "more" / f"m-{i}.txt").write_text("".join(s + "\n" for s in sents[8 * i + 24 : 8 * i + 32]))
    (tiny_run.folder / "first.txt.gz").write_bytes(gzip.compress("".join(s + "\n" for s in sents[:24]).encode()))
    recipe = tiny_run.recipe("listed")
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["train_file"] = ["first.txt.gz", "more/m-*.txt"]  # relative to the recipe, read in the list's order
    recipe.write_text(yaml.safe_dump(raw))
    cfg = load_config(recipe)
    assert cfg.data.train_file == [str(tiny_run.folder / "first.txt.gz"), str(tiny_run.folder / "more" / "m-*.txt")]
    assert list(load_training_data(cfg)["sent0"]) == sents

    # The same from the command line, and as a dataset of a mixture (named by its first file).
    listed = f"[{tiny_run.folder / 'more'}, {tiny_run.folder / 'first.txt.gz'}]"
    assert list(load_training_data(load_config(recipe, {"train_file": listed}))["sent0"]) == sents[24:] + sents[:24]
    raw["data"]["datasets"] = [{"file": ["more", "first.txt.gz"]}, {"name": "one", "file": "first.txt.gz"}]
    recipe.write_text(yaml.safe_dump(raw))
    sets = load_training_sets(load_config(recipe))
    assert list(sets) == ["more", "one"] and list(sets["more"]["sent0"]) == sents[24:] + sents[:24]

    raw["data"]["datasets"][0]["file"] = ["more", "nope.txt"]
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"entry 'more': .*nope\.txt: file not found"):
        load_config(recipe).check_data()
    raw["data"]["datasets"][0]["file"] = []
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"file = \[\] is not a valid str \| list\[str\]"):
        load_config(recipe)

    # --resume checks a list's shards as a pattern's.
    del raw["data"]["datasets"]
    recipe.write_text(yaml.safe_dump(raw))
    out = prepare_run_dir(load_config(recipe))
    label = ", ".join(load_config(recipe).data.train_file)
    recorded = json.loads((out / DATA_FINGERPRINTS).read_text())[label]["shards"]
    assert [Path(s["file"]).name for s in recorded] == ["first.txt.gz", "m-0.txt", "m-1.txt", "m-2.txt"]
    (tiny_run.folder / "more" / "m-1.txt").write_text("another sentence\n" * 8)
    with pytest.raises(ConfigError, match=rf"--resume: {re.escape(label)} changed since the run started: shard .*m-1\.txt \("):
        prepare_run_dir(load_config(recipe), resume=True)
