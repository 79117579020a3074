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

from dataclasses import dataclass

import torch

__all__ = ["LoaderOptions", "loader_options"]


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
