"""Export a simcse-kit model to a sentence-transformers folder that loads anywhere, verified
(``docs/export.md``).

Modules, one concern each:

* :mod:`~simcse_kit.export.source` — the run or model folder exported, the target folder
  checked, :class:`ExportError`;
* :mod:`~simcse_kit.export.folder` — simcse-kit's pooler and MLP as sentence-transformers
  modules, written in the one format every version reads;
* :mod:`~simcse_kit.export.verify` — parity with simcse-kit on probe sentences, encode speed;
* :mod:`~simcse_kit.export.onnx` — the encoder with its pooling as one ONNX graph
  (``torch.onnx``), checked at several shapes, and its dynamic int8;
* :mod:`~simcse_kit.export.sts_gate` — the int8 graph's STS-B dev against fp32 (the run's
  recorded score where it is the same measurement);
* :mod:`~simcse_kit.export.card` — the model card, from the template ``model_card.md``;
* :mod:`~simcse_kit.export.hub` — the upload;
* :mod:`~simcse_kit.export.exporter` — :func:`export_model`, all of the above in order;
* :mod:`~simcse_kit.export.onnx_encoder` — serving an ONNX export with onnxruntime,
  tokenizers and numpy alone.

The names below load on first use, so ``simcse_kit.export.onnx_encoder`` (no torch, no
transformers) can be imported where only onnxruntime is installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simcse_kit.export.card import model_card
    from simcse_kit.export.exporter import export_model
    from simcse_kit.export.folder import (
        COMPAT_TESTED,
        NORMALIZE,
        STModule,
        decide_normalize,
        describe_modules,
        export_modules,
        pooling,
        pooling_modules,
        write_folder,
    )
    from simcse_kit.export.hub import hub_upload
    from simcse_kit.export.onnx import DEFAULT_OPSET, OnnxExport, OnnxExportError, SentenceEmbeddingGraph, write_onnx
    from simcse_kit.export.source import EXPORT_INFO, ExportError, ExportSource, find_source
    from simcse_kit.export.sts_gate import MAX_INT8_STS_DROP, STSScorer
    from simcse_kit.export.verify import MIN_COSINE, MIN_COSINE_ONNX, PROBE_SENTENCES, ExportResult, Parity, parity

# Each public name -> the module that defines it.
_WHERE = {
    "COMPAT_TESTED": "simcse_kit.export.folder",
    "DEFAULT_OPSET": "simcse_kit.export.onnx",
    "EXPORT_INFO": "simcse_kit.export.source",
    "ExportError": "simcse_kit.export.source",
    "ExportResult": "simcse_kit.export.verify",
    "ExportSource": "simcse_kit.export.source",
    "MAX_INT8_STS_DROP": "simcse_kit.export.sts_gate",
    "MIN_COSINE": "simcse_kit.export.verify",
    "MIN_COSINE_ONNX": "simcse_kit.export.verify",
    "NORMALIZE": "simcse_kit.export.folder",
    "OnnxExport": "simcse_kit.export.onnx",
    "OnnxExportError": "simcse_kit.export.onnx",
    "PROBE_SENTENCES": "simcse_kit.export.verify",
    "Parity": "simcse_kit.export.verify",
    "STModule": "simcse_kit.export.folder",
    "STSScorer": "simcse_kit.export.sts_gate",
    "SentenceEmbeddingGraph": "simcse_kit.export.onnx",
    "decide_normalize": "simcse_kit.export.folder",
    "describe_modules": "simcse_kit.export.folder",
    "export_model": "simcse_kit.export.exporter",
    "export_modules": "simcse_kit.export.folder",
    "find_source": "simcse_kit.export.source",
    "hub_upload": "simcse_kit.export.hub",
    "model_card": "simcse_kit.export.card",
    "parity": "simcse_kit.export.verify",
    "pooling": "simcse_kit.export.folder",
    "pooling_modules": "simcse_kit.export.folder",
    "write_folder": "simcse_kit.export.folder",
    "write_onnx": "simcse_kit.export.onnx",
}

__all__ = [
    "COMPAT_TESTED",
    "DEFAULT_OPSET",
    "EXPORT_INFO",
    "MAX_INT8_STS_DROP",
    "MIN_COSINE",
    "MIN_COSINE_ONNX",
    "NORMALIZE",
    "PROBE_SENTENCES",
    "ExportError",
    "ExportResult",
    "ExportSource",
    "OnnxExport",
    "OnnxExportError",
    "Parity",
    "STModule",
    "STSScorer",
    "SentenceEmbeddingGraph",
    "decide_normalize",
    "describe_modules",
    "export_model",
    "export_modules",
    "find_source",
    "hub_upload",
    "model_card",
    "parity",
    "pooling",
    "pooling_modules",
    "write_folder",
    "write_onnx",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
