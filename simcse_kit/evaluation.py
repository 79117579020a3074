"""``simcse-kit evaluate``: load any model, run the STS suite, print and save results."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from simcse_kit.fileio import write_json_atomic
from simcse_kit.modeling import load_encoder
from simcse_kit.sts import STSEvaluator, format_table

logger = logging.getLogger(__name__)


def evaluate_model(
    model: str | Path,
    *,
    pooler: str | None = None,
    data_dir: str | Path = "../shared/data/senteval",
    tasks: Sequence[str] | None = None,
    json_out: str | Path | None = None,
    batch_size: int = 128,
    precision: str = "no",
) -> dict[str, float]:
    """Spearman x 100 on the STS tasks for MODEL; prints the paper-style table.

    The JSON holds each task's main figure under its name (``STS12`` ... ``SICKRelatedness``),
    details under ``<task>/<detail>``, and the 7-task average under ``avg``.
    """
    # Read the data first: a bad data folder fails before the model loads.
    evaluator = STSEvaluator(data_dir, tasks=tasks, batch_size=batch_size)
    encoder = load_encoder(model, pooler=pooler, precision=precision)
    start = time.perf_counter()
    results = evaluator(encoder.encode)
    logger.info("evaluated %s in %.1fs", model, time.perf_counter() - start)
    print(format_table(results))
    if json_out is not None:
        write_json_atomic(Path(json_out), results)
    return results
