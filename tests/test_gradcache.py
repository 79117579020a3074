"""GradCache: cached chunk-wise gradients equal full-batch gradients (fp32, tiny BERT)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import TinyRun, toy_sentences
from torch.optim.optimizer import register_optimizer_step_pre_hook
from transformers import AutoTokenizer

from simcse_kit.config.run import LoopConfig, LossConfig, ModelConfig
from simcse_kit.core.batch import views_per_example
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.loop import fit, prepare
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.gradcache import chunk_slices, effective_negatives
from simcse_kit.training.objective.objectives import SimCSEObjective

MODES = [("unsup", "cls", "train"), ("sup", "avg", "none"), ("hardneg", "cls", "always"), ("scored", "avg", "none")]


def make_batch(tokenizer: object, mode: str, n: int) -> dict[str, torch.Tensor]:
    sents = toy_sentences(3 * n)
    examples = [
        {"sent0": sents[i], "sent1": sents[n + i], "hard_neg": sents[2 * n + i], "score": float(i * 3 % 5)} for i in range(n)
    ]
    return ContrastiveCollator(tokenizer, mode, 16)(examples)


def make_model(tiny_model_dir: Path, pooler: str, mlp: str, dropout: float) -> SimCSEModel:
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp=mlp, dropout=dropout))
    return model.train()


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def assert_grads_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        # ``atol`` per unit of the tensor's largest entry: a row every token adds into (token_type_embeddings) sums
        # hundreds of terms, and with AVX2 kernels on an Intel Xeon its fp32 sum came 1.2e-5 off on entries of 4.
        scale = max(1.0, want[name].abs().max().item())
        torch.testing.assert_close(got[name], want[name], atol=atol * scale, rtol=0, msg=name)
    # The comparison must not be vacuous: the gradients are far from zero.
    assert sum(g.abs().sum() for g in want.values()) > 1e-2


@pytest.mark.parametrize(("mode", "pooler", "mlp"), MODES)
@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_cached_gradients_equal_full_batch_without_dropout(
    tiny_model_dir: Path, mode: str, pooler: str, mlp: str, chunk: int
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05))
    batch = make_batch(tokenizer, mode, 8)
    model = make_model(tiny_model_dir, pooler, mlp, dropout=0.0)

    full_loss = objective.step(model, batch)  # backward=None: loss.backward()
    want = grads(model)
    model.zero_grad(set_to_none=True)

    cached_loss = GradCacheStep(objective, chunk)(model, batch)
    assert abs(cached_loss.item() - full_loss.item()) < 1e-5
    assert_grads_equal(grads(model), want, atol=1e-5)


@pytest.mark.parametrize(("score_loss", "score_weight"), [("cosent", 1.0), ("angle", 1.0), ("cosent", 0.5)])
def test_score_loss_through_gradcache_equals_full_batch(tiny_model_dir: Path, score_loss: str, score_weight: float) -> None:
    """The score term is part of the objective's loss of the cached [B, H]: GradCache needs nothing of its own."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective("scored", LossConfig(score_loss=score_loss, score_weight=score_weight))
    batch = make_batch(tokenizer, "scored", 8)
    model = make_model(tiny_model_dir, "avg", "none", dropout=0.0)
    full_loss = objective.step(model, batch)
    want = grads(model)
    model.zero_grad(set_to_none=True)
    cached_loss = GradCacheStep(objective, 4)(model, batch)
    assert full_loss.item() > 0.1 and abs(cached_loss.item() - full_loss.item()) < 1e-5
    assert_grads_equal(grads(model), want, atol=1e-5)
    assert set(objective.metrics()) == ({"score_loss"} if score_weight == 1 else {"score_loss", "infonce_loss"})


