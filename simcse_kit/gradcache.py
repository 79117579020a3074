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

Because step 3 replays exactly the forward of step 1, the parameter gradients equal
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

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from simcse_kit.batch import model_inputs
from simcse_kit.objectives import Backward, Batch, SimCSEObjective

logger = logging.getLogger(__name__)

__all__ = ["GradCacheStep", "chunk_slices", "effective_negatives"]


def effective_negatives(mode: str, n_examples: int, unsup_loss: str = "views", world_size: int = 1) -> int:
    """Negatives each anchor's softmax sees for a batch of ``n_examples`` examples.

    ``unsup`` + ``views``: 2N views, each contrasted with all others except itself
    and its own positive -> ``2N - 2``. ``unsup`` + ``paper`` and ``sup``: ``z1 . z2^T``
    -> ``N - 1``. ``hardneg``: the other ``N - 1`` positives plus all ``N`` hard
    negatives -> ``2N - 1``. ``world_size`` multiplies ``N`` when embeddings are
    gathered across processes.
    """
    n = n_examples * world_size
    if mode == "unsup":
        return 2 * n - 2 if unsup_loss == "views" else n - 1
    if mode == "sup":
        return n - 1
    if mode == "hardneg":
        return 2 * n - 1
    raise ValueError(f"unknown mode {mode!r}")


def chunk_slices(n_rows: int, chunk_rows: int, align: int = 1) -> list[slice]:
    """Contiguous row slices of at most ``chunk_rows`` rows, each a multiple of ``align``.

    ``align`` keeps chunk boundaries on example boundaries: with ``align = V`` (the
    views per example, :func:`simcse_kit.batch.views_per_example`) an example's views
    share a chunk.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    step = max(align, chunk_rows - chunk_rows % align)
    return [slice(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


class _RngState:
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


def _model_chunk(batch: Batch, rows: slice) -> Batch:
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


class GradCacheStep:
    """A trainer step computing the loss GradCache-style.

    Args:
        objective: gives ``embed(model, batch) -> [b, H]``,
            ``loss(embeddings [B, H], batch) -> scalar`` and ``views_per_example()``.
        chunk_rows: rows (sentences) encoded per chunk; rounded down to whole examples
            (a multiple of the views per example), at least one example.
        accelerator: optional; with several processes all but the last chunk's
            backward run under ``accelerator.no_sync(model)``.

    Calling ``step(model, batch, backward)`` runs the three passes above, calls
    ``backward(loss)`` once on the full-batch loss (default ``loss.backward()``) and
    returns the detached loss.
    """

    def __init__(self, objective: SimCSEObjective, chunk_rows: int, accelerator: Any | None = None) -> None:
        if chunk_rows < 1:
            raise ValueError(f"grad_cache_chunk must be >= 1, got {chunk_rows}")
        self.objective = objective
        self.chunk_rows = chunk_rows
        self.accelerator = accelerator
        # Chunks hold whole examples, so a chunk boundary never separates the views
        # of one example (batch.py: rows are example-major).
        self.align = objective.views_per_example()
        self._logged = False

    def metrics(self) -> dict[str, float]:
        """The objective's counters (:meth:`SimCSEObjective.metrics <simcse_kit.objectives.SimCSEObjective.metrics>`)."""
        return self.objective.metrics()

    def _no_sync(self, model: nn.Module, last: bool) -> Any:
        acc = self.accelerator
        if last or acc is None or getattr(acc, "num_processes", 1) <= 1:
            return nullcontext()
        return acc.no_sync(model)

    def __call__(self, model: nn.Module, batch: Batch, backward: Backward | None = None) -> torch.Tensor:
        backward = backward or (lambda loss: loss.backward())
        n_rows = batch["input_ids"].shape[0]
        slices = chunk_slices(n_rows, self.chunk_rows, self.align)
        if not self._logged:
            n_examples = n_rows // self.objective.views_per_example()
            world = getattr(self.accelerator, "num_processes", 1) if self.accelerator is not None else 1
            gather = world > 1 and getattr(self.objective.loss_cfg, "gather", False)
            logger.info(
                "GradCache: %d rows in %d chunks of <= %d; %d negatives per anchor",
                n_rows,
                len(slices),
                slices[0].stop - slices[0].start,
                effective_negatives(self.objective.mode, n_examples, self.objective.loss_cfg.unsup_loss, world if gather else 1),
            )
            self._logged = True

        # Pass 1: embeddings without a graph, remembering each chunk's RNG state.
        states: list[_RngState] = []
        with torch.no_grad():
            parts = []
            for rows in slices:
                states.append(_RngState())
                parts.append(self.objective.embed(model, _model_chunk(batch, rows)))
        embeddings = torch.cat(parts).detach().requires_grad_()

        # Pass 2: the full-batch loss and d loss / d embeddings (through the trainer's
        # backward, so loss scaling and accumulation division are applied once).
        loss = self.objective.loss(embeddings, batch)
        backward(loss)
        grad = embeddings.grad
        if grad is None:  # a loss that ignores the embeddings: nothing to propagate
            return loss.detach()

        # Pass 3: replay each chunk with a graph and push its cached gradient through.
        for i, (rows, state) in enumerate(zip(slices, states, strict=True)):
            with state.replay(), self._no_sync(model, last=i == len(slices) - 1):
                chunk_embeddings = self.objective.embed(model, _model_chunk(batch, rows))
                chunk_embeddings.backward(grad[rows].to(chunk_embeddings.dtype))
        return loss.detach()
