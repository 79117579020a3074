"""The int8 quality gate: a quantised graph is kept only if its STS-B dev score stays within
:data:`MAX_INT8_STS_DROP` of simcse-kit's fp32 model.

The default scorer is STS-B dev (:class:`~simcse_kit.evaluation.DevEvaluator`, 1,500 pairs)
in the SentEval folder under the data root, found the way every command finds it
(:func:`simcse_kit.config.recipes.senteval_dir`: ``--data-dir``, else ``senteval/`` under
``--data-root`` > ``SIMCSE_KIT_DATA`` > ``../shared/data`` beside a source checkout). One
task, not the 7-task table: int8 moves every task alike (all-MiniLM-L6-v2: STS-B test 83.45
int8 vs 83.43 fp32, lowest cosine to fp32 ~0.97), and the full table twice took 18 minutes
for a 22M model on 2 CPU cores. The fp32 side is the run's own record when it is the same
measurement (:func:`kept_fp32_score`: the kept model's STS-B dev score, scored on a byte-identical
STS-B dev file without a prompt), so only the int8 graph is encoded; otherwise it is computed
once, here.
"""

from __future__ import annotations

import filecmp
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from simcse_kit.config.recipes import senteval_dir
from simcse_kit.evaluation import DevEvaluator
from simcse_kit.evaluation.suite import stsb_split_path
from simcse_kit.export.source import ExportError, ExportSource
from simcse_kit.export.verify import TensorEncode
from simcse_kit.training.engine.selection import LEGACY_DEV_METRIC, dev_selection

logger = logging.getLogger(__name__)

MAX_INT8_STS_DROP = 0.5
"""int8 ONNX: most the STS score (Spearman x 100, primary metric) may fall below fp32 simcse-kit."""

STSScorer = Callable[[TensorEncode], Mapping[str, float]]
"""An evaluator such as :class:`~simcse_kit.evaluation.DevEvaluator`: ``encode -> scores``
(its ``primary_metric`` attribute, else ``"avg"``, names the figure the int8 gate reads)."""


def default_scorer(data_dir: str | Path | None = None, data_root: str | Path | None = None) -> DevEvaluator:
    """STS-B dev of ``data_dir``, else of ``senteval/`` under the data root (read and checked
    now, before any model work).

    Raises:
        ConfigError: No folder given and no data root set.
        DataError: The STS-B dev file is missing or malformed.
    """
    return DevEvaluator(senteval_dir(data_dir, data_root))


def kept_fp32_score(source: ExportSource, evaluator: STSScorer) -> float | None:
    """The kept model's STS-B dev score as the run recorded it, when that is what
    ``evaluator`` would measure on fp32 simcse-kit: ``evaluator`` is STS-B dev
    (:class:`~simcse_kit.evaluation.DevEvaluator`), the run selected on STS-B dev (no other
    ``dev_file``) of a byte-identical file, with no query prompt. None otherwise (the gate
    then scores fp32 itself)."""
    if not isinstance(evaluator, DevEvaluator) or source.run_dir is None:
        return None
    data = source.run_config.get("data", {})
    selected = dev_selection({}, source.meta, data)  # STS-B dev under its name, or a folder's older stsb_dev
    score = selected.best if selected.metric == LEGACY_DEV_METRIC else None
    if not isinstance(score, int | float) or not math.isfinite(score):
        return None
    if data.get("dev_file") is not None or data.get("dev_format", "stsb") != "stsb" or (data.get("prompts") or {}).get("query"):
        return None
    if data.get("eval_data_dir") is None:
        return None
    run_dev = stsb_split_path(data["eval_data_dir"], "dev")
    if not run_dev.is_file() or not filecmp.cmp(run_dev, evaluator.path, shallow=False):
        return None
    return float(score)


def sts_score(evaluator: STSScorer, encode: TensorEncode) -> tuple[float, dict[str, float]]:
    """``(primary figure, all figures)`` of ``evaluator`` on ``encode``."""
    scores = dict(evaluator(encode))
    key = getattr(evaluator, "primary_metric", "avg")
    return float(scores[key]), scores


def int8_gate(
    evaluator: STSScorer, fp32: TensorEncode, int8: TensorEncode, out: Path, fp32_score: float | None = None
) -> dict[str, float]:
    """Score the int8 encoder (and fp32, unless ``fp32_score`` gives it); returns
    ``{"simcse-kit fp32": ..., "onnx-int8": ...}``.

    Raises:
        ExportError: int8 loses more than :data:`MAX_INT8_STS_DROP` points.
    """
    ref_sts = sts_score(evaluator, fp32)[0] if fp32_score is None else fp32_score
    q_sts, _ = sts_score(evaluator, int8)
    key = getattr(evaluator, "primary_metric", "avg")
    how = "computed" if fp32_score is None else "the run's record"
    logger.info("int8 %s %.2f vs fp32 %.2f (%s; %+.2f)", key, q_sts, ref_sts, how, q_sts - ref_sts)
    if ref_sts - q_sts > MAX_INT8_STS_DROP:
        raise ExportError(
            f"int8 ONNX loses {ref_sts - q_sts:.2f} {key} points (fp32 {ref_sts:.2f}, int8 {q_sts:.2f}; "
            f"allowed {MAX_INT8_STS_DROP}); nothing written to {out}"
        )
    return {"simcse-kit fp32": ref_sts, "onnx-int8": q_sts}
