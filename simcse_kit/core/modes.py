"""The training modes as data: one row per mode, read by everything that depends on it.

A mode says which data column each view of an example comes from and who is contrasted
with whom. The collator's columns (:data:`simcse_kit.core.batch.VIEW_COLUMNS`), the objective
(:meth:`simcse_kit.training.objective.objectives.SimCSEObjective.loss`), GradCache's count of negatives
(:func:`simcse_kit.training.objective.gradcache.effective_negatives`) and the config's mode list
(:data:`simcse_kit.config.run.MODES`) all read :data:`TABLE`, so a new mode is one new row.

Rows of a batch are example-major (:mod:`simcse_kit.core.batch`): the ``V`` views of example
``i`` are rows ``i*V .. i*V + V - 1``. Which views anchor and which are candidates in each
mode, ``hardneg`` with ``k`` negatives per example (:func:`mode` ``(name, negatives=k)``,
:func:`hardneg`), ``scored``'s score column (:attr:`Mode.score_column`) and ``unsup``'s two
forms (``loss.unsup_loss``): the table of ``docs/architecture.md``, "The modes" (the
columns each view is read from: :data:`TABLE` here, the file formats in ``docs/data.md``).
The module imports nothing, so the config (layer 0) can read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TEACHER_LOSSES = ("similarity", "embedding")
"""A teacher's term (``loss.teacher_loss``, ``TeacherTargets.kind``): its in-batch softmax matched, or its vectors."""

__all__ = [
    "PROMPT_NAMES",
    "TABLE",
    "UNSUP_LOSSES",
    "Contrast",
    "Mode",
    "contrast",
    "hard_negative_columns",
    "hardneg",
    "mode",
    "negatives_in",
]

UNSUP_LOSSES = ("views", "paper")
"""The two forms of ``unsup`` (``loss.unsup_loss``): the 2N-view NT-Xent, SimCSE's ``z1 . z2^T``."""

PROMPT_NAMES = ("query", "document")
"""The prompts a model may carry (``data.prompts``): view 0 (the anchor) is the query,
the other views (its positive, its hard negative) are documents."""


@dataclass(frozen=True)
class Contrast:
    """Who is contrasted with whom, in views of an example.

    Attributes:
        anchor_view: the view whose rows are the anchors; None: every row is an anchor,
            its candidates are all rows in batch order (itself excluded) and its
            positive is the other view of its example (two views).
        candidate_views: the views whose rows are the candidates, one block after
            another; an anchor's positive is its own example's row in the first block.
            With ``anchor_view`` None, all views.
        weighted_views: the candidate views whose rows of the anchor's own example enter
            the softmax weighted by ``loss.hard_negative_weight`` (hardneg's
            contradictions, one view per hard negative); ``()``: none.
    """

    anchor_view: int | None
    candidate_views: tuple[int, ...]
    weighted_views: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for view in self.weighted_views:
            if view not in self.candidate_views[1:]:
                raise ValueError(f"the weighted view {view} must be a candidate view after the positives'")

    @property
    def all_rows(self) -> bool:
        """True when every row is an anchor and every row a candidate (2N-view NT-Xent): an
        anchor is then among its own candidates, and its own column is excluded."""
        return self.anchor_view is None

    @property
    def weighted_blocks(self) -> tuple[int, ...]:
        """The candidate blocks of :attr:`weighted_views` (blocks in :attr:`candidate_views` order)."""
        return tuple(self.candidate_views.index(view) for view in self.weighted_views)

    def negatives(self, n_examples: int) -> int:
        """Negatives each anchor's softmax sees among ``n_examples`` examples' rows: every
        candidate but its positive (and itself, when it is a candidate)."""
        return n_examples * len(self.candidate_views) - 1 - int(self.all_rows)


