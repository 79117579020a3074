"""Export a simcse-kit model to a sentence-transformers folder that loads anywhere, verified.

``SentenceTransformer(out_dir)`` must give the vectors simcse-kit gives, with no
name-based guessing: the pooler and the MLP are read from the model's own
``simcse_config.json`` and written as explicit sentence-transformers modules.

**One format for every version.** The folder is written by hand, not by
``SentenceTransformer.save``: sentence-transformers 6 saves 6-only class paths
(``sentence_transformers.base.modules...``) and config keys that 3.x-5.x cannot read
(``embedding_dimension``, ``pooling_mode``, ``module_output_name`` ...). We write what
all-MiniLM-L6-v2 ships and every version from 2.x to 6.x reads (checked against the
loaders of 3.4.1, 4.1.0, 5.1.2 and 6.2.0; ``tests/test_export_compat.py`` loads exports
with each):

* ``modules.json`` types ``sentence_transformers.models.<Class>`` (6.x maps these old
  paths itself, silently);
* ``sentence_bert_config.json`` = ``{"max_seq_length", "do_lower_case"}`` (old loaders pass
  every key to ``Transformer.__init__``, so no other key may appear);
* ``N_Pooling/config.json`` with the boolean ``pooling_mode_*_tokens`` keys and
  ``word_embedding_dimension``; ``N_WeightedLayerPooling`` with ``word_embedding_dimension``,
  ``layer_start``, ``num_hidden_layers`` and ``layer_weights`` in ``model.safetensors``;
  ``N_Dense`` with ``in_features``, ``out_features``, ``bias``, ``activation_function`` and
  ``linear.weight``/``linear.bias``; ``N_Normalize`` (an empty folder);
* the encoder's ``config.json`` with ``output_hidden_states: true`` when a layer-averaging
  pooler needs every layer (how every version hands ``all_layer_embeddings`` on).

=====================  ==============================================================
simcse-kit pooler       modules after ``Transformer``
=====================  ==============================================================
``cls``                 ``Pooling(cls)`` (+ ``Dense(H, H, Tanh)`` when ``mlp="always"``)
``cls_before_pooler``   ``Pooling(cls)``
``avg``                 ``Pooling(mean)``
``avg_first_last``      ``WeightedLayerPooling(layer_start=1, weights [1, 0, ..., 0, 1])``
                        + ``Pooling(mean)``
``avg_top2``            ``WeightedLayerPooling(layer_start=L-1, weights [1, 1])``
                        + ``Pooling(mean)``
=====================  ==============================================================

then ``Normalize`` when the base model ended in one or the model was trained with cosine
similarity (the default; ``normalize=False`` opts out). ``mlp="train"`` drops the MLP at
inference, as :class:`~simcse_kit.modeling.SimCSEModel` does in ``eval()`` mode.

The folder is built inside :func:`~simcse_kit.fileio.atomic_dir`, reloaded from disk with
``SentenceTransformer`` and compared with simcse-kit on probe sentences (cosine and vector
norm, so a missing ``Normalize`` is caught too). With ``onnx=True`` the encoder with its
pooling and normalisation is written as one ONNX graph by :mod:`simcse_kit.onnx_export`
(PyTorch's exporter, no optimum; checked against torch at several shapes) and checked the
same way through :class:`~simcse_kit.onnx_encoder.OnnxEncoder` (onnxruntime + tokenizers);
with ``quantize="int8"`` a dynamic-int8 graph is added and must keep the STS average within
:data:`MAX_INT8_STS_DROP` of simcse-kit's fp32 model. Any failed check leaves nothing at
``out_dir``.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoTokenizer

from simcse_kit.devices import resolve_device
from simcse_kit.errors import ConfigError
from simcse_kit.fileio import atomic_dir, check_writable, folder_contents
from simcse_kit.inference import Encoder
from simcse_kit.model_checks import load_checked_tokenizer, tokenization_problem
from simcse_kit.modeling import SIMCSE_CONFIG, SimCSEModel, resolve_model_path
from simcse_kit.onnx_export import DEFAULT_OPSET, INT8_OPS, OnnxExport, OnnxExportError, write_onnx

logger = logging.getLogger(__name__)

MIN_COSINE = 0.9999
"""Torch export vs simcse-kit: every probe's cosine must reach this."""
MIN_COSINE_ONNX = 0.9999
"""fp32 ONNX export (onnxruntime + tokenizers) vs simcse-kit on the probes."""
NORM_RTOL = 1e-3
"""Relative difference allowed between exported and reference vector norms (cosine is blind
to scale, so this is what catches a missing or extra ``Normalize``)."""
MAX_INT8_STS_DROP = 0.5
"""int8 ONNX: most the STS score (Spearman x 100, primary metric) may fall below fp32 simcse-kit."""
FORMAT_ST_VERSION = "3.0.0"
"""Written as ``__version__.sentence_transformers`` in ``config_sentence_transformers.json``:
the release whose format the folder uses (``similarity_fn_name`` is 3.0's). Loaders read the
field only to warn "created with a newer version, please update", which for this folder would
be false; the versions that really wrote and checked it are in :data:`EXPORT_INFO`."""
ST_CLASS_PREFIX = "sentence_transformers.models."
"""The module class path that sentence-transformers 2.x-6.x all resolve."""
COMPAT_TESTED = ("3.4.1", "4.1.0", "5.1.2")
"""Older sentence-transformers versions that tests/test_export_compat.py loads exports with
(.ci/compat_env.sh installs exactly these), besides the version running the export."""
EXPORT_INFO = "simcse_export.json"
"""Provenance written into the export. Deliberately *not* ``simcse_config.json``: the
export is a plain sentence-transformers folder, so every loader (``simcse-kit evaluate``
included) runs it through ``SentenceTransformer`` and sees exactly what users see."""

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

