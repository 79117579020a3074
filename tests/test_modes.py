"""The per-mode table (simcse_kit.core.modes): known answers, its readers agree with it, a new
row is a new loss with no code, and a bad row fails when it is written."""

from __future__ import annotations

import pytest
import torch
from test_objectives import TAU, reference

from simcse_kit.config import run as config
from simcse_kit.config.run import LossConfig
from simcse_kit.core import modes
from simcse_kit.core.batch import VIEW_COLUMNS, views_per_example
from simcse_kit.core.modes import Contrast, Mode
from simcse_kit.training.objective.gradcache import effective_negatives
from simcse_kit.training.objective.objectives import SimCSEObjective


def test_the_table_by_hand() -> None:
    assert modes.contrast("unsup", "views") == Contrast(anchor_view=None, candidate_views=(0, 1))
    assert modes.contrast("unsup", "paper") == modes.contrast("sup", "views") == Contrast(anchor_view=0, candidate_views=(1,))
    hardneg = modes.contrast("hardneg")
    got = (hardneg.anchor_view, hardneg.candidate_views, hardneg.weighted_views, hardneg.weighted_blocks)
    assert got == (0, (1, 2), (2,), (1,))
    assert modes.contrast("unsup").all_rows and not hardneg.all_rows
    # Negatives per anchor among 8 examples: 2N - 2, N - 1, N - 1, 2N - 1.
    counts = [
        modes.contrast(m, u).negatives(8)
        for m, u in [("unsup", "views"), ("unsup", "paper"), ("sup", "views"), ("hardneg", "views")]
    ]
    assert counts == [14, 7, 7, 15]


def test_every_reader_reads_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    assert VIEW_COLUMNS == {name: row.columns for name, row in modes.TABLE.items()}
    assert config.MODES == tuple(modes.TABLE) == ("unsup", "sup", "hardneg", "scored")
    assert [views_per_example(m) for m in config.MODES] == [2, 2, 3, 2]
    assert effective_negatives("hardneg", 8, world_size=2) == 31
    # A changed row changes GradCache's count: nothing restates the table.
    monkeypatch.setitem(modes.TABLE, "hardneg", Mode(("sent0", "sent1", "hard_neg"), modes.PAIRED))
    assert effective_negatives("hardneg", 8, world_size=2) == 15


def test_a_new_row_is_a_new_loss_without_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows written into the table drive SimCSEObjective.loss: the entailments as anchors
    against the premises (the sup loss with the views swapped), and a three-view row
    without a weighted view (the hardneg loss with alpha ignored: the table, not the
    config, says which view is weighted)."""
    monkeypatch.setitem(modes.TABLE, "reverse", Mode(("sent0", "sent1"), Contrast(anchor_view=1, candidate_views=(0,))))
    monkeypatch.setitem(
        modes.TABLE, "triplet", Mode(("sent0", "sent1", "hard_neg"), Contrast(anchor_view=0, candidate_views=(1, 2)))
    )
    g = torch.Generator().manual_seed(0)
    pairs = torch.randn(10, 8, generator=g, dtype=torch.float64)
    swapped = pairs.view(5, 2, 8).flip(1).reshape(10, 8)
    got = SimCSEObjective("reverse", LossConfig(temperature=TAU)).loss(pairs).item()
    assert got == pytest.approx(reference("sup", swapped), rel=1e-10)
    assert abs(got - reference("sup", pairs)) > 1e-3  # the swap matters
    triples = torch.randn(15, 8, generator=g, dtype=torch.float64)
    got = SimCSEObjective("triplet", LossConfig(temperature=TAU, hard_negative_weight=2.5)).loss(triples).item()
    assert got == pytest.approx(reference("hardneg", triples, alpha=1.0), rel=1e-10)
    assert abs(got - reference("hardneg", triples, alpha=2.5)) > 1e-3


def test_a_bad_row_fails_when_written() -> None:
    with pytest.raises(ValueError, match="weighted view 1"):
        Contrast(anchor_view=0, candidate_views=(1,), weighted_views=(1,))  # the positives' view
    with pytest.raises(ValueError, match="weighted view 2"):
        Contrast(anchor_view=0, candidate_views=(1,), weighted_views=(2,))  # not a candidate
    with pytest.raises(ValueError, match="out of range for 2 views"):
        Mode(("sent0", "sent1"), Contrast(anchor_view=0, candidate_views=(2,)))
    with pytest.raises(ValueError, match="only with two views"):
        Mode(("sent0", "sent1", "hard_neg"), modes.PAIRED, views_contrast=Contrast(anchor_view=None, candidate_views=(0, 1, 2)))
    with pytest.raises(ValueError, match=r"unknown mode 'pairs'; expected one of \['hardneg', 'scored', 'sup', 'unsup'\]"):
        SimCSEObjective("pairs", LossConfig())
