"""SentEval transfer tasks: a logistic-regression probe on frozen sentence embeddings.

The seven tasks of the SimCSE paper's appendix (Table B.1), read by
:func:`~simcse_kit.evaluation.transfer_readers.load_transfer_task` and scored as SentEval's
scikit-learn path does (``senteval/tools/validation.py``):

=======  ============================  =========================================
task     data                          protocol
=======  ============================  =========================================
MR       rt-polarity.{pos,neg}         nested k-fold: outer k folds for test,
CR       custrev.{pos,neg}             inner k folds on each outer train part to
SUBJ     subj.{subjective,objective}   pick C (``InnerKFoldClassifier``)
MPQA     mpqa.{pos,neg}
SST2     SST/binary sentiment-*        C picked on dev, scored on test (``SplitClassifier``)
TREC     train_5500 / TREC_10 (6       C picked by k-fold CV on train, scored on
         coarse classes)               test (``KFoldClassifier``)
MRPC     msr_paraphrase_{train,test}   as TREC, on pair features; accuracy and F1
=======  ============================  =========================================

C grids are SentEval's: ``2^-2 .. 2^3`` for the nested and split protocols,
``2^-1 .. 2^5`` for k-fold-then-test; folds are ``StratifiedKFold(shuffle=True,
random_state=1111)``; the classifier is ``LogisticRegression(C, random_state=1111)``.
Scores are accuracy x 100 rounded to 2 decimals, as SentEval reports them.

Where this differs from SentEval, on purpose:
  * files are decoded as UTF-8, falling back to Latin-1 for a file that is not UTF-8
    (SentEval reads most as Latin-1, which turns any UTF-8 character into two);
  * blank lines in the MR/CR/SUBJ/MPQA files are skipped (SentEval keeps them as empty
    samples: 4 in CR, 3 in MPQA), so CR has 3771 and MPQA 10603 sentences;
  * LogisticRegression runs scikit-learn's current default solver (lbfgs) with
    ``max_iter=1000``, not the liblinear default of the scikit-learn SentEval was
    written against; the SimCSE paper itself used SentEval's PyTorch logistic
    regression, so absolute numbers may differ by a few tenths.
  * MRPC features default to SentEval's ``[|u - v|, u * v]``; ``mrpc_features="full"``
    gives ``[u, v, |u - v|, u * v]`` (the InferSent/SNLI form).
  * each sentence vector is L2-normalised before the probe (``normalize=False``: as
    encoded, SentEval's setting). A sentence-transformers model that ends with
    ``Normalize`` gives unit vectors and the same weights without it (a simcse-kit run's
    folder) do not; the probe's fixed C grid regularises the two differently, so the
    same weights scored 82.98 raw and 83.10 unit on the average (all-MiniLM-L6-v2,
    5 folds). Unit vectors are the one treatment every ``encode`` can be given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from simcse_kit.evaluation.encoding import Encode, encode_once
from simcse_kit.evaluation.transfer_readers import TRANSFER_TASKS, TransferTask, load_transfer_task

__all__ = [
    "KFOLD_REGS",
    "NESTED_REGS",
    "TransferEvaluator",
    "kfold_then_test",
    "nested_kfold",
    "pair_features",
    "split_validation",
]

logger = logging.getLogger(__name__)

SEED = 1111  # SentEval's fixed seed for folds and classifiers
NESTED_REGS = tuple(2.0**t for t in range(-2, 4))  # InnerKFoldClassifier / SplitClassifier
KFOLD_REGS = tuple(2.0**t for t in range(-1, 6))  # KFoldClassifier


# --------------------------------------------------------------------------- probes


def _classifier(c: float, seed: int) -> LogisticRegression:
    return LogisticRegression(C=c, random_state=seed, max_iter=1000)


def _accuracy(c: float, seed: int, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    return float(_classifier(c, seed).fit(x_train, y_train).score(x_test, y_test))


def nested_kfold(
    x: np.ndarray, y: np.ndarray, kfold: int = 10, regs: Sequence[float] = NESTED_REGS, seed: int = SEED
) -> tuple[float, float]:
    """SentEval's ``InnerKFoldClassifier``: outer ``kfold`` folds give the test scores;
    on each outer training part an inner ``kfold``-fold CV picks C.

    Args:
        x: ``[N, F]`` features.
        y: ``[N]`` integer labels.

    Returns:
        ``(dev, test)``: mean best inner CV accuracy and mean outer test accuracy, x 100.
    """
    outer = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed)
    inner = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed)
    dev, test = [], []
    for train_idx, test_idx in outer.split(x, y):
        x_tr, y_tr = x[train_idx], y[train_idx]
        scores = []
        for c in regs:
            accs = [_accuracy(c, seed, x_tr[a], y_tr[a], x_tr[b], y_tr[b]) for a, b in inner.split(x_tr, y_tr)]
            scores.append(round(100 * float(np.mean(accs)), 2))
        best = int(np.argmax(scores))
        dev.append(scores[best])
        test.append(round(100 * _accuracy(regs[best], seed, x_tr, y_tr, x[test_idx], y[test_idx]), 2))
    return round(float(np.mean(dev)), 2), round(float(np.mean(test)), 2)


def kfold_then_test(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    kfold: int = 10,
    regs: Sequence[float] = KFOLD_REGS,
    seed: int = SEED,
) -> tuple[float, float, np.ndarray]:
    """SentEval's ``KFoldClassifier``: C by ``kfold``-fold CV on train, then one fit on
    all of train scored on test.

    Returns:
        ``(dev, test, predictions)``: best CV accuracy x 100, test accuracy x 100, and
        the ``[N_test]`` test predictions.
    """
    folds = StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed)
    scores = []
    for c in regs:
        accs = [_accuracy(c, seed, x_train[a], y_train[a], x_train[b], y_train[b]) for a, b in folds.split(x_train, y_train)]
        scores.append(round(100 * float(np.mean(accs)), 2))
    best = int(np.argmax(scores))
    clf = _classifier(regs[best], seed).fit(x_train, y_train)
    return scores[best], round(100 * float(clf.score(x_test, y_test)), 2), clf.predict(x_test)


def split_validation(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_dev: np.ndarray,
    y_dev: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    regs: Sequence[float] = NESTED_REGS,
    seed: int = SEED,
) -> tuple[float, float]:
    """SentEval's ``SplitClassifier``: C by dev accuracy, then test accuracy (x 100)."""
    scores = [round(100 * _accuracy(c, seed, x_train, y_train, x_dev, y_dev), 2) for c in regs]
    best = int(np.argmax(scores))
    return scores[best], round(100 * _accuracy(regs[best], seed, x_train, y_train, x_test, y_test), 2)


