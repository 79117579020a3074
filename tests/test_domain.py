"""Domain adaptation pieces: mixing a general corpus in, training on a scored pair file's
sentences, selecting on another dev split, and the train/domain recipes."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from conftest import REPO, TinyRun, toy_sentences
from safetensors.torch import load_file, save_file

import simcse_kit.training.wiring.run
from simcse_kit.config.run import load_config
from simcse_kit.data.mixture import mix_datasets
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation import DevEvaluator
from simcse_kit.export.card import training_rows
from simcse_kit.export.source import find_source
from simcse_kit.training.wiring.inputs import load_training_data


def corpus(prefix: str, n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"sent0": [f"{prefix} {i}" for i in range(n)]})


def test_mixing_keeps_the_domain_and_adds_the_exact_share_deterministically() -> None:
    domain, general = corpus("domain", 30), corpus("general", 100)
    mixed = mix_datasets(domain, general, 0.25, seed=1)
    texts = mixed["sent0"]
    assert len(texts) == 40 and texts[:30] == domain["sent0"]  # all 30 in-domain, 10 general = 25 %
    picked = texts[30:]
    assert len(set(picked)) == 10 and all(t.startswith("general") for t in picked)
    assert mix_datasets(domain, general, 0.25, seed=1)["sent0"] == texts  # same seed, same sample
    assert mix_datasets(domain, general, 0.25, seed=2)["sent0"][30:] != picked
    assert len(mix_datasets(domain, general, 0.0, seed=1)) == 30
    with pytest.raises(DataError, match="mix_ratio 0.9"):
        mix_datasets(domain, general, 0.9, seed=1)  # needs 270 general examples


def write_sick(path: Path, pairs: list[tuple[str, str]]) -> Path:
    lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    lines += [f"{i}\t{a}\t{b}\t{1 + i % 5}\tNEUTRAL" for i, (a, b) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_domain_run_trains_on_the_distinct_sentences_and_selects_on_its_dev_split(
    tmp_path: Path, tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    sents = toy_sentences(30)
    pairs = [(sents[i], sents[i + 1]) for i in range(20)]  # 21 distinct sentences, most in two pairs
    sick = write_sick(tmp_path / "sick_train.txt", pairs)
    dev = write_sick(tmp_path / "sick_trial.txt", [(sents[i], sents[i + 5]) for i in range(12)])
    overrides = {"train_file": sick, "train_format": "sick", "dev_file": dev, "dev_format": "sick"}
    cfg = tiny_run.config("domain", **overrides)
    assert load_training_data(cfg)["sent0"] == sents[:21]  # distinct, first-seen order, no scores
    mixed = load_training_data(tiny_run.config("mixed", **overrides, mix_file=tiny_run.folder / "train.txt", mix_ratio=0.5))
    assert len(mixed) == 42  # 21 in-domain + 21 of the 64 general sentences
    # The dev split is the SICK file, not STS-B dev.
    assert DevEvaluator(cfg.data.eval_data_dir, path=cfg.data.dev_file, fmt="sick").pairs.sentences1 == sents[:12]
    figures: dict[str, tuple] = {}

    def recorded(name: str) -> object:
        draw = getattr(simcse_kit.training.wiring.run, name)

        def record(*args: object, **kwargs: object) -> object:
            figures[name] = (args, kwargs)
            return draw(*args, **kwargs)

        return record

    for name in ("plot_training_curves", "plot_trajectory"):  # what the run's figures are drawn with
        monkeypatch.setattr(simcse_kit.training.wiring.run, name, recorded(name))
    metrics = tiny_run.train(
        "mixed-rep", **overrides, mix_file=tiny_run.folder / "train.txt", mix_ratio=0.5, word_repetition=0.32
    )
    assert metrics["steps"] == 3 * (42 // 8)  # 3 epochs of 5 full batches of the mixed set
    assert len(metrics["evals"]) >= 2 and "sts" in metrics
    # Selected on SICK trial Spearman, and named so: metrics.json, best model, card, curves.
    run = tiny_run.folder / "mixed-rep"
    assert json.loads((run / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    assert (metrics["dev_metric"], metrics["dev_label"]) == ("sick_dev", "SICK trial Spearman x 100")
    assert "best_stsb_dev" not in metrics and not any("stsb_dev" in e for e in metrics["evals"])
    assert metrics["best_dev_score"] == max(e["sick_dev"] for e in metrics["evals"])
    meta = json.loads((run / "best_model" / "simcse_config.json").read_text())
    assert (meta["dev_metric"], meta["dev_label"]) == ("sick_dev", "SICK trial Spearman x 100")
    assert (meta["step"], meta["dev_score"]) == (metrics["best_step"], metrics["best_dev_score"])
    rows = training_rows(find_source(run))
    assert f"| best SICK trial Spearman x 100 | {metrics['best_dev_score']:.2f} |" in rows and "STS-B dev" not in rows
    (_, curves), (trajectory, _) = figures["plot_training_curves"], figures["plot_trajectory"]
    assert curves["label"] == "SICK trial Spearman x 100" and trajectory[2] == "SICK trial, unsup"


def test_domain_options_are_validated(tiny_run: TinyRun) -> None:
    with pytest.raises(ConfigError, match="data.mode"):
        tiny_run.config("a", mode="sup", word_repetition=0.3)
    with pytest.raises(ConfigError, match="data.mix_file"):
        tiny_run.config("b", mix_ratio=0.3)
    with pytest.raises(ConfigError, match="data.mix_ratio"):
        tiny_run.config("c", mix_file="x.txt", mix_ratio=1.0)
    with pytest.raises(ConfigError, match="data.train_format"):
        tiny_run.config("d", train_format="tsv")
    with pytest.raises(ConfigError, match="data.word_repetition"):
        tiny_run.config("e", word_repetition=1.5)


@pytest.mark.parametrize(
    ("recipe", "train_name", "columns", "dev_name"),
    [
        ("sick", "SICK/SICK_train.txt", ("sentence_A", "sentence_B"), "SICK/SICK_trial.txt"),
        ("stsb", "STS/STSBenchmark/sts-train.csv", (5, 6), "STS/STSBenchmark/sts-dev.csv"),
    ],
)
def test_domain_recipes_read_the_domains_training_sentences(
    data_dir: Path, recipe: str, train_name: str, columns: tuple, dev_name: str
) -> None:
    cfg = load_config(REPO / "train" / "domain" / f"{recipe}.yaml", {"data_root": str(data_dir)})
    senteval = data_dir / "senteval"
    assert Path(cfg.data.train_file) == senteval / train_name and Path(cfg.data.dev_file) == senteval / dev_name
    # The expected corpus, read independently of the kit's readers: each distinct sentence once.
    with (senteval / train_name).open(encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    if isinstance(columns[0], str):
        header, rows = rows[0], rows[1:]
        columns = tuple(header.index(c) for c in columns)
    expected = {row[c].strip() for row in rows for c in columns}
    got = load_training_data(cfg)["sent0"]
    assert len(got) == len(set(got)) == len(expected) and set(got) == expected


class Crash(RuntimeError):
    pass


def test_word_repetition_run_resumes_exactly(tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repetitions are drawn from the run seed and each batch's texts, so a crash and
    ``--resume`` redraw exactly those of an uninterrupted run (the loader's order is what
    the checkpoint restores)."""
    from simcse_kit.training.wiring import run

    options = {"word_repetition": 0.32, "save_steps": 4}
    ref = tiny_run.train("ref", **options)
    calls, real = {"n": 0}, run.ModelEvaluator.__call__

    def crash_at_the_fourth_eval(self: run.ModelEvaluator, model: object) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 4:  # step 9: after the checkpoint at step 8
            raise Crash
        return real(self, model)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(run.ModelEvaluator, "__call__", crash_at_the_fourth_eval)
        with pytest.raises(Crash):
            tiny_run.train("cut", **options)
    cfg = tiny_run.config("cut", **options)
    got = run.train(cfg, resume=True)
    assert got["losses"] == ref["losses"] and got["evals"] == ref["evals"]
    assert got["best_step"] == ref["best_step"] and got["sts"] == ref["sts"]
    # Off, the same run trains on other batches: the option changed what was computed.
    assert tiny_run.train("plain", save_steps=4)["losses"] != ref["losses"]


