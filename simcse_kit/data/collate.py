"""Batch collation: a list of training examples as one tokenised batch of all their views.

A batch is its rows' token ids, example-major as :mod:`simcse_kit.core.batch` lays them
out, padded to the longest row (``input_ids``, ``attention_mask``, ``token_type_ids``
where the tokenizer has them), plus what the objective asks for: ``text_ids``, ``scores``,
``teacher_scores``, ``teacher_rows``, ``guide_rows``, a packing plan. The ids come from the
token table where the dataset has one (:mod:`simcse_kit.data.tokens`), else are tokenised
here; ESimCSE's word repetition (:func:`repeat_tokens`) changes them per batch. Apart from
the readers (:mod:`simcse_kit.data.readers`): this runs per batch in the DataLoader
workers, on rows the readers have already checked.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from simcse_kit.core import modes
from simcse_kit.core.batch import batch_texts, text_ids, view_columns, view_rows, views_per_example
from simcse_kit.data.readers import TEACHER_SCORES
from simcse_kit.data.tokens import TEXT_ID, Padding, id_columns
from simcse_kit.model.packing import plan_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class ContrastiveCollator:
    """Turn a list of examples into one tokenised batch of all their views.

    The rows are example-major, as :mod:`simcse_kit.core.batch` lays them out
    (``unsup``: ``[a, a, b, b, ...]``, each sentence twice so dropout makes the views;
    ``sup``: ``[p1, e1, p2, e2, ...]``; ``hardneg``: ``[p1, e1, c1, p2, e2, c2, ...]``,
    with ``k`` negatives ``[p1, e1, c1_1, .., c1_k, p2, ...]``).
    Padding is to the longest sequence of the batch, truncation at ``max_seq_len``.
    A mode with a score column (``scored``) also gets ``scores`` ``[N]`` float32: each
    example's graded label, in batch order.

    Args:
        tokenizer: a Hugging Face tokenizer.
        mode: a mode of :data:`simcse_kit.core.modes.TABLE` (``unsup``, ``sup``, ``hardneg``, ``scored``).
        max_seq_len: tokens per row, at most.
        with_text_ids: also add ``text_ids`` ``[B]`` int64 (row text hashes,
            :func:`simcse_kit.core.batch.text_ids`) for false-negative masking.
        word_repetition: ESimCSE's dup rate for ``unsup`` (0: off): view 1 of each
            example gets a few tokens doubled (:func:`repeat_tokens`); view 0 is as before.
        seed: with ``word_repetition``, seeds the draws (with each batch's texts).
        prompts: one text per view put before that view's rows
            (:func:`simcse_kit.core.batch.view_prompts` of ``data.prompts``; ``()``: none).
            ``text_ids`` are of the texts without them: a false negative is the same content.
        teacher_index: with a teacher (``loss.teacher``), sentence -> row of its vector
            table; adds ``teacher_rows`` ``[B]`` int64 (:mod:`simcse_kit.training.objective.teacher`).
        guide_index: with a guide (``loss.guide``), sentence -> row of its vector table;
            adds ``guide_rows`` ``[B]`` int64.
        packing_plan: also add the batch's packing plan (:func:`simcse_kit.model.packing.plan_batch`:
            ``pack_*`` int64 tensors), planned here in the DataLoader worker so a packing
            model's forward needs no device-to-host synchronisation.
        pack_left_padded: the plan packs left-padded rows too (a decoder's, whose positions
            count real tokens; an encoder's left-padded rows run padded).
        negatives: ``k``, hard negatives per example (``hardneg``; :func:`~simcse_kit.data.readers.negatives_of`
            the dataset's columns): ``2 + k`` rows per example.
        teacher_scores: also add ``teacher_scores`` ``[N, 1 + k]`` float32, each example's
            :data:`~simcse_kit.data.readers.TEACHER_SCORES` (its positive's, then its negatives'), in batch order.
    """

    tokenizer: PreTrainedTokenizerBase
    mode: str
    max_seq_len: int = 32
    with_text_ids: bool = False
    word_repetition: float = 0.0
    seed: int = 0
    prompts: tuple[str, ...] = ()
    teacher_index: Mapping[str, int] | None = None
    packing_plan: bool = False
    guide_index: Mapping[str, int] | None = None
    pack_left_padded: bool = False
    negatives: int = 1
    teacher_scores: bool = False

    def __post_init__(self) -> None:
        n_views = views_per_example(self.mode, self.negatives)  # an unknown mode fails here, not at the first batch
        if self.prompts and len(self.prompts) != n_views:
            raise ValueError(f"{len(self.prompts)} prompts for the {n_views} views of mode {self.mode!r}")
        if self.word_repetition and self.mode != "unsup":
            raise ValueError(f"word_repetition is an unsup augmentation; mode is {self.mode!r}")
        columns = view_columns(self.mode, self.negatives)
        self._sources = list(zip(columns, self.prompts or ("",) * n_views, strict=True))
        self._id_columns = id_columns(self._sources)  # per view, its token table column
        self._text_columns = list(dict.fromkeys(columns))
        self._pad = Padding.of(self.tokenizer)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from_table = all(name in examples[0] for name in self._id_columns)
        rows = self._table_rows(examples) if from_table else self._tokenised_rows(examples)
        raw: list[str] = []
        looked_up = self.teacher_index is not None or self.guide_index is not None  # their tables are by text
        if self.word_repetition or looked_up or (self.with_text_ids and not from_table):
            raw = batch_texts(examples, self.mode, self.negatives)
        if self.word_repetition:
            rows = self._with_repetition(rows, raw)
        out = self._pad(rows)
        if self.with_text_ids:
            if from_table:
                hashes = [ex[TEXT_ID + column] for ex in examples for column, _ in self._sources]
                out["text_ids"] = torch.tensor(hashes, dtype=torch.int64)
            else:
                out["text_ids"] = text_ids(raw)
        score_column = modes.mode(self.mode).score_column
        if score_column is not None:  # one graded label per example (not per row): the score loss's
            out["scores"] = torch.tensor([float(ex[score_column]) for ex in examples], dtype=torch.float32)
        if self.teacher_scores:  # per example too: its own candidates' scores, travelling with its rows
            out["teacher_scores"] = torch.tensor([ex[TEACHER_SCORES] for ex in examples], dtype=torch.float32)
        if self.teacher_index is not None:  # the teacher encoded the texts without prompts
            out["teacher_rows"] = torch.tensor([self.teacher_index[t] for t in raw], dtype=torch.long)
        if self.guide_index is not None:  # so did the guide
            out["guide_rows"] = torch.tensor([self.guide_index[t] for t in raw], dtype=torch.long)
        if self.packing_plan:
            out.update(plan_batch(out["attention_mask"], left_padding=self.pack_left_padded))
        return out

    def _table_rows(self, examples: list[dict[str, Any]]) -> list[list[int]]:
        """The rows' token ids, example-major, from the token table's columns (:mod:`simcse_kit.data.tokens`)."""
        return [ex[name] for ex in examples for name in self._id_columns]

    def _tokenised_rows(self, examples: list[dict[str, Any]]) -> list[list[int]]:
        """The rows' token ids, example-major, tokenising each distinct (column, prompt) once:
        an ``unsup`` sentence's two rows are one tokenisation, its ids twice."""
        encoded: dict[str, list[list[int]]] = {}
        for name, (column, prompt) in zip(self._id_columns, self._sources, strict=True):
            if name not in encoded:
                texts = [prompt + ex[column] for ex in examples]
                encoded[name] = self.tokenizer(texts, truncation=True, max_length=self.max_seq_len)["input_ids"]
        return [encoded[name][i] for i in range(len(examples)) for name in self._id_columns]

    def _with_repetition(self, rows: list[list[int]], raw: list[str]) -> list[list[int]]:
        """Repeat a few tokens of view 1 of each example (ESimCSE); view 0 as it is.

        The random draws are seeded from ``seed`` and the batch's own texts (with their
        prompts), not from a counter: a counter would live in each DataLoader worker's copy
        of the collator and be lost on ``--resume``, while the batches themselves are what
        the checkpointed loader generator reproduces; the same batch always gets the same
        repetitions.
        """
        texts = [self.prompts[i % len(self.prompts)] + text for i, text in enumerate(raw)] if self.prompts else raw
        digest = hashlib.blake2b(f"{self.seed}\0".encode() + "\0".join(texts).encode("utf-8"), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        second = view_rows(len(rows), views_per_example(self.mode, self.negatives), 1)
        out = list(rows)
        for i in range(len(rows))[second]:
            special = self.tokenizer.get_special_tokens_mask(rows[i], already_has_special_tokens=True)
            out[i] = repeat_tokens(rows[i], special, self.word_repetition, self.max_seq_len, rng)
        return out


def repeat_tokens(ids: list[int], special: list[int], rate: float, max_len: int, rng: random.Random) -> list[int]:
    """ESimCSE's word repetition (Wu et al. 2022) on one row of token ids.

    Of the row's ``n`` non-special tokens, ``randint(0, max(2, int(rate * n)))`` distinct
    ones (capped at ``n``) are each duplicated in place, so the tokens stay in order and
    only the length changes (SimCSE's views share a length, which the model learns to
    use; this breaks that). Tokens over ``max_len`` are cut from the end of the content,
    the special tokens kept.

    Args:
        ids: token ids with the tokenizer's special tokens.
        special: 1 where ``ids`` holds a special token (``get_special_tokens_mask``).
        rate: ESimCSE's ``dup_rate`` (0.32 in the paper).
        max_len: tokens per row, at most.
        rng: the batch's random source.

    Returns:
        The new ids: prefix specials, content with repetitions, suffix specials.
    """
    content = [i for i, s in enumerate(special) if not s]
    if not content:
        return list(ids)
    first, last = content[0], content[-1] + 1
    words = ids[first:last]
    n = len(words)
    dup = set(rng.sample(range(n), min(n, rng.randint(0, max(2, int(rate * n))))))
    repeated = [t for k, t in enumerate(words) for _ in range(2 if k in dup else 1)]
    room = max_len - first - (len(ids) - last)
    return ids[:first] + repeated[:room] + ids[last:]