def trimmed(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """The reference's own chunk: rows sliced, all-padding columns dropped."""
    chunk = {k: v[rows] for k, v in batch.items() if v.ndim == 2}  # per-row tokens; not per-example scores
    keep = int(chunk["attention_mask"].sum(dim=1).max())
    return {k: v[:, :keep] for k, v in chunk.items()}


@pytest.mark.parametrize(("mode", "pooler", "mlp"), MODES)
def test_dropout_is_replayed(tiny_model_dir: Path, mode: str, pooler: str, mlp: str) -> None:
    """With dropout on, the cached gradients equal one graph over the same chunked
    forwards (same dropout masks): the replay reproduces pass 1 exactly."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05))
    batch = make_batch(tokenizer, mode, 8)
    model = make_model(tiny_model_dir, pooler, mlp, dropout=0.3)
    chunk = 6

    torch.manual_seed(7)
    parts = [
        objective.embed(model, trimmed(batch, rows))
        for rows in chunk_slices(batch["input_ids"].shape[0], chunk, views_per_example(mode))
    ]
    ref_loss = objective.loss(torch.cat(parts), batch)
    ref_loss.backward()
    want = grads(model)
    after_ref = torch.get_rng_state()
    model.zero_grad(set_to_none=True)

    torch.manual_seed(7)
    loss = GradCacheStep(objective, chunk)(model, batch)
    assert abs(loss.item() - ref_loss.item()) < 1e-5
    assert_grads_equal(grads(model), want, atol=1e-5)
    # The RNG stream continues as after one pass of chunk forwards (replays are forked).
    assert torch.equal(torch.get_rng_state(), after_ref)

    # Without the replay the masks differ and so do the gradients: the test has teeth.
    model.zero_grad(set_to_none=True)
    torch.manual_seed(8)
    GradCacheStep(objective, chunk)(model, batch)
    assert any((g - want[k]).abs().max() > 1e-3 for k, g in grads(model).items())


def test_unsup_chunks_keep_both_views_together() -> None:
    assert chunk_slices(10, 3, align=2) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8), slice(8, 10)]
    assert chunk_slices(10, 4, align=2) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert chunk_slices(10, 1, align=2) == [slice(i, i + 2) for i in range(0, 10, 2)]
    assert chunk_slices(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    with pytest.raises(ValueError):
        chunk_slices(4, 0)


def test_effective_negatives() -> None:
    # batch of 512 examples: 2N-view InfoNCE sees 2*512 - 2 = 1022 other views
    assert effective_negatives("unsup", 512) == 1022
    assert effective_negatives("unsup", 512, unsup_loss="paper") == 511
    assert effective_negatives("sup", 512) == 511
    assert effective_negatives("hardneg", 512) == 1023
    assert effective_negatives("sup", 64, world_size=4) == 255


def test_fit_hands_the_optimizer_full_batch_gradients(tiny_model_dir: Path) -> None:
    """Through the real loop (Accelerate's backward, AdamW): at every optimiser step the
    gradients GradCache leaves for the optimiser equal the full-batch gradients at the
    weights the loop has reached (dropout off).

    The comparison is of gradients, not of weights after AdamW: Adam moves a weight by
    about lr * g / (|g| + eps), so an entry whose true gradient is ~0 turns the kernels'
    rounding noise into an lr-sized move, and that amplification differs between AVX2 and
    AVX-512 kernels (it failed an earlier weights-after-two-steps form on AVX2 CPUs).
    """
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    collator = ContrastiveCollator(tokenizer, "unsup", 16)
    data = [{"sent0": s} for s in toy_sentences(16)]
    # The loop's own config: fp32 (a text run's TrainConfig picks its precision from the hardware).
    cfg = LoopConfig(learning_rate=1e-3, num_epochs=1, progress_bar=False, eval_steps=0)
    cached_step = GradCacheStep(objective, 4)
    handed: list[dict[str, torch.Tensor]] = []  # what GradCache left, per optimiser step
    reference: list[dict[str, torch.Tensor]] = []  # one full-batch graph at the same weights

    def checked_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], backward: object) -> torch.Tensor:
        twin = copy.deepcopy(model)  # the weights the loop has reached, before this step
        twin.zero_grad(set_to_none=True)
        objective.step(twin, batch)
        reference.append(grads(twin))
        loss = cached_step(model, batch, backward)
        handed.append(grads(model))
        return loss

    seen_by_optimizer: list[dict[int, torch.Tensor]] = []  # keyed by id(parameter)

    def before_optimizer_step(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        seen_by_optimizer.append({id(p): p.grad.detach().clone() for p in params})

    model = make_model(tiny_model_dir, "cls", "train", dropout=0.0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=False, collate_fn=collator)
    hook = register_optimizer_step_pre_hook(before_optimizer_step)
    try:
        state = fit(prepare(model, loader, cfg), checked_step, cfg)
    finally:
        hook.remove()
    assert state.global_step == 2 and len(handed) == len(reference) == len(seen_by_optimizer) == 2
    ids = {name: id(p) for name, p in model.named_parameters()}
    for got, want, seen in zip(handed, reference, seen_by_optimizer, strict=True):
        assert_grads_equal(got, want, atol=1e-5)
        # The optimiser stepped on exactly these (nothing clipped, accumulated or rescaled them).
        assert {ids[name] for name in got} == seen.keys()
        assert all(torch.equal(seen[ids[name]], g) for name, g in got.items())
    # Step 2 ran at weights the optimiser had moved, so both steps were checked for real.
    assert any((v - start[k]).abs().max() > 1e-4 for k, v in model.state_dict().items())


def test_bf16_autocast_close_to_full_batch(tiny_model_dir: Path) -> None:
    """Under CPU bf16 autocast the replayed forwards run in bf16 too; gradients agree
    with the full-batch bf16 ones to bf16 accuracy."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective("sup", LossConfig(temperature=0.05))
    batch = make_batch(tokenizer, "sup", 8)
    model = make_model(tiny_model_dir, "avg", "none", dropout=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        objective.step(model, batch)
        want = grads(model)
        model.zero_grad(set_to_none=True)
        GradCacheStep(objective, 5)(model, batch)
    got = grads(model)
    for name, g in want.items():
        scale = g.abs().max().item() + 1e-6
        assert (got[name] - g).abs().max().item() <= 0.05 * scale, name


@pytest.mark.slow  # a whole run incl. the 7-task STS evaluation (~15 s CPU)
def test_train_run_uses_gradcache(tiny_run: TinyRun, caplog: pytest.LogCaptureFixture) -> None:
    """``train.grad_cache_chunk > 0`` routes a real run through GradCacheStep."""
    import logging

    with caplog.at_level(logging.INFO, logger="simcse_kit.training.engine.steps"):
        metrics = tiny_run.train("run", batch_size=16, grad_cache_chunk=6, max_steps=2, eval_steps=0, save_steps=0)
    # 16 examples = 32 rows in chunks of 6 rows (3 sentences x 2 views): 6 chunks;
    # 2N-view InfoNCE over 16 examples: 30 negatives per anchor.
    assert "GradCache: 32 rows in 6 chunks of <= 6; 30 negatives per anchor" in caplog.text
    assert metrics["steps"] == 2


def test_chunk_trims_only_all_padding_columns() -> None:
    from simcse_kit.training.objective.gradcache import model_chunk

    ids = torch.tensor([[2, 7, 3, 0, 0], [2, 7, 8, 3, 0], [2, 3, 0, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long(), "text_ids": torch.arange(3)}
    right = model_chunk(batch, slice(0, 2))
    assert right.keys() == {"input_ids", "attention_mask"}  # non-model keys stay out
    assert torch.equal(right["input_ids"], ids[:2, :4])
    assert torch.equal(model_chunk(batch, slice(2, 3))["input_ids"], torch.tensor([[2, 3]]))
    left = {"input_ids": ids.flip(1), "attention_mask": (ids != 0).long().flip(1)}
    assert torch.equal(model_chunk(left, slice(0, 3))["input_ids"], ids.flip(1))  # left padding: nothing to trim
