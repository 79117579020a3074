"""The fast training path: fast dropout and bf16 weights with fp32 master weights."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TinyRun, toy_sentences
from safetensors import safe_open
from transformers import AutoTokenizer, BertConfig, BertModel

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.model.fastpath import LEVELS, FastDropout, enable_fast_dropout, fast_dropout, quantized_drop_rate
from simcse_kit.model.fastpath.bf16 import MasterWeightAdamW
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.objectives import SimCSEObjective

# --------------------------------------------------------------------------- fast dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_fast_dropout_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    n = 1 << 21
    y = fast_dropout(torch.ones(n), p)
    q = quantized_drop_rate(p)
    assert abs(q - p) <= 0.5 / LEVELS
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - q) < 5 * math.sqrt(q * (1 - q) / n)  # a binomial within 5 sigma
    kept = y[y != 0]
    assert torch.all(kept == 1 / (1 - q))  # inverted dropout: the expectation is kept
    # Every one of the four 16-bit lanes of a 64-bit draw is used and uniform: a lane
    # stuck at >= 0 (a 63-bit draw) would drop nothing there.
    lanes = (y == 0).view(-1, 4).float().mean(dim=0)
    assert torch.all((lanes - q).abs() < 5 * math.sqrt(q * (1 - q) / (n // 4)))


def test_fast_dropout_follows_the_torch_seed_and_keeps_dtype() -> None:
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = fast_dropout(x, 0.2)
    torch.manual_seed(3)
    b = fast_dropout(x, 0.2)
    c = fast_dropout(x, 0.2)
    assert a.dtype == torch.bfloat16 and a.shape == x.shape
    assert torch.equal(a, b) and not torch.equal(b, c)
    assert torch.equal(fast_dropout(x, 0.0), x) and torch.equal(fast_dropout(x, 1e-9), x)
    assert torch.count_nonzero(fast_dropout(x, 1.0)) == 0


def test_fast_dropout_gradient_is_the_mask_times_scale() -> None:
    x = torch.randn(4096, requires_grad=True)
    torch.manual_seed(1)
    y = fast_dropout(x, 0.25)
    y.sum().backward()
    kept = y.detach() != 0
    assert torch.all(x.grad[kept] == 1 / (1 - quantized_drop_rate(0.25)))
    assert torch.all(x.grad[~kept] == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.5, 1 / LEVELS, 1 - 1 / LEVELS])
def test_the_16_bit_mask_path_equals_the_where_form_bit_for_bit(dtype: torch.dtype, p: float) -> None:
    """bf16/fp16 build the mask in the integers (1.0's bit pattern where kept): output and
    gradient equal the torch.where form on the same draw, including at the extremes."""
    x = torch.randn(3, 1001, dtype=dtype, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)
    g = torch.randn(3, 1001, dtype=dtype)
    torch.manual_seed(11)
    y = fast_dropout(x, p)
    torch.manual_seed(11)
    ref = fast_dropout(ref_x, p, integer_mask=False)
    assert y.dtype == dtype and torch.equal(y, ref)
    y.backward(g)
    ref.backward(g)
    assert torch.equal(x.grad, ref_x.grad)
    torch.manual_seed(11)
    with torch.no_grad():  # the in-place path (GradCache's first pass, evaluation-free dropout)
        assert torch.equal(fast_dropout(x.detach(), p), ref.detach())
    with pytest.raises(ValueError, match="16-bit"):
        fast_dropout(torch.ones(4), 0.5, integer_mask=True)


def tiny_bert(dropout: float) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    model = BertModel(config, add_pooling_layer=False)
    model.set_attn_implementation("sdpa")
    return model


def padded_batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    ids = torch.randint(5, 60, (4, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_enable_fast_dropout_swaps_every_dropout_and_keeps_the_mask() -> None:
    batch = padded_batch()
    # A drop rate that quantizes to 0: the explicit attention path runs, no element is
    # dropped, so the output must equal SDPA's, padding masks included.
    model = tiny_bert(dropout=1e-9).train()
    want = model(**batch).last_hidden_state
    assert enable_fast_dropout(model) == 1 + 3 * 2  # embeddings + 3 per layer
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert all(m.p == 1e-9 for m in model.modules() if isinstance(m, FastDropout))
    got = model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    model.eval()  # no dropout: straight to SDPA
    torch.testing.assert_close(model(**batch).last_hidden_state, want, atol=1e-5, rtol=0)
    # The padded rows are really masked: changing a padded token changes nothing.
    other = {k: v.clone() for k, v in batch.items()}
    other["input_ids"][2, 5] = 7
    torch.testing.assert_close(model(**other).last_hidden_state[2, :3], got[2, :3], atol=1e-5, rtol=0)


def test_fast_dropout_model_drops_in_training_only() -> None:
    batch = padded_batch()
    model = tiny_bert(dropout=0.1)
    enable_fast_dropout(model)
    model.train()
    torch.manual_seed(0)
    a = model(**batch).last_hidden_state
    b = model(**batch).last_hidden_state
    assert (a - b).abs().max() > 1e-2  # two views differ: the SimCSE augmentation
    model.eval()
    torch.testing.assert_close(model(**batch).last_hidden_state, model(**batch).last_hidden_state, atol=0, rtol=0)


def test_gradcache_replays_fast_dropout(tiny_model_dir: Path) -> None:
    """GradCache's RNG replay covers fast dropout: the same draws come from torch's generator."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": s} for s in toy_sentences(8)])
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train", dropout=0.3))
    enable_fast_dropout(model)
    model.train()
    # Chunk of 16 rows = the whole batch: one forward in each pass, so the cached
    # gradient equals a plain backward with the same dropout draws.
    torch.manual_seed(9)
    objective.step(model, batch)
    want = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(9)
    GradCacheStep(objective, 16)(model, batch)
    for k, p in model.named_parameters():
        if k in want:
            torch.testing.assert_close(p.grad, want[k], atol=1e-5, rtol=0, msg=k)
    assert sum(g.abs().sum() for g in want.values()) > 1e-2


