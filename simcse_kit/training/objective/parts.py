"""The parts of a text objective (:class:`~simcse_kit.training.objective.objectives.SimCSEObjective`):
the contrastive problem a batch poses, the filters that take negatives out of it, and the
weighted terms that join the contrastive loss.

* :class:`Problem`: anchors, candidates (every process's, then the queue's), each anchor's
  positive column, its own column where every row is an anchor, and the hard negatives' logit
  bias; :meth:`Problem.exclusions` adds the never-a-negative self entries to what the
  filters dropped.
* The negative filters, applied in order, each ``filter(problem, layout, batch, queue) ->
  mask or None`` (:class:`NegativeFilter`): :class:`SameText` (the false negatives by
  text, the queue's own copies included), :class:`TooSimilar` (``loss.false_negative_threshold``)
  and :class:`GuideFilter` (``loss.guide``). :func:`drop_negatives` joins their masks and
  returns what each counter gained; nothing here keeps a count.
* :class:`Term`: a named, weighted term beside the contrastive one (the quantized codes',
  a teacher's, a scored mode's, ``loss.distill``'s), joined to it by its own rule.

None of these imports the config: :class:`LossSettings` says what they read of ``loss.*``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from simcse_kit.core import masks
from simcse_kit.training.engine.steps import Batch, Queue

__all__ = [
    "GuideFilter",
    "Layout",
    "LossSettings",
    "NegativeFilter",
    "Problem",
    "SameText",
    "Term",
    "TooSimilar",
    "drop_negatives",
]


class LossSettings(Protocol):
    """What an objective reads of ``loss.*`` (:class:`~simcse_kit.config.sections.LossConfig` has it all)."""

    @property
    def temperature(self) -> float: ...
    @property
    def hard_negative_weight(self) -> float: ...
    @property
    def unsup_loss(self) -> str: ...
    @property
    def gather(self) -> bool: ...
    @property
    def mask_false_negatives(self) -> bool: ...
    @property
    def false_negative_threshold(self) -> float | None: ...
    @property
    def matryoshka_dims(self) -> Sequence[int] | None: ...
    @property
    def matryoshka_weights(self) -> Sequence[float] | None: ...
    @property
    def quantization(self) -> str | None: ...
    @property
    def quantization_weight(self) -> float: ...
    @property
    def score_loss(self) -> str: ...
    @property
    def score_scale(self) -> float: ...
    @property
    def score_weight(self) -> float: ...
    @property
    def distill(self) -> str | None: ...
    @property
    def distill_weight(self) -> float: ...
    @property
    def distill_student_temperature(self) -> float | None: ...
    @property
    def distill_teacher_temperature(self) -> float: ...


class Layout(Protocol):
    """How a batch's per-row values split into anchors and candidate blocks, and how they are
    gathered across processes (the objective's mode and ``loss.gather``)."""

    @property
    def all_rows(self) -> bool:
        """Every row is an anchor (unsup's 2N-view form)."""
        ...

    def views(self, rows: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]: ...

    def gather_ids(self, ids: torch.Tensor) -> torch.Tensor: ...

    def row_ids(self, batch: Batch | None, n_rows: int) -> torch.Tensor | None: ...


@dataclass
class Problem:
    """One contrastive problem, as :func:`simcse_kit.core.losses.contrastive_loss` takes it.

    Attributes:
        anchors: ``[N, H]`` this process's anchors.
        candidates: ``[M, H]`` every process's candidate blocks, block after block, then the
            queue's rows.
        positive: ``[N]`` each anchor's positive column.
        itself: ``[N]`` each anchor's own column where every row is an anchor, else None.
        offset: where this process's rows start in each gathered block.
        block_rows: rows of one gathered block.
        in_batch: candidate columns before the queue's.
        rows: the batch's rows on this process (``N V``).
        bias: the hard negatives' logit bias (``log alpha`` on each anchor's own), or None.
    """

    anchors: torch.Tensor
    candidates: torch.Tensor
    positive: torch.Tensor
    itself: torch.Tensor | None
    offset: int
    block_rows: int
    in_batch: int
    rows: int
    bias: torch.Tensor | None = None

    def exclusions(self, dropped: torch.Tensor | None) -> torch.Tensor | None:
        """The ``[N, M]`` entries no anchor may take as a negative: those ``dropped`` by the
        filters and, where every row is an anchor, each anchor itself."""
        if self.itself is None:
            return dropped
        own = masks.self_mask(self.anchors.shape[0], self.candidates.shape[0], self.offset, self.anchors.device)
        return own if dropped is None else own | dropped


class NegativeFilter(Protocol):
    """Candidates that must not count as an anchor's negatives: ``[N, M]`` True where dropped,
    or None when it drops nothing for this batch. ``counter``: the tally its drops count in
    (``"masked"``: only the entries no earlier filter dropped; ``"guided"``: all of its own)."""

    @property
    def counter(self) -> str: ...

    def __call__(self, problem: Problem, layout: Layout, batch: Batch | None, queue: Queue | None) -> torch.Tensor | None: ...


@dataclass
class SameText:
    """The false negatives by text (``loss.mask_false_negatives``): candidates whose text is
    the anchor's or its positive's, among every process's rows and the queue's own copies
    (:func:`masks.false_negative_mask`; the batch's and the queue's ``text_ids``)."""

    counter: ClassVar[str] = "masked"

    def __call__(self, problem: Problem, layout: Layout, batch: Batch | None, queue: Queue | None) -> torch.Tensor | None:
        ids = layout.row_ids(batch, problem.rows)
        if ids is None:
            return None
        anchor_ids, id_blocks = layout.views(ids)
        blocks = [layout.gather_ids(block) for block in id_blocks]
        if queue is not None:
            if queue[1] is None:
                raise ValueError("the queue's text ids are required when masking false negatives")
            blocks.append(queue[1].to(anchor_ids.device))
        column_ids = torch.cat(blocks)
        # A positive column also stands for its anchor: an NLI premise seen twice has
        # each copy's entailment as a positive of both.
        group = None
        if not layout.all_rows:
            pair_ids = layout.gather_ids(anchor_ids)
            group = torch.cat([pair_ids, column_ids[pair_ids.shape[0] :]])
        return masks.false_negative_mask(anchor_ids, column_ids, problem.positive, problem.itself, group)


@dataclass
class TooSimilar:
    """Candidates whose cosine with the anchor exceeds ``threshold``
    (``loss.false_negative_threshold``, :func:`masks.similar_candidate_mask`); never the positive."""

    threshold: float
    counter: ClassVar[str] = "masked"

    def __call__(self, problem: Problem, layout: Layout, batch: Batch | None, queue: Queue | None) -> torch.Tensor | None:
        return masks.similar_candidate_mask(problem.anchors, problem.candidates, self.threshold, problem.positive, problem.itself)


@dataclass
class GuideFilter:
    """A guide's vetting of negatives (``loss.guide``; :func:`simcse_kit.training.wiring.inputs.load_guide`):
    every candidate (in-batch rows of every process, hard negatives, the queue's rows) that
    the guide rates above the anchor's positive, less the margin, is dropped
    (:func:`masks.guided_mask`, GISTEmbed's rule). The batch's ``guide_rows`` and the queue's
    say which of its vectors each row is.

    Attributes:
        vectors: ``[U, D']`` the guide's vectors of the distinct training sentences (any
            width); a batch's ``guide_rows`` ``[B]`` (and the queue's) index it.
        margin: ``loss.guide_margin``.
        strategy: ``loss.guide_margin_strategy``, ``"absolute"`` or ``"relative"``
            (:func:`simcse_kit.core.masks.guide_threshold`).
    """

    vectors: torch.Tensor
    margin: float = 0.0
    strategy: str = "absolute"
    counter: ClassVar[str] = "guided"

    def __post_init__(self) -> None:
        if self.strategy not in masks.MARGIN_STRATEGIES:
            raise ValueError(f"guide margin strategy must be one of {masks.MARGIN_STRATEGIES}, got {self.strategy!r}")

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The guide's vectors of table rows ``index`` ``[K]``: ``[K, D']`` on its device."""
        if self.vectors.device != index.device:  # moved once, to the training device
            self.vectors = self.vectors.to(index.device)
        return self.vectors[index]

    def __call__(self, problem: Problem, layout: Layout, batch: Batch | None, queue: Queue | None) -> torch.Tensor | None:
        if batch is None or "guide_rows" not in batch:
            raise ValueError("a guide needs the batch's guide_rows (ContrastiveCollator(guide_index=...))")
        device = problem.positive.device
        anchor_rows, blocks = layout.views(batch["guide_rows"].to(device))
        parts = [layout.gather_ids(block) for block in blocks]
        if queue is not None:
            if queue.guide_rows is None:
                raise ValueError("the queue's guide rows are required with a guide (MomentumQueue(guide=True))")
            parts.append(queue.guide_rows.to(device))
        anchors, candidates = self.rows(anchor_rows), self.rows(torch.cat(parts))
        return masks.guided_mask(anchors, candidates, problem.positive, self.margin, self.strategy, problem.itself)


def drop_negatives(
    filters: Sequence[NegativeFilter], problem: Problem, layout: Layout, batch: Batch | None, queue: Queue | None
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """Every filter's mask joined (None when none drops anything), and what each counter
    gained: ``"masked"`` the entries a ``masked`` filter dropped that no earlier one had,
    ``"guided"`` every entry a ``guided`` filter dropped. Device tensors, not read back."""
    dropped: torch.Tensor | None = None
    gained: dict[str, torch.Tensor] = {}
    for drop in filters:
        mask = drop(problem, layout, batch, queue)
        if mask is None:
            continue
        new = mask & ~dropped if drop.counter == "masked" and dropped is not None else mask
        gained[drop.counter] = gained[drop.counter] + new.sum() if drop.counter in gained else new.sum()
        dropped = mask if dropped is None else dropped | mask
    return dropped, gained


@dataclass(frozen=True)
class Term:
    """A term beside the contrastive loss: its metric ``name``, its ``weight`` and its value
    (``fn``). ``mixed``: ``(1 - w) * rest + w * term`` (a teacher's, a scored mode's,
    ``loss.distill``'s); else added, ``rest + w * term`` (the quantized codes'). ``rest``
    names what it joins in the logged terms."""

    name: str
    weight: float
    fn: Callable[..., torch.Tensor]
    rest: str
    mixed: bool = True

    def join(self, rest: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The loss with this term: mixed or added, at its weight."""
        return (1 - self.weight) * rest + self.weight * value if self.mixed else rest + self.weight * value
