"""Sharded engines (FSDP2, DeepSpeed ZeRO) under the kit's loop: what changes and what is refused.

The engine is Accelerate's choice, made by ``accelerate launch --config_file ...`` (the
YAML files in ``docs/accelerate/``): the kit reads it from the Accelerator and adapts the
few places where a sharded engine behaves differently from DDP:

- **weights sharded** (FSDP, ZeRO-3): no process holds the full weights, so the main
  process cannot evaluate or save the prepared model alone. At each evaluation every
  process takes part in ``accelerator.get_state_dict`` (a collective), and the main
  process loads the full weights into an unsharded copy of the model made before
  ``prepare`` (:class:`FullCopy`), which it evaluates and saves as the best model;
- **the optimiser step inside backward** (DeepSpeed): ``accelerator.backward`` runs the
  engine's step (clipping, update, schedule) at the accumulation boundary, so the
  schedule moves once per optimiser step, clipping is DeepSpeed's ``gradient_clipping``,
  and GradCache (whose full-batch ``backward`` holds no parameter gradient yet) cannot
  work.

What does not compose is refused before the run folder exists (:func:`check_engine`).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, is_deepspeed_available, parse_flag_from_env
from torch import nn

from simcse_kit.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["Engine", "FullCopy", "check_engine", "check_requested", "engine_of", "requested_engine"]


@dataclass(frozen=True)
class Engine:
    """How the run's processes hold the model.

    Attributes:
        name: for messages: ``"DDP"`` (also one process), ``"FSDP2"``, ``"FSDP1"``,
            ``"DeepSpeed ZeRO-N"``.
        shards_weights: no process holds the full weights (FSDP, ZeRO-3).
        steps_in_backward: ``accelerator.backward`` runs the optimiser step (DeepSpeed).
        clip: DeepSpeed's ``gradient_clipping`` (None: not DeepSpeed, or no clipping).
        requested: the engine ``accelerate launch`` asked for (its ``ACCELERATE_USE_FSDP``
            or ``ACCELERATE_USE_DEEPSPEED``), which Accelerate may not have set up.
    """

    name: str = "DDP"
    shards_weights: bool = False
    steps_in_backward: bool = False
    clip: float | None = None
    requested: str | None = None


def engine_of(accelerator: Accelerator) -> Engine:
    """The engine Accelerate was configured with (``accelerate launch --config_file``)."""
    kind, requested = accelerator.distributed_type, requested_engine()
    if kind == DistributedType.FSDP:
        return Engine("FSDP2" if accelerator.is_fsdp2 else "FSDP1", shards_weights=True, requested=requested)
    if kind == DistributedType.DEEPSPEED:
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        stage = int(config.get("zero_optimization", {}).get("stage", 0))
        # Accelerate fills an unset ("auto") gradient_clipping with 1.0 at prepare.
        clip = config.get("gradient_clipping", "auto")
        clip = 1.0 if clip == "auto" else (float(clip) or None)
        return Engine(
            f"DeepSpeed ZeRO-{stage}", shards_weights=stage == 3, steps_in_backward=True, clip=clip, requested=requested
        )
    return Engine(requested=requested)


def requested_engine() -> str | None:
    """The sharded engine that ``accelerate launch`` (its config file or flags) asked for
    through the environment: ``"FSDP"``, ``"DeepSpeed"`` or None."""
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        return "DeepSpeed"
    if parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return "FSDP"
    return None


def check_engine(engine: Engine, settings: dict[str, Any]) -> None:
    """Refuse the settings a sharded engine cannot run, naming the config keys.

    Args:
        engine: the run's (:func:`engine_of`).
        settings: config key -> value, of those that matter here: ``train.bf16_weights``,
            ``train.fast_dropout``, ``train.grad_cache_chunk``, ``loss.queue_size``,
            ``train.max_grad_norm``, ``train.grad_accum`` (a missing key is not checked)
            and ``accelerate.gradient_accumulation_steps`` (what the Accelerator took).

    Raises:
        ConfigError: one line naming the keys and the engine.
    """
    problems = []
    accumulate = settings.get("accelerate.gradient_accumulation_steps")
    if accumulate is not None and "train.grad_accum" in settings and accumulate != settings["train.grad_accum"]:
        # ACCELERATE_GRADIENT_ACCUMULATION_STEPS (a DeepSpeed config's, or accelerate
        # launch --gradient_accumulation_steps) overrides the Accelerator's argument.
        problems.append(
            f"'train.grad_accum' = {settings['train.grad_accum']} but accelerate launch set gradient accumulation to "
            f"{accumulate} (leave gradient_accumulation_steps out of the launch: the recipe decides)"
        )
    if engine.name == "DDP":
        if engine.requested:
            raise ConfigError(not_available(engine.requested))
        if problems:
            raise ConfigError("; ".join(problems))
        return
    # bf16 weights keep their own fp32 masters beside the (sharded) parameters, and fast
    # dropout swaps the attention module's code: neither was built for a sharded module.
    for key in ("train.bf16_weights", "train.fast_dropout"):
        if settings.get(key) is True:
            problems.append(f"'{key}' = true (a CPU fast path; use false or auto)")
    if engine.shards_weights and settings.get("loss.queue_size", 0):
        # The momentum encoder is an unsharded copy updated from the online weights.
        problems.append(f"'loss.queue_size' = {settings['loss.queue_size']} (the momentum encoder needs full weights)")
    if engine.steps_in_backward and settings.get("train.grad_cache_chunk", 0):
        # GradCache's backward of the full-batch loss reaches no parameter, yet the engine steps there.
        problems.append(f"'train.grad_cache_chunk' = {settings['train.grad_cache_chunk']} (DeepSpeed steps inside backward)")
    if engine.steps_in_backward and "train.max_grad_norm" in settings and settings["train.max_grad_norm"] != engine.clip:
        problems.append(
            f"'train.max_grad_norm' = {settings['train.max_grad_norm']} but DeepSpeed clips at {engine.clip} "
            "(set gradient_clipping in the accelerate config's deepspeed_config to the same value)"
        )
    if problems:
        raise ConfigError(f"not with {engine.name}: {'; '.join(problems)}")


def not_available(requested: str) -> str:
    # Accelerate sets these engines up on GPUs only; on CPU processes it quietly trains
    # plain DDP instead (FSDP), or gives each process a world of its own (DeepSpeed 0.19:
    # N separate trainings), or fails with a traceback (DeepSpeed not installed).
    return (
        f"the accelerate config asks for {requested}, but Accelerate runs it on GPUs only and would not use it here: "
        "launch without that config (torchrun, or accelerate launch --multi_cpu) on a machine without CUDA"
    )


def check_requested(cpu: bool) -> None:
    """Before the Accelerator exists: refuse a sharded engine that ``accelerate launch``
    asked for where it cannot run (CPU processes; DeepSpeed not installed).

    Raises:
        ConfigError: one line naming the engine and what to do.
    """
    requested = requested_engine()
    if requested and cpu:
        raise ConfigError(not_available(requested))
    if requested == "DeepSpeed" and not is_deepspeed_available():
        raise ConfigError("the accelerate config asks for DeepSpeed, which is not installed: pip install deepspeed")


class FullCopy:
    """An unsharded copy of the model on the main process, refreshed from the sharded one.

    Made before ``accelerator.prepare`` shards the model (on the CPU, so it costs host
    memory, not accelerator memory); :meth:`refresh` is a collective that every process
    must call, after which the main process's copy holds the current full weights.

    Args:
        model: the model before ``accelerator.prepare``.
        accelerator: the run's.
    """

    def __init__(self, model: nn.Module, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.model = copy.deepcopy(model).to("cpu") if accelerator.is_main_process else None

    def refresh(self, prepared: nn.Module) -> nn.Module | None:
        """Gather the full weights of ``prepared`` (all processes call this); the main
        process gets its copy with them on the accelerator's device, the others None."""
        state = self.accelerator.get_state_dict(prepared)  # a collective: full weights on the main process
        if self.model is None:
            return None
        self.model.load_state_dict(state)  # strict: every weight comes from the gathered state
        return self.model.to(self.accelerator.device)

    def release(self) -> None:
        """Back to the CPU after evaluating (the accelerator's memory is the engine's)."""
        if self.model is not None:
            self.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
