"""A teacher's scores of each row's candidates: reading them, the objective's distill term
against a naive loop (KL and MarginMSE, k = 1 and 3, alone and beside InfoNCE, through
GradCache), and ``simcse-kit score`` (a bi-encoder's cosines, a CrossEncoder's predict, a
round trip into training)."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TinyRun, toy_sentences
from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

from simcse_kit.cli import main
from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core.modes import hard_negative_columns
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import load_train_dataset, read_rows
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.objectives import SimCSEObjective

# --------------------------------------------------------------------------- data


def scored_rows(n: int, k: int) -> list[dict[str, object]]:
    """``n`` rows of anchor, positive, ``k`` negatives and ``1 + k`` scores (distinct texts)."""
    s = toy_sentences((2 + k) * n)
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"sent0": f"{s[i]} {i}", "sent1": f"{s[n + i]} {i}"}
        row |= {name: f"{s[(2 + j) * n + i]} {i}" for j, name in enumerate(hard_negative_columns(k))}
        row["scores"] = [round(0.9 - 0.1 * j - 0.01 * i, 4) for j in range(1 + k)]
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict[str, object]], k: int) -> Path:
    negatives = hard_negative_columns(k)
    score_names = ["score_pos", *(f"score_{n.removeprefix('hard_')}" for n in negatives)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sent0", "sent1", *negatives, *score_names])
        for r in rows:
            scores = r["scores"]
            assert isinstance(scores, list)
            writer.writerow([r["sent0"], r["sent1"], *(r[n] for n in negatives), *scores])
    return path


def write_jsonl(path: Path, rows: list[dict[str, object]], k: int) -> Path:
    lines = []
    for r in rows:
        negatives = [r[n] for n in hard_negative_columns(k)]
        obj = {"sent0": r["sent0"], "sent1": r["sent1"], "hard_neg": negatives}
        lines.append(json.dumps(obj | ({"scores": r["scores"]} if "scores" in r else {})))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_teacher_scores_are_read_in_both_forms(tmp_path: Path, k: int, suffix: str) -> None:
    rows = scored_rows(6, k)
    path = (write_csv if suffix == ".csv" else write_jsonl)(tmp_path / f"train{suffix}", rows, k)
    data = load_train_dataset(str(path), "hardneg", cache_dir=tmp_path / "cache", teacher_scores=True)
    assert data["scores"] == [r["scores"] for r in rows]
    assert data["sent1"] == [r["sent1"] for r in rows]
    # Without loss.distill the same file trains as plain hardneg data: the scores are not read.
    plain = load_train_dataset(str(path), "hardneg", cache_dir=tmp_path / "cache")
    assert "scores" not in plain.column_names and len(plain) == 6


DROP = object()  # the row has no scores at all


@pytest.mark.parametrize(
    ("suffix", "scores", "message"),
    [
        (".jsonl", DROP, "train.jsonl, line 3: missing value for column 'scores'"),
        (".jsonl", [0.5, 0.1], "train.jsonl, line 3: 2 teacher score(s) for a positive and 3"),
        (".jsonl", [0.5, 0.1, 0.2, 0.3, 0.4], "line 3: 5 teacher score(s)"),
        (".jsonl", [0.5, "high", 0.2, 0.3], "line 3: score 'high' (column 'scores[1]') is not a number"),
        (".jsonl", [0.5, 0.1, float("inf"), 0.3], "line 3: score inf (column 'scores[2]') is not finite"),
        (".jsonl", [0.5, True, 0.2, 0.3], "line 3: column 'scores[1]' must be a number, got bool"),
        (".jsonl", "0.5 0.1 0.2 0.3", "line 3: column 'scores' must be a list"),
        (".csv", [0.5, "nan", 0.2, 0.3], "train.csv, line 4: score 'nan' (column 'score_neg_1') is not finite"),
        (".csv", [0.5, "", 0.2, 0.3], "train.csv, line 4: score '' (column 'score_neg_1') is not a number"),
    ],
)
def test_bad_teacher_scores_name_the_file_and_line(tmp_path: Path, suffix: str, scores: object, message: str) -> None:
    rows = scored_rows(5, 3)
    if scores is DROP:
        rows[2].pop("scores")
    else:
        rows[2]["scores"] = scores
    if suffix == ".jsonl":
        path = write_jsonl(tmp_path / "train.jsonl", rows, 3)
    else:
        path = write_csv(tmp_path / "train.csv", rows, 3)
    with pytest.raises(DataError) as info:
        load_train_dataset(str(path), "hardneg", cache_dir=tmp_path / "cache", teacher_scores=True)
    assert message in str(info.value)


def test_a_csv_without_a_score_column_is_refused_at_its_header(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "train.csv", scored_rows(4, 3), 3)
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    drop = header.index("score_neg_3")
    path.write_text("\n".join(",".join(c for j, c in enumerate(next(csv.reader([line]))) if j != drop) for line in lines) + "\n")
    with pytest.raises(DataError, match=r"train.csv, line 1: header .* lacks column\(s\) \['score_neg_3'\]"):
        load_train_dataset(str(path), "hardneg", cache_dir=tmp_path / "cache", teacher_scores=True)


def test_the_collator_passes_each_examples_scores_in_batch_order(tiny_model_dir: Path) -> None:
    rows = scored_rows(4, 3)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "hardneg", 16, negatives=3, teacher_scores=True)(rows)  # type: ignore[arg-type]
    assert batch["teacher_scores"].shape == (4, 4)
    torch.testing.assert_close(batch["teacher_scores"], torch.tensor([r["scores"] for r in rows]))  # type: ignore[misc]


# --------------------------------------------------------------------------- the objective against a naive loop


def naive_distill(embeddings: torch.Tensor, teacher: torch.Tensor, k: int, kind: str, tau_s: float, tau_t: float) -> torch.Tensor:
    """The distill term by a loop over anchors and their candidates, scalar ops only."""
    views, n = 2 + k, teacher.shape[0]
    per_anchor = []
    for i in range(n):
        a = embeddings[i * views]
        s = []
        for j in range(1 + k):
            c = embeddings[i * views + 1 + j]
            s.append((a * c).sum() / (a.norm() * c.norm()))
        t = [float(teacher[i, j]) for j in range(1 + k)]
        if kind == "kl":
            z_t = sum(math.exp(x / tau_t) for x in t)
            p = [math.exp(x / tau_t) / z_t for x in t]
            z_s = sum(torch.exp(x / tau_s) for x in s)
            per_anchor.append(sum(p[j] * (math.log(p[j]) - torch.log(torch.exp(s[j] / tau_s) / z_s)) for j in range(1 + k)))
        else:
            per_anchor.extend(((s[0] - s[j]) - (t[0] - t[j])) ** 2 for j in range(1, 1 + k))
    return sum(per_anchor) / len(per_anchor)


@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("weight", [1.0, 0.4])
def test_distill_term_equals_a_naive_loop(kind: str, k: int, weight: float) -> None:
    """Values and gradients in fp64; at weight < 1 beside the objective's own InfoNCE term."""
    torch.manual_seed(k)
    n, views = 5, 2 + k
    embeddings = torch.randn(n * views, 8, dtype=torch.float64, requires_grad=True)
    teacher = torch.rand(n, 1 + k, dtype=torch.float64)
    cfg = LossConfig(temperature=0.07, distill=kind, distill_weight=weight, distill_teacher_temperature=0.03)
    objective = SimCSEObjective("hardneg", cfg, negatives=k)
    got = objective.loss(embeddings, {"teacher_scores": teacher})
    (got_grad,) = torch.autograd.grad(got, embeddings)

    want = weight * naive_distill(embeddings, teacher, k, kind, tau_s=0.07, tau_t=0.03)
    if weight < 1:
        want = want + (1 - weight) * SimCSEObjective("hardneg", LossConfig(temperature=0.07), negatives=k).loss(embeddings)
    (want_grad,) = torch.autograd.grad(want, embeddings)
    assert float(want.detach()) > 1e-3  # not a vacuous zero
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-12, rtol=0)
    assert set(objective.metrics()) == ({"distill_loss"} if weight == 1 else {"distill_loss", "infonce_loss"})


