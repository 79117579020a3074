"""SentEval transfer tasks: readers against the official counts, the probes against a
loop written from SentEval's validation.py, and an end-to-end known answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from simcse_kit.cli import main
from simcse_kit.errors import DataError
from simcse_kit.transfer import (
    KFOLD_REGS,
    NESTED_REGS,
    TRANSFER_TASKS,
    TransferEvaluator,
    format_transfer_table,
    kfold_then_test,
    load_transfer_task,
    nested_kfold,
    pair_features,
    split_validation,
)

# --------------------------------------------------------------------------- readers on the real data

# SentEval's sizes (MR 10662, CR 3775, SUBJ 10000, MPQA 10606, SST2 67349/872/1821,
# TREC 5452/500, MRPC 4076/1725) less the blank lines SentEval keeps as samples.
COUNTS = {
    "MR": {"all": (5331, 5331)},
    "CR": {"all": (1366, 2405)},
    "SUBJ": {"all": (5000, 5000)},
    "MPQA": {"all": (7292, 3311)},
    "SST2": {"train": (29780, 37569), "dev": (428, 444), "test": (912, 909)},
    "TREC": {"train": (86, 1162, 1250, 1223, 835, 896), "test": (9, 138, 94, 65, 81, 113)},
    "MRPC": {"train": (1323, 2753), "test": (578, 1147)},
}


@pytest.mark.parametrize("name", TRANSFER_TASKS)
def test_readers_match_official_counts(data_dir: Path, name: str) -> None:
    task = load_transfer_task(data_dir / "senteval", name)
    for split, per_class in COUNTS[name].items():
        texts, labels = task.splits[split]
        assert tuple(np.bincount(labels).tolist()) == per_class
        sentences = [s for t in texts for s in t.split("\t")] if task.paired else texts
        assert len(texts) == len(labels) and all(s and s == " ".join(s.split()) for s in sentences)
    if name == "MRPC":
        a, b = task.pairs(task.splits["train"][0][:1])
        assert a[0].startswith("Amrozi accused his brother") and b[0].startswith("Referring to him as only")
    if name == "TREC":  # Latin-1 file, coarse label, fine label dropped
        assert task.splits["train"][0][0] == "How did serfdom develop in and then leave Russia ?"
        assert task.splits["train"][1][0] == 1  # DESC


def test_malformed_file_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "TREC").mkdir()
    (tmp_path / "TREC" / "train_5500.label").write_text("DESC:manner How ?\nWHAT:x bad label\n", encoding="utf-8")
    (tmp_path / "TREC" / "TREC_10.label").write_text("NUM:dist How far ?\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train_5500.label, line 2"):
        load_transfer_task(tmp_path, "TREC")
    with pytest.raises(DataError, match="not found"):
        load_transfer_task(tmp_path, "MR")
    with pytest.raises(KeyError):
        load_transfer_task(tmp_path, "SNLI")


# --------------------------------------------------------------------------- probes vs SentEval's loops


def senteval_inner_kfold(x: np.ndarray, y: np.ndarray, k: int, regs: list[float]) -> tuple[float, float]:
    """SentEval's InnerKFoldClassifier.run, sklearn branch, transcribed."""
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    innerskf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    devresults, testresults = [], []
    for train_idx, test_idx in skf.split(x, y):
        x_train, x_test, y_train, y_test = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
        scores = []
        for reg in regs:
            regscores = []
            for a, b in innerskf.split(x_train, y_train):
                clf = LogisticRegression(C=reg, random_state=1111, max_iter=1000).fit(x_train[a], y_train[a])
                regscores.append(clf.score(x_train[b], y_train[b]))
            scores.append(round(100 * np.mean(regscores), 2))
        optreg = regs[int(np.argmax(scores))]
        devresults.append(np.max(scores))
        clf = LogisticRegression(C=optreg, random_state=1111, max_iter=1000).fit(x_train, y_train)
        testresults.append(round(100 * clf.score(x_test, y_test), 2))
    return round(float(np.mean(devresults)), 2), round(float(np.mean(testresults)), 2)


