"""Two real gloo processes on CPU: loss and gradients equal one process on the whole batch.

Each process encodes half the batch with the same tiny BERT (dropout off, so both
computations see the same network), gathers the other process's candidates with
gradient, computes the loss on its local anchors, then averages loss and parameter
gradients over processes (what DDP does). That must equal the mean loss of a single
process on the concatenated batch and its gradient, in fp32 to 1e-5, for the 2N-view,
pair (``sup``, SimCSE's ``z1 . z2^T``), triplet (hard negatives) and SupCon forms, for the
score-ranking loss of ``scored`` pairs (every process ranks all processes' pairs) and for the
teacher-score terms (``loss.distill``: each process's own anchors and candidates, their scores
travelling with their rows).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import toy_sentences
from test_gradcache import assert_grads_equal
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core import distributed, losses
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.objective.objectives import SimCSEObjective

WORLD = 2
PER_RANK = 4  # examples per process
TOL = 1e-5

# (case name, mode, loss options): every form the objectives gather for.
CASES = [
    ("views", "unsup", {"unsup_loss": "views"}),
    ("paper", "unsup", {"unsup_loss": "paper"}),
    ("sup", "sup", {}),
    ("hardneg", "hardneg", {"hard_negative_weight": 2.0}),
    # Score ranking over the pairs of both processes, alone and beside InfoNCE.
    ("scored", "scored", {}),
    ("scored-angle-mix", "scored", {"score_loss": "angle", "score_weight": 0.5}),
    # A teacher's scores of each anchor's own candidates: local terms, beside the gathered InfoNCE.
    ("distill-kl-mix", "hardneg", {"distill": "kl", "distill_weight": 0.5}),
    ("distill-margin_mse", "hardneg", {"distill": "margin_mse"}),
    # Quantization-aware terms on the gathered candidates (int8 ranges from them: the same on both processes).
    # (int8 codes carry 1 / step ~ 100 into the gradients: a small weight keeps them at the scale TOL is set for.)
    ("qat-int8-sup", "sup", {"quantization": "int8", "quantization_weight": 0.02}),
    ("qat-binary-hardneg-matryoshka", "hardneg", {"quantization": "binary", "matryoshka_dims": [32, 16]}),
]


def examples(n: int) -> list[dict[str, str]]:
    s = toy_sentences(3 * n)
    # Graded scores (with ties) that interleave across the two processes' halves.
    return [
        {"sent0": s[i], "sent1": s[n + i], "hard_neg": s[2 * n + i], "score": float(i * 7 % 5), "scores": [0.8, 0.1 * (i % 4)]}
        for i in range(n)
    ]


# SupCon labels over the global batch: classes shared across the two processes, so a
# positive of a rank-0 anchor lives on rank 1 and is only found through the gather.
SUPCON_LABELS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 4])


def build(model_dir: str) -> tuple[SimCSEModel, ContrastiveCollator, ContrastiveCollator]:
    torch.manual_seed(0)  # the MLP head is initialised at random: same weights everywhere
    model = SimCSEModel.from_config(ModelConfig(name_or_path=model_dir, pooler="avg", mlp="train", dropout=0.0))
    model.train()  # MLP "train" is on; dropout is 0 so the forward is deterministic
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, ContrastiveCollator(tokenizer, "unsup", 16), ContrastiveCollator(tokenizer, "sup", 16)


def run_case(
    model: SimCSEModel, model_dir: str, mode: str, options: dict, exs: list[dict[str, str]]
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients of ``exs`` under the objective (gathering if distributed)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05, gather=True, **options))
    model.zero_grad()
    collator = ContrastiveCollator(tokenizer, mode, 16, teacher_scores="distill" in options)
    loss = objective.step(model, collator(exs))  # backward=None: loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def supcon_case(
    model: SimCSEModel, collator: ContrastiveCollator, exs: list[dict[str, str]], labels: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor]]:
    """SupCon at the loss-core level: one view per example, gathered with its labels."""
    model.zero_grad()
    emb = model(**{k: v for k, v in collator(exs).items()})[0::2]  # unsup collator: each row twice
    ref, offset = distributed.gather_with_grad(emb)
    loss = losses.supcon(
        emb, labels, temperature=0.1, ref_embeddings=ref, ref_labels=distributed.gather_labels(labels), offset=offset
    )
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def average(loss: float, grads: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """What DDP does: mean of the per-process losses and gradients."""
    t = torch.tensor([loss], dtype=torch.float64)
    dist.all_reduce(t)
    for g in grads.values():
        dist.all_reduce(g)
        g /= WORLD
    return t.item() / WORLD, grads


def worker(rank: int, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        model, unsup_collator, _ = build(model_dir)
        exs = examples(WORLD * PER_RANK)[rank * PER_RANK : (rank + 1) * PER_RANK]
        results: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
        for name, mode, options in CASES:
            results[name] = average(*run_case(model, model_dir, mode, options, exs))
        local_labels = SUPCON_LABELS[rank * PER_RANK : (rank + 1) * PER_RANK]
        results["supcon"] = average(*supcon_case(model, unsup_collator, exs, local_labels))
        # Uneven row counts (3 and 5): padding must not leak into the gathered rows.
        rows = torch.arange(3 if rank == 0 else 5, dtype=torch.float32).view(-1, 1) + 100 * rank
        gathered, offset = distributed.gather_with_grad(rows.requires_grad_())
        labels = distributed.gather_labels(torch.full((rows.shape[0],), rank))
        if rank == 0:
            torch.save(
                {
                    "results": results,
                    "uneven": gathered.detach(),
                    "offset": offset,
                    "labels": labels,
                    "world": distributed.world_size(),
                },
                Path(out_dir) / "rank0.pt",
            )
        else:
            torch.save({"offset": offset, "rank": distributed.rank()}, Path(out_dir) / "rank1.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes (~14 s CPU)
def test_two_processes_equal_one_process_on_concatenated_batch(tmp_path: Path, tiny_model_dir: Path) -> None:
    mp.spawn(worker, args=(str(tiny_model_dir), str(tmp_path)), nprocs=WORLD, join=True)
    got = torch.load(tmp_path / "rank0.pt")
    other = torch.load(tmp_path / "rank1.pt")
    assert got["world"] == 2 and other["rank"] == 1

    # Reference: one process (no process group: gathering is a no-op) on all 8 examples.
    assert not distributed.is_distributed()
    model, unsup_collator, _ = build(str(tiny_model_dir))
    exs = examples(WORLD * PER_RANK)
    for name, mode, options in CASES:
        want_loss, want_grads = run_case(model, str(tiny_model_dir), mode, options, exs)
        loss, grads = got["results"][name]
        assert abs(loss - want_loss) < TOL, (name, loss, want_loss)
        assert_grads_equal(grads, want_grads, atol=TOL)  # TOL per unit of each tensor's largest entry
    want_loss, want_grads = supcon_case(model, unsup_collator, exs, SUPCON_LABELS)
    loss, grads = got["results"]["supcon"]
    assert abs(loss - want_loss) < TOL
    assert_grads_equal(grads, want_grads, atol=TOL)

    # The gather must really widen the batch: a process alone (its 4 examples) gets
    # a different loss from the gathered one.
    alone, _ = run_case(model, str(tiny_model_dir), "sup", {}, exs[:PER_RANK])
    assert abs(alone - got["results"]["sup"][0]) > 1e-3
    # ... and so must the ranking: the mean of the two halves' CoSENT losses is not the whole batch's.
    halves = [run_case(model, str(tiny_model_dir), "scored", {}, exs[r * PER_RANK : (r + 1) * PER_RANK])[0] for r in range(WORLD)]
    assert abs(sum(halves) / WORLD - got["results"]["scored"][0]) > 1e-3

    # Uneven sizes: rank order, no padding rows; offsets are the cumulative counts.
    assert got["uneven"].view(-1).tolist() == [0.0, 1.0, 2.0, 100.0, 101.0, 102.0, 103.0, 104.0]
    assert got["offset"] == 0 and other["offset"] == 3
    assert got["labels"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]


def test_single_process_gather_is_identity() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    gathered, offset = distributed.gather_with_grad(x)
    assert gathered is x and offset == 0
    assert distributed.world_size() == 1 and distributed.rank() == 0
    labels = torch.tensor([3, 1])
    assert distributed.gather_labels(labels) is labels


def test_cli_destroys_the_process_group_before_exit(tmp_path: Path) -> None:
    """Left to interpreter shutdown, a gloo group can abort a finished worker (SIGABRT,
    "terminate called without an active exception") and torchrun fails the job; the
    console script must destroy it itself, on success and on a user error alike."""
    from simcse_kit.cli import main as cli_main

    for argv, want in ((["recipes"], 0), (["train", str(tmp_path / "missing.yaml")], 2)):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous-{want}", rank=0, world_size=1)
        try:
            assert cli_main(argv) == want
            assert not dist.is_initialized()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
