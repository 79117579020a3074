"""Tiny random BERT trains in all three modes through the real loop (the loss falls), and a
tiny run through ``run.train`` leaves the run folder it promises."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TinyRun, toy_sentences, write_train_data
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from simcse_kit.config.run import LoopConfig, LossConfig, ModelConfig, load_config
from simcse_kit.core.batch import views_per_example
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import load_train_dataset
from simcse_kit.evaluation import STSEvaluator
from simcse_kit.model.inference import Encoder, load_encoder
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.loop import fit, prepare
from simcse_kit.training.engine.selection import DevSelection, adopt_legacy_evals, dev_selection
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.wiring.run import EVAL_BATCH_SIZE, build_run, train


@pytest.mark.parametrize(
    ("mode", "pooler", "mlp"), [("unsup", "cls", "train"), ("sup", "avg", "none"), ("hardneg", "cls", "always")]
)
def test_three_modes_loss_falls(tmp_path: Path, tiny_model_dir: Path, mode: str, pooler: str, mlp: str) -> None:
    """The objective is itself the loop's step, in every mode."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp=mlp))
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05))
    collator = ContrastiveCollator(tokenizer, mode, 16)
    dataset = load_train_dataset(str(write_train_data(tmp_path, mode)), mode)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collator, generator=torch.Generator().manual_seed(0))
    views = views_per_example(mode)
    fixed = collator([dataset[i] for i in range(8)])
    assert fixed["input_ids"].shape[0] == 8 * views

    def fixed_loss() -> float:
        # Averaged over dropout draws: one draw's loss moves by ~10% with the masks alone
        # (and the masks depend on the batch layout, e.g. packed or padded).
        model.train()
        torch.manual_seed(123)
        with torch.no_grad():
            return sum(objective(model, fixed, lambda loss: None).item() for _ in range(16)) / 16

    before = fixed_loss()
    cfg = LoopConfig(learning_rate=1e-3, num_epochs=4, progress_bar=False, eval_steps=0)
    state = fit(prepare(model, loader, cfg), objective, cfg)
    after = fixed_loss()
    assert state.global_step == 16
    assert state.rows_seen == 128 * views
    assert after < 0.9 * before, (before, after)