# --------------------------------------------------------------------------- master weights


def two_layer() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def test_master_adamw_equals_fp32_adamw_on_the_same_gradients() -> None:
    ref = two_layer()
    model = two_layer()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    opt = MasterWeightAdamW([{"params": list(model.parameters())}], lr=1e-2, weight_decay=0.01)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(m, p) for m, p in zip(opt.masters, ref.parameters(), strict=True))  # exact fp32 start
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            p.grad, q.grad = g, g.float()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for m, p, q in zip(opt.masters, model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(m, q.detach(), atol=1e-6, rtol=0)
        assert torch.equal(p.detach(), m.to(torch.bfloat16))  # the model holds the rounded masters
        assert p.grad is None


def test_master_weights_keep_updates_below_bf16_resolution() -> None:
    """Why the masters exist: 20 steps of lr 1e-5 on weights of size ~1 vanish in plain
    bf16 AdamW (each step is below half an ulp) but accumulate in the masters."""
    w = torch.full((64,), 1.0)
    plain = torch.nn.Parameter(w.clone().to(torch.bfloat16))
    plain_opt = torch.optim.AdamW([plain], lr=1e-5, weight_decay=0.0)
    kept = torch.nn.Parameter(w.clone())
    opt = MasterWeightAdamW([{"params": [kept]}], lr=1e-5, weight_decay=0.0)
    for _ in range(20):
        plain.grad = torch.ones_like(plain)
        kept.grad = torch.ones_like(kept)
        plain_opt.step()
        opt.step()
    assert torch.all(plain.detach() == 1.0)  # stuck
    torch.testing.assert_close(opt.masters[0], torch.full((64,), 1.0 - 20e-5), atol=1e-6, rtol=0)


def test_master_state_dict_roundtrip_and_fp32_view() -> None:
    model = two_layer()
    opt = MasterWeightAdamW([{"params": list(model.parameters())}], lr=1e-2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()

    fresh = two_layer()
    fresh_opt = MasterWeightAdamW([{"params": list(fresh.parameters())}], lr=1e-2)
    fresh_opt.load_state_dict(state)
    for a, b in zip(fresh_opt.masters, opt.masters, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])

    with opt.fp32_model(model) as m:
        assert all(p.dtype == torch.float32 for p in m.parameters())
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), opt.masters, strict=True))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    plain = torch.optim.AdamW(two_layer().parameters()).state_dict()
    with pytest.raises(ValueError, match="master weights"):
        fresh_opt.load_state_dict(plain)


