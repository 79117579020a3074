"""Sequence packing: run the encoder on the tokens of a batch, not on its padding.

A batch padded to its longest sentence wastes the pad positions' share of every
linear layer, and at SimCSE's training length (32 tokens) on Wikipedia sentences that
is about a third of the rows' positions. Packing places several sentences end to end
in one row (first-fit decreasing into rows as long as the padded batch), gives each
sentence its own position ids, and masks attention block-diagonally, so no token sees
another sentence's tokens. Every token's output is then the one it would have in the
padded batch (up to floating-point summation order): the hidden states are gathered
back into the padded ``[B, T, H]`` layout and pooled as usual.

This only uses the public ``transformers`` API (``position_ids`` and a prepared 4-D
attention mask, which BERT-family models take as given). RoBERTa-style embeddings
number positions from ``padding_idx + 1``; the caller adds that offset
(:func:`simcse_kit.model.families.position_offset`). Models that do not work this way
(DeBERTa-v2 builds its own mask, ModernBERT's sliding window) are detected by
:func:`packing_matches`, which compares a packed and a padded forward pass, and then
run padded.

**Decoders** (:func:`simcse_kit.model.families.is_decoder`) get no 4-D mask: their forward
is given ``position_ids`` that restart at 0 for each sentence and no attention mask, and
transformers' mask builder (``masking_utils.find_packed_sequence_indices``, called by
``create_causal_mask`` and ``create_sliding_window_causal_mask`` when the 2-D mask is None
and there is no cache) reads the sentences off those restarts and masks causally within each,
sliding windows included. Their padded forward counts positions over real tokens
(:func:`~simcse_kit.model.families.decoder_position_ids`), so a left-padded row packs as well
as a right-padded one. The probe (:func:`packing_matches`) checks that too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from simcse_kit.model.families import decoder_position_ids, probe_batch
from simcse_kit.model.fastpath.dropout import ATTENTION_NAME

logger = logging.getLogger(__name__)

# Pack only when it saves at least this share of the padded positions: the mask and
# gather cost a little, and a batch already sorted by length has little to save.
MIN_SAVING = 0.1


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each holding lengths that sum to at most ``capacity``.

    Args:
        lengths: ``B`` item lengths, each ``<= capacity``.
        capacity: the row length.

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once.
    """
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"length {n} does not fit in rows of {capacity}")
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


@dataclass
class PackedBatch:
    """A padded batch ``[B, T]`` rearranged into ``R`` rows of length ``T``.

    Attributes:
        input_ids: ``[R, T]``.
        position_ids: ``[R, T]``, counting from 0 within each sentence.
        token_type_ids: ``[R, T]`` or None.
        segment: ``[R, T]`` int64, the padded-batch row of each packed position, -1
            where unused.
        index: ``[B, T]`` int64, for each padded-batch position its flat position in
            ``[R * T]``, or ``R * T`` for a pad position (a zero row in :meth:`unpack`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    segment: torch.Tensor
    index: torch.Tensor

    @classmethod
    def from_plan(
        cls,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        *,
        pack_source: torch.Tensor,
        pack_index: torch.Tensor,
        pack_position_ids: torch.Tensor,
        pack_segment: torch.Tensor,
        pad_token_id: int = 0,
    ) -> PackedBatch:
        """Lay a padded ``[B, T]`` batch out in packed rows by a plan (:func:`plan`).

        Only gathers and comparisons whose output sizes come from the plan's shapes:
        nothing is read back from the device.
        """
        r, t = pack_position_ids.shape

        def gather(values: torch.Tensor, fill: int) -> torch.Tensor:
            flat = torch.cat([values.reshape(-1), values.new_full((1,), fill)])
            return flat.index_select(0, pack_source).view(r, t)

        return cls(
            input_ids=gather(input_ids, pad_token_id),
            position_ids=pack_position_ids,
            token_type_ids=None if token_type_ids is None else gather(token_type_ids, 0),
            segment=pack_segment,
            index=pack_index,
        )

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def attention_mask(self) -> torch.Tensor:
        """``[R, 1, T, T]`` bool, True where query ``i`` may attend key ``j``: the same
        sentence; a pad position attends only itself (a row with nothing to attend would
        give a NaN softmax). An encoder's mask; a decoder is given none (module docstring)."""
        seg, t = self.segment, self.segment.shape[1]
        same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
        same |= torch.eye(t, dtype=torch.bool, device=seg.device)
        return same[:, None]

    def unpack(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, T, H]`` packed states -> ``[B, T, H]`` in the padded layout (zeros at pads)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        flat = torch.cat([flat, flat.new_zeros(1, flat.shape[-1])])
        b, t = self.index.shape
        return flat.index_select(0, self.index.reshape(-1)).view(b, t, -1)