def pair_features(u: np.ndarray, v: np.ndarray, kind: str = "senteval") -> np.ndarray:
    """Sentence-pair features: ``"senteval"`` ``[|u - v|, u * v]`` (``[N, 2D]``, SentEval's
    MRPC) or ``"full"`` ``[u, v, |u - v|, u * v]`` (``[N, 4D]``)."""
    if kind == "senteval":
        return np.concatenate([np.abs(u - v), u * v], axis=1)
    if kind == "full":
        return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)
    raise ValueError(f"pair features must be 'senteval' or 'full', got {kind!r}")


# --------------------------------------------------------------------------- evaluator


def _subsample(texts: list[str], labels: np.ndarray, n: int | None, seed: int) -> tuple[list[str], np.ndarray]:
    """A stratified-in-expectation random ``n`` of a split (all of it when ``n`` is None)."""
    if n is None or n >= len(texts):
        return texts, labels
    keep = np.sort(np.random.default_rng(seed).permutation(len(texts))[:n])
    return [texts[i] for i in keep], labels[keep]


class TransferEvaluator:
    """Runs the SentEval transfer tasks on an ``encode(list[str]) -> [N, D]`` callable.

    Data are read and checked when the evaluator is built. Each split's distinct
    sentences are encoded once (:func:`~simcse_kit.evaluation.encoding.encode_once`).

    Args:
        data_dir: SentEval-layout folder (``../shared/data/senteval``).
        tasks: subset of :data:`~simcse_kit.evaluation.transfer_readers.TRANSFER_TASKS` (default all seven).
        kfold: folds for the nested and k-fold protocols (SentEval: 10; its
            "prototyping" setting: 5).
        batch_size: sentences per ``encode`` call.
        max_train_samples: keep at most this many examples of each task's training
            data (``all`` for the nested tasks), for quick runs; None: all of it.
        mrpc_features: ``"senteval"`` or ``"full"`` (see :func:`pair_features`).
        seed: folds, classifier and subsampling seed (SentEval: 1111).
        normalize: probe unit vectors (see the module notes); False: the vectors as encoded.
    """

    primary_metric = "avg"

    def __init__(
        self,
        data_dir: str | Path,
        tasks: Sequence[str] | None = None,
        kfold: int = 10,
        batch_size: int = 128,
        max_train_samples: int | None = None,
        mrpc_features: str = "senteval",
        seed: int = SEED,
        normalize: bool = True,
    ) -> None:
        names = list(TRANSFER_TASKS if tasks is None else tasks)
        unknown = [t for t in names if t not in TRANSFER_TASKS]
        if unknown:
            raise KeyError(f"unknown transfer task(s) {unknown}; known: {list(TRANSFER_TASKS)}")
        if kfold < 2:
            raise ValueError(f"kfold must be >= 2, got {kfold}")
        pair_features(np.zeros((1, 1)), np.zeros((1, 1)), mrpc_features)  # validate the choice early
        self.kfold, self.batch_size, self.seed, self.mrpc_features = kfold, batch_size, seed, mrpc_features
        self.normalize = normalize
        self.tasks: dict[str, TransferTask] = {}
        for name in names:
            task = load_transfer_task(data_dir, name)
            first = "all" if task.protocol == "nested" else "train"
            task.splits[first] = _subsample(*task.splits[first], max_train_samples, seed)
            self.tasks[name] = task

    def _embed(self, encode: Encode, texts: Sequence[str]) -> np.ndarray:
        """``[N, D]`` float64 embeddings of ``texts`` (unit length if ``normalize``), each distinct text encoded once,
        batched as every evaluator batches (:mod:`simcse_kit.evaluation.encoding`)."""
        x = encode_once(encode, texts, self.batch_size).of(texts).astype(np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) if self.normalize else x

    def _features(self, encode: Encode, task: TransferTask, split: str) -> tuple[np.ndarray, np.ndarray]:
        texts, labels = task.splits[split]
        if not task.paired:
            return self._embed(encode, texts), labels
        a, b = task.pairs(texts)
        return pair_features(self._embed(encode, a), self._embed(encode, b), self.mrpc_features), labels

    def __call__(self, encode: Encode) -> dict[str, float]:
        """Accuracy x 100 per task under its name, ``<task>/devacc``, ``MRPC/f1``, and
        ``avg`` over the seven accuracies when all ran."""
        results: dict[str, float] = {}
        for name, task in self.tasks.items():
            start = time.perf_counter()
            if task.protocol == "nested":
                dev, test = nested_kfold(*self._features(encode, task, "all"), kfold=self.kfold, seed=self.seed)
            elif task.protocol == "split":
                (x_tr, y_tr), (x_dev, y_dev), (x_te, y_te) = (self._features(encode, task, s) for s in ("train", "dev", "test"))
                dev, test = split_validation(x_tr, y_tr, x_dev, y_dev, x_te, y_te, seed=self.seed)
            else:
                x_tr, y_tr = self._features(encode, task, "train")
                x_te, y_te = self._features(encode, task, "test")
                dev, test, pred = kfold_then_test(x_tr, y_tr, x_te, y_te, kfold=self.kfold, seed=self.seed)
                if name == "MRPC":
                    results["MRPC/f1"] = round(100 * float(f1_score(y_te, pred)), 2)
            results[name], results[f"{name}/devacc"] = test, dev
            logger.info("%s: %.2f (dev %.2f, %.1fs)", name, test, dev, time.perf_counter() - start)
        if all(t in results for t in TRANSFER_TASKS):
            results["avg"] = round(float(np.mean([results[t] for t in TRANSFER_TASKS])), 2)
        return results
