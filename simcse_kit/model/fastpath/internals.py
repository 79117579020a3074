"""THE one module that uses other libraries' private or semi-private API.

Everything here leans on a name that its library does not promise to keep: a leading
underscore, or a module below the library's public surface. Each use is a speed trick
or a workaround worth its risk, and nothing else in ``simcse_kit`` may do the same
(``tests/test_architecture.py`` scans for it). ``tests/test_internals.py`` checks that
every name used here still exists with the signature relied on, and names the library
version when one moves, so an upgrade fails in that test rather than deep in a run.

Nothing here runs at import time: registering the fast-dropout attention happens when
:func:`simcse_kit.model.fastpath.enable_fast_dropout` is called.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate.state import AcceleratorState
from torch import nn
from transformers import AttentionInterface, PreTrainedModel

# Semi-private: transformers' SDPA attention function and SDPA mask builder live below
# its public surface (``integrations``, ``masking_utils``); a custom attention that wants
# SDPA's behaviour in eval mode, and the boolean mask SDPA takes, has to borrow them.
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "attention_implementation",
    "can_route_attention",
    "onednn_bf16_kernels",
    "register_attention",
    "reset_accelerate_state",
    "route_attention",
    "sdpa_attention_forward",
]


def register_attention(name: str, attention: Callable[..., tuple[torch.Tensor, None]]) -> None:
    """Register ``attention`` under ``name`` with transformers, with SDPA's mask builder.

    Idempotent: registering the same function again does nothing; another function
    under a taken name is an error (it would silently reroute models already using it).

    Without a registered mask builder transformers passes *no* mask to a custom
    attention, so padding would be attended to; SDPA's boolean mask (True = attend) is
    the form the fast-dropout attention expects.
    """
    current = AttentionInterface().get(name)
    if current is attention and AttentionMaskInterface().get(name) is sdpa_mask:
        return
    if current is not None and current is not attention:
        raise ValueError(f"attention {name!r} is already registered with transformers as another function")
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)


def route_attention(model: nn.Module, name: str) -> int:
    """Make every Hugging Face sub-model of ``model`` whose attention can be routed
    (:func:`can_route_attention`) use the registered attention ``name``; returns how
    many were switched."""
    switched = 0
    for sub in model.modules():
        if isinstance(sub, PreTrainedModel) and can_route_attention(sub):
            sub.set_attn_implementation(name)
            switched += 1
    return switched


def can_route_attention(model: PreTrainedModel) -> bool:
    """Whether ``model``'s attention goes through transformers' ``AttentionInterface``
    (so a registered attention can replace it). MPNet and DeBERTa-v2 have their own
    attention code; transformers only logs a warning when asked to switch them. The
    check is the classmethod transformers itself uses, ``_can_set_attn_implementation``."""
    return bool(type(model)._can_set_attn_implementation())


def attention_implementation(model: PreTrainedModel) -> str:
    """The attention ``model`` runs now (``config._attn_implementation``: transformers
    has no public getter), to switch it back after a failed check."""
    return str(model.config._attn_implementation)


def reset_accelerate_state() -> None:
    """Forget Accelerate's process-wide state, keeping the process group.

    Accelerate keeps one process-wide ``AcceleratorState`` and refuses a second
    ``Accelerator`` with another mixed precision in the same process; seeds, sweeps and
    benchmarks train several runs (and other libraries' trainers) in one process. There
    is no public reset, so this calls ``AcceleratorState._reset_state``, keeping the
    ``PartialState`` (the process group) that a second run still needs.
    """
    AcceleratorState._reset_state(reset_partial_state=False)


def onednn_bf16_kernels() -> bool:
    """Whether oneDNN, as capped in this process, runs bf16 matmuls with AVX-512 or better.

    ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` is the check torch's own bf16 tests
    use; it asks oneDNN for its *effective* ISA, so it honours ``ONEDNN_MAX_CPU_ISA`` (False
    with ``AVX2`` on a CPU whose flags have ``avx512_bf16``), which the CPU flags cannot.
    True already from AVX512_CORE (bf16 through AVX-512 conversions, not native dot
    products): :func:`simcse_kit.model.precision.cpu_bf16_support` adds the flags and the cap.
    """
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def momentum_update(keys: list[torch.Tensor], queries: list[torch.Tensor], momentum: float) -> None:
    """``k <- m * k + (1 - m) * q`` for every pair, in two multi-tensor kernels.

    ``torch._foreach_mul_`` and ``torch._foreach_add_`` (underscored, though documented
    as the foreach API) launch one kernel per op for the whole parameter list on CUDA
    instead of two per parameter; on the CPU they run the same per-tensor ``mul_`` and
    ``add_`` as a Python loop would, so the numbers are those of the loop, bit for bit
    (``torch._foreach_lerp_`` would compute ``k + w * (q - k)``: other last bits).

    Args:
        keys: the momentum encoder's parameters, updated in place.
        queries: the online encoder's parameters, same shapes (cast to the keys' dtype).
        momentum: ``m``.
    """
    queries = [q.detach().to(k.dtype) for k, q in zip(keys, queries, strict=True)]
    torch._foreach_mul_(keys, momentum)
    torch._foreach_add_(keys, queries, alpha=1.0 - momentum)
