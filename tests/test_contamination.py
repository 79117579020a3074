"""The contamination guard (simcse_kit.data.overlap, simcse_kit.evaluation.contamination):
planted overlaps found through every path a text reaches training by, none in clean data,
``drop`` against a naive loop, and the counts on the shipped data (issue 49)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TinyRun, write_tiny_senteval
from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from simcse_kit.cli import main
from simcse_kit.data import overlap
from simcse_kit.data.overlap import dataset_keys, hashes_file, normalize, text_hashes
from simcse_kit.data.readers import read_train_file
from simcse_kit.errors import DataError
from simcse_kit.evaluation.contamination import (
    FILTER_BITS,
    EvalSet,
    Guard,
    count_overlap,
    dev_set,
    file_keys,
    format_marked_table,
    members,
    pair_set,
    suite_sets,
)
from simcse_kit.evaluation.suite import default_suite
from simcse_kit.evaluation.tables import format_table

# --------------------------------------------------------------------------- the key


def test_normalize_folds_case_punctuation_and_tokenised_spacing() -> None:
    assert normalize("It's a dog.") == normalize("it 's a dog") == "itsadog"
    assert normalize("Don't  stop!") == normalize("do n't stop") == "dontstop"
    assert normalize("«CAFÉ» — “Ça va?”\u00a0Oui") == "caféçavaoui"  # Unicode punctuation and spaces, case folded
    assert normalize("Straße") == "strasse"  # casefold, not lower
    assert normalize("$5 + 3 < 9") == "$5+3<9"  # symbols (category S) are not punctuation: kept


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(string.printable), max_size=30), max_size=20))
def test_batched_keys_equal_one_by_one_normalize(texts: list[str]) -> None:
    """The fast path (ASCII texts joined and stripped by bytes.translate) and the one-by-one
    path give xxh3 of exactly normalize()'s UTF-8, text by text."""
    want = [xxh3_64_intdigest(normalize(t).encode("utf-8", "surrogatepass")) for t in texts]
    assert text_hashes(texts).tolist() == want


def test_a_text_holding_the_separator_keeps_its_own_key() -> None:
    texts = ["a\0b", "A B", "c"]
    assert text_hashes(texts).tolist() == [xxh3_64_intdigest(normalize(t).encode()) for t in texts]


# --------------------------------------------------------------------------- planted overlaps

TEST_PAIRS = [("A man is playing a guitar.", "A woman slices an onion."), ("The cat sat on the mat.", "Dogs run in a park.")]
DEV_PAIRS = [("A child reads a book.", "Two birds sing at dawn.")]
CLEAN = ["Paris is the capital of France.", "Water boils at one hundred degrees.", "The train left early."]


def guard(mode: str = "warn", drop_dev: bool = False) -> Guard:
    test = pair_set("TASK", "test", "task.txt", [a for a, _ in TEST_PAIRS], [b for _, b in TEST_PAIRS])
    dev = pair_set("dev", "dev", "dev.csv", [a for a, _ in DEV_PAIRS], [b for _, b in DEV_PAIRS])
    return Guard([test, dev], mode, drop_dev)


def rows_of(texts: list[str]) -> np.ndarray:
    return text_hashes(texts)[:, None]


def test_case_and_space_variants_are_found() -> None:
    g = guard()
    texts = [*CLEAN, "a MAN is playing a guitar", "  a woman   slices an onion ."]
    g.check("train.txt", rows_of(texts), lambda i: [texts[i]])
    task = g.report()["tasks"]["TASK"]
    assert (task["sentences_seen"], task["sentences"], task["pairs_seen"], task["pairs"]) == (2, 4, 1, 2)
    assert task["contaminated"] and task["training"] == ["train.txt"]


