"""AdamW for a model whose weights are bf16, with fp32 master weights.

Autocast keeps fp32 weights and casts them (and the activations) to bf16 around each
matmul; everything between the matmuls (dropout, GELU, LayerNorm, residual adds) stays
fp32. Running the model in bf16 outright halves the bytes those ops move and drops the
casts. The catch is the update: a step of lr 3e-5 is below bf16's resolution for most
weights and would be rounded away, so AdamW updates an fp32 master copy and the bf16
weights are re-rounded from it after every step (as in Megatron / DeepSpeed bf16).

Trainable embedding tables stay fp32 (:func:`bf16_training`): a lookup gains nothing from
bf16, and the word embedding's dense gradient is half the model's parameters, so converting
it to fp32 for the update and the table back to bf16 after it cost more a step than the
lookups themselves. A frozen table (the base under a LoRA adapter) has no gradient to
convert: it is cast to bf16 with the rest of the frozen base, which halves the memory the
base takes (a decoder's vocabulary table is a quarter of Qwen3-0.6B).

**Adapters.** With LoRA only the adapter (and the MLP head) trains: the optimizer keeps its
fp32 masters and the bf16 copies the forward reads are re-rounded from them after every
step, so the adapter's updates are fp32 AdamW's; :meth:`MasterWeightAdamW.fp32_model` hands
the saving code the fp32 adapter.

Gradients that stay put. A dense embedding backward allocates a zeroed table-sized
gradient every time (47 MB on the default model): on CPU a block that large is a fresh
mapping whose every page faults in when zeroed, and GradCache runs a backward per chunk. With
``sparse_tables`` the tables look up with ``sparse=True`` (their backward yields only the
rows used) and keep one dense ``.grad`` across steps, zeroed in place, into which autograd
adds those rows in place. Likewise each master's fp32 gradient buffer is kept and
overwritten, not re-allocated every step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

__all__ = ["MASTER_KEY", "MasterWeightAdamW", "bf16_training"]

MASTER_KEY = "master_weights"


def copy_tensors_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``d.copy_(s)`` for each pair (here: bf16 weights re-rounded from fp32 masters).

    A plain loop, not ``torch._foreach_copy_`` (private): on the default model's bf16 <- fp32
    copies both take the same time, as the copies' memory traffic dominates, and give
    identical tensors.
    """
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over fp32 masters of the given parameters, which it casts to ``dtype``.

    Build it on the fp32 model, before anything else casts it: the masters start from
    the exact fp32 weights. ``step()`` reads the model's (bf16) gradients, updates the
    masters and copies them back into the model. The masters are part of
    ``state_dict()``, so a checkpoint resumes exactly. Parameters in ``keep_fp32``
    are left in fp32 and updated in place, as plain AdamW would.
    """

    def __init__(
        self,
        params: list[dict[str, Any]],
        dtype: torch.dtype = torch.bfloat16,
        keep_fp32: Sequence[torch.Tensor] = (),
        kept_grads: Sequence[torch.Tensor] = (),
        **kwargs: Any,
    ) -> None:
        self.model_params: list[torch.Tensor] = []
        self.masters: list[torch.Tensor] = []
        self.kept = list(keep_fp32)
        # These (of the kept) have a dense .grad zeroed in place, never None: autograd then
        # adds a sparse gradient into it instead of storing the sparse tensor itself.
        self.kept_grad_ids = {id(p) for p in kept_grads}
        for p in kept_grads:
            p.grad = torch.zeros_like(p)
        kept = {id(p) for p in self.kept}
        groups = []
        for group in params:
            masters = []
            for p in group["params"]:
                if id(p) in kept:
                    masters.append(p)  # its own master
                    continue
                master = p.detach().clone().float()
                p.data = p.data.to(dtype)
                self.model_params.append(p)
                self.masters.append(master)
                masters.append(master)
            groups.append({**group, "params": masters})
        super().__init__(groups, **kwargs)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for p, master in zip(self.model_params, self.masters, strict=True):
            if p.grad is None:
                master.grad = None
            elif master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad.copy_(p.grad)  # the buffer of the last step, overwritten
        loss = super().step(closure)
        copy_tensors_(self.model_params, self.masters)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        # Masters' gradients are overwritten by the next step (or dropped there when the
        # model's gradient is None), so they are left alone here.
        for p in self.model_params:
            p.grad = None
        for p in self.kept:
            if id(p) in self.kept_grad_ids:
                if p.grad is None or p.grad.is_sparse:  # e.g. after a user's model.zero_grad()
                    p.grad = torch.zeros_like(p)
                else:
                    p.grad.zero_()
            elif set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[MASTER_KEY] = [m.clone() for m in self.masters]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop(MASTER_KEY, None)
        if masters is None or len(masters) != len(self.masters):
            raise ValueError("optimizer state has no (or mismatched) fp32 master weights: not saved by MasterWeightAdamW")
        with torch.no_grad():
            for mine, saved in zip(self.masters, masters, strict=True):
                mine.copy_(saved)
            copy_tensors_(self.model_params, self.masters)
        super().load_state_dict(state_dict)

    @contextmanager
    def fp32_model(self, model: nn.Module) -> Iterator[nn.Module]:
        """An fp32 copy of ``model`` holding the trained weights (the masters), e.g. to
        save it; ``model`` itself is not touched.

        A copy, not ``model`` cast to fp32 and back, because a parameter whose dtype
        changes is a new leaf to autograd: ``param.data = <other dtype>`` drops the
        parameter's gradient accumulator (``set_data`` resets it on a change of type),
        and the next backward makes a new one. DistributedDataParallel hooks the
        accumulators it found when it wrapped the model, so after a cast there and back
        on the main process alone (saving the best model after an evaluation) its
        backward no longer reached DDP: it all-reduced no gradient bucket, went on to
        the loop's next collective (the divergence guard's all-reduce of 2 flags) and met
        the other processes' first bucket all-reduce there (gloo: "op.preamble.length <=
        op.nbytes. 8576 vs 4 ... Received data size doesn't match expected size"). See
        "Every precision on several processes" in docs/distributed.md.

        Costs one model's worth of memory (in fp32) while the context lasts.
        """
        masters = {id(p): master for p, master in zip(self.model_params, self.masters, strict=True)}
        live = dict(model.named_parameters(remove_duplicate=False))
        # deepcopy keeps shared (tied) parameters shared, and the tables' dtype hooks follow
        # the copy (bf16_training binds them with functools.partial, which deepcopy copies).
        fp32 = copy.deepcopy(model).float()
        with torch.no_grad():
            for name, p in fp32.named_parameters(remove_duplicate=False):
                master = masters.get(id(live[name]))
                if master is not None:
                    p.copy_(master)  # the kept fp32 tables were copied exactly already
        yield fp32


def bf16_training(model: nn.Module, groups: list[dict[str, Any]], sparse_tables: bool = False, **adamw: Any) -> MasterWeightAdamW:
    """Cast ``model`` to bf16 for training and return AdamW with fp32 master weights.

    Trainable embedding tables stay fp32 and every table's output is cast to the dtype of
    the layers after it, so the rest of the model runs in bf16 (see the module docstring).
    Frozen parameters (frozen tables included) and floating buffers are cast too; the
    optimizer owns the trainable ones.

    Args:
        model: an fp32 model, not yet cast.
        groups: AdamW parameter groups over ``model``'s trainable parameters.
        sparse_tables: trainable tables look up with ``sparse=True`` and add their rows'
            gradient into a dense ``.grad`` kept across steps (the module docstring).
            Not under DistributedDataParallel, which expects such a table's ``.grad``
            to be sparse.
        adamw: keyword arguments of ``torch.optim.AdamW`` (lr, fused, ...).
    """
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    trainable = {id(p) for g in groups for p in g["params"]}
    kept = [m.weight for m in tables if id(m.weight) in trainable]  # frozen tables go bf16
    sparse = [m for m in tables if sparse_tables and id(m.weight) in trainable]
    for table in sparse:
        table.sparse = True
    grads = [m.weight for m in sparse]
    optimizer = MasterWeightAdamW(groups, dtype=torch.bfloat16, keep_fp32=kept, kept_grads=grads, **adamw)
    skip = {id(p) for p in kept}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point() and id(tensor) not in skip and tensor.dtype != torch.bfloat16:
            tensor.data = tensor.data.to(torch.bfloat16)
    compute = next((p for p in model.parameters() if id(p) not in skip), None)
    if compute is not None:
        for table in tables:
            # A partial, not a closure: a deepcopy of the model (MasterWeightAdamW.fp32_model)
            # copies its arguments, so the copy's tables follow the copy's compute dtype.
            table.register_forward_hook(partial(_to_compute_dtype, compute))
    return optimizer


def _to_compute_dtype(compute: torch.Tensor, _module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """A table's forward hook: its output in the dtype the layers after it compute in,
    read at call time (``compute`` is one of those layers' parameters)."""
    return output.to(compute.dtype)
