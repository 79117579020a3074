"""Checking an export: its vectors against simcse-kit's on probe sentences (cosine and norm,
per backend), and each backend's encode speed for the card.

A wrong mapping shows as a low cosine; a missing or extra ``Normalize`` leaves cosine at 1
and shows in the norms, so both are checked. Every backend is read back from the written
folder, as a user would load it: ``SentenceTransformer`` for torch,
:class:`~simcse_kit.export.onnx_encoder.OnnxEncoder` (onnxruntime + tokenizers) for ONNX.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from sentence_transformers import SentenceTransformer

from simcse_kit.export.onnx import OnnxExport
from simcse_kit.export.onnx_encoder import OnnxEncoder
from simcse_kit.export.source import ExportError

logger = logging.getLogger(__name__)

MIN_COSINE = 0.9999
"""Torch export vs simcse-kit: every probe's cosine must reach this."""
MIN_COSINE_ONNX = 0.9999
"""fp32 ONNX export (onnxruntime + tokenizers) vs simcse-kit on the probes."""
NORM_RTOL = 1e-3
"""Relative difference allowed between exported and reference vector norms (cosine is blind
to scale, so this is what catches a missing or extra ``Normalize``)."""

# Varied on purpose: one word, punctuation, digits, casing, accents, a sentence far past
# any max_seq_len (checks the exported truncation), and lengths that force padding.
PROBE_SENTENCES: tuple[str, ...] = (
    "A man is playing a guitar.",
    "A woman is slicing an onion in the kitchen.",
    "Two dogs are running through a snowy field.",
    "hello",
    "The stock market fell 3.5% on Tuesday, its worst day since March 2020!",
    "Can you tell me where the nearest train station is?",
    "Le café était délicieux, merci beaucoup.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "a child plays with a red ball in the park",
    "Nobody expected the results to be this good; the team celebrated late into the night.",
    "Scientists discovered a new species of frog in the rainforest of Ecuador.",
    "I don't think that's right.",
    " ".join(["This sentence repeats itself to run well past the maximum sequence length."] * 40),
    "Water boils at 100 degrees Celsius at sea level.",
    "She reads a book in bed before sleeping.",
    "The car drives down the empty street at night.",
)

TensorEncode = Callable[[Sequence[str]], torch.Tensor]
"""``encode(sentences) -> [N, D]`` embeddings as a torch tensor: what the parity checks
compare (a narrower kind of :data:`simcse_kit.evaluation.encoding.Encode`, which may also
return numpy, so every one is also an evaluator's encode function)."""


@dataclass
class Parity:
    """How one backend's vectors compare with simcse-kit's on the probes."""

    min_cosine: float
    max_abs_diff: float
    max_norm_rel_diff: float
    worst_probe: int


def parity(reference: torch.Tensor, exported: torch.Tensor) -> Parity:
    """Compare two ``[N, D]`` embedding sets row by row (fp64)."""
    if reference.shape != exported.shape:
        raise ExportError(f"exported model gives shape {tuple(exported.shape)}, simcse-kit {tuple(reference.shape)}")
    ref, exp = reference.double(), exported.double()
    cos = torch.nn.functional.cosine_similarity(ref, exp, dim=-1)
    norms = (exp.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12) - 1).abs()
    worst = int(cos.argmin())
    return Parity(float(cos[worst]), float((ref - exp).abs().max()), float(norms.max()), worst)


def check_parity(what: str, result: Parity, min_cosine: float, probes: Sequence[str], out: Path) -> None:
    """Raise :class:`ExportError` unless ``result`` meets ``min_cosine`` and :data:`NORM_RTOL`."""
    logger.info(
        "%s parity: min cosine %.7f, max |diff| %.2e, max norm diff %.2e",
        what,
        result.min_cosine,
        result.max_abs_diff,
        result.max_norm_rel_diff,
    )
    if result.min_cosine < min_cosine:
        raise ExportError(
            f"{what} export disagrees with simcse-kit: cosine {result.min_cosine:.6f} < {min_cosine} on probe "
            f"{result.worst_probe} ({probes[result.worst_probe][:60]!r}); nothing written to {out}"
        )
    if result.max_norm_rel_diff > NORM_RTOL:
        raise ExportError(
            f"{what} export disagrees with simcse-kit: vector norms differ by up to {result.max_norm_rel_diff:.2%} "
            f"(normalisation mismatch?); nothing written to {out}"
        )