def test_a_tiny_run_folder(tiny_run: TinyRun) -> None:
    """``train`` wires the pieces: the dev evaluator picks best_model/, metrics.json holds
    the curves, throughput and the final table of best_model/, config.yaml the config."""
    cfg = tiny_run.config("run", save_steps=0, num_epochs=1, eval_steps=3)
    metrics = train(cfg)
    run = tiny_run.folder / "run"
    assert json.loads((run / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    assert set(metrics) == {
        "dev_metric",
        "dev_label",
        "best_step",
        "best_dev_score",
        "steps",
        "train_seconds",
        "examples_per_second",
        "sentences_per_second",
        "losses",
        "evals",
        "masked_negatives",
        "datasets",  # each dataset's batches, examples and mean loss: here the one, train.txt's
        "sampling",
        "precision",
        "memory",
        "skipped_rows",
        "contamination",  # the evaluation sentences the training data holds (tests/test_contamination.py)
        "speed",
        "sts",
    }
    assert metrics["skipped_rows"] == 0  # data.bad_rows: error (the default)
    # CPU: no TF32; compile off by default; auto workers and packing as decided for the CPU
    assert metrics["speed"] == {"tf32": False, "compile": False, "num_workers": 0, "packing": True}
    # mmap_threshold_mib unset: malloc left as it comes, and said so
    assert metrics["memory"]["mmap_threshold_mib"] is None and "malloc as it is" in metrics["memory"]["reason"]
    # fast_dropout "auto" at mixed_precision "no": decided (off) and recorded with its reason
    assert metrics["precision"]["fast_dropout"] is False and metrics["precision"]["mixed_precision"] == "no"
    assert (metrics["precision"]["decided_by"], metrics["precision"]["hardware"]) == ("requested no", {})  # nothing read
    assert metrics["steps"] == 8  # 64 sentences, batch 8
    assert [e["step"] for e in metrics["evals"]] == [0.0, 3.0, 6.0, 8.0]  # step 0: the untouched model
    assert all(set(e) == {"step", "stsb_dev", "alignment", "uniformity"} for e in metrics["evals"])
    best = max(metrics["evals"], key=lambda e: e["stsb_dev"])
    assert (metrics["best_step"], metrics["best_dev_score"]) == (best["step"], best["stsb_dev"])
    assert (metrics["dev_metric"], metrics["dev_label"]) == ("stsb_dev", "STS-B dev Spearman x 100")
    assert metrics["sentences_per_second"] == pytest.approx(2 * metrics["examples_per_second"])  # unsup: 2 views
    assert [s for s, _ in metrics["losses"]] == list(range(1, 9))  # log_steps 1
    meta = json.loads((run / "best_model" / "simcse_config.json").read_text())
    assert (meta["step"], meta["dev_score"], meta["mode"]) == (metrics["best_step"], metrics["best_dev_score"], "unsup")
    assert (meta["dev_metric"], meta["dev_label"]) == ("stsb_dev", "STS-B dev Spearman x 100")
    sts = STSEvaluator(cfg.data.eval_data_dir, batch_size=EVAL_BATCH_SIZE)(load_encoder(run / "best_model").encode)
    assert sts == metrics["sts"]
    # config.yaml records what ran: "auto" switches as decided on this machine
    assert cfg.train.fast_dropout == "auto"
    assert load_config(run / "config.yaml") == replace(cfg, train=replace(cfg.train, fast_dropout=False, bf16_weights=False))
    assert (run / "alignment_uniformity.png").stat().st_size > 0
    assert not (run / "checkpoints").exists()


def test_build_run_wires_what_train_runs_without_running_it(tiny_run: TinyRun) -> None:
    """``build_run`` builds and prepares every piece and writes nothing; fitting what it
    returns is the run ``train`` runs (the same losses and dev scores, step for step)."""
    overrides = {"save_steps": 0, "num_epochs": 1, "eval_steps": 3, "warmup_ratio": 0.25, "weight_decay": 0.01}
    cfg = tiny_run.config("built", **overrides)
    collated: list[int] = []

    def counting(collate: Callable[..., dict]) -> Callable[..., dict]:
        return lambda features: collated.append(len(features)) or collate(features)

    run = build_run(cfg, wrap_collate=counting)
    assert not Path(cfg.train.output_dir).exists()  # no run folder, no lock, no config.yaml
    assert run.cfg.train.fast_dropout is False and cfg.train.fast_dropout == "auto"  # decided once, here
    assert run.n_steps == 8 and run.evaluator is not None and run.final_sts is not None
    assert isinstance(run.accelerator.unwrap_model(run.model), SimCSEModel)
    decay, no_decay = run.optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert run.optimizer.param_groups[0]["lr"] == 0.0  # warm-up: the schedule starts at 0
    state = fit(run, run.step, run.cfg.train, evaluator=run.evaluator)
    reference = train(tiny_run.config("ref", **overrides))
    assert state.losses == reference["losses"] and state.evals == reference["evals"]
    assert collated == [8] * 8  # the prepared loader calls the wrapped collate function


def test_unsup_batch_is_each_sentence_twice(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": "a dog"}, {"sent0": "the red car drives"}])
    ids = batch["input_ids"]
    assert ids.shape[0] == 4
    assert torch.equal(ids[0], ids[1]) and torch.equal(ids[2], ids[3]) and not torch.equal(ids[0], ids[2])
    # Padded to the longest in the batch, not to max_seq_len.
    assert ids.shape[1] == 6


def test_save_load_roundtrip_every_pooler(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sents = toy_sentences(10)
    for pooler, mlp in [
        ("cls", "train"),
        ("cls", "always"),
        ("cls_before_pooler", "none"),
        ("avg", "none"),
        ("avg_first_last", "none"),
        ("avg_top2", "train"),
    ]:
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp=mlp))
        model.save(tmp_path / pooler, tokenizer)
        meta = json.loads((tmp_path / pooler / "simcse_config.json").read_text())
        assert meta["pooler"] == pooler and meta["mlp"] == mlp
        want = Encoder(model, tokenizer, 64).encode(sents)
        got = load_encoder(tmp_path / pooler).encode(sents)
        assert torch.allclose(want, got, atol=1e-6)
        if mlp == "train":  # MLP off at inference: equals the bare pooled vector
            bare = SimCSEModel(model.encoder, pooler, "none")
            assert torch.allclose(Encoder(bare, tokenizer, 64).encode(sents), got, atol=1e-6)
    assert not list(tmp_path.glob(".*tmp*")), "temp folders left behind"


def test_pooler_values_by_hand(tiny_model_dir: Path) -> None:
    from simcse_kit.model.modeling import Pooler

    mask = torch.tensor([[1, 1, 0]])
    h = [torch.full((1, 3, 2), float(i)) for i in range(4)]  # embeddings, layer1, layer2, layer3
    h[-1] = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert Pooler("cls")(mask, h[-1], h).tolist() == [[1.0, 2.0]]
    assert Pooler("avg")(mask, h[-1], h).tolist() == [[2.0, 3.0]]
    assert Pooler("avg_first_last")(mask, h[-1], h).tolist() == [[1.5, 2.0]]  # (layer1=1 + last)/2
    assert Pooler("avg_top2")(mask, h[-1], h).tolist() == [[2.0, 2.5]]  # (layer2=2 + last)/2


def test_final_eval_off_skips_only_the_sts_table(tiny_run: TinyRun, tmp_path: Path) -> None:
    """A dev-only sweep point: same training, same best model, no 7-task table — and the
    STS folder is not even read (a sweep on a machine without the test sets works)."""
    with_table = train(tiny_run.config("with", save_steps=0, eval_steps=3))
    cfg = tiny_run.config("without", save_steps=0, eval_steps=3, final_eval="false")
    final_only = list(Path(cfg.data.eval_data_dir).glob("STS/STS12*"))  # read by the final table only
    assert final_only
    for task in final_only:
        shutil.rmtree(task) if task.is_dir() else task.unlink()
    without = train(cfg)
    assert "sts" not in without and "sts" in with_table
    assert without["evals"] == with_table["evals"] and without["best_step"] == with_table["best_step"]


def test_dev_selection_reads_new_and_older_run_folders() -> None:
    """What selected a run's best model, from metrics.json or the best model's metadata; the
    keys of folders written before the metric was named read as STS-B dev."""
    new = {"dev_metric": "sick_dev", "dev_label": "SICK trial Spearman x 100", "best_dev_score": 81.5}
    assert dev_selection(new) == DevSelection("sick_dev", "SICK trial Spearman x 100", 81.5)
    meta = {"step": 4, "dev_metric": "dev_ndcg@10", "dev_label": "scifact dev nDCG@10 x 100", "dev_score": 40.0}
    assert dev_selection({}, meta) == DevSelection("dev_ndcg@10", "scifact dev nDCG@10 x 100", 40.0)
    assert dev_selection({"best_stsb_dev": 79.0}, {"stsb_dev": 1.0}) == DevSelection("stsb_dev", "STS-B dev Spearman x 100", 79.0)
    assert dev_selection({}, {"step": 2, "stsb_dev": 77.0}).best == 77.0
    assert dev_selection({"best_dev_score": None, "dev_metric": "sick_dev"}).best is None  # no usable evaluation
    assert dev_selection({}).best is None
    # An older folder's "stsb_dev" measured what its config's dev data was.
    old_sick = dev_selection({"best_stsb_dev": 81.0}, data={"dev_format": "sick", "dev_file": "x/SICK_trial.txt"})
    assert old_sick == DevSelection("stsb_dev", "SICK trial Spearman x 100", 81.0)
    old_beir = dev_selection({"best_stsb_dev": 40.0}, data={"dev_format": "beir", "dev_file": "/d/scifact"})
    assert old_beir.label == "scifact nDCG@10 x 100"


def test_a_resumed_older_checkpoint_keeps_one_dev_key() -> None:
    """Evaluations restored from a checkpoint written before the metric was named: the
    score moves to the evaluator's key (a retrieval split's duplicate is dropped)."""
    sick = [{"step": 0.0, "stsb_dev": 70.0, "alignment": 0.2}]
    assert adopt_legacy_evals(sick, "sick_dev") == 1 and sick == [{"step": 0.0, "alignment": 0.2, "sick_dev": 70.0}]
    beir = [{"step": 2.0, "stsb_dev": 40.0, "dev_ndcg@10": 40.0}]
    assert adopt_legacy_evals(beir, "dev_ndcg@10") == 1 and beir == [{"step": 2.0, "dev_ndcg@10": 40.0}]
    stsb = [{"step": 2.0, "stsb_dev": 80.0}]
    assert adopt_legacy_evals(stsb, "stsb_dev") == 0 and stsb == [{"step": 2.0, "stsb_dev": 80.0}]
