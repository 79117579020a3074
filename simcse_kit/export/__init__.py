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
* :mod:`~simcse_kit.export.exporter` — :func:`export_model`, all of the above in order.
"""

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
