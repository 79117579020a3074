"""Gradient checkpointing for any encoder: transformers' own where the model has it, else per block.

transformers 5 implements checkpointing per architecture, and some encoders have none: MPNet
(all-mpnet-base-v2, the usual teacher and a common backbone) reports
``supports_gradient_checkpointing = False``. The fallback here does what transformers' layers
do: each transformer block (the elements of the model's largest ``nn.ModuleList`` of one
class: ``encoder.layer`` in the BERT family; with them every block of that class, as Funnel's
lists of layers) runs under ``torch.utils.checkpoint``
(non-reentrant) while training with gradients on, so only the blocks' inputs are kept and
each block's activations are recomputed in the backward pass.

Non-reentrant checkpointing saves and restores torch's random state around the recompute,
so dropout (and the fast dropout of :mod:`~simcse_kit.model.fastpath`, which draws from the
same generator) draws the same masks twice: the gradients are those of the plain model.
Each block's class is swapped for a subclass that checkpoints its whole call (hooks included):
the weights, their names and the saved model are untouched, ``isinstance`` still holds, and
``copy.deepcopy`` of the model copies the blocks with their class. Before they are wrapped, one
probe forward counts the blocks it calls (:func:`blocks_called`): blocks the forward never calls
(Funnel's lists of layers were taken for blocks once, and nothing was recomputed) are refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)


CONTAINERS = (nn.ModuleList, nn.ModuleDict)  # iterated by their owner, never called: not blocks


def _stacks(model: nn.Module) -> list[nn.ModuleList]:
    """The ``nn.ModuleList``s of ``model`` whose elements share one class that is not a container."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.ModuleList) and len(m) and len({type(b) for b in m}) == 1 and not isinstance(m[0], CONTAINERS)
    ]


def transformer_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of transformer blocks: the ``nn.ModuleList`` whose elements share one
    class (not a list: Funnel's ``encoder.blocks`` holds lists of layers), with the most
    parameters (``None`` where there is none)."""
    return max(_stacks(model), key=lambda s: sum(p.numel() for p in s.parameters()), default=None)


def all_blocks(model: nn.Module) -> list[nn.Module]:
    """Every block of the class of :func:`transformer_blocks`' elements, in every such stack
    (Funnel keeps its layers in one list per block of the funnel)."""
    heaviest = transformer_blocks(model)
    if heaviest is None:
        return []
    kind = type(heaviest[0])
    return [block for stack in _stacks(model) if type(stack[0]) is kind for block in stack]


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


def checkpoint_blocks(blocks: Iterable[nn.Module]) -> None:
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
    blocks = all_blocks(encoder)
    if not blocks:
        raise ValueError(f"{type(encoder).__name__} has no gradient checkpointing and no stack of blocks to checkpoint")
    called = blocks_called(encoder, blocks)
    if called == 0:
        raise ValueError(
            f"{type(encoder).__name__}'s {len(blocks)} {type(blocks[0]).__name__} blocks are not called in its forward, "
            "so none would be recomputed"
        )
    if called is not None and called < len(blocks):
        name = type(encoder).__name__
        logger.warning("gradient checkpointing: only %d of %s's %d blocks run in its forward", called, name, len(blocks))
    checkpoint_blocks(blocks)
    return "blocks"


PROBE_TOKENS = 8  # a probe text's length: long enough for Funnel to pool


def blocks_called(encoder: nn.Module, blocks: list[nn.Module]) -> int | None:
    """How many of ``blocks`` a forward of ``encoder`` calls, counted by forward pre-hooks on
    one short probe text in eval mode without gradients (no dropout draw: the run's random
    stream is untouched); None where the probe cannot run (the count is then unknown)."""
    seen: set[int] = set()
    handles = [block.register_forward_pre_hook(lambda module, _: seen.add(id(module))) for block in blocks]
    vocab = getattr(getattr(encoder, "config", None), "vocab_size", None) or PROBE_TOKENS
    ids = torch.arange(PROBE_TOKENS).remainder(vocab).unsqueeze(0)
    device = next((p.device for p in encoder.parameters()), torch.device("cpu"))
    was_training = encoder.training
    try:
        with torch.no_grad():
            encoder.eval()(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device))
    except Exception as exc:  # noqa: BLE001 - any model's own failure: the count is unknown, not an error of the run
        logger.warning("gradient checkpointing: cannot verify that %s calls its blocks (%s)", type(encoder).__name__, exc)
        return None
    finally:
        encoder.train(was_training)
        for handle in handles:
            handle.remove()
    return len(seen)


def is_checkpointed(encoder: Any) -> bool:
    """Whether ``encoder`` recomputes its blocks in the backward pass (either way)."""
    if any(getattr(m, "gradient_checkpointing", False) is True for m in encoder.modules()):  # transformers' own
        return True
    blocks = all_blocks(encoder)
    return bool(blocks) and all(isinstance(b, CheckpointedBlock) for b in blocks)
