"""Hard-negative mining: known negatives from hand-placed embeddings, and the CLI on a tiny model."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences

from simcse_kit.cli import main
from simcse_kit.errors import ConfigError
from simcse_kit.training.mining import mine_negatives

# Sentences on the unit circle at these angles (degrees): cosines are known by hand.
ANGLES = {"a0": 0, "p0": 30, "p0b": 40, "close": 20, "near": 35, "far": 60, "opposite": 180}
PAIRS = [("a0", "p0"), ("a0", "p0b"), ("close", "near"), ("far", "opposite")]


def circle_encode(sentences: Sequence[str]) -> torch.Tensor:
    rad = [math.radians(ANGLES[s]) for s in sentences]
    return torch.tensor([[math.cos(r), math.sin(r)] for r in rad])


def test_margin_and_exclusions_give_the_known_negatives() -> None:
    # margin 0: for (a0, p0) [cos 0.866] "close" (0.940) scores above the positive and is
    # skipped; p0b (0.766) is a0's other positive, never a negative; so "near" (0.819).
    # (close, near): bound 0.966; p0 (0.985) is above it, p0b and a0 (both 20 degrees away,
    # 0.940: an exact tie, ranked in either order) the best below.
    # (far, opposite): bound cos 120 = -0.5; everything else is above it -> none.
    got = mine_negatives(PAIRS, circle_encode, top_k=10, margin=0.0, progress=False)
    assert got[:2] == ["near", "far"] and got[2] in ("p0b", "a0") and got[3] is None
    # margin 0.05: "near" is within 0.047 of p0 and p0b within 0.026 of "near": both
    # skipped; "far" is next for both.
    got = mine_negatives(PAIRS, circle_encode, top_k=10, margin=0.05, progress=False)
    assert got == ["far", "far", "far", None]
    # top_k 1: only the single best candidate is considered; for (a0, p0) that is
    # "close", which the margin rules out, so nothing qualifies.
    assert mine_negatives(PAIRS, circle_encode, top_k=1, progress=False)[0] is None


def test_random_strategy_is_seeded_and_picks_within_the_top_k() -> None:
    def pick(seed: int) -> str | None:
        return mine_negatives(PAIRS, circle_encode, top_k=3, sampling_strategy="random", seed=seed, progress=False)[0]

    picks = {pick(s) for s in range(20)}
    # The top 3 for (a0, p0), its positives aside: close, near, far; the margin drops
    # "close", and "opposite" (rank 4) is never considered.
    assert picks == {"near", "far"}
    assert [pick(3) for _ in range(3)] == [pick(3)] * 3
    with pytest.raises(ConfigError, match="sampling-strategy"):
        mine_negatives(PAIRS, circle_encode, sampling_strategy="best")


def test_mine_command_writes_hard_negatives_that_respect_the_rules(tmp_path: Path, tiny_model_dir: Path) -> None:
    sents = toy_sentences(40)
    pairs = [(sents[i], sents[i + 20]) for i in range(20)] + [(sents[0], sents[1])]  # sents[0] has two positives
    src = tmp_path / "pairs.csv"
    with src.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1"), *pairs])
    out = tmp_path / "mined.csv"
    margin = 0.01
    args = ["mine", str(src), str(out), "--model", str(tiny_model_dir), "--pooler", "avg", "--margin", str(margin)]
    assert main([*args, "--top-k", "5"]) == 0
    with out.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and list(rows[0]) == ["sent0", "sent1", "hard_neg"]
    related: dict[str, set[str]] = {}
    for a, p in pairs:
        related.setdefault(a, {a}).add(p)
    from simcse_kit.model.inference import load_encoder

    encode = load_encoder(str(tiny_model_dir), pooler="avg").encode
    for row in rows:
        assert row["hard_neg"] not in related[row["sent0"]]  # never the anchor or any of its positives
        a, p, n = torch.nn.functional.normalize(encode([row["sent0"], row["sent1"], row["hard_neg"]]), dim=-1)
        assert float(a @ n) <= float(a @ p) - margin + 1e-5
