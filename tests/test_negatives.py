"""False-negative masking removes exactly the duplicate negatives; the momentum queue's
negatives enter the loss with no gradient into the momentum encoder.

References are naive per-anchor Python loops in fp64 over explicit candidate lists.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core.batch import text_ids
from simcse_kit.core.masks import false_negative_mask, similar_candidate_mask
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import MomentumQueueStep
from simcse_kit.training.objective.momentum_queue import MomentumQueue
from simcse_kit.training.objective.objectives import SimCSEObjective

TAU = 0.05


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def naive_info_nce(anchor: torch.Tensor, positive: torch.Tensor, negatives: list[tuple[torch.Tensor, float]]) -> float:
    """``-log(e^{s+} / (e^{s+} + sum_j w_j e^{s_j}))`` with ``s = cos / tau``."""
    pos = math.exp(cos(anchor, positive) / TAU)
    denom = pos + sum(w * math.exp(cos(anchor, v) / TAU) for v, w in negatives)
    return -math.log(pos / denom)


def views_reference(
    emb: torch.Tensor, texts: list[str], mask: bool, extra: list[tuple[torch.Tensor, str]] = ()
) -> tuple[float, int]:
    """2N-view InfoNCE: each row's positive is its neighbour; with ``mask`` every other
    row (and queue entry) with the same text is dropped. Returns (loss, dropped)."""
    total, dropped = 0.0, 0
    n = emb.shape[0]
    for i in range(n):
        pos = i ^ 1
        negs = []
        for j in range(n):
            if j in (i, pos):
                continue
            if mask and texts[j] in (texts[i], texts[pos]):
                dropped += 1
                continue
            negs.append((emb[j], 1.0))
        for vec, text in extra:
            if mask and text in (texts[i], texts[pos]):
                dropped += 1
                continue
            negs.append((vec, 1.0))
        total += naive_info_nce(emb[i], emb[pos], negs)
    return total / n, dropped


def views_batch(texts: list[str]) -> dict[str, torch.Tensor]:
    rows = [t for t in texts for _ in range(2)]
    return {"text_ids": text_ids(rows)}


# --------------------------------------------------------------------------- text ids and the mask


def test_text_ids_equal_exactly_for_equal_texts() -> None:
    ids = text_ids(["a dog", "a dog", "a Dog", "a dog ", ""])
    assert ids.dtype == torch.int64 and ids.shape == (5,)
    assert ids[0] == ids[1]
    assert len(set(ids[1:].tolist())) == 4  # case and whitespace count: exact texts only
    # Stable across processes and runs (Python's hash() is salted, this is not).
    assert text_ids(["a dog"]).item() == -4081912340589182210


def test_false_negative_mask_by_hand() -> None:
    # anchors: A, B, C; candidates (their positives then two extra): a, b, a, A, z
    anchor_ids = torch.tensor([1, 2, 3])
    candidate_ids = torch.tensor([11, 12, 11, 1, 99])
    positive = torch.tensor([0, 1, 2])
    got = false_negative_mask(anchor_ids, candidate_ids, positive)
    want = torch.tensor(
        [
            [False, False, True, True, False],  # A: candidate 2 repeats its positive, 3 repeats A itself
            [False, False, False, False, False],
            [True, False, False, False, False],  # C's positive is "a": candidate 0 is a copy
        ]
    )
    assert torch.equal(got, want)
    # With anchor groups: candidate 1 is the positive of an anchor with text id 1 (= A).
    got = false_negative_mask(anchor_ids, candidate_ids, positive, candidate_anchor_ids=torch.tensor([1, 1, 3, 1, 99]))
    assert got[0].tolist() == [False, True, True, True, False]


def test_false_negative_mask_matches_loop_on_random_ids() -> None:
    gen = torch.Generator().manual_seed(0)
    anchor_ids = torch.randint(0, 4, (9,), generator=gen)
    candidate_ids = torch.randint(0, 4, (13,), generator=gen)
    positive = torch.randint(0, 13, (9,), generator=gen)
    got = false_negative_mask(anchor_ids, candidate_ids, positive)
    for i in range(9):
        for j in range(13):
            want = j != positive[i] and candidate_ids[j] in (anchor_ids[i], candidate_ids[positive[i]])
            assert bool(got[i, j]) == bool(want), (i, j)


# --------------------------------------------------------------------------- masking inside the objective


@pytest.mark.parametrize("unsup_loss", ["views", "paper"])
def test_unsup_masking_removes_exactly_the_duplicates(unsup_loss: str) -> None:
    texts = ["x", "y", "x", "z", "x"]  # "x" three times
    torch.manual_seed(0)
    emb = torch.randn(2 * len(texts), 8, dtype=torch.float64)
    batch = views_batch(texts)
    rows = [t for t in texts for _ in range(2)]
    masked = SimCSEObjective("unsup", LossConfig(temperature=TAU, mask_false_negatives=True, unsup_loss=unsup_loss))
    plain = SimCSEObjective("unsup", LossConfig(temperature=TAU, unsup_loss=unsup_loss))
    if unsup_loss == "views":
        want, dropped = views_reference(emb, rows, mask=True)
        assert dropped == 6 * 4  # each of the 6 "x" rows loses the 4 other "x" rows but its own pair
        assert abs(plain.loss(emb).item() - views_reference(emb, rows, mask=False)[0]) < 1e-9
    else:  # z1 . z2^T: anchor i against the second views, positive i
        n = len(texts)
        total, dropped = 0.0, 0
        for i in range(n):
            negs = [(emb[2 * j + 1], 1.0) for j in range(n) if j != i and texts[j] != texts[i]]
            dropped += sum(1 for j in range(n) if j != i and texts[j] == texts[i])
            total += naive_info_nce(emb[2 * i], emb[2 * i + 1], negs)
        want = total / n
        assert dropped == 6
    got = masked.loss(emb, batch)
    assert abs(got.item() - want) < 1e-9
    assert masked.last_masked == dropped == masked.masked_negatives
    # No duplicates: masking changes nothing and counts nothing.
    fresh = SimCSEObjective("unsup", LossConfig(temperature=TAU, mask_false_negatives=True, unsup_loss=unsup_loss))
    distinct = ["p", "q", "r", "s", "t"]
    assert torch.allclose(fresh.loss(emb, views_batch(distinct)), plain.loss(emb), atol=1e-12)
    assert fresh.masked_negatives == 0


def test_sup_and_hardneg_masking_by_loop() -> None:
    # Premise "p" twice (its entailments are positives of both copies), and example 2's
    # hard negative repeats example 3's positive.
    s0 = ["p", "p", "q", "r"]
    s1 = ["e1", "e2", "f", "g"]
    neg = ["c1", "c2", "g", "c4"]
    torch.manual_seed(1)
    emb = torch.randn(12, 6, dtype=torch.float64)  # example-major: [p1, e1, c1, p2, e2, c2, ...]
    a, pos, hard = emb[0::3], emb[1::3], emb[2::3]
    alpha = 2.0
    batch = {"text_ids": text_ids([t for example in zip(s0, s1, neg, strict=True) for t in example])}

    def reference(with_hard: bool) -> tuple[float, int]:
        total, dropped = 0.0, 0
        for i in range(4):
            negs = []
            for j in range(4):
                if j == i:
                    continue
                if s1[j] in (s0[i], s1[i]) or s0[j] == s0[i]:
                    dropped += 1
                else:
                    negs.append((pos[j], 1.0))
            if with_hard:
                for j in range(4):
                    if neg[j] in (s0[i], s1[i]):
                        dropped += 1
                    else:
                        negs.append((hard[j], alpha if j == i else 1.0))
            total += naive_info_nce(a[i], pos[i], negs)
        return total / 4, dropped

    sup = SimCSEObjective("sup", LossConfig(temperature=TAU, mask_false_negatives=True))
    want, dropped = reference(with_hard=False)
    assert dropped == 2
    sup_rows = torch.stack([a, pos], dim=1).reshape(8, 6)  # [p1, e1, p2, e2, ...]
    sup_ids = text_ids([t for example in zip(s0, s1, strict=True) for t in example])
    assert abs(sup.loss(sup_rows, {"text_ids": sup_ids}).item() - want) < 1e-9
    assert sup.masked_negatives == 2

    hn = SimCSEObjective("hardneg", LossConfig(temperature=TAU, mask_false_negatives=True, hard_negative_weight=alpha))
    want, dropped = reference(with_hard=True)
    assert dropped == 3  # the two premise copies, and "g" as anchor 3's hard-block negative
    assert abs(hn.loss(emb, batch).item() - want) < 1e-9
    assert hn.masked_negatives == 3


@pytest.mark.parametrize("unsup_loss", ["views", "paper"])
def test_similarity_threshold_drops_exactly_the_close_candidates(unsup_loss: str) -> None:
    """Naive loop: for each anchor, softmax over the candidates whose cosine with it is at
    most the threshold, plus its positive (which may be closer and is never dropped)."""
    torch.manual_seed(1)
    n, threshold = 6, 0.3
    base = torch.randn(n, 8, dtype=torch.float64)
    base[3] = base[1] + 0.05 * torch.randn(8, dtype=torch.float64)  # a paraphrase of example 1
    emb = torch.stack([base[i // 2] + 0.2 * torch.randn(8, dtype=torch.float64) for i in range(2 * n)])
    cfg = LossConfig(temperature=TAU, unsup_loss=unsup_loss, false_negative_threshold=threshold)
    objective = SimCSEObjective("unsup", cfg)
    got = objective.loss(emb).item()

    unit = torch.nn.functional.normalize(emb, dim=-1)
    if unsup_loss == "views":
        anchors, candidates = range(2 * n), range(2 * n)
        positive_of = {i: i ^ 1 for i in anchors}
    else:
        anchors, candidates = range(0, 2 * n, 2), range(1, 2 * n, 2)
        positive_of = {i: i + 1 for i in anchors}
    total, dropped = 0.0, 0
    for i in anchors:
        kept = []
        for j in candidates:
            cos = float(unit[i] @ unit[j])
            if j == i:
                continue
            if j != positive_of[i] and cos > threshold:
                dropped += 1
                continue
            kept.append(cos / TAU)
        pos = float(unit[i] @ unit[positive_of[i]]) / TAU
        total += -pos + math.log(sum(math.exp(v) for v in kept))
    assert dropped > 0  # the paraphrase pair at least
    assert abs(got - total / len(anchors)) < 1e-9
    assert objective.masked_negatives == dropped == objective.last_masked
    assert objective.metrics()["masked_negatives"] == dropped
    # Nothing dropped at threshold 1: the plain loss.
    plain = SimCSEObjective("unsup", LossConfig(temperature=TAU, unsup_loss=unsup_loss))
    at_one = SimCSEObjective("unsup", LossConfig(temperature=TAU, unsup_loss=unsup_loss, false_negative_threshold=1.0))
    assert abs(at_one.loss(emb).item() - plain.loss(emb).item()) < 1e-9


def test_similar_candidate_mask_never_marks_positive_or_self() -> None:
    emb = torch.ones(4, 3)  # every cosine is 1
    positive = torch.tensor([1, 0, 3, 2])
    mask = similar_candidate_mask(emb, emb, 0.5, positive, torch.arange(4))
    want = torch.ones(4, 4, dtype=torch.bool)
    want[torch.arange(4), positive] = False
    want[torch.arange(4), torch.arange(4)] = False
    assert torch.equal(mask, want)


def test_masking_needs_text_ids() -> None:
    objective = SimCSEObjective("unsup", LossConfig(mask_false_negatives=True))
    with pytest.raises(ValueError, match="text_ids"):
        objective.loss(torch.randn(4, 8), {})


def test_collator_text_ids_follow_row_order(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    exs = [{"sent0": "a dog", "sent1": "a cat", "hard_neg": "a car"}, {"sent0": "a man", "sent1": "a dog", "hard_neg": "a ball"}]
    batch = ContrastiveCollator(tokenizer, "hardneg", 16, with_text_ids=True)(exs)
    assert torch.equal(batch["text_ids"], text_ids(["a dog", "a cat", "a car", "a man", "a dog", "a ball"]))
    unsup = ContrastiveCollator(tokenizer, "unsup", 16, with_text_ids=True)(exs)
    assert torch.equal(unsup["text_ids"], text_ids(["a dog", "a dog", "a man", "a man"]))
    assert "text_ids" not in ContrastiveCollator(tokenizer, "unsup", 16)(exs)


# --------------------------------------------------------------------------- the momentum queue


def test_queue_is_a_fifo_ring() -> None:
    queue = MomentumQueue(torch.nn.Linear(2, 2), size=5, momentum=0.9, dim=1)
    assert queue.negatives()[0].shape == (0, 1)
    queue.enqueue(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([1, 2, 3]))
    assert queue.negatives()[0].flatten().tolist() == [1.0, 2.0, 3.0]
    queue.enqueue(torch.tensor([[4.0], [5.0], [6.0]]), torch.tensor([4, 5, 6]))
    # 6 overwrote the oldest (1); all 5 rows are filled
    emb, ids, _ = queue.negatives()
    assert emb.flatten().tolist() == [6.0, 2.0, 3.0, 4.0, 5.0] and ids.tolist() == [6, 2, 3, 4, 5]
    queue.enqueue(torch.arange(7.0, 14.0)[:, None], torch.arange(7, 14))  # more than the queue holds
    assert sorted(queue.negatives()[0].flatten().tolist()) == [9.0, 10.0, 11.0, 12.0, 13.0]


def test_momentum_update_formula() -> None:
    torch.manual_seed(0)
    online = torch.nn.Linear(3, 2)
    queue = MomentumQueue(online, size=4, momentum=0.9, dim=2)
    key_before = [p.detach().clone() for p in queue.encoder.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    queue.update(online)
    for k0, k, q in zip(key_before, queue.encoder.parameters(), online.parameters(), strict=True):
        assert torch.allclose(k, 0.9 * k0 + 0.1 * q)
        assert not k.requires_grad


def test_momentum_encoder_stays_fp32_beside_a_bf16_online_model(tiny_model_dir: Path) -> None:
    """With ``train.bf16_weights`` the online model is bf16 but the momentum copy stays
    fp32: an EMA step of (1 - 0.999) x 0.01 is far below bf16's resolution near 1 and
    would be rounded away in a bf16 copy. Keys are computed in bf16 like the online forward."""
    from simcse_kit.model.fastpath.bf16 import MasterWeightAdamW

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="none", dropout=0.0))
    queue = MomentumQueue(model, size=8, momentum=0.999, dim=32)  # built before the cast, as train() does
    MasterWeightAdamW([{"params": [p for p in model.parameters() if p.requires_grad]}], lr=1e-3)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in queue.encoder.parameters())
    step = MomentumQueueStep(SimCSEObjective("unsup", LossConfig(temperature=TAU, gather=False)), queue)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": w} for w in ["a man", "the dog runs", "two cats"]])
    step(model, batch)
    keys = queue.negatives()[0]
    assert keys.shape == (3, 32) and keys.dtype == torch.float32
    with torch.no_grad():
        want = model(**{k: v[1::2] for k, v in batch.items()}).float()  # the bf16 online forward (no dropout)
    torch.testing.assert_close(keys, want, atol=0.05, rtol=0.05)  # bf16 autocast on an fp32 copy vs bf16 weights

    before = [p.detach().clone() for p in queue.encoder.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    queue.update(model)
    moved = [(k - b).abs().max().item() for k, b in zip(queue.encoder.parameters(), before, strict=True)]
    assert min(moved) > 1e-6  # every fp32 key weight moved by ~1e-5


@pytest.mark.parametrize("mode", ["unsup", "hardneg"])
def test_queue_negatives_enter_loss_without_gradient_to_momentum_encoder(tiny_model_dir: Path, mode: str) -> None:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="none")).double()
    model.eval()  # dropout off: the momentum encoder runs in the same mode, so both are deterministic
    alpha = 1.5
    objective = SimCSEObjective(mode, LossConfig(temperature=TAU, hard_negative_weight=alpha, gather=False))
    queue = MomentumQueue(model, size=6, momentum=0.5, dim=32)
    step = MomentumQueueStep(objective, queue)
    collator = ContrastiveCollator(tokenizer, mode, 16, with_text_ids=True)
    words = ["a man plays guitar", "the dog runs", "two children read", "a red car", "a cat sleeps", "old woman swims"]
    first = collator([{"sent0": w, "sent1": w + " .", "hard_neg": "the " + w} for w in words[:3]])
    second = collator([{"sent0": w, "sent1": w + " .", "hard_neg": "the " + w} for w in words[3:]])

    # Step 1: empty queue, so the loss is the plain objective's; then the momentum
    # encoder's embeddings of view 1 (the positives; unsup: the second copy) are enqueued.
    # Through the step protocol: backward is called on the loss, the detached loss returned.
    seen: list[torch.Tensor] = []
    loss1 = step(model, first, seen.append)
    assert len(seen) == 1 and seen[0].requires_grad and not loss1.requires_grad
    assert torch.allclose(loss1, objective.step(model, first))
    model.zero_grad()
    rows = slice(1, 6, 2) if mode == "unsup" else slice(1, 9, 3)
    with torch.no_grad():
        keys1 = model(**{k: v[rows] for k, v in first.items() if k != "text_ids"}).float()
    assert torch.allclose(queue.negatives()[0], keys1, atol=1e-6)
    assert bool(queue.pending_update)

    # The online encoder moves (an "optimiser step"), so step 2 first updates the
    # momentum encoder: theta_k = 0.5 * theta_k + 0.5 * theta_q.
    online_before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.zero_grad()
    loss2 = step(model, second)  # backward=None: loss.backward()
    for k, q0, q in zip(queue.encoder.parameters(), online_before, model.parameters(), strict=True):
        assert torch.allclose(k, 0.5 * q0 + 0.5 * q.detach())

    # Known answer: the same loss with the 3 queued rows as extra negatives of every anchor.
    with torch.no_grad():
        emb = model(**{k: v for k, v in second.items() if k != "text_ids"})
    if mode == "unsup":
        want, _ = views_reference(emb, [str(i // 2) for i in range(6)], mask=False, extra=[(k, "") for k in keys1.double()])
    else:
        a, pos, hard = emb[0::3], emb[1::3], emb[2::3]
        want = 0.0
        for i in range(3):
            negs = [(pos[j], 1.0) for j in range(3) if j != i] + [(hard[j], alpha if j == i else 1.0) for j in range(3)]
            negs += [(k, 1.0) for k in keys1.double()]
            want += naive_info_nce(a[i], pos[i], negs) / 3
    assert abs(loss2.item() - want) < 1e-6
    assert loss2.item() > objective.loss(objective.embed(model, second), second).item()  # more negatives, larger loss

    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.embeddings.parameters() if p.requires_grad)
    assert all(p.grad is None and not p.requires_grad for p in queue.encoder.parameters())
    assert not queue.queue.requires_grad
    assert queue.negatives()[0].shape[0] == 6  # second batch enqueued after the loss


def test_queue_ids_are_masked_too(tiny_model_dir: Path) -> None:
    """A queued row with the same text as an anchor is a false negative as well."""
    objective = SimCSEObjective("unsup", LossConfig(temperature=TAU, mask_false_negatives=True, gather=False))
    torch.manual_seed(0)
    emb = torch.randn(4, 8, dtype=torch.float64)
    extra = torch.randn(3, 8, dtype=torch.float64)
    texts = ["x", "x", "y", "y"]
    extra_texts = ["y", "w", "x"]
    got = objective.loss(emb, {"text_ids": text_ids(texts)}, queue=(extra, text_ids(extra_texts)))
    want, dropped = views_reference(emb, texts, mask=True, extra=list(zip(extra, extra_texts, strict=True)))
    assert abs(got.item() - want) < 1e-9
    assert objective.masked_negatives == dropped == 4


# --------------------------------------------------------------------------- resume


class Crash(Exception):
    pass


def _queue_fit(model_dir: Path, out: Path, *, resume: bool, crash_at_eval: int | None) -> tuple[dict, dict]:
    import datasets
    from conftest import toy_sentences
    from torch.utils.data import DataLoader

    from simcse_kit.config.run import LoopConfig
    from simcse_kit.training.engine.checkpoints import Checkpoints
    from simcse_kit.training.engine.loop import fit, make_accelerator, prepare

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(model_dir), pooler="cls", mlp="train"))
    loader = DataLoader(
        datasets.Dataset.from_dict({"sent0": toy_sentences(40)}),
        batch_size=4,
        shuffle=True,
        drop_last=True,
        collate_fn=ContrastiveCollator(tokenizer, "unsup", 16, with_text_ids=True),
        generator=torch.Generator().manual_seed(1),
    )
    cfg = LoopConfig(learning_rate=1e-3, num_epochs=2, progress_bar=False, eval_steps=2, save_steps=3)
    accelerator = make_accelerator(cfg)
    queue = MomentumQueue(model, size=6, momentum=0.8, dim=32)
    accelerator.register_for_checkpointing(queue)
    objective = SimCSEObjective("unsup", LossConfig(mask_false_negatives=True))
    calls: list[int] = []

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        calls.append(1)
        if len(calls) == crash_at_eval:
            raise Crash
        return {"score": 0.0}

    evaluate.primary_metric = "score"  # type: ignore[attr-defined]
    step = MomentumQueueStep(objective, queue, accelerator)
    checkpoints = Checkpoints(out / "ckpt")
    fit(prepare(model, loader, cfg, accelerator), step, cfg, evaluator=evaluate, checkpoints=checkpoints, resume=resume)
    return {k: v.clone() for k, v in model.state_dict().items()}, {k: v.clone() for k, v in queue.state_dict().items()}


def test_resume_restores_queue_and_momentum_encoder(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A crash after the step-6 checkpoint and a resume end bit-equal to an uninterrupted
    run: the queue, its ids, pointer, pending update and the momentum encoder are saved."""
    want_model, want_queue = _queue_fit(tiny_model_dir, tmp_path / "a", resume=False, crash_at_eval=None)
    with pytest.raises(Crash):
        _queue_fit(tiny_model_dir, tmp_path / "b", resume=False, crash_at_eval=4)
    got_model, got_queue = _queue_fit(tiny_model_dir, tmp_path / "b", resume=True, crash_at_eval=None)
    assert int(want_queue["filled"]) == 6
    for key, value in want_queue.items():
        assert torch.equal(value, got_queue[key]), key
    for key, value in want_model.items():
        assert torch.equal(value, got_model[key]), key