def test_bf16_training_keeps_embedding_tables_fp32(tiny_model_dir: Path) -> None:
    """Lookups gain nothing from bf16: the tables stay fp32 (their own masters), every
    other weight is bf16 with an fp32 master, and saving sees the fp32 tables unrounded."""
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": s} for s in toy_sentences(6)])
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", dropout=0.0)).train()
    model.encoder.pooler.requires_grad_(False)
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert len(tables) == 3
    start = {id(t): t.detach().clone() for t in tables}
    opt = bf16_training(model, param_groups(model, 0.01), lr=1e-2)
    assert all(t.dtype == torch.float32 for t in tables)
    others = [p for p in model.parameters() if all(p is not t for t in tables)]
    assert others and all(p.dtype == torch.bfloat16 for p in others)  # frozen pooler included
    out = model(**batch)
    assert out.dtype == torch.bfloat16  # the tables' outputs join the bf16 stream
    out.float().pow(2).sum().backward()
    word = model.encoder.embeddings.word_embeddings.weight
    assert word.grad is not None and word.grad.dtype == torch.float32
    grad = word.grad.clone()
    opt.step()
    # The table took exactly plain fp32 AdamW's first step on the same gradient.
    ref = torch.nn.Parameter(start[id(word)].clone())
    ref.grad = grad
    torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01).step()
    torch.testing.assert_close(word.detach(), ref.detach(), atol=1e-7, rtol=0)
    moved = word.detach().clone()
    with opt.fp32_model(model) as m:
        assert all(p.dtype == torch.float32 for p in m.parameters())
    assert word.dtype == torch.float32 and torch.equal(word.detach(), moved)  # not rounded through bf16
    assert all(p.dtype == torch.bfloat16 for p in others)


def test_sparse_tables_train_like_dense_ones_in_kept_buffers(tiny_model_dir: Path) -> None:
    """sparse_tables: the tables' rows' gradients are added into one dense buffer per table,
    kept across steps; two backward passes a step (GradCache, accumulation) add up; the
    weights follow the dense path's up to the order of additions."""
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    collate = ContrastiveCollator(tokenizer, "unsup", 16)
    batches = [collate([{"sent0": s} for s in toy_sentences(12)[i : i + 4]]) for i in range(0, 12, 4)]
    runs = {}
    for sparse in (False, True):
        torch.manual_seed(0)
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", dropout=0.0)).train()
        opt = bf16_training(model, param_groups(model, 0.01), sparse_tables=sparse, lr=1e-2)
        word = model.encoder.embeddings.word_embeddings
        assert word.sparse is sparse
        buffers = set()
        for step in range(3):
            for half in (slice(0, 4), slice(4, 8)):  # two backward passes, one optimiser step
                part = {k: v[half] for k, v in batches[step].items()}
                model(**part).float().pow(2).sum().backward()
            assert word.weight.grad is not None and not word.weight.grad.is_sparse
            buffers.add(word.weight.grad.data_ptr())
            opt.step()
            opt.zero_grad()
            if sparse:
                assert torch.count_nonzero(word.weight.grad) == 0  # zeroed in place, not dropped
        if sparse:
            with opt.fp32_model(model):  # saving the best model (fp32) must not round the buffer
                pass
            assert word.weight.grad.dtype == torch.float32 and {word.weight.grad.data_ptr()} == buffers
            assert len(buffers) == 1  # one buffer for all steps
        runs[sparse] = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    for name, dense in runs[False].items():
        torch.testing.assert_close(runs[True][name], dense, atol=2e-2 if "encoder.layer" in name else 1e-5, rtol=0)


