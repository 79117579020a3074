"""The batch layout: which rows of a collated batch are which view of which example.

This module is the one home of that fact; the collator, the objective, GradCache and
the momentum queue all ask it (which view plays which part in the loss is
:mod:`simcse_kit.core.modes`' table). Every mode's batch is *example-major*: the ``V`` views
of example ``i`` are rows ``i*V .. i*V + V - 1``.

  * ``unsup``, V = 2: (sent0, sent0), dropout makes the two views differ:
    ``[a, a, b, b, ...]``;
  * ``sup``, V = 2: (sent0, sent1), premise and entailment: ``[p1, e1, p2, e2, ...]``;
  * ``hardneg``, V = 3: (sent0, sent1, hard_neg), + contradiction:
    ``[p1, e1, c1, p2, e2, c2, ...]``;
  * ``hardneg`` with ``k`` hard negatives, V = 2 + k: (sent0, sent1, hard_neg_1 ..
    hard_neg_k): ``[p1, e1, c1_1, .., c1_k, p2, e2, c2_1, .., c2_k, ...]``.

Example-major rows keep an example's views together, so any split on a multiple of
``V`` rows (GradCache's chunks, uneven per-process batches) holds whole examples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from simcse_kit.core import modes

__all__ = [
    "MODEL_INPUTS",
    "PLAN_INPUTS",
    "VIEW_COLUMNS",
    "batch_texts",
    "model_inputs",
    "split_views",
    "text_ids",
    "view_columns",
    "view_prompts",
    "view_rows",
    "views_per_example",
]

VIEW_COLUMNS: dict[str, tuple[str, ...]] = {name: row.columns for name, row in modes.TABLE.items()}
"""Per mode, the data column each view of an example is read from (view 0 is the anchor);
:data:`simcse_kit.core.modes.TABLE`'s columns."""

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""The keys of a collated batch that the encoder takes; others (``text_ids``) are not for it."""


def views_per_example(mode: str, negatives: int = 1) -> int:
    """``V``: rows per example in a batch of ``mode`` (``negatives`` hard negatives per example)."""
    return modes.mode(mode, negatives).n_views


def view_columns(mode: str, negatives: int = 1) -> tuple[str, ...]:
    """The data column of each view of ``mode`` with ``negatives`` hard negatives per
    example (:data:`VIEW_COLUMNS` for one)."""
    return modes.mode(mode, negatives).columns


def batch_texts(examples: Sequence[Mapping[str, str]], mode: str, negatives: int = 1) -> list[str]:
    """The texts of a batch's rows, example-major: ``N * V`` strings."""
    columns = view_columns(mode, negatives)  # a clear error for an unknown mode
    return [ex[col] for ex in examples for col in columns]


PROMPT_NAMES = modes.PROMPT_NAMES
"""The prompts a model may carry (``data.prompts``, :data:`simcse_kit.core.modes.PROMPT_NAMES`):
view 0 (the anchor) is the query, the other views (its positive, its hard negative) are documents."""


def view_prompts(prompts: Mapping[str, str] | None, mode: str, negatives: int = 1) -> tuple[str, ...]:
    """The text put before each view's rows: ``prompts["query"]`` for view 0,
    ``prompts["document"]`` for the others (``""`` where unset); ``()`` without prompts.

    In ``unsup`` the two views are the same sentence: with both prompts it learns to
    match a sentence as a query with itself as a document.
    """
    if not prompts:
        return ()
    n_views = views_per_example(mode, negatives)
    return (prompts.get("query", ""),) + (prompts.get("document", ""),) * (n_views - 1)


def view_rows(n_rows: int, n_views: int, view: int) -> slice:
    """The rows of view ``view`` (one per example) in a batch of ``n_rows`` rows."""
    if n_rows % n_views:
        raise ValueError(f"{n_rows} rows are not whole examples of {n_views} views")
    if not 0 <= view < n_views:
        raise ValueError(f"view must be in [0, {n_views}), got {view}")
    return slice(view, n_rows, n_views)


def split_views(rows: torch.Tensor, n_views: int) -> tuple[torch.Tensor, ...]:
    """Turn ``[N*V, ...]`` rows into ``V`` tensors of ``[N, ...]``, view by view.

    The tensors are strided views of ``rows`` (no copy), so gradients flow back to it.

    Args:
        rows: ``[N*V, ...]`` embeddings (or per-row ids) in batch order.
        n_views: ``V``.

    Returns:
        ``V`` tensors; the ``v``-th holds view ``v`` of every example, ``[N, ...]``.
    """
    return tuple(rows[view_rows(rows.shape[0], n_views, v)] for v in range(n_views))


PLAN_INPUTS = ("pack_source", "pack_index", "pack_position_ids", "pack_segment")
"""The keys of a packing plan made by the collator (:func:`simcse_kit.model.packing.plan_batch`), in that order:
model inputs of the whole batch only, since a plan cannot be cut by rows."""


def model_inputs(batch: Mapping[str, torch.Tensor], rows: slice | None = None) -> dict[str, torch.Tensor]:
    """The encoder's inputs of ``batch`` (:data:`MODEL_INPUTS`), optionally only ``rows``.

    The whole batch also passes its packing plan (:data:`PLAN_INPUTS`) where it has
    one; ``rows`` drops it (the plan packs all the rows together), and a packing model
    then plans the slice itself.
    """
    if rows is None:
        return {k: v for k, v in batch.items() if k in MODEL_INPUTS or k in PLAN_INPUTS}
    return {k: v[rows] for k, v in batch.items() if k in MODEL_INPUTS}


def text_ids(texts: Sequence[str]) -> torch.Tensor:
    """A stable 64-bit id per text: equal texts, equal ids, on every process and run.

    The collator adds them as ``text_ids`` so false negatives (two rows with the same
    text) can be found after gathering across processes and in the momentum queue.
    Python's ``hash`` is salted per process, so it would give different ids on
    different ranks; an 8-byte BLAKE2b digest is stable and collides with
    probability about ``n^2 / 2^65`` (negligible for any batch or queue).

    Args:
        texts: ``N`` strings, compared exactly (no case folding or whitespace change).

    Returns:
        ``[N]`` int64 tensor.
    """
    ids = [int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little", signed=True) for t in texts]
    return torch.tensor(ids, dtype=torch.int64)
