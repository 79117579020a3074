"""The int8 quality gate: a quantised graph is kept only if its STS score stays within
:data:`MAX_INT8_STS_DROP` of simcse-kit's fp32 model.

The default scorer is the 7-task :class:`~simcse_kit.evaluation.STSEvaluator` on the
SentEval folder under the data root, found the way every command finds it
(:func:`simcse_kit.recipes.senteval_dir`: ``--data-dir``, else ``senteval/`` under
``--data-root`` > ``SIMCSE_KIT_DATA`` > ``../shared/data`` beside a source checkout).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from simcse_kit.evaluation import STSEvaluator
from simcse_kit.export.source import ExportError
from simcse_kit.export.verify import TensorEncode
from simcse_kit.recipes import senteval_dir

logger = logging.getLogger(__name__)

MAX_INT8_STS_DROP = 0.5
"""int8 ONNX: most the STS score (Spearman x 100, primary metric) may fall below fp32 simcse-kit."""

STSScorer = Callable[[TensorEncode], Mapping[str, float]]
"""An evaluator such as :class:`~simcse_kit.evaluation.STSEvaluator`: ``encode -> scores``
(its ``primary_metric`` attribute, else ``"avg"``, names the figure the int8 gate reads)."""


def default_scorer(data_dir: str | Path | None = None, data_root: str | Path | None = None) -> STSScorer:
    """The 7-task STS evaluator on ``data_dir``, else on ``senteval/`` under the data root
    (read and checked now, before any model work).

    Raises:
        ConfigError: No folder given and no data root set, or a task file is missing.
    """
    return STSEvaluator(senteval_dir(data_dir, data_root))


def sts_score(evaluator: STSScorer, encode: TensorEncode) -> tuple[float, dict[str, float]]:
    """``(primary figure, all figures)`` of ``evaluator`` on ``encode``."""
    scores = dict(evaluator(encode))
    key = getattr(evaluator, "primary_metric", "avg")
    return float(scores[key]), scores


def int8_gate(evaluator: STSScorer, fp32: TensorEncode, int8: TensorEncode, out: Path) -> dict[str, float]:
    """Score both encoders; returns ``{"simcse-kit fp32": ..., "onnx-int8": ...}``.

    Raises:
        ExportError: int8 loses more than :data:`MAX_INT8_STS_DROP` points.
    """
    ref_sts, _ = sts_score(evaluator, fp32)
    q_sts, _ = sts_score(evaluator, int8)
    logger.info("int8 STS %.2f vs fp32 %.2f (%+.2f)", q_sts, ref_sts, q_sts - ref_sts)
    if ref_sts - q_sts > MAX_INT8_STS_DROP:
        raise ExportError(
            f"int8 ONNX loses {ref_sts - q_sts:.2f} STS points (fp32 {ref_sts:.2f}, int8 {q_sts:.2f}; "
            f"allowed {MAX_INT8_STS_DROP}); nothing written to {out}"
        )
    return {"simcse-kit fp32": ref_sts, "onnx-int8": q_sts}
