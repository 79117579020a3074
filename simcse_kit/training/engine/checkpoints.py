"""Checkpoints: the full training state every ``save_steps`` and the best model so far.

:class:`Checkpoints` owns a run's ``step-N`` folders (written whole into a temp folder,
then renamed; the newest :data:`KEEP_CHECKPOINTS` kept) and its best model, so that
:func:`simcse_kit.training.engine.loop.fit` with ``resume=True`` continues exactly where a killed run
stopped. :class:`LoopState` is what the loop has done so far: saved with each checkpoint,
returned at the end.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from simcse_kit.errors import ConfigError
from simcse_kit.files import atomic_dir, remove_dir, replace_dir, storage_error
from simcse_kit.model.checks import check_weights

logger = logging.getLogger(__name__)

SaveModelFn = Callable[[nn.Module, Path, dict[str, float]], None]

KEEP_CHECKPOINTS = 2  #: the newest complete one, plus one in case the newest is bad
LOOP_STATE = "loop_state.json"  # written last into a checkpoint: its presence marks it complete
LOADER_RNG = "loader_generator.pt"
BEST_SNAPSHOT = "best_model"  # a checkpoint's hard-linked copy of the best model at its step


@dataclass
class LoopState:
    """What the loop has done so far (saved with checkpoints, returned at the end)."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches consumed in the current epoch
    best_score: float = -math.inf
    best_step: int = -1
    rows_seen: int = 0  # batch rows trained on, all processes (text: sentences, V per example)
    train_seconds: float = 0.0  # without evaluations and checkpoint saves
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, [tuple(v) for v in value] if key == "losses" else value)


def checkpoint_step(path: Path) -> int | None:
    """``step-120`` -> 120; anything else (hidden temp or half-deleted folders) -> None."""
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint ``folder/step-N``, or None.

    Only folders named ``step-N`` holding ``loop_state.json`` count: a checkpoint is
    written into a hidden temp folder and renamed into place, so a kill mid-save leaves
    only a temp folder, which is ignored here and deleted by the next save.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir() if checkpoint_step(p) is not None and (p / LOOP_STATE).is_file()]
    return max(done, key=lambda p: checkpoint_step(p) or 0, default=None)


def loop_state_problem(state: object, step: int | None) -> str | None:
    """Why a checkpoint's parsed ``loop_state.json`` cannot be where a resume continues
    (not an object, a negative or non-integer count, a step other than the folder's name
    says), or None."""
    if not isinstance(state, dict):
        return f"expected a JSON object, got {type(state).__name__}"
    counts = ("global_step", "epoch", "batches_in_epoch", "rows_seen")
    for key in counts:
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{key} = {value!r}: must be a whole number >= 0"
    if step is not None and state["global_step"] != step:
        return f"global_step = {state['global_step']} but the folder is step-{step}"
    best = state.get("best_step", -1)
    if not isinstance(best, int) or not -1 <= best <= state["global_step"]:
        return f"best_step = {best!r}: must be in [-1, global_step = {state['global_step']}]"
    return None


