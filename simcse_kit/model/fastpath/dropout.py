"""A cheaper dropout for training on CPU.

In unsupervised SimCSE dropout *is* the augmentation, so it runs on every activation of
every step: 19 dropout sites per BERT-6 forward. PyTorch's CPU dropout draws one
Bernoulli sample per element (``bernoulli_``), a visible share of a bf16 training step on
the default model. Here one 64-bit draw of the same generator gives four 16-bit uniforms,
compared against a threshold; for bf16/fp16 the comparison is done with integer ops that
leave 1.0's bit pattern where kept, since a bool mask's conversion costs more than the
draws.

The drop probability is rounded to a multiple of 1/65536 (0.1 -> 0.100006) and the
kept values are scaled by the exact inverse keep rate, so the expectation is unchanged.
Because the bits come from torch's default generator, ``torch.manual_seed``,
``fork_rng`` and GradCache's RNG replay work as with ``nn.Dropout``.

Opt-in: importing this module changes nothing. :func:`enable_fast_dropout` swaps a
model's dropout modules and only then registers the attention with transformers.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from simcse_kit.model.families import probe_batch
from simcse_kit.model.fastpath import internals

logger = logging.getLogger(__name__)

LEVELS = 1 << 16
# The bit pattern of 1.0 in each 16-bit float type (as an int16).
_ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00}
ATTENTION_NAME = "simcse_fast_dropout"

__all__ = ["ATTENTION_NAME", "LEVELS", "FastDropout", "enable_fast_dropout", "fast_dropout", "quantized_drop_rate"]


def quantized_drop_rate(p: float) -> float:
    """The drop probability ``fast_dropout`` actually uses for ``p``."""
    return round(p * LEVELS) / LEVELS


def fast_dropout(x: torch.Tensor, p: float, integer_mask: bool | None = None) -> torch.Tensor:
    """Inverted dropout of ``x`` with drop rate ``quantized_drop_rate(p)`` (always on).

    Args:
        x: any shape and floating dtype.
        p: the drop probability.
        integer_mask: build the mask in the integers (16-bit floats only; the default
            there) rather than as a bool mask applied with ``torch.where`` (the default for
            other dtypes). The two give equal results.

    Returns:
        A tensor of ``x``'s shape and dtype.
    """
    dropped = round(p * LEVELS)
    if dropped == 0:
        return x
    if dropped >= LEVELS:
        return torch.zeros_like(x)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    uniforms = bits.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]: all 64 bits are drawn
    threshold = dropped - LEVELS // 2  # keep where uniform >= threshold
    scale = LEVELS / (LEVELS - dropped)
    one = _ONE_BITS.get(x.dtype)
    if integer_mask and one is None:
        raise ValueError(f"fast_dropout: integer_mask needs a 16-bit float input, not {x.dtype}")
    if one is None or integer_mask is False:
        return torch.where(uniforms >= threshold, x * scale, 0.0)
    # 16-bit floats: the mask is made in the integers and read as floats, 1.0 where kept and
    # 0.0 where dropped, because a bool mask's conversion (torch.where, x * keep) costs many
    # times a multiply on CPU. x * mask is exact, so the output and its gradient equal the
    # torch.where form bit for bit.
    mask = uniforms.clamp_(threshold - 1, threshold).sub_(threshold - 1).mul_(one).view(x.dtype)
    return _MaskThenScale.apply(x, mask, scale)


class _MaskThenScale(torch.autograd.Function):
    """``(x * mask) * scale`` and, backward, ``(grad * mask) * scale``: masking first, both
    ways, so a dropped element stays zero even where ``scale`` overflows the dtype (fp16 at
    a drop rate near 1), as in ``torch.where(keep, x * scale, 0)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return (x * mask).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return (grad * mask).mul_(ctx.scale), None, None


