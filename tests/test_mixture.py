"""Several datasets in one run (``data.datasets``): the batch sampler's tables, one dataset per
batch, coverage over processes, each batch in its dataset's mode, the single-file order kept,
the recipe's errors, and ``--resume`` mid-epoch ending as an uninterrupted run."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from accelerate.data_loader import BatchSamplerShard
from conftest import REPO, TinyRun, toy_sentences
from safetensors.torch import load_file
from test_resume import ENV, kill_when, newest_step, run_metrics, train_cmd

from simcse_kit.config.run import load_config
from simcse_kit.data.mixture import DATASET_KEY, Mixture, MixtureBatches, MixtureCollator, batches_per_dataset
from simcse_kit.errors import ConfigError

SIZES = [40, 24, 17]  # full batches of 8: 5, 3, 2 (0, 0 and 1 example left over)

# Hand-computed: batches per dataset an epoch at batch size 8.
#   proportional: every full batch, n // 8.
#   round_robin:  min(5, 3, 2) = 2 from each.
#   weighted 1:1:2 of the 10 proportional batches: quotas 2.5, 2.5, 5 -> 2, 2, 5 and the one
#   left to the largest remainder, the tie (0.5, 0.5) to the earlier dataset: 3, 2, 5.
TABLE = {"proportional": [5, 3, 2], "round_robin": [2, 2, 2], "weighted": [3, 2, 5]}
WEIGHTS = [1.0, 1.0, 2.0]


def dataset_of(index: int) -> int:
    return sum(index >= offset for offset in (40, 64))


@pytest.mark.parametrize("sampling", list(TABLE))
def test_batches_per_dataset_match_the_hand_computed_table(sampling: str) -> None:
    weights = WEIGHTS if sampling == "weighted" else None
    assert batches_per_dataset(SIZES, 8, sampling, weights) == TABLE[sampling]


@pytest.mark.parametrize("sampling", list(TABLE))
def test_every_batch_is_from_one_dataset_and_each_epoch_counts_as_the_table(sampling: str) -> None:
    weights = WEIGHTS if sampling == "weighted" else None
    sampler = MixtureBatches(SIZES, 8, 1, sampling, torch.Generator().manual_seed(3), weights)
    assert len(sampler) == sum(TABLE[sampling])
    epochs = [list(sampler) for _ in range(2)]
    assert epochs[0] != epochs[1]  # a fresh order each epoch
    for batches in epochs:
        owners = [{dataset_of(i) for i in batch} for batch in batches]
        assert all(len(o) == 1 and len(b) == 8 for o, b in zip(owners, batches, strict=True))
        assert all(len(set(batch)) == 8 for batch in batches)  # no example twice in a batch
        counts = Counter(next(iter(o)) for o in owners)
        assert [counts[d] for d in range(3)] == TABLE[sampling]
        seen = Counter(i for batch in batches for i in batch)
        if sampling != "weighted":  # each example at most once an epoch
            assert max(seen.values()) == 1
        else:  # dataset 2 (17 examples, 2 full batches) is asked for 5: gone through 3 times
            assert max(seen[i] for i in range(64, 81)) == 3
    if sampling == "round_robin":
        assert [dataset_of(b[0]) for b in epochs[0]] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("sampling", ["proportional", "round_robin"])
def test_two_processes_share_each_batch_and_see_each_example_once(sampling: str) -> None:
    """Accelerate's own batch sharding over two processes (two samplers seeded alike, as
    every process is): at each step both train one dataset, their halves make up the one
    process run's global batch, and an epoch covers each example at most once: exactly
    the first ``batches x 8`` of each dataset's permutation."""
    one = list(MixtureBatches(SIZES, 8, 1, sampling, torch.Generator().manual_seed(5)))
    ranks = [
        list(BatchSamplerShard(MixtureBatches(SIZES, 8, 2, sampling, torch.Generator().manual_seed(5)), 2, rank))
        for rank in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    seen: Counter[int] = Counter()
    for batch, first, second in zip(one, *ranks, strict=True):
        assert len(first) == len(second) == 4
        assert {dataset_of(i) for i in first + second} == {dataset_of(batch[0])}
        assert first + second == batch
        seen.update(first + second)
    assert max(seen.values()) == 1
    per_dataset = Counter(dataset_of(i) for i in seen)
    assert [per_dataset[d] for d in range(3)] == [8 * b for b in TABLE[sampling]]


def test_a_mixture_indexes_its_datasets_as_one_and_refuses_a_mixed_batch() -> None:
    import datasets

    parts = {
        "wiki": datasets.Dataset.from_dict({"sent0": ["a", "b", "c"]}),
        "nli": datasets.Dataset.from_dict({"sent0": ["p", "q"], "sent1": ["e", "f"], "hard_neg": ["x", "y"]}),
    }
    mixture = Mixture(parts)
    assert len(mixture) == 5 and mixture.locate(3) == (1, 0)
    assert mixture.__getitems__([4, 3]) == [
        {"sent0": "q", "sent1": "f", "hard_neg": "y", DATASET_KEY: "nli"},
        {"sent0": "p", "sent1": "e", "hard_neg": "x", DATASET_KEY: "nli"},
    ]
    with pytest.raises(ValueError, match="mixes datasets"):
        mixture.__getitems__([2, 3])
    collate = MixtureCollator({"wiki": lambda ex: {"n": torch.tensor(len(ex))}, "nli": lambda ex: {"n": torch.tensor(-1)}})
    assert collate(mixture.__getitems__([0, 1])) == {"n": torch.tensor(2), DATASET_KEY: "wiki"}
    with pytest.raises(ValueError, match="one dataset"):
        collate([mixture[0], mixture[3]])


# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("processes", [1, 2])
def test_a_single_file_run_keeps_its_batch_order(tiny_run: TinyRun, processes: int) -> None:
    """A recipe without data.datasets, a list of one dataset, draws exactly the order a plain
    ``DataLoader(shuffle=True, drop_last=True)`` drew, as the kit did before every run became a
    list: per epoch the DataLoader iterator's base seed, one ``randperm`` cut into per-process
    batches (those short of a whole global batch dropped, as Accelerate's sharding drops
    them), then RandomSampler's discarded second draw, all from the seeded generator."""
    from torch.utils.data import DataLoader, RandomSampler

    from simcse_kit.training.wiring.inputs import load_checked_tokenizer, load_training_sets
    from simcse_kit.training.wiring.loaders import make_loader

    cfg = tiny_run.config("order", batch_size=6)
    sets = load_training_sets(cfg)
    (dataset,) = sets.values()
    texts = list(dataset["sent0"])
    loader = make_loader(cfg, sets, load_checked_tokenizer(cfg), processes)
    loader.collate_fn = lambda examples: [texts.index(e["sent0"]) for e in examples]
    got = [batch for _ in range(2) for batch in loader]
    # The same by hand, and by torch's own shuffled loader.
    generator, n, per, want = torch.Generator().manual_seed(cfg.train.seed), len(texts), 6 // processes, []
    for _ in range(2):
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        order = torch.randperm(n, generator=generator).tolist()
        want += [order[i : i + per] for i in range(0, n - n % 6, per)]
        torch.randperm(n, generator=generator)
    plain = DataLoader(
        range(n),
        batch_size=per,
        sampler=RandomSampler(range(n), generator=torch.Generator().manual_seed(cfg.train.seed)),
        drop_last=True,
        collate_fn=list,
    )
    plain.generator = plain.sampler.generator  # type: ignore[attr-defined]  # the base seed from it too, as the kit's
    whole = (n // 6) * processes  # the per-process batches of whole global batches
    torch_order = [batch for _ in range(2) for batch in list(plain)[:whole]]
    assert len(set(texts)) == n and got == want == torch_order


def mixture_recipe(tiny_run: TinyRun, name: str, datasets: object, **train: object) -> Path:
    """The tiny recipe with ``data.datasets``: ``train.txt`` (64 sentences, unsup) and
    ``nli.csv`` (32 triplets, hardneg) beside it."""
    recipe = tiny_run.recipe(name, **train)
    sents = toy_sentences(100)
    nli = tiny_run.folder / "nli.csv"
    nli.write_text("sent0,sent1,hard_neg\n" + "".join(f"{sents[i]},{sents[i]} .,{sents[i + 50]}\n" for i in range(32)))
    raw = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    raw["data"]["datasets"] = datasets
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return recipe


TWO = {"wiki": {"file": "train.txt"}, "nli": {"file": "nli.csv", "mode": "hardneg"}}


def test_each_batch_trains_in_its_datasets_mode(tiny_run: TinyRun, tiny_model_dir: Path) -> None:
    """Through the run's loader: an unsup batch has 2 rows an example, a hardneg batch 3 and
    one with 2 mined negatives 4, and the mixture's loss of each is that mode's objective's
    (not the other reading of the rows)."""
    from transformers import AutoTokenizer

    from simcse_kit.training.objective.mixture import MixtureObjective
    from simcse_kit.training.objective.objectives import SimCSEObjective
    from simcse_kit.training.wiring.inputs import load_training_sets
    from simcse_kit.training.wiring.loaders import make_loader

    sents = toy_sentences(60)
    rows = "".join(f"{sents[i]},{sents[i]} .,{sents[i + 20]},{sents[i + 40]}\n" for i in range(16))
    (tiny_run.folder / "mined.csv").write_text("sent0,sent1,hard_neg_1,hard_neg_2\n" + rows, encoding="utf-8")
    three = TWO | {"mined": {"file": "mined.csv", "mode": "hardneg"}}
    cfg = load_config(mixture_recipe(tiny_run, "modes", three))
    sets = load_training_sets(cfg)
    loader = make_loader(cfg, sets, AutoTokenizer.from_pretrained(tiny_model_dir), 1)
    own = {
        "wiki": SimCSEObjective("unsup", cfg.loss),
        "nli": SimCSEObjective("hardneg", cfg.loss),
        "mined": SimCSEObjective("hardneg", cfg.loss, negatives=2),
    }
    objective = MixtureObjective(own)
    views = {"wiki": 2, "nli": 3, "mined": 4}
    seen: Counter[str] = Counter()
    torch.manual_seed(0)
    for batch in loader:
        name = batch[DATASET_KEY]
        assert batch["input_ids"].shape[0] == 8 * views[name]
        embeddings = torch.randn(8 * views[name], 8)
        want = own[name].loss(embeddings, batch)
        other = SimCSEObjective("sup", cfg.loss).loss(embeddings[: 16 if name == "wiki" else 24], batch)  # read as pairs
        assert torch.equal(objective.loss(embeddings, batch), want) and not torch.isclose(want, other)
        seen[name] += 1
    assert seen == {"wiki": 8, "nli": 4, "mined": 2}
    report = objective.tally.report()
    assert report["wiki"]["examples"] == 64 and report["nli"]["examples"] == 32 and report["mined"]["batches"] == 2
    assert objective.metrics()["nli/examples"] == 32.0


def test_a_teacher_and_a_guide_cover_every_dataset(tiny_run: TinyRun, tiny_model_dir: Path, tmp_path: Path) -> None:
    """One table of every dataset's distinct sentences (first-seen: wiki's, then the triplets'
    columns); a batch of either dataset gets the teacher and guide terms a one-dataset run of the
    same examples gets from a table of its own sentences (its rows elsewhere in the shared table);
    a run on both reports the shared table and the guide's count."""
    from dataclasses import replace

    from test_teacher import save_teacher
    from transformers import AutoTokenizer

    from simcse_kit.data.mixture import Mixture
    from simcse_kit.data.readers import negatives_of
    from simcse_kit.training.objective.objectives import SimCSEObjective
    from simcse_kit.training.wiring.inputs import load_guide, load_teacher, load_training_sets, training_texts
    from simcse_kit.training.wiring.loaders import make_collator, make_loader
    from simcse_kit.training.wiring.run import train

    teacher, guide = save_teacher(tmp_path / "teacher", hidden=16), save_teacher(tmp_path / "guide", hidden=24)
    opts = {"teacher": str(teacher), "guide": str(guide), "teacher_weight": "0.5"}
    cfg = load_config(mixture_recipe(tiny_run, "taught", TWO), opts | {"teacher_cache_dir": str(tmp_path / "cache")})
    sets = load_training_sets(cfg)
    texts = training_texts(cfg, sets)
    nli = sets["nli"]
    assert texts == list(dict.fromkeys([*sets["wiki"]["sent0"], *nli["sent0"], *nli["sent1"], *nli["hard_neg"]]))
    shared = load_teacher(cfg, texts)
    assert shared is not None
    guided = load_guide(cfg, texts, shared[1])
    assert guided is not None
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loader = make_loader(cfg, sets, tokenizer, 1, teacher_index=shared[1].index, guide_index=guided[1].index)
    mixture = Mixture(sets)
    for name, mode, start in (("wiki", "unsup", 0), ("nli", "hardneg", len(sets["wiki"]))):
        examples = mixture.__getitems__(list(range(start, start + 8)))
        batch = loader.collate_fn(examples)
        alone = replace(cfg, data=replace(cfg.data, mode=mode, datasets=None))
        own_texts = training_texts(alone, {alone.data.training_sets()[0].name: sets[name]})
        own = load_teacher(alone, own_texts)
        assert own is not None
        own_guide = load_guide(alone, own_texts, own[1])
        assert own_guide is not None
        k = negatives_of(sets[name].column_names)
        collate = make_collator(alone, tokenizer, mode, None, k, own[1].index, own_guide[1].index)
        single = collate(examples)
        if name == "nli":  # its sentences sit after wiki's in the shared table
            assert not torch.equal(batch["teacher_rows"], single["teacher_rows"])
        embeddings = torch.randn(batch["input_ids"].shape[0], 32, generator=torch.Generator().manual_seed(start))
        ours = SimCSEObjective(mode, cfg.loss, teacher=shared[0], negatives=k, guide=guided[0])
        theirs = SimCSEObjective(mode, cfg.loss, teacher=own[0], negatives=k, guide=own_guide[0])
        assert torch.allclose(ours.loss(embeddings, batch), theirs.loss(embeddings, single), rtol=1e-5, atol=1e-6)
        assert ours.last_terms["teacher_loss"] > 0 and ours.guided.total == theirs.guided.total
    short = mixture_recipe(tiny_run, "run", TWO, max_steps=4, eval_steps=0, save_steps=0, final_eval=False)
    metrics = train(load_config(short, opts | {"teacher_cache_dir": str(tmp_path / "cache")}))
    assert metrics["teacher"]["sentences"] == len(texts) and metrics["teacher"]["cache_hit"]
    assert metrics["guide"]["sentences"] == len(texts) and metrics["guide"]["masked"] >= 0
    assert set(metrics["datasets"]) == {"wiki", "nli"}


def test_a_bad_dataset_entry_names_the_recipe_and_the_entry(tiny_run: TinyRun) -> None:
    from simcse_kit.training.wiring.run import build_run

    bad = mixture_recipe(tiny_run, "bad", {"wiki": {"file": "train.txt"}, "nli": {"file": "nli.csv", "mode": "scored"}})
    with pytest.raises(ConfigError, match=rf"{bad}: config key 'data.datasets' entry 'nli': mode 'scored': must be one of"):
        load_config(bad)
    typo = mixture_recipe(tiny_run, "typo", [{"file": "train.txt"}, {"file": "nli.csv", "mdoe": "hardneg"}])
    unknown = r"entry 2 of the list: unknown key\(s\) \['mdoe'\]"
    with pytest.raises(ConfigError, match=rf"{typo}: config key 'data.datasets' {unknown}"):
        load_config(typo)
    weight = mixture_recipe(tiny_run, "weight", TWO | {"nli": TWO["nli"] | {"weight": 2}})
    with pytest.raises(ConfigError, match=rf"{weight}: config key 'data.datasets' entry 'nli': weight 2.0: only used with"):
        load_config(weight)
    missing = mixture_recipe(tiny_run, "missing", TWO | {"nli": {"file": "nope.csv", "mode": "hardneg"}})
    with pytest.raises(ConfigError, match=r"entry 'nli': .*nope.csv: file not found"):
        load_config(missing).check_data()
    big = mixture_recipe(tiny_run, "big", TWO, batch_size=40)  # nli has 32 triplets
    with pytest.raises(ConfigError, match=r"'train.batch_size' = 40: larger than the training set 'nli' \(32 example"):
        build_run(load_config(big))


def test_a_weight_too_small_for_one_batch_is_refused_naming_the_weight_that_gives_one(tiny_run: TinyRun) -> None:
    """Issue 48: under weighted sampling a dataset with weight 1e-9 got 0 batches, said only at
    INFO. 64 + 32 examples in batches of 8 are 12 batches; nli's quota 12 w / (1 + w) reaches
    one at w = 1/11."""
    from simcse_kit.data.mixture import batches_per_dataset
    from simcse_kit.training.wiring.run import build_run

    def weighted(weight: float) -> Path:
        specs = TWO | {"wiki": {"file": "train.txt", "weight": 1.0}, "nli": TWO["nli"] | {"weight": weight}}
        recipe = mixture_recipe(tiny_run, "weighted", specs)
        raw = yaml.safe_load(recipe.read_text(encoding="utf-8"))
        raw["data"]["sampling"] = "weighted"
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        return recipe

    message = r"entry 'nli': weight 1e-09 gives it 0 of the epoch's 12 batches, .* a weight of 0.0909 is sure to give it one"
    with pytest.raises(ConfigError, match=message):
        build_run(load_config(weighted(1e-9)))
    assert not (tiny_run.folder / "weighted").exists()
    assert batches_per_dataset([64, 32], 8, "weighted", [1.0, 1 / 11 + 1e-12]) == [11, 1]  # the weight it names: one batch
    assert batches_per_dataset([64, 32], 8, "weighted", [1.0, 0.04]) == [12, 0]  # quotas 11.54 and 0.46


@pytest.mark.slow
def test_a_mixture_killed_mid_epoch_and_resumed_ends_as_an_uninterrupted_run(tmp_path: Path, tiny_run: TinyRun) -> None:
    """``simcse-kit train`` on two datasets, SIGKILLed after a checkpoint inside the first
    epoch and resumed: the same per-dataset counts and losses, evaluations and weights."""
    tracked = {"report_to": ["tensorboard"]}
    ref_recipe, cut_recipe = mixture_recipe(tiny_run, "ref", TWO, **tracked), mixture_recipe(tiny_run, "cut", TWO, **tracked)
    ref_out, cut_out = tiny_run.folder / "ref", tiny_run.folder / "cut"
    ref = subprocess.run(train_cmd(ref_recipe), env=ENV, capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    with (tmp_path / "killed.log").open("w") as log:
        proc = subprocess.Popen(train_cmd(cut_recipe), env=ENV, stdout=subprocess.DEVNULL, stderr=log)
        kill_when(proc, lambda: newest_step(cut_out) >= 4)
    assert newest_step(cut_out) < 12  # inside the first epoch (8 + 4 batches)
    done = subprocess.run(train_cmd(cut_recipe, "--resume"), env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stderr
    want = run_metrics(ref_out)
    # 3 epochs of 8 wiki and 4 nli batches of 8 examples.
    assert {name: (d["batches"], d["examples"]) for name, d in want["datasets"].items()} == {"wiki": (24, 192), "nli": (12, 96)}
    assert run_metrics(cut_out) == want
    # The trackers get the same counts, step by step (the last log step: the run's end).
    events = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logs = events.EventAccumulator(str(ref_out / "logs" / "simcse-kit"))
    logs.Reload()
    assert logs.Scalars("train/nli/examples")[-1].value == 96
    assert logs.Scalars("train/wiki/mean_loss")[-1].value == pytest.approx(want["datasets"]["wiki"]["mean_loss"], rel=1e-6)
    # Its export's card names the datasets and their modes, not the unused data.train_file.
    from simcse_kit.export import export_model

    export_model(ref_out, tmp_path / "st")
    card = (tmp_path / "st" / "README.md").read_text(encoding="utf-8")
    assert f"wiki (`{tiny_run.folder / 'train.txt'}`, unsup), nli (`{tiny_run.folder / 'nli.csv'}`, hardneg)" in card
    assert "SimCSE (unsup + hardneg)" in card
    weights = load_file(str(ref_out / "best_model" / "model.safetensors"))
    got = load_file(str(cut_out / "best_model" / "model.safetensors"))
    assert all(torch.equal(weights[k], got[k]) for k in weights)


@pytest.mark.slow
def test_two_processes_train_a_mixture_as_one(tiny_run: TinyRun) -> None:
    """``torchrun`` on 2 processes against one, dropout 0, global batch 8: the same loss at
    every step, the same weights and per-dataset counts and mean losses: each step's
    dataset is the same on both processes and the gather combines rows of it."""
    from test_multiprocess import TOL, assert_same_training, cli_args, launch, torchrun

    options = {
        "dropout": 0.0, "pooler": "avg", "batch_size": 8, "learning_rate": 1e-3, "max_steps": 6, "eval_steps": 0,
        "eval_at_start": "false", "save_steps": 0, "final_eval": "false", "log_steps": 1, "report_to": "tensorboard",
        "mask_false_negatives": "true",
    }  # fmt: skip
    one, two = tiny_run.folder / "one", tiny_run.folder / "two"
    recipe = mixture_recipe(tiny_run, "procs", TWO)
    single = [sys.executable, "-m", "simcse_kit.cli", "train", str(recipe), *cli_args(options | {"output_dir": one})]
    launch([single], 1)
    launch(torchrun(1, 2, recipe, options | {"output_dir": two}), 2)
    assert_same_training(two, one, 6, tiny_run.model_dir)
    want, got = (json.loads((out / "metrics.json").read_text())["datasets"] for out in (one, two))
    counts = [{n: (d["batches"], d["examples"]) for n, d in run.items()} for run in (got, want)]
    assert counts[0] == counts[1]
    assert sum(d["batches"] for d in want.values()) == 6 and all(d["batches"] for d in want.values())
    for name, row in want.items():
        assert got[name]["mean_loss"] == pytest.approx(row["mean_loss"], rel=TOL)


def test_the_shipped_teacher_recipe_is_the_measured_row() -> None:
    """train/teacher/multi.yaml is the quality table's ``kit-multi-teacher-t0.1-wiki+snli`` row (multi.yaml
    with that row's overrides and the teacher, on that row's datasets only), so the recipe a user runs is
    the one BENCHMARKS.md measured."""
    import dataclasses

    from benchmarks.quality import TABLES, Job, job_config

    row = TABLES["multi"].rows["kit-multi-teacher-t0.1-wiki+snli"]
    train = Path(__file__).resolve().parents[1] / "train"
    overrides = dict(row.overrides) | {"teacher": "sentence-transformers/all-mpnet-base-v2"}
    measured = job_config(Job("row", "kit", str(train / "multi.yaml"), overrides, datasets=row.datasets))
    shipped = load_config(train / "teacher" / "multi.yaml")
    assert row.teacher and shipped.loss.teacher_temperature == 0.1
    assert [spec.name for spec in shipped.data.datasets or []] == ["wiki", "snli"]  # no STS or SICK file
    assert dataclasses.replace(shipped.train, output_dir="") == dataclasses.replace(measured.train, output_dir="")
    assert (shipped.model, shipped.data, shipped.loss) == (measured.model, measured.data, measured.loss)


# Attribute reads of the keys that write a run's data one way or the other, and the old forks.
FORKS = re.compile(
    r"[\w)\]]\.data\.(datasets|train_file|train_format|mode|max_train_samples)\b"
    r"|\.datasets is (not )?None|isinstance\([^)]*Mixture|make_mixture_loader"
)


def test_no_code_past_the_config_tells_one_dataset_from_several() -> None:
    """Every run is a list of datasets: ``DataConfig.training_sets`` makes the list (``train_file``
    is a list of one), and no module outside the config package reads the keys that write it
    one way or the other, or asks whether the objective is a mixture. (On the code before the
    list, this finds 25 such lines.)"""
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "simcse_kit").rglob("*.py"))
        if "config" not in path.relative_to(REPO / "simcse_kit").parts[:1]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORKS.search(line)
    ]
    assert found == []


# --------------------------------------------------------------------------- GradCache, the queue, a teacher: several datasets


def several_datasets(tiny_run: TinyRun, tiny_model_dir: Path, **loss: object) -> tuple[Any, dict[str, Any], list[str], Any]:
    """Three datasets of the tiny run (unsup, hardneg, hardneg with 2 mined negatives): the
    config, the datasets, their sentences (a teacher's table rows) and a loader of batches of 6
    carrying each row's teacher row and text id."""
    from transformers import AutoTokenizer

    from simcse_kit.training.wiring.inputs import load_training_sets, training_texts
    from simcse_kit.training.wiring.loaders import make_loader

    sents = toy_sentences(60)
    rows = "".join(f"{sents[i]},{sents[i]} .,{sents[i + 20]},{sents[i + 40]}\n" for i in range(18))
    (tiny_run.folder / "mined.csv").write_text("sent0,sent1,hard_neg_1,hard_neg_2\n" + rows, encoding="utf-8")
    three = TWO | {"mined": {"file": "mined.csv", "mode": "hardneg"}}
    opts = {"batch_size": "6", "mask_false_negatives": "true"} | {k: str(v) for k, v in loss.items()}
    cfg = load_config(mixture_recipe(tiny_run, "several", three), opts)
    sets = load_training_sets(cfg)
    texts = training_texts(cfg, sets)
    index = {text: row for row, text in enumerate(texts)}
    loader = make_loader(cfg, sets, AutoTokenizer.from_pretrained(tiny_model_dir), 1, teacher_index=index)
    return cfg, sets, texts, loader


def per_dataset(cfg: Any, sets: dict[str, Any], teacher: Any = None) -> Any:
    from simcse_kit.data.readers import negatives_of
    from simcse_kit.training.objective.mixture import MixtureObjective
    from simcse_kit.training.objective.objectives import SimCSEObjective

    modes = {spec.name: spec.mode for spec in cfg.data.training_sets()}
    return MixtureObjective(
        {name: SimCSEObjective(modes[name], cfg.loss, teacher=teacher, negatives=negatives_of(part.column_names))
         for name, part in sets.items()}
    )  # fmt: skip


def tiny_model(tiny_model_dir: Path, double: bool = False) -> Any:
    from simcse_kit.config.run import ModelConfig
    from simcse_kit.model.modeling import SimCSEModel

    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train", dropout=0.0))
    return (model.double() if double else model).train()


def test_gradcache_and_a_teacher_over_several_datasets_equal_the_plain_step(tiny_run: TinyRun, tiny_model_dir: Path) -> None:
    """Batches of three datasets (2, 3 and 4 rows an example), a teacher's similarity term on
    each: GradCache's loss and gradients equal the plain step's batch for batch (dropout off),
    its chunks of 5 rows cut at each dataset's own example boundary, and both tally alike."""
    from simcse_kit.training.engine.steps import GradCacheStep
    from simcse_kit.training.objective.objectives import TeacherTargets

    cfg, sets, texts, loader = several_datasets(tiny_run, tiny_model_dir)
    table = torch.randn(len(texts), 11, generator=torch.Generator().manual_seed(8))
    teacher = TeacherTargets(table, "similarity", 0.05, 0.5)
    plain, cached = per_dataset(cfg, sets, teacher), per_dataset(cfg, sets, teacher)
    step = GradCacheStep(cached, 5)
    seen: Counter[str] = Counter()
    for batch in loader:
        full, chunked = tiny_model(tiny_model_dir), tiny_model(tiny_model_dir)
        want = plain.step(full, batch)
        got = step(chunked, batch)
        assert got.item() == pytest.approx(want.item(), abs=1e-5)
        for (name, p), q in zip(full.named_parameters(), chunked.parameters(), strict=True):
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)
        assert plain.of(batch).last_terms["teacher_loss"] > 0
        seen[batch[DATASET_KEY]] += 1
    assert seen == {"wiki": 10, "nli": 5, "mined": 3}
    for name, row in plain.tally.report().items():
        assert cached.tally.report()[name] == pytest.approx(row, abs=1e-5) and row["batches"] == seen[name]