# --------------------------------------------------------------------------- benchmarks/quality.py


def bench(name: str):  # noqa: ANN201 - a benchmark module
    """A module of ``benchmarks/`` (the repo's root on the path: ``benchmarks`` is a package)."""
    import importlib
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"benchmarks.{name}")


class DevOnly(Mapping):
    """A run's table that fails the test when anything but its dev scores is read."""

    def __init__(self, **table: float) -> None:
        self.table = table

    def __getitem__(self, key: str) -> float:
        if key not in ("best_stsb_dev", "dev_trained"):
            raise AssertionError(f"the learning-rate choice read {key!r}")
        return self.table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


def test_the_learning_rate_is_chosen_on_the_mean_dev_score_never_on_test() -> None:
    choose = bench("quality").choose_learning_rate
    # Test scores rank the rates the other way round; the best single dev run is 3e-5's;
    # the best MEAN dev is 1e-5's (87.0 against 86.9 and 86.9).
    sweep = {
        5e-6: [
            DevOnly(best_stsb_dev=86.8, dev_trained=86.0, STSBenchmark=90.0),
            DevOnly(best_stsb_dev=87.0, dev_trained=86.5, STSBenchmark=90.0),
        ],
        1e-5: [
            DevOnly(best_stsb_dev=87.1, dev_trained=87.1, STSBenchmark=80.0),
            DevOnly(best_stsb_dev=86.9, dev_trained=86.9, STSBenchmark=80.0),
        ],
        3e-5: [
            DevOnly(best_stsb_dev=87.3, dev_trained=87.3, STSBenchmark=70.0),
            DevOnly(best_stsb_dev=86.5, dev_trained=86.5, STSBenchmark=70.0),
        ],
    }
    assert choose(sweep) == 1e-5
    # Every rate keeps the untouched model (same dev score, as on SICK): the best trained checkpoint decides ...
    kept = {lr: [DevOnly(best_stsb_dev=79.8, dev_trained=t)] for lr, t in ((5e-6, 78.0), (1e-5, 79.1), (3e-5, 75.0))}
    assert choose(kept) == 1e-5
    # ... and with that tied as well, the earlier rate of the list.
    assert (
        choose({3e-5: [DevOnly(best_stsb_dev=80.0, dev_trained=70.0)], 1e-5: [DevOnly(best_stsb_dev=80.0, dev_trained=70.0)]})
        == 3e-5
    )
    with pytest.raises(ValueError, match="no learning rate"):
        choose({})


def domain_args(tmp_path: Path, **changes: object) -> argparse.Namespace:
    values = {"eval_steps": 25, "data_root": tmp_path / "data", "steps": 2, "eval_data_dir": None, "output_dir": tmp_path / "out"}
    values |= {"model": None, "transfer_kfold": 0, "transfer_teacher": False}
    return argparse.Namespace(**values | {"st_precision": "auto", "tasks": ["/rt/mrpc-paraphrase", "/rt/sick-related"]} | changes)


