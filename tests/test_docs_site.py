"""docs/conf.py's resolution of ``simcse_kit`` references (the site itself is built by .ci/run,
``python -m sphinx -W --keep-going -n -b html docs SITE``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sphinx", reason="the docs extra (sphinx, myst-parser) builds the site")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def conf() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_conf", REPO / "docs" / "conf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documented(*names: str) -> Any:
    """A stand-in for the py domain: only its ``objects`` (documented full names) are read."""
    return SimpleNamespace(objects=dict.fromkeys(names))


def test_a_name_is_read_as_its_module_reads_it(conf: ModuleType) -> None:
    from simcse_kit.core import losses, masks
    from simcse_kit.evaluation import sts

    # A module the referring module imported, then an attribute of it.
    assert conf._lookup("simcse_kit.training.objective.objectives", "masks.guided_mask") is masks.guided_mask
    assert conf._lookup("simcse_kit.training.objective.objectives", "losses.contrastive_loss") is losses.contrastive_loss
    # A full path through a package's re-export.
    assert conf._lookup(None, "simcse_kit.evaluation.DevEvaluator") is sts.DevEvaluator
    assert conf._lookup("simcse_kit.export.verify", "simcse_kit.core.masks") is masks
    # Names that do not exist stay unresolved (the build then fails on them).
    assert conf._lookup("simcse_kit.training.objective.objectives", "masks.no_such_mask") is None
    assert conf._lookup("simcse_kit.data.tokens", "pad_rows") is None
    assert conf._lookup(None, "simcse_kit.no_such_module.thing") is None


def test_an_object_links_where_it_is_defined(conf: ModuleType) -> None:
    from simcse_kit.config import run, sections
    from simcse_kit.core import masks
    from simcse_kit.evaluation import sts

    domain = documented(
        "simcse_kit.evaluation.sts.DevEvaluator", "simcse_kit.core.masks.guided_mask", "simcse_kit.config.sections.MODES"
    )
    assert conf._defined_name(sts.DevEvaluator, "DevEvaluator", domain) == "simcse_kit.evaluation.sts.DevEvaluator"
    assert conf._defined_name(masks.guided_mask, "guided_mask", domain) == "simcse_kit.core.masks.guided_mask"
    assert conf._defined_name(masks, "masks", domain) == "simcse_kit.core.masks"
    # A constant has no __module__: config.run's MODES is the one documented in config.sections.
    assert run.MODES is sections.MODES
    assert conf._defined_name(run.MODES, "MODES", domain) == "simcse_kit.config.sections.MODES"
    # Not documented: no link.
    assert conf._defined_name(sts.STSEvaluator, "STSEvaluator", domain) is None


def test_a_shared_constant_is_not_guessed(conf: ModuleType) -> None:
    """Two modules' ``FORMAT = 2`` are one int object: which one a bare reference means is
    the author's to say, so neither is picked."""
    from simcse_kit.data import corpus, tokens

    assert corpus.FORMAT is tokens.FORMAT
    both = documented("simcse_kit.data.corpus.FORMAT", "simcse_kit.data.tokens.FORMAT")
    assert conf._defined_name(corpus.FORMAT, "FORMAT", both) is None
    one = documented("simcse_kit.data.corpus.FORMAT")
    assert conf._defined_name(corpus.FORMAT, "FORMAT", one) == "simcse_kit.data.corpus.FORMAT"


def test_benchmarks_links_become_the_site_page(conf: ModuleType) -> None:
    source = ["[a](../BENCHMARKS.md#memory), [b](BENCHMARKS.md), [c](benchmarks/gpu.py), [d](../BENCHMARKS.md)"]
    conf.link_benchmarks_page(None, "usage", source)
    assert source == ["[a](benchmarks.md#memory), [b](benchmarks.md), [c](benchmarks/gpu.py), [d](benchmarks.md)"]
