"""The score-ranking and teacher-score losses (simcse_kit.core.score_losses) against references:
sentence-transformers' CoSENTLoss / AnglELoss (values and gradients, fp64), and naive Python
loops over the written formulas for the KL and MarginMSE distillation losses."""

from __future__ import annotations

import math

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import AnglELoss, CoSENTLoss

from simcse_kit.core import score_losses

OURS = {"cosent": score_losses.cosent_loss, "angle": score_losses.angle_loss}
THEIRS = {"cosent": CoSENTLoss, "angle": AnglELoss}


def _pairs(n: int, d: int, seed: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g, dtype=torch.float64)
    b = torch.randn(n, d, generator=g, dtype=torch.float64)
    # Graded labels with ties (STS-B's fifths of 0..5) or all distinct.
    scores = torch.randint(0, 26, (n,), generator=g).double() / 5 if ties else torch.rand(n, generator=g, dtype=torch.float64)
    return a, b, scores


def _value_and_grads(fn, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    loss = fn(a, b)
    loss.backward()
    return loss.detach(), a.grad, b.grad


@pytest.mark.parametrize("name", ["cosent", "angle"])
@pytest.mark.parametrize(("n", "d", "ties", "scale"), [(9, 16, True, 20.0), (12, 7, False, 20.0), (5, 8, True, 3.5)])
def test_ranking_losses_equal_sentence_transformers(name: str, n: int, d: int, ties: bool, scale: float) -> None:
    a, b, scores = _pairs(n, d, seed=n * d, ties=ties)
    theirs = THEIRS[name](model=None, scale=scale)  # the model is only stored; the core takes embeddings
    ref = _value_and_grads(lambda x, y: theirs.compute_loss_from_embeddings([x, y], scores), a, b)
    got = _value_and_grads(lambda x, y: OURS[name](x, y, scores, scale=scale), a, b)
    assert ref[0].item() > 0.1  # a loss with something to rank
    for mine, reference in zip(got, ref, strict=True):
        assert mine.dtype == torch.float64
        torch.testing.assert_close(mine, reference, rtol=1e-10, atol=1e-10)


def test_cosent_known_answer_and_direction() -> None:
    # Two pairs, labels 0 < 1: loss = log(1 + exp(scale * (cos_0 - cos_1))).
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.6, 0.8], [0.8, 0.6]], dtype=torch.float64, requires_grad=True)
    scores = torch.tensor([0.0, 1.0], dtype=torch.float64)
    loss = score_losses.cosent_loss(a, b, scores, scale=20.0)
    assert loss.item() == pytest.approx(math.log1p(math.exp(20.0 * (0.6 - 0.8))), rel=1e-12)
    # Swapping the labels ranks the pairs the wrong way round: a larger loss.
    assert score_losses.cosent_loss(a, b, scores.flip(0)).item() > 1.0 > loss.item()


def test_ranking_loss_of_ties_is_a_zero_with_graph() -> None:
    a = torch.randn(4, 8, requires_grad=True)
    loss = score_losses.cosent_loss(a, torch.randn(4, 8), torch.full((4,), 3.0))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(a.grad).all() and not a.grad.any()


def test_ranking_loss_runs_in_fp32_under_bf16_autocast() -> None:
    a, b, scores = _pairs(6, 8, seed=1, ties=False)
    exact = score_losses.cosent_loss(a.float(), b.float(), scores)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = score_losses.cosent_loss(a.bfloat16(), b.bfloat16(), scores)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(exact.item(), rel=2e-2)


