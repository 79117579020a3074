"""The packing plan made by the collator: same packed rows, loss and gradients as packing
in the model, and a packed training step that reads nothing back from the device."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core.batch import PLAN_INPUTS, model_inputs
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.model.packing import pack, plan, plan_batch
from simcse_kit.training.objective.objectives import SimCSEObjective


def mixed_examples(n: int) -> list[dict[str, str]]:
    """Toy sentences, every fourth long enough to be truncated at 16 (a real batch's mix)."""
    short = toy_sentences(n)
    return [{"sent0": s + " " + short[(i + 1) % n] if i % 4 == 0 else s} for i, s in enumerate(short)]


def reference_pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> dict:
    """The packed rows as the model built them before the plan moved to the collator
    (commit 45766b1's ``pack``: scatter by boolean-mask indexing), for parity."""
    from simcse_kit.model.packing import first_fit_decreasing

    lengths = attention_mask.sum(1).tolist()
    b, t = input_ids.shape
    bins = first_fit_decreasing([max(n, 1) for n in lengths], t)
    r = len(bins)
    start = [0] * b
    for row, members in enumerate(bins):
        offset = row * t
        for i in members:
            start[i] = offset
            offset += max(lengths[i], 1)
    tokens = attention_mask.bool()
    positions = torch.arange(t).expand(b, t)
    index = torch.where(tokens, torch.tensor(start)[:, None] + positions, r * t)
    sel = index[tokens]

    def scatter(values: torch.Tensor, fill: int) -> torch.Tensor:
        flat = torch.full((r * t,), fill, dtype=values.dtype)
        flat[sel] = values[tokens]
        return flat.view(r, t)

    segment = scatter(torch.arange(b)[:, None].expand(b, t), -1)
    same = (segment[:, :, None] == segment[:, None, :]) & (segment[:, :, None] >= 0)
    same |= torch.eye(t, dtype=torch.bool)
    return {
        "input_ids": scatter(input_ids, 0),
        "position_ids": scatter(positions, 0),
        "token_type_ids": scatter(token_type_ids, 0),
        "attention_mask": same[:, None],
        "index": index,
    }


def test_plan_gives_the_rows_of_the_old_scatter(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)(mixed_examples(24))
    want = reference_pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    got = pack(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert got is not None and got.rows < 48
    for key, value in want.items():
        assert torch.equal(getattr(got, key), value), key


def test_plan_known_answer_and_declines() -> None:
    # Lengths 3, 1, 2, 0 in rows of 4: FFD puts 3 (i=0) in row 0, 2 (i=2) in row 1,
    # 1 (i=1) in row 0, the empty row (one slot) in row 1.
    got = plan([3, 1, 2, 0], 4, min_saving=0.0)
    assert got is not None
    assert got["pack_source"].tolist() == [0, 1, 2, 4, 8, 9, 16, 16]
    assert got["pack_segment"].tolist() == [[0, 0, 0, 1], [2, 2, -1, -1]]
    assert got["pack_position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]
    assert got["pack_index"].tolist() == [[0, 1, 2, 8], [3, 8, 8, 8], [4, 5, 8, 8], [8, 8, 8, 8]]
    assert plan([4, 4, 4], 4) is None  # nothing to save
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    declined = plan_batch(left)  # left padding: zero packed rows, i.e. "run padded"
    assert set(declined) == set(PLAN_INPUTS) and declined["pack_position_ids"].shape == (0, 3)


def test_plan_of_a_left_padded_batch_known_answer() -> None:
    """A decoder's left-padded rows (lengths 2, 3, 1 ending at column 4) pack as right-padded
    rows would: FFD puts 3 (i=1) and 1 (i=2) in row 0, 2 (i=0) in row 1; each token is read
    from its own column, and unpacked back to it."""
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    got = plan_batch(left, min_saving=0.0, left_padding=True)
    assert got["pack_source"].tolist() == [5, 6, 7, 11, 2, 3, 12, 12]
    assert got["pack_segment"].tolist() == [[1, 1, 1, 2], [0, 0, -1, -1]]
    assert got["pack_position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]
    assert got["pack_index"].tolist() == [[8, 8, 4, 5], [8, 0, 1, 2], [8, 8, 8, 3]]
    holes = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    assert plan_batch(holes, min_saving=0.0, left_padding=True)["pack_position_ids"].shape == (0, 4)  # not one run: padded


def loop_plan(lengths: list[int], t: int, min_saving: float) -> dict[str, torch.Tensor] | None:
    """The plan as commit 44fd089 laid it out: one slice assignment per sentence."""
    from simcse_kit.model.packing import first_fit_decreasing

    b = len(lengths)
    bins = first_fit_decreasing([max(n, 1) for n in lengths], t)
    r = len(bins)
    if not b or r * t > (1.0 - min_saving) * b * t:
        return None
    source, segment = torch.full((r * t,), b * t), torch.full((r * t,), -1)
    positions, index = torch.zeros(r * t, dtype=torch.int64), torch.full((b, t), r * t)
    for row, members in enumerate(bins):
        offset = row * t
        for i in members:
            n = lengths[i]
            source[offset : offset + n] = i * t + torch.arange(n)
            segment[offset : offset + n] = i
            positions[offset : offset + n] = torch.arange(n)
            index[i, :n] = offset + torch.arange(n)
            offset += max(n, 1)
    planned = {"pack_source": source, "pack_index": index}
    return planned | {"pack_position_ids": positions.view(r, t), "pack_segment": segment.view(r, t)}


def test_plan_equals_the_per_sentence_loop() -> None:
    rng = random.Random(0)
    for _ in range(500):
        t = rng.randint(1, 40)
        lengths = [rng.randint(0, t) for _ in range(rng.randint(0, 70))]
        saving = rng.choice([0.0, 0.1, 0.5])
        want, got = loop_plan(lengths, t, saving), plan(lengths, t, saving)
        assert (want is None) == (got is None), lengths
        if want is not None and got is not None:
            for key, value in want.items():
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), (key, lengths, t)


def test_collator_plan_is_dropped_when_a_batch_is_cut_by_rows(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16, packing_plan=True)(mixed_examples(8))
    assert set(PLAN_INPUTS) <= set(model_inputs(batch))
    assert not set(PLAN_INPUTS) & set(model_inputs(batch, slice(0, 4)))  # GradCache chunks re-plan


def loss_and_grads(model: SimCSEModel, batch: dict, objective: SimCSEObjective) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    loss = objective.loss(objective.embed(model, batch), batch)
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pooler", ["avg", "avg_top2"])
def test_planned_step_equals_model_packing(tiny_model_dir: Path, pooler: str) -> None:
    """Loss and every gradient, fp32 with dropout 0: the collator's plan gives exactly what
    packing in the model gives, and the padded batch's up to summation order."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    planned = ContrastiveCollator(tokenizer, "unsup", 16, packing_plan=True)(mixed_examples(24))
    plain = {k: v for k, v in planned.items() if k not in PLAN_INPUTS}
    assert planned["pack_position_ids"].shape[0] < 48  # it really packs
    torch.manual_seed(0)
    cfg = ModelConfig(name_or_path=str(tiny_model_dir), pooler=pooler, mlp="train", dropout=0.0, packing=True)
    model = SimCSEModel.from_config(cfg).train()
    assert model.packing
    objective = SimCSEObjective("unsup", LossConfig())
    want, want_grads = loss_and_grads(model, plain, objective)  # today's path: the model plans
    got, got_grads = loss_and_grads(model, planned, objective)
    assert torch.equal(got, want)
    assert got_grads.keys() == want_grads.keys()
    for name, g in want_grads.items():
        assert torch.equal(got_grads[name], g), name
    model.packing = False  # the padded batch: the same up to float summation order
    padded, padded_grads = loss_and_grads(model, planned, objective)
    torch.testing.assert_close(got, padded, atol=1e-5, rtol=0)
    for name, g in padded_grads.items():
        torch.testing.assert_close(got_grads[name], g, atol=1e-5 * max(1.0, g.abs().max().item()), rtol=0, msg=name)


# Ops that read a device value back to the host, or size their output from data.
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero", "unique", "item")


class HostSyncRecorder(TorchDispatchMode):
    """Records every aten op that would synchronise with a CUDA device."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.syncs.append(name)
        if name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])
        ):
            self.syncs.append(f"{name}[bool mask]")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_reads(calls: list[str]) -> Iterator[None]:
    """Patch the Python-level readbacks (``tolist`` goes around the dispatcher)."""
    saved = {name: getattr(torch.Tensor, name) for name in ("item", "tolist", "__bool__", "__int__", "__index__")}

    def spy(name: str):  # noqa: ANN202
        def wrapped(self: torch.Tensor, *args: object):  # noqa: ANN202
            calls.append(name)
            return saved[name](self, *args)

        return wrapped

    for name in saved:
        setattr(torch.Tensor, name, spy(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def test_planned_training_step_reads_nothing_back(tiny_model_dir: Path) -> None:
    """Forward, loss and backward of a packed step with the collator's plan: no op that
    would wait for a GPU. Without the plan the model's own planning does read back
    (the check is not vacuous)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    planned = ContrastiveCollator(tokenizer, "unsup", 16, packing_plan=True)(mixed_examples(24))
    plain = {k: v for k, v in planned.items() if k not in PLAN_INPUTS}
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train")).train()
    objective = SimCSEObjective("unsup", LossConfig())

    def step(batch: dict) -> list[str]:
        calls: list[str] = []
        recorder = HostSyncRecorder()
        with no_host_reads(calls), recorder:
            objective.loss(objective.embed(model, batch), batch).backward()
        return calls + recorder.syncs

    assert step(planned) == []
    assert step(plain)  # the model plans: lengths read back


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CPU check is the test above)")
def test_planned_step_on_cuda_does_not_synchronise(tiny_model_dir: Path) -> None:
    """On a GPU: forward, loss and backward of a planned packed step under torch's sync
    debug mode "error", which raises on any synchronising call."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16, packing_plan=True)(mixed_examples(24))
    batch = {k: v.cuda() for k, v in batch.items()}
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train")).cuda().train()
    objective = SimCSEObjective("unsup", LossConfig())
    objective.loss(objective.embed(model, batch), batch).backward()  # warm-up: lazy initialisation may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        objective.loss(objective.embed(model, batch), batch).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_partial_plan_is_refused_in_one_line(tiny_model_dir: Path) -> None:
    """The plan's four tensors come together from the collator; a forward given only some
    of them names what is missing instead of failing inside the packing."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    planned = ContrastiveCollator(tokenizer, "unsup", 16, packing_plan=True)(mixed_examples(8))
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), dropout=0.0, packing=True))
    assert model.packing
    model(**planned)  # the whole plan: fine
    partial = {k: v for k, v in planned.items() if k != "pack_segment"}
    with pytest.raises(ValueError, match="a packing plan needs all four of pack_source, pack_index, pack_position_ids"):
        model(**partial)
