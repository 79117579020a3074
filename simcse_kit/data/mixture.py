"""A run's training datasets, each batch drawn from one of them: ``data.datasets``, or
``data.train_file`` as a list of one (:meth:`~simcse_kit.config.sections.DataConfig.training_sets`).

A batch's in-batch negatives are the other examples of the same batch. Drawn from one
dataset, they share its domain and its mode: the batch has one layout (``V`` views per
example, :mod:`simcse_kit.core.batch`), one loss, and no negative that is easy only
because it comes from another corpus (a Wikipedia sentence beside an SNLI caption).
sentence-transformers' ``MultiDatasetBatchSamplers`` and FlagEmbedding's
``same_dataset_within_batch`` make the same choice.

:class:`MixtureBatches` decides which dataset each global batch of an epoch comes from
(``data.sampling``, :func:`epoch_batches`), then cuts it into one share per process:
``W`` consecutive per-process batches, which Accelerate's batch sharding deals out one to
each process, so every process trains the same dataset at a step and the cross-process
gather combines rows of one dataset. The order is drawn from the loader's generator, the
one a checkpoint saves at each epoch's start, so ``--resume`` redraws it and continues at
the same example. :class:`Mixture` indexes the datasets as one and tags each example with
its dataset's name; :class:`MixtureCollator` hands a batch to its dataset's collator.

The older way to train on two datasets at once, ``data.mix_file`` beside ``train_file``,
is :func:`mix_datasets`: one dataset of both, so a batch mixes them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import datasets
import torch
from torch.utils.data import Dataset, Sampler

from simcse_kit.config.sections import SAMPLINGS
from simcse_kit.data.readers import negatives_of
from simcse_kit.errors import DataError

__all__ = ["DATASET_KEY", "Mixture", "MixtureBatches", "MixtureCollator", "batches_per_dataset", "epoch_batches", "mix_datasets"]

logger = logging.getLogger(__name__)

DATASET_KEY = "dataset"
"""The key of an example (and a collated batch) naming the dataset it comes from."""


def batches_per_dataset(
    sizes: Sequence[int], batch_size: int, sampling: str, weights: Sequence[float] | None = None
) -> list[int]:
    """How many global batches of ``batch_size`` examples each dataset gives an epoch.

    * ``proportional``: every full batch of every dataset, ``n_d // batch_size`` (the rest,
      fewer than a batch, waits for the next epoch's shuffle), as sentence-transformers'
      ``ProportionalBatchSampler``;
    * ``round_robin``: as many from each as the smallest dataset has (``min_d n_d // batch_size``),
      as its ``RoundRobinBatchSampler``: the larger datasets are only partly seen an epoch;
    * ``weighted``: the same number of batches as ``proportional``, shared in proportion to
      ``weights`` (largest remainders, ties to the earlier dataset). A dataset given more
      batches than it has is gone through again in a fresh order; fewer, partly.

    Raises:
        ValueError: an unknown rule, or ``weights`` not one positive number per dataset.
    """
    full = [n // batch_size for n in sizes]
    if sampling == "proportional":
        return full
    if sampling == "round_robin":
        return [min(full)] * len(full)
    if sampling != "weighted":
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {SAMPLINGS}")
    if weights is None or len(weights) != len(sizes) or not all(w > 0 for w in weights):
        raise ValueError(f"weighted sampling needs one weight > 0 per dataset, got {weights}")
    total, share = sum(full), sum(weights)
    quotas = [total * w / share for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(sizes)), key=lambda d: (-(quotas[d] - counts[d]), d))
    for d in by_remainder[: total - sum(counts)]:
        counts[d] += 1
    return counts


def epoch_batches(counts: Sequence[int], sampling: str, generator: torch.Generator) -> list[int]:
    """The dataset of each global batch of an epoch, in order: ``round_robin`` takes the
    datasets in turn; the others arrange the ``counts[d]`` batches of every dataset ``d`` in a
    random order, uniform over the arrangements.

    The order is drawn batch by batch, each batch's dataset with probability proportional to
    the batches each has left (one ``randint`` from ``generator``), and only where there is a
    choice: once a single dataset has batches left the rest are its, drawn for nothing. A
    run of one dataset so draws no number here, and its order is the one a plain shuffled
    loader gives (:class:`MixtureBatches`).
    """
    if sampling == "round_robin":
        return [d for _ in range(min(counts, default=0)) for d in range(len(counts))]
    left = list(counts)
    order: list[int] = []
    while sum(1 for n in left if n) > 1:
        pick = int(torch.randint(sum(left), (1,), generator=generator))
        d = 0
        while pick >= left[d]:
            pick -= left[d]
            d += 1
        order.append(d)
        left[d] -= 1
    order += [d for d, n in enumerate(left) for _ in range(n)]
    return order


class MixtureBatches(Sampler[list[int]]):
    """Per-process batches of a :class:`Mixture`, each global batch from one dataset: every
    run's batch sampler, one dataset being a mixture of one.

    Each epoch draws, from ``generator`` and in this order, a permutation of every dataset
    (``randperm(n_d)``, in the datasets' order), then the datasets' batch order
    (:func:`epoch_batches`). Global batch ``t`` from dataset ``d`` takes the next
    ``batch_size`` examples of ``d``'s permutation (under ``weighted``, a fresh permutation
    when too few are left for a whole batch) and is yielded as ``processes`` consecutive
    slices of ``batch_size // processes``: Accelerate's ``BatchSamplerShard`` gives slice ``r``
    to process ``r``. The epoch ends as ``torch``'s ``RandomSampler`` ends one, with one more
    ``randperm(n_d)`` per dataset, kept by nobody. So with one dataset the draws are exactly
    a ``DataLoader(shuffle=True, drop_last=True)``'s, batch for batch and epoch after epoch
    (``tests/test_mixture.py`` checks it against ``RandomSampler``). Every process draws the
    same numbers (the generator is seeded alike and restored alike on resume), so all agree
    on each step's dataset.

    Args:
        sizes: examples of each dataset (:attr:`Mixture.sizes`).
        batch_size: examples of a global batch, all processes (``train.batch_size``;
            rounded down to a multiple of ``processes`` as a single-file run's is).
        processes: processes of the run.
        sampling: one of :data:`~simcse_kit.config.sections.SAMPLINGS` (:func:`batches_per_dataset`).
        generator: the loader's generator (checkpointed at each epoch's start).
        weights: each dataset's weight (``weighted`` only).

    Raises:
        ValueError: a dataset with fewer examples than a global batch.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: int,
        processes: int,
        sampling: str,
        generator: torch.Generator,
        weights: Sequence[float] | None = None,
    ) -> None:
        self.sizes, self.processes, self.sampling, self.generator = list(sizes), processes, sampling, generator
        self.batch_size = batch_size // processes  # per process: what Accelerate's sharding reads
        self.drop_last = True  # never a short batch: it would have too few negatives
        self.global_batch = self.batch_size * processes
        small = [d for d, n in enumerate(self.sizes) if n < self.global_batch]
        if small:
            raise ValueError(f"dataset {small[0]} has {self.sizes[small[0]]} examples, fewer than a batch ({self.global_batch})")
        self.counts = batches_per_dataset(self.sizes, self.global_batch, sampling, weights)
        self.offsets = [sum(self.sizes[:d]) for d in range(len(self.sizes))]

    def __len__(self) -> int:
        return sum(self.counts) * self.processes

    def __iter__(self) -> Iterator[list[int]]:
        orders = [torch.randperm(n, generator=self.generator) for n in self.sizes]
        used = [0] * len(self.sizes)
        size, per = self.global_batch, self.batch_size
        for d in epoch_batches(self.counts, self.sampling, self.generator):
            if used[d] + size > self.sizes[d]:  # weighted only: this dataset again, in a fresh order
                orders[d], used[d] = torch.randperm(self.sizes[d], generator=self.generator), 0
            batch = (orders[d][used[d] : used[d] + size] + self.offsets[d]).tolist()
            used[d] += size
            for rank in range(self.processes):
                yield batch[rank * per : (rank + 1) * per]
        for n in self.sizes:  # RandomSampler's second permutation (its [: num_samples % n]): the generator moves as it does
            torch.randperm(n, generator=self.generator)


