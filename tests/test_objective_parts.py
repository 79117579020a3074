"""The objective's parts, each alone (simcse_kit/training/objective/parts.py): the contrastive
problem a batch poses, each negative filter, how their drops are joined and counted, and a
term's rule; each against a hand-built answer."""

from __future__ import annotations

import math

import pytest
import torch

from simcse_kit.config.run import LossConfig
from simcse_kit.core.batch import text_ids
from simcse_kit.training.engine.steps import Queue
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.objective.parts import GuideFilter, Problem, SameText, Term, TooSimilar, drop_negatives


def problem_of(mode: str, rows: int, negatives: int = 1, **loss: object) -> tuple[SimCSEObjective, Problem]:
    objective = SimCSEObjective(mode, LossConfig(gather=False, **loss), negatives=negatives)  # type: ignore[arg-type]
    embeddings = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    return objective, objective.problem(embeddings)


def test_the_unsup_problem_pairs_each_row_with_its_neighbour_and_excludes_itself() -> None:
    objective, problem = problem_of("unsup", 6)  # [a, a, b, b, c, c]
    assert torch.equal(problem.anchors, problem.candidates) and problem.candidates.shape == (6, 2)
    assert problem.positive.tolist() == [1, 0, 3, 2, 5, 4] and problem.itself is not None
    assert problem.itself.tolist() == list(range(6)) and problem.bias is None and problem.in_batch == 6
    exclusions = problem.exclusions(None)
    assert exclusions is not None and torch.equal(exclusions, torch.eye(6, dtype=torch.bool))
    dropped = torch.zeros(6, 6, dtype=torch.bool)
    dropped[0, 4] = True
    both = problem.exclusions(dropped)
    assert both is not None and both.sum() == 7 and both[0, 4] and both[5, 5]


def test_the_hardneg_problem_weights_each_anchors_own_negatives() -> None:
    """k = 2: rows [a, p, n1, n2] per example; candidates are the positives' block, then
    each negative's block; anchor i's bias is log(alpha) at columns N + i and 2N + i."""
    _, problem = problem_of("hardneg", 12, negatives=2, hard_negative_weight=2.0)  # N = 3, V = 4
    assert problem.anchors.shape == (3, 2) and problem.candidates.shape == (9, 2) and problem.itself is None
    assert problem.positive.tolist() == [0, 1, 2] and problem.block_rows == 3
    assert torch.equal(problem.candidates[:3], problem_of("hardneg", 12, negatives=2)[1].candidates[:3])
    assert problem.bias is not None
    want = torch.zeros(3, 9)
    for i in range(3):
        want[i, 3 + i] = want[i, 6 + i] = math.log(2.0)
    assert torch.allclose(problem.bias.expand(3, 9), want)
    assert problem.exclusions(None) is None  # no anchor is among its candidates


def test_a_queue_extends_the_candidates_after_the_batch() -> None:
    objective = SimCSEObjective("sup", LossConfig(gather=False))
    embeddings, queued = torch.randn(6, 4), torch.randn(5, 4)
    problem = objective.problem(embeddings, Queue(queued))
    assert problem.in_batch == 3 and problem.candidates.shape == (8, 4)
    assert torch.equal(problem.candidates[3:], queued) and torch.equal(problem.candidates[:3], embeddings[1::2])


def test_same_text_drops_the_anchors_and_its_positives_copies_and_the_queues() -> None:
    """sup, 3 pairs (x, x'), (y, x), (x, z') and a queue holding y and w, against the
    candidates [x', x, z', y, w]: a candidate with the anchor's text is dropped (x for the
    two x anchors, the queue's y for y), and so is the positive of another copy of the
    anchor (an NLI premise seen twice); never an anchor's own positive."""
    objective = SimCSEObjective("sup", LossConfig(gather=False, mask_false_negatives=True))
    texts = ["x", "x'", "y", "x", "x", "z'"]
    queue = Queue(torch.randn(2, 4), text_ids(["y", "w"]))
    problem = objective.problem(torch.randn(6, 4), queue)
    mask = SameText()(problem, objective, {"text_ids": text_ids(texts)}, queue)
    want = torch.zeros(3, 5, dtype=torch.bool)
    want[0, 1] = want[0, 2] = True  # x itself; z', the positive of the other x
    want[1, 3] = True  # the queue's y
    want[2, 0] = want[2, 1] = True  # x', the positive of the other x; x itself
    assert mask is not None and torch.equal(mask, want)
    assert SameText()(problem, SimCSEObjective("sup", LossConfig(gather=False)), {}, None) is None  # masking off


def test_too_similar_drops_what_exceeds_the_threshold_but_never_the_positive() -> None:
    objective = SimCSEObjective("sup", LossConfig(gather=False))
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 0.1], [1.0, 1.0]])  # candidate 0 ~ anchor 0 (its positive); 1 at 45 degrees
    problem = objective.problem(torch.stack([a[0], p[0], a[1], p[1]]))
    mask = TooSimilar(0.6)(problem, objective, None, None)
    # cos(a0, p1) = 0.707 > 0.6: dropped; cos(a1, p1) = 0.707 but p1 is a1's positive; cos(a1, p0) = 0.0995
    assert mask is not None and mask.tolist() == [[False, True], [False, False]]


