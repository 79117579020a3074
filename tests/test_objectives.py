"""SimCSEObjective: each mode's candidates, built as data, against naive per-anchor loops
on example-major rows; the step protocol; the queue joins every mode's candidates."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from simcse_kit.config.run import LossConfig
from simcse_kit.core import losses
from simcse_kit.core.batch import text_ids
from simcse_kit.training.objective.objectives import SimCSEObjective

TAU = 0.05


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def nll(anchor: torch.Tensor, positive: torch.Tensor, negatives: list[tuple[torch.Tensor, float]]) -> float:
    """``-log(e^{s+} / (e^{s+} + sum_j w_j e^{s_j}))`` with ``s = cos / tau``, in Python floats."""
    pos = math.exp(cos(anchor, positive) / TAU)
    return -math.log(pos / (pos + sum(w * math.exp(cos(anchor, v) / TAU) for v, w in negatives)))


def reference(mode: str, emb: torch.Tensor, alpha: float = 1.0, unsup_loss: str = "views", queue=()) -> float:
    """The SimCSE losses read off example-major rows by hand (``queue``: extra negatives)."""
    extra = [(q, 1.0) for q in queue]
    if mode == "unsup" and unsup_loss == "views":  # [a, a, b, b]: every row an anchor
        n = emb.shape[0]
        return (
            sum(nll(emb[i], emb[i ^ 1], [(emb[j], 1.0) for j in range(n) if j not in (i, i ^ 1)] + extra) for i in range(n)) / n
        )
    v = 3 if mode == "hardneg" else 2
    n = emb.shape[0] // v
    z1, z2 = emb[0::v], emb[1::v]
    total = 0.0
    for i in range(n):
        negs = [(z2[j], 1.0) for j in range(n) if j != i]
        if mode == "hardneg":
            negs += [(emb[2::3][j], alpha if j == i else 1.0) for j in range(n)]
        total += nll(z1[i], z2[i], negs + extra)
    return total / n


CASES = [
    ("unsup", "views", 1.0),
    ("unsup", "paper", 1.0),
    ("sup", "views", 1.0),
    ("hardneg", "views", 1.0),
    ("hardneg", "views", 2.5),
]


@pytest.mark.parametrize(("mode", "unsup_loss", "alpha"), CASES)
def test_loss_matches_naive_loop_on_example_major_rows(mode: str, unsup_loss: str, alpha: float) -> None:
    g = torch.Generator().manual_seed(0)
    n_rows = 15 if mode == "hardneg" else 10
    emb = torch.randn(n_rows, 8, generator=g, dtype=torch.float64)
    cfg = LossConfig(temperature=TAU, unsup_loss=unsup_loss, hard_negative_weight=alpha)
    objective = SimCSEObjective(mode, cfg)
    assert objective.loss(emb).item() == pytest.approx(reference(mode, emb, alpha, unsup_loss), rel=1e-10)
    # The queue's rows are negatives of every anchor, in every mode.
    queue = torch.randn(4, 8, generator=g, dtype=torch.float64)
    got = objective.loss(emb, queue=(queue, None)).item()
    assert got == pytest.approx(reference(mode, emb, alpha, unsup_loss, list(queue)), rel=1e-10)


def test_forms_agree_with_the_named_losses() -> None:
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(12, 6, generator=g, dtype=torch.float64)
    views = SimCSEObjective("unsup", LossConfig(temperature=TAU)).loss(emb)
    assert views.item() == pytest.approx(losses.info_nce_views(emb, temperature=TAU).item(), rel=1e-12)
    supcon = losses.supcon(emb, torch.arange(6).repeat_interleave(2), temperature=TAU)
    assert views.item() == pytest.approx(supcon.item(), rel=1e-10)
    hard = SimCSEObjective("hardneg", LossConfig(temperature=TAU, hard_negative_weight=0.5)).loss(emb)
    want = losses.info_nce(emb[0::3], emb[1::3], emb[2::3], temperature=TAU, hard_negative_weight=0.5)
    assert hard.item() == pytest.approx(want.item(), rel=1e-12)


def test_gradient_equals_the_naive_graph() -> None:
    """d loss / d embeddings through the objective equals autograd through an explicit
    per-anchor formula (fp64): the data-built candidates route gradients to the right rows."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(9, 5, generator=g, dtype=torch.float64)
    emb = base.clone().requires_grad_()
    SimCSEObjective("hardneg", LossConfig(temperature=TAU, hard_negative_weight=2.0)).loss(emb).backward()
    ref = base.clone().requires_grad_()
    z = torch.nn.functional.normalize(ref, dim=-1)
    a, p, h = z[0::3], z[1::3], z[2::3]
    bias = torch.cat(
        [torch.zeros(3, 3, dtype=torch.float64), math.log(2.0) * torch.eye(3, dtype=torch.float64)], dim=1
    )  # alpha on own hard negative
    logits = torch.cat([a @ p.T, a @ h.T], dim=1) / TAU + bias
    torch.nn.functional.cross_entropy(logits, torch.arange(3)).backward()
    torch.testing.assert_close(emb.grad, ref.grad, atol=1e-12, rtol=0)


class BagModel(nn.Module):
    """A tiny encoder with the SimCSEModel call signature: mean of token embeddings."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(20, 6)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).float()
        return (self.table(input_ids) * mask).sum(1) / mask.sum(1)


def toy_batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[1, 2, 0], [1, 2, 0], [3, 4, 5], [3, 4, 5], [6, 7, 0], [6, 7, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "text_ids": text_ids(["a", "a", "b", "b", "c", "c"])}


def test_step_protocol_calls_backward_once_and_returns_the_detached_loss() -> None:
    objective = SimCSEObjective("unsup", LossConfig(temperature=TAU))
    model, batch = BagModel(), toy_batch()
    want = objective.loss(objective.embed(model, batch), batch)  # text_ids never reach the model
    want.backward()
    want_grad = model.table.weight.grad.clone()
    model.zero_grad()

    calls: list[torch.Tensor] = []

    def backward(loss: torch.Tensor) -> None:
        calls.append(loss)
        loss.backward()

    got = objective(model, batch, backward)
    assert len(calls) == 1 and not got.requires_grad
    assert torch.equal(got, want.detach())
    torch.testing.assert_close(model.table.weight.grad, want_grad, atol=0, rtol=0)
    # Without backward: plain loss.backward(), as every step of simcse_kit.training.engine.steps does.
    model.zero_grad()
    got = objective.step(model, batch)
    assert torch.equal(got, want.detach()) and not got.requires_grad
    torch.testing.assert_close(model.table.weight.grad, want_grad, atol=0, rtol=0)


def test_masking_counts_and_needs_queue_ids() -> None:
    objective = SimCSEObjective("unsup", LossConfig(temperature=TAU, mask_false_negatives=True))
    emb = torch.randn(6, 4, dtype=torch.float64)
    batch = {"text_ids": text_ids(["a", "a", "b", "b", "a", "a"])}
    objective.loss(emb, batch)
    assert objective.last_masked == objective.masked_negatives == 8  # 4 "a" rows each lose the other pair's 2
    objective.loss(emb, batch)
    assert (objective.last_masked, objective.masked_negatives) == (8, 16)
    with pytest.raises(ValueError, match="queue's text ids"):
        objective.loss(emb, batch, queue=(torch.randn(2, 4, dtype=torch.float64), None))


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        SimCSEObjective("triplet", LossConfig())
