"""Export a simcse-kit model to a sentence-transformers folder, with verified parity.

``SentenceTransformer(out_dir)`` must give the vectors simcse-kit gives, with no
name-based guessing: the pooler and the MLP are read from the model's own
``simcse_config.json`` and written as explicit sentence-transformers modules.

Every SimCSE pooler maps onto *native* sentence-transformers modules, so an export
loads with plain ``sentence-transformers`` (no simcse-kit, no ``trust_remote_code``):

=====================  ==============================================================
simcse-kit pooler       sentence-transformers modules after ``Transformer``
=====================  ==============================================================
``cls``                 ``Pooling("cls")`` (+ ``Dense(H, H, Tanh)`` when ``mlp="always"``)
``cls_before_pooler``   ``Pooling("cls")``
``avg``                 ``Pooling("mean")``
``avg_first_last``      ``WeightedLayerPooling(layer_start=1, weights [1, 0, ..., 0, 1])``
                        + ``Pooling("mean")``
``avg_top2``            ``WeightedLayerPooling(layer_start=L-1, weights [1, 1])``
                        + ``Pooling("mean")``
=====================  ==============================================================

``mlp="train"`` (SimCSE unsupervised) drops the MLP at inference, exactly as
:class:`~simcse_kit.modeling.SimCSEModel` does in ``eval()`` mode. A pooler that has no
such mapping is refused with :class:`ExportError` rather than exported approximately.

The folder is built in a temporary folder beside ``out_dir``, reloaded from disk with
``SentenceTransformer`` and compared with simcse-kit on probe sentences; only if every
cosine is >= :data:`MIN_COSINE` is it renamed to ``out_dir``.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from transformers import AutoTokenizer

from simcse_kit.errors import ConfigError
from simcse_kit.modeling import SIMCSE_CONFIG, Encoder, SimCSEModel, replace_dir

logger = logging.getLogger(__name__)

MIN_COSINE = 0.9999
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


class ExportError(RuntimeError):
    """The export was written but does not reproduce simcse-kit's vectors; nothing was kept."""


@dataclass
class ExportSource:
    """What is being exported: the model folder and, when known, the run around it."""

    model_dir: Path
    meta: dict[str, Any]
    run_dir: Path | None = None
    run_config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


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


def pooling_modules(pooler: str, hidden_size: int, num_layers: int) -> list[nn.Module]:
    """The sentence-transformers modules that follow ``Transformer`` for ``pooler``.

    Args:
        pooler: A simcse-kit pooler name.
        hidden_size: H, the encoder's hidden size.
        num_layers: L, the encoder's number of transformer layers (``hidden_states``
            holds L + 1 tensors: the embeddings, then one per layer).

    Raises:
        ExportError: ``pooler`` has no exact sentence-transformers equivalent.
    """
    from sentence_transformers.sentence_transformer.modules import Pooling, WeightedLayerPooling

    if pooler in ("cls", "cls_before_pooler"):
        # ST's "cls" takes the first *unmasked* token: position 0 with right padding,
        # which is what simcse-kit's tokenizer calls produce.
        return [Pooling(hidden_size, pooling_mode="cls")]
    if pooler == "avg":
        return [Pooling(hidden_size, pooling_mode="mean")]
    if pooler in ("avg_first_last", "avg_top2"):
        if pooler == "avg_first_last":
            # hidden_states[1] (first layer) and hidden_states[L] (last); zero weight between.
            layer_start = 1
            weights = torch.zeros(num_layers)
            weights[0] = weights[-1] = 1.0
        else:
            layer_start = num_layers - 1
            weights = torch.ones(2)
        if num_layers < 2:
            raise ExportError(f"pooler {pooler} needs at least 2 layers; the model has {num_layers}")
        layers = WeightedLayerPooling(
            hidden_size, num_hidden_layers=num_layers, layer_start=layer_start, layer_weights=nn.Parameter(weights)
        )
        return [layers, Pooling(hidden_size, pooling_mode="mean")]
    raise ExportError(f"pooler {pooler!r} has no exact sentence-transformers equivalent; refusing to export an approximation")


