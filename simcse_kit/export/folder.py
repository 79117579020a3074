"""The sentence-transformers folder: simcse-kit's pooler and MLP as explicit modules, written
in the one format every sentence-transformers version reads.

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
  pooler needs every layer (how every version hands ``all_layer_embeddings`` on);
* ONE truncation length, the model's ``max_seq_len``, wherever a loader may read one
  (:func:`align_truncation`): ``sentence_bert_config.json`` ``max_seq_length``,
  ``tokenizer_config.json`` ``model_max_length`` and ``max_length``, ``tokenizer.json``'s
  ``truncation``. Base models such as all-MiniLM-L6-v2 ship a ``tokenizer.json`` truncating
  at 128, which transformers 5 saves on as ``"max_length": 128`` beside ``model_max_length``;
  fastembed takes the smaller of the two and would cut every text at 128 tokens.

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
inference, as :class:`~simcse_kit.model.modeling.SimCSEModel` does in ``eval()`` mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file

from simcse_kit.export.source import ExportError, ExportSource
from simcse_kit.model.modeling import SimCSEModel, resolve_model_path

FORMAT_ST_VERSION = "3.0.0"
"""Written as ``__version__.sentence_transformers`` in ``config_sentence_transformers.json``:
the release whose format the folder uses (``similarity_fn_name`` is 3.0's). Loaders read the
field only to warn "created with a newer version, please update", which for this folder would
be false; the versions that really wrote and checked it are in
:data:`~simcse_kit.export.source.EXPORT_INFO`."""
ST_CLASS_PREFIX = "sentence_transformers.models."
"""The module class path that sentence-transformers 2.x-6.x all resolve."""
COMPAT_TESTED = ("3.4.1", "4.1.0", "5.1.2")
"""Older sentence-transformers versions that tests/test_export_compat.py loads exports with
(.ci/compat_env.sh installs exactly these), besides the version running the export."""


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
    """``Pooling`` with the explicit boolean keys every version reads (``mode``: cls, mean
    or lasttoken)."""
    config = {
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    if mode == "lasttoken":  # written only where used: a key older versions do not know stays out of their way
        config["pooling_mode_lasttoken"] = True
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
    if pooler == "last":
        # ST's lasttoken reads the last real token by the attention mask, either padding side.
        return [pooling(hidden_size, "lasttoken")]
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


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def align_truncation(folder: Path, max_len: int) -> None:
    """Make every truncation length the saved tokenizer files hold ``max_len``.

    ``tokenizer_config.json``: ``model_max_length`` and, where present, ``max_length`` (the
    smaller of the two is what fastembed truncates at). ``tokenizer.json``: its
    ``truncation`` length, where one is set (what ``tokenizers.Tokenizer.from_file`` users
    get), and a ``Fixed`` padding length, which would pad short texts and leave longer ones
    ragged, becomes batch-longest padding (the attention mask makes the vectors the same).
    """
    from tokenizers import Tokenizer  # transformers' own dependency

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["model_max_length"] = max_len
    if "max_length" in config:
        config["max_length"] = max_len
    write_json(config_path, config)
    tok_path = folder / "tokenizer.json"
    if not tok_path.is_file():  # a slow-only tokenizer: nothing else holds a length
        return
    tok = Tokenizer.from_file(str(tok_path))
    trunc, pad = tok.truncation, tok.padding
    if trunc is None and (pad is None or pad.get("length") is None):
        return
    if trunc is not None:
        tok.enable_truncation(max_len, stride=trunc["stride"], strategy=trunc["strategy"], direction=trunc["direction"])
    if pad is not None and pad.get("length") is not None:
        pad = {k: v for k, v in pad.items() if k != "length"}
        tok.enable_padding(**pad)
    tok.save(str(tok_path))


def truncation_lengths(folder: Path) -> dict[str, int]:
    """Every truncation length the folder's files hold, by ``file:key`` (the ones set)."""
    found: dict[str, int] = {}
    st = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8"))
    found["sentence_bert_config.json:max_seq_length"] = int(st["max_seq_length"])
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for key in ("model_max_length", "max_length"):
        if isinstance(config.get(key), int):
            found[f"tokenizer_config.json:{key}"] = int(config[key])
    if (folder / "tokenizer.json").is_file():
        tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        if tok.get("truncation"):
            found["tokenizer.json:truncation.max_length"] = int(tok["truncation"]["max_length"])
    return found


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
        tokenizer: Its tokenizer; saved truncating at ``model.max_seq_len`` everywhere
            (:func:`align_truncation`).
        modules: What follows ``Transformer`` (:func:`export_modules`).
        folder: An empty folder.
        prompts: The model's prompts by name (``query``, ``document``): ``prompt_name=``
            in sentence-transformers' ``encode``.
        truncate_dim: Written as sentence-transformers' ``truncate_dim`` (>= 3.0 loads
            the model with that many dimensions; older versions ignore it).
    """
    model.encoder.save_pretrained(folder, safe_serialization=True)
    if model.pooler.needs_hidden_states:
        # Every version's Transformer module hands all layers on (all_layer_embeddings)
        # exactly when the HF config asks the model for them.
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config["output_hidden_states"] = True
        write_json(folder / "config.json", config)
    tokenizer.model_max_length = model.max_seq_len
    if model.pooler.mode == "last":
        # Transformers.js' last_token pooling reads the last column, the last real token only
        # under left padding (sentence-transformers, fastembed and simcse-kit find it by the
        # mask, either side); Qwen3-Embedding's tokenizer pads left too.
        tokenizer.padding_side = "left"
    tokenizer.save_pretrained(folder)
    align_truncation(folder, model.max_seq_len)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": model.max_seq_len, "do_lower_case": False})

    entries = [{"idx": 0, "name": "0", "path": "", "type": ST_CLASS_PREFIX + "Transformer"}]
    for idx, module in enumerate(modules, start=1):
        sub = f"{idx}_{module.kind}"
        (folder / sub).mkdir()
        if module.config is not None:
            write_json(folder / sub / "config.json", module.config)
        if module.weights:
            save_file({k: v.contiguous().cpu() for k, v in module.weights.items()}, str(folder / sub / "model.safetensors"))
        entries.append({"idx": idx, "name": str(idx), "path": sub, "type": ST_CLASS_PREFIX + module.kind})
    write_json(folder / "modules.json", entries)
    # No 6.x-only keys (model_type): old loaders ignore them today, but nothing obliges them to.
    write_json(
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