def test_the_queue_over_several_datasets_is_a_naive_queue(tiny_run: TinyRun, tiny_model_dir: Path) -> None:
    """The momentum queue across batches of three datasets (2, 3 and 4 rows an example) holds
    what a naive queue does: before each step the key encoder moves to ``m k + (1 - m) q``, the
    loss is the batch's dataset's objective with the last ``Q`` keys as extra negatives, and
    then the key encoder's vectors of each example's positive (view 1) join the queue."""
    import copy

    from simcse_kit.training.engine.steps import MomentumQueueStep, Queue
    from simcse_kit.training.objective.momentum_queue import MomentumQueue

    cfg, sets, _, loader = several_datasets(tiny_run, tiny_model_dir, temperature=0.1, gather="false")
    model = tiny_model(tiny_model_dir, double=True)
    objective, naive = per_dataset(cfg, sets), per_dataset(cfg, sets)
    step = MomentumQueueStep(objective, MomentumQueue(model, size=10, momentum=0.5, dim=32).double())
    keys_model = copy.deepcopy(model)
    kept: list[torch.Tensor] = []  # every key so far, oldest first, and its text id
    kept_ids: list[torch.Tensor] = []
    generator = torch.Generator().manual_seed(3)
    for i, batch in enumerate(loader):
        if i:  # what an optimiser step does between the steps
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
                for k, q in zip(keys_model.parameters(), model.parameters(), strict=True):
                    k.mul_(0.5).add_(0.5 * q)
        queue = Queue(torch.stack(kept[-10:]), torch.stack(kept_ids[-10:])) if kept else None
        with torch.no_grad():
            want = naive.loss(naive.embed(model, batch), batch, queue)
            v = naive.of(batch).views_per_example()
            inputs = {k: t[1::v] for k, t in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            keys = keys_model(**inputs).float().double()  # the queue's keys are fp32, whatever the encoder's dtype
        got = step(model, batch)
        model.zero_grad()
        assert got.item() == pytest.approx(want.item(), abs=1e-9)
        kept += list(keys)
        kept_ids += list(batch["text_ids"][1::v])
    assert i >= 12 and len(kept) > 10
    for name, row in naive.tally.report().items():
        assert objective.tally.report()[name] == pytest.approx(row)


def test_a_teachers_scores_train_over_several_hardneg_datasets(tiny_run: TinyRun) -> None:
    """``loss.distill`` with two hardneg datasets of teacher-scored rows (1 and 3 negatives):
    both train, each batch with its own dataset's scores; beside an unsup dataset, which has
    no candidates to score, it is refused by name."""
    from test_teacher_scores import scored_rows, write_csv

    from simcse_kit.training.wiring.run import train

    write_csv(tiny_run.folder / "one.csv", scored_rows(24, 1), 1)
    write_csv(tiny_run.folder / "three.csv", scored_rows(16, 3), 3)
    both = {"one": {"file": "one.csv", "mode": "hardneg"}, "three": {"file": "three.csv", "mode": "hardneg"}}
    recipe = mixture_recipe(tiny_run, "distill", both, max_steps=5, eval_steps=0, save_steps=0, final_eval=False)
    metrics = train(load_config(recipe, {"distill": "kl", "distill_weight": "0.5"}))
    assert {name: row["batches"] > 0 for name, row in metrics["datasets"].items()} == {"one": True, "three": True}
    assert all(math.isfinite(loss) for _, loss in metrics["losses"])
    mixed = mixture_recipe(tiny_run, "mixed", {"wiki": {"file": "train.txt"}} | both)
    with pytest.raises(ConfigError, match=r"'data.datasets' entry 'wiki': mode 'unsup': must be 'hardneg' with loss.distill"):
        load_config(mixed, {"distill": "kl"})


def test_a_list_of_one_dataset_is_the_train_file_run(tiny_run: TinyRun) -> None:
    """The same file written as ``train_file`` and as a ``data.datasets`` list of one trains
    the same run, bit for bit: losses, dev scores and weights."""
    from simcse_kit.training.wiring.run import train

    opts = dict(max_steps=10, eval_steps=5, save_steps=0, final_eval=False)
    one = train(load_config(tiny_run.recipe("file", **opts)))
    listed = train(load_config(mixture_recipe(tiny_run, "list", [{"file": "train.txt"}], **opts)))
    assert one["losses"] == listed["losses"] and one["evals"] == listed["evals"] and one["datasets"] == listed["datasets"]
    weights = [load_file(tiny_run.folder / name / "best_model" / "model.safetensors") for name in ("file", "list")]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
