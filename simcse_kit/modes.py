"""The training modes as data: one row per mode, read by everything that depends on it.

A mode says which data column each view of an example comes from and who is contrasted
with whom. The collator's columns (:data:`simcse_kit.batch.VIEW_COLUMNS`), the objective
(:meth:`simcse_kit.objectives.SimCSEObjective.loss`), GradCache's count of negatives
(:func:`simcse_kit.gradcache.effective_negatives`) and the config's mode list
(:data:`simcse_kit.config.MODES`) all read :data:`TABLE`, so a new mode is one new row.

Rows of a batch are example-major (:mod:`simcse_kit.batch`): the ``V`` views of example
``i`` are rows ``i*V .. i*V + V - 1``.

+-----------+-----------------------------+-----------------+------------+----------+
| mode      | views (columns)             | anchors         | candidates | weighted |
+===========+=============================+=================+============+==========+
| unsup     | sent0, sent0                | view 0          | view 1     |          |
| (views)   |                             | every row       | every row  |          |
| sup       | sent0, sent1                | view 0          | view 1     |          |
| hardneg   | sent0, sent1, hard_neg      | view 0          | views 1, 2 | view 2   |
+-----------+-----------------------------+-----------------+------------+----------+

``unsup`` has two forms, chosen by ``loss.unsup_loss``: ``"paper"`` is SimCSE's
``z1 . z2^T`` like ``sup``; ``"views"`` is NT-Xent over the 2N views (both views are the
same sentence, so either can anchor): every row against every row, itself excluded. The
module imports nothing, so the config (layer 0) can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TABLE", "Contrast", "Mode", "contrast", "mode"]


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
        weighted_view: the candidate view whose row of the anchor's own example enters
            the softmax weighted by ``loss.hard_negative_weight`` (hardneg's
            contradiction); None: no weighted view.
    """

    anchor_view: int | None
    candidate_views: tuple[int, ...]
    weighted_view: int | None = None

    def __post_init__(self) -> None:
        if self.weighted_view is not None and self.weighted_view not in self.candidate_views[1:]:
            raise ValueError(f"the weighted view {self.weighted_view} must be a candidate view after the positives'")

    @property
    def all_rows(self) -> bool:
        """True when every row is an anchor and every row a candidate (2N-view NT-Xent): an
        anchor is then among its own candidates, and its own column is excluded."""
        return self.anchor_view is None

    @property
    def weighted_block(self) -> int | None:
        """The candidate block of :attr:`weighted_view` (blocks in :attr:`candidate_views` order)."""
        return None if self.weighted_view is None else self.candidate_views.index(self.weighted_view)

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
    """

    columns: tuple[str, ...]
    contrast: Contrast
    views_contrast: Contrast | None = None

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
        """The form ``loss.unsup_loss`` selects (``"views"`` or ``"paper"``)."""
        return self.views_contrast if unsup_loss == "views" and self.views_contrast is not None else self.contrast


PAIRED = Contrast(anchor_view=0, candidate_views=(1,))
"""View 0 against view 1: SimCSE's ``z1 . z2^T``, ``N - 1`` negatives per anchor."""

TABLE: dict[str, Mode] = {
    "unsup": Mode(("sent0", "sent0"), PAIRED, views_contrast=Contrast(anchor_view=None, candidate_views=(0, 1))),
    "sup": Mode(("sent0", "sent1"), PAIRED),
    "hardneg": Mode(("sent0", "sent1", "hard_neg"), Contrast(anchor_view=0, candidate_views=(1, 2), weighted_view=2)),
}
"""Every mode, by name (the order is the config's and the CLI's)."""


def mode(name: str) -> Mode:
    """The row of ``name``; a clear error for an unknown mode."""
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; expected one of {sorted(TABLE)}") from None


def contrast(name: str, unsup_loss: str = "views") -> Contrast:
    """The contrast of mode ``name`` under ``loss.unsup_loss``."""
    return mode(name).contrast_for(unsup_loss)
