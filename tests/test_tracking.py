"""Experiment tracking (``train.report_to``) and the run's training curves: a tiny tracked
run's TensorBoard event file holds every scalar at exactly the logged and evaluated steps,
with the run's own numbers; tracking changes no number of the run; the loop's gradient norm
is the hand-computed one; ``training_curves.png`` draws what it is given."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import TinyRun
from matplotlib.image import imread
from test_loop import Toy, mse_step, toy_loader

from simcse_kit.config.run import LoopConfig, LossConfig, flat_params, load_config
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation.plots import pyplot, training_curves
from simcse_kit.training.engine.loop import fit, make_accelerator, prepare
from simcse_kit.training.engine.steps import GradCacheStep, MomentumQueueStep
from simcse_kit.training.engine.tracking import PROJECT, tracker_names
from simcse_kit.training.objective.momentum_queue import MomentumQueue
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.wiring.folder import LOGS, config_differences

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` of the TensorBoard event file(s) in ``folder``."""
    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_tracked_run_logs_every_scalar_at_its_steps(tiny_run: TinyRun) -> None:
    """8 steps, a loss logged at 1, 4, 8, dev evaluations at 0, 3, 6, 8, masking and a
    16-row queue of 8 keys a step: the event file holds exactly those points."""
    overrides = dict(save_steps=0, num_epochs=1, eval_steps=3, log_steps=4, mask_false_negatives="true", queue_size=16)
    metrics = tiny_run.train("tracked", report_to="tensorboard", **overrides)
    run = tiny_run.folder / "tracked"
    scalars = read_scalars(run / LOGS / PROJECT)

    logged, evaluated = [1, 4, 8], [0, 3, 6, 8]
    assert [s for s, _ in metrics["losses"]] == logged and [int(e["step"]) for e in metrics["evals"]] == evaluated
    train = {"loss", "learning_rate", "grad_norm", "rows_per_second", "masked_negatives", "masked_negatives_total", "queue_size"}
    train |= {"train/examples", "train/mean_loss"}  # the one dataset's (train.txt's) tally
    dev = {"eval/stsb_dev", "eval/alignment", "eval/uniformity"}
    final = {f"test/{task}" for task in metrics["sts"] if "/" not in task}  # the table's tasks, not their subsets
    assert set(scalars) == {f"train/{tag}" for tag in train} | dev | final
    for tag in train:
        assert [s for s, _ in scalars[f"train/{tag}"]] == logged, tag
    # The run's own numbers (event files hold fp32).
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([v for _, v in metrics["losses"]], rel=1e-6)
    for key in ("stsb_dev", "alignment", "uniformity"):
        assert scalars[f"eval/{key}"] == [(int(e["step"]), pytest.approx(e[key], rel=1e-6)) for e in metrics["evals"]]
    assert scalars["test/avg"] == [(8, pytest.approx(metrics["sts"]["avg"], rel=1e-6))]
    # Linear decay from 1e-3 over 8 steps, no warm-up: step s trains at 1e-3 * (1 - (s - 1) / 8).
    assert [v for _, v in scalars["train/learning_rate"]] == pytest.approx([1e-3, 1e-3 * 5 / 8, 1e-3 / 8])
    assert scalars["train/queue_size"] == [(1, 8.0), (4, 16.0), (8, 16.0)]  # 8 examples' keys a step, 16 rows at most
    assert scalars["train/masked_negatives_total"][-1] == (8, float(metrics["masked_negatives"]))
    assert all(v > 0 for _, v in scalars["train/grad_norm"] + scalars["train/rows_per_second"])
    # The hyper-parameters: the resolved config, flattened, once.
    (hparams,) = (run / LOGS / PROJECT).glob("*/hparams.yml")
    logged_config = yaml.safe_load(hparams.read_text())
    # The tracker holds what ran: config.yaml, with the device's auto (null) settings as decided
    # at the start (config.yaml keeps them null, so a resume on another device decides again).
    recorded = flat_params(load_config(run / "config.yaml"))
    assert recorded["data.num_workers"] == "none" and recorded["model.packing"] == "none"
    speed = json.loads((run / "metrics.json").read_text())["speed"]
    decided = {"data.num_workers": speed["num_workers"], "model.packing": speed["packing"]}
    assert decided == {"data.num_workers": 0, "model.packing": True}  # the CPU's choices
    assert logged_config == recorded | decided
    assert logged_config["train.learning_rate"] == 1e-3 and logged_config["train.report_to"] == "tensorboard"

    # Tracking reads numbers, never changes them: the same run untracked is identical.
    untracked = tiny_run.train("untracked", **overrides)
    assert untracked["losses"] == metrics["losses"] and untracked["evals"] == metrics["evals"]
    assert untracked["sts"] == metrics["sts"] and untracked["masked_negatives"] == metrics["masked_negatives"]
    assert not (tiny_run.folder / "untracked" / LOGS).exists()

    # The picture of the run: two panels, read back as an image.
    image = imread(run / "training_curves.png")
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300