def _candidates(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    student = (torch.rand(n, c, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
    teacher = torch.randn(n, c, generator=g, dtype=torch.float64) * 3
    exclude = torch.rand(n, c, generator=g) < 0.3
    return student, teacher, exclude


def _naive_kl(student: torch.Tensor, teacher: torch.Tensor, exclude: torch.Tensor | None, ts: float, tt: float) -> torch.Tensor:
    """sum_j p_j (log p_j - log q_j) per row with plain Python exps and logs, mean over rows."""
    rows = []
    for i in range(student.shape[0]):
        kept = [j for j in range(student.shape[1]) if j == 0 or exclude is None or not exclude[i, j]]
        t_norm = sum(math.exp(float(teacher[i, j]) / tt) for j in kept)
        s_lse = torch.logsumexp(torch.stack([student[i, j] / ts for j in kept]), dim=0)
        term = student.new_zeros(())
        for j in kept:
            p = math.exp(float(teacher[i, j]) / tt) / t_norm
            term = term + p * (math.log(p) - (student[i, j] / ts - s_lse))
        rows.append(term)
    return torch.stack(rows).mean()


def _naive_margin_mse(student: torch.Tensor, teacher: torch.Tensor, exclude: torch.Tensor | None) -> torch.Tensor:
    terms = []
    for i in range(student.shape[0]):
        for j in range(1, student.shape[1]):
            if exclude is not None and exclude[i, j]:
                continue
            teacher_margin = float(teacher[i, 0]) - float(teacher[i, j])
            terms.append(((student[i, 0] - student[i, j]) - teacher_margin) ** 2)
    return torch.stack(terms).sum() / len(terms)


def _check_against(fn, reference, student: torch.Tensor) -> None:
    got = fn(student)
    (grad,) = torch.autograd.grad(got, student)
    want = reference(student)
    (want_grad,) = torch.autograd.grad(want, student)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("ts", "tt"), [(0.05, 0.05), (0.1, 2.0)])
def test_kl_distillation_equals_naive_loop(masked: bool, ts: float, tt: float) -> None:
    student, teacher, exclude = _candidates(6, 5, seed=3)
    mask = exclude if masked else None
    _check_against(
        lambda s: score_losses.kl_distillation_loss(s, teacher, student_temperature=ts, teacher_temperature=tt, exclude=mask),
        lambda s: _naive_kl(s, teacher, mask, ts, tt),
        student,
    )


def test_kl_is_zero_when_the_student_matches_and_swapped_temperatures_differ() -> None:
    student, teacher, _ = _candidates(4, 6, seed=4)
    matched = score_losses.kl_distillation_loss(teacher * 0.5, teacher, student_temperature=0.5, teacher_temperature=1.0)
    assert abs(matched.item()) < 1e-12
    args = {"student_temperature": 0.05, "teacher_temperature": 1.0}
    swapped = {"student_temperature": 1.0, "teacher_temperature": 0.05}
    right = score_losses.kl_distillation_loss(student, teacher, **args)
    wrong = score_losses.kl_distillation_loss(student, teacher, **swapped)
    assert right.item() >= 0 and abs(right.item() - wrong.item()) > 1e-3


@pytest.mark.parametrize("masked", [False, True])
def test_margin_mse_equals_naive_loop(masked: bool) -> None:
    student, teacher, exclude = _candidates(5, 4, seed=5)
    mask = exclude if masked else None
    _check_against(
        lambda s: score_losses.margin_mse_loss(s, teacher, exclude=mask), lambda s: _naive_margin_mse(s, teacher, mask), student
    )


def test_margin_mse_sign_matters_and_all_masked_is_zero() -> None:
    student = torch.tensor([[0.9, 0.1]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[5.0, 4.2]], dtype=torch.float64)
    # Margins 0.8 and 0.8: no loss; a negative-minus-positive margin would give (−0.8 − 0.8)² = 2.56.
    assert score_losses.margin_mse_loss(student, teacher).item() == pytest.approx(0.0, abs=1e-15)
    assert score_losses.margin_mse_loss(student, teacher.flip(1)).item() == pytest.approx(2.56)
    zero = score_losses.margin_mse_loss(student, teacher, exclude=torch.tensor([[False, True]]))
    zero.backward()
    assert zero.item() == 0.0 and not student.grad.any()


def test_candidate_cosines_and_positive_never_excluded() -> None:
    g = torch.Generator().manual_seed(6)
    anchors, candidates = torch.randn(3, 8, generator=g), torch.randn(3, 4, 8, generator=g)
    cos = score_losses.candidate_cosines(anchors, candidates)
    for i in range(3):
        for j in range(4):
            want = torch.cosine_similarity(anchors[i], candidates[i, j], dim=0).item()
            assert cos[i, j].item() == pytest.approx(want, abs=1e-6)
    teacher = torch.randn(3, 4, generator=g)
    everything = torch.ones(3, 4, dtype=torch.bool)
    only_positive = score_losses.kl_distillation_loss(
        cos, teacher, student_temperature=0.05, teacher_temperature=0.05, exclude=everything
    )
    assert only_positive.item() == pytest.approx(0.0, abs=1e-6)  # one candidate: both softmaxes are 1


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match=r"\[N, C\]"):
        score_losses.margin_mse_loss(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\[N\]"):
        score_losses.score_ranking_loss(torch.zeros(3), torch.zeros(4))