@dataclass(frozen=True)
class Mode:
    """One training mode.

    Attributes:
        columns: the data column each view of an example is read from (view 0 the anchor's).
        contrast: SimCSE's ``z1 . z2^T`` form (``loss.unsup_loss: paper``, and the only
            form of the supervised modes).
        views_contrast: the 2N-view form ``loss.unsup_loss: views`` selects, where the
            mode has one (views that are the same sentence); None: ``contrast`` always.
        score_column: the data column of each example's graded label (one number per
            example, not a view), which the collator passes as ``scores``; None: unlabelled.
    """

    columns: tuple[str, ...]
    contrast: Contrast
    views_contrast: Contrast | None = None
    score_column: str | None = None

    def __post_init__(self) -> None:
        for form in (self.contrast, self.views_contrast):
            if form is None:
                continue
            used = [*form.candidate_views, *([] if form.anchor_view is None else [form.anchor_view])]
            if not all(0 <= v < self.n_views for v in used):
                raise ValueError(f"views {used} of {form} out of range for {self.n_views} views")
            if form.all_rows and (self.n_views != 2 or form.candidate_views != (0, 1)):
                raise ValueError("every row can anchor only with two views (each row's positive is the other)")

    @property
    def n_views(self) -> int:
        """``V``: rows per example in this mode's batches."""
        return len(self.columns)

    def contrast_for(self, unsup_loss: str) -> Contrast:
        """The form ``loss.unsup_loss`` selects (one of :data:`UNSUP_LOSSES`)."""
        return self.views_contrast if unsup_loss == "views" and self.views_contrast is not None else self.contrast


PAIRED = Contrast(anchor_view=0, candidate_views=(1,))
"""View 0 against view 1: SimCSE's ``z1 . z2^T``, ``N - 1`` negatives per anchor."""

TABLE: dict[str, Mode] = {
    "unsup": Mode(("sent0", "sent0"), PAIRED, views_contrast=Contrast(anchor_view=None, candidate_views=(0, 1))),
    "sup": Mode(("sent0", "sent1"), PAIRED),
    "hardneg": Mode(("sent0", "sent1", "hard_neg"), Contrast(anchor_view=0, candidate_views=(1, 2), weighted_views=(2,))),
    "scored": Mode(("sent0", "sent1"), PAIRED, score_column="score"),
}
"""Every mode, by name (the order is the config's and the CLI's)."""

NEGATIVES_MODE = "hardneg"
"""The mode whose examples carry hard negatives, one view each."""


def hard_negative_columns(k: int) -> tuple[str, ...]:
    """The columns of ``k`` hard negatives: ``hard_neg`` for one, else ``hard_neg_1 .. hard_neg_k``."""
    if k < 1:
        raise ValueError(f"the number of hard negatives must be >= 1, got {k}")
    return ("hard_neg",) if k == 1 else tuple(f"hard_neg_{i}" for i in range(1, k + 1))


def negatives_in(columns: Sequence[str]) -> int:
    """``k``, the hard negatives per example of a dataset with these columns
    (:func:`hard_negative_columns`: ``hard_neg``, or ``hard_neg_1 .. hard_neg_k``); 1
    when it has neither (the other modes)."""
    k = 0
    while f"hard_neg_{k + 1}" in columns:
        k += 1
    return max(k, 1)


def hardneg(k: int) -> Mode:
    """``hardneg`` with ``k`` hard negatives per example: ``V = 2 + k`` views (anchor,
    positive, ``hard_neg_1 .. hard_neg_k``), every negative view a candidate block and
    weighted. ``k = 1`` is :data:`TABLE`'s row itself (column ``hard_neg``)."""
    if k == 1:
        return TABLE[NEGATIVES_MODE]
    base = TABLE[NEGATIVES_MODE]
    negatives = tuple(range(2, 2 + k))
    columns = (*base.columns[:2], *hard_negative_columns(k))
    weighted = negatives if base.contrast.weighted_views else ()
    return Mode(columns, Contrast(base.contrast.anchor_view, (*base.contrast.candidate_views[:1], *negatives), weighted))


def mode(name: str, negatives: int = 1) -> Mode:
    """The row of ``name`` (with ``negatives`` hard negatives per example, for
    ``hardneg``); a clear error for an unknown mode."""
    try:
        row = TABLE[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; expected one of {sorted(TABLE)}") from None
    if negatives == 1:
        return row
    if name != NEGATIVES_MODE:
        raise ValueError(f"mode {name!r} has no hard negatives; {negatives} per example needs mode {NEGATIVES_MODE!r}")
    return hardneg(negatives)


def contrast(name: str, unsup_loss: str = "views", negatives: int = 1) -> Contrast:
    """The contrast of mode ``name`` under ``loss.unsup_loss``, ``negatives`` hard negatives per example."""
    return mode(name, negatives).contrast_for(unsup_loss)
