"""Opt-in CPU speed tricks for training; importing this package changes nothing.

* :mod:`simcse_kit.model.fastpath.dropout`: a cheaper dropout RNG with the same distribution,
  and the attention that uses it (:func:`enable_fast_dropout`);
* :mod:`simcse_kit.model.fastpath.bf16`: bf16 weights with fp32 master weights in AdamW
  (:func:`~simcse_kit.model.fastpath.bf16.bf16_training`);
* :mod:`simcse_kit.model.fastpath.internals`: the one module that touches other libraries'
  private API (every such use in ``simcse_kit`` is there, and version-checked by
  ``tests/test_internals.py``).
"""

from __future__ import annotations

from simcse_kit.model.fastpath.dropout import (
    ATTENTION_NAME,
    LEVELS,
    FastDropout,
    enable_fast_dropout,
    fast_dropout,
    fast_dropout_attention,
    quantized_drop_rate,
)

__all__ = [
    "ATTENTION_NAME",
    "LEVELS",
    "FastDropout",
    "enable_fast_dropout",
    "fast_dropout",
    "fast_dropout_attention",
    "quantized_drop_rate",
]
