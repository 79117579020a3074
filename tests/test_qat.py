"""Quantization-aware training: the straight-through codes equal sentence-transformers'
``quantize_embeddings``; the loss and its gradients equal a naive per-pair loop; the
objective's term in every mode, with Matryoshka, GradCache; the config keys."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers.util import quantize_embeddings
from test_gradcache import assert_grads_equal, grads, make_batch, make_model
from test_objectives import CASES, TAU, reference
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig
from simcse_kit.core import quantization
from simcse_kit.core.batch import split_views
from simcse_kit.errors import ConfigError
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.objectives import SimCSEObjective


def st_codes(x: torch.Tensor, target: str, ranges: torch.Tensor | None = None) -> torch.Tensor:
    """sentence-transformers' codes as the vectors scored: int8 as numbers, binary as +-1 signs."""
    if target == "int8":
        assert ranges is not None
        return torch.from_numpy(quantize_embeddings(x.detach().numpy(), "int8", ranges=ranges.numpy()).astype(np.float64))
    bits = np.unpackbits(quantize_embeddings(x.detach().numpy(), "ubinary"), axis=-1)[:, : x.shape[1]]
    return torch.from_numpy(bits.astype(np.float64) * 2 - 1)


def int8_steps(ranges: torch.Tensor) -> torch.Tensor:
    steps = (ranges[1].float() - ranges[0].float()) / 255  # fp32, as sentence-transformers
    return torch.where(steps == 0, torch.ones_like(steps), steps)


@pytest.mark.parametrize("target", quantization.TARGETS)
def test_straight_through_codes_and_gradient(target: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 13, generator=g)
    ranges = quantization.batch_ranges(x[:10])  # rows 10.. fall partly outside: clipped codes
    x.requires_grad_(True)
    codes = quantization.straight_through(x, target, ranges)
    assert torch.equal(codes.detach().double(), st_codes(x, target, ranges))  # the same codes, bit for bit
    weights = torch.randn(20, 13, generator=g)
    (codes * weights).sum().backward()
    # Straight through: the identity for signs, 1 / step for int8 codes (clipped ones too).
    want = weights if target == "binary" else weights / int8_steps(ranges)
    torch.testing.assert_close(x.grad, want)


def naive_qat_loss(codes_a: torch.Tensor, codes_c: torch.Tensor, tau: float) -> torch.Tensor:
    """InfoNCE over cosines of the codes, one anchor and one candidate at a time (anchor i's positive: candidate i)."""
    total = torch.zeros((), dtype=torch.float64)
    for i in range(len(codes_a)):
        sims = [torch.dot(codes_a[i], c) / (codes_a[i].norm() * c.norm()) / tau for c in codes_c]
        total = total - (sims[i] - torch.logsumexp(torch.stack(sims), dim=0))
    return total / len(codes_a)


@pytest.mark.parametrize("target", quantization.TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantized_loss_and_gradients_equal_naive_loop(target: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(6, 16, generator=g, dtype=dtype, requires_grad=True)
    c = torch.randn(6, 16, generator=g, dtype=dtype, requires_grad=True)
    ranges = quantization.batch_ranges(c)
    idx = torch.arange(6)
    loss = quantization.quantized_contrastive_loss(a, c, target, temperature=0.5, positive_index=idx)  # default ranges: c's
    loss.backward()
    # Reference: the loss of sentence-transformers' codes, differentiated by autograd with
    # respect to the codes, then carried to the embeddings by d code / dx (1, or 1 / step).
    codes_a = st_codes(a, target, ranges).requires_grad_(True)
    codes_c = st_codes(c, target, ranges).requires_grad_(True)
    want = naive_qat_loss(codes_a, codes_c, 0.5)
    want.backward()
    scale = torch.ones(16, dtype=torch.float64) if target == "binary" else 1 / int8_steps(ranges).double()
    tol = {"rtol": 1e-4, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-12}
    assert loss.item() == pytest.approx(want.item(), rel=tol["rtol"])
    torch.testing.assert_close(a.grad.double(), codes_a.grad * scale, **tol)
    torch.testing.assert_close(c.grad.double(), codes_c.grad * scale, **tol)
    assert a.grad.abs().sum() > 0 and math.isfinite(loss.item())


@pytest.mark.parametrize(("mode", "unsup_loss", "alpha"), CASES)
@pytest.mark.parametrize("target", quantization.TARGETS)
def test_objective_adds_the_quantized_term_in_every_mode(mode: str, unsup_loss: str, alpha: float, target: str) -> None:
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(15 if mode == "hardneg" else 10, 8, generator=g, dtype=torch.float64)
    base = {"temperature": TAU, "unsup_loss": unsup_loss, "hard_negative_weight": alpha}
    cfg = LossConfig(**base, quantization=target, quantization_weight=0.3, matryoshka_dims=[8, 4], matryoshka_weights=[1, 2])
    got = SimCSEObjective(mode, cfg).loss(emb).item()
    # The int8 ranges are the candidates': every row in the all-rows form, else views 1.. .
    v = {"unsup": 2, "sup": 2, "hardneg": 3}[mode]
    rows = emb if (mode == "unsup" and unsup_loss == "views") else torch.cat(split_views(emb, v)[1:])
    ranges = quantization.batch_ranges(rows)
    codes = st_codes(emb, target, ranges)
    want = sum(
        w * (reference(mode, emb[:, :d], alpha, unsup_loss) + 0.3 * reference(mode, codes[:, :d], alpha, unsup_loss))
        for d, w in ((8, 1.0), (4, 2.0))
    )
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("mode", "target"), [("unsup", "binary"), ("hardneg", "int8"), ("sup", "binary")])
def test_gradcache_gives_the_full_batch_gradients(tiny_model_dir: Path, mode: str, target: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = LossConfig(temperature=TAU, quantization=target, matryoshka_dims=[32, 16])
    objective = SimCSEObjective(mode, cfg)
    batch = make_batch(tokenizer, mode, 8)
    model = make_model(tiny_model_dir, "cls", "train", dropout=0.0)
    if target == "int8":
        # An int8 code is a step function: the last-bit differences between a chunk's forward
        # and the full batch's (padding) can move a value across a bucket edge in fp32. In
        # fp64 they are ~1e-16, far below any edge's distance here.
        model = model.double()
    full = objective.step(model, batch)
    assert set(objective.metrics()) == {"float_loss", "quantized_loss"}
    want = grads(model)
    model.zero_grad(set_to_none=True)
    cached = GradCacheStep(objective, 4)(model, batch)
    assert cached.item() == pytest.approx(full.item(), abs=1e-5)
    assert_grads_equal(grads(model), want, atol=1e-5)


def test_config_keys(tiny_run) -> None:  # noqa: ANN001 - conftest's TinyRun
    cfg = tiny_run.config("q", quantization="binary", quantization_weight="0.5")
    assert cfg.loss.quantization == "binary" and cfg.loss.quantization_weight == 0.5
    with pytest.raises(ConfigError, match=r"'loss.quantization' = 'int4': must be 'int8' or 'binary'"):
        tiny_run.config("b", quantization="int4")
    with pytest.raises(ConfigError, match="'loss.quantization_weight' = 0.0"):
        tiny_run.config("w", quantization="int8", quantization_weight="0")
    with pytest.raises(ValueError, match="score_loss at weight 1 leaves none"):
        SimCSEObjective("scored", LossConfig(quantization="binary"))
