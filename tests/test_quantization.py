"""Quantized vectors: parity with sentence-transformers' ``quantize_embeddings``, the faiss
Hamming search against a numpy reference (plain and rescored), the calibration file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers.util import quantize_embeddings
from sentence_transformers.util.quantization import semantic_search_faiss

from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.quantization import (
    PRECISIONS,
    VectorPrecision,
    calibration_from,
    calibration_ranges,
    comparable,
    hamming_search,
    quantize,
    read_ranges,
    rescored_search,
    write_quantization,
)
from simcse_kit.evaluation.search import exact_search

pytest.importorskip("faiss")


def vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dim", [384, 13])  # 13: packed bits padded to a whole byte
def test_quantize_equals_sentence_transformers(precision: str, dim: int) -> None:
    calib, x = vectors(200, dim, 1), vectors(50, dim, 2) * 1.3  # some values outside the ranges: clipped
    ranges = calibration_ranges(calib)
    ours = quantize(x, precision, ranges if precision.endswith("int8") else None)
    theirs = quantize_embeddings(x, precision, calibration_embeddings=calib)  # their own range computation
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    assert np.array_equal(quantize(torch.from_numpy(x), precision, ranges), ours)


def test_ranges_are_per_dimension_min_max() -> None:
    calib = np.array([[0.5, -1.0], [-0.25, 2.0], [0.0, 0.0]], dtype=np.float32)
    assert np.array_equal(calibration_ranges(calib), [[-0.25, -1.0], [0.5, 2.0]])
    # 255 steps of (0.5 + 0.25) / 255: 0.5 is bucket 255 -> int8 127; -0.25 is 0 -> -128.
    codes = quantize(np.array([[0.5, -1.0], [-0.25, 2.0]], dtype=np.float32), "int8", calibration_ranges(calib))
    assert codes.tolist() == [[127, -128], [-128, 127]]
    with pytest.raises(ValueError, match="at least 2"):
        calibration_ranges(calib[:1])
    with pytest.raises(ValueError, match="needs calibration ranges"):
        quantize(calib, "int8")


def test_comparable_binary_is_d_minus_twice_hamming() -> None:
    x, y = vectors(7, 21, 3), vectors(5, 21, 4)
    for precision in ("binary", "ubinary"):
        a = comparable(quantize(x, precision), precision, 21)
        b = comparable(quantize(y, precision), precision, 21)
        hamming = ((x[:, None, :] > 0) != (y[None, :, :] > 0)).sum(-1)
        assert np.array_equal(a @ b.T, 21 - 2 * hamming)
    codes = quantize(x, "int8", calibration_ranges(y))
    assert np.array_equal(comparable(codes, "int8", 21), codes.astype(np.float32))


def numpy_hamming(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
    """Naive reference: Hamming distance of every query bit vector to every document one."""
    qb, cb = queries > 0, corpus > 0
    return np.array([[int((q != c).sum()) for c in cb] for q in qb])


def test_hamming_search_equals_numpy_reference() -> None:
    queries, corpus = vectors(30, 24, 5), vectors(400, 24, 6)  # 24 bits: many ties
    distances, indices = hamming_search(quantize(queries, "ubinary"), quantize(corpus, "ubinary"), 10)
    ref = numpy_hamming(queries, corpus)
    for row in range(len(queries)):
        assert np.array_equal(distances[row], np.sort(ref[row])[:10])
        assert np.array_equal(ref[row, indices[row]], distances[row])  # each hit is at its distance
        assert len(set(indices[row].tolist())) == 10


def test_rescored_search_equals_numpy_reference_and_sentence_transformers() -> None:
    queries, corpus = vectors(40, 256, 7), vectors(300, 256, 8)
    codes = quantize(corpus, "ubinary")
    scores, indices = rescored_search(queries, codes, 5, 20, 256)
    ref = numpy_hamming(queries, corpus)
    bits = (corpus > 0).astype(np.float64)
    compared = 0
    for row in range(len(queries)):
        # The candidates: the 20 nearest by Hamming distance, assumed free of ties at the cut.
        cut = np.sort(ref[row])[19]
        if (ref[row] == cut).sum() != (np.sort(ref[row])[:20] == cut).sum():
            continue  # tie at the 20th place: faiss may keep either; the rows compared below avoid it
        candidates = np.flatnonzero(ref[row] <= cut)
        rescored = bits[candidates] @ queries[row].astype(np.float64)
        best = candidates[np.argsort(-rescored, kind="stable")[:5]]
        assert set(indices[row].tolist()) == set(best.tolist())
        np.testing.assert_allclose(np.sort(scores[row])[::-1], np.sort(rescored)[::-1][:5], rtol=1e-5)
        compared += 1
    assert compared >= 10
    # sentence-transformers' own rescoring of a ubinary corpus: top_k 5, 4 x oversampling = 20 candidates.
    theirs, _ = semantic_search_faiss(queries, corpus_embeddings=codes, corpus_precision="ubinary", top_k=5, rescore_multiplier=4)
    for row, hits in enumerate(theirs):
        assert [h["corpus_id"] for h in hits] == indices[row].tolist()
        np.testing.assert_allclose([h["score"] for h in hits], scores[row], rtol=1e-5)


def test_vector_precision_search_modes() -> None:
    queries, corpus = vectors(12, 32, 9), vectors(80, 32, 10)
    ranges = calibration_ranges(corpus)
    # int8: the exact cosine search over the codes as floats.
    s, i = VectorPrecision("int8", ranges).search(queries, corpus, 5, exact_search, "cpu")
    q8 = quantize(queries, "int8", ranges).astype(np.float64)
    c8 = quantize(corpus, "int8", ranges).astype(np.float64)
    cos = (q8 / np.linalg.norm(q8, axis=1, keepdims=True)) @ (c8 / np.linalg.norm(c8, axis=1, keepdims=True)).T
    np.testing.assert_allclose(s.numpy(), np.sort(cos, axis=1)[:, ::-1][:, :5], atol=1e-6)
    # binary without rescoring: scores D - 2 * hamming, best first.
    s, i = VectorPrecision("binary").search(queries, corpus, 5, exact_search, "cpu")
    ref = numpy_hamming(queries, corpus)
    assert np.array_equal(s.numpy(), 32 - 2 * np.sort(ref, axis=1)[:, :5])
    assert np.array_equal(np.take_along_axis(ref, i.numpy(), 1), np.sort(ref, axis=1)[:, :5])
    with pytest.raises(ConfigError, match="needs calibration ranges"):
        VectorPrecision("uint8")
    with pytest.raises(ConfigError, match="--rescore"):
        VectorPrecision("int8", ranges, rescore=10)


def test_truncated_precision_uses_the_prefix_ranges() -> None:
    calib, x = vectors(100, 48, 11), vectors(9, 48, 12)
    full = VectorPrecision("int8", calibration_ranges(calib))
    # Ranges of the prefix == prefix of the ranges, so a 16-dim Matryoshka cut needs no recalibration.
    assert np.array_equal(full.truncated(16).scored(x[:, :16]), quantize(x[:, :16], "int8", calibration_ranges(calib[:, :16])))
    with pytest.raises(ConfigError, match="cover 48 dimensions"):
        full.scored(x[:, :16])


def test_quantization_file_round_trip(tmp_path: Path) -> None:
    ranges = calibration_ranges(vectors(30, 10, 13))
    write_quantization(tmp_path / "quantization.json", ranges, 30, "training sentences", True)
    assert np.array_equal(read_ranges(tmp_path / "quantization.json"), ranges)  # float32 exact through JSON
    data = json.loads((tmp_path / "quantization.json").read_text())
    assert data["dim"] == 10 and data["calibration"] == {"sentences": 30, "source": "training sentences"}
    (tmp_path / "bad.json").write_text('{"ranges": {"min": [1]}}')
    with pytest.raises(ConfigError, match="bad.json: not a simcse-kit quantization.json"):
        read_ranges(tmp_path / "bad.json")
    # A sentence file is encoded; its ranges are the min/max of the encoded vectors.
    (tmp_path / "calib.txt").write_text("a\nbb\n\nccc\n")
    table = {"a": [0.0, 1.0], "bb": [2.0, -1.0], "ccc": [1.0, 0.5]}
    got = calibration_from(tmp_path / "calib.txt", lambda s: np.array([table[t] for t in s], dtype=np.float32), 2)
    assert got.tolist() == [[0.0, -1.0], [2.0, 1.0]]
    (tmp_path / "one.txt").write_text("a\n")
    with pytest.raises(ConfigError, match="one.txt: needs at least 2"):
        calibration_from(tmp_path / "one.txt", lambda s: np.zeros((len(s), 2)), 2)


# --- evaluate --embedding-precision on a tiny model ----------------------------------------


def test_evaluate_sts_with_quantized_vectors(tmp_path: Path, tiny_model_dir: Path) -> None:
    """STS with int8 codes (cosine of the codes) and binary codes (1 - 2 hamming / D), against
    the task's pairs scored by hand from sentence-transformers' codes."""
    from conftest import toy_sentences, write_tiny_senteval
    from scipy.stats import spearmanr

    from simcse_kit.cli import main
    from simcse_kit.evaluation.sts_readers import load_task
    from simcse_kit.evaluation.suite import default_suite
    from simcse_kit.model.inference import load_encoder

    senteval = write_tiny_senteval(tmp_path / "senteval")
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(toy_sentences(30)) + "\n")
    encode = load_encoder(tiny_model_dir, pooler="avg", device="cpu").encode
    ranges = calibration_ranges(encode(toy_sentences(30)).numpy()[:, :24])
    pairs = load_task(senteval, default_suite()["STSBenchmark"])["test"]

    def spearman(precision: str) -> float:
        a, b = (encode(list(s)).numpy()[:, :24] for s in (pairs.sentences1, pairs.sentences2))
        if precision == "int8":
            a, b = (quantize_embeddings(x, "int8", ranges=ranges).astype(np.float64) for x in (a, b))
            sims = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        else:
            sims = -((a > 0) != (b > 0)).sum(1)  # -hamming
        return 100 * float(spearmanr(sims, pairs.scores).statistic)

    for precision in ("int8", "binary"):
        out = tmp_path / f"{precision}.json"
        args = ["evaluate", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(senteval), "--tasks", "STSBenchmark"]
        args += ["--embedding-precision", precision, "--truncate-dim", "24", "--calibration", str(calib), "--json", str(out)]
        assert main([*args, "--device", "cpu"]) == 0
        assert json.loads(out.read_text())["STSBenchmark"] == pytest.approx(spearman(precision), abs=1e-6)
    assert main(["evaluate", str(tiny_model_dir), "--data-dir", str(senteval), "--embedding-precision", "int8"]) == 2


def test_evaluate_retrieval_binary_rescored(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Retrieval over binary codes: the run equals the numpy Hamming reference, rescored by the float query."""
    from conftest import toy_sentences

    from simcse_kit.evaluation import evaluate_retrieval, write_beir
    from simcse_kit.evaluation.api import Quantized
    from simcse_kit.evaluation.retrieval import RetrievalEvaluator, search_task
    from simcse_kit.model.inference import load_encoder

    sents = toy_sentences(60)
    queries = {f"q{i}": " ".join(sents[i].split()[:3]) for i in range(8)}
    folder = write_beir(
        tmp_path / "toy", {f"d{i}": s for i, s in enumerate(sents)}, queries, {"test": {f"q{i}": {f"d{i}": 1} for i in range(8)}}
    )
    encode = load_encoder(tiny_model_dir, pooler="avg", device="cpu").encode
    evaluator = RetrievalEvaluator([folder])
    evaluator.vectors = VectorPrecision("binary", rescore=20)
    run, q, d = search_task(evaluator.tasks["toy"], encode, k=5, vectors=evaluator.vectors)
    ref = numpy_hamming(q, d)
    bits = (d > 0).astype(np.float64)
    for row, qid in enumerate(sorted(queries, key=lambda x: int(x[1:]))):
        # Ties at the 20th Hamming place leave faiss a choice, so: every hit is among the 20
        # nearest (ties included), scores q . bits, and outscores every sure candidate it beat.
        cut = np.sort(ref[row])[19]
        hits = [int(h[1:]) for h in run[qid]]
        assert len(hits) == 5 and all(ref[row, h] <= cut for h in hits)
        rescored = bits @ q[row].astype(np.float64)
        np.testing.assert_allclose(list(run[qid].values()), rescored[hits], rtol=1e-5)
        sure = [i for i in np.flatnonzero(ref[row] < cut) if i not in hits]
        assert all(rescored[h] >= rescored[i] - 1e-6 for h in hits for i in sure)
    got = evaluate_retrieval(tiny_model_dir, [folder], pooler="avg", device="cpu", quantized=Quantized("binary", rescore=20))
    assert got["toy"] == pytest.approx(evaluator(encode)["toy"])