def test_every_row_runs_at_the_swept_learning_rate_on_the_data_root(tmp_path: Path) -> None:
    quality = bench("quality")
    args = domain_args(tmp_path)
    peer = quality.row_job("domain", "sick", "st-tsdae", 1e-5, 1, True, args)
    assert (peer.kind, peer.loss, peer.precision, peer.dev_only, peer.retrieval) == ("st", "tsdae", "auto", True, ())
    assert peer.out == str(tmp_path / "out" / "sweep" / "sick-st-tsdae" / "lr1e-05")
    kit = quality.row_job("domain", "stsb", "tau0.1", 3e-5, 2, False, args)
    assert (kit.kind, kit.seed, kit.dev_only, kit.retrieval) == ("kit", 2, False, ("/rt/mrpc-paraphrase", "/rt/sick-related"))
    assert kit.out == str(tmp_path / "out" / "stsb-tau0.1" / "lr3e-05") and kit.name == "stsb-tau0.1/lr3e-05/seed-2"
    # A job survives the trip to a worker's file.
    assert type(kit).from_json(json.dumps(dataclasses.asdict(kit))) == kit
    cfg = quality.kit_config(kit)
    assert cfg.train.learning_rate == 3e-5 and cfg.loss.temperature == 0.1 and cfg.train.max_steps == 2
    assert cfg.train.output_dir == kit.out and cfg.train.final_eval
    root = tmp_path / "data"  # every data path under --data-root, not ../shared/data
    assert Path(cfg.data.train_file) == root / "senteval" / "STS" / "STSBenchmark" / "sts-train.csv"
    assert (
        Path(cfg.data.dev_file).parent
        == Path(cfg.data.eval_data_dir) / "STS" / "STSBenchmark"
        == root / "senteval" / "STS" / "STSBenchmark"
    )
    assert not quality.kit_config(quality.row_job("domain", "sick", "domain", 1e-5, 1, True, args)).train.final_eval
    mix = quality.kit_config(quality.row_job("domain", "sick", "mix50", 1e-5, 1, False, args))
    assert Path(mix.data.mix_file) == root / "train" / "wiki1m_head.txt"


def test_the_domain_table_has_the_chosen_rate_the_seeds_and_the_verdict_chosen_on_dev() -> None:
    """report.py renders quality.py's record: the kit row is picked on dev (not the best on test)
    and compared on the domain's test column with the base and the best peer."""
    quality, report = bench("quality"), bench("report")
    scores = {"SICKRelatedness": 77.0, "avg": 78.0, "best_stsb_dev": 79.0, "retrieval:avg": 85.0}
    results = {
        "sick-base": quality.stats("sick-base", "sick", "base", {0: scores}, None),
        "sick-domain": quality.stats(
            "sick-domain",
            "sick",
            "kit",
            {1: scores | {"best_step": 25.0, "retrieval:avg": 86.0}, 2: scores | {"best_step": 0.0, "retrieval:avg": 88.0}},
            1e-5,
        ),
        # best on test, worse on dev: never the one chosen
        "sick-tau0.1": quality.stats(
            "sick-tau0.1", "sick", "kit", {1: scores | {"SICKRelatedness": 90.0, "best_stsb_dev": 1.0}}, 3e-5
        ),
        "sick-st-mnrl": quality.stats("sick-st-mnrl", "sick", "st", {1: scores | {"SICKRelatedness": 76.5}}, 1e-5),
    }
    record = {"results": results}
    rows = list(report.DOMAIN.rows(record))
    # the base trains on nothing; no row scored SentEval transfer (the column after the 7-task average)
    assert rows[0] == ["sick-base", "–", "1", "77.00", "78.00", "–", "79.00", "–", "85.00", "–"]
    old = "not counted (record predates the guard)"  # these stats carry no guard count
    assert rows[1] == [
        "sick-domain",
        "1e-05",
        "2",
        "77.00 ± 0.00",
        "78.00 ± 0.00",
        "–",
        "79.00 ± 0.00",
        "12 (25, 0)",
        "87.00 ± 1.41",
        old,
    ]
    assert report._domain_verdict([record]) == [
        "- sick: chosen on dev `sick-domain`, SICKRelatedness 77.00: +0.00 over the base, +0.50 over the best peer "
        "`sick-st-mnrl` (no interval (record predates per-pair data)); 7-task average 78.00.",
        "- `sick-st-mnrl` below the untouched base: SICK-R -0.50 (std 0.00).",
    ]


def test_retrieval_rows_and_never_snli(tmp_path: Path) -> None:
    quality = bench("quality")
    from benchmarks.st_peers import retrieval_row

    results = {"a": 90.0, "a/mrr@10": 80.0, "b": 70.0, "avg": 80.0, "c": 1.0}
    want = {"retrieval:a": 90.0, "retrieval:a/mrr@10": 80.0, "retrieval:b": 70.0, "retrieval:avg": 80.0}
    assert retrieval_row(results, ["/x/a", "/y/b"]) == want
    with pytest.raises(ValueError, match="never evaluate on SNLI"):
        quality.build_tasks(tmp_path, tmp_path, ["snli-entailment"], [str(tmp_path / "train" / "snli_triplets.csv")])


