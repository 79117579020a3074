"""Nearest documents by cosine: exact chunked search on a device, or a faiss index.

:func:`exact_search` never builds the full ``Q x C`` score matrix: queries go through in
blocks of ``query_chunk`` rows and the corpus in blocks of ``corpus_chunk`` rows; each
``(query block) x (corpus block)`` product keeps only its top ``k`` per query, merged into
the running top ``k``. Memory is ``query_chunk x corpus_chunk`` scores whatever the corpus
size, and the result is the same as a full-matrix sort (up to the order of exact ties).

:func:`faiss_search` hands the same question to a faiss ``IndexFlatIP`` (``pip install
simcse-kit[faiss]``): still exact inner products on normalised vectors, but on the CPU
with faiss's blocked BLAS kernels and its own memory management, for corpora whose
embeddings do not fit on the device. An approximate index (IVF, HNSW) is a one-line
change there, traded against recall.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["SEARCHES", "exact_search", "faiss_search"]


def _normalized(x: torch.Tensor | np.ndarray, device: torch.device | str) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.as_tensor(x).to(device=device, dtype=torch.float32), dim=-1)


def exact_search(
    queries: torch.Tensor | np.ndarray,
    corpus: torch.Tensor | np.ndarray,
    k: int,
    *,
    device: torch.device | str = "cpu",
    query_chunk: int = 1024,
    corpus_chunk: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most cosine-similar corpus rows of each query, exactly, in chunks.

    Args:
        queries: ``(Q, D)`` query embeddings (any float dtype; normalised here).
        corpus: ``(C, D)`` document embeddings (normalised here, a chunk at a time on ``device``).
        k: Documents kept per query (at most ``C``).
        device: Where the products run (``"cuda"`` for a GPU).
        query_chunk: Queries per block.
        corpus_chunk: Documents per block.

    Returns:
        ``(scores, indices)``, both ``(Q, min(k, C))`` on the CPU: cosines (float32) in
        descending order and the corpus rows they belong to (int64).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n_corpus = len(corpus)
    k = min(k, n_corpus)
    all_scores: list[torch.Tensor] = []
    all_indices: list[torch.Tensor] = []
    for q_start in range(0, len(queries), query_chunk):
        q = _normalized(queries[q_start : q_start + query_chunk], device)
        best_scores = torch.empty(len(q), 0, device=device)
        best_indices = torch.empty(len(q), 0, dtype=torch.long, device=device)
        for c_start in range(0, n_corpus, corpus_chunk):
            c = _normalized(corpus[c_start : c_start + corpus_chunk], device)
            scores, indices = torch.topk(q @ c.T, min(k, len(c)), dim=1)
            # Merge this block's top k with the running top k: 2k candidates per query.
            merged = torch.cat([best_scores, scores], dim=1)
            merged_indices = torch.cat([best_indices, indices + c_start], dim=1)
            best_scores, pick = torch.topk(merged, min(k, merged.shape[1]), dim=1)
            best_indices = torch.gather(merged_indices, 1, pick)
        all_scores.append(best_scores.cpu())
        all_indices.append(best_indices.cpu())
    return torch.cat(all_scores), torch.cat(all_indices)


def faiss_search(
    queries: torch.Tensor | np.ndarray, corpus: torch.Tensor | np.ndarray, k: int, **_: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`exact_search`'s answer from a faiss ``IndexFlatIP`` on normalised vectors.

    Raises:
        ImportError: faiss is not installed (``pip install simcse-kit[faiss]``).
    """
    try:
        import faiss
    except ImportError:
        raise ImportError("--index faiss needs faiss: pip install 'simcse-kit[faiss]' (faiss-cpu)") from None
    q = _normalized(queries, "cpu").numpy()
    c = _normalized(corpus, "cpu").numpy()
    index = faiss.IndexFlatIP(c.shape[1])
    index.add(c)
    scores, indices = index.search(q, min(k, len(c)))
    return torch.from_numpy(scores), torch.from_numpy(indices.astype(np.int64))


SEARCHES = {"exact": exact_search, "faiss": faiss_search}
"""Index name (``--index``) -> search function ``(queries, corpus, k, device=...) -> (scores, indices)``."""
