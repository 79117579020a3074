"""A stronger model's vectors of the training sentences, computed once and cached.

Distillation (``loss.teacher``) needs the teacher's view of every training row, and the
guide (``loss.guide``, which vets negatives) the guide's: both are such a table, made here. Running the
teacher inside each step would cost a second, bigger forward per batch; instead each
*distinct* training sentence is encoded once before training (batched, on the run's
device, with a progress bar) into a table ``[U, D']``, and a batch carries each row's index
into it (``teacher_rows``, added by the collator). The table is cached on disk under a key
made of the teacher's identity (its folder's files, or its hub id), the maximum length and
the sentences, so ``--seeds``, sweeps and reruns never load the teacher again.

The loss side lives in the loss core (:func:`simcse_kit.core.losses.similarity_targets`) and the
objective; this module only produces and stores vectors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from simcse_kit.core.batch import view_columns
from simcse_kit.errors import ConfigError
from simcse_kit.model.inference import load_encoder
from simcse_kit.model.modeling import resolve_model_path

logger = logging.getLogger(__name__)

__all__ = [
    "TeacherTable",
    "aligned_projection",
    "default_cache_dir",
    "load_teacher_table",
    "pca_projection",
    "teacher_key",
    "teacher_texts",
]

CACHE_ENV = "SIMCSE_KIT_CACHE"
CACHE_FORMAT = "1"  # bump when what a cached table holds changes
ENCODE_BLOCK = 2048  # sentences per progress-bar tick


@dataclass
class TeacherTable:
    """The teacher's vectors of the training sentences.

    Attributes:
        vectors: ``[U, D']`` fp32, one row per distinct sentence, as the teacher encodes
            it (normalised or not, as the teacher's own modules decide).
        index: sentence -> its row.
        key: the cache key (hex), recorded in metrics.json.
        cache_hit: True when read from the cache (the teacher was never loaded).
        seconds: time to encode (or to read the cache).
    """

    vectors: torch.Tensor
    index: Mapping[str, int]
    key: str
    cache_hit: bool
    seconds: float

    @property
    def width(self) -> int:
        return int(self.vectors.shape[1])


def teacher_texts(columns: Mapping[str, Sequence[str]], mode: str, negatives: int = 1) -> list[str]:
    """The distinct sentences of a training set's view columns, in first-seen order.

    Args:
        columns: the dataset's columns (``sent0``, ``sent1``, ``hard_neg`` or
            ``hard_neg_1 .. hard_neg_k``) by name.
        mode: ``unsup``, ``sup`` or ``hardneg`` (which columns are views).
        negatives: ``k``, hard negatives per example (``hardneg``).
    """
    names = dict.fromkeys(view_columns(mode, negatives))
    return list(dict.fromkeys(text for name in names for text in columns[name]))


def default_cache_dir() -> Path:
    """``$SIMCSE_KIT_CACHE/teachers``, else ``~/.cache/simcse-kit/teachers``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "simcse-kit"
    return Path(root) / "teachers"


def _identity(teacher: str) -> str:
    """What names the teacher's weights: a folder by its files (name, size, mtime), so an
    edited folder never reuses a stale table; a hub id by itself."""
    path = Path(resolve_model_path(teacher)).expanduser()
    if not path.is_dir():
        return f"hub:{teacher}"
    files = sorted(p for p in path.rglob("*") if p.is_file())
    stamp = [f"{p.relative_to(path)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return f"dir:{path.resolve()}\n" + "\n".join(stamp)


def teacher_key(teacher: str, texts: Sequence[str], max_seq_len: int | None) -> str:
    """The cache key of ``teacher``'s table of ``texts`` at ``max_seq_len``."""
    h = hashlib.sha256(f"{CACHE_FORMAT}\0{_identity(teacher)}\0{max_seq_len}\0{len(texts)}\0".encode())
    for text in texts:
        h.update(text.encode("utf-8") + b"\0")
    return h.hexdigest()[:32]


def _read_cache(path: Path, texts: Sequence[str]) -> torch.Tensor | None:
    try:
        with safe_open(str(path), framework="pt") as fh:
            cached = json.loads((fh.metadata() or {}).get("texts", "null"))
            vectors = fh.get_tensor("vectors")
    except Exception as exc:  # a truncated or foreign file: encode again, overwrite it
        logger.warning("teacher cache %s is unreadable (%s); encoding again", path, exc)
        return None
    if cached != list(texts) or vectors.shape[0] != len(texts):
        logger.warning("teacher cache %s holds other sentences; encoding again", path)
        return None
    return vectors.float()


def _write_cache(path: Path, vectors: torch.Tensor, texts: Sequence[str], teacher: str) -> None:
    # Written beside and renamed: a kill leaves no half table that a later run would trust.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file({"vectors": vectors.contiguous()}, tmp, metadata={"texts": json.dumps(list(texts)), "teacher": teacher})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_teacher_table(
    teacher: str,
    texts: Sequence[str],
    *,
    cache_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    max_seq_len: int | None = None,
    batch_size: int = 128,
    show_progress: bool = True,
    config_key: str = "loss.teacher",
) -> TeacherTable:
    """The teacher's (or the guide's) vectors of ``texts``: from the cache, or encoded once and cached.

    Args:
        teacher: any model :func:`simcse_kit.model.inference.load_encoder` opens (a
            sentence-transformers folder, a simcse-kit model or run, a hub id).
        texts: the distinct training sentences.
        cache_dir: where tables are kept (default :func:`default_cache_dir`).
        device: where the teacher runs (the training device).
        max_seq_len: the teacher's truncation (default its own).
        batch_size: sentences per forward.
        show_progress: a progress bar over the encoding.
        config_key: the key that named the model (``loss.teacher`` or ``loss.guide``), for
            errors and logs.
    """
    role = config_key.rsplit(".", 1)[-1]
    start = time.perf_counter()
    key = teacher_key(teacher, texts, max_seq_len)
    path = Path(cache_dir or default_cache_dir()) / f"{key}.safetensors"
    index = {text: i for i, text in enumerate(texts)}
    vectors = _read_cache(path, texts) if path.is_file() else None
    if vectors is not None:
        logger.info("%s %s: %d sentences from the cache %s", role, teacher, len(texts), path)
        return TeacherTable(vectors, index, key, True, time.perf_counter() - start)
    try:
        encoder = load_encoder(teacher, max_seq_len=max_seq_len, device=str(device))
    except ConfigError as exc:
        raise ConfigError(f"config key {config_key!r} = {teacher!r}: {exc}") from None
    blocks = []
    bar = tqdm(total=len(texts), desc=role, unit="sent", disable=not show_progress)
    for first in range(0, len(texts), ENCODE_BLOCK):
        block = list(texts[first : first + ENCODE_BLOCK])
        blocks.append(encoder.encode(block, batch_size=batch_size).float().cpu())
        bar.update(len(block))
    bar.close()
    vectors = torch.cat(blocks) if blocks else torch.empty(0, 0)
    _write_cache(path, vectors, texts, teacher)
    seconds = time.perf_counter() - start
    width = vectors.shape[1]
    logger.info("%s %s: encoded %d sentences (%d wide) in %.1f s; cached at %s", role, teacher, len(texts), width, seconds, path)
    return TeacherTable(vectors, index, key, False, seconds)


def pca_projection(vectors: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The PCA that maps the teacher's ``[U, D']`` vectors to ``dim`` columns (the
    student's width), as sentence-transformers' distillation example reduces a wider
    teacher: ``(mean [D'], components [D', dim])``; project with ``(x - mean) @ components``.

    Deterministic (an SVD in fp64; each component's sign fixed so its largest entry is
    positive), so a resumed run projects exactly as the first.
    """
    n, width = vectors.shape
    if not 0 < dim <= width:
        raise ConfigError(f"PCA only narrows: the teacher's vectors are {width} wide, the student's {dim}")
    if n < dim:
        raise ConfigError(f"a PCA projection to {dim} dimensions needs at least {dim} training sentences, got {n}")
    x = vectors.double()
    mean = x.mean(dim=0)
    _, _, vh = torch.linalg.svd(x - mean, full_matrices=False)
    components = vh[:dim].T  # [D', dim]
    signs = torch.sign(components.gather(0, components.abs().argmax(dim=0, keepdim=True)))
    return mean.float(), (components * signs).float()


def aligned_projection(teacher: torch.Tensor, student: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's vectors mapped into the student's own coordinates, for ``embedding``
    distillation from a model the student was not cut from (``loss.teacher_projection: aligned``).

    A PCA alone (:func:`pca_projection`) keeps the teacher's axes, which have nothing to do with
    an independently trained student's: MSE towards them first has to rotate the student's
    whole space, which wrecks it long before the teacher's finer geometry is learnt. Here the
    PCA is followed by the similarity transform (orthogonal Procrustes: rotation and one
    scale) that best maps the projected teacher vectors onto the student's vectors of the
    same sentences, and the student's mean is added back, so the targets start where the
    student is and differ from it only by what the teacher's geometry says.

    Args:
        teacher: ``[U, D']`` the teacher's vectors of the training sentences.
        student: ``[U, D]`` the untrained student's vectors of the same sentences (``D <= D'``).

    Returns:
        ``(mean [D'], components [D', D], offset [D])``: project with
        ``(x - mean) @ components + offset``. Deterministic (fp64 SVDs), so a resumed run
        projects exactly as the first.
    """
    if teacher.shape[0] != student.shape[0]:
        raise ValueError(f"teacher and student vectors of different sentences: {teacher.shape[0]} vs {student.shape[0]} rows")
    mean, components = pca_projection(teacher, student.shape[1])
    projected = (teacher.double() - mean.double()) @ components.double()
    offset = student.double().mean(dim=0)
    u, sigma, vh = torch.linalg.svd(projected.T @ (student.double() - offset), full_matrices=False)
    scale = sigma.sum() / projected.pow(2).sum().clamp_min(1e-12)
    return mean, (components.double() @ (u @ vh) * scale).float(), offset.float()