def load_backend(
    folder: Path,
    backend: Literal["torch", "onnx", "openvino"] = "torch",
    file_name: str | None = None,
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> Any:
    """``SentenceTransformer`` reading ``folder`` from disk, as a user would (on ``device``;
    with ``trust_remote_code`` as a user of a model with its own code must)."""
    kwargs: dict[str, Any] = {}
    if file_name is not None:
        kwargs["model_kwargs"] = {"file_name": file_name}
    # Explicit: None would let the loader ask y/N on the terminal for a folder's own code.
    return SentenceTransformer(str(folder), device=device, backend=backend, trust_remote_code=trust_remote_code, **kwargs)


def st_encode(st_model: Any) -> TensorEncode:
    """``encode`` for a ``SentenceTransformer``: ``[N, D]`` fp32 CPU tensor."""

    def encode(sentences: Sequence[str]) -> torch.Tensor:
        out = st_model.encode(list(sentences), batch_size=64, convert_to_tensor=True, show_progress_bar=False)
        return out.float().cpu()

    return encode


def encode_speed(encode: TensorEncode, sentences: Sequence[str], repeat_to: int = 256) -> float:
    """Sentences per second of one timed run over ``sentences`` cycled to ``repeat_to``
    (after one warm-up call; the same sentences for every backend)."""
    batch = [sentences[i % len(sentences)] for i in range(max(repeat_to, len(sentences)))]
    encode(batch[:8])
    start = time.perf_counter()
    encode(batch)
    return len(batch) / max(time.perf_counter() - start, 1e-9)


def onnx_encode(folder: Path, file_name: str) -> TensorEncode:
    """``encode`` through :class:`~simcse_kit.export.onnx_encoder.OnnxEncoder` (what deployments run)."""
    encoder = OnnxEncoder(folder, file_name)
    return lambda sentences: torch.from_numpy(encoder.encode(list(sentences), batch_size=64))


@dataclass
class ExportResult:
    """What :func:`~simcse_kit.export.exporter.export_model` wrote and measured.

    Attributes:
        out_dir: The export folder.
        modules: Module summary (``Transformer -> Pooling(mean) -> Normalize``).
        normalize: Whether ``Normalize`` ends the modules; ``normalize_reason`` says why.
        n_probes: Probe sentences the parity checks encoded.
        st_version: The sentence-transformers version that loaded the export here.
        parity: Backend (``torch``, ``onnx``, ``onnx-int8``) -> its parity figures.
        speed: Backend -> encode speed in sentences/s (probe sentences, one run).
        onnx_files: Backend -> file inside the folder (``onnx/model.onnx`` ...).
        sts: ``{"simcse-kit fp32": ..., "onnx-int8": ...}`` primary STS figures (int8 only).
        sts_fp32_from: Where the fp32 figure came from: ``"run record"`` (the kept model's
            recorded STS-B dev) or ``"computed"``.
        onnx: The ONNX export's details (exporter, opset, inputs, per-shape parity), if any.
    """

    out_dir: Path
    modules: str
    normalize: bool
    normalize_reason: str
    n_probes: int
    st_version: str
    parity: dict[str, Parity] = field(default_factory=dict)
    speed: dict[str, float] = field(default_factory=dict)
    onnx_files: dict[str, str] = field(default_factory=dict)
    sts: dict[str, float] = field(default_factory=dict)
    sts_fp32_from: str | None = None
    onnx: OnnxExport | None = None

    @property
    def min_cosine(self) -> float:
        return self.parity["torch"].min_cosine

    @property
    def max_abs_diff(self) -> float:
        return self.parity["torch"].max_abs_diff
