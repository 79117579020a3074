"""Hard-negative mining: known negatives from hand-placed embeddings, and the CLI on a tiny model."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences

from simcse_kit.cli import main
from simcse_kit.data.readers import load_train_dataset, negatives_of
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import search
from simcse_kit.tools import mining
from simcse_kit.tools.mining import mine_hard_negatives, mine_negatives

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


# --------------------------------------------------------------------------- k negatives per row

# The anchor q at 0 degrees, its positive at 40 (cos 0.766); every other sentence is some
# other pair's, at its angle: q's candidates by cosine are x10 .985, x20 .940, x45 .707,
# x50 .643, x60 .5, x70 .342, x80 .174, x100 -.174, x150 -.866, x170 -.985.
K_ANGLES = {"q": 0, "qp": 40} | {f"x{a}": a for a in (10, 20, 45, 50, 60, 70, 80, 100, 150, 170)}
K_PAIRS = [("q", "qp"), ("x10", "x150"), ("x20", "x100"), ("x45", "x80"), ("x50", "x70"), ("x60", "x170")]


def k_encode(sentences: Sequence[str]) -> torch.Tensor:
    rad = [math.radians(K_ANGLES[s]) for s in sentences]
    return torch.tensor([[math.cos(r), math.sin(r)] for r in rad])


def mine_q(**options: object) -> tuple[str, ...] | None:
    return mine_hard_negatives(K_PAIRS, k_encode, **options)[0]


def test_k_negatives_follow_range_and_margins_by_hand() -> None:
    # The margin (0) drops x10 and x20, above the positive: the next three, best first.
    assert mine_q(num_negatives=3) == ("x45", "x50", "x60")
    # range_min 2 skips the two best left (x45, x50).
    assert mine_q(num_negatives=3, range_min=2) == ("x60", "x70", "x80")
    # range_max 5 ranks x10 .. x60 only: three left after the margin, so four is too many.
    assert mine_q(num_negatives=3, range_max=5) == ("x45", "x50", "x60")
    assert mine_q(num_negatives=4, range_max=5) is None
    # relative 0.1: drop above .766 - .0766 = .689, so x45 (.707) goes too.
    assert mine_q(num_negatives=3, relative_margin=0.1) == ("x50", "x60", "x70")
    # absolute 0.2: drop above .566: x45 and x50 go.
    assert mine_q(num_negatives=3, margin=0.2) == ("x60", "x70", "x80")
    # One negative is the one-negative miner's answer.
    assert mine_negatives(K_PAIRS, k_encode, progress=False)[0] == mine_q(num_negatives=1)[0] == "x45"


def test_random_k_negatives_are_a_seeded_sample_written_best_first() -> None:
    # range_max 8: x10 .. x100; the margin leaves x45, x50, x60, x70, x80, x100.
    left = ["x45", "x50", "x60", "x70", "x80", "x100"]
    picks = [mine_q(num_negatives=3, range_max=8, sampling_strategy="random", seed=s) for s in range(30)]
    assert all(p is not None and len(set(p)) == 3 and set(p) <= set(left) for p in picks)
    assert all(list(p) == sorted(p, key=left.index) for p in picks)  # best first
    assert len({n for p in picks for n in p}) == len(left) and len(set(picks)) > 3
    assert mine_q(num_negatives=3, range_max=8, sampling_strategy="random", seed=4) == picks[4]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_negatives": 0}, "--num-negatives 0: must be >= 1"),
        ({"num_negatives": 4, "range_min": 2, "range_max": 5}, "--num-negatives 4: only 3 candidate"),
        ({"range_min": -1}, "--range-min -1"),
        ({"relative_margin": math.nan}, "--relative-margin nan"),
        ({"index": "annoy"}, "--index 'annoy'"),
    ],
)
def test_bad_mining_options_name_the_option(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        mine_hard_negatives(K_PAIRS, k_encode, **options)


def random_corpus(n: int = 120, dim: int = 12) -> tuple[list[tuple[str, str]], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    anchors = torch.randn(n, dim, generator=g)
    positives = anchors + 0.6 * torch.randn(n, dim, generator=g)  # close: the margins leave most candidates
    vectors = {f"s{i}": v for i, v in enumerate(torch.cat([anchors, positives]))}
    pairs = [(f"s{i}", f"s{n + i}") for i in range(n)] + [("s0", "s7")]  # s0 has two positives
    return pairs, vectors


def test_chunked_and_faiss_search_agree_with_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result does not depend on the search's blocks (tiny query and corpus chunks, a
    running top-k) nor on the index (faiss's IndexFlatIP)."""
    pairs, vectors = random_corpus()

    def encode(sentences: Sequence[str]) -> torch.Tensor:
        return torch.stack([vectors[s] for s in sentences])

    options = {"num_negatives": 3, "range_min": 1, "relative_margin": 0.05, "margin": -0.5}
    whole = mine_hard_negatives(pairs, encode, **options)
    assert sum(m is not None for m in whole) > 100
    # A brute-force loop per pair: the rules by hand on the full cosine matrix.
    corpus = list(dict.fromkeys(s for p in pairs for s in p))
    emb = torch.nn.functional.normalize(encode(corpus), dim=-1)
    related = {a: {a} | {p for b, p in pairs if b == a} for a, _ in pairs}
    for (a, p), got in zip(pairs, whole, strict=True):
        ia, ip = corpus.index(a), corpus.index(p)
        ranked = sorted((float(emb[ia] @ emb[j]), corpus[j]) for j in range(len(corpus)) if corpus[j] not in related[a])[::-1]
        pos = float(emb[ia] @ emb[ip])
        left = [c for s, c in ranked[: 1 + 10 * 3] if s <= pos + 0.5 and s <= pos - abs(pos) * 0.05][1:]
        assert got == (tuple(left[:3]) if len(left) >= 3 else None), a
    chunked = partial(search.exact_search, query_chunk=7, corpus_chunk=11)
    monkeypatch.setitem(mining.SEARCHES, "exact", chunked)
    assert mine_hard_negatives(pairs, encode, **options) == whole
    assert mine_hard_negatives(pairs, encode, index="faiss", **options) == whole


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_mine_command_writes_k_negatives_that_train(tmp_path: Path, tiny_model_dir: Path, suffix: str) -> None:
    sents = toy_sentences(60)
    pairs = [(sents[i], sents[i + 30]) for i in range(30)]
    src = tmp_path / "pairs.csv"
    with src.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1"), *pairs])
    out = tmp_path / f"mined{suffix}"
    args = ["mine", str(src), str(out), "--model", str(tiny_model_dir), "--pooler", "avg", "--num-negatives", "3"]
    assert main([*args, "--range-min", "1", "--range-max", "12", "--relative-margin", "0.01"]) == 0
    if suffix == ".csv":
        assert out.read_text(encoding="utf-8").splitlines()[0] == "sent0,sent1,hard_neg_1,hard_neg_2,hard_neg_3"
    else:
        assert isinstance(json.loads(out.read_text(encoding="utf-8").splitlines()[0])["hard_neg"], list)
    data = load_train_dataset(str(out), "hardneg")
    assert negatives_of(data.column_names) == 3 and len(data) > 0
    from simcse_kit.model.inference import load_encoder

    encode = load_encoder(str(tiny_model_dir), pooler="avg").encode
    partner = dict(pairs)
    for row in data:
        negatives = [row[f"hard_neg_{i}"] for i in (1, 2, 3)]
        assert len(set(negatives)) == 3 and not set(negatives) & {row["sent0"], partner[row["sent0"]]}
        a, p, *n = torch.nn.functional.normalize(encode([row["sent0"], row["sent1"], *negatives]), dim=-1)
        scores = [float(a @ v) for v in n]
        assert scores == sorted(scores, reverse=True)  # best first
        assert all(s <= float(a @ p) - abs(float(a @ p)) * 0.01 + 1e-5 for s in scores)


