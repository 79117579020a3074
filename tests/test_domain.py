"""Domain adaptation pieces: mixing a general corpus in, training on a scored pair file's
sentences, selecting on another dev split, and the train/domain recipes."""

from __future__ import annotations

import csv
from pathlib import Path

import datasets
import pytest
from conftest import REPO, TinyRun, toy_sentences

from simcse_kit.config import load_config
from simcse_kit.data import mix_datasets
from simcse_kit.errors import ConfigError, DataError
from simcse_kit.evaluation import DevEvaluator
from simcse_kit.training import load_training_data


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


def test_a_domain_run_trains_on_the_distinct_sentences_and_selects_on_its_dev_split(tmp_path: Path, tiny_run: TinyRun) -> None:
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
    metrics = tiny_run.train(
        "mixed-rep", **overrides, mix_file=tiny_run.folder / "train.txt", mix_ratio=0.5, word_repetition=0.32
    )
    assert metrics["steps"] == 3 * (42 // 8)  # 3 epochs of 5 full batches of the mixed set
    assert len(metrics["evals"]) >= 2 and "sts" in metrics


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
    from simcse_kit import training

    options = {"word_repetition": 0.32, "save_steps": 4}
    ref = tiny_run.train("ref", **options)
    calls, real = {"n": 0}, training.ModelEvaluator.__call__

    def crash_at_the_fourth_eval(self: training.ModelEvaluator, model: object) -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 4:  # step 9: after the checkpoint at step 8
            raise Crash
        return real(self, model)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(training.ModelEvaluator, "__call__", crash_at_the_fourth_eval)
        with pytest.raises(Crash):
            tiny_run.train("cut", **options)
    cfg = tiny_run.config("cut", **options)
    got = training.train(cfg, resume=True)
    assert got["losses"] == ref["losses"] and got["evals"] == ref["evals"]
    assert got["best_step"] == ref["best_step"] and got["sts"] == ref["sts"]
    # Off, the same run trains on other batches: the option changed what was computed.
    assert tiny_run.train("plain", save_steps=4)["losses"] != ref["losses"]