def test_clean_data_finds_nothing() -> None:
    g = guard("drop")
    assert g.check("clean.txt", rows_of(CLEAN), lambda i: [CLEAN[i]]) is None
    report = g.report()
    assert all(t["sentences_seen"] == t["pairs_seen"] == 0 and not t["contaminated"] for t in report["tasks"].values())
    assert report["dropped"] == {}


def test_a_sentence_only_in_the_teachers_texts_is_found() -> None:
    g = guard()
    g.check("train.txt", rows_of(CLEAN), lambda i: [CLEAN[i]])
    g.add_texts("the teacher's and the guide's sentences", ["the cat sat on the mat"])
    task = g.report()["tasks"]["TASK"]
    assert task["sentences_seen"] == 1 and task["training"] == ["the teacher's and the guide's sentences"]


def test_a_sentence_only_in_a_mined_negative_is_found(tmp_path: Path) -> None:
    """A hard-negative file as `simcse-kit mine` writes it: the test sentence is only a negative."""
    path = tmp_path / "mined.csv"
    path.write_text(
        "sent0,sent1,hard_neg_1,hard_neg_2\n"
        f"{CLEAN[0]},{CLEAN[1]},{CLEAN[2]},Dogs run in a park!\n"
        f"{CLEAN[1]},{CLEAN[2]},{CLEAN[0]},{CLEAN[2]}\n",
        encoding="utf-8",
    )
    fmt, keys = file_keys(path, cache_dir=tmp_path / "cache")
    assert fmt == "table" and keys.shape == (2, 4)
    g = guard("error")
    with pytest.raises(DataError) as err:
        g.check(str(path), keys, lambda i: ["?", "?", "?", "Dogs run in a park!"], path)
    assert str(err.value).startswith(f"{path}, line 2: 'Dogs run in a park!' is a sentence of evaluation task TASK")


MINED = [
    {"sent0": CLEAN[0], "sent1": CLEAN[1], "hard_neg": "Dogs run in a park!"},
    {"sent0": CLEAN[1], "sent1": CLEAN[2], "hard_neg": CLEAN[0]},
    {"sent0": CLEAN[2], "sent1": CLEAN[0], "hard_neg": CLEAN[1]},
]


