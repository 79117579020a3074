"""Tests for simcse_kit.evaluation.geometry: alignment and uniformity (Wang & Isola, 2020)
against hand-computed values and naive loops; the trajectory plot; the align-uniform command."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TinyRun, fake_encoder
from scipy.stats import spearmanr

from simcse_kit.evaluation import alignment, pair_alignment_uniformity, plot_trajectory, sts_alignment_uniformity, uniformity


def test_alignment_by_hand() -> None:
    # Orthogonal unit vectors are sqrt(2) apart, identical ones 0: mean squared distance (2 + 0) / 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    assert float(alignment(x, y)) == pytest.approx(1.0)
    assert float(alignment(x, y, alpha=1.0)) == pytest.approx(math.sqrt(2) / 2)
    # Normalised first: lengths do not matter, only directions.
    assert float(alignment(3 * x, 0.5 * y)) == pytest.approx(1.0)
    assert float(alignment(3 * x, 0.5 * y, normalize=False)) == pytest.approx((9 + 0.25 + 0 + 6.25) / 2)
    # Antipodal: distance 2, squared 4 (the maximum).
    assert float(alignment(torch.tensor([[0.0, 2.0]]), torch.tensor([[0.0, -1.0]]))) == pytest.approx(4.0)


def test_uniformity_by_hand() -> None:
    square = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    # 6 pairs: 4 neighbours at squared distance 2, 2 opposites at 4; t = 2.
    expected = math.log((4 * math.exp(-4) + 2 * math.exp(-8)) / 6)
    assert float(uniformity(square)) == pytest.approx(expected, rel=1e-6)
    assert float(uniformity(torch.tensor([[1.0, 0.0], [-5.0, 0.0]]))) == pytest.approx(-8.0)
    assert float(uniformity(torch.tensor([[1.0, 1.0]] * 5))) == pytest.approx(0.0, abs=1e-6)  # collapse
    assert float(uniformity(square, t=1.0)) == pytest.approx(math.log((4 * math.exp(-2) + 2 * math.exp(-4)) / 6), rel=1e-6)


def test_against_naive_loops_fp64() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 5, generator=g, dtype=torch.float64)
    y = torch.randn(9, 5, generator=g, dtype=torch.float64)
    xn = [v / v.norm() for v in x]
    yn = [v / v.norm() for v in y]
    naive_align = sum(float((a - b).norm() ** 2) for a, b in zip(xn, yn, strict=True)) / 9
    pairs = [(i, j) for i in range(9) for j in range(i + 1, 9)]
    naive_unif = math.log(sum(math.exp(-2 * float((xn[i] - xn[j]).norm() ** 2)) for i, j in pairs) / len(pairs))
    assert float(alignment(x, y)) == pytest.approx(naive_align, rel=1e-12)
    assert float(uniformity(x)) == pytest.approx(naive_unif, rel=1e-12)
    assert alignment(x, y).dtype == torch.float64


def test_half_precision_inputs_are_computed_in_fp32_and_differentiable() -> None:
    x = torch.randn(16, 8, dtype=torch.float16, requires_grad=True)
    u = uniformity(x)
    assert u.dtype == torch.float32
    u.backward()
    assert torch.isfinite(x.grad).all()
    ref = uniformity(x.detach().double())
    assert float(u.detach()) == pytest.approx(float(ref), abs=1e-5)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError):
        alignment(torch.zeros(3, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError):
        uniformity(torch.zeros(1, 2))
    with pytest.raises(ValueError):
        pair_alignment_uniformity(torch.eye(2), torch.tensor([0]), torch.tensor([1]), torch.tensor([3.0]))


def test_pair_alignment_uniformity_uses_only_high_score_pairs() -> None:
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [-1.0, 0.0]])
    idx1 = torch.tensor([0, 0, 1])
    idx2 = torch.tensor([2, 1, 3])
    scores = torch.tensor([4.5, 4.0, 1.0])
    out = pair_alignment_uniformity(emb, idx1, idx2, scores, threshold=4.0)
    # Positives (0,2): distance 0 and (0,1): squared distance 2 -> alignment 1; pair (1,3) ignored.
    assert out["alignment"] == pytest.approx(1.0)
    assert out["positive_pairs"] == 2
    # Uniformity over all 4 rows: squared distances 0,2,4 (row0) 2,2 (row1) 4 (row2 vs 3) -> 6 pairs.
    d2 = [2, 0, 4, 2, 2, 4]
    assert out["uniformity"] == pytest.approx(math.log(sum(math.exp(-2 * d) for d in d2) / 6), rel=1e-6)


def test_sts_alignment_uniformity_one_encoding_matches_definitions(data_dir: Path) -> None:
    from simcse_kit.evaluation import read_stsb, stsb_split_path

    pairs = read_stsb(stsb_split_path(data_dir / "senteval", "dev"))
    encode = fake_encoder()
    calls: list[int] = []

    def counting(sentences: list[str]) -> torch.Tensor:
        calls.append(len(sentences))
        return encode(sentences)

    geo = sts_alignment_uniformity(counting, pairs, batch_size=100)
    unique = set(pairs.sentences1) | set(pairs.sentences2)
    assert sum(calls) == len(unique) and max(calls) <= 100  # every distinct sentence encoded exactly once

    # Direct: encode all distinct sentences, then the definitions.
    vocab = sorted(unique)
    emb = encode(vocab)
    row = {s: i for i, s in enumerate(vocab)}
    pos = np.asarray(pairs.scores) >= 4.0
    i1 = torch.tensor([row[s] for s, p in zip(pairs.sentences1, pos, strict=True) if p])
    i2 = torch.tensor([row[s] for s, p in zip(pairs.sentences2, pos, strict=True) if p])
    assert geo["alignment"] == pytest.approx(float(alignment(emb[i1], emb[i2])), rel=1e-5)
    assert geo["uniformity"] == pytest.approx(float(uniformity(emb)), rel=1e-5)
    assert geo["positive_pairs"] == int(pos.sum()) > 100
    cos = [
        float(torch.nn.functional.cosine_similarity(emb[row[a]], emb[row[b]], dim=0))
        for a, b in zip(pairs.sentences1, pairs.sentences2, strict=True)
    ]
    assert geo["spearman"] == pytest.approx(spearmanr(cos, pairs.scores)[0] * 100, abs=1e-4)


def test_plot_trajectory(tmp_path: Path) -> None:
    evals = [{"step": float(s), "stsb_dev": 50.0, "alignment": 0.5 - s / 100, "uniformity": -1.0 - s / 50} for s in (0, 10, 20)]
    path = plot_trajectory(evals, tmp_path / "au.png")
    assert path is not None and path.stat().st_size > 1000
    assert [p.name for p in tmp_path.iterdir()] == ["au.png"]  # no temp file left behind
    assert plot_trajectory([{"step": 1.0, "stsb_dev": 3.0}], tmp_path / "none.png") is None


@pytest.mark.slow
def test_training_logs_alignment_uniformity_and_saves_plot(tiny_run: TinyRun) -> None:
    metrics = tiny_run.train("run", batch_size=16, eval_steps=2, num_epochs=1, save_steps=0)
    evals = metrics["evals"]
    assert [e["step"] for e in evals] == [0.0, 2.0, 4.0]  # the trajectory starts at the base model
    for e in evals:
        assert 0.0 <= e["alignment"] <= 4.0 and -4.0 <= e["uniformity"] <= 0.0
    assert (tiny_run.folder / "run" / "alignment_uniformity.png").stat().st_size > 1000


def test_align_uniform_command(tmp_path: Path, tiny_model_dir: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from simcse_kit.cli import main
    from simcse_kit.evaluation import DevEvaluator
    from simcse_kit.model.inference import load_encoder

    out = tmp_path / "au.json"
    args = ["align-uniform", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(data_dir / "senteval"), "--json", str(out)]
    assert main(args) == 0
    assert "alignment" in capsys.readouterr().out
    got = json.loads(out.read_text())
    dev = DevEvaluator(data_dir / "senteval", batch_size=128)
    ref = dev(load_encoder(tiny_model_dir, pooler="avg").encode)
    # Same batches, same model: the command and the training-time dev evaluator agree exactly.
    assert (got["alignment"], got["uniformity"], got["spearman"]) == (ref["alignment"], ref["uniformity"], ref["stsb_dev"])
    assert got["positive_pairs"] == int((np.asarray(dev.pairs.scores) >= 4).sum())
    # A missing data folder is a user error: one line, status 2, before any model loads.
    assert main(["align-uniform", str(tiny_model_dir), "--pooler", "avg", "--data-dir", str(tmp_path)]) == 2
