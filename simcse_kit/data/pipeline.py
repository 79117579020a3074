"""How training batches reach the device: pinned host memory and asynchronous copies on CUDA.

On a GPU the step of a small encoder is short, so the input pipeline is on the critical
path: a pageable host batch is copied synchronously (the copy waits for the GPU to go
idle first). Pinned (page-locked) host memory lets the copy run asynchronously
(``non_blocking=True``) behind the previous step's kernels. On the CPU there is nothing
to copy, and pinning would only cost time (and needs a CUDA runtime), so it stays off.

Tokenisation and the packing plan (:func:`simcse_kit.model.packing.plan_batch`) run in the
collator, so ``data.num_workers > 0`` moves them into DataLoader worker processes. Its
default (auto, :func:`simcse_kit.training.wiring.folder.with_device_defaults`) is 0 on the CPU, where
workers take cores from the training step, and 8 on CUDA, where the tokenisation in the training process is the bottleneck
(BENCHMARKS.md, "GPU").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import RandomSampler

__all__ = ["LoaderOptions", "ShuffledIndices", "loader_options"]

INDEX_CHUNK = 65_536  # indices turned into Python ints at a time


class ShuffledIndices(RandomSampler):
    """``RandomSampler`` (no replacement) that gives the epoch's permutation a chunk at a
    time: the same ``torch.randperm(n, generator=...)`` draw, so the same order, and the same
    generator state after it (a checkpoint and ``--resume`` see no difference), but never a
    Python list of all ``n`` indices (about 36 bytes an example, per process and epoch; the
    permutation itself is an int64 tensor, 8 bytes an example). A subclass, so Accelerate
    shards and skips it as it does the loader's own.
    """

    def __iter__(self) -> Iterator[int]:
        if self.replacement or self._num_samples is not None or self.generator is None:
            yield from super().__iter__()
            return
        n = len(self.data_source)
        for chunk in torch.randperm(n, generator=self.generator).split(INDEX_CHUNK):
            yield from chunk.tolist()
        # RandomSampler then draws a second permutation and keeps none of it (its
        # ``[: num_samples % n]``): drawn too, so the generator moves on exactly as it did.
        torch.randperm(n, generator=self.generator)


@dataclass(frozen=True)
class LoaderOptions:
    """DataLoader and host-to-device copy settings for one training device.

    Attributes:
        pin_memory: the DataLoader returns batches in pinned host memory.
        non_blocking: batches are copied to the device asynchronously (Accelerate's
            ``DataLoaderConfiguration(non_blocking=...)``; only useful with pinned memory).
    """

    pin_memory: bool
    non_blocking: bool


def loader_options(device: torch.device | str) -> LoaderOptions:
    """The loader settings for training on ``device`` (``accelerator.device``)."""
    cuda = torch.device(device).type == "cuda"
    return LoaderOptions(pin_memory=cuda, non_blocking=cuda)
