"""Matryoshka: the loss over truncated, re-normalised prefixes, in every mode, with the
queue, false-negative masking and GradCache; the config keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gradcache import assert_grads_equal, grads, make_batch, make_model
from test_objectives import CASES, TAU, reference
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig
from simcse_kit.core import losses
from simcse_kit.core.batch import text_ids
from simcse_kit.errors import ConfigError
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.wiring.run import load_checked_tokenizer

DIMS, WEIGHTS = [8, 5, 2], [1.0, 0.5, 2.0]


@pytest.mark.parametrize(("mode", "unsup_loss", "alpha"), CASES)
def test_loss_is_the_weighted_sum_of_per_dimension_losses_by_hand(mode: str, unsup_loss: str, alpha: float) -> None:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(15 if mode == "hardneg" else 10, 8, generator=g, dtype=torch.float64)
    queue = torch.randn(4, 8, generator=g, dtype=torch.float64)
    cfg = LossConfig(
        temperature=TAU, unsup_loss=unsup_loss, hard_negative_weight=alpha, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS
    )
    objective = SimCSEObjective(mode, cfg)
    # reference() normalises each prefix itself (cosines): the re-normalisation.
    by_hand = sum(w * reference(mode, emb[:, :d], alpha, unsup_loss) for d, w in zip(DIMS, WEIGHTS, strict=True))
    assert objective.loss(emb).item() == pytest.approx(by_hand, rel=1e-10)
    with_queue = sum(
        w * reference(mode, emb[:, :d], alpha, unsup_loss, list(queue[:, :d])) for d, w in zip(DIMS, WEIGHTS, strict=True)
    )
    assert objective.loss(emb, queue=(queue, None)).item() == pytest.approx(with_queue, rel=1e-10)
    # Not the full-dimension loss alone: the prefixes change the number.
    assert abs(objective.loss(emb).item() - sum(WEIGHTS) * reference(mode, emb, alpha, unsup_loss)) > 1e-3


def test_default_weights_and_no_dims() -> None:
    g = torch.Generator().manual_seed(1)
    a, c = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    idx = torch.arange(6)
    plain = losses.contrastive_loss(a, c, temperature=TAU, positive_index=idx)
    assert torch.equal(losses.matryoshka_loss(a, c, None, temperature=TAU, positive_index=idx), plain)
    two = losses.matryoshka_loss(a, c, [8, 4], temperature=TAU, positive_index=idx)
    half = losses.contrastive_loss(a[:, :4], c[:, :4], temperature=TAU, positive_index=idx)
    assert two.item() == pytest.approx((plain + half).item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"must lie in 1..8"):
        losses.matryoshka_loss(a, c, [16], temperature=TAU, positive_index=idx)
    with pytest.raises(ValueError, match="2 Matryoshka dims but 1 weights"):
        losses.matryoshka_loss(a, c, [8, 4], [1.0], temperature=TAU, positive_index=idx)


def test_false_negative_masks_apply_to_every_prefix() -> None:
    # Rows 0 and 2 share a text: masked as each other's negative, at every dimension.
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(8, 8, generator=g, dtype=torch.float64)
    batch = {"text_ids": text_ids(["x", "x", "y", "y", "x", "x", "z", "z"])}
    cfg = dict(temperature=TAU, unsup_loss="paper", mask_false_negatives=True)
    matryoshka = SimCSEObjective("unsup", LossConfig(**cfg, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS))
    plain = SimCSEObjective("unsup", LossConfig(**cfg))
    want = sum(w * plain.loss(emb[:, :d], batch) for d, w in zip(DIMS, WEIGHTS, strict=True))
    assert matryoshka.loss(emb, batch).item() == pytest.approx(want.item(), rel=1e-10)
    assert matryoshka.last_masked == plain.last_masked > 0  # counted once, not once per prefix


@pytest.mark.parametrize("mode", ["unsup", "hardneg"])
def test_gradcache_gives_the_full_batch_gradients(tiny_model_dir: Path, mode: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective(mode, LossConfig(temperature=TAU, matryoshka_dims=[32, 16, 4]))
    batch = make_batch(tokenizer, mode, 8)
    model = make_model(tiny_model_dir, "cls", "train", dropout=0.0)
    full = objective.step(model, batch)  # backward=None: loss.backward()
    want = grads(model)
    model.zero_grad(set_to_none=True)
    cached = GradCacheStep(objective, 4)(model, batch)
    assert cached.item() == pytest.approx(full.item(), abs=1e-5)
    assert_grads_equal(grads(model), want, atol=1e-5)


def test_config_keys(tiny_run) -> None:  # noqa: ANN001 - conftest's TinyRun
    cfg = tiny_run.config("m", matryoshka_dims="32,16", matryoshka_weights="[1, 0.5]")
    assert cfg.loss.matryoshka_dims == [32, 16] and cfg.loss.matryoshka_weights == [1.0, 0.5]
    with pytest.raises(ConfigError, match="loss.matryoshka_weights"):
        tiny_run.config("w", matryoshka_dims="32,16", matryoshka_weights="1")
    with pytest.raises(ConfigError, match="loss.matryoshka_dims"):
        tiny_run.config("d", matryoshka_dims="32,0")
    with pytest.raises(ConfigError, match="matryoshka_dims.*must be a list of ints"):
        tiny_run.config("x", matryoshka_dims="32,abc")
    with pytest.raises(ConfigError, match=r"'loss.matryoshka_dims' = \[64, 32\]: the model's embeddings have 32 dimensions"):
        load_checked_tokenizer(tiny_run.config("big", matryoshka_dims="64,32"))
