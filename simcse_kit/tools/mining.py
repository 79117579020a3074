"""Hard-negative mining for pair data: ``sent0, sent1`` -> ``sent0, sent1, hard_neg``
(or ``k`` negatives: ``hard_neg_1 .. hard_neg_k``).

Each anchor (``sent0``) gets ``num_negatives`` hard negatives from the file's own corpus
(every distinct ``sent0`` and ``sent1``): sentences the current model finds close to it
but not *too* close. The rules are sentence-transformers' ``mine_hard_negatives``:

  * ``range_max``: the best ``range_max`` candidates of the ranking are considered (the
    anchor and every sentence paired with it in any row aside: never a negative);
  * ``absolute_margin`` (``--margin``): drop a candidate with ``cos(a, c) > cos(a, p) - margin``;
  * ``relative_margin``: drop a candidate with ``cos(a, c) > cos(a, p) - |cos(a, p)| * margin``
    (``cos(a, p) * (1 - margin)`` for a positive ``cos(a, p)``);
  * ``range_min``: of the candidates left, in order, the ``range_min`` best are skipped
    (likely unlabelled paraphrases);
  * ``sampling_strategy``: ``"top"`` takes the next ``num_negatives``, ``"random"`` a
    seeded sample of that many from all that are left (written best first); a row with
    fewer than ``num_negatives`` left gets none (``mine_file`` leaves it out, as ST's
    ``n-tuple`` output does).

  * ``guide`` (``--guide``): a second model vets what is left, as ``loss.guide`` vets a
    batch's negatives (GISTEmbed; :func:`simcse_kit.core.masks.guide_threshold`): a candidate
    the guide rates above the row's positive, less ``guide_margin`` (absolute, or relative
    to the positive's guide score), is likely an unlabelled positive and is never taken.

The margins use the row's own positive (ST uses the hardest of the anchor's positives).
The search never builds the corpus's all-pairs matrix: the anchors' top candidates come
from :func:`simcse_kit.evaluation.search.exact_search` (blocks of queries and of corpus,
a running top-k) or, with ``index="faiss"`` (``pip install simcse-kit[faiss]``), a faiss
``IndexFlatIP``; each keeps ``range_max`` plus the most sentences any anchor is paired
with, so ``range_max`` candidates are left once those are set aside.

Why not ``sentence_transformers.util.mine_hard_negatives`` itself: it takes a
``SentenceTransformer``, while MODEL here is anything :func:`load_encoder` opens (a
simcse-kit folder with its own pooler and MLP, a plain HF model with ``--pooler``); making
each of those a ``SentenceTransformer`` means an export round trip per call.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from simcse_kit.config.run import DEFAULT_MODEL, GUIDE_MARGIN_STRATEGIES
from simcse_kit.core.masks import guide_threshold
from simcse_kit.core.modes import hard_negative_columns
from simcse_kit.data.readers import TEACHER_SCORES, read_rows, score_columns
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation.quantization import VectorPrecision, calibration_ranges
from simcse_kit.evaluation.search import SEARCHES
from simcse_kit.files import check_writable, write_text_atomic
from simcse_kit.model.inference import load_encoder

logger = logging.getLogger(__name__)

__all__ = ["INDEXES", "SAMPLING_STRATEGIES", "mine_file", "mine_hard_negatives", "mine_negatives"]

SAMPLING_STRATEGIES = ("top", "random")
INDEXES = tuple(SEARCHES)
"""``--index``: ``exact`` (chunked exact search, torch) or ``faiss``."""
RANGE_PER_NEGATIVE = 10
"""Without ``range_max``: ``range_min + 10 * num_negatives`` candidates (ST's default with a margin)."""


def check_options(
    num_negatives: int,
    range_min: int,
    range_max: int,
    margin: float,
    relative_margin: float | None,
    sampling_strategy: str,
    guide_margin: float = 0.0,
    guide_margin_strategy: str = "absolute",
) -> None:
    """The options' own rules, each a ConfigError naming the option."""
    if sampling_strategy not in SAMPLING_STRATEGIES:
        raise ConfigError(f"--sampling-strategy {sampling_strategy!r}: must be one of {SAMPLING_STRATEGIES}")
    if num_negatives < 1:
        raise ConfigError(f"--num-negatives {num_negatives}: must be >= 1")
    if range_min < 0:
        raise ConfigError(f"--range-min {range_min}: must be >= 0")
    if range_max < 1:
        raise ConfigError(f"--range-max {range_max}: must be >= 1")
    if num_negatives > range_max - range_min:
        raise ConfigError(
            f"--num-negatives {num_negatives}: only {max(range_max - range_min, 0)} candidate(s) remain after skipping "
            f"--range-min {range_min} of --range-max {range_max}; lower --num-negatives or --range-min, or raise --range-max"
        )
    # nan compares false with everything: no candidate would ever be dropped
    if not math.isfinite(margin):
        raise ConfigError(f"--margin {margin}: must be a finite number")
    if relative_margin is not None and not math.isfinite(relative_margin):
        raise ConfigError(f"--relative-margin {relative_margin}: must be a finite number")
    if not math.isfinite(guide_margin):
        raise ConfigError(f"--guide-margin {guide_margin}: must be a finite number")
    if guide_margin_strategy not in GUIDE_MARGIN_STRATEGIES:
        raise ConfigError(f"--guide-margin-strategy {guide_margin_strategy!r}: must be one of {GUIDE_MARGIN_STRATEGIES}")


def mine_hard_negatives(
    pairs: Sequence[tuple[str, str]],
    encode: Callable[[Sequence[str]], torch.Tensor],
    num_negatives: int = 1,
    *,
    range_min: int = 0,
    range_max: int | None = None,
    margin: float = 0.0,
    relative_margin: float | None = None,
    sampling_strategy: str = "top",
    seed: int = 0,
    index: str = "exact",
    device: torch.device | str = "cpu",
    guide: Callable[[Sequence[str]], torch.Tensor] | None = None,
    guide_margin: float = 0.0,
    guide_margin_strategy: str = "absolute",
    precision: str = "float32",
) -> list[tuple[str, ...] | None]:
    """``num_negatives`` hard negatives per pair, from the corpus of all the pairs'
    sentences, by the rules of the module docstring.

    Args:
        pairs: ``N`` (anchor, positive) pairs.
        encode: sentences -> ``[M, D]`` embeddings.
        num_negatives: ``k``, negatives per pair.
        range_min: best remaining candidates skipped (ST's ``range_min``).
        range_max: candidates ranked per anchor (ST's ``range_max``); None:
            ``range_min + 10 * num_negatives``.
        margin: ST's ``absolute_margin``; 0 skips only candidates scored above the positive.
        relative_margin: ST's ``relative_margin`` (None: off).
        sampling_strategy: ``"top"`` or ``"random"``.
        seed: for ``"random"``.
        index: ``"exact"`` or ``"faiss"`` (:data:`INDEXES`).
        device: where the exact search runs.
        guide: sentences -> ``[M, D']`` a second model's embeddings; a candidate it rates
            above the row's positive (by ``guide_margin``) is not taken (None: no guide).
        guide_margin: how far below the positive's guide score a candidate is still dropped.
        guide_margin_strategy: ``"absolute"`` or ``"relative"`` (a share of that score).
        precision: Mine with quantized vectors (``--embedding-precision``): every score
            (candidates, positive, margins) is the cosine of the codes, for binary
            ``1 - 2 hamming / D``; int8 ranges are the corpus's own (it is the index).

    Returns:
        ``N`` tuples of ``k`` negatives, best first; ``None`` where fewer than ``k`` qualify.
    """
    range_max = range_min + RANGE_PER_NEGATIVE * num_negatives if range_max is None else range_max
    check_options(
        num_negatives, range_min, range_max, margin, relative_margin, sampling_strategy, guide_margin, guide_margin_strategy
    )
    if index not in SEARCHES:
        raise ConfigError(f"--index {index!r}: must be one of {INDEXES}")
    corpus = list(dict.fromkeys(s for pair in pairs for s in pair))
    position = {text: i for i, text in enumerate(corpus)}
    queries = list(dict.fromkeys(a for a, _ in pairs))  # each distinct anchor searched once
    query_of = {text: i for i, text in enumerate(queries)}
    # Everything an anchor is paired with in any row, itself included: none is a negative.
    related = {(query_of[a], position[t]) for a, p in pairs for t in (a, p)}
    most_related = int(torch.bincount(torch.tensor([q for q, _ in related]), minlength=len(queries)).max())
    emb = torch.nn.functional.normalize(encode(corpus).float(), dim=-1)
    if precision != "float32":
        ranges = calibration_ranges(emb.numpy()) if precision in ("int8", "uint8") else None
        emb = torch.nn.functional.normalize(torch.from_numpy(VectorPrecision(precision, ranges).scored(emb)), dim=-1)
    query_rows = torch.tensor([position[q] for q in queries])
    k = min(range_max + most_related, len(corpus))
    scores, ids = SEARCHES[index](emb[query_rows], emb, k, device=device)
    # Set the related sentences aside (a key per (query, sentence) pair), keep the best range_max.
    keys = torch.arange(len(queries))[:, None] * len(corpus) + ids
    taken = torch.tensor(sorted(q * len(corpus) + c for q, c in related))
    scores = scores.masked_fill(torch.isin(keys, taken) | (ids < 0), -math.inf)
    scores, order = scores.sort(dim=1, descending=True, stable=True)
    scores, ids = scores[:, :range_max], ids.gather(1, order)[:, :range_max]
    # Per pair: its anchor's candidates, the margins against its own positive.
    rows = torch.tensor([query_of[a] for a, _ in pairs])
    scores, ids = scores[rows], ids[rows]
    anchor_rows, positive_rows = torch.tensor([position[a] for a, _ in pairs]), torch.tensor([position[p] for _, p in pairs])
    anchors = emb[anchor_rows]
    positive = (anchors * emb[positive_rows]).sum(dim=1, keepdim=True)
    drop = scores > positive - margin
    if relative_margin is not None:
        drop |= scores > positive - positive.abs() * relative_margin
    if guide is not None:
        vetted = guide_scores(guide, corpus, anchor_rows, positive_rows, ids)
        limit = guide_threshold(vetted[:, :1], guide_margin, guide_margin_strategy)
        dropped = (vetted[:, 1:] > limit) & ~drop & torch.isfinite(scores)
        logger.info("the guide dropped %d candidate(s) that the model's margins had kept", int(dropped.sum()))
        drop |= dropped
    scores = scores.masked_fill(drop, -math.inf)
    scores, order = scores.sort(dim=1, descending=True, stable=True)
    scores, ids = scores[:, range_min:], ids.gather(1, order)[:, range_min:]
    generator = torch.Generator().manual_seed(seed)
    out: list[tuple[str, ...] | None] = []
    for r in range(len(pairs)):
        valid = ids[r][torch.isfinite(scores[r])]
        if valid.numel() < num_negatives:
            out.append(None)
            continue
        if sampling_strategy == "top":
            picked = valid[:num_negatives]
        elif num_negatives == 1:  # one draw, as the one-negative miner always drew it
            picked = valid[int(torch.randint(valid.numel(), (1,), generator=generator))][None]
        else:  # a sample without replacement, written best first
            picked = valid[torch.randperm(valid.numel(), generator=generator)[:num_negatives].sort().values]
        out.append(tuple(corpus[int(i)] for i in picked))
    return out


GUIDE_BLOCK = 4096
"""Pairs scored by the guide at once: ``[block, range_max, D']`` stays small (all of SNLI at
once would be gigabytes)."""


def guide_scores(
    guide: Callable[[Sequence[str]], torch.Tensor],
    corpus: Sequence[str],
    anchor_rows: torch.Tensor,
    positive_rows: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """The guide's cosines of each pair's anchor with its positive and its candidates.

    Args:
        guide: sentences -> ``[M, D']`` embeddings.
        corpus: the ``M`` sentences.
        anchor_rows: ``[N]`` corpus row of each pair's anchor; ``positive_rows``: of its positive.
        ids: ``[N, K]`` corpus rows of each pair's candidates (``-1``: none; scored as row 0).

    Returns:
        ``[N, 1 + K]``: the positive's score, then each candidate's.
    """
    vectors = torch.nn.functional.normalize(guide(corpus).float(), dim=-1)
    anchors = vectors[anchor_rows]
    columns = torch.cat([positive_rows[:, None], ids.clamp_min(0)], dim=1)
    blocks = [
        torch.einsum("nd,nkd->nk", anchors[first : first + GUIDE_BLOCK], vectors[columns[first : first + GUIDE_BLOCK]])
        for first in range(0, len(anchor_rows), GUIDE_BLOCK)
    ]
    return torch.cat(blocks) if blocks else torch.empty(0, columns.shape[1])


def mine_negatives(
    pairs: Sequence[tuple[str, str]],
    encode: Callable[[Sequence[str]], torch.Tensor],
    top_k: int = 10,
    margin: float = 0.0,
    sampling_strategy: str = "top",
    seed: int = 0,
    progress: bool = True,
) -> list[str | None]:
    """One hard negative per pair (:func:`mine_hard_negatives` with ``num_negatives=1``
    and ``range_max=top_k``); ``None`` where no candidate qualifies.

    ``progress`` is accepted for callers of the older form; the search reports nothing.
    """
    if top_k < 1:
        raise ConfigError(f"--top-k {top_k}: must be >= 1")
    mined = mine_hard_negatives(pairs, encode, 1, range_max=top_k, margin=margin, sampling_strategy=sampling_strategy, seed=seed)
    return [None if m is None else m[0] for m in mined]


def check_output_file(pairs_path: str | Path, out_path: str | Path, what: str) -> None:
    """The output of a command that rewrites PAIRS (``mine``, ``score``), checked before any
    model is loaded and the file encoded: not PAIRS itself (it would be replaced by its own
    copy), not a folder (found only at the rename, after the work, otherwise), writable.

    Raises:
        ConfigError: the input or a folder, naming ``what`` is written; StorageError: not writable.
    """
    if Path(out_path).resolve() == Path(pairs_path).resolve():
        raise ConfigError(f"{out_path}: the output is the input file {pairs_path}; write the {what} to another file")
    if Path(out_path).is_dir():
        raise ConfigError(f"{out_path}: is a folder; give the path of a file to write the {what} to")
    check_writable(out_path, "--out")


def mine_file(
    pairs_path: str | Path,
    out_path: str | Path,
    model: str | None = None,
    pooler: str | None = None,
    top_k: int | None = None,
    margin: float = 0.0,
    sampling_strategy: str = "top",
    seed: int = 0,
    batch_size: int = 128,
    device: str = "auto",
    *,
    num_negatives: int = 1,
    range_min: int = 0,
    relative_margin: float | None = None,
    index: str = "exact",
    guide: str | None = None,
    guide_margin: float = 0.0,
    guide_margin_strategy: str = "absolute",
    precision: str = "float32",
    trust_remote_code: bool = False,
) -> dict[str, int]:
    """``simcse-kit mine``: read ``sent0, sent1`` pairs, write them with ``num_negatives``
    hard negatives: CSV columns ``hard_neg`` (one) or ``hard_neg_1 .. hard_neg_k``; JSONL
    (``out_path`` ending ``.jsonl``/``.json``) ``"hard_neg"``, a text for one and a list of
    ``k`` texts for more. Both read back as ``hardneg`` training data with that ``k``.

    Rows for which fewer than ``num_negatives`` candidates qualify are left out (and
    counted), as sentence-transformers does: a ``hardneg`` file needs ``k`` in every row.
    ``top_k`` is ``--range-max`` (:func:`mine_hard_negatives`). ``guide``: a second model
    (anything :func:`load_encoder` opens) that vets the candidates (``--guide``). ``precision``:
    mine with quantized vectors (:func:`mine_hard_negatives`).
    (anything :func:`load_encoder` opens) that vets the candidates (``--guide``).
    ``trust_remote_code``: run the folders' own code (``auto_map``); otherwise such a
    model (or guide) is refused.

    Returns:
        ``{"rows": written, "skipped": rows without enough negatives}``.
    """
    range_max = range_min + RANGE_PER_NEGATIVE * num_negatives if top_k is None else top_k
    check_options(
        num_negatives, range_min, range_max, margin, relative_margin, sampling_strategy, guide_margin, guide_margin_strategy
    )
    if index not in SEARCHES:
        raise ConfigError(f"--index {index!r}: must be one of {INDEXES}")
    if index == "faiss":
        try:
            import faiss  # noqa: F401
        except ImportError:
            raise ConfigError("--index faiss needs faiss: pip install 'simcse-kit[faiss]' (faiss-cpu)") from None
    check_output_file(pairs_path, out_path, "mined pairs")
    rows = read_rows(pairs_path, ("sent0", "sent1"))
    encoder = load_encoder(model or DEFAULT_MODEL, pooler=pooler, device=device, trust_remote_code=trust_remote_code)
    vetting = None
    if guide is not None:
        try:
            vetting = load_encoder(guide, device=device, trust_remote_code=trust_remote_code)
        except ConfigError as exc:
            raise ConfigError(f"--guide {guide}: {exc}") from None
    pairs = [(r["sent0"], r["sent1"]) for r in rows]
    negatives = mine_hard_negatives(
        pairs,
        lambda s: encoder.encode(s, batch_size=batch_size),
        num_negatives,
        range_min=range_min,
        range_max=range_max,
        margin=margin,
        relative_margin=relative_margin,
        sampling_strategy=sampling_strategy,
        seed=seed,
        index=index,
        device=encoder.device,
        guide=None if vetting is None else (lambda s: vetting.encode(s, batch_size=batch_size)),
        guide_margin=guide_margin,
        guide_margin_strategy=guide_margin_strategy,
        precision=precision,
    )
    kept = [(a, p, n) for (a, p), n in zip(pairs, negatives, strict=True) if n is not None]
    if not kept:  # an empty hardneg file would only fail later, at training
        raise DataError(
            f"{pairs_path}: no row got {'a hard negative' if num_negatives == 1 else f'{num_negatives} hard negatives'} "
            f"({len(pairs)} row(s), "
            f"{len(set(s for p in pairs for s in p))} distinct sentence(s); every candidate is one of the row's own "
            f"sentences, within the margins or past --range-max); nothing written to {out_path}"
        )
    write_text_atomic(out_path, format_rows(kept, num_negatives, Path(out_path)))
    skipped = len(pairs) - len(kept)
    if skipped:
        logger.warning(
            "%d of %d row(s) had fewer than %d candidate(s) left in the top %d after the margins and --range-min; left out",
            skipped,
            len(pairs),
            num_negatives,
            range_max,
        )
    logger.info("wrote %d rows with %d hard negative(s) each to %s", len(kept), num_negatives, out_path)
    return {"rows": len(kept), "skipped": skipped}


def format_rows(
    rows: Sequence[tuple[str, str, tuple[str, ...]]],
    num_negatives: int,
    out_path: Path,
    scores: Sequence[Sequence[float]] | None = None,
) -> str:
    """The mined file's text: JSONL for a ``.jsonl``/``.json`` path, else CSV (module docstring).

    ``scores``: each row's teacher scores ``[s_pos, s_neg_1, ..]`` (:mod:`simcse_kit.tools.scoring`),
    written as the training reader reads them: JSONL ``"scores"``, CSV
    :func:`simcse_kit.data.readers.score_columns`."""
    per_row: Sequence[Sequence[float] | None] = [None] * len(rows) if scores is None else scores
    if out_path.suffix.lower() in (".jsonl", ".json"):
        lines = []
        for (anchor, positive, negatives), row_scores in zip(rows, per_row, strict=True):
            value: str | list[str] = negatives[0] if num_negatives == 1 else list(negatives)
            obj: dict[str, object] = {"sent0": anchor, "sent1": positive, "hard_neg": value}
            if row_scores is not None:
                obj[TEACHER_SCORES] = list(row_scores)
            lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        return "".join(lines)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    negative_columns = hard_negative_columns(num_negatives)
    writer.writerow(("sent0", "sent1", *negative_columns, *(score_columns(negative_columns) if scores is not None else ())))
    for (anchor, positive, negatives), row_scores in zip(rows, per_row, strict=True):
        writer.writerow((anchor, positive, *negatives, *(row_scores or ())))
    return buffer.getvalue()
