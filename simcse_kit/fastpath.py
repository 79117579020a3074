"""A cheaper dropout for training on CPU.

In unsupervised SimCSE dropout *is* the augmentation, so it runs on every activation of
every step: 19 dropout sites per BERT-6 forward. PyTorch's CPU dropout draws one
Bernoulli sample per element (``bernoulli_``), about 10% of a bf16 training step on the
default model. Here one 64-bit draw of the same generator gives four 16-bit uniforms,
compared against a threshold: about 3x cheaper per call (BENCHMARKS.md, issue 5).

The drop probability is rounded to a multiple of 1/65536 (0.1 -> 0.100006) and the
kept values are scaled by the exact inverse keep rate, so the expectation is unchanged.
Because the bits come from torch's default generator, ``torch.manual_seed``,
``fork_rng`` and GradCache's RNG replay work as with ``nn.Dropout``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

LEVELS = 1 << 16
ATTENTION_NAME = "simcse_fast_dropout"


def quantized_drop_rate(p: float) -> float:
    """The drop probability ``fast_dropout`` actually uses for ``p``."""
    return round(p * LEVELS) / LEVELS


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout of ``x`` with drop rate ``quantized_drop_rate(p)`` (always on)."""
    dropped = round(p * LEVELS)
    if dropped == 0:
        return x
    if dropped >= LEVELS:
        return torch.zeros_like(x)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    uniforms = bits.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]: all 64 bits are drawn
    keep = uniforms >= dropped - LEVELS // 2
    return torch.where(keep, x * (LEVELS / (LEVELS - dropped)), 0.0)


class FastDropout(nn.Module):
    """Drop-in for ``nn.Dropout`` using ``fast_dropout``; keeps ``p`` for code that reads it."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p) if self.training and self.p > 0 else x

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Bidirectional attention: SDPA when there is no dropout (eval), else the explicit
    softmax with ``fast_dropout`` on the probabilities (SDPA's CPU path with dropout is
    this same math, with ``bernoulli_``)."""
    if dropout == 0.0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # SDPA-style: True = attend
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:  # additive
            scores = scores + attention_mask[..., : key.shape[-2]]
    probs = fast_dropout(torch.softmax(scores, dim=-1), dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, _attention)
# Without a registered mask builder transformers passes *no* mask to a custom attention:
# padding would be attended to. SDPA's boolean mask is what ``_attention`` expects.
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every ``nn.Dropout`` in ``model`` for ``FastDropout`` and route the attention
    of every Hugging Face sub-model through ``_attention``; returns the swaps made."""
    swapped = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p))
                swapped += 1
    for sub in model.modules():
        if isinstance(sub, PreTrainedModel):
            sub.set_attn_implementation(ATTENTION_NAME)
    return swapped
