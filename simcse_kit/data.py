"""Training data: validated readers, `datasets` wrapping and batch collation.

Files are read with :func:`simcse_kit.fileio.read_lines` (UTF-8, a byte-order mark as
Excel writes it dropped, ``\r\n`` or ``\n``) and checked here, so an error names the
file and line, then handed to `datasets.Dataset`. Formats, by training mode:
  * ``unsup``: a text file, one sentence a line; blank lines are skipped.
  * ``sup``: CSV or JSONL with columns ``sent0, sent1`` (extra columns are ignored).
  * ``hardneg``: CSV or JSONL with ``sent0, sent1, hard_neg``.
  * ``hub:<id>``: a hub dataset (users with internet), same columns, split ``train``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch

from simcse_kit.batch import VIEW_COLUMNS, batch_texts, text_ids, view_rows, views_per_example
from simcse_kit.errors import DataError, where
from simcse_kit.fileio import read_json_objects, read_lines
from simcse_kit.packing import plan_batch

logger = logging.getLogger(__name__)

# The columns a training file of each mode must have: those its views are read from.
COLUMNS: dict[str, tuple[str, ...]] = {mode: tuple(dict.fromkeys(cols)) for mode, cols in VIEW_COLUMNS.items()}


def read_sentences(path: str | Path) -> list[str]:
    """One sentence a line; blank lines skipped; an empty file is an error."""
    path = Path(path)
    sentences = [line.strip() for _, line in read_lines(path) if line.strip()]
    if not sentences:
        raise DataError(f"{path}: no sentences (the file is empty or blank)")
    if len(sentences) < 2:
        raise DataError(f"{path}: only one sentence; contrastive training needs at least two (in-batch negatives)")
    return sentences


def _check_row(path: Path, number: int, row: dict[str, object], columns: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for col in columns:
        value = row.get(col)
        if value is None:
            raise DataError(f"{where(path, number)}: missing value for column {col!r}")
        if not isinstance(value, str):
            raise DataError(f"{where(path, number)}: column {col!r} must be text, got {type(value).__name__}")
        if not value.strip():
            raise DataError(f"{where(path, number)}: empty value in column {col!r}")
        out[col] = value.strip()
    return out


def _csv_records(reader: Iterator[list[str]], path: Path) -> Iterator[list[str]]:
    """Iterate a ``csv.reader``, turning its errors (a bare carriage return inside a
    field, a field over ``csv.field_size_limit()``) into a DataError naming the line."""
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"{where(path, getattr(reader, 'line_num', None))}: not valid CSV ({exc})") from None
        yield record


def read_rows(path: str | Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """Read CSV (header row) or JSONL (one object a line) and check the columns."""
    path = Path(path)
    rows: list[dict[str, str]] = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for number, obj in read_json_objects(path, keys=f" with keys {list(columns)}"):
            rows.append(_check_row(path, number, obj, columns))
    else:
        lines = read_lines(path)
        if not lines:
            raise DataError(f"{path}: empty file; expected a header row with {list(columns)}")
        text = "\n".join(line for _, line in lines)
        reader = csv.reader(io.StringIO(text))
        records = _csv_records(reader, path)
        try:
            header = [h.strip() for h in next(records)]
        except StopIteration:
            raise DataError(f"{path}: empty file; expected a header row with {list(columns)}") from None
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:  # csv's DictReader-style zip would silently keep the last of the copies
            raise DataError(f"{where(path, 1)}: header {header} repeats column(s) {repeated}; name each column once")
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataError(f"{where(path, 1)}: header {header} lacks column(s) {missing}")
        for record in records:
            number = reader.line_num
            if not any(field.strip() for field in record):
                continue
            if len(record) != len(header):
                raise DataError(f"{where(path, number)}: {len(record)} fields, header has {len(header)}")
            rows.append(_check_row(path, number, dict(zip(header, record, strict=True)), columns))
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} usable row(s); contrastive training needs at least two")
    return rows


def load_train_dataset(
    source: str, mode: str, max_samples: int | None = None, sentences: Sequence[str] | None = None
) -> datasets.Dataset:
    """The training set for ``mode`` as a `datasets.Dataset` with columns ``COLUMNS[mode]``.

    ``sentences``: an ``unsup`` corpus already read (the distinct sentences of a scored
    pair file, say); ``source`` then only names it.
    """
    columns = COLUMNS[mode]
    if sentences is not None:
        if mode != "unsup":
            raise ValueError(f"a sentence list is an unsup corpus; mode is {mode!r}")
        ds = datasets.Dataset.from_dict({"sent0": list(sentences)})
    elif source.startswith("hub:"):
        try:
            ds = datasets.load_dataset(source[4:], split="train")
        except Exception as exc:  # offline, unknown id, no train split: many exception types
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"{source}: cannot load this hub dataset ({reason})") from None
        missing = [c for c in columns if c not in ds.column_names]
        if missing:
            raise DataError(f"{source}: dataset lacks column(s) {missing}; has {ds.column_names}")
        ds = ds.select_columns(list(columns))
    elif mode == "unsup" and Path(source).suffix.lower() not in (".csv", ".jsonl", ".json"):
        sentences = read_sentences(source)
        duplicates = len(sentences) - len(set(sentences))
        if duplicates:
            # Kept (a corpus is what it is), but two copies in one batch are each
            # other's negatives: say so, and how to mask them.
            logger.warning(
                "%s: %d duplicated sentence(s) kept; copies in one batch act as negatives (set loss.mask_false_negatives)",
                source,
                duplicates,
            )
        ds = datasets.Dataset.from_dict({"sent0": sentences})
    else:
        rows = read_rows(source, columns)
        ds = datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in columns})
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    logger.info("loaded %d training examples (%s) from %s", len(ds), mode, source)
    return ds


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
    wanted = round(len(domain) * ratio / (1 - ratio))
    if wanted > len(general):
        raise DataError(f"mix_ratio {ratio}: needs {wanted} general examples, the mix file has {len(general)}")
    picked = torch.randperm(len(general), generator=torch.Generator().manual_seed(seed))[:wanted]
    mixed = datasets.concatenate_datasets([domain, general.select(sorted(picked.tolist()))])
    logger.info("mixed %d in-domain + %d general examples (ratio %.2f)", len(domain), wanted, ratio)
    return mixed


@dataclass
class ContrastiveCollator:
    """Turn a list of examples into one tokenised batch of all their views.

    The rows are example-major, as :mod:`simcse_kit.batch` lays them out
    (``unsup``: ``[a, a, b, b, ...]``, each sentence twice so dropout makes the views;
    ``sup``: ``[p1, e1, p2, e2, ...]``; ``hardneg``: ``[p1, e1, c1, p2, e2, c2, ...]``).
    Padding is to the longest sequence of the batch, truncation at ``max_seq_len``.

    Args:
        tokenizer: a Hugging Face tokenizer.
        mode: ``unsup``, ``sup`` or ``hardneg``.
        max_seq_len: tokens per row, at most.
        with_text_ids: also add ``text_ids`` ``[B]`` int64 (row text hashes,
            :func:`simcse_kit.batch.text_ids`) for false-negative masking.
        word_repetition: ESimCSE's dup rate for ``unsup`` (0: off): view 1 of each
            example gets a few tokens doubled (:func:`repeat_tokens`); view 0 is as before.
        seed: with ``word_repetition``, seeds the draws (with each batch's texts).
        prompts: one text per view put before that view's rows
            (:func:`simcse_kit.batch.view_prompts` of ``data.prompts``; ``()``: none).
            ``text_ids`` are of the texts without them: a false negative is the same content.
        teacher_index: with a teacher (``loss.teacher``), sentence -> row of its vector
            table; adds ``teacher_rows`` ``[B]`` int64 (:mod:`simcse_kit.teacher`).
        packing_plan: also add the batch's packing plan (:func:`simcse_kit.packing.plan_batch`:
            ``pack_*`` int64 tensors), planned here in the DataLoader worker so a packing
            model's forward needs no device-to-host synchronisation.
    """

    tokenizer: object
    mode: str
    max_seq_len: int = 32
    with_text_ids: bool = False
    word_repetition: float = 0.0
    seed: int = 0
    prompts: tuple[str, ...] = ()
    teacher_index: Mapping[str, int] | None = None
    packing_plan: bool = False

    def __post_init__(self) -> None:
        views_per_example(self.mode)  # an unknown mode fails here, not at the first batch
        if self.prompts and len(self.prompts) != views_per_example(self.mode):
            raise ValueError(f"{len(self.prompts)} prompts for the {views_per_example(self.mode)} views of mode {self.mode!r}")
        if self.word_repetition and self.mode != "unsup":
            raise ValueError(f"word_repetition is an unsup augmentation; mode is {self.mode!r}")

    def __call__(self, examples: list[dict[str, str]]) -> dict[str, torch.Tensor]:
        texts = raw = batch_texts(examples, self.mode)
        if self.prompts:
            texts = [self.prompts[i % len(self.prompts)] + text for i, text in enumerate(raw)]
        if self.word_repetition:
            batch = self._with_repetition(texts)
        else:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_len, return_tensors="pt")
        out = dict(batch)
        if self.with_text_ids:
            out["text_ids"] = text_ids(raw)
        if self.teacher_index is not None:  # the teacher encoded the texts without prompts
            out["teacher_rows"] = torch.tensor([self.teacher_index[t] for t in raw], dtype=torch.long)
        if self.packing_plan:
            out.update(plan_batch(out["attention_mask"]))
        return out

    def _with_repetition(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Tokenise, repeat a few tokens of view 1 of each example (ESimCSE), pad.

        The random draws are seeded from ``seed`` and the batch's own texts, not from a
        counter: a counter would live in each DataLoader worker's copy of the collator and
        be lost on ``--resume``, while the batches themselves are what the checkpointed
        loader generator reproduces; the same batch always gets the same repetitions.
        """
        features = self.tokenizer(texts, truncation=True, max_length=self.max_seq_len)
        digest = hashlib.blake2b(f"{self.seed}\0".encode() + "\0".join(texts).encode("utf-8"), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        n_rows = len(texts)
        second_views = set(range(n_rows)[view_rows(n_rows, views_per_example(self.mode), 1)])
        rows = []
        for i, ids in enumerate(features["input_ids"]):
            if i in second_views:
                ids = repeat_tokens(
                    ids,
                    self.tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True),
                    self.word_repetition,
                    self.max_seq_len,
                    rng,
                )
            row = {"input_ids": ids, "attention_mask": [1] * len(ids)}
            if "token_type_ids" in features:
                row["token_type_ids"] = [0] * len(ids)
            rows.append(row)
        return self.tokenizer.pad(rows, return_tensors="pt")


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