def token_spans(attention_mask: torch.Tensor, left_padding: bool = False) -> tuple[list[int], list[int]] | None:
    """Each row's first token and token count, when every row's tokens are one run that
    starts the row (right padding) or, with ``left_padding``, ends it (left padding);
    else None (holes, or left padding where it is not allowed: an encoder numbers a
    left-padded sentence's positions from the number of pads, not from 0, so its packed
    rows would not match).

    Returns:
        ``(starts, lengths)``, ``B`` ints each.
    """
    t = attention_mask.shape[1]
    lengths = attention_mask.sum(dim=1)
    steps = torch.arange(t, device=attention_mask.device)[None, :]
    keep = attention_mask.bool()
    if torch.equal(steps < lengths[:, None], keep):
        return [0] * len(lengths), lengths.tolist()
    if left_padding and torch.equal(steps >= t - lengths[:, None], keep):
        return (t - lengths).tolist(), lengths.tolist()
    return None


def plan(
    lengths: Sequence[int], t: int, min_saving: float = MIN_SAVING, starts: Sequence[int] | None = None
) -> dict[str, torch.Tensor] | None:
    """The packing of a padded ``[B, t]`` batch with these row lengths, as CPU tensors.

    Pure host work (first-fit decreasing in Python, the layout in numpy): the collator runs it in the
    DataLoader workers, so the training process gets the plan as tensors and a packed
    forward (:meth:`PackedBatch.from_plan`) needs no device-to-host synchronisation.

    Args:
        lengths: ``B`` token counts, each ``<= t``.
        t: the padded batch's length.
        min_saving: the share of the ``B * t`` positions packing must remove.
        starts: ``B`` column of each row's first token (None: all 0, right padding).

    Returns:
        None when packing saves too little; else (``R`` packed rows):
        ``pack_source`` ``[R * t]`` int64, each packed position's flat position in the
        padded ``[B * t]`` batch, or ``B * t`` for an unused one (the pad fill);
        ``pack_index`` ``[B, t]`` int64 (:attr:`PackedBatch.index`);
        ``pack_position_ids`` ``[R, t]`` int64, counting from 0 within each sentence;
        ``pack_segment`` ``[R, t]`` int64, the padded-batch row of each packed position,
        -1 where unused.
    """
    b = len(lengths)
    if not b:
        return None
    bins = first_fit_decreasing([max(n, 1) for n in lengths], t)
    r = len(bins)
    if r * t > (1.0 - min_saving) * b * t:
        return None
    # Each sentence's packed start, then all token positions at once (numpy, not a Python
    # step per token or per sentence: this runs for every training batch).
    order = np.fromiter((i for members in bins for i in members), dtype=np.int64, count=b)
    sizes = np.fromiter((len(members) for members in bins), dtype=np.int64, count=r)
    row_of = np.repeat(np.arange(r, dtype=np.int64), sizes)
    slots = np.maximum(np.asarray(lengths, dtype=np.int64), 1)[order]
    begins = np.cumsum(slots) - slots  # offsets in the rows' members laid end to end ...
    heads = begins[np.cumsum(sizes) - sizes]  # ... and where each row's first member is
    start = np.empty(b, dtype=np.int64)
    start[order] = row_of * t + begins - heads[row_of]
    n = np.asarray(lengths, dtype=np.int64)  # an empty row takes one slot but places no token
    item = np.repeat(np.arange(b, dtype=np.int64), n)
    step = np.arange(item.size, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    packed = start[item] + step
    first = np.zeros(b, dtype=np.int64) if starts is None else np.asarray(starts, dtype=np.int64)
    column = first[item] + step  # each token's column in the padded batch (left padding: after the pads)
    source = np.full(r * t, b * t, dtype=np.int64)
    segment = np.full(r * t, -1, dtype=np.int64)
    positions = np.zeros(r * t, dtype=np.int64)
    index = np.full((b, t), r * t, dtype=np.int64)
    source[packed] = item * t + column
    segment[packed] = item
    positions[packed] = step
    index[item, column] = packed
    return {
        "pack_source": torch.from_numpy(source),
        "pack_index": torch.from_numpy(index),
        "pack_position_ids": torch.from_numpy(positions).view(r, t),
        "pack_segment": torch.from_numpy(segment).view(r, t),
    }


def plan_batch(
    attention_mask: torch.Tensor, min_saving: float = MIN_SAVING, left_padding: bool = False
) -> dict[str, torch.Tensor]:
    """The collator's plan keys (:data:`~simcse_kit.core.batch.PLAN_INPUTS`) for a CPU ``[B, T]`` attention mask.

    A batch that should run padded (too little to save, or padded in a way that does not
    pack: :func:`token_spans`) gets the keys with zero packed rows, so the model knows from
    a shape, not from a value on the device, that the plan says "do not pack".
    ``left_padding``: left-padded rows pack too (a decoder's).
    """
    spans = token_spans(attention_mask, left_padding)
    b, t = attention_mask.shape
    planned = None if spans is None else plan(spans[1], t, min_saving, starts=spans[0])
    if planned is not None:
        return planned
    empty = torch.zeros(0, dtype=torch.int64)
    return {"pack_source": empty, "pack_index": empty, "pack_position_ids": empty.view(0, t), "pack_segment": empty.view(0, t)}


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    pad_token_id: int = 0,
    min_saving: float = MIN_SAVING,
    left_padding: bool = False,
) -> PackedBatch | None:
    """Pack a padded batch; None when packing would save less than ``min_saving`` of the
    positions (or the batch is padded in a way that does not pack: :func:`token_spans`).

    This plans on the spot (reading the lengths back from the device); training batches
    come with the plan precomputed by the collator (:func:`plan_batch`).

    Args:
        input_ids: ``[B, T]``.
        attention_mask: ``[B, T]``, 1 for tokens.
        token_type_ids: optional ``[B, T]``.
        pad_token_id: the id put in packed rows' unused positions.
        min_saving: the share of the ``B * T`` positions packing must remove.
        left_padding: left-padded rows pack too (a decoder, whose padded positions count
            real tokens).
    """
    spans = token_spans(attention_mask, left_padding)
    if spans is None:
        return None
    planned = plan(spans[1], input_ids.shape[1], min_saving, starts=spans[0])
    if planned is None:
        return None
    planned = {k: v.to(input_ids.device) for k, v in planned.items()}
    return PackedBatch.from_plan(input_ids, token_type_ids, pad_token_id=pad_token_id, **planned)