def test_mine_command_refuses_impossible_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "pairs.csv"
    src.write_text("sent0,sent1\na,b\nc,d\n", encoding="utf-8")
    out = tmp_path / "mined.csv"
    assert main(["mine", str(src), str(out), "--num-negatives", "5", "--range-max", "4"]) == 2
    assert "--num-negatives 5: only 4 candidate(s) remain" in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------------------------------- a guide vets the candidates

# The model ranks q's candidates as K_ANGLES does (x45 .707 is the best below the positive's
# .766). The guide sees q's positive at 20 degrees (cos .940) and x45 at 10 (.985: above the
# positive), x50 at 25 (.906: .034 below it), x60 at 60 (.5); every other sentence far away.
GUIDE_ANGLES = {name: 180 for name in K_ANGLES} | {"q": 0, "qp": 20, "x45": 10, "x50": 25, "x60": 60}


def guide_encode(sentences: Sequence[str]) -> torch.Tensor:
    rad = [math.radians(GUIDE_ANGLES[s]) for s in sentences]
    return torch.tensor([[math.cos(r), math.sin(r)] for r in rad])


@pytest.mark.parametrize(
    ("margin", "strategy", "want"),
    [
        (None, "absolute", "x45"),  # no guide: the model's best below the positive
        (0.0, "absolute", "x50"),  # x45 the guide rates above the positive
        (0.05, "absolute", "x60"),  # x50 is within .05 of it too: .906 > .940 - .05
        (0.03, "relative", "x50"),  # .940 x .97 = .912 > .906: x50 stays
        (0.05, "relative", "x60"),  # .940 x .95 = .893 < .906: x50 goes
    ],
)
def test_the_guide_vets_mined_negatives_by_hand(margin: float | None, strategy: str, want: str) -> None:
    guide = None if margin is None else guide_encode
    got = mine_hard_negatives(
        K_PAIRS, k_encode, 1, margin=0.0, guide=guide, guide_margin=margin or 0.0, guide_margin_strategy=strategy
    )
    assert got[0] == (want,)


def test_mine_command_takes_a_guide(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--guide`` with a huge margin vets every candidate away: no row gets a negative; a bad
    strategy or a missing guide is a clear error naming the option."""
    sents = toy_sentences(24)
    src = tmp_path / "pairs.csv"
    with src.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1"), *[(sents[i], sents[i + 12]) for i in range(12)]])
    args = ["mine", str(src), str(tmp_path / "out.csv"), "--model", str(tiny_model_dir), "--pooler", "avg"]
    from test_teacher import save_teacher

    guide = save_teacher(tmp_path / "guide", hidden=16)
    assert main([*args, "--guide", str(guide), "--guide-margin", "0"]) == 0
    assert main([*args, "--guide", str(guide), "--guide-margin", "3"]) == 2  # cos > pos - 3: every candidate
    assert "no row got a hard negative" in capsys.readouterr().err
    assert main([*args, "--guide", str(tmp_path / "missing")]) == 2
    assert "--guide" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--guide-margin-strategy 'percent'"):
        mining.mine_file(src, tmp_path / "x.csv", str(tiny_model_dir), "avg", guide=str(guide), guide_margin_strategy="percent")