def test_sup_4509_trains_on_exactly_the_pairs_that_got_a_mined_negative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mining table: ``sup-4509`` and ``sup+mined`` read the same rows, those the miner
    kept, in the same order; ``sup`` and ``hardneg`` read every row of the data root's file."""
    from simcse_kit.tools import mining as kit_mining

    quality, report = bench("quality"), bench("report")
    triplets = tmp_path / "data" / "train" / "snli_triplets.csv"
    triplets.parent.mkdir(parents=True)
    rows = [(f"premise {i}", f"entailment {i}", f"contradiction {i}") for i in range(9)]
    with triplets.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1", "hard_neg"), *rows])
    kept = [(p, e, f"entailment {(i + 1) % 9}") for i, (p, e, _) in enumerate(rows) if i % 3]  # rows 0, 3, 6 got none

    def mine(pairs: Path, out: Path, num_negatives: int = 1) -> dict[str, int]:
        assert num_negatives == 1
        with Path(pairs).open(encoding="utf-8") as fh:
            assert list(csv.reader(fh)) == [["sent0", "sent1"], *([p, e] for p, e, _ in rows)]  # contradictions dropped
        with Path(out).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([("sent0", "sent1", "hard_neg"), *kept])
        return {"rows": len(kept), "skipped": len(rows) - len(kept)}

    monkeypatch.setattr(kit_mining, "mine_file", mine)
    mined = quality.mined_file(tmp_path / "out", triplets)
    args = domain_args(tmp_path, steps=None, mined={(1, False): mined})

    def columns(name: str) -> list[tuple[str, ...]]:
        job = quality.row_job("mining", "", name, 3e-5, 1, False, args)
        cfg = load_config(job.recipe, job.overrides)
        data = load_training_data(cfg)
        names = ("sent0", "sent1", "hard_neg") if cfg.data.mode == "hardneg" else ("sent0", "sent1")
        return list(zip(*(data[c] for c in names), strict=True))

    assert columns("sup-4509") == [(p, e) for p, e, _ in kept]
    assert columns("sup+mined") == kept
    assert columns("sup") == [(p, e) for p, e, _ in rows] and columns("hardneg") == rows
    counts = {
        n: quality.training_rows(quality.row_job("mining", "", n, 3e-5, 1, False, args)) for n in quality.TABLES["mining"].rows
    }
    assert counts == {"sup": 9, "sup-4509": 6, "sup+mined": 6, "hardneg": 9}
    table = {"avg": 78.0, "STSBenchmark": 82.0, "best_stsb_dev": 86.0, "retrieval:mrpc-paraphrase": 99.0}
    table |= {"retrieval:stsb-similar": 89.0, "retrieval:sick-related": 91.0}  # nDCG@10 90: the smoke test left out
    mined = {"avg": 78.5, "retrieval:mrpc-paraphrase": 10.0, "retrieval:stsb-similar": 88.0}
    means = {"sup": table, "sup-4509": table, "sup+mined": table | mined}
    record = {"results": {n: {"mean": m} for n, m in means.items()}}
    assert (
        report._mining_verdict([record])[0]
        == "- `sup+mined` − `sup-4509` (the same rows): +0.50 on the 7-task average, -0.50 nDCG@10 (sound tasks); "
        "no interval (record predates per-pair data)"
    )


def test_the_scores_table_trains_every_row_on_the_same_scored_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scores table: SNLI's pairs mined with 3 negatives, scored by --teacher; every row reads
    those rows, the distill rows with their scores, ``hardneg-k3`` without."""
    from simcse_kit.tools import mining as kit_mining
    from simcse_kit.tools import scoring as kit_scoring

    quality = bench("quality")
    triplets = tmp_path / "data" / "train" / "snli_triplets.csv"
    triplets.parent.mkdir(parents=True)
    with triplets.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1", "hard_neg"), *((f"p {i}", f"e {i}", f"c {i}") for i in range(6))])
    calls: list[tuple[str, object]] = []

    def mine(pairs: Path, out: Path, num_negatives: int = 1) -> dict[str, int]:
        calls.append(("mine", num_negatives))
        rows = [(f"p {i}", f"e {i}", *(f"e {(i + j) % 6}" for j in (1, 2, 3))) for i in range(6)]
        with Path(out).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([("sent0", "sent1", "hard_neg_1", "hard_neg_2", "hard_neg_3"), *rows])
        return {"rows": 6, "skipped": 0}

    def score(pairs: Path, out: Path, model: str) -> dict[str, int]:
        calls.append(("score", model))
        with Path(pairs).open(encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        extra = ["score_pos", "score_neg_1", "score_neg_2", "score_neg_3"]
        with Path(out).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([rows[0] + extra, *(r + ["0.9", "0.5", "0.4", "0.3"] for r in rows[1:])])
        return {"rows": 6, "negatives": 3}

    monkeypatch.setattr(kit_mining, "mine_file", mine)
    monkeypatch.setattr(kit_scoring, "score_file", score)
    spec = quality.TABLES["scores"]
    assert {row.mined for row in spec.rows.values()} == {3}
    mined = quality.mined_file(tmp_path / "out", triplets, 3, teacher="/teacher")
    assert calls == [("mine", 3), ("score", "/teacher")] and mined.name == "snli_pairs_mined3_scored.csv"
    args = domain_args(tmp_path, steps=None, mined={(3, False): mined}, teacher="/teacher", teacher_cache_dir=None)
    for name in spec.rows:
        job = quality.row_job("scores", "", name, 3e-5, 1, False, args)
        cfg = load_config(job.recipe, job.overrides).validate()
        data = load_training_data(cfg)
        assert data["hard_neg_3"] == [f"e {(i + 3) % 6}" for i in range(6)]
        assert (cfg.loss.distill is None) == ("scores" not in data.column_names), name
        assert cfg.loss.distill is None or data["scores"][0] == [0.9, 0.5, 0.4, 0.3]
    assert {quality.kit_config(quality.row_job("scores", "", n, 3e-5, 1, False, args)).loss.distill for n in spec.rows} == {
        None, "kl", "margin_mse"}  # fmt: skip


def test_the_negatives_table_trains_k1_and_k3_on_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negatives table: SNLI's pairs mined once with 3 negatives; ``hardneg-k3`` reads all
    three, ``hardneg-k1`` the same rows with each one's first, and the miner runs once."""
    from simcse_kit.tools import mining as kit_mining

    quality = bench("quality")
    triplets = tmp_path / "data" / "train" / "snli_triplets.csv"
    triplets.parent.mkdir(parents=True)
    with triplets.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sent0", "sent1", "hard_neg"), *((f"p {i}", f"e {i}", f"c {i}") for i in range(7))])
    calls: list[int] = []

    def mine(pairs: Path, out: Path, num_negatives: int = 1) -> dict[str, int]:
        calls.append(num_negatives)
        rows = [(f"p {i}", f"e {i}", *(f"e {(i + j) % 7}" for j in (1, 2, 3))) for i in range(7) if i != 4]  # row 4: none
        with Path(out).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([("sent0", "sent1", "hard_neg_1", "hard_neg_2", "hard_neg_3"), *rows])
        return {"rows": 6, "skipped": 1}

    monkeypatch.setattr(kit_mining, "mine_file", mine)
    spec = quality.TABLES["negatives"]
    files = {(r.mined, r.first): quality.mined_file(tmp_path / "out", triplets, r.mined, r.first) for r in spec.rows.values()}
    assert calls == [3]  # the k = 1 file is cut from the k = 3 one
    args = domain_args(tmp_path, steps=None, mined=files)
    kept = [i for i in range(7) if i != 4]
    jobs = {name: quality.row_job("negatives", "", name, 3e-5, 1, False, args) for name in ("hardneg-k1", "hardneg-k3")}
    k1, k3 = (load_training_data(load_config(job.recipe, job.overrides)) for job in jobs.values())
    assert k3["sent0"] == k1["sent0"] == [f"p {i}" for i in kept]
    assert k1["hard_neg"] == k3["hard_neg_1"] == [f"e {(i + 1) % 7}" for i in kept]
    assert k3["hard_neg_3"] == [f"e {(i + 3) % 7}" for i in kept] and "hard_neg_2" not in k1.column_names