def write_every_format(folder: Path, rows: list[dict[str, str]]) -> list[Path]:
    """``rows`` as each training format writes them: CSV, TSV, JSONL, gzip'd JSONL, Parquet,
    an Arrow (Feather) file, a ``datasets.save_to_disk`` folder of 3 shards, and a glob of them."""
    import gzip

    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    folder.mkdir()
    head = list(rows[0])
    (folder / "t.csv").write_text("\n".join([",".join(head), *(",".join(r.values()) for r in rows)]) + "\n", "utf-8")
    (folder / "t.tsv").write_text("\n".join(["\t".join(head), *("\t".join(r.values()) for r in rows)]) + "\n", "utf-8")
    jsonl = "".join(json.dumps(r) + "\n" for r in rows)
    (folder / "t.jsonl").write_text(jsonl, "utf-8")
    (folder / "t.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    pq.write_table(pa.Table.from_pylist(rows), folder / "t.parquet")
    feather.write_feather(pa.Table.from_pylist(rows), folder / "t.arrow")
    datasets.Dataset.from_list(rows).save_to_disk(str(folder / "saved"), num_shards=3)
    return [*sorted(folder.glob("t.*")), folder / "saved", folder / "saved" / "data-*.arrow"]


def test_overlap_reads_every_training_format_alike(tmp_path: Path) -> None:
    """`simcse-kit overlap` reads what training reads: the same rows in every format and
    layout give the same keys, the hard negatives among them (it read only CSV, JSONL and
    text: a Parquet file, a compressed one or a folder of shards stopped it)."""
    want = np.stack([text_hashes([r[c] for r in MINED]) for c in ("sent0", "sent1", "hard_neg")], axis=1)
    for path in write_every_format(tmp_path / "data", MINED):
        fmt, keys = file_keys(path, cache_dir=tmp_path / "cache")
        assert fmt == "table" and np.array_equal(keys, want), path
    unsup = tmp_path / "unsup.csv"  # only sent0: an unsup table, not a pair file lacking sent1
    unsup.write_text("sent0\n" + "".join(f"{s}\n" for s in CLEAN), "utf-8")
    assert np.array_equal(file_keys(unsup, cache_dir=tmp_path / "cache")[1], text_hashes(CLEAN)[:, None])


@pytest.mark.parametrize(("name", "where_"), [("t.parquet", "row 1"), ("t.arrow", "row 1"), ("t.jsonl.gz", "line 1")])
def test_the_guard_names_the_row_of_a_parquet_or_compressed_file(tmp_path: Path, name: str, where_: str) -> None:
    """``data.decontaminate: error`` on one Parquet, Arrow or compressed file names the row or
    line holding the test sentence (finding it read the file as plain text: "not valid UTF-8")."""
    path = write_every_format(tmp_path / "data", MINED)[0].parent / name
    _, keys = file_keys(path, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError) as err:
        guard("error").check(str(path), keys, lambda i: list(MINED[i].values()), path)
    assert str(err.value).startswith(f"{path}, {where_}: 'Dogs run in a park!' is a sentence of evaluation task TASK")


def test_drop_removes_exactly_the_overlapping_rows_and_dev_only_when_asked() -> None:
    rows = [
        (CLEAN[0], CLEAN[1]),
        ("the CAT sat on the mat", CLEAN[2]),  # test sentence in column 0
        (CLEAN[1], "a child reads a book"),  # dev sentence
        (CLEAN[2], "dogs-run in a park"),  # test sentence in column 1
        (CLEAN[0], CLEAN[2]),
    ]
    keys = np.stack([text_hashes([a for a, _ in rows]), text_hashes([b for _, b in rows])], axis=1)
    test_norm = {normalize(s) for pair in TEST_PAIRS for s in pair}
    dev_norm = {normalize(s) for pair in DEV_PAIRS for s in pair}
    for drop_dev, guarded in ((False, test_norm), (True, test_norm | dev_norm)):
        naive = [i for i, row in enumerate(rows) if not any(normalize(t) in guarded for t in row)]
        g = guard("drop", drop_dev)
        kept = g.check("pairs.csv", keys, lambda i: list(rows[i]))
        assert kept is not None and kept.tolist() == naive
        assert g.report()["dropped"] == {"pairs.csv": len(rows) - len(naive)}
    assert naive == [0, 4]


# Keys that share their low bits (members' bitmap slot) and differ above them, up to 2**64 - 1.
key_values = st.tuples(st.integers(0, 4), st.sampled_from([0, 1, 7, 2**42 - 1])).map(lambda lh: lh[0] + (lh[1] << FILTER_BITS))
keys_strategy = st.lists(key_values, max_size=60).map(lambda v: np.array(v, dtype=np.uint64))


@settings(max_examples=200, deadline=None)
@given(keys_strategy, keys_strategy, st.booleans())
def test_members_is_isin_against_a_sorted_table(keys: np.ndarray, table: np.ndarray, rows: bool) -> None:
    keys = keys[: len(keys) // 2 * 2].reshape(-1, 2) if rows else keys  # a corpus's [rows, text columns] too
    assert members(keys, np.unique(table)).tolist() == np.isin(keys, table).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=20), keys_strategy, keys_strategy,
       st.sampled_from(["warn", "drop"]))  # fmt: skip