def build_sentence_transformer(model: SimCSEModel, model_dir: Path) -> Any:
    """A ``SentenceTransformer`` computing what ``model.eval()`` computes.

    Args:
        model: The loaded simcse-kit model (gives the pooler, MLP weights, max length).
        model_dir: Its folder (the transformer weights and tokenizer are read from it).
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Transformer

    hf_config = model.encoder.config
    needs_layers = model.pooler.needs_hidden_states
    # WeightedLayerPooling reads hidden states only when the saved HF config asks for them.
    config_kwargs = {"output_hidden_states": True} if needs_layers else {}
    transformer = Transformer(
        str(model_dir),
        max_seq_length=model.max_seq_len,
        config_kwargs=config_kwargs,
        model_kwargs={"dtype": torch.float32},
    )
    modules: list[nn.Module] = [transformer]
    modules += pooling_modules(model.pooler.mode, hf_config.hidden_size, hf_config.num_hidden_layers)
    if model.mlp is not None and model.mlp_mode == "always":
        dense = model.mlp.dense
        modules.append(
            Dense(
                dense.in_features,
                dense.out_features,
                bias=True,
                activation_function=nn.Tanh(),
                init_weight=dense.weight.detach().clone(),
                init_bias=dense.bias.detach().clone(),
            )
        )
    return SentenceTransformer(modules=modules, similarity_fn_name="cosine", device="cpu")


def describe_modules(st_model: Any) -> str:
    """``'Transformer -> Pooling(mean)'``-style summary for logs and the card."""
    parts = []
    for module in st_model:
        name = type(module).__name__
        if name == "Pooling":
            name = f"Pooling({module.pooling_mode})"
        elif name == "WeightedLayerPooling":
            name = f"WeightedLayerPooling(layer_start={module.layer_start}, weights={module.layer_weights.tolist()})"
        elif name == "Dense":
            name = f"Dense({module.in_features}->{module.out_features}, {type(module.activation_function).__name__})"
        parts.append(name)
    return " -> ".join(parts)


def parity_cosines(reference: torch.Tensor, exported: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine between two ``[N, D]`` embedding sets: ``[N]`` in fp64."""
    if reference.shape != exported.shape:
        raise ExportError(f"exported model gives shape {tuple(exported.shape)}, simcse-kit {tuple(reference.shape)}")
    return torch.nn.functional.cosine_similarity(reference.double(), exported.double(), dim=-1)


def _hub_id(name: str) -> str | None:
    """A base model name as a hub id for the card's metadata (local paths give None)."""
    from simcse_kit.config import DEFAULT_MODEL

    if name in (DEFAULT_MODEL, "default"):
        return f"sentence-transformers/{DEFAULT_MODEL}"
    if name.count("/") == 1 and not Path(name).exists() and not name.startswith((".", "/")):
        return name
    return None


def model_card(source: ExportSource, modules: str, dim: int, min_cos: float, n_probes: int) -> str:
    """README.md for the export: base model, recipe, data, STS table, usage, parity."""
    from simcse_kit.sts import format_table

    meta, cfg, metrics = source.meta, source.run_config, source.metrics
    model_cfg, data_cfg = cfg.get("model", {}), cfg.get("data", {})
    loss_cfg, train_cfg = cfg.get("loss", {}), cfg.get("train", {})
    base = str(model_cfg.get("name_or_path", meta.get("base_model", "unknown")))
    mode = str(data_cfg.get("mode", meta.get("mode", "unknown")))
    train_file = str(data_cfg.get("train_file", meta.get("train_file", "unknown")))
    hub = _hub_id(base)

    front = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:"]
    front += [f"- {t}" for t in ("sentence-transformers", "sentence-similarity", "feature-extraction", "simcse", "simcse-kit")]
    if hub:
        front.append(f"base_model: {hub}")
    front.append("---")

    mlp_text = {
        "none": "none",
        "train": "used in training only (dropped at inference)",
        "always": "kept at inference (Dense + Tanh)",
    }
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
        f"| modules | {modules} |",
        f"| max sequence length | {meta['max_seq_len']} tokens |",
        f"| embedding dimension | {dim} |",
        "| similarity | cosine (embeddings are not normalised) |",
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
        "",
        "## Export check",
        "",
        f"At export, {n_probes} probe sentences were encoded by simcse-kit and by `SentenceTransformer` loading this folder;",
        f"the lowest cosine between the two was {min_cos:.7f} (the export fails below {MIN_COSINE}).",
        "",
    ]
    return "\n".join(lines)


