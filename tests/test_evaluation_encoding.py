"""Tests for simcse_kit.evaluation.encoding: each distinct sentence encoded once, batches
longest first, order restored, shapes checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simcse_kit.evaluation import encode_once, encode_unique


class Recorder:
    """Embeds a sentence as ``[len(s), first char code]`` and records every call."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.batches: list[list[str]] = []
        self.grad_enabled: list[bool] = []
        self.dtype = dtype

    def __call__(self, batch: list[str]) -> torch.Tensor:
        self.batches.append(list(batch))
        self.grad_enabled.append(torch.is_grad_enabled())
        return torch.tensor([[float(len(s)), float(ord(s[0]))] for s in batch], dtype=self.dtype)


def test_each_distinct_sentence_once_longest_first_order_restored() -> None:
    sentences = ["bb", "a", "dddd", "bb", "ccc", "a", "eeeee", "dddd"]
    encode = Recorder()
    embedded = encode_once(encode, sentences, batch_size=2)
    # One call per batch of at most 2, each distinct sentence exactly once, longest first.
    assert encode.batches == [["eeeee", "dddd"], ["ccc", "bb"], ["a"]]
    assert encode.grad_enabled == [False, False, False]  # no graph kept for a training model
    # Rows in first-seen order; of() gives every input sentence back in input order.
    assert list(embedded.rows) == ["bb", "a", "dddd", "ccc", "eeeee"]
    expected = np.array([[len(s), ord(s[0])] for s in sentences], dtype=np.float32)
    assert np.array_equal(embedded.of(sentences), expected)
    assert embedded.vectors.dtype == np.float32 and embedded.vectors.shape == (5, 2)
    assert embedded.index(["eeeee", "bb"]).tolist() == [4, 0]


def test_ties_keep_input_order_and_numpy_or_bf16_outputs() -> None:
    # Python's sort is stable: equal lengths keep their first-seen order, so batches
    # (and therefore a real model's padding) are reproducible.
    encode = Recorder(torch.bfloat16)
    out = encode_unique(encode, ["xy", "ab", "cd", "z"], batch_size=3)
    assert encode.batches == [["xy", "ab", "cd"], ["z"]]
    assert out.dtype == np.float32 and out[:, 0].tolist() == [2.0, 2.0, 2.0, 1.0]
    as_numpy = encode_unique(lambda b: np.ones((len(b), 3), dtype=np.float64), ["a", "b"], batch_size=8)
    assert as_numpy.shape == (2, 3) and as_numpy.dtype == np.float32


def test_bad_encoder_output_and_arguments() -> None:
    with pytest.raises(ValueError, match="expected \\(batch, dim\\)"):
        encode_unique(lambda b: np.zeros((len(b) + 1, 2)), ["a", "b"], batch_size=4)
    with pytest.raises(ValueError, match="expected \\(batch, dim\\)"):
        encode_unique(lambda b: np.zeros(len(b)), ["a"], batch_size=4)
    with pytest.raises(ValueError, match="no sentences"):
        encode_once(Recorder(), [], batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        encode_unique(Recorder(), ["a"], batch_size=0)
    with pytest.raises(KeyError):
        encode_once(Recorder(), ["a"], batch_size=1).index(["b"])
