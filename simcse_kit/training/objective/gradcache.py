"""GradCache: contrastive batches far larger than activation memory allows.

The loss of a contrastive batch couples every row with every other, so it cannot be
split into independent micro-batches (gradient accumulation would shrink the set of
negatives). GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup") splits the *encoder* work instead:

1. embed the batch chunk by chunk under ``torch.no_grad`` (no activations kept),
   saving the RNG state before each chunk so dropout can be replayed;
2. compute the loss on the full ``[B, H]`` embedding matrix and its gradient with
   respect to the embeddings (cheap: the loss graph is only ``B x B``);
3. re-embed each chunk *with* a graph, under the RNG state saved for it, and
   backpropagate the cached embedding gradient of its rows:
   ``chunk_embeddings.backward(grad[rows])``.

:class:`simcse_kit.training.engine.steps.GradCacheStep` runs the three passes; this module holds their
parts. Because step 3 replays exactly the forward of step 1, the parameter gradients equal
those of one forward+backward over the same chunked forwards; with dropout off they
equal the plain full-batch gradients (tests/test_gradcache.py checks both in fp32).
Peak activation memory is that of one chunk; the cost is a second forward pass.

Mixed precision: under Accelerate the prepared model's ``forward`` already runs under
its autocast, so both passes use the same precision. The full-batch loss goes through
the trainer's ``backward`` (Accelerate's: loss scaling for fp16, division by the
accumulation steps), so the cached embedding gradients carry that scale and the
chunk-wise ``backward(grad)`` calls need none of their own.

Several processes (DDP): every chunk's backward would all-reduce the gradients; pass
the accelerator and all but the last chunk run under ``accelerator.no_sync(model)``.
tests/test_multiprocess.py trains with GradCache on 2 processes and checks the losses
and final weights against one process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from simcse_kit.core import modes
from simcse_kit.core.batch import model_inputs

__all__ = ["RngState", "chunk_slices", "effective_negatives", "model_chunk"]


def effective_negatives(mode: str, n_examples: int, unsup_loss: str = "views", world_size: int = 1, negatives: int = 1) -> int:
    """Negatives each anchor's softmax sees for a batch of ``n_examples`` examples
    (:meth:`simcse_kit.core.modes.Contrast.negatives` of the mode's form).

    ``unsup`` + ``views``: 2N views, each contrasted with all others except itself
    and its own positive -> ``2N - 2``. ``unsup`` + ``paper`` and ``sup``: ``z1 . z2^T``
    -> ``N - 1``. ``hardneg``: the other ``N - 1`` positives plus all ``N`` hard
    negatives -> ``2N - 1``; with ``k`` hard negatives per example (``negatives``)
    ``N (1 + k) - 1``. ``world_size`` multiplies ``N`` when embeddings are gathered
    across processes.
    """
    return modes.contrast(mode, unsup_loss, negatives).negatives(n_examples * world_size)


def chunk_slices(n_rows: int, chunk_rows: int, align: int = 1) -> list[slice]:
    """Contiguous row slices of at most ``chunk_rows`` rows, each a multiple of ``align``.

    ``align`` keeps chunk boundaries on example boundaries: with ``align = V`` (the
    views per example, :func:`simcse_kit.core.batch.views_per_example`) an example's views
    share a chunk.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    step = max(align, chunk_rows - chunk_rows % align)
    return [slice(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


class RngState:
    """The CPU RNG state (and every CUDA device's) at one moment, to replay dropout."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    @contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block under this state; the global RNG stream is left as it was."""
        devices = list(range(len(self.cuda))) if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices, enabled=True):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)
            yield


def model_chunk(batch: Mapping[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """The model inputs of ``rows``, without trailing columns that are padding in every row.

    Trimming is exact (masked positions never reach a real token) and saves the
    attention and FFN work on them; with left padding there is nothing to trim.
    """
    chunk = model_inputs(batch, rows)
    mask = chunk.get("attention_mask")
    if mask is not None and mask.ndim == 2:
        used = mask.any(dim=0).nonzero()
        length = int(used.max().item()) + 1 if used.numel() else 0
        if 0 < length < mask.shape[1]:
            chunk = {k: v[:, :length] for k, v in chunk.items()}
    return chunk
