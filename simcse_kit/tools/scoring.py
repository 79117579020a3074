"""A teacher's scores of each row's candidates: ``sent0, sent1, hard_neg..`` -> the same
rows plus ``scores`` ``[s_pos, s_neg_1, .., s_neg_k]`` (``simcse-kit score``), the data
``loss.distill`` learns from (docs/losses.md).

Two kinds of teacher:

  * a bi-encoder, anything :func:`simcse_kit.model.inference.load_encoder` opens (a
    simcse-kit run or model folder with its own pooling, a sentence-transformers folder,
    a plain HF model with ``pooler``): the cosine of the anchor's vector with each
    candidate's, by :func:`simcse_kit.core.score_losses.candidate_cosines` (the student's
    own score in training). Every distinct text is encoded once, in batches; a model's
    ``query``/``document`` prompts go before the anchor and the candidates;
  * a sentence-transformers ``CrossEncoder`` folder: ``CrossEncoder.predict`` of each
    ``(anchor, candidate)`` pair, with the model's own activation (a sigmoid for one
    label: scores in [0, 1]).

The rows are read as the ``hardneg`` training reader reads them (:func:`simcse_kit.data.readers.read_rows`:
the same checks, the same file-and-line errors; columns other than the texts are not
kept) and written as :func:`simcse_kit.tools.mining.format_rows` writes mined ones, with
the scores added, atomically (never a half-written file).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from simcse_kit.config.run import DEFAULT_MODEL
from simcse_kit.core import modes
from simcse_kit.core.score_losses import candidate_cosines
from simcse_kit.data.readers import negatives_of, read_rows
from simcse_kit.errors import ConfigError
from simcse_kit.files import write_text_atomic
from simcse_kit.model.checks import check_weights
from simcse_kit.model.devices import resolve_device
from simcse_kit.model.inference import Encoder, SentenceTransformerEncoder, load_encoder
from simcse_kit.tools.mining import check_output_file, format_rows

logger = logging.getLogger(__name__)

__all__ = ["bi_encoder_scores", "cross_encoder_scores", "score_file"]

ROWS_PER_BLOCK = 4096
"""Rows whose candidate vectors are gathered at once: ``[rows, 1 + k, D]`` stays small."""


def bi_encoder_scores(
    rows: Sequence[Sequence[str]], encoder: Encoder | SentenceTransformerEncoder, batch_size: int = 128
) -> list[list[float]]:
    """The cosine of each row's anchor (``row[0]``) with each of its candidates (``row[1:]``).

    Args:
        rows: ``N`` rows of ``1 + C`` texts (anchor, positive, negatives), ``C`` the same in each.
        encoder: encodes texts to vectors (its pooling, its prompts).
        batch_size: texts per forward pass.

    Returns:
        ``N`` lists of ``C`` cosines.
    """
    query, document = (encoder.prompts.get(name, "") for name in modes.PROMPT_NAMES)
    anchors = [query + row[0] for row in rows]
    candidates = [document + text for row in rows for text in row[1:]]
    distinct = list(dict.fromkeys([*anchors, *candidates]))  # a premise that is also a negative: encoded once
    vectors = encoder.encode(distinct, batch_size=batch_size)
    index = {text: i for i, text in enumerate(distinct)}
    anchor_rows = torch.tensor([index[t] for t in anchors])
    candidate_rows = torch.tensor([index[t] for t in candidates]).view(len(rows), -1)
    scores: list[list[float]] = []
    for start in range(0, len(rows), ROWS_PER_BLOCK):
        block = slice(start, start + ROWS_PER_BLOCK)
        scores += candidate_cosines(vectors[anchor_rows[block]], vectors[candidate_rows[block]]).tolist()
    return scores


def cross_encoder_scores(
    rows: Sequence[Sequence[str]], path: str, batch_size: int = 128, device: str = "auto", trust_remote_code: bool = False
) -> list[list[float]]:
    """``CrossEncoder(path).predict`` of each row's ``(anchor, candidate)`` pairs, its own
    activation applied, as ``N`` lists of ``C`` scores. A folder needing its own code is
    refused unless ``trust_remote_code``."""
    from sentence_transformers import CrossEncoder

    check_weights(path, trust_remote_code)  # one line, never transformers' y/N question
    try:
        model = CrossEncoder(path, device=str(resolve_device(device)), trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ConfigError(f"--cross-encoder {path}: cannot load a cross-encoder there ({exc})") from None
    pairs = [(row[0], text) for row in rows for text in row[1:]]
    predicted = model.predict(pairs, batch_size=batch_size, show_progress_bar=False, convert_to_tensor=True)
    return torch.as_tensor(predicted).float().cpu().view(len(rows), -1).tolist()


def score_file(
    pairs_path: str | Path,
    out_path: str | Path,
    model: str | None = None,
    pooler: str | None = None,
    cross_encoder: str | None = None,
    batch_size: int = 128,
    device: str = "auto",
    trust_remote_code: bool = False,
) -> dict[str, int]:
    """``simcse-kit score``: read ``sent0, sent1`` and ``k`` hard negatives per row, write the
    same rows with their teacher scores (module docstring): JSONL (``out_path`` ending
    ``.jsonl``/``.json``) ``"scores": [s_pos, s_neg_1, .., s_neg_k]``, else CSV columns
    ``score_pos`` and ``score_neg`` (one negative) or ``score_neg_1 .. score_neg_k``.

    Args:
        pairs_path: CSV or JSONL, as ``hardneg`` training data.
        out_path: the scored file (not the input).
        model: a bi-encoder (default: the default model); not with ``cross_encoder``.
        pooler: for a plain HF ``model``.
        cross_encoder: a sentence-transformers CrossEncoder folder or hub id.
        batch_size: texts (or pairs) per forward pass.
        device: ``auto``, ``cpu``, ``cuda``, ...
        trust_remote_code: run the teacher folder's own code (``auto_map``); otherwise
            such a folder is refused.

    Returns:
        ``{"rows": written, "negatives": k}``.
    """
    if model is not None and cross_encoder is not None:
        raise ConfigError("--model and --cross-encoder: give one teacher")
    check_output_file(pairs_path, out_path, "scored rows")
    rows = read_rows(pairs_path, ("sent0", "sent1"), hard_negatives=True)
    k = negatives_of(list(rows[0]))
    negative_columns = modes.hard_negative_columns(k)
    texts = [[row["sent0"], row["sent1"], *(row[c] for c in negative_columns)] for row in rows]
    if cross_encoder is not None:
        scores = cross_encoder_scores(texts, cross_encoder, batch_size, device, trust_remote_code)
    else:
        encoder = load_encoder(model or DEFAULT_MODEL, pooler=pooler, device=device, trust_remote_code=trust_remote_code)
        scores = bi_encoder_scores(texts, encoder, batch_size)
    triples = [(t[0], t[1], tuple(t[2:])) for t in texts]
    write_text_atomic(out_path, format_rows(triples, k, Path(out_path), scores))
    logger.info("wrote %d rows with the scores of a positive and %d hard negative(s) each to %s", len(rows), k, out_path)
    return {"rows": len(rows), "negatives": k}
