"""simcse-kit: SimCSE sentence-embedding training, STS evaluation and export.

The folder tree is the architecture (``docs/architecture.md``): ``core/`` (the method, torch
only), ``config/``, ``model/``, ``data/``, ``evaluation/``, ``training/``, ``export/``,
``demos/`` and ``cli/``, each package importing only from the floors below it.

The names below are the public API. They load on first use, so ``import simcse_kit.core.losses``
costs only what that module needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simcse_kit.config.run import RunConfig, load_config
    from simcse_kit.core.distributed import gather_with_grad
    from simcse_kit.core.losses import contrastive_loss, info_nce, info_nce_views, matryoshka_loss, supcon
    from simcse_kit.evaluation.api import evaluate_model, evaluate_retrieval
    from simcse_kit.export.exporter import export_model
    from simcse_kit.export.onnx_encoder import OnnxEncoder
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.model.modeling import SimCSEModel
    from simcse_kit.training.wiring.run import build_run, train

__version__ = "0.1.0"

# Each public name -> the module that defines it.
_WHERE = {
    "RunConfig": "simcse_kit.config.run",
    "load_config": "simcse_kit.config.run",
    "gather_with_grad": "simcse_kit.core.distributed",
    "contrastive_loss": "simcse_kit.core.losses",
    "info_nce": "simcse_kit.core.losses",
    "info_nce_views": "simcse_kit.core.losses",
    "matryoshka_loss": "simcse_kit.core.losses",
    "supcon": "simcse_kit.core.losses",
    "evaluate_model": "simcse_kit.evaluation.api",
    "evaluate_retrieval": "simcse_kit.evaluation.api",
    "export_model": "simcse_kit.export.exporter",
    "OnnxEncoder": "simcse_kit.export.onnx_encoder",
    "load_encoder": "simcse_kit.model.inference",
    "SimCSEModel": "simcse_kit.model.modeling",
    "build_run": "simcse_kit.training.wiring.run",
    "train": "simcse_kit.training.wiring.run",
}
__all__ = [
    "OnnxEncoder",
    "RunConfig",
    "SimCSEModel",
    "build_run",
    "contrastive_loss",
    "evaluate_model",
    "evaluate_retrieval",
    "export_model",
    "gather_with_grad",
    "info_nce",
    "info_nce_views",
    "load_config",
    "load_encoder",
    "matryoshka_loss",
    "supcon",
    "train",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