def test_a_failed_run_stops_the_table_or_with_keep_going_is_left_out(tmp_path: Path) -> None:
    """The worker path too: a fresh interpreter per job, its output in its own log."""
    quality = bench("quality")
    bad = quality.Job(name="bogus/seed-1", kind="bogus", out=str(tmp_path / "bogus"))
    with pytest.raises(ValueError, match="unknown job kind 'bogus'"):
        quality.execute([bad], 1, 1, tmp_path / "logs")
    assert quality.execute([bad], 1, 1, tmp_path / "logs", keep_going=True) == {}
    with pytest.raises(RuntimeError, match="1 of 1 runs failed"):
        quality.execute([bad], 2, 1, tmp_path / "logs")
    assert "unknown job kind 'bogus'" in (tmp_path / "logs" / "bogus_seed-1.log").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "logs" / "bogus_seed-1.json").read_text(encoding="utf-8"))["kind"] == "bogus"


def test_the_shared_protocol_sweeps_on_dev_then_runs_every_seed_at_the_chosen_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sweep_and_run``: the rate is chosen on the sweep's dev score alone (its test column
    says otherwise), the seeds run seed by seed across rows, a row whose every sweep run
    failed is left out and named, and a row with a rate of its own runs at it unswept."""
    quality = bench("quality")
    dev = {1e-5: 80.0, 3e-5: 82.0, 1e-4: 81.0}
    batches: list[list[str]] = []

    def fake_execute(jobs, parallel, threads, logs, keep_going=False):  # noqa: ANN001, ANN202 - execute's signature
        batches.append([j.name for j in jobs])
        assert (parallel, threads, logs, keep_going) == (2, 1, tmp_path / "logs", True)
        tables = {}
        for job in jobs:
            lr = float(job.overrides.get("learning_rate", 0))
            if job.name.startswith("sweep/bad"):
                continue  # every sweep run of this row failed
            test = 90.0 if lr == 1e-4 else 70.0  # the test column favours a rate dev does not
            tables[job.name] = {"best_stsb_dev": dev.get(lr, 0.0), "test": test, "seed": float(job.seed)}
        return tables

    monkeypatch.setattr(quality, "execute", fake_execute)

    def row(name: str):  # noqa: ANN202 - a job factory
        def job(lr: float, seed: int, sweep: bool) -> object:
            prefix = "sweep/" if sweep else ""
            return quality.Job(
                name=f"{prefix}{name}/{quality.lr_tag(lr)}/seed-{seed}",
                kind="kit",
                overrides={"learning_rate": str(lr)},
                seed=seed,
                dev_only=sweep,
            )

        return job

    args = argparse.Namespace(seeds=[1, 2, 3], sweep_seed=7, parallel=2, threads=1, keep_going=True, output_dir=tmp_path)
    base = quality.Job(name="base", kind="base")
    rows = {"a": row("a"), "fixed": row("fixed"), "b": row("b"), "bad": row("bad")}
    made = quality.sweep_and_run(rows, {name: [5e-4] if name == "fixed" else list(dev) for name in rows}, args, [base])
    assert made.chosen == {"a": 3e-5, "fixed": 5e-4, "b": 3e-5}
    assert [n for n in batches[0] if n.startswith("sweep/a/")] == [f"sweep/a/lr{lr:.0e}/seed-7" for lr in dev]
    assert not [n for n in batches[0] if "fixed" in n] and len(batches[0]) == 9
    chosen = (("a", "3e-05"), ("fixed", "5e-04"), ("b", "3e-05"))
    assert batches[1] == ["base"] + [f"{r}/lr{lr}/seed-{s}" for s in (1, 2, 3) for r, lr in chosen]
    assert sorted(made.rows) == ["a", "b", "fixed"] and list(made.rows["a"]) == [1, 2, 3]
    assert made.rows["b"][2]["seed"] == 2.0 and made.extra == {"base": {"best_stsb_dev": 0.0, "test": 70.0, "seed": 0.0}}
    assert made.lost == ["sweep of bad"] and set(made.sweep["a"]) == set(dev)


def test_a_finished_run_is_reused_only_with_the_same_config(tmp_path: Path) -> None:
    """What lets a stopped table continue: the run folder's config.yaml must match the job's."""
    quality = bench("quality")
    from simcse_kit.config.run import save_config

    job = quality.Job(name="x", kind="kit", recipe=str(REPO / "train" / "domain" / "sick.yaml"), out=str(tmp_path))
    cfg = quality.kit_config(job)
    folder = tmp_path / "seed-42"
    folder.mkdir()
    save_config(cfg, folder / "config.yaml")
    quality.check_same_run(cfg, folder)  # the same: reused
    other = quality.kit_config(dataclasses.replace(job, overrides={"learning_rate": "1e-4"}))
    with pytest.raises(ConfigError, match=r"another config \(train.learning_rate"):
        quality.check_same_run(other, folder)


def test_the_teacher_table_has_its_rows_on_one_protocol(tmp_path: Path) -> None:
    quality = bench("quality")
    args = domain_args(tmp_path, teacher="/models/mpnet", teacher_cache_dir=tmp_path / "cache")
    jobs = {row: quality.row_job("teacher", "sick", row, 3e-5, 2, False, args) for row in quality.TABLES["teacher"].rows}
    assert {r: (j.kind, Path(j.recipe).parent.name, j.loss) for r, j in jobs.items()} == {
        "kit-unsup": ("kit", "domain", ""),
        "kit-similarity": ("kit", "teacher", ""),
        "kit-embedding": ("kit", "teacher", ""),
        "kit-similarity+simcse": ("kit", "teacher", ""),
        "st-mse": ("st", "teacher", "mse"),
    }
    assert all(j.retrieval == ("/rt/mrpc-paraphrase", "/rt/sick-related") and j.seed == 2 for j in jobs.values())
    assert "teacher" not in jobs["kit-unsup"].overrides  # plain SimCSE: no teacher loaded
    loss = {r: quality.kit_config(j).loss for r, j in jobs.items() if j.kind == "kit"}
    assert loss["kit-unsup"].teacher is None
    assert (loss["kit-similarity"].teacher, loss["kit-similarity"].teacher_loss) == ("/models/mpnet", "similarity")
    assert loss["kit-embedding"].teacher_loss == "embedding" and loss["kit-similarity+simcse"].teacher_weight == 0.5
    assert Path(loss["kit-similarity"].teacher_cache_dir) == tmp_path / "cache"
    assert jobs["st-mse"].overrides["teacher"] == "/models/mpnet"
    sweep = quality.row_job("teacher", "stsb", "kit-embedding", 1e-4, 1, True, args)
    assert sweep.dev_only and sweep.retrieval == ()
    assert sweep.out == str(tmp_path / "out" / "sweep" / "stsb-kit-embedding" / "lr1e-04")


def test_the_tables_transfer_column_scores_each_seeds_model_once_never_a_sweep_run(
    tmp_path: Path, tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--transfer-kfold K``: each seed's run (never a dev-only sweep run) and each untouched model get the SentEval
    transfer tasks at K folds, as ``simcse-kit transfer`` scores them, under ``transfer:<task>`` (the column reads
    ``transfer:avg``), cached beside the run with its folds; a peer run with another K is not reused."""
    from test_evaluation_transfer import write_tiny_senteval

    from benchmarks.st_peers import run_settings, training_settings
    from simcse_kit.evaluation import TransferEvaluator
    from simcse_kit.model.inference import load_encoder

    quality = bench("quality")
    args = domain_args(tmp_path, transfer_kfold=5)
    assert quality.row_job("domain", "sick", "domain", 1e-5, 1, False, args).transfer == 5
    assert quality.row_job("domain", "sick", "domain", 1e-5, 1, True, args).transfer == 0  # dev only
    job = quality.row_job("domain", "sick", "st-mnrl", 1e-5, 1, False, args)
    assert job.transfer == 5 and type(job).from_json(json.dumps(dataclasses.asdict(job))) == job
    cfg = quality.job_config(job)
    # The folds are not a training setting: a peer run asked for them later is scored from its kept weights
    # (test_a_finished_peer_run_asked_for_transfer_scores_is_scored_from_its_kept_weights_not_retrained).
    settings = run_settings(cfg, "mnrl", "fp32")
    assert "transfer_kfold" not in settings and training_settings(settings | {"transfer_kfold": 5}) == settings

    tiny_run.train("run", max_steps=2, eval_steps=2, save_steps=0)
    model, senteval = tiny_run.folder / "run" / "best_model", write_tiny_senteval(tmp_path / "senteval")
    row = quality.score_transfer(model, senteval, 3, tmp_path / "scored")
    want = TransferEvaluator(senteval, kfold=3)(load_encoder(str(model)).encode)
    assert row == {f"transfer:{k}": v for k, v in want.items()} and "transfer:avg" in row

    def rescored(*_: object) -> dict[str, float]:
        raise AssertionError("scored again")

    monkeypatch.setattr(quality, "transfer_row", rescored)
    assert quality.score_transfer(model, senteval, 3, tmp_path / "scored") == row  # cached
    with pytest.raises(AssertionError, match="scored again"):
        quality.score_transfer(model, senteval, 5, tmp_path / "scored")  # other folds: scored afresh
    # A cache from before the probe took unit vectors (no "normalize" key) held a kit folder's raw-vector scores.
    cache = tmp_path / "scored" / "transfer.json"
    saved = json.loads(cache.read_text())
    assert saved["normalize"] is True
    cache.write_text(json.dumps({k: v for k, v in saved.items() if k != "normalize"}))
    with pytest.raises(AssertionError, match="scored again"):
        quality.score_transfer(model, senteval, 3, tmp_path / "scored")
    # Nor one from before the probe batched longest first (no "batches" key): its sentences were batched alphabetically.
    assert saved["batches"] == "longest_first"
    cache.write_text(json.dumps({k: v for k, v in saved.items() if k != "batches"}))
    with pytest.raises(AssertionError, match="scored again"):
        quality.score_transfer(model, senteval, 3, tmp_path / "scored")

    # A run is finished (no worker started for it) only once its transfer scores at these folds are cached:
    # otherwise this coordinating process would score every model in turn.
    base = quality.Job("base", "base", out=str(tmp_path / "base"), model=str(model), eval_data_dir=str(senteval), transfer=3)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "metrics.json").write_text("{}")
    assert not quality.finished(base)
    monkeypatch.undo()
    quality.score_transfer(model, senteval, 3, tmp_path / "base")
    assert quality.finished(base) and not quality.finished(dataclasses.replace(base, transfer=5))
    assert quality.finished(dataclasses.replace(base, transfer=0))


