"""The export's model card (``README.md``), rendered from the template file shipped beside
this module (``model_card.md``).

The template holds every word of the card; this module only computes the values. It is
split into sections, each starting with a line ``%% name``: ``card`` is the card, the others
are the optional parts and repeated rows it may include. Placeholders are
:class:`string.Template`'s (``$name``). A placeholder alone on its line stands for a block of
whole lines: its value is a rendered section (or lines) to put there, or None to drop the
line.
"""

from __future__ import annotations

import platform
from importlib.resources import files
from pathlib import Path
from string import Template

import torch
import yaml

from simcse_kit.config.run import DEFAULT_MODEL, files_label
from simcse_kit.evaluation.contamination import format_marked_table
from simcse_kit.export.folder import COMPAT_TESTED, ST_CLASS_PREFIX
from simcse_kit.export.source import ExportSource
from simcse_kit.export.sts_gate import MAX_INT8_STS_DROP
from simcse_kit.export.verify import MIN_COSINE, MIN_COSINE_ONNX, ExportResult
from simcse_kit.training.engine.selection import dev_selection

TEMPLATE = "model_card.md"
SECTION = "%% "
DROP = "\0"  # a block placeholder whose value is None: its line is removed after substitution

MLP_TEXT = {
    "none": "none",
    "train": "used in training only (dropped at inference)",
    "always": "kept at inference (Dense + Tanh)",
}


def read_sections(text: str) -> dict[str, str]:
    """Template text -> ``{section name: its lines joined by newlines}``."""
    sections: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in text.removesuffix("\n").split("\n"):
        if line.startswith(SECTION):
            lines = sections.setdefault(line[len(SECTION) :].strip(), [])
        else:
            lines.append(line)
    return {name: "\n".join(body) for name, body in sections.items()}


SECTIONS = read_sections(files("simcse_kit.export").joinpath(TEMPLATE).read_text(encoding="utf-8"))


def fill(section: str, **values: object) -> str:
    """``section`` with its placeholders substituted (see the module docstring).

    Raises:
        KeyError: The template names a placeholder that ``values`` lacks.
        ValueError: A None value stands inside a line rather than alone on it.
    """
    text = Template(SECTIONS[section]).substitute({k: DROP if v is None else v for k, v in values.items()})
    text = "\n".join(line for line in text.split("\n") if line != DROP)
    if DROP in text:
        raise ValueError(f"{TEMPLATE}, section {section!r}: a None value must stand alone on its line")
    return text


def hub_id(name: str) -> str | None:
    """A base model name as a hub id for the card's metadata (local paths give None)."""
    if name in (DEFAULT_MODEL, "default"):
        return f"sentence-transformers/{DEFAULT_MODEL}"
    if name.count("/") == 1 and not Path(name).exists() and not name.startswith((".", "/")):
        return name
    return None


def training_rows(source: ExportSource) -> str:
    """The training table's rows after ``objective`` and ``training data``: what is known."""
    cfg, metrics, meta = source.run_config, source.metrics, source.meta
    dev = dev_selection(metrics, meta, cfg.get("data"))  # what picked the best model (older folders: from the config)
    loss_cfg, train_cfg = cfg.get("loss", {}), cfg.get("train", {})
    rows = [
        ("temperature", loss_cfg.get("temperature")),
        ("batch size", train_cfg.get("batch_size")),
        ("learning rate", train_cfg.get("learning_rate")),
        ("epochs", train_cfg.get("num_epochs")),
        ("max steps", train_cfg.get("max_steps")),
        ("training max length", cfg.get("model", {}).get("max_seq_len")),
        ("seed", train_cfg.get("seed")),
        ("steps run", metrics.get("steps")),
        ("best step", metrics.get("best_step", meta.get("step"))),
    ]
    if dev.best is not None:  # e.g. "best SICK trial Spearman x 100": what selected that step
        rows.append((f"best {dev.label}", f"{dev.best:.2f}"))
    return "\n".join(fill("row", label=label, value=value) for label, value in rows if value is not None)


def onnx_usage(result: ExportResult, dim: int) -> str | None:
    """How to run the ONNX graphs (None without them)."""
    if "onnx" not in result.onnx_files:
        return None
    fp32 = result.onnx_files["onnx"]
    int8 = result.onnx_files.get("onnx-int8")
    # sentence-transformers' ONNX backend pools from last_hidden_state: only graphs that return it.
    st_backend = result.onnx is not None and "last_hidden_state" in result.onnx.outputs
    return fill(
        "onnx_usage",
        and_normalisation=" and normalisation" if result.normalize else "",
        fp32_file=fp32,
        int8_encoder=fill("int8_encoder", int8_file=int8) if int8 else None,
        st_onnx_backend=fill("st_onnx_backend", fp32_file=fp32) if st_backend else None,
        clients=client_usage(result, fp32, dim),
    )


LAST_TOKEN_JS = (
    "Its `last_token` pooling reads the last column, which this folder's tokenizer (padding on the left) makes every "
    "text's last real token. A text longer than the max length loses its appended EOS there (Transformers.js truncates "
    "after adding special tokens), so its vector differs from this model's."
)
# docs/export.md, "What the clients do differently": measured on all-MiniLM-L6-v2 (issue 48).
TRUNCATION_JS = (
    "Transformers.js truncates after adding the special tokens: a text longer than the max length loses its final "
    "separator token there, so its vector differs slightly from this model's (cosine 0.998 on all-MiniLM-L6-v2); "
    "within the max length they are the same."
)


