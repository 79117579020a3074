"""Tests for simcse_kit.evaluation.transfer: the probes against a loop written from
SentEval's validation.py, and an end-to-end known answer (readers: test_evaluation_readers)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from simcse_kit.cli import main
from simcse_kit.evaluation import TRANSFER_COLUMNS, TRANSFER_TASKS, TransferEvaluator, format_table, load_transfer_task
from simcse_kit.evaluation.transfer import (
    KFOLD_REGS,
    NESTED_REGS,
    kfold_then_test,
    nested_kfold,
    pair_features,
    split_validation,
)
from simcse_kit.model.inference import load_encoder

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
    lengths: list[list[int]] = []

    def encode(texts: list[str]) -> torch.Tensor:
        calls.append(len(texts))
        lengths.append([len(t) for t in texts])
        return keyword_encoder(texts)

    results = TransferEvaluator(folder, kfold=3, batch_size=16)(encode)
    for name in TRANSFER_TASKS:
        assert results[name] == 100.0, (name, results)
        assert results[f"{name}/devacc"] == 100.0
    assert results["MRPC/f1"] == 100.0 and results["avg"] == 100.0
    assert max(calls) <= 16  # encoded in batches of batch_size
    # Batched longest first, as every evaluator batches: each batch pads to its own first sentence.
    # (Alphabetical batches, before 2026-12, padded each to the longest of a random 16.)
    assert all(batch == sorted(batch, reverse=True) for batch in lengths)
    # Each split's distinct texts once (MRPC: each side of its pairs).
    folder_texts = {t: load_transfer_task(folder, t) for t in TRANSFER_TASKS}
    distinct = 0
    for task in folder_texts.values():
        for texts, _ in task.splits.values():
            distinct += sum(len(set(side)) for side in task.pairs(texts)) if task.paired else len(set(texts))
    assert sum(calls) == distinct
    table = format_table(results, TRANSFER_COLUMNS)
    assert table.splitlines()[0].split() == ["MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC", "Avg."]
    assert table.splitlines()[1].split() == ["100.00"] * 8

    # A constant encoder learns nothing: the majority class on balanced MR is 50%.
    flat = TransferEvaluator(folder, tasks=["MR"], kfold=3)(lambda texts: torch.ones(len(texts), 4))
    assert flat["MR"] == 50.0 and "avg" not in flat


def test_probe_takes_unit_vectors_so_a_final_normalize_changes_nothing(tmp_path: Path) -> None:
    """The same encoder with and without a final ``Normalize`` (here: each text's vector scaled by its own factor)
    scores alike by default; probed as encoded (``normalize=False``) the scales change the scores."""
    folder = write_tiny_senteval(tmp_path / "senteval")

    def noisy(texts: list[str]) -> torch.Tensor:
        # Keyword features drowned in per-text noise, so the probe is not at 100 and the C grid matters.
        rng = [np.random.default_rng(zlib.crc32(t.encode())) for t in texts]
        return keyword_encoder(texts) + torch.tensor(np.stack([1.5 * r.normal(size=len(KEYWORDS)) for r in rng]))

    def scaled(texts: list[str]) -> torch.Tensor:
        scale = [0.05 + 20 * (zlib.crc32(t[::-1].encode()) % 1000) / 1000 for t in texts]
        return noisy(texts) * torch.tensor(scale, dtype=torch.float64)[:, None]

    tasks = ["MR", "SUBJ", "TREC", "MRPC"]
    unit = TransferEvaluator(folder, tasks=tasks, kfold=3)
    assert unit(scaled) == unit(noisy)
    assert any(unit(noisy)[t] < 100.0 for t in tasks)
    raw = TransferEvaluator(folder, tasks=tasks, kfold=3, normalize=False)
    assert raw(scaled) != raw(noisy)
    # Unit vectors as encoded: probing them raw is probing them normalised.
    unit_encode = lambda texts: torch.nn.functional.normalize(noisy(texts), dim=-1)  # noqa: E731
    assert raw(unit_encode) == unit(noisy)


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
    # --no-normalize reaches the probe: the scores are the evaluator's on the vectors as encoded.
    raw = tmp_path / "raw.json"
    argv = ["transfer", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(folder), "--tasks", "MR", "TREC"]
    assert main([*argv, "--kfold", "3", "--no-normalize", "--json", str(raw)]) == 0
    encode = load_encoder(str(tiny_model_dir), pooler="avg").encode
    for normalize in (True, False):
        want = TransferEvaluator(folder, tasks=["MR", "TREC"], kfold=3, normalize=normalize)(encode)
        assert (json.loads(raw.read_text()) == want) is not normalize
    assert main(["transfer", str(tiny_model_dir), "--data-dir", str(tmp_path / "missing")]) == 2
