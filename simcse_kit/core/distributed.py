"""Cross-process negatives: gather embeddings from every process *with* gradient.

With in-batch negatives each process must see the other processes' candidates, or the
effective batch (and the result) silently shrinks to the per-process batch. Each
process gathers the candidate rows of all processes, keeps computing the loss on its
*local* anchors only, and finds its own rows at ``offset`` in the gathered matrix.

Why gradients still come out right: the gather's backward hands each process the
*sum* over processes of the gradients that reach each gathered
slice, so process ``r``'s embeddings receive ``d(sum_r' L_r') / d e_r``. DDP then
averages parameter gradients over ``W`` processes, which gives the gradient of the
mean loss over the concatenated global batch (for equal per-process batch sizes,
which ``drop_last=True`` guarantees). ``tests/test_distributed.py`` checks this
against one process on the concatenated batch.

Everything here is a no-op on one process (or without an initialised process group),
so single-process code calls it unconditionally.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["close_process_group", "gather_labels", "gather_with_grad", "is_distributed", "rank", "world_size"]


def is_distributed() -> bool:
    """True when a process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def close_process_group() -> None:
    """Destroy this process's process group, if one is open, before the interpreter exits.

    Left to interpreter shutdown, gloo's worker threads can still hold tensors with
    Python references when the interpreter is torn down, and the process then dies of
    SIGABRT ("terminate called without an active exception") after a run that
    succeeded: torchrun reports the whole job as failed. Destroying the group while
    Python is fully alive joins those threads. Local to this process (no collective), so
    it cannot hang on a peer that has already exited or crashed.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _sizes(local_rows: int, device: torch.device) -> list[int]:
    """Row count of every process (they may differ, e.g. an uneven last batch)."""
    size = torch.tensor([local_rows], device=device, dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    dist.all_gather(sizes, size)
    return [int(s.item()) for s in sizes]


class _AllGatherWithGrad(torch.autograd.Function):
    """``all_gather`` whose backward hands each process the gradient of its own rows
    summed over all processes.

    Written here on the public ``all_gather``/``all_reduce`` rather than taken from
    ``torch.distributed.nn.functional`` (deprecated in torch 2.x in favour of a
    private module). The backward all-reduces the ``[sum n_r, D]`` gradient, which is
    small next to the model's own gradient traffic.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        longest = max(sizes)
        padded = tensor.contiguous()
        if tensor.shape[0] < longest:
            padded = torch.cat([padded, padded.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))])
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded)
        ctx.sizes, ctx.rank = sizes, dist.get_rank()
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None


def gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Concatenate ``tensor`` from all processes in rank order, keeping the graph.

    Processes may hold different row counts: rows are padded to the largest count for
    the collective and the padding dropped again, so no fake candidates appear.

    Args:
        tensor: ``[n_r, ...]`` local rows of process ``r``.

    Returns:
        ``(gathered, offset)``: ``gathered`` is ``[sum_r n_r, ...]``, differentiable
        with respect to the local ``tensor`` (each process's gradient includes what
        the other processes' losses send back to its rows); ``offset`` is where the
        local rows start in it (``sum_{r' < r} n_r'``). On one process: ``(tensor, 0)``.
    """
    if not is_distributed():
        return tensor, 0
    sizes = _sizes(tensor.shape[0], tensor.device)
    return _AllGatherWithGrad.apply(tensor, sizes), sum(sizes[: rank()])


def gather_labels(labels: torch.Tensor) -> torch.Tensor:
    """Concatenate integer ``labels`` ``[n_r]`` from all processes (no gradient)."""
    if not is_distributed():
        return labels
    sizes = _sizes(labels.shape[0], labels.device)
    longest = max(sizes)
    padded = torch.cat([labels, labels.new_zeros(longest - labels.shape[0])]) if labels.shape[0] < longest else labels
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])
