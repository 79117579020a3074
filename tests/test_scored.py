"""data.mode scored: graded pairs read and checked (CSV, JSONL, STS-B and SICK train), the
collator's scores, the config's keys, the objective's score term, and a tiny run through
``simcse-kit train`` whose score loss decreases and agrees with and without GradCache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import write_tiny_senteval, write_train_data
from transformers import AutoTokenizer

from simcse_kit.cli import main
from simcse_kit.config.run import SCORE_LOSSES, LossConfig, RunConfig, load_config
from simcse_kit.core import score_losses
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import load_train_dataset
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.wiring.inputs import load_training_data

# --------------------------------------------------------------------------- readers


def test_csv_and_jsonl_scores_are_read_and_scaled(tmp_path: Path) -> None:
    csv = tmp_path / "pairs.csv"
    csv.write_text("sent0,sent1,score,extra\na dog,a cat,4.5,x\na man,two people, 0 ,y\n", encoding="utf-8")
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"sent0": "a dog", "sent1": "a cat", "score": 4.5}\n{"sent0": "a man", "sent1": "a car", "score": "0"}\n')
    for path in (csv, jsonl):
        raw = load_train_dataset(str(path), "scored")
        assert raw.column_names == ["sent0", "sent1", "score"] and raw["score"] == [4.5, 0.0]
        scaled = load_train_dataset(str(path), "scored", score_range=[0, 5])
        assert scaled["score"] == [0.9, 0.0] and scaled["sent1"][0] == "a cat"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("a dog,a cat,4\na man,a car,high\n", r"pairs\.csv, line 3: score 'high' \(column 'score'\) is not a number"),
        ("a dog,a cat,4\na man,a car,5.5\n", r"pairs\.csv, line 3: score 5\.5 is outside data\.score_range \[0, 5\]"),
        ("a dog,a cat,nan\na man,a car,1\n", r"pairs\.csv, line 2: score 'nan' \(column 'score'\) is not finite"),
        ("a dog,a cat,\na man,a car,1\n", r"pairs\.csv, line 2: score '' \(column 'score'\) is not a number"),
    ],
)
def test_bad_scores_are_named_by_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("sent0,sent1,score\n" + body, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_train_dataset(str(path), "scored", score_range=[0, 5])


def test_a_missing_score_column_and_a_json_boolean_are_named(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("sent0,sent1\na dog,a cat\na man,a car\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lacks column\(s\) \['score'\]"):
        load_train_dataset(str(path), "scored")
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"sent0": "a", "sent1": "b", "score": 1}\n{"sent0": "a", "sent1": "c", "score": true}\n')
    with pytest.raises(DataError, match=r"pairs\.jsonl, line 2: column 'score' must be a number, got bool"):
        load_train_dataset(str(jsonl), "scored")


def _scored_config(train_file: Path, train_format: str, score_range: list[float] | None) -> RunConfig:
    cfg = RunConfig()
    cfg.data.mode, cfg.data.train_file, cfg.data.train_format, cfg.data.score_range = (
        "scored",
        str(train_file),
        train_format,
        score_range,
    )
    return cfg.validate()


def test_stsb_and_sick_train_are_scored_pairs(data_dir: Path) -> None:
    stsb = load_training_data(_scored_config(data_dir / "senteval/STS/STSBenchmark/sts-train.csv", "stsb", [0, 5]))
    assert len(stsb) == 5749 and stsb.column_names == ["sent0", "sent1", "score"]
    assert min(stsb["score"]) == 0.0 and max(stsb["score"]) == 1.0
    sick = load_training_data(_scored_config(data_dir / "senteval/SICK/SICK_train.txt", "sick", [1, 5]))
    assert len(sick) == 4500 and min(sick["score"]) == 0.0 and max(sick["score"]) == 1.0
    # No range: the raw gold scores (SICK's relatedness lies in [1, 5]).
    raw = load_training_data(_scored_config(data_dir / "senteval/SICK/SICK_train.txt", "sick", None))
    assert min(raw["score"]) >= 1.0 and max(raw["score"]) == 5.0


def test_a_bad_stsb_row_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "sts-train.csv"
    rows = ["main-news\tf\t2012\t0001\t3.2\ta dog\ta cat", "main-news\tf\t2012\t0002\t4.8\ta man\ta car"]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"sts-train\.csv, line 2: gold score 4\.8 is outside the range \[0, 4\]"):
        load_training_data(_scored_config(path, "stsb", [0, 4]))
    path.write_text(rows[0] + "\n" + rows[1].replace("4.8", "n/a") + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"sts-train\.csv, line 2: gold score 'n/a' is not a number"):
        load_training_data(_scored_config(path, "stsb", None))


def test_scores_all_equal_are_refused_alone_and_warned_about_beside_infonce(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48: a scored file whose scores are all equal trained at loss 0.0 from step 1 without a
    word: CoSENT and AnglE rank pairs by their scores, and equal scores order no pair."""
    import logging

    path = tmp_path / "flat.csv"
    path.write_text("sent0,sent1,score\n" + "".join(f"a man {i},a dog {i},3\n" for i in range(40)), encoding="utf-8")
    cfg = _scored_config(path, "auto", [0, 5])
    flat = torch.full((4,), 0.6)  # the known answer behind the refusal: the ranking loss of equal scores is 0
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    assert score_losses.cosent_loss(a, b, flat).item() == 0.0 and score_losses.cosent_loss(a, b, flat + torch.arange(4.0)) > 0
    with pytest.raises(DataError, match=rf"{path}: every score is 0.6: the score loss ranks pairs .* \(loss 0 from step 1\)"):
        load_training_data(cfg)
    cfg.loss.score_weight = 0.5
    with caplog.at_level(logging.WARNING, logger="simcse_kit.training.wiring.inputs"):
        assert len(load_training_data(cfg)) == 40
    assert "every score is 0.6" in caplog.text and "(loss.score_weight 0.5) is 0 at every step" in caplog.text
    cfg.loss.score_weight = 0.0  # the scores are unused: nothing to say
    caplog.clear()
    load_training_data(cfg)
    assert not caplog.records
    graded = tmp_path / "graded.csv"
    graded.write_text(path.read_text().replace("a man 7,a dog 7,3", "a man 7,a dog 7,4"), encoding="utf-8")
    assert len(load_training_data(_scored_config(graded, "auto", [0, 5]))) == 40  # one pair differs: accepted