def noisy_data(n: int, d: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, d)) + 0.8 * np.eye(classes, d)[y]
    return x, y


def test_nested_kfold_equals_senteval_loop() -> None:
    x, y = noisy_data(90, 5, 2, 0)
    regs = [0.01, 1.0, 8.0]
    got = nested_kfold(x, y, kfold=3, regs=regs)
    assert got == senteval_inner_kfold(x, y, 3, regs)
    assert 50 < got[1] < 100  # noisy: neither chance nor perfect, so C matters


def test_kfold_then_test_and_split_validation_by_hand() -> None:
    x, y = noisy_data(120, 6, 3, 1)
    xt, yt = noisy_data(40, 6, 3, 2)
    regs = [0.01, 4.0]
    dev, test, pred = kfold_then_test(x, y, xt, yt, kfold=4, regs=regs)
    folds = list(StratifiedKFold(4, shuffle=True, random_state=1111).split(x, y))
    scores = [
        round(
            100
            * np.mean(
                [LogisticRegression(C=c, random_state=1111, max_iter=1000).fit(x[a], y[a]).score(x[b], y[b]) for a, b in folds]
            ),
            2,
        )
        for c in regs
    ]
    best = regs[int(np.argmax(scores))]
    clf = LogisticRegression(C=best, random_state=1111, max_iter=1000).fit(x, y)
    assert dev == max(scores)
    assert test == round(100 * clf.score(xt, yt), 2)
    assert np.array_equal(pred, clf.predict(xt))

    xd, yd = noisy_data(40, 6, 3, 3)
    dev, test = split_validation(x, y, xd, yd, xt, yt, regs=regs)
    dev_scores = [round(100 * LogisticRegression(C=c, random_state=1111, max_iter=1000).fit(x, y).score(xd, yd), 2) for c in regs]
    best = regs[int(np.argmax(dev_scores))]
    assert dev == max(dev_scores)
    assert test == round(100 * LogisticRegression(C=best, random_state=1111, max_iter=1000).fit(x, y).score(xt, yt), 2)


def test_senteval_grids() -> None:
    assert NESTED_REGS == (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    assert KFOLD_REGS == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def test_pair_features_by_hand() -> None:
    u = np.array([[1.0, -2.0]])
    v = np.array([[3.0, 1.0]])
    assert pair_features(u, v).tolist() == [[2.0, 3.0, 3.0, -2.0]]
    assert pair_features(u, v, "full").tolist() == [[1.0, -2.0, 3.0, 1.0, 2.0, 3.0, 3.0, -2.0]]
    with pytest.raises(ValueError):
        pair_features(u, v, "concat")


# --------------------------------------------------------------------------- end to end, known answer

KEYWORDS = ["good", "bad", "fact", "opinion", "abbr", "desc", "enty", "hum", "loc", "num"]
FILLER = "the a of film it was and this movie very".split()


def write_tiny_senteval(folder: Path, per_class: int = 24) -> Path:
    """Every transfer task in SentEval layout; each label is given away by one keyword."""
    rng = np.random.default_rng(0)

    def sent(word: str) -> str:
        words = list(rng.choice(FILLER, size=4)) + [word]
        rng.shuffle(words)
        return " ".join(words)

    def lines(word: str, n: int = per_class) -> str:
        return "".join(sent(word) + " \n" for _ in range(n))

    for task, folder_name, files in [
        ("MR", "MR", ("rt-polarity.pos", "rt-polarity.neg")),
        ("CR", "CR", ("custrev.pos", "custrev.neg")),
        ("SUBJ", "SUBJ", ("subj.objective", "subj.subjective")),
        ("MPQA", "MPQA", ("mpqa.pos", "mpqa.neg")),
    ]:
        (folder / folder_name).mkdir(parents=True)
        words = ("fact", "opinion") if task == "SUBJ" else ("good", "bad")
        for name, word in zip(files, words, strict=True):
            (folder / folder_name / name).write_text(lines(word), encoding="utf-8")
    sst = folder / "SST" / "binary"
    sst.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        rows = [f"{sent(w)}\t{label}\n" for _ in range(per_class) for w, label in (("good", 1), ("bad", 0))]
        (sst / f"sentiment-{split}").write_text("".join(rows), encoding="utf-8")
    (folder / "TREC").mkdir()
    coarse = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    for name, n in (("train_5500.label", per_class), ("TREC_10.label", 5)):
        rows = [f"{c}:x {sent(c.lower())}\n" for _ in range(n) for c in coarse]
        (folder / "TREC" / name).write_bytes("".join(rows).encode("latin-1"))
    (folder / "MRPC").mkdir()
    for name in ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt"):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"]
        for i in range(per_class):
            a = sent(KEYWORDS[i % 10])
            rows.append(f"1\t{i}\t{i}\t{a}\t{a}\n")
            rows.append(f"0\t{i}\t{i}\t{a}\t{sent(KEYWORDS[(i + 3) % 10])}\n")
        (folder / "MRPC" / name).write_text("".join(rows), encoding="utf-8")
    return folder