def random_state_problem(path: Path) -> str | None:
    """Why an Accelerate ``random_states_N.pkl`` would not restore the RNGs, or None.
    Accelerate's ``load_state`` catches any failure here, logs "Could not load random
    states" at INFO and goes on with fresh RNG: a resume that silently differs."""
    from accelerate.utils import load

    try:
        states = load(path)
    except Exception as exc:  # whatever the unpickler raises, the file is unusable
        return f"{path}: not a random-state file ({type(exc).__name__})"
    keys = ("random_state", "numpy_random_seed", "torch_manual_seed")
    if not isinstance(states, dict) or any(key not in states for key in keys):
        return f"{path}: not a random-state file (expected the keys {list(keys)})"
    return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """What is wrong with a complete-looking checkpoint folder (a truncated or corrupt
    file: a disk that filled, a copy cut short; a loop state no run writes; random states
    that would not restore), or None. Cheap: headers, zip directories and the small
    state files are read, no model tensor."""
    try:
        loop_state = json.loads((ckpt / LOOP_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{ckpt / LOOP_STATE}: {exc}"
    problem = loop_state_problem(loop_state, checkpoint_step(ckpt))
    if problem is not None:
        return f"{ckpt / LOOP_STATE}: {problem}"
    for path in sorted(ckpt.iterdir()):
        # torch.save writes zip archives, whose directory sits at the end: a cut file has none.
        if path.suffix in (".bin", ".pt", ".pkl") and path.is_file():
            try:
                zipfile.ZipFile(path).close()
            except (OSError, zipfile.BadZipFile) as exc:
                return f"{path}: {exc}"
        if path.name.startswith("random_states_") and path.suffix == ".pkl":
            problem = random_state_problem(path)
            if problem is not None:
                return problem
    for folder in (ckpt, ckpt / BEST_SNAPSHOT):
        try:
            check_weights(folder)
        except ConfigError as exc:
            return str(exc)
    return None


def link_tree(src: Path, dst: Path) -> None:
    """Copy folder ``src`` to ``dst`` as hard links (a copy where linking fails).

    Model folders are only ever replaced whole (built elsewhere, then renamed), never
    edited in place, so files shared by links cannot change under a checkpoint.
    """

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


class Checkpoints:
    """A run's checkpoint folder and its best model.

    The full training state goes to ``folder/step-N`` (the newest :data:`KEEP_CHECKPOINTS`
    kept); the best model so far to ``best_dir``. Each checkpoint carries a hard-linked
    snapshot of ``best_dir`` as it was at that step: after a kill, ``best_dir`` may come
    from steps that the resumed run redoes, and :meth:`restore` puts it back to the
    checkpoint's best-so-far.

    Args:
        folder: where the ``step-N`` folders go.
        best_dir: where the best model goes; None: the best is tracked, not saved.
        save_model: ``save_model(model, folder, metrics)`` writes ``model`` into the empty
            ``folder`` (renamed to ``best_dir`` once written); ``metrics`` are the
            evaluation's, with ``"step"``.
    """

    def __init__(self, folder: str | Path, best_dir: str | Path | None = None, save_model: SaveModelFn | None = None) -> None:
        if (best_dir is None) != (save_model is None):
            raise ValueError("Checkpoints: best_dir and save_model go together")
        self.folder = Path(folder)
        self.best_dir = Path(best_dir) if best_dir is not None else None
        self.save_model = save_model

    def latest(self) -> Path | None:
        return latest_checkpoint(self.folder)

    def intact(self) -> Path | None:
        """The newest checkpoint that passes :func:`checkpoint_problem`, saying which newer
        ones were skipped and why; None if there is none at all.

        Raises:
            ConfigError: there are checkpoints, but none intact.
        """
        done = (
            sorted(
                (p for p in self.folder.iterdir() if checkpoint_step(p) is not None and (p / LOOP_STATE).is_file()),
                key=lambda p: checkpoint_step(p) or 0,
                reverse=True,
            )
            if self.folder.is_dir()
            else []
        )
        problems: list[str] = []
        for ckpt in done:
            problem = checkpoint_problem(ckpt)
            if problem is None:
                if problems:
                    logger.warning("resuming from %s, the newest intact checkpoint, instead: %s", ckpt, "; ".join(problems))
                return ckpt
            problems.append(f"{ckpt.name} is damaged ({problem})")
        if problems:
            raise ConfigError(
                f"--resume: no intact checkpoint in {self.folder}: {'; '.join(problems)}; start over with --overwrite"
            )
        return None

    def save_best(self, model: nn.Module, metrics: dict[str, float]) -> None:
        """Replace ``best_dir`` whole with ``model`` (main process only)."""
        if self.best_dir is None or self.save_model is None:
            return
        with atomic_dir(self.best_dir) as tmp:
            self.save_model(model, tmp, metrics)

    def save(self, accelerator: Accelerator, state: LoopState, loader_rng: torch.Tensor | None) -> Path:
        """:meth:`write`; a write that fails for the disk's reasons (full, read-only)
        removes the partial temp folder and raises a one-line StorageError naming the
        checkpoint it was writing (``checkpoints/step-N``, not the hidden temp folder)."""
        try:
            return self.write(accelerator, state, loader_rng)
        except Exception as exc:  # OSError, torch's RuntimeError, safetensors' SafetensorError: storage_error decides
            partial = self.folder / f".step-{state.global_step}.tmp"
            shutil.rmtree(partial, ignore_errors=True)  # it would keep the disk full for the next try
            error = storage_error(exc, self.folder / f"step-{state.global_step}")
            if error is None:
                raise
            raise error from None

    def write(self, accelerator: Accelerator, state: LoopState, loader_rng: torch.Tensor | None) -> Path:
        """Write the full training state to ``folder/step-N`` atomically; keep the newest two.

        Model, optimizer, scheduler, scaler, registered objects and every process's RNG
        states come from ``accelerator.save_state``; the loop position and best-so-far from
        ``state``; the shuffling generator's state at the start of the current epoch from
        ``loader_rng``. All processes must call this (``save_state`` writes per-process
        files, so on several nodes ``folder`` must be on a shared filesystem).
        """
        final = self.folder / f"step-{state.global_step}"
        # Not files.atomic_dir: every process writes into this folder, so its temp name
        # must be the same on all of them (atomic_dir draws a random one).
        tmp = self.folder / f".step-{state.global_step}.tmp"
        if accelerator.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".step-*"):  # leftovers of a killed save or delete
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if loader_rng is not None:
                torch.save(loader_rng, tmp / LOADER_RNG)
            if self.best_dir is not None and self.best_dir.is_dir():
                link_tree(self.best_dir, tmp / BEST_SNAPSHOT)
            (tmp / LOOP_STATE).write_text(json.dumps(state.state_dict()), encoding="utf-8")
            replace_dir(tmp, final)  # a resumed run passing the same step again replaces it
            done = sorted(
                (p for p in self.folder.iterdir() if checkpoint_step(p) is not None), key=lambda p: checkpoint_step(p) or 0
            )
            for old in done[:-KEEP_CHECKPOINTS]:
                remove_dir(old)
            logger.info("saved training state at step %d to %s", state.global_step, final)
        accelerator.wait_for_everyone()
        return final

    def agreed(self, accelerator: Accelerator) -> Path | None:
        """The checkpoint rank 0 resumes from (:meth:`intact` there), on every process; a
        collective. Every process reads it (the weights, the optimizer, its own RNG file
        ``random_states_R.pkl``, which Accelerate skips with an INFO line where it is
        missing, going on with other random numbers), so every process must see it: one
        that does not (a run folder not shared between nodes, a process count changed)
        fails every process with the same line, rather than training a resume that is not one.

        Raises:
            ConfigError: :meth:`intact`'s on rank 0, or a process that does not see rank 0's checkpoint.
        """
        rank = accelerator.process_index
        try:
            mine: tuple[str | None, str | None] = (str(self.intact() or "") or None, None)
        except ConfigError as exc:
            mine = (None, str(exc))
        views: list[tuple[str | None, str | None] | None] = [None] * accelerator.num_processes
        torch.distributed.all_gather_object(views, mine)
        chosen, error = views[0] or (None, None)
        if error is not None:
            raise ConfigError(error)
        rng = f"random_states_{rank}.pkl"
        blind = []
        for other, view in enumerate(views):
            if chosen is None and view is not None and view[0] is not None:
                blind.append(f"rank {other} sees {view[0]}, rank 0 no checkpoint")
        if chosen is not None:
            seen = [(Path(chosen) / LOOP_STATE).is_file(), (Path(chosen) / rng).is_file()]
            flags: list[list[bool] | None] = [None] * accelerator.num_processes
            torch.distributed.all_gather_object(flags, seen)
            blind += [f"rank {r} {'sees no random_states_' + str(r) + '.pkl in it' if f[0] else 'does not see it'}"
                      for r, f in enumerate(flags) if f is not None and not all(f)]  # fmt: skip
        if blind:
            raise ConfigError(
                f"--resume from {chosen or self.folder}: {'; '.join(blind)}. Every process reads the checkpoint: "
                "--output-dir must be the same folder on every node (shared storage), and the launch as many processes"
            )
        return None if chosen is None else Path(chosen)

    def restore(self, accelerator: Accelerator, state: LoopState, generator: torch.Generator | None) -> Path | None:
        """Load the newest checkpoint into the prepared objects, ``state`` and the shuffling
        ``generator``, and put ``best_dir`` back to its snapshot; None if there is none."""
        if accelerator.is_main_process and self.folder.is_dir():
            for stale in self.folder.glob(".step-*"):  # a failed save's leftovers (they may fill the disk)
                shutil.rmtree(stale, ignore_errors=True)
        ckpt = self.intact() if accelerator.num_processes == 1 else self.agreed(accelerator)
        if ckpt is None:
            logger.info("no checkpoint in %s: starting from the beginning", self.folder)
            return None
        accelerator.load_state(str(ckpt))
        state.load_state_dict(json.loads((ckpt / LOOP_STATE).read_text(encoding="utf-8")))
        if generator is not None and (ckpt / LOADER_RNG).is_file():
            generator.set_state(torch.load(ckpt / LOADER_RNG))
        if accelerator.is_main_process and self.best_dir is not None:
            snapshot = ckpt / BEST_SNAPSHOT
            if snapshot.is_dir():
                with atomic_dir(self.best_dir) as tmp:
                    link_tree(snapshot, tmp)
            elif self.best_dir.exists():  # saved by steps after the checkpoint, before any best
                remove_dir(self.best_dir)
        accelerator.wait_for_everyone()
        logger.info("resumed from %s (step %d, epoch %d, batch %d)", ckpt, state.global_step, state.epoch, state.batches_in_epoch)
        return ckpt