@pytest.mark.parametrize("max_grad_norm", [None, 0.01])
def test_fit_logs_the_gradient_norm_before_clipping(tmp_path: Path, max_grad_norm: float | None) -> None:
    """``fit`` on its own (the trackers started by it, its loop config as hyper-parameters):
    step 1's ``train/grad_norm`` is the norm of the first batch's gradient at the initial
    weights, computed here by hand, with clipping (from clip_grad_norm_) and without."""
    cfg = LoopConfig(learning_rate=0.05, eval_steps=0, log_steps=5, progress_bar=False, report_to=["tensorboard"])
    cfg = replace(cfg, max_grad_norm=max_grad_norm)
    model, reference = Toy(dropout=0.0), Toy(dropout=0.0)
    loader = toy_loader()
    batch = next(iter(toy_loader()))  # the same first batch: the loader's generator is seeded
    F.mse_loss(reference(batch["ids"]).float(), batch["y"]).backward()
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()])).item()

    state = fit(prepare(model, loader, cfg, make_accelerator(cfg, cpu=True, logging_dir=tmp_path)), mse_step, cfg)
    scalars = read_scalars(tmp_path / PROJECT)
    assert [s for s, _ in scalars["train/grad_norm"]] == [s for s, _ in state.losses] == [1, 5, 10]
    assert scalars["train/grad_norm"][0][1] == pytest.approx(expected, rel=1e-5)
    assert (next((tmp_path / PROJECT).glob("*/hparams.yml"))).is_file()


def test_report_to_from_yaml_and_command_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  report_to: [tensorboard]\n", encoding="utf-8")
    assert load_config(recipe).train.report_to == ["tensorboard"]
    assert load_config(None, {"report-to": "tensorboard, wandb"}).train.report_to == ["tensorboard", "wandb"]
    assert load_config(None, {"report_to": "none"}).train.report_to == ["none"]
    assert load_config(None).train.report_to == []
    with pytest.raises(ConfigError, match="report_to"):
        load_config(None, {"report_to": 3})
    assert tracker_names(["none"]) == [] and tracker_names(["TensorBoard"]) == ["tensorboard"]
    with pytest.raises(ConfigError, match="unknown tracker 'tensorbord'"):
        tracker_names(["tensorbord"])
    if importlib.util.find_spec("wandb") is None:  # Accelerate alone would drop it without a word
        with pytest.raises(ConfigError, match="pip install wandb"):
            tracker_names(["wandb"])
    # Trackers change no number of a run: a resume may add or drop them.
    cfg = load_config(None)
    assert config_differences(cfg, replace(cfg, train=replace(cfg.train, report_to=["tensorboard"]))) == []


def test_flat_params_are_tensorboard_hparams() -> None:
    cfg = load_config(None, {"report_to": "tensorboard,wandb", "max_steps": "7"})
    flat = flat_params(cfg)
    assert flat["train.report_to"] == "tensorboard,wandb" and flat["train.max_steps"] == 7
    assert flat["data.max_train_samples"] == "none" and flat["model.pooler"] == "avg"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    assert flat_params(LoopConfig())["learning_rate"] == 3e-5  # a flat config keeps its names


def test_training_curves_figure() -> None:
    """Two panels: the loss points and the dev points as given, the best one starred and
    both panels marked at its step."""
    losses = [(1, 3.0), (2, 2.5), (4, 2.0)]
    evals = [{"step": 0.0, "stsb_dev": 60.0}, {"step": 2.0, "stsb_dev": 75.0}, {"step": 4.0, "stsb_dev": 70.0}]
    fig = training_curves(losses, evals, "stsb_dev", best_step=2, title="t")
    top, bottom = fig.axes
    assert len(fig.axes) == 2
    assert top.lines[0].get_xydata().tolist() == [[1, 3.0], [2, 2.5], [4, 2.0]]
    assert bottom.lines[0].get_xydata().tolist() == [[0, 60.0], [2, 75.0], [4, 70.0]]
    star = [line for line in bottom.lines if line.get_marker() == "*"]
    assert len(star) == 1 and star[0].get_xydata().tolist() == [[2, 75.0]]
    for ax in (top, bottom):  # the vertical best-step line: x = 2 at both ends
        assert any(list(line.get_xdata()) == [2, 2] for line in ax.lines)
    assert bottom.get_ylabel() == "stsb_dev" and top.get_title() == "t"
    pyplot().close(fig)
    # The dev axis says what the metric measures where the run names it.
    sick = [{"step": e["step"], "sick_dev": e["stsb_dev"]} for e in evals]
    fig = training_curves(losses, sick, "sick_dev", best_step=2, label="SICK trial Spearman x 100")
    assert fig.axes[1].get_ylabel() == "SICK trial Spearman x 100"
    assert fig.axes[1].lines[0].get_xydata().tolist() == [[0, 60.0], [2, 75.0], [4, 70.0]]
    pyplot().close(fig)


def test_the_steps_expose_their_counters() -> None:
    """What a text run's step adds to the log: masking counters (only with masking on),
    the same through GradCache, plus the queue's fill with the momentum queue."""
    assert SimCSEObjective("unsup", LossConfig()).metrics() == {}
    objective = SimCSEObjective("unsup", LossConfig(mask_false_negatives=True))
    objective.masked.add(torch.tensor(5))  # counts stay tensors until read
    objective.masked.add(torch.tensor(2))
    counters = {"masked_negatives": 2.0, "masked_negatives_total": 7.0}
    assert objective.metrics() == GradCacheStep(objective, 4).metrics() == counters
    queue = MomentumQueue(torch.nn.Linear(3, 3), size=4, momentum=0.9, dim=3)
    queue.enqueue(torch.ones(3, 3), torch.arange(3))
    assert MomentumQueueStep(objective, queue).metrics() == counters | {"queue_size": 3.0}
