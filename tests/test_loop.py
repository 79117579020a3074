"""The loop alone (``simcse_kit.training.engine.loop``) on a toy model and a synthetic step: the loss
falls, accumulation equals a big batch, evaluations pick the best model, checkpoints keep
two and own the best model, and a crash + resume ends exactly as an uninterrupted run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from simcse_kit.config.run import LoopConfig
from simcse_kit.training.engine.checkpoints import LOOP_STATE, Checkpoints, LoopState, latest_checkpoint
from simcse_kit.training.engine.loop import fit, make_accelerator, prepare

N_EXAMPLES = 40


class Toy(nn.Module):
    """``[B, 4]`` token ids -> ``[B]``: an embedding table (kept fp32 under bf16 weights),
    dropout (so the RNG state matters), a linear layer."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 8)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(self.embed(ids).mean(1))).squeeze(-1)


def mse_step(model: nn.Module, batch: dict[str, torch.Tensor], backward: object) -> torch.Tensor:
    """The step protocol: compute the loss, call ``backward`` on it, return it detached."""
    loss = F.mse_loss(model(batch["ids"]).float(), batch["y"])
    backward(loss)  # type: ignore[operator]
    return loss.detach()


def toy_data() -> list[dict[str, torch.Tensor]]:
    """Targets a linear function of the ids' mean: the toy can fit them exactly."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (N_EXAMPLES, 4), generator=g)
    y = ids.float().mean(1) / 10 - 1
    return [{"ids": i, "y": t} for i, t in zip(ids, y, strict=True)]


def toy_loader(batch_size: int = 4, shuffle: bool = True) -> DataLoader:
    return DataLoader(
        toy_data(), batch_size=batch_size, shuffle=shuffle, drop_last=True, generator=torch.Generator().manual_seed(1)
    )


def full_loss(model: nn.Module) -> float:
    batch = next(iter(DataLoader(toy_data(), batch_size=N_EXAMPLES)))
    model.eval()
    with torch.no_grad():
        return F.mse_loss(model(batch["ids"]).float(), batch["y"]).item()


class WeightsScore:
    """An evaluator whose score moves with the weights and is not monotone; it can crash."""

    primary_metric = "score"

    def __init__(self, crash_at: int | None = None) -> None:
        self.calls = 0
        self.crash_at = crash_at

    def __call__(self, model: nn.Module) -> dict[str, float]:
        self.calls += 1
        if self.calls == self.crash_at:
            raise Crash
        with torch.no_grad():
            return {"score": float(torch.cos(sum(p.float().sum() for p in model.parameters()))), "other": 1.0}


class Crash(Exception):
    pass


def save_toy(model: nn.Module, folder: Path, metrics: dict[str, float]) -> None:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, folder / "model.pt")
    (folder / "meta.json").write_text(json.dumps(metrics))


def best_meta(folder: Path) -> dict[str, float]:
    return json.loads((folder / "meta.json").read_text())


# --------------------------------------------------------------------------- the loop


def test_loss_falls_and_rows_are_counted() -> None:
    model = Toy()
    before = full_loss(model)
    cfg = LoopConfig(learning_rate=3e-2, num_epochs=6, log_steps=1, eval_steps=0, progress_bar=False)
    state = fit(prepare(model, toy_loader(), cfg), mse_step, cfg)
    assert state.global_step == 6 * N_EXAMPLES // 4
    assert state.rows_seen == 6 * N_EXAMPLES
    assert [s for s, _ in state.losses] == list(range(1, 61))
    assert full_loss(model) < 0.2 * before, (before, full_loss(model))
    assert state.evals == [] and state.best_step == -1


def test_max_steps_cuts_the_run() -> None:
    cfg = LoopConfig(num_epochs=5, max_steps=7, log_steps=3, eval_steps=0, progress_bar=False)
    state = fit(prepare(Toy(), toy_loader(), cfg), mse_step, cfg)
    assert state.global_step == 7 and state.epoch == 0 and state.batches_in_epoch == 7
    assert [s for s, _ in state.losses] == [1, 3, 6]  # every log_steps, and the first


def test_accumulation_equals_a_big_batch() -> None:
    """Two micro-batches of 4 with grad_accum 2 are one step on the batch of 8: Accelerate
    divides each micro-batch loss by 2, and clipping sees the summed gradient."""
    cfg = LoopConfig(learning_rate=1e-2, num_epochs=2, max_grad_norm=0.05, eval_steps=0, progress_bar=False)
    small, big = Toy(dropout=0.0), Toy(dropout=0.0)
    accumulating = LoopConfig(**{**vars(cfg), "grad_accum": 2})
    accumulated = fit(prepare(small, toy_loader(4, shuffle=False), accumulating), mse_step, accumulating)
    whole = fit(prepare(big, toy_loader(8, shuffle=False), cfg), mse_step, cfg)
    assert accumulated.global_step == whole.global_step == 10
    assert accumulated.rows_seen == whole.rows_seen == 2 * N_EXAMPLES
    for (name, a), b in zip(small.state_dict().items(), big.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_accumulation_remainder_steps_and_every_batch_is_seen() -> None:
    """10 batches an epoch with grad_accum 3: Accelerate steps after batches 3, 6, 9 and on
    the lone 10th (the loader's end syncs), so 4 steps an epoch. Two epochs take 8 steps,
    train on every batch of both, and the linear schedule reaches 0 at the last step."""
    cfg = LoopConfig(learning_rate=1e-2, num_epochs=2, grad_accum=3, log_steps=1, eval_steps=0, progress_bar=False)
    run = prepare(Toy(), toy_loader(4), cfg)
    assert len(run.loader) == N_EXAMPLES // 4 == 10 and run.n_steps == 2 * 4
    state = fit(run, mse_step, cfg)
    assert state.global_step == 8 and [s for s, _ in state.losses] == list(range(1, 9))
    assert state.rows_seen == 2 * N_EXAMPLES and (state.epoch, state.batches_in_epoch) == (1, 10)
    assert run.scheduler.get_last_lr()[0] == 0.0


def test_evaluations_pick_the_best_model(tmp_path: Path) -> None:
    """Scores 1, 3, 2, 5, 4 at steps 2, 4, 6, 8 and 10 (the final one): the best is step
    8, saved with its metrics; the model is saved at each improvement only."""
    scores = iter([1.0, 3.0, 2.0, 5.0, 4.0])
    seen: dict[int, dict[str, torch.Tensor]] = {}
    saves: list[float] = []

    class Scripted:
        primary_metric = "dev"

        def __call__(self, model: nn.Module) -> dict[str, float]:
            assert not model.training  # evaluated in eval mode
            seen[len(seen) + 1] = {k: v.clone() for k, v in model.state_dict().items()}
            return {"dev": next(scores)}

    def save(model: nn.Module, folder: Path, metrics: dict[str, float]) -> None:
        saves.append(metrics["step"])
        save_toy(model, folder, metrics)

    checkpoints = Checkpoints(tmp_path / "ckpt", tmp_path / "best", save)
    cfg = LoopConfig(num_epochs=1, eval_steps=2, eval_at_start=False, progress_bar=False)
    state = fit(prepare(Toy(), toy_loader(), cfg), mse_step, cfg, evaluator=Scripted(), checkpoints=checkpoints)
    assert [e["step"] for e in state.evals] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert (state.best_step, state.best_score) == (8, 5.0)
    assert saves == [2.0, 4.0, 8.0]
    assert best_meta(tmp_path / "best") == {"step": 8.0, "dev": 5.0}
    saved = torch.load(tmp_path / "best" / "model.pt")
    for key, value in seen[4].items():
        assert torch.equal(saved[key], value), key
    assert not (tmp_path / "ckpt").exists()  # save_steps 0: no training state saved
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_step_zero_is_a_candidate_and_wins_when_training_only_hurts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Do no harm: the untouched model is evaluated first (step 0); when every later score
    is lower, the saved best model is the initial weights and the run says so."""
    scores = iter([9.0, 1.0, 3.0, 2.0])
    initial = {k: v.clone() for k, v in Toy().state_dict().items()}

    class Scripted:
        primary_metric = "dev"

        def __call__(self, model: nn.Module) -> dict[str, float]:
            return {"dev": next(scores)}

    checkpoints = Checkpoints(tmp_path / "ckpt", tmp_path / "best", save_toy)
    cfg = LoopConfig(learning_rate=3e-2, num_epochs=1, max_steps=6, eval_steps=2, progress_bar=False)
    with caplog.at_level("WARNING", logger="simcse_kit.training.engine.selection"):
        state = fit(prepare(Toy(), toy_loader(), cfg), mse_step, cfg, evaluator=Scripted(), checkpoints=checkpoints)
    assert [e["step"] for e in state.evals] == [0.0, 2.0, 4.0, 6.0]
    assert (state.best_step, state.best_score) == (0, 9.0)
    saved = torch.load(tmp_path / "best" / "model.pt")
    for key, value in initial.items():
        assert torch.equal(saved[key], value), key
    assert "the best model IS the base model" in caplog.text


def test_evaluator_needs_a_primary_metric() -> None:
    with pytest.raises(TypeError, match="primary_metric"):
        cfg = LoopConfig(progress_bar=False)
        fit(prepare(Toy(), toy_loader(), cfg), mse_step, cfg, evaluator=lambda m: {"score": 0.0})


# --------------------------------------------------------------------------- checkpoints


def test_checkpoints_keep_two_and_own_the_best_model(tmp_path: Path) -> None:
    """Each ``step-N`` holds a hard-linked snapshot of the best model at its step; restore
    puts ``best_dir`` back to it (it may come from steps the resumed run redoes)."""
    accelerator = make_accelerator(LoopConfig(), cpu=True)
    model = accelerator.prepare(Toy())
    checkpoints = Checkpoints(tmp_path / "ckpt", tmp_path / "best", save_toy)
    assert checkpoints.save(accelerator, LoopState(global_step=2), None) == tmp_path / "ckpt" / "step-2"
    checkpoints.save_best(model, {"step": 3.0})
    checkpoints.save(accelerator, LoopState(global_step=3), None)
    snapshot = tmp_path / "ckpt" / "step-3" / "best_model"
    assert os.stat(snapshot / "model.pt").st_ino == os.stat(tmp_path / "best" / "model.pt").st_ino
    checkpoints.save(accelerator, LoopState(global_step=6, best_step=3), None)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-3", "step-6"]  # the newest two

    with torch.no_grad():
        model.out.bias.add_(1.0)
    checkpoints.save_best(model, {"step": 7.0})  # after the last checkpoint, then a kill
    assert best_meta(snapshot) == {"step": 3.0}  # replaced whole, never edited under a link

    state = LoopState()
    assert checkpoints.restore(accelerator, state, None) == tmp_path / "ckpt" / "step-6"
    assert (state.global_step, state.best_step) == (6, 3)
    assert best_meta(tmp_path / "best") == {"step": 3.0}
    # The model's weights come back from step-6 too (saved before the +1).
    assert torch.load(tmp_path / "best" / "model.pt")["out.bias"].item() == model.out.bias.item()

    # A checkpoint from before any best model: a best_dir written after it goes.
    fresh = Checkpoints(tmp_path / "ckpt2", tmp_path / "best2", save_toy)
    fresh.save(accelerator, LoopState(global_step=1), None)
    fresh.save_best(model, {"step": 2.0})
    fresh.restore(accelerator, LoopState(), None)
    assert not (tmp_path / "best2").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_killed_save_leaves_only_ignored_temp_folders(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step-4").mkdir(parents=True)
    (ckpts / "step-4" / LOOP_STATE).write_text("{}")
    (ckpts / ".step-6.tmp").mkdir()  # killed mid-save
    (ckpts / ".step-2.deleting").mkdir()  # killed mid-prune
    (ckpts / "step-8").mkdir()  # no loop_state.json: never renamed into place whole
    assert latest_checkpoint(ckpts) == ckpts / "step-4"
    assert Checkpoints(ckpts).latest() == ckpts / "step-4"
    assert latest_checkpoint(tmp_path / "nothing") is None
    # The next save clears the leftovers.
    Checkpoints(ckpts).save(make_accelerator(LoopConfig(), cpu=True), LoopState(global_step=10), None)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-10", "step-8"]


# --------------------------------------------------------------------------- resume


def fit_run(out: Path, *, resume: bool, crash_at_eval: int | None, grad_accum: int, fast: bool = False) -> tuple[LoopState, dict]:
    model = Toy()
    cfg = LoopConfig(
        learning_rate=1e-2,
        num_epochs=3,
        progress_bar=False,
        eval_steps=2,
        save_steps=3,
        log_steps=1,
        grad_accum=grad_accum,
        mixed_precision="bf16" if fast else "no",
        bf16_weights=fast,
    )
    checkpoints = Checkpoints(out / "ckpt", out / "best", save_toy)
    run = prepare(model, toy_loader(), cfg)
    state = fit(run, mse_step, cfg, evaluator=WeightsScore(crash_at_eval), checkpoints=checkpoints, resume=resume)
    return state, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("grad_accum", "fast"), [(1, False), (2, False), (3, False), (1, True)])
def test_resume_is_exact(tmp_path: Path, grad_accum: int, fast: bool) -> None:
    """The loop restores weights, optimizer, schedule, RNG (dropout), the shuffled order
    and the position inside the epoch: a crash mid-epoch 1 and a resume end bit-equal.
    With bf16 weights the fp32 masters travel in the optimizer state, and the best model
    is saved from them (fp32)."""
    ref_state, ref_weights = fit_run(tmp_path / "a", resume=False, crash_at_eval=None, grad_accum=grad_accum, fast=fast)
    with pytest.raises(Crash):
        fit_run(tmp_path / "b", resume=False, crash_at_eval=5, grad_accum=grad_accum, fast=fast)  # at step 8
    assert sorted(p.name for p in (tmp_path / "b" / "ckpt").iterdir()) == ["step-3", "step-6"]
    state, weights = fit_run(tmp_path / "b", resume=True, crash_at_eval=None, grad_accum=grad_accum, fast=fast)
    assert state.global_step == ref_state.global_step == 3 * math.ceil(10 / grad_accum)  # 3 epochs of 10 batches
    assert state.losses == ref_state.losses and state.evals == ref_state.evals
    for key in ("best_step", "best_score", "rows_seen"):
        assert getattr(state, key) == getattr(ref_state, key), key
    assert math.isfinite(state.best_score)
    for key, value in ref_weights.items():
        assert torch.equal(value, weights[key]), key
    want, got = torch.load(tmp_path / "a" / "best" / "model.pt"), torch.load(tmp_path / "b" / "best" / "model.pt")
    assert {v.dtype for v in got.values()} == {torch.float32}
    for key, value in want.items():
        assert torch.equal(value, got[key]), key
    assert best_meta(tmp_path / "b" / "best") == best_meta(tmp_path / "a" / "best")


def test_resume_from_a_checkpoint_that_stored_the_dev_score_as_stsb_dev(tmp_path: Path) -> None:
    """A checkpoint written before the dev metric was named kept every dev score under
    ``stsb_dev``: resumed, those evaluations take the evaluator's key, so the curve and
    metrics hold one key and the run ends as an uninterrupted one."""
    ref, _ = fit_run(tmp_path / "a", resume=False, crash_at_eval=None, grad_accum=1)
    with pytest.raises(Crash):
        fit_run(tmp_path / "b", resume=False, crash_at_eval=5, grad_accum=1)
    for ckpt in (tmp_path / "b" / "ckpt").iterdir():  # as an older simcse-kit wrote them
        saved = json.loads((ckpt / LOOP_STATE).read_text())
        saved["evals"] = [{("stsb_dev" if k == "score" else k): v for k, v in e.items()} for e in saved["evals"]]
        (ckpt / LOOP_STATE).write_text(json.dumps(saved))
    state, _ = fit_run(tmp_path / "b", resume=True, crash_at_eval=None, grad_accum=1)
    assert state.evals == ref.evals and all("stsb_dev" not in e for e in state.evals)


def test_resume_without_checkpoint_starts_from_scratch(tmp_path: Path) -> None:
    ref, _ = fit_run(tmp_path / "a", resume=False, crash_at_eval=None, grad_accum=2)
    again, _ = fit_run(tmp_path / "b", resume=True, crash_at_eval=None, grad_accum=2)
    assert again.losses == ref.losses and again.evals == ref.evals


# --------------------------------------------------------------------------- Accelerate


def test_runs_with_different_precisions_in_one_process() -> None:
    """Seeds, sweeps and benchmarks build several Accelerators in one process (an autocast
    run, then an fp32 or bf16-weights run); Accelerate's process-wide state would refuse the
    second precision (ValueError) unless make_accelerator resets it."""
    first = make_accelerator(LoopConfig(mixed_precision="bf16", bf16_weights=False), cpu=True)
    assert str(first.mixed_precision) == "bf16"
    second = make_accelerator(LoopConfig(mixed_precision="no"), cpu=True)
    assert str(second.mixed_precision) == "no"
    with second.autocast():
        assert not torch.is_autocast_enabled("cpu")
    third = make_accelerator(LoopConfig(mixed_precision="bf16", bf16_weights=True), cpu=True)
    assert str(third.mixed_precision) == "no"  # bf16 weights: the model itself is bf16, no autocast


def test_make_accelerator_wants_the_precision_decided() -> None:
    """ "auto" is decided once, by the caller, before the config is recorded: the loop, the
    optimiser and the accelerator then read the same values (not three decisions)."""
    for cfg in (LoopConfig(mixed_precision="auto"), LoopConfig(mixed_precision="bf16", bf16_weights="auto")):
        with pytest.raises(ValueError, match="decide 'auto'"):
            make_accelerator(cfg, cpu=True)