# --- dev selection on the deployed precision ----------------------------------------------


@pytest.mark.parametrize("precision", ["binary", "int8"])
def test_selection_scores_dev_on_quantized_vectors(tiny_run, precision: str) -> None:  # noqa: ANN001 - conftest's TinyRun
    """``train.selection_precision``: the best model's recorded dev score is STS-B dev of its
    quantized vectors (int8: ranges of the first training sentences), computed here by hand."""
    from conftest import toy_sentences
    from scipy.stats import spearmanr

    from simcse_kit.evaluation import DevEvaluator
    from simcse_kit.model.inference import load_encoder

    # avg pooling: the tiny random BERT's CLS vectors share nearly every sign, which leaves binary codes constant.
    metrics = tiny_run.train(precision, selection_precision=precision, num_epochs=1, pooler="avg", mlp="none")
    best = tiny_run.folder / precision / "best_model"
    meta = json.loads((best / "simcse_config.json").read_text())
    assert metrics["dev_label"] == meta["dev_label"] == f"STS-B dev Spearman x 100 ({precision} vectors)"
    encode = load_encoder(best, device="cpu").encode
    pairs = DevEvaluator(tiny_run.folder / "senteval").pairs
    a, b = (encode(list(s)).numpy() for s in (pairs.sentences1, pairs.sentences2))
    if precision == "int8":
        ranges = calibration_ranges(encode(toy_sentences(64)).numpy())  # the recipe's 64 training sentences
        a, b = (quantize_embeddings(x, "int8", ranges=ranges).astype(np.float64) for x in (a, b))
        sims = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    else:
        sims = -((a > 0) != (b > 0)).sum(1)
    assert meta["dev_score"] == pytest.approx(100 * spearmanr(sims, pairs.scores).statistic, abs=1e-4)
    with pytest.raises(ConfigError, match="'train.selection_precision' = 'int4'"):
        tiny_run.config("bad", selection_precision="int4")