def keyword_encoder(texts: list[str]) -> torch.Tensor:
    """One feature per keyword: present or not. Every task is separable on it."""
    return torch.tensor([[float(k in t.split()) for k in KEYWORDS] for t in texts])


def test_keyword_encoder_scores_100_on_every_task(tmp_path: Path) -> None:
    folder = write_tiny_senteval(tmp_path / "senteval")
    calls: list[int] = []

    def encode(texts: list[str]) -> torch.Tensor:
        calls.append(len(texts))
        return keyword_encoder(texts)

    results = TransferEvaluator(folder, kfold=3, batch_size=16)(encode)
    for name in TRANSFER_TASKS:
        assert results[name] == 100.0, (name, results)
        assert results[f"{name}/devacc"] == 100.0
    assert results["MRPC/f1"] == 100.0 and results["avg"] == 100.0
    assert max(calls) <= 16  # encoded in batches of batch_size
    table = format_transfer_table(results)
    assert table.splitlines()[0].split() == ["MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC", "Avg."]
    assert table.splitlines()[1].split() == ["100.00"] * 8

    # A constant encoder learns nothing: the majority class on balanced MR is 50%.
    flat = TransferEvaluator(folder, tasks=["MR"], kfold=3)(lambda texts: torch.ones(len(texts), 4))
    assert flat["MR"] == 50.0 and "avg" not in flat


def test_max_train_samples_subsamples_training_data_only(tmp_path: Path) -> None:
    folder = write_tiny_senteval(tmp_path / "senteval")
    ev = TransferEvaluator(folder, tasks=["MR", "TREC"], kfold=3, max_train_samples=30)
    assert len(ev.tasks["MR"].splits["all"][0]) == 30
    assert len(ev.tasks["TREC"].splits["train"][0]) == 30 and len(ev.tasks["TREC"].splits["test"][0]) == 30


def test_cli_transfer_on_tiny_model(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_tiny_senteval(tmp_path / "senteval")
    out = tmp_path / "transfer.json"
    rc = main(["transfer", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(folder), "--kfold", "3", "--json", str(out)])
    assert rc == 0
    results = json.loads(out.read_text())
    assert set(TRANSFER_TASKS) | {"avg", "MRPC/f1"} <= set(results)
    assert all(0.0 <= results[t] <= 100.0 for t in TRANSFER_TASKS)
    assert "MPQA" in capsys.readouterr().out
    assert main(["transfer", str(tiny_model_dir), "--data-dir", str(tmp_path / "missing")]) == 2