class Mixture(Dataset[dict[str, Any]]):
    """Datasets indexed as one: dataset ``d``'s rows at ``offsets[d] ..``; each example
    carries its dataset's name under :data:`DATASET_KEY`."""

    def __init__(self, parts: Mapping[str, datasets.Dataset]) -> None:
        self.names = list(parts)
        self.parts = list(parts.values())
        self.sizes = [len(part) for part in self.parts]  #: examples of each dataset
        self.offsets = [sum(self.sizes[:d]) for d in range(len(self.parts))]

    def __len__(self) -> int:
        return sum(self.sizes)

    def locate(self, index: int) -> tuple[int, int]:
        """``(dataset, row in it)`` of a mixture index."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a mixture of {len(self)} examples")
        d = max(i for i, offset in enumerate(self.offsets) if offset <= index)
        return d, index - self.offsets[d]

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The examples of a batch (read in one call from their dataset, whose rows they all are)."""
        d, _ = self.locate(indices[0])
        rows = [i - self.offsets[d] for i in indices]
        if not all(0 <= r < self.sizes[d] for r in rows):
            raise ValueError(f"a batch mixes datasets: indices {list(indices)[:8]}... are not all of {self.names[d]!r}")
        name = self.names[d]
        return [dict(example) | {DATASET_KEY: name} for example in self.parts[d].__getitems__(rows)]


