"""Several datasets in one run (``data.datasets``): the batch sampler's tables, one dataset per
batch, coverage over processes, each batch in its dataset's mode, the single-file order kept,
the recipe's errors, and ``--resume`` mid-epoch ending as an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.data_loader import BatchSamplerShard
from conftest import TinyRun, toy_sentences
from safetensors.torch import load_file
from test_resume import ENV, kill_when, newest_step, run_metrics, train_cmd

from simcse_kit.config.run import load_config
from simcse_kit.data.mixture import DATASET_KEY, Mixture, MixtureBatches, MixtureCollator, batches_per_dataset
from simcse_kit.errors import ConfigError

SIZES = [40, 24, 17]  # full batches of 8: 5, 3, 2 (0, 0 and 1 example left over)

# Hand-computed: batches per dataset an epoch at batch size 8.
#   proportional: every full batch, n // 8.
#   round_robin:  min(5, 3, 2) = 2 from each.
#   weighted 1:1:2 of the 10 proportional batches: quotas 2.5, 2.5, 5 -> 2, 2, 5 and the one
#   left to the largest remainder, the tie (0.5, 0.5) to the earlier dataset: 3, 2, 5.
TABLE = {"proportional": [5, 3, 2], "round_robin": [2, 2, 2], "weighted": [3, 2, 5]}
WEIGHTS = [1.0, 1.0, 2.0]


def dataset_of(index: int) -> int:
    return sum(index >= offset for offset in (40, 64))


@pytest.mark.parametrize("sampling", list(TABLE))
def test_batches_per_dataset_match_the_hand_computed_table(sampling: str) -> None:
    weights = WEIGHTS if sampling == "weighted" else None
    assert batches_per_dataset(SIZES, 8, sampling, weights) == TABLE[sampling]


@pytest.mark.parametrize("sampling", list(TABLE))
def test_every_batch_is_from_one_dataset_and_each_epoch_counts_as_the_table(sampling: str) -> None:
    weights = WEIGHTS if sampling == "weighted" else None
    sampler = MixtureBatches(SIZES, 8, 1, sampling, torch.Generator().manual_seed(3), weights)
    assert len(sampler) == sum(TABLE[sampling])
    epochs = [list(sampler) for _ in range(2)]
    assert epochs[0] != epochs[1]  # a fresh order each epoch
    for batches in epochs:
        owners = [{dataset_of(i) for i in batch} for batch in batches]
        assert all(len(o) == 1 and len(b) == 8 for o, b in zip(owners, batches, strict=True))
        assert all(len(set(batch)) == 8 for batch in batches)  # no example twice in a batch
        counts = Counter(next(iter(o)) for o in owners)
        assert [counts[d] for d in range(3)] == TABLE[sampling]
        seen = Counter(i for batch in batches for i in batch)
        if sampling != "weighted":  # each example at most once an epoch
            assert max(seen.values()) == 1
        else:  # dataset 2 (17 examples, 2 full batches) is asked for 5: gone through 3 times
            assert max(seen[i] for i in range(64, 81)) == 3
    if sampling == "round_robin":
        assert [dataset_of(b[0]) for b in epochs[0]] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("sampling", ["proportional", "round_robin"])
def test_two_processes_share_each_batch_and_see_each_example_once(sampling: str) -> None:
    """Accelerate's own batch sharding over two processes (two samplers seeded alike, as
    every process is): at each step both train one dataset, their halves make up the one
    process run's global batch, and an epoch covers each example at most once: exactly
    the first ``batches x 8`` of each dataset's permutation."""
    one = list(MixtureBatches(SIZES, 8, 1, sampling, torch.Generator().manual_seed(5)))
    ranks = [
        list(BatchSamplerShard(MixtureBatches(SIZES, 8, 2, sampling, torch.Generator().manual_seed(5)), 2, rank))
        for rank in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    seen: Counter[int] = Counter()
    for batch, first, second in zip(one, *ranks, strict=True):
        assert len(first) == len(second) == 4
        assert {dataset_of(i) for i in first + second} == {dataset_of(batch[0])}
        assert first + second == batch
        seen.update(first + second)
    assert max(seen.values()) == 1
    per_dataset = Counter(dataset_of(i) for i in seen)
    assert [per_dataset[d] for d in range(3)] == [8 * b for b in TABLE[sampling]]


def test_a_mixture_indexes_its_datasets_as_one_and_refuses_a_mixed_batch() -> None:
    import datasets

    parts = {
        "wiki": datasets.Dataset.from_dict({"sent0": ["a", "b", "c"]}),
        "nli": datasets.Dataset.from_dict({"sent0": ["p", "q"], "sent1": ["e", "f"], "hard_neg": ["x", "y"]}),
    }
    mixture = Mixture(parts)
    assert len(mixture) == 5 and mixture.locate(3) == (1, 0)
    assert mixture.__getitems__([4, 3]) == [
        {"sent0": "q", "sent1": "f", "hard_neg": "y", DATASET_KEY: "nli"},
        {"sent0": "p", "sent1": "e", "hard_neg": "x", DATASET_KEY: "nli"},
    ]
    with pytest.raises(ValueError, match="mixes datasets"):
        mixture.__getitems__([2, 3])
    collate = MixtureCollator({"wiki": lambda ex: {"n": torch.tensor(len(ex))}, "nli": lambda ex: {"n": torch.tensor(-1)}})
    assert collate(mixture.__getitems__([0, 1])) == {"n": torch.tensor(2), DATASET_KEY: "wiki"}
    with pytest.raises(ValueError, match="one dataset"):
        collate([mixture[0], mixture[3]])