def test_guard_counts_equal_a_naive_set_loop(test: list[tuple[int, int]], dev: np.ndarray, train: np.ndarray, mode: str) -> None:
    """A source keeps only the evaluation keys (not a corpus's millions): the counts are still a set loop's."""
    pairs = np.array(test, dtype=np.uint64).reshape(-1, 2)
    no_pairs = np.empty((0, 2), np.uint64)
    g = Guard([EvalSet("T", "test", "t", pairs, np.unique(pairs)), EvalSet("D", "dev", "d", no_pairs, np.unique(dev))], mode)
    rows = train.reshape(-1, 2) if len(train) % 2 == 0 else train[:, None]
    g.check("train", rows, lambda i: ["?"] * rows.shape[1])
    guarded = {int(k) for k in pairs.ravel()}
    kept = [r for r in rows.tolist() if mode == "warn" or not guarded & set(r)]
    seen = {k for r in kept for k in r}
    task = g.report()["tasks"]["T"]
    assert task["sentences_seen"] == len(guarded & seen)
    assert task["pairs_seen"] == sum(a in seen and b in seen for a, b in pairs.tolist())
    assert g.report()["tasks"]["D"]["sentences_seen"] == len({int(k) for k in dev} & seen)
    assert set(g.sources["train"].tolist()) == seen & (guarded | {int(k) for k in dev})