# --------------------------------------------------------------------------- two processes


def _dup_examples() -> list[dict[str, str]]:
    """8 examples, 4 per rank; duplicates across the ranks (rank 1 repeats rank 0's
    example 1 whole, and example 2's positive), found only through the gathered ids."""
    from conftest import toy_sentences

    s = toy_sentences(24)
    exs = [{"sent0": s[i], "sent1": s[8 + i], "hard_neg": s[16 + i]} for i in range(8)]
    exs[5] = dict(exs[1])
    exs[6]["sent1"] = exs[2]["sent1"]
    return exs


def _masked_case(model_dir: str, mode: str, exs: list[dict[str, str]]) -> tuple[float, int, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=model_dir, pooler="avg", mlp="none", dropout=0.0))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    objective = SimCSEObjective(
        mode, LossConfig(temperature=TAU, gather=True, mask_false_negatives=True, hard_negative_weight=2.0)
    )
    loss = objective.step(model, ContrastiveCollator(tokenizer, mode, 16, with_text_ids=True)(exs))  # and loss.backward()
    return (
        loss.item(),
        objective.masked_negatives,
        {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
    )


def _masked_worker(rank: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=2)
    try:
        results = {}
        for mode in ("unsup", "hardneg"):
            loss, masked, grads = _masked_case(model_dir, mode, _dup_examples()[4 * rank : 4 * rank + 4])
            totals = torch.tensor([loss, float(masked)], dtype=torch.float64)
            dist.all_reduce(totals)
            for g in grads.values():  # what DDP does: the mean over processes
                dist.all_reduce(g)
                g /= 2
            results[mode] = (totals[0].item() / 2, int(totals[1].item()), grads)
        if rank == 0:
            torch.save(results, Path(out_dir) / "masked.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes
def test_masking_across_two_processes_equals_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_masked_worker, args=(str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "masked.pt")
    for mode, want_masked in (("unsup", 8), ("hardneg", 4)):
        want_loss, masked, want_grads = _masked_case(str(tiny_model_dir), mode, _dup_examples())
        # unsup: the 4 rows of examples 1 and 5 each lose the 2 rows of the other copy.
        # hardneg: anchors 1 and 5 lose each other's positive (same premise and text),
        # anchors 2 and 6 each other's positive (same text).
        assert masked == want_masked == got[mode][1], (mode, masked, got[mode][1])
        assert abs(got[mode][0] - want_loss) < 1e-5
        for key, g in got[mode][2].items():
            assert torch.allclose(g, want_grads[key], atol=1e-5, rtol=0), (mode, key)


def test_keys_use_bf16_autocast_beside_the_recipes_bf16_model(tiny_model_dir: Path) -> None:
    """The recipes' bf16 model (``bf16_training``) keeps its embedding tables, its first
    parameters, in fp32; the key forward must still see a bf16 model and run under bf16
    autocast, not fall back to fp32 keys."""
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="none"))
    queue = MomentumQueue(model, size=8, momentum=0.999, dim=32)
    bf16_training(model, param_groups(model, 0.0), lr=1e-3)
    assert next(model.parameters()).dtype == torch.float32  # the case a first-parameter test gets wrong
    step = MomentumQueueStep(SimCSEObjective("unsup", LossConfig(temperature=TAU, gather=False)), queue)
    with step.key_autocast(model, torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