# Attention implementations that take a boolean 4-D mask (True = attend); every other one
# adds the mask to its scores. The fast-dropout attention takes either form.
BOOLEAN_MASK_ATTENTION = frozenset({"sdpa", ATTENTION_NAME})


def attention_mask_for(mask: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """The packed 4-D mask in the form the encoder's attention takes.

    Args:
        mask: ``[R, 1, T, T]`` bool, True = attend (:attr:`PackedBatch.attention_mask`).
        attn_implementation: the implementation the encoder was loaded with (recorded by
            the model: transformers has no public getter for it).
        dtype: the dtype of the attention scores (the encoder's compute dtype).

    Returns:
        ``mask`` itself for SDPA (and the fast-dropout attention); otherwise ``[R, 1, T, T]``
        additive, 0 where attended and ``dtype``'s minimum elsewhere (never -inf: a
        masked score must stay finite in fp16/bf16).
    """
    if attn_implementation in BOOLEAN_MASK_ATTENTION:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def packed_inputs(
    packed: PackedBatch, *, causal: bool, attn_implementation: str, dtype: torch.dtype, position_offset: int = 0
) -> dict[str, torch.Tensor | bool | None]:
    """The encoder's keyword arguments (besides ``input_ids``) for packed rows.

    Args:
        packed: the rows.
        causal: a decoder: position ids alone, restarting per sentence, and no mask, so
            transformers builds the causal mask per sentence (module docstring); no cache.
        attn_implementation: an encoder's attention, which decides the mask form
            (:func:`attention_mask_for`).
        dtype: the encoder's compute dtype (for an additive mask).
        position_offset: added to the position ids (RoBERTa-style embeddings).
    """
    if causal:
        return {"position_ids": packed.position_ids, "attention_mask": None, "use_cache": False}
    return {
        "position_ids": packed.position_ids + position_offset,
        "attention_mask": attention_mask_for(packed.attention_mask, attn_implementation, dtype),
    }


def padded_decoder_inputs(attention_mask: torch.Tensor) -> dict[str, torch.Tensor | bool]:
    """A decoder's keyword arguments (besides ``input_ids``) for a padded batch: the 2-D
    mask, position ids counted over real tokens (either padding side), and no cache (an
    embedding forward never generates; transformers' default builds one every call)."""
    return {"attention_mask": attention_mask, "position_ids": decoder_position_ids(attention_mask), "use_cache": False}


def packing_matches(
    encoder: nn.Module,
    vocab_size: int | None = None,
    atol: float = 1e-4,
    *,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    position_offset: int = 0,
    causal: bool = False,
) -> bool:
    """Whether ``encoder`` gives the same token states packed as padded.

    Runs a probe batch of three random sentences (lengths 5, 3 and 2, so two pack into
    one row; longer than a local-attention window where the model has one:
    :func:`simcse_kit.model.families.probe_batch`) both ways in eval mode, without
    gradient, and compares the tokens' last hidden states. A model that builds its own
    mask (DeBERTa-v2) or keeps a sliding window a 4-D mask overrides (ModernBERT) fails
    and is run padded; so does a decoder whose mask builder does not read the sentences
    off the restarting position ids (:func:`packed_inputs`).

    Args:
        encoder: a Hugging Face encoder taking ``position_ids`` and a 4-D mask.
        vocab_size: the probe's token id range (default: the encoder config's).
        atol: absolute and relative tolerance of the comparison.
        attn_implementation: the implementation ``encoder`` was loaded with, which
            decides the mask form (:func:`attention_mask_for`).
        dtype: the encoder's compute dtype (for an additive mask).
        position_offset: added to the packed position ids (RoBERTa-style embeddings
            number positions from ``padding_idx + 1``:
            :func:`simcse_kit.model.families.position_offset`).
        causal: ``encoder`` is a decoder (:func:`packed_inputs`).
    """
    pad = getattr(encoder.config, "pad_token_id", None) or 0
    ids, mask = probe_batch(encoder, vocab_size=vocab_size)
    packed = pack(ids, mask, pad_token_id=pad, min_saving=0.0)
    if packed is None or packed.rows != 2:
        return False
    padded_kwargs = padded_decoder_inputs(mask) if causal else {"attention_mask": mask}
    packed_kwargs = packed_inputs(
        packed, causal=causal, attn_implementation=attn_implementation, dtype=dtype, position_offset=position_offset
    )
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            padded = encoder(input_ids=ids, return_dict=True, **padded_kwargs).last_hidden_state
            out = encoder(input_ids=packed.input_ids, return_dict=True, **packed_kwargs).last_hidden_state
    except Exception as exc:  # any failure means "run padded"
        logger.info("sequence packing off: the encoder rejects a packed batch (%s)", exc)
        return False
    finally:
        encoder.train(was_training)
    unpacked = packed.unpack(out)
    keep = mask.bool()
    ok = torch.allclose(unpacked[keep].float(), padded[keep].float(), atol=atol, rtol=atol)
    if not ok:
        logger.info("sequence packing off: %s gives other token states packed than padded", type(encoder).__name__)
    return ok