def test_error_names_the_file_line_and_task(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(f"{CLEAN[0]}\n\n{CLEAN[1]}\nThe Cat sat on the mat\n", encoding="utf-8")
    corpus = read_train_file(path, "unsup", cache_dir=tmp_path / "cache")
    with pytest.raises(DataError) as err:
        guard("error").check(str(path), dataset_keys(corpus.dataset), lambda i: [corpus.dataset[i]["sent0"]], path)
    message = str(err.value)
    assert message.startswith(f"{path}, line 4: 'The Cat sat on the mat' is a sentence of evaluation task TASK")
    assert "\n" not in message


# --------------------------------------------------------------------------- the cache


def test_keys_are_kept_beside_the_cache_and_a_warm_read_hashes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("sent0,sent1\n" + "".join(f"{a},{b}\n" for a, b in [*TEST_PAIRS, (CLEAN[0], CLEAN[1])]), encoding="utf-8")
    cold = read_train_file(path, "sup", cache_dir=tmp_path / "cache")
    kept = np.load(hashes_file(cold.cache_files[0]))
    want = np.stack([text_hashes(cold.dataset["sent0"]), text_hashes(cold.dataset["sent1"])], axis=1)
    np.testing.assert_array_equal(kept, want)
    hashes_file(cold.cache_files[0]).unlink()  # a cache built before the keys were kept: computed once, then kept
    np.testing.assert_array_equal(dataset_keys(cold.dataset), want)
    np.testing.assert_array_equal(np.load(hashes_file(cold.cache_files[0])), want)

    def no_hashing(*_: object) -> np.ndarray:
        raise AssertionError("a warm run hashed the corpus again")

    monkeypatch.setattr(overlap, "row_hashes", no_hashing)
    warm = read_train_file(path, "sup", cache_dir=tmp_path / "cache")
    assert warm.cache_hit
    np.testing.assert_array_equal(dataset_keys(warm.dataset), want)
    np.testing.assert_array_equal(dataset_keys(warm.dataset.select(range(2))), want[:2])  # max_train_samples' prefix


# --------------------------------------------------------------------------- the table


def test_marked_table_and_clean_average_by_hand() -> None:
    sts = {
        "STS12": 70.0,
        "STS13": 80.0,
        "STS14": 75.0,
        "STS15": 81.0,
        "STS16": 79.0,
        "STSBenchmark": 82.0,
        "SICKRelatedness": 73.0,
    }
    sts["avg"] = sum(sts.values()) / 7
    dirty = {"pairs_seen": 1900, "pairs": 3750, "sentences_seen": 3346, "sentences": 6341, "contaminated": True}
    tasks = {t: {"contaminated": False} for t in sts if t != "avg"}
    tasks["STS14"] = dirty | {"training": ["sts-train.csv"]}
    tasks["SICKRelatedness"] = dirty | {"training": ["SICK_train.txt"]}
    table = format_marked_table(sts, {"tasks": tasks}).splitlines()
    assert table[0].split() == ["STS12", "STS13", "STS14*", "STS15", "STS16", "STS-B", "SICK-R*", "Avg."]
    assert table[2] == "Avg. over the 5 clean task(s) of 7: 78.40"  # (70 + 80 + 81 + 79 + 82) / 5
    assert table[3] == "* STS14: 1,900 of 3,750 pairs and 3,346 of 6,341 sentences also in training (sts-train.csv)"
    assert table[4].startswith("* SICK-R: ") and table[4].endswith("(SICK_train.txt)")
    assert format_marked_table(sts, None) == format_table(sts)  # a run from before the guard: as it was


# --------------------------------------------------------------------------- the shipped data (issue 49)


def test_shipped_stsb_and_sick_train_against_their_tests(data_dir: Path) -> None:
    senteval = data_dir / "senteval"
    suite = default_suite()
    sets = {s.name: s for s in suite_sets(senteval, suite)}
    _, stsb = file_keys(senteval / "STS" / "STSBenchmark" / "sts-train.csv")
    years = [count_overlap(sets[t], {"stsb": stsb}) for t in ("STS12", "STS13", "STS14", "STS15", "STS16")]
    # Issue 49 says 4,833; casefold + no punctuation + no whitespace gives 4,831 (docs/contamination.md).
    assert [o.pairs_seen for o in years] == [1029, 597, 1900, 1108, 197]
    assert (sum(o.pairs_seen for o in years), sum(o.pairs for o in years)) == (4831, 12544)
    _, sick = file_keys(senteval / "SICK" / "SICK_train.txt")
    sick_r = count_overlap(sets["SICKRelatedness"], {"sick": sick})
    assert (sick_r.pairs_seen, sick_r.pairs, sick_r.sentences_seen, sick_r.sentences) == (2533, 4927, 3742, 5006)


def test_the_main_jobs_data_is_clean(data_dir: Path, tmp_path: Path) -> None:
    """train/unsup.yaml reads wiki1m_head.txt: no sentence of the suite or STS-B dev, so
    ``drop`` leaves its dataset as it is (the same object, so the same batches)."""
    from simcse_kit.training.wiring.inputs import guarded

    senteval = data_dir / "senteval"
    g = Guard(
        [*suite_sets(senteval, default_suite()), dev_set(senteval / "STS" / "STSBenchmark" / "sts-dev.csv", "stsb")], "drop", True
    )
    wiki = read_train_file(data_dir / "train" / "wiki1m_head.txt", "unsup", cache_dir=tmp_path).dataset
    assert guarded(wiki, g, str(data_dir / "train" / "wiki1m_head.txt")) is wiki
    assert all(t["sentences_seen"] == 0 for t in g.report()["tasks"].values())


def test_overlap_command_counts_a_users_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    sts12 = suite_sets(senteval, {"STS12": default_suite()["STS12"]})[0]
    first_subset = (senteval / "STS" / "STS12-en-test" / "STS.input.MSRpar.txt").read_text(encoding="utf-8").splitlines()
    a, b = first_subset[0].split("\t")
    train = tmp_path / "mine.txt"
    train.write_text(f"{a.upper()}\n{b} !\nnothing like the tests\n", encoding="utf-8")
    out = tmp_path / "overlap.json"
    args = ["overlap", str(train), "--data-dir", str(senteval), "--tasks", "STS12", "--cache-dir", str(tmp_path / "c")]
    assert main([*args, "--json", str(out)]) == 0
    counts = json.loads(out.read_text())["tasks"]["STS12"]
    want = count_overlap(sts12, {"mine": text_hashes([a, b])})
    assert counts["pairs_seen"] == want.pairs_seen >= 1
    assert counts["sentences_seen"] == want.sentences_seen == len({normalize(a), normalize(b)})
    assert "STS12*" in capsys.readouterr().out


# --------------------------------------------------------------------------- runs


def naive_pairs_seen(senteval: Path, trained: list[str]) -> dict[str, int]:
    """Per suite task, its test pairs with both sentences among ``trained`` (a Python loop)."""
    from simcse_kit.evaluation.sts_readers import load_task

    seen = {normalize(t) for t in trained}
    counts = {}
    for name, spec in default_suite().items():
        splits = load_task(senteval, spec)
        chosen = [splits[s] for s in spec.subsets] if spec.format == "sts" else [splits["test"]]
        counts[name] = sum(
            normalize(a) in seen and normalize(b) in seen for p in chosen for a, b in zip(p.sentences1, p.sentences2, strict=True)
        )
    return counts


def test_a_run_reports_its_contaminated_tasks_in_metrics_and_the_final_table(tiny_run: TinyRun) -> None:
    """The tiny run's corpus holds the tiny suite's sentences (both are toy_sentences): metrics.json
    counts each task's pairs as a loop over the files does, and the table marks them."""
    metrics = tiny_run.train("run", max_steps=2, eval_steps=2, save_steps=0)
    trained = (tiny_run.folder / "train.txt").read_text(encoding="utf-8").split("\n")
    want = naive_pairs_seen(tiny_run.folder / "senteval", [t for t in trained if t.strip()])
    tasks = metrics["contamination"]["tasks"]
    assert {name: tasks[name]["pairs_seen"] for name in want} == want and sum(want.values()) > 0
    table = format_marked_table(metrics["sts"], metrics["contamination"])
    marked = [h.rstrip("*") for h in table.splitlines()[0].split() if h.endswith("*")]
    assert marked and marked == [STS_LABELS[t] for t in want if tasks[t]["contaminated"]]
    assert "clean task(s) of 7" in table
    assert json.loads((tiny_run.folder / "run" / "metrics.json").read_text())["contamination"] == metrics["contamination"]
    assert main(["export", str(tiny_run.folder / "run"), str(tiny_run.folder / "export")]) == 0
    assert table in (tiny_run.folder / "export" / "README.md").read_text(encoding="utf-8")  # the card's table, verbatim


STS_LABELS = {"STS12": "STS12", "STS13": "STS13", "STS14": "STS14", "STS15": "STS15", "STS16": "STS16",
              "STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}  # fmt: skip


def test_drop_trains_on_the_clean_rows_and_error_refuses_before_the_folder(tiny_run: TinyRun) -> None:
    from simcse_kit.training.wiring.run import build_run

    cfg = tiny_run.config("drop", decontaminate="drop", save_steps=0)
    run = build_run(cfg)
    trained = [t for t in (tiny_run.folder / "train.txt").read_text(encoding="utf-8").split("\n") if t.strip()]
    tests = naive_test_sentences(tiny_run.folder / "senteval")
    clean = [t for t in trained if normalize(t) not in tests]
    assert 0 < len(clean) < len(trained)
    assert run.loader.dataset.parts[0]["sent0"] == clean  # in file order: the rows kept, none added
    assert run.contamination is not None and run.contamination["dropped"] == {cfg.data.train_file: len(trained) - len(clean)}
    assert all(t["pairs_seen"] == 0 for t in run.contamination["tasks"].values() if t["kind"] == "test")
    with pytest.raises(DataError, match=r"train\.txt, line 1: .* is a sentence of evaluation task STS"):
        tiny_run.train("error", decontaminate="error")
    assert not (tiny_run.folder / "error").exists()


def naive_test_sentences(senteval: Path) -> set[str]:
    from simcse_kit.evaluation.sts_readers import load_task

    out = set()
    for spec in default_suite().values():
        for name, split in load_task(senteval, spec).items():
            if spec.format != "stsb" or name == "test":
                out |= {normalize(s) for s in split.sentences1 + split.sentences2}
    return out


def test_a_clean_run_is_unchanged_by_drop(tiny_run: TinyRun) -> None:
    """Clean data under ``drop``: the same batches, bit for bit, as a run built without the guard."""
    from conftest import toy_sentences

    from simcse_kit.training.wiring.run import build_run

    tiny_run.recipe("clean")  # writes the tiny senteval and the contaminated train.txt
    tests = naive_test_sentences(tiny_run.folder / "senteval")
    dev = tiny_run.folder / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"
    tests |= {normalize(s) for line in dev.read_text(encoding="utf-8").splitlines() for s in line.split("\t")[5:7]}
    clean = [s for s in toy_sentences(400)[200:] if normalize(s) not in tests][:64]
    path = tiny_run.folder / "clean.txt"
    path.write_text("\n".join(clean) + "\n", encoding="utf-8")

    def batches(**overrides: object) -> list[torch.Tensor]:
        cfg = tiny_run.config("clean", train_file=str(path), save_steps=0, **overrides)
        run = build_run(cfg, evaluate=overrides.get("decontaminate") is not None)
        if overrides.get("decontaminate") is not None:
            assert run.contamination is not None and run.contamination["dropped"] == {}
            assert all(t["sentences_seen"] == 0 for t in run.contamination["tasks"].values())
        return [batch["input_ids"].clone() for batch in run.loader]

    guarded = batches(decontaminate="drop", decontaminate_dev="true")
    unguarded = batches()  # evaluate=False: no guard at all
    assert len(guarded) == len(unguarded) > 0
    assert all(torch.equal(a, b) for a, b in zip(guarded, unguarded, strict=True))


def test_the_teachers_texts_are_hashed_in_a_run(tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence that only the teacher encodes (planted in the run's teacher texts) is counted."""
    from test_teacher import save_teacher

    from simcse_kit.training.wiring import run as run_module

    tiny_run.recipe("t")
    planted = (tiny_run.folder / "senteval" / "STS" / "STS16-en-test" / "STS.input.headlines.txt").read_text().split("\t")[0]
    clean_file = tiny_run.folder / "one.txt"
    clean_file.write_text("zz qq first\nzz qq second\nzz qq third\nzz qq fourth\n" * 4, encoding="utf-8")
    real = run_module.training_texts
    monkeypatch.setattr(run_module, "training_texts", lambda *a: [*real(*a), planted.upper()])
    teacher = save_teacher(tmp_path / "teacher", hidden=16)
    cfg = tiny_run.config("t", train_file=str(clean_file), teacher=str(teacher), teacher_cache_dir=str(tmp_path / "c"),
                          save_steps=0, batch_size=4)  # fmt: skip
    report = run_module.build_run(cfg).contamination
    assert report is not None
    holders = {name: t["training"] for name, t in report["tasks"].items() if t["sentences_seen"]}
    assert holders and all(h == ["the teacher's and the guide's sentences"] for h in holders.values())
    assert "STS16" in holders


def test_a_headerless_table_read_as_text_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SICK's ``SICK_train.txt`` has no header, so it reads as one sentence a line, and whole
    tab-joined lines match no evaluation sentence: a clean 0% that is wrong. The reader says
    so, naming the file; a text file of sentences says nothing."""
    table = tmp_path / "SICK_train.txt"
    table.write_text("".join(f"{i}\tA dog runs {i}\tA dog is running {i}\t4.5\tENTAILMENT\n" for i in range(20)))
    with caplog.at_level("WARNING"):
        file_keys(table, cache_dir=tmp_path / "cache")
    assert [r.getMessage() for r in caplog.records if "20 of its first 20 lines hold tabs" in r.getMessage()], caplog.text
    assert str(table) in caplog.text
    caplog.clear()
    text = tmp_path / "sentences.txt"
    text.write_text("".join(f"A dog runs {i}\n" for i in range(20)) + "one\tline with a tab\n")
    with caplog.at_level("WARNING"):
        file_keys(text, cache_dir=tmp_path / "cache")
    assert "hold tabs" not in caplog.text