def test_the_guide_drops_candidates_it_rates_above_the_positive() -> None:
    """The guide's own vectors decide: a candidate the guide rates closer to the anchor than
    its positive (less the margin) is dropped, whatever the student's embeddings say."""
    objective = SimCSEObjective("sup", LossConfig(gather=False))
    table = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [1.0, 0.1]])  # rows of the guide's table
    guide = GuideFilter(table, margin=0.0)
    problem = objective.problem(torch.randn(4, 3))  # 2 pairs: rows (0, 1), (2, 3)
    batch = {"guide_rows": torch.tensor([0, 1, 2, 3])}  # anchor 0 = t0, positive 0 = t1, anchor 1 = t2, positive 1 = t3
    mask = guide(problem, objective, batch, None)
    # anchor 0: positive t1 scores 0.8; candidate t3 scores 0.995 > 0.8: dropped. anchor 1: positive t3 0.0995;
    # candidate t1 0.6 > 0.0995: dropped.
    assert mask is not None and mask.tolist() == [[False, True], [True, False]]
    assert GuideFilter(table, margin=0.5)(problem, objective, batch, None).tolist() == [[False, True], [True, False]]
    with pytest.raises(ValueError, match="guide_rows"):
        guide(problem, objective, {}, None)


class Fixed:
    """A filter that drops the entries it was given."""

    def __init__(self, mask: list[list[bool]] | None, counter: str) -> None:
        self.mask, self.counter = None if mask is None else torch.tensor(mask), counter

    def __call__(self, *args: object) -> torch.Tensor | None:
        return self.mask


def test_drops_are_joined_and_counted_by_their_counters() -> None:
    """A masked filter counts only what no earlier filter dropped; a guided one all of its
    own; a filter with nothing to drop counts nothing; nothing is kept between calls."""
    _, problem = problem_of("sup", 4)
    text = Fixed([[False, True], [False, False]], "masked")
    similar = Fixed([[False, True], [True, False]], "masked")
    guide = Fixed([[False, True], [True, False]], "guided")
    dropped, gained = drop_negatives([text, Fixed(None, "masked"), similar, guide], problem, None, None, None)  # type: ignore[arg-type]
    assert dropped is not None and dropped.tolist() == [[False, True], [True, False]]
    assert {name: int(n) for name, n in gained.items()} == {"masked": 2, "guided": 2}
    assert drop_negatives([Fixed(None, "masked")], problem, None, None, None) == (None, {})  # type: ignore[arg-type]


def test_a_term_is_mixed_or_added_at_its_weight() -> None:
    rest, value = torch.tensor(2.0), torch.tensor(10.0)
    assert Term("teacher_loss", 0.25, torch.zeros, "simcse_loss").join(rest, value).item() == 0.75 * 2 + 0.25 * 10
    assert Term("quantized_loss", 0.5, torch.zeros, "float_loss", mixed=False).join(rest, value).item() == 2 + 0.5 * 10


def test_an_objective_keeps_its_parts_in_order_and_counts_what_they_return() -> None:
    """The filters in order (text, similarity, guide) and the terms (quantized, then the
    teacher's); the objective's tallies hold what the filters returned, batch by batch."""
    from simcse_kit.training.objective.objectives import TeacherTargets

    guide = GuideFilter(torch.randn(8, 3))
    teacher = TeacherTargets(torch.randn(8, 5), weight=0.5)
    cfg = LossConfig(gather=False, mask_false_negatives=True, false_negative_threshold=0.9, quantization="binary")
    objective = SimCSEObjective("unsup", cfg, teacher=teacher, guide=guide)
    assert [type(f).__name__ for f in objective.filters] == ["SameText", "TooSimilar", "GuideFilter"]
    assert [t.name for t in objective.terms] == ["quantized_loss", "teacher_loss"] and objective.side is None
    texts = ["a", "a", "b", "b", "a", "a", "c", "c"]
    batch = {"text_ids": text_ids(texts), "guide_rows": torch.arange(8), "teacher_rows": torch.arange(8)}
    embeddings = torch.randn(8, 6)
    objective.loss(embeddings, batch)
    problem = objective.problem(embeddings)
    dropped, gained = drop_negatives(objective.filters, problem, objective, batch, None)
    assert (
        dropped is not None and objective.last_masked == int(gained["masked"]) and objective.guided.last == int(gained["guided"])
    )
    assert objective.masked_negatives == int(gained["masked"]) and int(gained["masked"]) >= 4  # a's two copies
    assert set(objective.last_terms) == {"float_loss", "quantized_loss", "simcse_loss", "teacher_loss"}