def test_distill_student_temperature_is_its_own_knob() -> None:
    torch.manual_seed(0)
    embeddings = torch.randn(4 * 3, 8, dtype=torch.float64)
    teacher = torch.rand(4, 2, dtype=torch.float64)
    cfg = LossConfig(temperature=0.05, distill="kl", distill_student_temperature=0.2, distill_teacher_temperature=0.1)
    got = SimCSEObjective("hardneg", cfg).loss(embeddings, {"teacher_scores": teacher})
    torch.testing.assert_close(got, naive_distill(embeddings, teacher, 1, "kl", tau_s=0.2, tau_t=0.1), atol=1e-12, rtol=0)


def test_distill_with_matryoshka_sums_the_prefixes() -> None:
    torch.manual_seed(1)
    embeddings = torch.randn(3 * 5, 8, dtype=torch.float64)
    teacher = torch.rand(3, 4, dtype=torch.float64)
    cfg = LossConfig(distill="margin_mse", matryoshka_dims=[8, 3], matryoshka_weights=[1.0, 0.5])
    got = SimCSEObjective("hardneg", cfg, negatives=3).loss(embeddings, {"teacher_scores": teacher})
    want = sum(w * naive_distill(embeddings[:, :d], teacher, 3, "margin_mse", 1, 1) for d, w in ((8, 1.0), (3, 0.5)))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_distill_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="mode hardneg"):
        SimCSEObjective("sup", LossConfig(distill="kl"))
    with pytest.raises(ValueError, match="teacher_scores"):
        SimCSEObjective("hardneg", LossConfig(distill="kl")).loss(torch.randn(6, 4), {})
    with pytest.raises(ValueError, match=r"teacher_scores has shape \(2, 3\)"):
        SimCSEObjective("hardneg", LossConfig(distill="kl")).loss(torch.randn(6, 4), {"teacher_scores": torch.rand(2, 3)})


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("kind", "weight"), [("kl", 1.0), ("margin_mse", 1.0), ("kl", 0.5), ("margin_mse", 0.5)])
def test_distill_through_gradcache_equals_full_batch(tiny_model_dir: Path, kind: str, weight: float) -> None:
    """The distill term is part of the loss of the cached [B, H]: chunked encoding, same loss and gradients."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "hardneg", 16, negatives=3, teacher_scores=True)(scored_rows(8, 3))  # type: ignore[arg-type]
    objective = SimCSEObjective("hardneg", LossConfig(distill=kind, distill_weight=weight), negatives=3)
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="none", dropout=0.0))
    full = objective.step(model.train(), batch)
    want = grads(model)
    model.zero_grad(set_to_none=True)
    cached = GradCacheStep(objective, 7)(model, batch)  # chunks of 5 rows: one example each, never split
    assert full.item() > 1e-4 and abs(cached.item() - full.item()) < 1e-6
    assert want.keys() == grads(model).keys() and sum(g.abs().sum() for g in want.values()) > 1e-4
    for name, g in grads(model).items():
        torch.testing.assert_close(g, want[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"distill": "kl", "mode": "sup"}, "config key 'data.mode' = 'sup': must be 'hardneg' with loss.distill"),
        ({"distill": "kld"}, "config key 'loss.distill' = 'kld': must be 'kl' or 'margin_mse'"),
        ({"distill": "kl", "distill_weight": "1.5"}, "config key 'loss.distill_weight' = 1.5: must be in [0, 1]"),
        ({"distill": "kl", "distill_teacher_temperature": "0"}, "'loss.distill_teacher_temperature' = 0"),
        ({"distill": "kl", "queue_size": "16"}, "config key 'loss.queue_size' = 16: must be 0 with loss.distill_weight 1"),
    ],
)
def test_distill_config_is_checked(tiny_run: TinyRun, overrides: dict[str, str], message: str) -> None:
    base = {"mode": "hardneg", "train_file": str(write_csv(tiny_run.folder / "t.csv", scored_rows(4, 1), 1))}
    with pytest.raises(ConfigError) as info:
        tiny_run.config(**(base | overrides)).validate()
    assert message in str(info.value)


# --------------------------------------------------------------------------- simcse-kit score


def texts_of(row: dict[str, object], k: int) -> list[str]:
    return [str(row["sent0"]), str(row["sent1"]), *(str(row[c]) for c in hard_negative_columns(k))]


def write_triplets(path: Path, n: int, k: int) -> list[dict[str, object]]:
    rows = scored_rows(n, k)
    for r in rows:
        r.pop("scores")
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sent0", "sent1", *hard_negative_columns(k), "source"])
        writer.writerows([*texts_of(r, k), "toy"] for r in rows)
    return rows


@pytest.mark.parametrize(("k", "suffix"), [(3, ".csv"), (1, ".csv"), (3, ".jsonl")])
def test_score_writes_the_bi_encoders_cosines(tmp_path: Path, tiny_model_dir: Path, k: int, suffix: str) -> None:
    rows = write_triplets(tmp_path / "triplets.csv", 7, k)
    out = tmp_path / f"scored{suffix}"
    args = ["score", str(tmp_path / "triplets.csv"), str(out), "--model", str(tiny_model_dir), "--pooler", "avg"]
    assert main([*args, "--batch-size", "3"]) == 0
    written = read_rows(out, ("sent0", "sent1"), hard_negatives=True, teacher_scores=True)
    if suffix == ".csv":
        negatives = ",".join(hard_negative_columns(k))
        scores = "score_pos," + ",".join(f"score_{c.removeprefix('hard_')}" for c in hard_negative_columns(k))
        assert out.read_text(encoding="utf-8").splitlines()[0] == f"sent0,sent1,{negatives},{scores}"
    from simcse_kit.model.inference import load_encoder

    encoder = load_encoder(str(tiny_model_dir), pooler="avg")
    assert len(written) == len(rows)
    for row, got in zip(rows, written, strict=True):
        assert texts_of(got, k) == texts_of(row, k)  # the same rows, in order
        a, *candidates = F.normalize(encoder.encode(texts_of(row, k)).double(), dim=-1)
        want = [float(a @ c) for c in candidates]
        assert len(got["scores"]) == 1 + k
        assert max(abs(g - w) for g, w in zip(got["scores"], want, strict=True)) < 1e-5
    assert len({s for r in written for s in r["scores"]}) > 1 + k  # not one constant


def save_tiny_cross_encoder(model_dir: Path, folder: Path) -> Path:
    """The tiny BERT's tokenizer and shape with a one-label classification head: a CrossEncoder folder."""
    shutil.copytree(model_dir, folder)
    config = AutoConfig.from_pretrained(model_dir, num_labels=1, initializer_range=0.5)  # logits spread well apart
    torch.manual_seed(3)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_score_with_a_cross_encoder_equals_its_predict(tmp_path: Path, tiny_model_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    folder = save_tiny_cross_encoder(tiny_model_dir, tmp_path / "ce")
    rows = write_triplets(tmp_path / "triplets.csv", 6, 2)
    out = tmp_path / "scored.jsonl"
    assert main(["score", str(tmp_path / "triplets.csv"), str(out), "--cross-encoder", str(folder), "--device", "cpu"]) == 0
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    predicted = CrossEncoder(str(folder), device="cpu").predict([(str(r["sent0"]), t) for r in rows for t in texts_of(r, 2)[1:]])
    got = [s for r in written for s in r["scores"]]
    assert len(got) == len(predicted) == 18
    assert max(abs(g - float(p)) for g, p in zip(got, predicted, strict=True)) < 1e-6
    assert max(got) - min(got) > 0.05  # the pairs are scored apart


def test_score_refuses_its_input_as_output_and_pairs_without_negatives(tmp_path: Path, tiny_model_dir: Path) -> None:
    src = tmp_path / "pairs.csv"
    src.write_text("sent0,sent1\na b,c d\ne f,g h\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="the output is the input file"):
        from simcse_kit.tools.scoring import score_file

        score_file(src, src, model=str(tiny_model_dir), pooler="avg")
    out = tmp_path / "scored.csv"
    with pytest.raises(DataError, match=r"pairs.csv, line 1: header .* lacks column\(s\) \['hard_neg"):
        score_file(src, out, model=str(tiny_model_dir), pooler="avg")
    assert not out.exists()


def test_scored_file_trains_with_distill_and_matches_its_teacher_at_the_start(tiny_run: TinyRun) -> None:
    """Round trip: ``score`` with the student itself as teacher, then train with KL at equal
    temperatures and no dropout: the first step's loss is 0 (the student *is* the teacher,
    so every score reached its own anchor's candidates, in order), and the student moves
    from there only through the InfoNCE term beside it."""
    model = str(tiny_run.model_dir)
    write_triplets(tiny_run.folder / "triplets.csv", 24, 3)
    scored = tiny_run.folder / "scored.jsonl"
    assert main(["score", str(tiny_run.folder / "triplets.csv"), str(scored), "--model", model, "--pooler", "avg"]) == 0
    common = {"mode": "hardneg", "train_file": str(scored), "pooler": "avg", "mlp": "none", "dropout": "0", "max_seq_len": "32"}
    common |= {"distill": "kl", "distill_teacher_temperature": "0.05", "temperature": "0.05", "num_epochs": "1"}
    alone = tiny_run.train("alone", **common, distill_weight="1")
    assert alone["losses"][0][1] < 1e-5
    mixed = tiny_run.train("mixed", **common, distill_weight="0.5")
    assert mixed["losses"][0][1] > 0.1  # InfoNCE's half: 24 candidates per anchor


def test_a_hub_dataset_carries_its_scores_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    rows = {
        "sent0": ["a", "b"],
        "sent1": ["p", "q"],
        "hard_neg": [["x", "y"], ["z", "w"]],
        "scores": [[0.9, 0.2, 0.1], [0.8, 0.3, 0.4]],
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: datasets.Dataset.from_dict(rows))
    ds = load_train_dataset("hub:org/scored", "hardneg", teacher_scores=True)
    assert ds["scores"] == rows["scores"] and ds["hard_neg_2"] == ["y", "w"]
    rows["scores"] = [[0.9, 0.2, 0.1], [0.8, 0.3]]
    with pytest.raises(DataError, match=r"hub:org/scored, row 2: 2 teacher score\(s\) for a positive and 2 hard negative"):
        load_train_dataset("hub:org/scored", "hardneg", teacher_scores=True)