@dataclass
class ExportResult:
    """What :func:`export_model` wrote and measured."""

    out_dir: Path
    modules: str
    min_cosine: float
    max_abs_diff: float
    n_probes: int


def _check_target(source: ExportSource, out: Path, overwrite: bool) -> None:
    out_r = out.resolve()
    for keep in filter(None, (source.model_dir, source.run_dir)):
        keep_r = keep.resolve()
        if out_r == keep_r or keep_r.is_relative_to(out_r) or out_r.is_relative_to(keep_r):
            raise ConfigError(f"{out}: the export must not replace, contain or sit inside its source {keep}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out}: already exists; choose another folder or pass --overwrite")


def export_model(
    source_path: str | Path,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    probes: Sequence[str] = PROBE_SENTENCES,
    min_cosine: float = MIN_COSINE,
) -> ExportResult:
    """Write a sentence-transformers folder for a simcse-kit run or model, verified.

    Args:
        source_path: A run folder or a simcse-kit model folder.
        out_dir: Where the export goes. Appears only complete and verified.
        overwrite: Replace an existing non-empty ``out_dir`` (atomically, after the check).
        probes: Sentences encoded by both sides for the parity check.
        min_cosine: Every probe's cosine between the two must be at least this.

    Returns:
        The export's folder, module summary and parity figures.

    Raises:
        ConfigError: Bad source or target (nothing is written).
        ExportError: No exact mapping for the pooler, or the reloaded export does not
            reproduce simcse-kit's vectors (the temporary folder is removed).
    """
    from sentence_transformers import SentenceTransformer

    source = find_source(source_path)
    out = Path(out_dir)
    _check_target(source, out, overwrite)
    if not probes:
        raise ConfigError("no probe sentences to check the export with")

    model = SimCSEModel.load(source.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(source.model_dir)
    reference = Encoder(model, tokenizer, model.max_seq_len, "cpu").encode(list(probes))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        st_model = build_sentence_transformer(model, source.model_dir)
        modules = describe_modules(st_model)
        st_model.save(str(tmp), create_model_card=False)
        del st_model

        # Reload from disk: this checks the files users get, not the object we built.
        reloaded = SentenceTransformer(str(tmp), device="cpu")
        if reloaded.max_seq_length != model.max_seq_len:
            raise ExportError(f"exported max_seq_length {reloaded.max_seq_length} != model's {model.max_seq_len}")
        exported = reloaded.encode(list(probes), convert_to_tensor=True, show_progress_bar=False).float().cpu()
        cosines = parity_cosines(reference, exported)
        worst = int(cosines.argmin())
        min_cos = float(cosines[worst])
        max_abs = float((reference - exported).abs().max())
        logger.info("export parity over %d probes: min cosine %.7f, max |diff| %.2e", len(probes), min_cos, max_abs)
        if min_cos < min_cosine:
            raise ExportError(
                f"exported model disagrees with simcse-kit: cosine {min_cos:.6f} < {min_cosine} on probe {worst} "
                f"({probes[worst][:60]!r}); nothing written to {out}"
            )

        dim = int(exported.shape[1])
        (tmp / "README.md").write_text(model_card(source, modules, dim, min_cos, len(probes)), encoding="utf-8")
        info = {
            "source": str(source.run_dir or source.model_dir),
            "pooler": model.pooler.mode,
            "mlp": model.mlp_mode,
            "max_seq_len": model.max_seq_len,
            "modules": modules,
            "parity_min_cosine": min_cos,
            "parity_max_abs_diff": max_abs,
            "parity_probes": len(probes),
            "simcse_meta": source.meta,
        }
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2), encoding="utf-8")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported %s -> %s (%s)", source_path, out, modules)
    return ExportResult(out, modules, min_cos, max_abs, len(probes))
