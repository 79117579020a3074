"""Gradient checkpointing for any encoder: transformers' own where the model has it, else per block.

transformers 5 implements checkpointing per architecture, and some encoders have none: MPNet
(all-mpnet-base-v2, the usual teacher and a common backbone) reports
``supports_gradient_checkpointing = False``. The fallback here does what transformers' layers
do: each transformer block (the elements of the model's largest ``nn.ModuleList`` of one
class: ``encoder.layer`` in the BERT family) runs under ``torch.utils.checkpoint``
(non-reentrant) while training with gradients on, so only the blocks' inputs are kept and
each block's activations are recomputed in the backward pass.

Non-reentrant checkpointing saves and restores torch's random state around the recompute,
so dropout (and the fast dropout of :mod:`~simcse_kit.model.fastpath`, which draws from the
same generator) draws the same masks twice: the gradients are those of the plain model.
Only the block's ``forward`` is replaced, on the instance: the weights, their names and the
saved model are untouched, and ``copy.deepcopy`` of the model rebinds the wrapper to the copy.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_UNCHECKED = "_simcse_kit_unchecked_forward"  # the block's own forward, bound to it


def transformer_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of transformer blocks: the ``nn.ModuleList`` whose elements share one
    class, with the most parameters (``None`` where there is none)."""
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and len({type(b) for b in m}) == 1]
    return max(stacks, key=lambda s: sum(p.numel() for p in s.parameters()), default=None)


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    inner = getattr(self, _UNCHECKED)
    if self.training and torch.is_grad_enabled():
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)
    return inner(*args, **kwargs)


def checkpoint_blocks(blocks: nn.ModuleList) -> None:
    """Run each of ``blocks`` under non-reentrant checkpointing when training (idempotent)."""
    for block in blocks:
        if _UNCHECKED not in vars(block):
            setattr(block, _UNCHECKED, block.forward)
            block.forward = types.MethodType(_checkpointed_forward, block)


def enable_gradient_checkpointing(encoder: Any) -> str:
    """Checkpoint ``encoder`` (a transformers ``PreTrainedModel``); returns how: ``"transformers"``
    (the model's own) or ``"blocks"`` (:func:`checkpoint_blocks` on :func:`transformer_blocks`).
    Raises ``ValueError`` where the model has neither."""
    if getattr(encoder, "supports_gradient_checkpointing", False):
        # transformers 5.24 renamed it (the old name warns); older releases have only the old one.
        if hasattr(encoder, "activation_checkpointing_enable"):
            encoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "transformers"
    blocks = transformer_blocks(encoder)
    if blocks is None:
        raise ValueError(f"{type(encoder).__name__} has no gradient checkpointing and no stack of blocks to checkpoint")
    checkpoint_blocks(blocks)
    return "blocks"


def is_checkpointed(encoder: Any) -> bool:
    """Whether ``encoder`` recomputes its blocks in the backward pass (either way)."""
    if any(getattr(m, "gradient_checkpointing", False) is True for m in encoder.modules()):  # transformers' own
        return True
    blocks = transformer_blocks(encoder)
    return blocks is not None and all(_UNCHECKED in vars(b) for b in blocks)