def test_saving_fp32_weights_leaves_the_model_hooked_to_ddp(tmp_path: Path, tiny_model_dir: Path) -> None:
    """``fp32_model`` (saving the best model, on the main process only) must not cast the
    live model: a parameter whose dtype changes gets a new gradient accumulator, and DDP's
    hooks stay on the old one, so that process's backward would all-reduce nothing (the
    2-process crash after the step-0 evaluation). DDP's comm hook counts the buckets each
    backward hands over, before and after; the fp32 copy encodes like the masters say."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([{"sent0": s} for s in toy_sentences(4)])
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", dropout=0.0)).train()
    model.encoder.pooler.requires_grad_(False)
    opt = bf16_training(model, param_groups(model, 0.01), lr=1e-2)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        buckets: list[int] = []

        def count(bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            buckets.append(bucket.index())
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        # A lambda: DDP checks the hook's annotations, which this module's future import makes strings.
        ddp.register_comm_hook(None, lambda _state, bucket: count(bucket))

        def step() -> int:
            before = len(buckets)
            ddp(**batch).float().pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
            return len(buckets) - before

        handed = step()
        assert handed > 0
        live = {n: p.dtype for n, p in model.named_parameters()}
        with opt.fp32_model(model) as fp32:
            assert all(p.dtype == torch.float32 for p in fp32.parameters())
            masters = dict(zip(map(id, opt.model_params), opt.masters, strict=True))
            for (name, p), q in zip(model.named_parameters(), fp32.parameters(), strict=True):
                assert torch.equal(q, masters.get(id(p), p)), name
            fp32.eval()
            assert fp32(**batch).dtype == torch.float32  # the tables' hooks follow the copy
        assert {n: p.dtype for n, p in model.named_parameters()} == live
        assert step() == handed, "after saving, backward no longer reaches DDP"
    finally:
        dist.destroy_process_group()


def test_sparse_embedding_grad_is_refused_with_several_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate import state as accelerate_state

    from simcse_kit.config.run import LoopConfig
    from simcse_kit.errors import ConfigError
    from simcse_kit.training.engine.loop import make_optimizer

    class TwoProcesses:
        num_processes = 2

    monkeypatch.setattr(accelerate_state, "PartialState", TwoProcesses)
    cfg = LoopConfig(mixed_precision="bf16", bf16_weights=True, sparse_embedding_grad=True)
    with pytest.raises(ConfigError, match="sparse_embedding_grad"):
        make_optimizer(torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2)), cfg)
    table = torch.nn.Embedding(10, 4)
    make_optimizer(torch.nn.Sequential(table, torch.nn.Linear(4, 2)), dataclasses.replace(cfg, sparse_embedding_grad="auto"))
    assert not table.sparse  # auto: dense under DistributedDataParallel


# --------------------------------------------------------------------------- a whole run


@pytest.mark.slow  # a whole run incl. the 7-task STS evaluation
def test_train_run_on_the_fast_path(tiny_run: TinyRun) -> None:
    """The recipes' fast path end to end: the loss falls, and the saved best model holds
    the fp32 master weights in a plain (sdpa) model folder."""
    fast = {"mixed_precision": "bf16", "bf16_weights": "true", "fast_dropout": "true"}
    metrics = tiny_run.train("run", batch_size=16, num_epochs=2, eval_steps=0, save_steps=0, eval_max_seq_len=64, **fast)
    tmp_path = tiny_run.folder
    losses = [v for _, v in metrics["losses"]]
    assert len(losses) == 8 and sum(losses[-3:]) < sum(losses[:3])  # 64 sentences, batch 16, 2 epochs
    best = tmp_path / "run" / "best_model"
    with safe_open(str(best / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F32"}
    config = json.loads((best / "config.json").read_text())
    assert "simcse_fast_dropout" not in json.dumps(config)
    assert not any(type(m).__name__ == "FastDropout" for m in SimCSEModel.load(best).modules())
