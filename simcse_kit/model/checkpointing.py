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
Each block's class is swapped for a subclass that checkpoints its whole call (hooks included):
the weights, their names and the saved model are untouched, ``isinstance`` still holds, and
``copy.deepcopy`` of the model copies the blocks with their class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def transformer_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of transformer blocks: the ``nn.ModuleList`` whose elements share one
    class, with the most parameters (``None`` where there is none)."""
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) and len({type(b) for b in m}) == 1]
    return max(stacks, key=lambda s: sum(p.numel() for p in s.parameters()), default=None)


class CheckpointedBlock(nn.Module):
    """Mixed in before a block's own class by :func:`checkpoint_blocks`: the whole module call (its
    hooks included, as transformers' own checkpointed layers do, so an engine's pre-forward hook,
    FSDP's unshard for one, runs again for the recompute) under non-reentrant checkpointing."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = super().__call__
        if self.training and torch.is_grad_enabled():
            return checkpoint(call, *args, use_reentrant=False, **kwargs)
        return call(*args, **kwargs)


_CLASSES: dict[type, type] = {}  # one checkpointed subclass per block class


def checkpoint_blocks(blocks: nn.ModuleList) -> None:
    """Run each of ``blocks`` under non-reentrant checkpointing when training (idempotent): each
    block's class becomes a subclass of it with :class:`CheckpointedBlock` first."""
    for block in blocks:
        cls = type(block)
        if not issubclass(cls, CheckpointedBlock):
            if cls not in _CLASSES:
                _CLASSES[cls] = type(f"Checkpointed{cls.__name__}", (CheckpointedBlock, cls), {})
            block.__class__ = _CLASSES[cls]


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
    return blocks is not None and all(isinstance(b, CheckpointedBlock) for b in blocks)