def test_a_peer_seed_that_kept_the_untouched_model_takes_the_bases_transfer_scores() -> None:
    """Such a seed is not scored in its worker (``st_peers.st_train``): the table fills in the untouched model's
    transfer columns, and nothing else of its row; a trained seed keeps its own."""
    quality = bench("quality")
    base = {"avg": 78.0, "transfer:avg": 85.0, "transfer:MR": 77.0}
    kept, trained = {"best_step": 0, "avg": 78.0}, {"best_step": 50, "avg": 79.0, "transfer:avg": 84.0}
    made = quality.TableResults(sweep={}, chosen={}, rows={"st-mse": {1: kept, 2: trained}}, extra={"base": base}, lost=[])
    quality.fill_kept_base_transfer(made)
    assert made.rows["st-mse"][1] == {"best_step": 0, "avg": 78.0, "transfer:avg": 85.0, "transfer:MR": 77.0}
    assert made.rows["st-mse"][2] == {"best_step": 50, "avg": 79.0, "transfer:avg": 84.0}


def test_a_kit_seed_that_kept_the_untouched_model_takes_the_bases_transfer_scores_only_as_the_same_encoder(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A kit run whose dev selection kept step 0 saved the base's weights: pooled as the base model's own folder
    pools them (mean, then unit length as sentence-transformers' Normalize), it is the base's encoder and takes the
    base's transfer scores, scored once (no worker owes them); pooled otherwise (CLS) it is another encoder and is
    probed itself, as is a run with other weights."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    quality = bench("quality")
    base = tmp_path / "st-base"
    transformer = modules.Transformer(str(tiny_model_dir))
    pooling = modules.Pooling(transformer.get_word_embedding_dimension(), "mean")
    SentenceTransformer(modules=[transformer, pooling, modules.Normalize()], device="cpu").save(str(base))
    run = TinyRun(tmp_path, base)
    # A rate far too high: every evaluation after step 0 scores below it, and the run keeps the untouched weights.
    for pooler in ("avg", "cls"):
        assert run.train(pooler, max_steps=4, eval_steps=2, save_steps=0, learning_rate=1.0, pooler=pooler)["best_step"] == 0
    assert quality.takes_base_transfer(tmp_path / "avg", base)
    assert not quality.takes_base_transfer(tmp_path / "cls", base)
    assert quality.encodes_as(tmp_path / "avg" / "best_model", tmp_path / "avg" / "best_model")
    metrics = tmp_path / "avg" / "metrics.json"
    done = json.loads(metrics.read_text())
    metrics.write_text(json.dumps(done | {"best_step": 2}))
    assert not quality.takes_base_transfer(tmp_path / "avg", base)  # a trained step kept: probed itself
    metrics.write_text(json.dumps(done))
    # Other weights, whatever its metrics say: another encoder.
    weights = tmp_path / "avg" / "best_model" / "model.safetensors"
    state = load_file(weights)
    name = next(k for k in state if k.endswith("word_embeddings.weight"))
    save_file(state | {name: state[name] + 0.01 * torch.randn_like(state[name])}, weights)
    assert not quality.takes_base_transfer(tmp_path / "avg", base)


def test_a_peer_seed_that_kept_the_untouched_model_is_not_retrained_for_its_transfer_scores(tmp_path: Path) -> None:
    """A finished peer run asked for ``--transfer-kfold`` scores later is not finished (its worker scores its kept
    model) unless it holds them at these folds, or kept the untouched model: the table fills in the base's scores
    (``fill_kept_base_transfer``). Settings of runs made when the folds were among them still match. Scores made
    before the probe batched longest first (no ``transfer_batches``) are owed again."""
    from benchmarks.st_peers import TRANSFER_BATCHES, run_settings

    quality = bench("quality")
    args = domain_args(tmp_path, transfer_kfold=5)
    job = quality.row_job("domain", "sick", "st-mnrl", 1e-5, 1, False, args)
    cfg = quality.job_config(job, {"output_dir": job.out})
    done = Path(job.out) / f"seed-{job.seed}" / "metrics.json"
    done.parent.mkdir(parents=True)
    settings = run_settings(cfg, job.loss, job.precision, job.retrieval, job.dev_only)

    def made(best_step: int, scored: int, batches: str | None = TRANSFER_BATCHES, **extra: Any) -> bool:
        metrics = {"best_step": best_step, "settings": settings | extra}
        metrics |= {"transfer": {"transfer:avg": 80.0}, "transfer_kfold": scored} if scored else {}
        metrics |= {"transfer_batches": batches} if scored and batches else {}
        done.write_text(json.dumps(metrics))
        return quality.finished(job)

    assert made(50, 5) and made(0, 0) and made(0, 10)  # scored at these folds; kept the untouched model
    assert not made(50, 0) and not made(50, 10)  # trained, not scored at these folds: its worker scores them
    assert not made(50, 5, batches=None) and made(0, 5, batches=None)  # batched alphabetically: owed again
    old = {"best_step": 50, "settings": settings | {"transfer_kfold": 5}, "transfer": {"transfer:avg": 80.0}}
    done.write_text(json.dumps(old | {"transfer_batches": TRANSFER_BATCHES}))  # made when the folds were a setting
    assert quality.finished(job) and not quality.finished(dataclasses.replace(job, transfer=10))
    assert not made(50, 5, precision="bf16")  # another setting: no reuse


def test_a_finished_peer_run_asked_for_transfer_scores_is_scored_from_its_kept_weights_not_retrained(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trained peer seed keeps its best weights beside metrics.json; asked for transfer scores later, ``run_st``
    scores those weights (the same row as scoring the trained model itself) and trains nothing; the scores are kept
    with their folds. A run made before the weights were kept is trained again."""
    from sentence_transformers import SentenceTransformer
    from test_evaluation_transfer import write_tiny_senteval

    from benchmarks import st_peers

    quality = bench("quality")
    job = quality.row_job("domain", "sick", "st-mnrl", 1e-5, 1, False, domain_args(tmp_path))
    cfg = quality.job_config(job)
    senteval = write_tiny_senteval(tmp_path / "senteval")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name_or_path=str(tiny_model_dir)),
                              data=dataclasses.replace(cfg.data, eval_data_dir=str(senteval)))  # fmt: skip
    trained: list[Any] = []

    def fake_train(*_: object) -> dict[str, Any]:  # the weights a run's dev selection kept: not the untouched ones
        model = SentenceTransformer(str(tiny_model_dir), device="cpu")
        torch.manual_seed(len(trained))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        trained.append(model)
        kept = tmp_path / f"kept-{len(trained)}"
        kept.mkdir()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, kept / st_peers.BEST_STATE)
        (kept / st_peers.PREDICTIONS).write_bytes(b"pairs")
        return {"best_step": 2, "best_stsb_dev": 70.0, "evals": [(0, 60.0), (2, 70.0)], "train_seconds": 1.0,
                "sts": {"avg": 50.0}, "retrieval": {}, "kept_dir": str(kept)}  # fmt: skip

    monkeypatch.setattr(st_peers, "st_train", fake_train)
    out, seed = tmp_path / "peer", tmp_path / "peer" / "seed-1"
    row = st_peers.run_st(cfg, [1], "mnrl", "fp32", out)[1]
    assert len(trained) == 1 and "transfer:avg" not in row and (seed / st_peers.BEST_STATE).is_file()
    eval_len = cfg.model.eval_max_seq_len
    want = st_peers.transfer_row(st_peers.encoder(trained[0], eval_len, eval_len), str(senteval), 3)
    row = st_peers.run_st(cfg, [1], "mnrl", "fp32", out, transfer=3)[1]
    assert len(trained) == 1 and row["avg"] == 50.0  # nothing retrained
    assert {k: v for k, v in row.items() if k.startswith("transfer:")} == want and "transfer:avg" in want
    saved = json.loads((seed / "metrics.json").read_text())
    assert saved["transfer_kfold"] == 3 and saved["transfer_batches"] == st_peers.TRANSFER_BATCHES

    def rescored(*_: object) -> dict[str, float]:
        raise AssertionError("scored again")

    monkeypatch.setattr(st_peers, "rescore_transfer", rescored)
    assert st_peers.run_st(cfg, [1], "mnrl", "fp32", out, transfer=3)[1] == row  # kept with its folds
    (seed / "metrics.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "transfer_batches"}))
    with pytest.raises(AssertionError, match="scored again"):  # batched alphabetically, before 2026-12
        st_peers.run_st(cfg, [1], "mnrl", "fp32", out, transfer=3)
    (seed / "metrics.json").write_text(json.dumps(saved))
    assert "transfer:avg" not in st_peers.run_st(cfg, [1], "mnrl", "fp32", out)[1] and len(trained) == 1
    (seed / st_peers.BEST_STATE).unlink()  # as a run made before the weights were kept
    with pytest.raises(AssertionError, match="scored again"):
        st_peers.run_st(cfg, [1], "mnrl", "fp32", out, transfer=5)
    assert len(trained) == 2 and (seed / st_peers.BEST_STATE).is_file()  # trained again, its weights kept


def test_the_benchmarks_dev_curve_reads_the_metric_a_run_names() -> None:
    """A SICK-selected run's evaluations hold ``sick_dev``; a folder written before the
    metric was named holds ``stsb_dev``: both give the trained checkpoints' best and last."""
    from benchmarks.st_peers import dev_curve

    scores = [(0, 70.0), (2, 74.0), (4, 72.0)]
    sick = {"dev_metric": "sick_dev", "evals": [{"step": s, "sick_dev": v, "alignment": 0.1} for s, v in scores]}
    older = {"best_stsb_dev": 74.0, "evals": [{"step": s, "stsb_dev": v} for s, v in scores]}
    assert dev_curve(sick) == dev_curve(older) == {"dev_trained": 74.0, "dev_end": 72.0}


def test_a_run_stopped_before_its_final_sts_table_is_scored_from_its_best_model_on_resume(
    tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit writes metrics.json before the final STS table; a table stopped there (a killed worker) kept a run
    with a best model and no ``sts``. Such a run is not finished: its table is scored from the best model, the same
    table the kit writes (to float noise), into its metrics.json with the per-pair cosines; a full run is read as is."""
    quality = bench("quality")
    tiny_run.train("seed-1", max_steps=2, eval_steps=2, save_steps=0)
    folder = tiny_run.folder / "seed-1"
    metrics = json.loads((folder / "metrics.json").read_text())
    want = metrics.pop("sts")
    job = quality.Job(name="x", kind="kit", seed=1, out=str(tiny_run.folder))
    assert quality.finished(job) and not quality.lacks_table(folder)
    (folder / "metrics.json").write_text(json.dumps(metrics))  # as the stop left it
    assert quality.lacks_table(folder) and not quality.finished(job)
    cfg = tiny_run.config("seed-1")
    got = quality.table_owed(folder, cfg)["sts"]
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=1e-4) for k in want)
    assert json.loads((folder / "metrics.json").read_text())["sts"] == got and (folder / quality.PREDICTIONS).is_file()
    assert quality.finished(job)

    def rescored(*_: object) -> dict[str, float]:
        raise AssertionError("scored again")

    monkeypatch.setattr(quality, "kit_sts_pairs", rescored)
    assert quality.table_owed(folder, cfg)["sts"] == got


def test_the_benchmarks_score_a_prompted_run_as_the_kit_scored_its_final_table(tiny_run: TinyRun) -> None:
    """The per-pair cosines the tables' intervals are drawn from come from the run's best model read as the kit
    reads it: with the query prompt it was saved with. Without the prompt the benchmark scored another model."""
    from simcse_kit.evaluation import STSEvaluator
    from simcse_kit.model.inference import load_encoder

    quality = bench("quality")
    prompts = "{query: 'query: ', document: 'passage: '}"
    tiny_run.train("seed-1", max_steps=2, eval_steps=2, save_steps=0, prompts=prompts)
    folder = tiny_run.folder / "seed-1"
    want = json.loads((folder / "metrics.json").read_text())["sts"]
    cfg = tiny_run.config("seed-1", prompts=prompts)
    got = quality.kit_sts_pairs(folder, cfg)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=1e-4) for k in want)
    assert (folder / quality.PREDICTIONS).is_file()
    unprompted = STSEvaluator(cfg.data.eval_data_dir)(load_encoder(folder / "best_model").encode)
    assert any(abs(unprompted[k] - want[k]) > 1e-3 for k in want), "the prompt changes no score: the test shows nothing"
