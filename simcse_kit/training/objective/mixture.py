"""A run's objective: one per dataset (``data.datasets``, or ``train_file`` as a list of one),
each batch in its dataset's mode.

A batch comes from one dataset (:mod:`simcse_kit.data.mixture`) and names it. The
:class:`MixtureObjective` holds one :class:`~simcse_kit.training.objective.objectives.SimCSEObjective`
per dataset (its mode, its ``k`` hard negatives) and gives each batch its dataset's loss:
the mode decides the views per example and who is contrasted with whom
(:mod:`simcse_kit.core.modes`). :class:`DatasetTally` counts each dataset's examples and
sums its losses, for ``metrics.json`` and the trackers; it is checkpointed with the run, so
a resumed run reports what an uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from simcse_kit.core.batch import model_inputs
from simcse_kit.data.mixture import DATASET_KEY
from simcse_kit.training.engine.steps import Backward, Batch, Queue, backpropagate
from simcse_kit.training.objective.objectives import SimCSEObjective
from simcse_kit.training.objective.parts import LossSettings

__all__ = ["DatasetTally", "MixtureObjective"]


class DatasetTally:
    """Per dataset: batches, examples (all processes) and the sum of its batches' losses.

    The losses are kept on the loss's device and, with several processes, averaged over
    them at each step (one scalar all-reduce, no read-back), so every process holds the same
    tally and the main process's checkpoint of it is every process's.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.batches = dict.fromkeys(self.names, 0)
        self.examples = dict.fromkeys(self.names, 0)
        self.loss_sums: dict[str, torch.Tensor] = {name: torch.zeros((), dtype=torch.float64) for name in self.names}

    def add(self, name: str, examples: int, loss: torch.Tensor) -> None:
        """One step of dataset ``name``: ``examples`` over all processes, this process's ``loss``."""
        value = loss.detach().to(torch.float64)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            value = value.clone()
            dist.all_reduce(value)
            value /= dist.get_world_size()
        self.loss_sums[name] = self.loss_sums[name].to(value.device) + value
        self.batches[name] += 1
        self.examples[name] += examples

    def report(self) -> dict[str, dict[str, float]]:
        """``{name: {batches, examples, mean_loss}}`` (reads the sums back: at log steps and the end)."""
        return {
            name: {
                "batches": self.batches[name],
                "examples": self.examples[name],
                "mean_loss": float(self.loss_sums[name]) / self.batches[name] if self.batches[name] else float("nan"),
            }
            for name in self.names
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "batches": dict(self.batches),
            "examples": dict(self.examples),
            "loss_sums": {name: value.cpu() for name, value in self.loss_sums.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.batches, self.examples = dict(state["batches"]), dict(state["examples"])
        self.loss_sums = {name: torch.as_tensor(value, dtype=torch.float64) for name, value in state["loss_sums"].items()}


@dataclass
class MixtureObjective:
    """One objective per dataset; a batch takes the loss of the dataset it names.

    The plain step of the step contract (:mod:`simcse_kit.training.engine.steps`), and the
    objective GradCache and the momentum queue wrap: :meth:`of` gives them a batch's own
    objective (its views per example), :meth:`loss` its loss. Each loss is tallied
    (:class:`DatasetTally`): every step computes one loss per batch.

    Attributes:
        objectives: each dataset's objective (its mode and ``k``), by name.
        processes: processes of the run (a batch's examples are this process's share).
    """

    objectives: dict[str, SimCSEObjective]
    processes: int = 1
    tally: DatasetTally = field(init=False)
    latest: SimCSEObjective | None = field(init=False, default=None)  # the objective of the latest batch

    def __post_init__(self) -> None:
        self.tally = DatasetTally(list(self.objectives))

    @property
    def loss_cfg(self) -> LossSettings:
        """The loss settings, every dataset's."""
        return next(iter(self.objectives.values())).loss_cfg

    def of(self, batch: Mapping[str, Any] | None) -> SimCSEObjective:
        """The objective of the batch's dataset."""
        if batch is None or DATASET_KEY not in batch:
            raise ValueError(f"a mixture's batch names its dataset ({DATASET_KEY!r}: MixtureCollator adds it)")
        return self.objectives[batch[DATASET_KEY]]

    def embed(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Encode every row of a tokenised batch: ``[B, H]``."""
        return model(**model_inputs(batch))

    def loss(self, embeddings: torch.Tensor, batch: Batch | None = None, queue: Queue | None = None) -> torch.Tensor:
        """The batch's dataset's loss (:meth:`SimCSEObjective.loss`) of its ``[B, H]`` embeddings, tallied."""
        objective = self.latest = self.of(batch)
        loss = objective.loss(embeddings, batch, queue)
        examples = embeddings.shape[0] // objective.views_per_example() * self.processes
        self.tally.add(batch[DATASET_KEY], examples, loss)  # type: ignore[index,arg-type]  # of() checked the name, a str
        return loss

    def step(self, model: nn.Module, batch: Batch, backward: Backward | None = None) -> torch.Tensor:
        """Embed, the dataset's loss (tallied), ``backward(loss)``; the detached loss."""
        return backpropagate(self.loss(self.embed(model, batch), batch), backward)

    __call__ = step

    def metrics(self) -> dict[str, float]:
        """The trackers' counters: the latest batch's objective's (its loss terms, the entries
        it masked), per dataset its examples so far and mean loss, and the entries masked and
        dropped by the guide over every dataset."""
        out = self.latest.metrics() if self.latest is not None else {}
        for name, row in self.tally.report().items():
            out |= {f"{name}/examples": float(row["examples"]), f"{name}/mean_loss": row["mean_loss"]}
        if self.masking:
            out["masked_negatives_total"] = float(self.masked_negatives)
        if "guide_masked_total" in out:
            out["guide_masked_total"] = float(self.guided_total)
        return out

    @property
    def masking(self) -> bool:
        """True when some negatives may be masked (the same loss settings in every dataset)."""
        return any(objective.masking for objective in self.objectives.values())

    @property
    def masked_negatives(self) -> int:
        """Masked (anchor, candidate) entries over all batches of all datasets."""
        return sum(objective.masked_negatives for objective in self.objectives.values())

    @property
    def guided_total(self) -> int:
        """(anchor, candidate) entries the guide dropped over all batches of all datasets."""
        return sum(objective.guided_total for objective in self.objectives.values())

    def examples_seen(self) -> int:
        """Examples trained on so far, all datasets and processes."""
        return sum(self.tally.examples.values())
