"""What is exported and where to: the run or model folder read, the target folder checked,
and the error a failed export raises."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simcse_kit.errors import ConfigError
from simcse_kit.export.onnx_encoder import FP32_FILE, INT8_FILE, ONNX_INFO
from simcse_kit.files import check_writable, folder_contents
from simcse_kit.model.modeling import SIMCSE_CONFIG
from simcse_kit.training.engine.guards import lock_holder

EXPORT_INFO = "simcse_export.json"
"""Provenance written into the export. Deliberately *not* ``simcse_config.json``: the
export is a plain sentence-transformers folder, so every loader (``simcse-kit evaluate``
included) runs it through ``SentenceTransformer`` and sees exactly what users see."""


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
    for folder in dict.fromkeys(filter(None, (run_dir, path))):
        holder = lock_holder(folder)
        if holder is not None:  # its best_model/ may still be replaced, its metrics.json not written yet
            raise ConfigError(
                f"{path}: a training run is still writing into {folder} ({holder}); export it when the run has finished"
            )
    meta = json.loads((model_dir / SIMCSE_CONFIG).read_text(encoding="utf-8"))
    source = ExportSource(model_dir=model_dir, meta=meta, run_dir=run_dir)
    if run_dir is not None:
        if (run_dir / "config.yaml").is_file():
            source.run_config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
        if (run_dir / "metrics.json").is_file():
            source.metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    return source


def check_target(source: ExportSource, out: Path, overwrite: bool) -> None:
    """Refuse a target that would replace, contain or sit inside the source, that is not a
    folder, or that holds anything but an earlier export (``--overwrite``) or nothing.

    Raises:
        ConfigError: The target is refused (nothing is written).
    """
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
    if overwrite and (out / EXPORT_INFO).is_file():
        check_only_export_files(out)
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_INFO).is_file():
        # --overwrite replaces a whole folder: only one we wrote (an earlier export) or an empty one.
        raise ConfigError(
            f"{out}: --overwrite replaces only an earlier export (with {EXPORT_INFO}) or an empty folder; "
            f"this one holds {', '.join(folder_contents(out))}: choose another folder"
        )


def export_files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a path relative to it (``onnx/model.onnx``), sorted:
    what an export records in :data:`EXPORT_INFO` as its own."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def check_only_export_files(out: Path) -> None:
    """``--overwrite`` deletes the earlier export at ``out`` whole: only where it holds
    nothing but the files that export recorded (``files`` in :data:`EXPORT_INFO`); an export
    from before that record, only where it holds nothing but files an export writes
    (:func:`written_by_an_export`). A file added there since (notes, a fine-tuned head)
    would be lost: refused, naming it.

    Raises:
        ConfigError: naming the files the earlier export did not write.
    """
    try:
        info = json.loads((out / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{out / EXPORT_INFO}: cannot be read ({exc}); not replacing {out}") from None
    recorded = info.get("files") if isinstance(info, dict) else None
    if isinstance(recorded, list):
        added = [name for name in export_files(out) if name not in set(recorded) | {EXPORT_INFO}]
        whose = "the earlier export there did not write"
    else:  # an export from before the list was recorded: what any export writes, and nothing else
        modules = module_folders(out)
        added = [name for name in export_files(out) if not written_by_an_export(name, modules)]
        whose = "no export writes (the earlier export there predates the record of its files)"
    if added:
        shown = ", ".join(added[:5]) + (f", ... ({len(added) - 5} more)" if len(added) > 5 else "")
        raise ConfigError(
            f"{out}: --overwrite would delete {shown}, which {whose}; move it out first, or export to another folder"
        )


# The top-level files an export has ever written: the sentence-transformers folder, the
# encoder's config and weights, what a tokenizer's save_pretrained writes, the card and
# the provenance; ONNX graphs under onnx/. An export from before simcse_export.json listed
# its files is checked against these.
EXPORT_TOP_FILES = frozenset({
    "config.json", "model.safetensors", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json", "README.md", EXPORT_INFO,
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
})  # fmt: skip
EXPORT_ONNX_FILES = frozenset({FP32_FILE, INT8_FILE, ONNX_INFO})
MODULE_FILES = frozenset({"config.json", "model.safetensors"})


def module_folders(out: Path) -> set[str]:
    """The module folders (``1_Pooling``) that ``out``'s ``modules.json`` names; none when
    it cannot be read (then every file in a folder counts as not an export's)."""
    try:
        modules = json.loads((out / "modules.json").read_text(encoding="utf-8"))
        return {str(m["path"]) for m in modules if isinstance(m, dict) and m.get("path")}
    except (OSError, ValueError, TypeError, KeyError):
        return set()


def written_by_an_export(name: str, modules: set[str]) -> bool:
    """Whether ``name`` (relative, ``1_Pooling/config.json``) is a file an export writes."""
    folder, _, file = name.rpartition("/")
    if not folder:
        return file in EXPORT_TOP_FILES
    return name in EXPORT_ONNX_FILES or (folder in modules and file in MODULE_FILES)