def client_usage(result: ExportResult, fp32: str, dim: int) -> str | None:
    """fastembed's and Transformers.js' setup for this graph (``docs/export.md``, "Other clients")."""
    if result.onnx is None:
        return None
    pooling = result.onnx.token_pooling
    if pooling is None:
        # last_hidden_state with no token pooling: an MLP head runs at inference; no
        # last_hidden_state at all: a layer-averaging pooler.
        mlp = "last_hidden_state" in result.onnx.outputs
        in_graph, skipped = ("pooling and MLP head", "MLP head") if mlp else ("the layer-averaging pooling", "layer averaging")
        return fill("clients_sentence_embedding", fp32_file=fp32, in_graph=in_graph, skipped=skipped)
    return fill(
        "clients_pooled",
        pooling=pooling,
        then_normalise=" then L2 normalisation" if result.normalize else "",
        fastembed_pooling=pooling.upper(),
        normalization=str(result.normalize),
        dim=dim,
        fp32_file=fp32,
        js_pooling=pooling,
        js_normalize=str(result.normalize).lower(),
        js_last_token=LAST_TOKEN_JS if pooling == "last_token" else TRUNCATION_JS,
    )


def parity_rows(result: ExportResult) -> str:
    """One row per checked backend: its file, parity figures, requirement and speed."""
    required = {"torch": f"cosine >= {MIN_COSINE}", "onnx": f"cosine >= {MIN_COSINE_ONNX}"}
    required["onnx-int8"] = f"STS within {MAX_INT8_STS_DROP} of fp32"
    files_ = {"torch": "model.safetensors", **result.onnx_files}
    return "\n".join(
        fill(
            "parity_row",
            backend=backend,
            file=files_[backend],
            min_cosine=f"{par.min_cosine:.7f}",
            norm_diff=f"{par.max_norm_rel_diff:.1e}",
            required=required[backend],
            speed=f"{result.speed.get(backend, float('nan')):.0f}",
        )
        for backend, par in result.parity.items()
    )


def int8_cost(result: ExportResult) -> str | None:
    """The int8 graph's STS against simcse-kit fp32 (None without int8)."""
    if not result.sts:
        return None
    ref, q = result.sts["simcse-kit fp32"], result.sts["onnx-int8"]
    return fill("int8_cost", int8_sts=f"{q:.2f}", fp32_sts=f"{ref:.2f}", change=f"{q - ref:+.2f}", max_drop=MAX_INT8_STS_DROP)


def _files(value: object) -> str:
    """A recorded dataset file as the card names it: its path, or a list's paths (its shards) joined."""
    return files_label([str(v) for v in value]) if isinstance(value, list) else str(value)


def model_card(source: ExportSource, result: ExportResult, dim: int) -> str:
    """README.md for the export: base model, recipe, data, STS table, usage, checks."""
    meta, cfg, metrics = source.meta, source.run_config, source.metrics
    data_cfg = cfg.get("data", {})
    base = source.base_model or "unknown"
    mode = str(data_cfg.get("mode", meta.get("mode", "unknown")))
    train_file = _files(data_cfg.get("train_file", meta.get("train_file", "unknown")))
    limit = data_cfg.get("max_train_samples")
    training_data = f"`{train_file}`" + (f" (first {limit} examples)" if limit else "")
    if data_cfg.get("datasets"):  # several datasets (data.datasets): theirs, not the unused train_file's
        mode = " + ".join(dict.fromkeys(str(d["mode"]) for d in data_cfg["datasets"]))
        training_data = ", ".join(f"{d['name']} (`{_files(d['file'])}`, {d['mode']})" for d in data_cfg["datasets"])
    hub = hub_id(base)
    reason = result.normalize_reason
    if result.normalize:
        similarity = f"cosine; embeddings are L2-normalised (`Normalize`: {reason}), so dot product = cosine"
    else:
        similarity = f"cosine (embeddings are not normalised: {reason})"
    sts = metrics.get("sts")
    # Each task the training data also holds marked, with the clean tasks' average (data.decontaminate).
    sts_table = format_marked_table(sts, metrics.get("contamination")) if sts else None
    card = fill(
        "card",
        onnx_tag="- onnx" if result.onnx_files else None,
        base_model_line=f"base_model: {hub}" if hub else None,
        title=f"SimCSE ({mode}) on {base}" if "unknown" not in (mode, base) else "SimCSE sentence embeddings",
        mode=mode,
        base=base,
        dim=dim,
        pooler=meta["pooler"],
        mlp=MLP_TEXT.get(str(meta.get("mlp")), meta.get("mlp")),
        modules=result.modules,
        normalize=f"{'yes' if result.normalize else 'no'} ({reason})",
        max_seq_len=meta["max_seq_len"],
        similarity=similarity,
        backends=", ".join(["torch", *result.onnx_files]),
        training_data=training_data,
        training_rows=training_rows(source) or None,
        recipe=fill("recipe", config=yaml.safe_dump(cfg, sort_keys=False).rstrip()) if cfg else None,
        evaluation=fill("sts_table", table=sts_table) if sts_table else fill("no_sts_table"),
        onnx_usage=onnx_usage(result, dim),
        st_class_prefix=ST_CLASS_PREFIX,
        compat=", ".join(dict.fromkeys([*COMPAT_TESTED, result.st_version])),
        n_probes=result.n_probes,
        normalised=", normalised" if result.normalize else "",
        st_version=result.st_version,
        parity_rows=parity_rows(result),
        machine=platform.machine(),
        threads=torch.get_num_threads(),
        int8_cost=int8_cost(result),
    )
    return card + "\n"