Encode = Callable[[Sequence[str]], torch.Tensor]
"""``encode(sentences) -> [N, D]`` embeddings."""
STSScorer = Callable[[Encode], Mapping[str, float]]
"""An evaluator such as :class:`~simcse_kit.evaluation.STSEvaluator`: ``encode -> scores``
(its ``primary_metric`` attribute, else ``"avg"``, names the figure the int8 gate reads)."""


class ExportError(RuntimeError):
    """The export was written but failed a check (or cannot be built here); nothing was kept."""


@dataclass
class ExportSource:
    """What is being exported: the model folder and, when known, the run around it."""

    model_dir: Path
    meta: dict[str, Any]
    run_dir: Path | None = None
    run_config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def base_model(self) -> str | None:
        """The ``model.name_or_path`` the run was trained from (run config, else model metadata)."""
        base = self.run_config.get("model", {}).get("name_or_path", self.meta.get("base_model"))
        return None if base is None else str(base)


def find_source(path: str | Path) -> ExportSource:
    """Resolve a run folder (``config.yaml``, ``metrics.json``, ``best_model/``) or a
    simcse-kit model folder (``simcse_config.json``).

    Raises:
        ConfigError: ``path`` is neither (a sentence-transformers or plain HF folder
            records no SimCSE pooler, so there is nothing reliable to export).
    """
    path = Path(path)
    run_dir: Path | None = None
    if (path / "best_model" / SIMCSE_CONFIG).is_file():
        run_dir, model_dir = path, path / "best_model"
    elif (path / SIMCSE_CONFIG).is_file():
        model_dir = path
        # A best_model/ inside a run folder still gets the run's card.
        if path.name == "best_model" and (path.parent / "config.yaml").is_file():
            run_dir = path.parent
    else:
        raise ConfigError(f"{path}: not a simcse-kit run or model folder (no {SIMCSE_CONFIG} there or in best_model/)")
    meta = json.loads((model_dir / SIMCSE_CONFIG).read_text(encoding="utf-8"))
    source = ExportSource(model_dir=model_dir, meta=meta, run_dir=run_dir)
    if run_dir is not None:
        if (run_dir / "config.yaml").is_file():
            source.run_config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
        if (run_dir / "metrics.json").is_file():
            source.metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    return source


# ---- the modules -----------------------------------------------------------------------


@dataclass(frozen=True)
class STModule:
    """One sentence-transformers module after ``Transformer``, as files.

    Attributes:
        kind: The class name; ``modules.json`` says ``sentence_transformers.models.<kind>``
            and the folder is ``<idx>_<kind>``.
        config: Its ``config.json``; None writes none (``Normalize`` reads nothing).
        weights: Its ``model.safetensors`` tensors, if any.
        label: How logs and the model card name it.
    """

    kind: str
    config: dict[str, Any] | None
    weights: dict[str, torch.Tensor] | None = None
    label: str = ""


