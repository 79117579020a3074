"""Known answers and naive-loop references for the loss core."""

from __future__ import annotations

import math

import pytest
import torch

from simcse_kit.core import losses, masks

SIMS = [0.5, 0.25, -0.45, -0.1]


def embeddings_with_cosines(sims: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """An anchor ``[1, D]`` and candidates ``[M, D]`` whose cosines to it are exactly ``sims``."""
    m = len(sims)
    anchor = torch.zeros(1, m + 1, dtype=torch.float64)
    anchor[0, 0] = 1.0
    cands = torch.zeros(m, m + 1, dtype=torch.float64)
    for j, s in enumerate(sims):
        cands[j, 0] = s
        cands[j, j + 1] = math.sqrt(1 - s * s)
    return anchor, cands


@pytest.mark.parametrize(
    ("positive", "tau", "expected"),
    [
        (0, 1.0, 0.9986),
        (0, 0.5, 0.7214),
        (0, 0.05, 0.0067),
        (1, 1.0, 1.2486),
        (1, 0.5, 1.2214),
        (1, 0.05, 5.0067),
        (1, 0.01, 25.0),
    ],
)
def test_known_table(positive: int, tau: float, expected: float) -> None:
    # Straight from similarities...
    logits = torch.tensor([SIMS], dtype=torch.float64) / tau
    got = losses.cross_entropy_from_logits(logits, torch.tensor([positive])).item()
    assert got == pytest.approx(expected, abs=6e-5)
    # ...and through info_nce from embeddings with exactly those cosines.
    anchor, cands = embeddings_with_cosines(SIMS)
    got = losses.info_nce(anchor, cands, temperature=tau, positive_index=torch.tensor([positive])).item()
    assert got == pytest.approx(expected, abs=6e-5)
    # ...and through the general function.
    got = losses.contrastive_loss(anchor, cands, temperature=tau, positive_index=torch.tensor([positive])).item()
    assert got == pytest.approx(expected, abs=6e-5)


def naive_info_nce(z1, z2, z3=None, tau=0.05, alpha=1.0):
    total = 0.0
    n = len(z1)
    for i in range(n):
        cos = lambda a, b: float(torch.dot(a, b) / (a.norm() * b.norm()))  # noqa: E731
        num = math.exp(cos(z1[i], z2[i]) / tau)
        den = sum(math.exp(cos(z1[i], z2[j]) / tau) for j in range(n))
        if z3 is not None:
            den += sum((alpha if j == i else 1.0) * math.exp(cos(z1[i], z3[j]) / tau) for j in range(n))
        total += -math.log(num / den)
    return total / n


def naive_views(z, tau):
    n = len(z)
    total = 0.0
    for i in range(n):
        cos = lambda a, b: float(torch.dot(a, b) / (a.norm() * b.norm()))  # noqa: E731
        pos = i ^ 1
        den = sum(math.exp(cos(z[i], z[k]) / tau) for k in range(n) if k != i)
        total += -(cos(z[i], z[pos]) / tau - math.log(den))
    return total / n


def naive_supcon(z, labels, tau, variant):
    n = len(z)
    zn = torch.nn.functional.normalize(z, dim=-1)
    total, count = 0.0, 0
    for i in range(n):
        pos = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not pos:
            continue
        den = sum(math.exp(float(zn[i] @ zn[a]) / tau) for a in range(n) if a != i)
        probs = [math.exp(float(zn[i] @ zn[p]) / tau) / den for p in pos]
        if variant == "out":
            total += -sum(math.log(q) for q in probs) / len(pos)
        else:
            total += -math.log(sum(probs) / len(pos))
        count += 1
    return total / count


def naive_general(a, c, tau, positive_mask, exclude, bias, variant):
    """Per-pair loop of :func:`losses.contrastive_loss` with a multi-positive mask:
    ``logit_ij = cos(a_i, c_j) / tau + bias_ij`` over the columns not excluded (a
    positive is never excluded); anchors without a positive are skipped."""
    cos = lambda x, y: float(torch.dot(x, y) / (x.norm() * y.norm()))  # noqa: E731
    total, count = 0.0, 0
    for i in range(len(a)):
        pos = [j for j in range(len(c)) if positive_mask[i][j]]
        if not pos:
            continue
        keep = [j for j in range(len(c)) if j in pos or not exclude[i][j]]
        logit = {j: cos(a[i], c[j]) / tau + bias[i][j] for j in keep}
        log_den = math.log(sum(math.exp(logit[j]) for j in keep))
        if variant == "out":
            total += -sum(logit[p] - log_den for p in pos) / len(pos)
        else:
            total += -math.log(sum(math.exp(logit[p] - log_den) for p in pos) / len(pos))
        count += 1
    return total / count


# The module's contract: similarities and logits in fp32 whatever the input dtype. The
# references are computed on the same rounded inputs, so half-precision inputs must
# match at fp32's tolerance; a similarity matrix computed in fp16/bf16 (error ~1e-3 at
# tau = 0.05) fails here.
FP32_CONTRACT_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", ["out", "in"])
def test_contrastive_loss_matches_naive_loop(dtype: torch.dtype, variant: str) -> None:
    """The general function, with exclusions, a logit bias and several positives per
    anchor (one anchor with none, one whose positive is also marked excluded), against
    a per-pair Python loop; and with one positive per anchor against the same loop."""
    g = torch.Generator().manual_seed(10)
    a = torch.randn(5, 6, generator=g, dtype=torch.float64)
    c = torch.randn(9, 6, generator=g, dtype=torch.float64)
    positive_mask = torch.rand(5, 9, generator=g) < 0.3
    positive_mask[0] = False  # no positive: dropped from the mean
    positive_mask[1, 2] = True
    exclude = torch.rand(5, 9, generator=g) < 0.3
    exclude[1, 2] = True  # a positive is never excluded
    bias = torch.randn(5, 9, generator=g, dtype=torch.float64)
    tol = FP32_CONTRACT_TOL[dtype]
    ra, rc = a.to(dtype).double(), c.to(dtype).double()
    for tau in (1.0, 0.05):
        got = losses.contrastive_loss(
            a.to(dtype),
            c.to(dtype),
            temperature=tau,
            positive_mask=positive_mask,
            exclude=exclude,
            logit_bias=bias,
            variant=variant,
        )
        want = naive_general(ra, rc, tau, positive_mask.tolist(), exclude.tolist(), bias.tolist(), variant)
        assert got.item() == pytest.approx(want, rel=tol, abs=tol)
        index = torch.tensor([3, 0, 2, 8, 5])
        one = torch.zeros(5, 9, dtype=torch.bool)
        one[torch.arange(5), index] = True
        got = losses.contrastive_loss(
            a.to(dtype), c.to(dtype), temperature=tau, positive_index=index, exclude=exclude, logit_bias=bias
        )
        want = naive_general(ra, rc, tau, one.tolist(), exclude.tolist(), bias.tolist(), variant)
        assert got.item() == pytest.approx(want, rel=tol, abs=tol)


def test_weight_bias_is_log_alpha_on_one_column_per_row() -> None:
    bias = masks.weight_bias(torch.tensor([2, 0]), 4, 3.0, torch.zeros(1))
    want = torch.zeros(2, 4)
    want[0, 2] = want[1, 0] = math.log(3.0)
    assert torch.equal(bias, want)
    assert masks.weight_bias(torch.tensor([2, 0]), 4, 1.0, torch.zeros(1)) is None  # alpha = 1: nothing added
    with pytest.raises(ValueError, match="hard_negative_weight"):
        masks.weight_bias(torch.tensor([0]), 1, 0.0, torch.zeros(1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_info_nce_matches_naive_loop(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2, z3 = (torch.randn(6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    tol = FP32_CONTRACT_TOL[dtype]
    # Reference computed on the same (rounded) inputs the loss sees.
    r1, r2, r3 = (t.to(dtype).double() for t in (z1, z2, z3))
    for tau in (1.0, 0.05):
        got = losses.info_nce(z1.to(dtype), z2.to(dtype), temperature=tau).item()
        assert got == pytest.approx(naive_info_nce(r1, r2, tau=tau), rel=tol, abs=tol)
        got = losses.info_nce(z1.to(dtype), z2.to(dtype), z3.to(dtype), temperature=tau, hard_negative_weight=2.5).item()
        assert got == pytest.approx(naive_info_nce(r1, r2, r3, tau=tau, alpha=2.5), rel=tol, abs=tol)


def test_views_matches_naive_loop_and_labels() -> None:
    assert masks.view_labels(6).tolist() == [1, 0, 3, 2, 5, 4]
    g = torch.Generator().manual_seed(1)
    z = torch.randn(8, 5, generator=g, dtype=torch.float64)
    for tau in (0.5, 0.05):
        assert losses.info_nce_views(z, temperature=tau).item() == pytest.approx(naive_views(z, tau), rel=1e-9)


@pytest.mark.parametrize("variant", ["out", "in"])
def test_supcon_matches_naive_loop(variant: str) -> None:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(10, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 1, 4])  # 3 and 4 have no positive: excluded
    got = losses.supcon(z, labels, temperature=0.1, variant=variant).item()
    assert got == pytest.approx(naive_supcon(z, labels.tolist(), 0.1, variant), rel=1e-9)
    mask = labels.view(-1, 1) == labels.view(1, -1)
    assert losses.supcon(z, positive_mask=mask, temperature=0.1, variant=variant).item() == pytest.approx(got, rel=1e-12)


def test_supcon_l_in_le_l_out() -> None:
    # Jensen: L_in <= L_out, equal when every anchor has one positive.
    g = torch.Generator().manual_seed(3)
    z = torch.randn(12, 4, generator=g)
    labels = torch.arange(12) % 3
    assert losses.supcon(z, labels, variant="in") <= losses.supcon(z, labels, variant="out") + 1e-6


def test_supcon_two_views_equals_views_infonce() -> None:
    g = torch.Generator().manual_seed(4)
    z = torch.randn(10, 7, generator=g, dtype=torch.float64)
    labels = torch.arange(5).repeat_interleave(2)  # [0,0,1,1,...] one label per sentence
    for variant in ("out", "in"):
        a = losses.supcon(z, labels, temperature=0.05, variant=variant)
        b = losses.info_nce_views(z, temperature=0.05)
        assert a.item() == pytest.approx(b.item(), rel=1e-10)


def test_supcon_no_positive_is_zero_not_nan() -> None:
    z = torch.randn(4, 3, requires_grad=True)
    loss = losses.supcon(z, torch.arange(4))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_at_low_temperature(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)
    base = torch.randn(8, 16, generator=g)
    for fn in (
        lambda z: losses.info_nce(z[:4], z[4:], temperature=0.01),
        lambda z: losses.info_nce(z[:4], z[4:], z[:4].flip(0), temperature=0.01, hard_negative_weight=0.1),
        lambda z: losses.info_nce_views(z, temperature=0.01),
        lambda z: losses.supcon(z, torch.arange(8) % 3, temperature=0.01),
        lambda z: losses.supcon(z, torch.arange(8) % 3, temperature=0.01, variant="in"),
        lambda z: losses.contrastive_loss(
            z[:4], z, temperature=0.01, positive_mask=torch.rand(4, 8) < 0.5, exclude=torch.eye(4, 8) > 0, variant="in"
        ),
    ):
        z = base.to(dtype).requires_grad_(True)
        loss = fn(z)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(z.grad.float()).all()


def test_mask_uses_dtype_min_not_big_constant() -> None:
    # A row whose only candidates besides the positive are excluded: loss is exactly 0.
    logits = torch.tensor([[3.0, 1.0, 2.0]])
    exclude = torch.tensor([[False, True, True]])
    assert losses.cross_entropy_from_logits(logits, torch.tensor([0]), exclude).item() == 0.0
    # The positive is never excluded even if the mask says so.
    assert torch.isfinite(losses.cross_entropy_from_logits(logits, torch.tensor([1]), torch.ones(1, 3, dtype=torch.bool)))


def test_gradient_on_negative_grows_with_similarity() -> None:
    # Hardness awareness: d loss / d s_j = P_j / tau, larger for more similar negatives.
    s = torch.tensor([[0.5, 0.25, -0.45, -0.1]], requires_grad=True)
    tau = 0.1
    losses.cross_entropy_from_logits(s / tau, torch.tensor([0])).backward()
    g = s.grad[0, 1:]
    p = torch.softmax(s.detach() / tau, dim=1)[0, 1:] / tau
    assert torch.allclose(g, p)
    order = torch.argsort(s.detach()[0, 1:])
    assert torch.all(torch.diff(g[order]) > 0)


def test_hard_negative_weight_one_is_plain_and_weight_raises_loss() -> None:
    g = torch.Generator().manual_seed(6)
    z1, z2, z3 = (torch.randn(5, 8, generator=g) for _ in range(3))
    plain = losses.info_nce(z1, z2, z3, temperature=0.05)
    heavier = losses.info_nce(z1, z2, z3, temperature=0.05, hard_negative_weight=3.0)
    assert heavier > plain
    assert losses.info_nce(z1, z2, z3, temperature=0.05, hard_negative_weight=1.0) == plain


def test_bad_arguments() -> None:
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match="temperature"):
        losses.info_nce(z, z, temperature=0.0)
    with pytest.raises(ValueError, match="even"):
        losses.info_nce_views(torch.randn(5, 3))
    with pytest.raises(ValueError, match="labels or positive_mask"):
        losses.supcon(z)
    with pytest.raises(ValueError, match="exactly one"):
        losses.contrastive_loss(z, z, temperature=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        losses.contrastive_loss(z, z, temperature=0.1, positive_index=torch.arange(4), positive_mask=torch.eye(4) > 0)
    with pytest.raises(ValueError, match="exclude must be"):
        losses.contrastive_loss(z, z, temperature=0.1, positive_index=torch.arange(4), exclude=torch.zeros(4, 3) > 0)
    with pytest.raises(ValueError, match="variant"):
        losses.contrastive_loss(z, z, temperature=0.1, positive_mask=torch.eye(4) > 0, variant="both")
