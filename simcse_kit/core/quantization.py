"""Quantization-aware training: the contrastive loss of the vectors a deployment stores.

:func:`straight_through` turns embeddings into the codes sentence-transformers'
``quantize_embeddings`` gives (int8 codes, or the +-1 signs behind binary codes) in the
forward pass, and passes the gradient straight through the rounding (Bengio et al., 2013's
straight-through estimator) in the backward pass:

* ``binary``: forward ``+1`` where ``x > 0`` else ``-1``; backward the identity. The dot
  product of two such vectors is ``D - 2 * hamming``, what a Hamming search ranks by.
* ``int8``: forward ``clip(floor((x - min) / step), 0, 255) - 128`` with ``step = (max - min) / 255``
  per dimension; backward ``1 / step``, the derivative of the unrounded map.

:func:`quantized_contrastive_loss` is :func:`~simcse_kit.core.losses.matryoshka_loss` (so
any InfoNCE/SupCon problem, on every Matryoshka prefix) of those codes: it trains the model
so that its *quantized* vectors keep the contrastive ranking. Quantizing per coordinate
commutes with taking a prefix, so a prefix of the codes is the code of the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from simcse_kit.core import losses

__all__ = ["TARGETS", "batch_ranges", "quantized_contrastive_loss", "straight_through"]

TARGETS = ("int8", "binary")
"""What a quantization-aware term trains for (``loss.quantization``)."""


def batch_ranges(*rows: torch.Tensor) -> torch.Tensor:
    """Per-dimension ``[min, max]`` of the rows, without gradient: ``[2, D]``, fp32 (fp64 stays fp64)."""
    stacked = torch.cat([r.detach() for r in rows]).to(torch.promote_types(rows[0].dtype, torch.float32))
    return torch.stack([stacked.min(dim=0).values, stacked.max(dim=0).values])


def straight_through(x: torch.Tensor, target: str, ranges: torch.Tensor | None = None) -> torch.Tensor:
    """Quantized codes in the forward pass, the straight-through gradient in the backward one.

    Args:
        x: ``[N, D]`` embeddings.
        target: ``"binary"`` or ``"int8"``.
        ranges: int8 only: ``[2, D]`` per-dimension min and max (sentence-transformers'
            ``ranges``); values outside are clipped to the end codes.

    Returns:
        ``[N, D]`` in ``x``'s dtype (at least fp32): exactly the codes (+-1, or -128..127)
        forward; the gradient reaches ``x`` as through the identity (binary) or ``1 / step``
        (int8), clipped codes included.
    """
    if target not in TARGETS:
        raise ValueError(f"quantization target must be one of {TARGETS}, got {target!r}")
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    if target == "binary":
        hard = torch.where(x > 0, 1.0, -1.0).to(x.dtype)
        return hard + (x - x.detach())  # + an exact 0 forward: the codes, not x + (hard - x)'s rounding
    if ranges is None or ranges.shape != (2, x.shape[-1]):
        raise ValueError(f"int8 needs ranges of shape (2, {x.shape[-1]}), got {None if ranges is None else tuple(ranges.shape)}")
    # sentence-transformers' numpy arithmetic, so the codes are the same bits: ranges and
    # steps in fp32, then (x - start) / step in x's dtype.
    starts = ranges[0].to(torch.float32)
    steps = (ranges[1].to(torch.float32) - starts) / 255
    steps = torch.where(steps == 0, torch.ones_like(steps), steps)
    scaled = (x - starts.to(x.dtype)) / steps.to(x.dtype)
    hard = torch.clamp(torch.floor(scaled.detach()), 0, 255) - 128
    return hard + (scaled - scaled.detach())


def quantized_contrastive_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    target: str,
    *,
    ranges: torch.Tensor | None = None,
    dims: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """:func:`~simcse_kit.core.losses.matryoshka_loss` of the straight-through codes of
    ``anchors`` and ``candidates``.

    The logits are the cosines of the codes over tau: for binary codes ``1 - 2 hamming / D``,
    for int8 the cosine of the codes read as numbers, the similarities ``simcse-kit evaluate
    --embedding-precision`` scores.

    Args:
        anchors: ``[N, D]`` embeddings.
        candidates: ``[M, D]`` embeddings.
        target: ``"binary"`` or ``"int8"``.
        ranges: int8: ``[2, D]`` ranges; default :func:`batch_ranges` of the candidates
            (the batch calibrates itself, no state to carry between steps; gathered
            candidates give every process the same ranges).
        dims: Matryoshka prefixes (None: the full rows).
        weights: One weight per prefix.
        **kwargs: :func:`~simcse_kit.core.losses.contrastive_loss`'s problem (temperature,
            positives, exclusions, bias).

    Returns:
        Scalar loss.
    """
    if target == "int8" and ranges is None:
        ranges = batch_ranges(candidates)
    codes_a = straight_through(anchors, target, ranges)
    codes_c = straight_through(candidates, target, ranges)
    return losses.matryoshka_loss(codes_a, codes_c, dims, weights, **kwargs)