def test_the_collator_adds_one_score_per_example(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = [{"sent0": "a dog", "sent1": "a cat", "score": 0.25}, {"sent0": "a man", "sent1": "a car", "score": 1.0}]
    batch = ContrastiveCollator(tokenizer, "scored", 16)(examples)
    assert batch["input_ids"].shape[0] == 4
    assert batch["scores"].dtype == torch.float32 and batch["scores"].tolist() == [0.25, 1.0]
    assert "scores" not in ContrastiveCollator(tokenizer, "sup", 16)(examples)


# --------------------------------------------------------------------------- config


def test_the_config_names_match_the_loss_core() -> None:
    assert SCORE_LOSSES == tuple(score_losses.SCORE_LOSSES)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mode": "sup", "score_range": "[0, 5]"}, "'data.score_range' = \\[0.0, 5.0\\]: must be null unless"),
        ({"mode": "scored", "score_range": "[5, 0]"}, "'data.score_range' = \\[5.0, 0.0\\]: must be \\[low, high\\]"),
        ({"mode": "scored", "score_loss": "mse"}, "'loss.score_loss' = 'mse': must be one of \\('cosent', 'angle'\\)"),
        ({"mode": "scored", "score_weight": "1.5"}, "'loss.score_weight' = 1.5: must be in \\[0, 1\\]"),
        ({"mode": "scored", "score_scale": "0"}, "'loss.score_scale' = 0.0: must be > 0"),
        ({"mode": "scored", "queue_size": "16"}, "'loss.queue_size' = 16: must be 0 with loss.score_weight 1"),
        ({"mode": "sup", "train_format": "stsb"}, "'data.mode' = 'sup': must be 'unsup' .* or 'scored'"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, overrides: dict[str, str], message: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  mode: unsup\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_config(recipe, overrides)


# --------------------------------------------------------------------------- objective


def test_the_objective_adds_the_score_term_to_infonce() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(12, 8, generator=g, dtype=torch.float64)  # 6 pairs, example-major
    batch = {"scores": torch.tensor([0.0, 0.2, 1.0, 0.4, 0.4, 0.8])}
    a, b = rows[0::2], rows[1::2]
    cosent = score_losses.cosent_loss(a, b, batch["scores"], scale=20.0)
    angle = score_losses.angle_loss(a, b, batch["scores"], scale=7.0)
    infonce = SimCSEObjective("sup", LossConfig(temperature=0.05)).loss(rows)
    alone = SimCSEObjective("scored", LossConfig()).loss(rows, batch)
    assert alone.item() == pytest.approx(cosent.item(), rel=1e-12)
    angled = SimCSEObjective("scored", LossConfig(score_loss="angle", score_scale=7.0)).loss(rows, batch)
    assert angled.item() == pytest.approx(angle.item(), rel=1e-12)
    mixed = SimCSEObjective("scored", LossConfig(temperature=0.05, score_weight=0.3)).loss(rows, batch)
    assert mixed.item() == pytest.approx(0.7 * infonce.item() + 0.3 * cosent.item(), rel=1e-12)
    with pytest.raises(ValueError, match="needs the batch's scores"):
        SimCSEObjective("scored", LossConfig()).loss(rows)


# --------------------------------------------------------------------------- a run


def _recipe(tmp_path: Path, model_dir: Path, out: str, **train: object) -> Path:
    senteval = tmp_path / "senteval"
    if not senteval.exists():
        write_tiny_senteval(senteval)
    cfg = {
        "model": {
            "name_or_path": str(model_dir),
            "pooler": "avg",
            "mlp": "none",
            "max_seq_len": 16,
            "eval_max_seq_len": 32,
            "dropout": 0.0,  # GradCache then gives the full batch's gradients exactly
        },
        "data": {"mode": "scored", "train_file": str(write_train_data(tmp_path, "scored")), "eval_data_dir": str(senteval)},
        "loss": {"score_loss": "cosent"},
        "train": {
            "output_dir": str(tmp_path / out),
            "batch_size": 8,
            "learning_rate": 1e-3,
            "num_epochs": 4,
            "eval_steps": 0,
            "eval_at_start": False,
            "log_steps": 1,
            "seed": 3,
            "progress_bar": False,
            "final_eval": False,
            "mixed_precision": "no",
        }
        | train,
    }
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_a_scored_run_learns_and_gradcache_changes_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert main(["train", str(_recipe(tmp_path, tiny_model_dir, "plain"))]) == 0
    assert main(["train", str(_recipe(tmp_path, tiny_model_dir, "cached", grad_cache_chunk=4))]) == 0
    plain = json.loads((tmp_path / "plain" / "metrics.json").read_text())
    cached = json.loads((tmp_path / "cached" / "metrics.json").read_text())
    losses = [loss for _, loss in plain["losses"]]
    assert plain["steps"] == 16 and len(losses) == 16  # 32 pairs, batch 8, 4 epochs
    # Each epoch sees every pair once: its mean loss falls from the first epoch to the last.
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.8 * first, (first, last)
    # Dropout off: chunked encoding gives the full batch's loss and gradients, so the same run.
    assert [s for s, _ in cached["losses"]] == [s for s, _ in plain["losses"]]
    for (_, want), (_, got) in zip(plain["losses"], cached["losses"], strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    saved = yaml.safe_load((tmp_path / "cached" / "config.yaml").read_text())
    assert saved["data"]["mode"] == "scored" and saved["loss"]["score_loss"] == "cosent"


def test_the_stsb_recipe_trains_on_train_and_selects_on_dev(data_dir: Path) -> None:
    from simcse_kit.config.recipes import find_recipe

    cfg = load_config(find_recipe("scored/stsb")).check_data()
    assert cfg.data.mode == "scored" and cfg.loss.score_loss == "cosent" and cfg.loss.score_weight == 1.0
    assert Path(cfg.data.train_file).name == "sts-train.csv"
    assert Path(cfg.data.dev_file or "").name == "sts-dev.csv" and cfg.data.dev_format == "stsb"  # never sts-test.csv
    pairs = load_training_data(cfg)
    assert len(pairs) == 5749 and 0.0 <= min(pairs["score"]) and max(pairs["score"]) <= 1.0


def test_the_sentence_transformers_peer_gets_the_same_pairs_scores_and_scale(tiny_model_dir: Path) -> None:
    """benchmarks' scored rows: the peer trains on the kit's pairs and [0, 1] scores, in the columns
    sentence-transformers reads (inputs in order, ``score`` the label), with its CoSENT/AnglE at the
    recipe's scale; another scale is another run; a score loss on unscored data is refused."""
    import datasets
    from sentence_transformers import SentenceTransformer

    from benchmarks.st_peers import peer_dataset, peer_loss, run_settings

    kit = datasets.Dataset.from_dict({"sent0": ["a", "b"], "sent1": ["c", "d"], "score": [0.2, 1.0]})
    pairs = peer_dataset(kit, "cosent", "scored", seed=1)
    assert pairs.column_names == ["sentence1", "sentence2", "score"]
    assert pairs.to_dict() == {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "score": [0.2, 1.0]}
    student = SentenceTransformer(str(tiny_model_dir), device="cpu")
    cfg = RunConfig()
    cfg.loss.score_scale = 7.0
    kinds = {name: peer_loss(name, student, cfg.loss) for name in ("cosent", "angle")}
    assert {n: (type(loss).__name__, loss.scale) for n, loss in kinds.items()} == {
        "cosent": ("CoSENTLoss", 7.0), "angle": ("AnglELoss", 7.0)}  # fmt: skip
    assert run_settings(cfg, "cosent", "fp32")["score_scale"] == 7.0
    with pytest.raises(ValueError, match="train on mode scored only"):
        peer_dataset(kit, "mnrl", "scored", seed=1)
    with pytest.raises(ValueError, match="train on mode scored only"):
        peer_dataset(kit, "angle", "unsup", seed=1)