# --- mining with quantized vectors ----------------------------------------------------------


def test_mining_with_binary_vectors_equals_a_hamming_reference() -> None:
    """The hardest negative of each pair by Hamming distance among candidates no closer than
    the positive (margin 0), from a naive loop over sentence-transformers' packed codes."""
    from simcse_kit.tools.mining import mine_hard_negatives

    rng = np.random.default_rng(14)
    texts = [f"s{i}" for i in range(40)]
    table = dict(zip(texts, rng.standard_normal((40, 256)).astype(np.float32), strict=True))
    pairs = [(texts[i], texts[i + 20]) for i in range(20)]
    encode = lambda s: torch.from_numpy(np.stack([table[t] for t in s]))  # noqa: E731
    got = mine_hard_negatives(pairs, encode, range_max=38, precision="binary")  # every candidate ranked
    bits = {t: np.unpackbits(quantize_embeddings(v[None], "ubinary"))[:256] for t, v in table.items()}
    float_got = mine_hard_negatives(pairs, encode, range_max=38)
    checked = 0
    for (a, p), negs in zip(pairs, got, strict=True):
        ham = {t: int((bits[a] != bits[t]).sum()) for t in texts if t not in (a, p)}
        allowed = {t: h for t, h in ham.items() if h >= int((bits[a] != bits[p]).sum())}  # cos <= cos(a, p)
        best = min(allowed.values(), default=None)
        if best is None:
            assert negs is None
            continue
        winners = [t for t, h in allowed.items() if h == best]
        assert negs is not None and negs[0] in winners
        checked += 1
    assert checked >= 10 and got != float_got  # binary codes pick other negatives than the floats