class MixtureCollator:
    """Collate a batch of one dataset with that dataset's collator (its mode, its prompts);
    the batch also names its dataset under :data:`DATASET_KEY` (a str, which the device
    copy leaves alone), after its tensors."""

    def __init__(self, collators: Mapping[str, Callable[[list[dict[str, Any]]], dict[str, Any]]]) -> None:
        self.collators = dict(collators)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        names = {example[DATASET_KEY] for example in examples}
        if len(names) != 1:
            raise ValueError(f"a batch must come from one dataset, this one mixes {sorted(names)}")
        (name,) = names
        return dict(self.collators[name](examples)) | {DATASET_KEY: name}


def mix_datasets(domain: datasets.Dataset, general: datasets.Dataset, ratio: float, seed: int) -> datasets.Dataset:
    """All of ``domain`` plus a seeded sample of ``general`` making up ``ratio`` of the result.

    Concatenation of an exact-size sample, not ``interleave_datasets``: its probabilities
    give the ratio only in expectation, and its length depends on which side runs out.
    The DataLoader shuffles, so the order here does not matter.

    Args:
        domain: the in-domain examples, all kept.
        general: the general corpus, same columns.
        ratio: share of the result from ``general``, in [0, 1).
        seed: the sample's seed (the run seed).

    Raises:
        DataError: ``general`` has too few examples for the ratio.
    """
    if negatives_of(domain.column_names) != negatives_of(general.column_names):
        raise DataError(
            f"mix_file: {negatives_of(general.column_names)} hard negative(s) per example, the train_file "
            f"{negatives_of(domain.column_names)}; both need the same number"
        )
    wanted = round(len(domain) * ratio / (1 - ratio))
    if wanted > len(general):
        raise DataError(f"mix_ratio {ratio}: needs {wanted} general examples, the mix file has {len(general)}")
    picked = torch.randperm(len(general), generator=torch.Generator().manual_seed(seed))[:wanted]
    mixed = datasets.concatenate_datasets([domain, general.select(sorted(picked.tolist()))])
    logger.info("mixed %d in-domain + %d general examples (ratio %.2f)", len(domain), wanted, ratio)
    return mixed