def pooling(hidden_size: int, mode: str) -> STModule:
    """``Pooling`` with the explicit boolean keys every version reads (``mode``: cls or mean)."""
    config = {
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    return STModule("Pooling", config, label=f"Pooling({mode})")


def pooling_modules(pooler: str, hidden_size: int, num_layers: int) -> list[STModule]:
    """The modules that turn ``Transformer``'s token states into simcse-kit's pooled vector.

    Args:
        pooler: A simcse-kit pooler name.
        hidden_size: H, the encoder's hidden size.
        num_layers: L, the encoder's number of transformer layers (``hidden_states``
            holds L + 1 tensors: the embeddings, then one per layer).

    Raises:
        ExportError: ``pooler`` has no exact sentence-transformers equivalent.
    """
    if pooler in ("cls", "cls_before_pooler"):
        # ST's cls takes token 0: with right padding, which simcse-kit's tokenizer calls produce.
        return [pooling(hidden_size, "cls")]
    if pooler == "avg":
        return [pooling(hidden_size, "mean")]
    if pooler in ("avg_first_last", "avg_top2"):
        if num_layers < 2:
            raise ExportError(f"pooler {pooler} needs at least 2 layers; the model has {num_layers}")
        if pooler == "avg_first_last":
            # hidden_states[1] (first layer) and hidden_states[L] (last); zero weight between.
            layer_start = 1
            weights = torch.zeros(num_layers)
            weights[0] = weights[-1] = 1.0
        else:
            layer_start = num_layers - 1
            weights = torch.ones(2)
        layers = STModule(
            "WeightedLayerPooling",
            {"word_embedding_dimension": hidden_size, "layer_start": layer_start, "num_hidden_layers": num_layers},
            {"layer_weights": weights},
            f"WeightedLayerPooling(layer_start={layer_start}, weights={weights.tolist()})",
        )
        return [layers, pooling(hidden_size, "mean")]
    raise ExportError(f"pooler {pooler!r} has no exact sentence-transformers equivalent; refusing to export an approximation")


def dense_module(linear: torch.nn.Linear) -> STModule:
    """SimCSE's MLP (Linear + Tanh) as ``Dense``."""
    config = {
        "in_features": linear.in_features,
        "out_features": linear.out_features,
        "bias": True,
        "activation_function": "torch.nn.modules.activation.Tanh",
    }
    weights = {"linear.weight": linear.weight.detach().float(), "linear.bias": linear.bias.detach().float()}
    return STModule("Dense", config, weights, f"Dense({linear.in_features}->{linear.out_features}, Tanh)")


NORMALIZE = STModule("Normalize", None, label="Normalize")


def export_modules(model: SimCSEModel, normalize: bool) -> list[STModule]:
    """Everything after ``Transformer`` for ``model`` in ``eval()`` mode."""
    cfg = model.encoder.config
    modules = pooling_modules(model.pooler.mode, cfg.hidden_size, cfg.num_hidden_layers)
    if model.mlp is not None and model.mlp_mode == "always":
        modules.append(dense_module(model.mlp.dense))
    if normalize:
        modules.append(NORMALIZE)
    return modules


def describe_modules(modules: Sequence[STModule]) -> str:
    """``'Transformer -> Pooling(mean) -> Normalize'``-style summary for logs and the card."""
    return " -> ".join(["Transformer", *(m.label or m.kind for m in modules)])


def base_has_normalize(base: str | None) -> bool | None:
    """Whether the base model is a sentence-transformers folder ending in ``Normalize``;
    None when that cannot be told (no base recorded, a hub id not on disk, a plain HF folder)."""
    if base is None:
        return None
    modules_json = Path(resolve_model_path(base)) / "modules.json"
    if not modules_json.is_file():
        return None
    entries = json.loads(modules_json.read_text(encoding="utf-8"))
    return any(str(e.get("type", "")).rsplit(".", 1)[-1] == "Normalize" for e in entries)


def decide_normalize(source: ExportSource, requested: bool | None) -> tuple[bool, str]:
    """``(normalize, why)``: an explicit request wins; else keep the base model's
    ``Normalize``, else add it when the model was trained with cosine similarity."""
    if requested is not None:
        return requested, "requested" if requested else "turned off (--no-normalize)"
    if base_has_normalize(source.base_model):
        return True, f"kept from the base model {source.base_model}"
    if source.meta.get("similarity", "cosine") == "cosine":
        return True, "trained with cosine similarity"
    return False, f"trained with {source.meta.get('similarity')} similarity"


# ---- writing ---------------------------------------------------------------------------


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def write_folder(
    model: SimCSEModel,
    tokenizer: Any,
    modules: Sequence[STModule],
    folder: Path,
    prompts: dict[str, str] | None = None,
    truncate_dim: int | None = None,
) -> None:
    """Write the version-neutral sentence-transformers folder (see the module docstring).

    Args:
        model: The fp32 simcse-kit model (its encoder becomes the root ``Transformer``).
        tokenizer: Its tokenizer; saved with ``model_max_length = model.max_seq_len``.
        modules: What follows ``Transformer`` (:func:`export_modules`).
        folder: An empty folder.
        prompts: The model's prompts by name (``query``, ``document``): ``prompt_name=``
            in sentence-transformers' ``encode``.
        truncate_dim: Written as sentence-transformers' ``truncate_dim`` (>= 3.0 loads
            the model with that many dimensions; older versions ignore it).
    """
    import transformers

    model.encoder.save_pretrained(folder, safe_serialization=True)
    if model.pooler.needs_hidden_states:
        # Every version's Transformer module hands all layers on (all_layer_embeddings)
        # exactly when the HF config asks the model for them.
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config["output_hidden_states"] = True
        _write_json(folder / "config.json", config)
    tokenizer.model_max_length = model.max_seq_len
    tokenizer.save_pretrained(folder)
    _write_json(folder / "sentence_bert_config.json", {"max_seq_length": model.max_seq_len, "do_lower_case": False})

    entries = [{"idx": 0, "name": "0", "path": "", "type": ST_CLASS_PREFIX + "Transformer"}]
    for idx, module in enumerate(modules, start=1):
        sub = f"{idx}_{module.kind}"
        (folder / sub).mkdir()
        if module.config is not None:
            _write_json(folder / sub / "config.json", module.config)
        if module.weights:
            save_file({k: v.contiguous().cpu() for k, v in module.weights.items()}, str(folder / sub / "model.safetensors"))
        entries.append({"idx": idx, "name": str(idx), "path": sub, "type": ST_CLASS_PREFIX + module.kind})
    _write_json(folder / "modules.json", entries)
    # No 6.x-only keys (model_type): old loaders ignore them today, but nothing obliges them to.
    _write_json(
        folder / "config_sentence_transformers.json",
        {
            "__version__": {
                "sentence_transformers": FORMAT_ST_VERSION,
                "transformers": transformers.__version__,
                "pytorch": torch.__version__,
            },
            "prompts": dict(prompts or {}),
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        }
        | ({"truncate_dim": truncate_dim} if truncate_dim is not None else {}),
    )


# ---- checking --------------------------------------------------------------------------


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


def load_backend(folder: Path, backend: str = "torch", file_name: str | None = None, device: str = "cpu") -> Any:
    """``SentenceTransformer`` reading ``folder`` from disk, as a user would (on ``device``)."""
    from sentence_transformers import SentenceTransformer

    kwargs: dict[str, Any] = {}
    if file_name is not None:
        kwargs["model_kwargs"] = {"file_name": file_name}
    return SentenceTransformer(str(folder), device=device, backend=backend, **kwargs)


def st_encode(st_model: Any) -> Encode:
    """``encode`` for a ``SentenceTransformer``: ``[N, D]`` fp32 CPU tensor."""

    def encode(sentences: Sequence[str]) -> torch.Tensor:
        out = st_model.encode(list(sentences), batch_size=64, convert_to_tensor=True, show_progress_bar=False)
        return out.float().cpu()

    return encode


def encode_speed(encode: Encode, sentences: Sequence[str], repeat_to: int = 256) -> float:
    """Sentences per second of one timed run over ``sentences`` cycled to ``repeat_to``
    (after one warm-up call; the same sentences for every backend)."""
    batch = [sentences[i % len(sentences)] for i in range(max(repeat_to, len(sentences)))]
    encode(batch[:8])
    start = time.perf_counter()
    encode(batch)
    return len(batch) / max(time.perf_counter() - start, 1e-9)


def require_onnx() -> None:
    """Raise :class:`ExportError` (before anything is written) when the ONNX exporter or
    onnxruntime cannot run here."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter)
        import tokenizers  # noqa: F401  (the OnnxEncoder the export is checked with)
    except ImportError as exc:
        raise ExportError(f"--onnx needs onnx, onnxruntime and onnxscript ({exc}); `pip install 'simcse-kit[onnx]'`") from None


def onnx_encode(folder: Path, file_name: str) -> Encode:
    """``encode`` through :class:`~simcse_kit.onnx_encoder.OnnxEncoder` (what deployments run)."""
    from simcse_kit.onnx_encoder import OnnxEncoder

    encoder = OnnxEncoder(folder, file_name)
    return lambda sentences: torch.from_numpy(encoder.encode(list(sentences), batch_size=64))


def sts_score(evaluator: STSScorer, encode: Encode) -> tuple[float, dict[str, float]]:
    """``(primary figure, all figures)`` of ``evaluator`` on ``encode``."""
    scores = dict(evaluator(encode))
    key = getattr(evaluator, "primary_metric", "avg")
    return float(scores[key]), scores


# ---- the card --------------------------------------------------------------------------


def _hub_id(name: str) -> str | None:
    """A base model name as a hub id for the card's metadata (local paths give None)."""
    from simcse_kit.config import DEFAULT_MODEL

    if name in (DEFAULT_MODEL, "default"):
        return f"sentence-transformers/{DEFAULT_MODEL}"
    if name.count("/") == 1 and not Path(name).exists() and not name.startswith((".", "/")):
        return name
    return None


@dataclass
class ExportResult:
    """What :func:`export_model` wrote and measured.

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
    onnx: OnnxExport | None = None

    @property
    def min_cosine(self) -> float:
        return self.parity["torch"].min_cosine

    @property
    def max_abs_diff(self) -> float:
        return self.parity["torch"].max_abs_diff


def model_card(source: ExportSource, result: ExportResult, dim: int) -> str:
    """README.md for the export: base model, recipe, data, STS table, usage, checks."""
    from simcse_kit.evaluation import format_table

    meta, cfg, metrics = source.meta, source.run_config, source.metrics
    model_cfg, data_cfg = cfg.get("model", {}), cfg.get("data", {})
    loss_cfg, train_cfg = cfg.get("loss", {}), cfg.get("train", {})
    base = source.base_model or "unknown"
    mode = str(data_cfg.get("mode", meta.get("mode", "unknown")))
    train_file = str(data_cfg.get("train_file", meta.get("train_file", "unknown")))
    hub = _hub_id(base)

    front = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:"]
    front += [f"- {t}" for t in ("sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", "simcse-kit")]
    if result.onnx_files:
        front.append("- onnx")
    if hub:
        front.append(f"base_model: {hub}")
    front.append("---")

    mlp_text = {
        "none": "none",
        "train": "used in training only (dropped at inference)",
        "always": "kept at inference (Dense + Tanh)",
    }
    similarity = (
        f"cosine; embeddings are L2-normalised (`Normalize`: {result.normalize_reason}), so dot product = cosine"
        if result.normalize
        else f"cosine (embeddings are not normalised: {result.normalize_reason})"
    )
    lines = [
        *front,
        "",
        f"# SimCSE ({mode}) on {base}" if "unknown" not in (mode, base) else "# SimCSE sentence embeddings",
        "",
        f"A sentence-embedding model trained with simcse-kit ({mode} SimCSE) from `{base}`,",
        "exported to sentence-transformers. It maps sentences to "
        f"{dim}-dimensional vectors; compare them with cosine similarity.",
        "",
        "## Model",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{base}` |",
        f"| pooler (simcse-kit) | `{meta['pooler']}` |",
        f"| MLP head | {mlp_text.get(str(meta.get('mlp')), meta.get('mlp'))} |",
        f"| modules | {result.modules} |",
        f"| normalize | {'yes' if result.normalize else 'no'} ({result.normalize_reason}) |",
        f"| max sequence length | {meta['max_seq_len']} tokens |",
        f"| embedding dimension | {dim} |",
        f"| similarity | {similarity} |",
        f"| backends | {', '.join(['torch', *result.onnx_files])} |",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| objective | {mode} SimCSE |",
        f"| training data | `{train_file}`"
        + (f" (first {data_cfg['max_train_samples']} examples)" if data_cfg.get("max_train_samples") else "")
        + " |",
    ]
    for label, value in (
        ("temperature", loss_cfg.get("temperature")),
        ("batch size", train_cfg.get("batch_size")),
        ("learning rate", train_cfg.get("learning_rate")),
        ("epochs", train_cfg.get("num_epochs")),
        ("max steps", train_cfg.get("max_steps")),
        ("training max length", model_cfg.get("max_seq_len")),
        ("seed", train_cfg.get("seed")),
        ("steps run", metrics.get("steps")),
        ("best step (STS-B dev)", metrics.get("best_step", meta.get("step"))),
    ):
        if value is not None:
            lines.append(f"| {label} | {value} |")
    dev = metrics.get("best_stsb_dev", meta.get("stsb_dev"))
    if dev is not None:
        lines.append(f"| best STS-B dev Spearman x 100 | {float(dev):.2f} |")
    if cfg:
        lines += [
            "",
            "Full recipe (the run's resolved `config.yaml`):",
            "",
            "```yaml",
            yaml.safe_dump(cfg, sort_keys=False).rstrip(),
            "```",
        ]

    lines += ["", "## Evaluation", ""]
    sts = metrics.get("sts")
    if sts:
        lines += [
            "Spearman correlation x 100 between cosine similarity and gold scores (SimCSE protocol:",
            "STS12-16 'all', STS-B test, SICK-R test), measured by simcse-kit at the end of the run:",
            "",
            "```",
            format_table(sts),
            "```",
        ]
    else:
        lines.append("No STS table: no finished run (`metrics.json`) was found beside this model.")

    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        'model = SentenceTransformer("path/to/this/folder")',
        'embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])',
        "print(model.similarity(embeddings, embeddings))",
        "```",
    ]
    if "onnx" in result.onnx_files:
        lines += [
            "",
            "ONNX (CPU): the graph holds the encoder, pooling"
            + (" and normalisation" if result.normalize else "")
            + " (output `sentence_embedding`) and runs with `pip install onnxruntime tokenizers numpy` and simcse-kit's "
            "one-file `simcse_kit/onnx_encoder.py` (no torch, no transformers):",
            "",
            "```python",
            "from simcse_kit.onnx_encoder import OnnxEncoder",
            "",
            f'encoder = OnnxEncoder("path/to/this/folder", "{result.onnx_files["onnx"]}")',
        ]
        if "onnx-int8" in result.onnx_files:
            lines.append(f'encoder = OnnxEncoder("path/to/this/folder", "{result.onnx_files["onnx-int8"]}")  # int8')
        lines += ['embeddings = encoder.encode(["A man is playing a guitar."])  # numpy [N, D]', "```"]
        if result.onnx is not None and "last_hidden_state" in result.onnx.outputs:
            lines += [
                "",
                "sentence-transformers' own ONNX backend (it needs optimum-onnx, which today requires transformers < 4.58) "
                "reads the graph's `last_hidden_state` and applies this folder's modules:",
                "",
                "```python",
                f'model = SentenceTransformer("path/to/this/folder", backend="onnx", '
                f'model_kwargs={{"file_name": "{result.onnx_files["onnx"]}"}})',
                "```",
            ]

    compat = ", ".join(dict.fromkeys([*COMPAT_TESTED, result.st_version]))
    lines += [
        "",
        "## Export checks",
        "",
        f"The folder uses the format every sentence-transformers release from 3.x to 6.x reads (class paths "
        f"`{ST_CLASS_PREFIX}*`); simcse-kit's tests load its exports with sentence-transformers {compat} and "
        "compare the embeddings.",
        "",
        f"At export, {result.n_probes} probe sentences were encoded by simcse-kit (fp32"
        + (", normalised" if result.normalize else "")
        + f") and by sentence-transformers {result.st_version} loading this folder:",
        "",
        "| backend | file | lowest cosine | largest norm difference | required | encode speed (sentences/s) |",
        "|---|---|---|---|---|---|",
    ]
    required = {"torch": f"cosine >= {MIN_COSINE}", "onnx": f"cosine >= {MIN_COSINE_ONNX}"}
    required["onnx-int8"] = f"STS within {MAX_INT8_STS_DROP} of fp32"
    files = {"torch": "model.safetensors", **result.onnx_files}
    for backend, par in result.parity.items():
        lines.append(
            f"| {backend} | `{files[backend]}` | {par.min_cosine:.7f} | {par.max_norm_rel_diff:.1e} | {required[backend]} "
            f"| {result.speed.get(backend, float('nan')):.0f} |"
        )
    lines += [
        "",
        f"Speeds: one run over the probe sentences cycled to 256 (one of them {meta['max_seq_len']} tokens long), "
        f"on the exporting machine ({platform.machine()}, {torch.get_num_threads()} threads).",
    ]
    if result.sts:
        ref, q = result.sts["simcse-kit fp32"], result.sts["onnx-int8"]
        lines += [
            "",
            f"int8 cost: STS {q:.2f} (int8 ONNX) vs {ref:.2f} (simcse-kit fp32), a change of {q - ref:+.2f} "
            f"(the export fails past -{MAX_INT8_STS_DROP}).",
        ]
    lines.append("")
    return "\n".join(lines)


# ---- the export ------------------------------------------------------------------------


def _check_target(source: ExportSource, out: Path, overwrite: bool) -> None:
    out_r = out.resolve()
    for keep in filter(None, (source.model_dir, source.run_dir)):
        keep_r = keep.resolve()
        if out_r == keep_r or keep_r.is_relative_to(out_r) or out_r.is_relative_to(keep_r):
            raise ConfigError(f"{out}: the export must not replace, contain or sit inside its source {keep}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder")
    check_writable(out, "export folder")  # the export is built beside it, then renamed into place
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out}: already exists; choose another folder or pass --overwrite")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_INFO).is_file():
        # --overwrite replaces a whole folder: only one we wrote (an earlier export) or an empty one.
        raise ConfigError(
            f"{out}: --overwrite replaces only an earlier export (with {EXPORT_INFO}) or an empty folder; "
            f"this one holds {', '.join(folder_contents(out))}: choose another folder"
        )


def _add_onnx(model: SimCSEModel, tokenizer: Any, folder: Path, normalize: bool, quantize: str | None, opset: int) -> OnnxExport:
    """Write ``onnx/model.onnx`` (and ``onnx/model_qint8.onnx``) with :mod:`simcse_kit.onnx_export`."""
    try:
        return write_onnx(model, tokenizer, folder, normalize=normalize, opset=opset, quantize=quantize)
    except OnnxExportError as exc:
        raise ExportError(str(exc)) from None


def _onnx_info(done: OnnxExport | None) -> dict[str, Any] | None:
    if done is None:
        return None
    keys = ("exporter", "opset", "inputs", "outputs", "shape_parity", "tried")
    return {k: getattr(done, k) for k in keys}


def _quant_info() -> dict[str, Any]:
    return {
        "type": "dynamic int8",
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "weights": "QInt8, per channel",
        "ops": list(INT8_OPS),
    }


def hub_upload(folder: Path, repo_id: str) -> str:
    """Create (if needed) the hub model repo ``repo_id`` and upload ``folder``; returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model", commit_message="simcse-kit export")
    return f"https://huggingface.co/{repo_id}"


def export_model(
    source_path: str | Path,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    normalize: bool | None = None,
    onnx: bool = False,
    quantize: str | None = None,
    sts_evaluator: STSScorer | None = None,
    data_dir: str | Path = "../shared/data/senteval",
    push_to_hub: str | None = None,
    probes: Sequence[str] = PROBE_SENTENCES,
    min_cosine: float = MIN_COSINE,
    device: str = "auto",
    opset: int = DEFAULT_OPSET,
    truncate_dim: int | None = None,
) -> ExportResult:
    """Write a sentence-transformers folder for a simcse-kit run or model, verified.

    Args:
        source_path: A run folder or a simcse-kit model folder.
        out_dir: Where the export goes. Appears only complete and verified.
        overwrite: Replace an existing non-empty ``out_dir`` (atomically, after the checks)
            if it is an earlier export (holds ``simcse_export.json``); any other folder is refused.
        normalize: End with ``Normalize``; None decides (:func:`decide_normalize`).
        onnx: Also write ``onnx/model.onnx`` (encoder + pooling + normalisation, one graph)
            and check it (cosine >= :data:`MIN_COSINE_ONNX`, with onnxruntime + tokenizers).
        quantize: ``"int8"``: also write a dynamic-int8 ONNX model (implies ``onnx``) and
            require its STS within :data:`MAX_INT8_STS_DROP` of simcse-kit fp32.
        sts_evaluator: What the int8 gate scores with (``encode -> scores``); default the
            7-task :class:`~simcse_kit.evaluation.STSEvaluator` on ``data_dir``.
        data_dir: SentEval-layout folder for the default evaluator.
        push_to_hub: Upload the finished folder to this hub repo id.
        probes: Sentences encoded by both sides for the parity checks.
        min_cosine: Every probe's cosine (torch backend) must be at least this.
        device: Where the torch parity check encodes, both sides (``auto``: CUDA, else
            MPS, else CPU; :func:`simcse_kit.devices.resolve_device`); ONNX runs on the CPU.
        opset: ONNX opset of the graphs.
        truncate_dim: sentence-transformers loads the export with this many dimensions
            (a Matryoshka model); parity is checked on that prefix.

    Raises:
        ConfigError: Bad source, target or option (nothing is written).
        ExportError: No exact mapping for the pooler, no working ONNX stack, or a failed
            check (the temporary folder is removed; an existing ``out_dir`` is untouched).
    """
    import sentence_transformers
    import transformers

    if quantize not in (None, "int8"):
        raise ConfigError(f"--quantize {quantize!r}: only 'int8' is supported")
    onnx = onnx or quantize is not None
    source = find_source(source_path)
    out = Path(out_dir)
    _check_target(source, out, overwrite)
    if not probes:
        raise ConfigError("no probe sentences to check the export with")
    if onnx:
        require_onnx()
    evaluator = sts_evaluator
    if quantize and evaluator is None:
        from simcse_kit.evaluation import STSEvaluator

        evaluator = STSEvaluator(data_dir)  # read (and checked) before any model work

    use_norm, why = decide_normalize(source, normalize)
    where = resolve_device(device)
    model = SimCSEModel.load(source.model_dir).float().eval()
    tokenizer = load_checked_tokenizer(source.model_dir, model.encoder.config.vocab_size)
    ours = Encoder(model, tokenizer, model.max_seq_len, where)
    reference = ours.encode(list(probes))
    if use_norm:
        reference = torch.nn.functional.normalize(reference, dim=-1)
    if truncate_dim is not None:  # sentence-transformers truncates after its Normalize
        if not 1 <= truncate_dim <= reference.shape[1]:
            raise ConfigError(f"--truncate-dim {truncate_dim}: must lie in 1..{reference.shape[1]} (the embedding size)")
        reference = reference[:, :truncate_dim]
    modules = export_modules(model, use_norm)
    summary = describe_modules(modules)
    result = ExportResult(out, summary, use_norm, why, len(probes), sentence_transformers.__version__)

    with atomic_dir(out) as tmp:
        prompts = source.meta.get("prompts")
        write_folder(model, AutoTokenizer.from_pretrained(source.model_dir), modules, tmp, prompts, truncate_dim)
        # Reload from disk: this checks the files users get, not an object we built.
        reloaded = load_backend(tmp, device=str(where))
        # Parity below encodes both sides with copies of one tokenizer: compare the ids of an
        # independent load of the exported one with the source's, and their [UNK] share.
        problem = tokenization_problem(tokenizer, AutoTokenizer.from_pretrained(tmp), list(probes), model.max_seq_len)
        if problem:
            raise ExportError(f"{problem}; nothing written to {out}")
        if reloaded.max_seq_length != model.max_seq_len:
            raise ExportError(f"exported max_seq_length {reloaded.max_seq_length} != model's {model.max_seq_len}")
        encode = st_encode(reloaded)
        exported = encode(probes)
        result.parity["torch"] = parity(reference, exported)
        check_parity("torch", result.parity["torch"], min_cosine, probes, out)
        result.speed["torch"] = encode_speed(encode, probes)

        if onnx:
            result.onnx = _add_onnx(model, tokenizer, tmp, use_norm, quantize, opset)
            result.onnx_files = dict(result.onnx.files)
            fp32_encode = onnx_encode(tmp, result.onnx_files["onnx"])
            result.parity["onnx"] = parity(reference, fp32_encode(probes))
            check_parity("onnx", result.parity["onnx"], MIN_COSINE_ONNX, probes, out)
            result.speed["onnx"] = encode_speed(fp32_encode, probes)
        if quantize:
            assert evaluator is not None
            q_encode = onnx_encode(tmp, result.onnx_files["onnx-int8"])
            result.parity["onnx-int8"] = parity(reference, q_encode(probes))
            result.speed["onnx-int8"] = encode_speed(q_encode, probes)
            ref_sts, _ = sts_score(evaluator, ours.encode)
            q_sts, _ = sts_score(evaluator, q_encode)
            result.sts = {"simcse-kit fp32": ref_sts, "onnx-int8": q_sts}
            logger.info("int8 STS %.2f vs fp32 %.2f (%+.2f)", q_sts, ref_sts, q_sts - ref_sts)
            if ref_sts - q_sts > MAX_INT8_STS_DROP:
                raise ExportError(
                    f"int8 ONNX loses {ref_sts - q_sts:.2f} STS points (fp32 {ref_sts:.2f}, int8 {q_sts:.2f}; "
                    f"allowed {MAX_INT8_STS_DROP}); nothing written to {out}"
                )

        dim = int(exported.shape[1])
        (tmp / "README.md").write_text(model_card(source, result, dim), encoding="utf-8")
        info = {
            "source": str(source.run_dir or source.model_dir),
            "base_model": source.base_model,
            "pooler": model.pooler.mode,
            "mlp": model.mlp_mode,
            "max_seq_len": model.max_seq_len,
            "modules": summary,
            "normalize": use_norm,
            "normalize_reason": why,
            "truncate_dim": truncate_dim,
            "backends": {"torch": "model.safetensors", **result.onnx_files},
            "onnx": _onnx_info(result.onnx),
            "quantization": _quant_info() if quantize else None,
            "parity": {k: vars(v) for k, v in result.parity.items()},
            "parity_min_cosine": result.min_cosine,
            "parity_max_abs_diff": result.max_abs_diff,
            "parity_probes": len(probes),
            "encode_speed_sentences_per_s": result.speed,
            "sts": result.sts,
            "sentence_transformers_checked": result.st_version,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "sentence_transformers_compat_tested": list(COMPAT_TESTED),
            "simcse_meta": source.meta,
        }
        _write_json(tmp / EXPORT_INFO, info)
        # Encoders keep the files open on some platforms; let go before the rename.
        del reloaded
    logger.info("exported %s -> %s (%s)", source_path, out, summary)
    if push_to_hub:
        logger.info("uploaded to %s", hub_upload(out, push_to_hub))
    return result


__all__ = [
    "COMPAT_TESTED",
    "EXPORT_INFO",
    "ExportError",
    "ExportResult",
    "ExportSource",
    "Parity",
    "STModule",
    "decide_normalize",
    "export_model",
    "export_modules",
    "find_source",
    "hub_upload",
    "pooling_modules",
    "write_folder",
]