class FastDropout(nn.Module):
    """Drop-in for ``nn.Dropout`` using ``fast_dropout``; keeps ``p`` for code that reads it."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p) if self.training and self.p > 0 else x

    def extra_repr(self) -> str:
        return f"p={self.p}"


def fast_dropout_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention with ``fast_dropout`` on the probabilities: SDPA when there is
    no dropout (eval), else the explicit softmax (SDPA's CPU path with dropout is this same
    math, with ``bernoulli_``), which is the model's own eager attention with another RNG.

    What eager and SDPA attention do, this does too: grouped-query attention (each run of
    ``heads // kv_heads`` consecutive query heads shares one key/value head, as in
    transformers' ``repeat_kv``); causal attention when the mask builder left the mask out
    (``sdpa_mask`` does when a batch has no padding and relies on SDPA's ``is_causal``);
    sliding windows (in the mask transformers builds per layer); Gemma-2-style
    ``softcap`` on the scores.

    Args:
        module: the attention module (transformers' calling convention): its
            ``is_causal`` is read when ``attention_mask`` is None, as SDPA attention does.
        query: ``[B, heads, L, head_dim]``.
        key, value: ``[B, kv_heads, S, head_dim]``; ``heads`` a multiple of ``kv_heads``.
        attention_mask: ``[B, 1, L, S]`` boolean (True = attend, as transformers' SDPA
            mask builder makes it) or additive (0 / dtype minimum, as a prepared 4-D
            mask for eager attention is), or None.
        dropout: the attention-probability drop rate (0 in eval mode).
        scaling: the score scale (default ``head_dim ** -0.5``).
        **kwargs: ``is_causal`` (overrides the module's), ``softcap``; the rest (such as
            ``sliding_window``, already in the mask) is not read.

    Returns:
        ``([B, L, heads, head_dim], None)``: no attention weights are returned.

    Raises:
        ValueError: attention sinks (``s_aux``), which this attention does not compute.
    """
    softcap = kwargs.get("softcap")
    if dropout == 0.0 and softcap is None and not _explicit.get():
        return internals.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
    if kwargs.get("s_aux") is not None:
        raise ValueError("fast_dropout_attention: attention sinks (s_aux) are not supported")
    b, heads, length, dim = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"fast_dropout_attention: {heads} query heads do not share {kv_heads} key/value heads evenly")
    groups = heads // kv_heads
    scaling = dim**-0.5 if scaling is None else scaling
    # Grouped-query attention without repeating keys and values: a group's query heads
    # become rows of one matrix against their shared key head, the order repeat_kv gives.
    grouped = query.reshape(b, kv_heads, groups * length, dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(b, heads, length, kv_length) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None and length > 1 and _is_causal(module, kwargs):
        # SDPA's is_causal: the top-left triangle (query i sees keys 0..i).
        attention_mask = torch.ones(length, kv_length, dtype=torch.bool, device=query.device).tril()
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # SDPA-style: True = attend
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:  # additive
            scores = scores + attention_mask[..., :kv_length]
    probs = fast_dropout(torch.softmax(scores, dim=-1), dropout)
    out = torch.matmul(probs.view(b, kv_heads, groups * length, kv_length), value)
    return out.view(b, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


def _is_causal(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether attention without a mask is causal, read as SDPA attention reads it: the
    call's ``is_causal``, else the module's, else causal."""
    causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True) if causal is None else causal)


# Set while enable_fast_dropout's check runs: the explicit attention without dropout, so
# the check covers the path training takes (grouped heads, masks), not only SDPA's.
_explicit: contextvars.ContextVar[bool] = contextvars.ContextVar("simcse_fast_dropout_explicit", default=False)


def enable_fast_dropout(model: nn.Module) -> int:
    """Swap every ``nn.Dropout`` in ``model`` for ``FastDropout`` and route the attention
    of every Hugging Face sub-model built on transformers' ``AttentionInterface`` through
    :func:`fast_dropout_attention`, where verified.

    The check, per architecture, is packing's: each Hugging Face sub-model encodes a
    probe batch (:func:`simcse_kit.model.families.probe_batch`, longer than a local
    attention window) in eval mode before and after, after both through SDPA (what eval
    runs) and through the explicit attention training runs (without dropout); any
    difference, or an error,
    restores the model's own dropout modules and attention and logs why. A model whose
    attention is its own code (MPNet, DeBERTa-v2) keeps it; its probability dropout is
    an ``nn.Dropout`` and is swapped with the rest.

    The attention is registered with transformers here, on first use (idempotent), not
    when the module is imported. A model's recorded ``attn_implementation`` (what it was
    loaded with) stays as it was: the new attention takes the mask form of either
    SDPA or eager attention, and a saved model must not name an attention that only
    exists after this call.

    Returns:
        The number of dropout modules swapped (0 when the check failed; 0 too for a
        decoder, whose only dropout is the attention's rate, read by the attention).
    """
    encoders = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    probes = [(encoder, *probe_batch(encoder)) for encoder in encoders]
    before = _probe_outputs(model, probes)
    originals: list[tuple[nn.Module, str, nn.Dropout]] = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                originals.append((parent, name, child))
    for parent, name, child in originals:
        setattr(parent, name, FastDropout(child.p).train(child.training))
    internals.register_attention(ATTENTION_NAME, fast_dropout_attention)
    routed: list[tuple[PreTrainedModel, str]] = []
    for encoder in encoders:
        if internals.can_route_attention(encoder):
            routed.append((encoder, internals.attention_implementation(encoder)))
            internals.route_attention(encoder, ATTENTION_NAME)
        else:
            logger.info("fast dropout: %s keeps its own attention (not built on AttentionInterface)", type(encoder).__name__)
    try:
        after = _probe_outputs(model, probes)
        token = _explicit.set(True)
        try:
            after += _probe_outputs(model, probes)
        finally:
            _explicit.reset(token)
        worst = max(((a - b).abs().max().item() for a, b in zip(before * 2, after, strict=True)), default=0.0)
        failure = f"outputs differ by {worst:.2e} in eval mode" if worst > 1e-5 else None
    except Exception as exc:  # any failure means "keep the model's own"
        failure = f"{type(exc).__name__}: {exc}"
    if failure is not None:
        for parent, name, child in originals:
            setattr(parent, name, child)
        for encoder, implementation in routed:
            internals.route_attention(encoder, implementation)
        logger.warning("fast dropout off for %s (%s): it keeps its own dropout and attention", type(model).__name__, failure)
        return 0
    return len(originals)


def _probe_outputs(model: nn.Module, probes: list[tuple[PreTrainedModel, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Each encoder's last hidden states ``[3, n, H]`` on its probe batch, in eval mode
    (``model``'s training flags are restored)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            return [encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float() for encoder, ids, mask in probes]
    finally:
        for m, training in modes:
            m.training = training
