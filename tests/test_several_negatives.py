"""Several hard negatives per anchor (``hardneg`` with ``k`` negatives, ``V = 2 + k`` views).

The objective's loss against a naive per-anchor Python loop in fp64, values and
gradients, for k = 1, 3, 7: every positive and every negative of the batch a candidate,
the anchor's own k negatives weighted by alpha, with the text and threshold masks and
the queue; GradCache equal to the plain step; two gloo processes equal to one process on
the concatenated batch (the loop reference for the gathered loss, the plain step for a
model with and without GradCache). k = 1 stays the old ``hardneg``, bit for bit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import toy_sentences
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core import losses, modes
from simcse_kit.core.batch import batch_texts, model_inputs, text_ids, views_per_example
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.mixture import mix_datasets
from simcse_kit.data.readers import load_train_dataset, negatives_of
from simcse_kit.errors import DataError
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.gradcache import effective_negatives
from simcse_kit.training.objective.objectives import SimCSEObjective

TAU = 0.05
KS = [1, 3, 7]
THRESHOLD = 0.9


def naive_loss(
    emb: torch.Tensor,
    k: int,
    alpha: float,
    texts: list[str] | None = None,
    threshold: float | None = None,
    queue: list[tuple[torch.Tensor, str]] = (),
) -> torch.Tensor:
    """The loss read off example-major rows ``[a, p, n_1 .. n_k]`` one anchor at a time.

    Anchor ``i``'s candidates: every example's positive, every example's ``k`` negatives,
    then the queue. A candidate is dropped when (``texts``) its text is the anchor's or
    the anchor's positive's, or it is the positive of an anchor with the anchor's text;
    or (``threshold``) its cosine with the anchor exceeds it. The anchor's own negatives
    get ``log(alpha)`` on their logit. Written with torch scalars so it has gradients.
    """
    v = 2 + k
    n = emb.shape[0] // v

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b / (a.norm() * b.norm())

    candidates = []  # (vector, owner example or None, is a positive, text)
    for j in range(n):
        candidates.append((emb[j * v + 1], j, True, None if texts is None else texts[j * v + 1]))
    for b in range(k):
        for j in range(n):
            candidates.append((emb[j * v + 2 + b], j, False, None if texts is None else texts[j * v + 2 + b]))
    candidates += [(vec, None, False, text) for vec, text in queue]
    total = emb.new_zeros(())
    for i in range(n):
        anchor = emb[i * v]
        positive = cos(anchor, emb[i * v + 1]) / TAU
        logits = [positive]
        for vec, owner, is_positive, text in candidates:
            if is_positive and owner == i:
                continue  # the positive, already first
            if texts is not None:
                mine = (texts[i * v], texts[i * v + 1])
                if text in mine or (is_positive and texts[owner * v] == texts[i * v]):
                    continue
            c = cos(anchor, vec)
            if threshold is not None and float(c.detach()) > threshold:
                continue
            logits.append(c / TAU + (math.log(alpha) if owner == i else 0.0))
        total = total - positive + torch.logsumexp(torch.stack(logits), dim=0)
    return total / n


def problem(k: int, n: int = 5, seed: int = 0) -> tuple[torch.Tensor, list[str], list[tuple[torch.Tensor, str]]]:
    """fp64 rows of ``n`` examples with ``k`` negatives, their texts with duplicates that
    the text mask must find, near-duplicates the threshold must find, and a queue."""
    v = 2 + k
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(n * v, 8, generator=g, dtype=torch.float64)
    texts = [f"ex{i} view{j}" for i in range(n) for j in range(v)]
    texts[2 * v] = texts[0]  # example 2 repeats example 0's premise (its positive is 0's too)
    texts[1 * v + 1 + k] = texts[0 * v + 1]  # example 1's last negative is example 0's positive
    texts[3 * v + 2] = texts[1 * v]  # example 3's first negative is example 1's anchor
    # Near-duplicates of anchor 4 for the threshold: example 0's first negative and a queue row.
    emb[0 * v + 2] = emb[4 * v] + 0.05 * torch.randn(8, generator=g, dtype=torch.float64)
    queue_rows = torch.randn(3, 8, generator=g, dtype=torch.float64)
    queue_rows[0] = emb[3 * v] + 0.05 * torch.randn(8, generator=g, dtype=torch.float64)
    queue = [(queue_rows[0], "queued 0"), (queue_rows[1], texts[2 * v + 1]), (queue_rows[2], "queued 2")]
    return emb, texts, queue


def objective(k: int, alpha: float, mask: bool = False, threshold: float | None = None, **options: object) -> SimCSEObjective:
    cfg = LossConfig(
        temperature=TAU, hard_negative_weight=alpha, mask_false_negatives=mask, false_negative_threshold=threshold, **options
    )
    return SimCSEObjective("hardneg", cfg, negatives=k)


def value_and_grad(loss_of: object, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = emb.clone().requires_grad_()
    loss = loss_of(leaf)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize(("mask", "threshold"), [(False, None), (True, None), (False, THRESHOLD), (True, THRESHOLD)])
@pytest.mark.parametrize("with_queue", [False, True])
def test_loss_and_gradients_equal_a_naive_loop(k: int, mask: bool, threshold: float | None, with_queue: bool) -> None:
    emb, texts, queue = problem(k)
    alpha = 2.5
    obj = objective(k, alpha, mask, threshold)
    batch = {"text_ids": text_ids(texts)}
    queued = (torch.stack([q for q, _ in queue]), text_ids([t for _, t in queue])) if with_queue else None
    got, got_grad = value_and_grad(lambda e: obj.loss(e, batch, queue=queued), emb)
    ref_queue = queue if with_queue else []
    want, want_grad = value_and_grad(lambda e: naive_loss(e, k, alpha, texts if mask else None, threshold, ref_queue), emb)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)
    assert want_grad.abs().sum() > 1e-3
    if mask or threshold is not None:
        assert obj.last_masked > 0  # the problem has something to mask
        unmasked = naive_loss(emb, k, alpha, None, None, ref_queue)
        assert abs(float(unmasked) - float(want)) > 1e-6  # and masking it changes the loss (tolerance 1e-12)


@pytest.mark.parametrize("k", KS)
def test_own_negatives_carry_the_weight_and_the_others_do_not(k: int) -> None:
    """alpha moves the loss by exactly the anchor's own negatives: with alpha on every
    example's negatives instead (a wrong reading), the loop gives another number."""
    emb, _, _ = problem(k)
    got = objective(k, 3.0).loss(emb)
    assert float(got) == pytest.approx(float(naive_loss(emb, k, 3.0)), rel=1e-12)
    assert abs(float(got) - float(objective(k, 1.0).loss(emb))) > 1e-3
    # Candidates per anchor: N positives + N k negatives; negatives N (1 + k) - 1.
    assert effective_negatives("hardneg", 5, negatives=k) == 5 * (1 + k) - 1
    assert effective_negatives("hardneg", 5, world_size=2, negatives=k) == 10 * (1 + k) - 1


def test_one_negative_is_the_old_hardneg_bit_for_bit() -> None:
    """k = 1 is the table's own row (column ``hard_neg``) and the old code path: the loss
    and its gradient equal the named loss :func:`losses.info_nce` exactly."""
    assert modes.mode("hardneg", 1) is modes.TABLE["hardneg"]
    emb = torch.randn(15, 8, generator=torch.Generator().manual_seed(3))
    got, got_grad = value_and_grad(lambda e: objective(1, 2.5).loss(e), emb)
    want, want_grad = value_and_grad(
        lambda e: losses.info_nce(e[0::3], e[1::3], e[2::3], temperature=TAU, hard_negative_weight=2.5), emb
    )
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)


def test_the_layout_of_k_negatives() -> None:
    row = modes.mode("hardneg", 3)
    assert row.columns == ("sent0", "sent1", "hard_neg_1", "hard_neg_2", "hard_neg_3")
    assert row.contrast.candidate_views == (1, 2, 3, 4) and row.contrast.weighted_views == (2, 3, 4)
    assert views_per_example("hardneg", 3) == 5
    examples = [{"sent0": f"a{i}", "sent1": f"p{i}", **{f"hard_neg_{j}": f"n{i}{j}" for j in (1, 2, 3)}} for i in range(2)]
    assert batch_texts(examples, "hardneg", 3) == ["a0", "p0", "n01", "n02", "n03", "a1", "p1", "n11", "n12", "n13"]
    with pytest.raises(ValueError, match="mode 'sup' has no hard negatives"):
        SimCSEObjective("sup", LossConfig(), negatives=3)


# --------------------------------------------------------------------------- a model: GradCache


def k_examples(n: int, k: int, offset: int = 0) -> list[dict[str, str]]:
    s = toy_sentences((2 + k) * (n + offset))
    v = 2 + k
    out = []
    for i in range(offset, offset + n):
        ex = {"sent0": s[i * v], "sent1": s[i * v + 1]}
        ex |= {name: s[i * v + 2 + b] for b, name in enumerate(modes.hard_negative_columns(k))}
        out.append(ex)
    out[-1]["hard_neg" if k == 1 else f"hard_neg_{k}"] = out[0]["sent1"]  # a false negative for the mask
    return out


def build_model(model_dir: str) -> SimCSEModel:
    torch.manual_seed(0)  # the MLP head is initialised at random: the same weights every time
    model = SimCSEModel.from_config(ModelConfig(name_or_path=model_dir, pooler="avg", mlp="train", dropout=0.0))
    return model.train()


def model_step(model: SimCSEModel, model_dir: str, k: int, exs: list[dict[str, str]], chunk: int | None, **options: object):
    """Loss and parameter gradients of ``exs`` under the plain step or GradCache (``chunk`` rows)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    obj = objective(k, 2.0, mask=True, **options)
    batch = ContrastiveCollator(tokenizer, "hardneg", 16, with_text_ids=True, negatives=k)(exs)
    model.zero_grad(set_to_none=True)
    step = obj.step if chunk is None else GradCacheStep(obj, chunk)
    loss = step(model, batch)
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("k", [3, 7])
def test_gradcache_equals_the_plain_step(tiny_model_dir: Path, k: int) -> None:
    model = build_model(str(tiny_model_dir))
    exs = k_examples(4, k)
    want_loss, want = model_step(model, str(tiny_model_dir), k, exs, None)
    # chunk 1 and 2 + k: one example a chunk; 11: two (examples never split); 1000: one chunk.
    for chunk in (1, 2 + k, 11, 1000):
        loss, got = model_step(model, str(tiny_model_dir), k, exs, chunk)
        assert abs(loss - want_loss) < 1e-5
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=0, msg=name)
    assert sum(g.abs().sum() for g in want.values()) > 1e-2


# --------------------------------------------------------------------------- two processes: the gather

WORLD = 2
PER_RANK = 3  # examples per process
GATHER_K = 3


def average(loss: float, grads: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """What DDP does: the mean of the per-process losses and gradients."""
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
        results: dict[str, object] = {}
        # The loss core on fixed fp64 rows: this process's examples, all masks, the queue.
        emb, texts, queue = problem(GATHER_K, n=WORLD * PER_RANK)
        v = 2 + GATHER_K
        rows = slice(rank * PER_RANK * v, (rank + 1) * PER_RANK * v)
        obj = objective(GATHER_K, 2.5, mask=True, threshold=THRESHOLD, gather=True)
        queued = (torch.stack([q for q, _ in queue]), text_ids([t for _, t in queue]))
        loss, grad = value_and_grad(lambda e: obj.loss(e, {"text_ids": text_ids(texts[rows])}, queue=queued), emb[rows])
        losses_ = [torch.zeros(()).double() for _ in range(WORLD)]
        dist.all_gather(losses_, loss)
        grads = [torch.zeros_like(grad) for _ in range(WORLD)]
        dist.all_gather(grads, grad.contiguous())
        results["rows"] = (torch.stack(losses_), torch.cat(grads), obj.last_masked)
        # A model: the plain step and GradCache, each process on its own examples.
        model = build_model(model_dir)
        exs = k_examples(WORLD * PER_RANK, GATHER_K)[rank * PER_RANK : (rank + 1) * PER_RANK]
        results["plain"] = average(*model_step(model, model_dir, GATHER_K, exs, None, gather=True))
        results["gradcache"] = average(*model_step(model, model_dir, GATHER_K, exs, 2 + GATHER_K, gather=True))
        if rank == 0:
            torch.save(results, Path(out_dir) / "rank0.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes
def test_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path: Path, tiny_model_dir: Path) -> None:
    mp.spawn(worker, args=(str(tiny_model_dir), str(tmp_path)), nprocs=WORLD, join=True)
    got = torch.load(tmp_path / "rank0.pt")

    # The loss core: each process's loss is the loop over its own anchors against every
    # process's candidates; its rows' gradient is that of the sum of all processes' losses.
    emb, texts, queue = problem(GATHER_K, n=WORLD * PER_RANK)
    want, want_grad = value_and_grad(lambda e: naive_loss(e, GATHER_K, 2.5, texts, THRESHOLD, queue), emb)
    per_rank, grads, masked = got["rows"]
    torch.testing.assert_close(per_rank.mean(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads / WORLD, want_grad, rtol=1e-10, atol=1e-12)
    assert masked > 0
    # The gather widens the problem: a process alone gets another loss.
    v = 2 + GATHER_K
    alone = naive_loss(emb[: PER_RANK * v], GATHER_K, 2.5, texts[: PER_RANK * v], THRESHOLD, queue)
    assert abs(float(alone) - float(per_rank[0])) > 1e-3

    # A model: two processes (plain and GradCache) equal one process's plain step.
    model = build_model(str(tiny_model_dir))
    exs = k_examples(WORLD * PER_RANK, GATHER_K)
    want_loss, want_grads = model_step(model, str(tiny_model_dir), GATHER_K, exs, None)
    for name in ("plain", "gradcache"):
        loss, grads = got[name]
        assert abs(loss - want_loss) < 1e-5, (name, loss, want_loss)
        assert grads.keys() == want_grads.keys()
        for key, g in grads.items():
            torch.testing.assert_close(g, want_grads[key], atol=1e-5, rtol=0, msg=f"{name} {key}")


# --------------------------------------------------------------------------- the data: k read off the file


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_jsonl_list_and_numbered_csv_columns_read_alike(tmp_path: Path) -> None:
    rows = [{"sent0": f"a{i}", "sent1": f"p{i}", "hard_neg": [f"n{i}1", f"n{i}2", f"n{i}3"]} for i in range(3)]
    from_jsonl = load_train_dataset(str(write_jsonl(tmp_path / "k.jsonl", rows)), "hardneg")
    csv = "sent0,sent1,hard_neg_1,hard_neg_2,hard_neg_3\n" + "".join(f"a{i},p{i},n{i}1,n{i}2,n{i}3\n" for i in range(3))
    (tmp_path / "k.csv").write_text(csv, encoding="utf-8")
    from_csv = load_train_dataset(str(tmp_path / "k.csv"), "hardneg")
    for ds in (from_jsonl, from_csv):
        assert ds.column_names == ["sent0", "sent1", "hard_neg_1", "hard_neg_2", "hard_neg_3"]
        assert negatives_of(ds.column_names) == 3
        assert ds[1] == {"sent0": "a1", "sent1": "p1", "hard_neg_1": "n11", "hard_neg_2": "n12", "hard_neg_3": "n13"}
    # Numbered keys in JSONL too; and one negative in any form is the old column hard_neg.
    numbered = [{"sent0": "a", "sent1": "p", "hard_neg_1": "x", "hard_neg_2": "y"}] * 2
    assert load_train_dataset(str(write_jsonl(tmp_path / "n.jsonl", numbered)), "hardneg")[0]["hard_neg_2"] == "y"
    for name, one in (("s.jsonl", {"hard_neg": "x"}), ("l.jsonl", {"hard_neg": ["x"]}), ("h.jsonl", {"hard_neg_1": "x"})):
        ds = load_train_dataset(str(write_jsonl(tmp_path / name, [{"sent0": "a", "sent1": "p"} | one] * 2)), "hardneg")
        assert ds.column_names == ["sent0", "sent1", "hard_neg"] and negatives_of(ds.column_names) == 1


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "r.jsonl",
            '{"sent0": "a", "sent1": "p", "hard_neg": ["x", "y", "z"]}\n{"sent0": "b", "sent1": "q", "hard_neg": ["x", "y"]}\n',
            r"r.jsonl, line 2: 2 hard negative\(s\), the file's first row has 3; every row needs the same number",
        ),
        (
            "s.jsonl",
            '{"sent0": "a", "sent1": "p", "hard_neg": "x"}\n{"sent0": "b", "sent1": "q", "hard_neg": ["x", "y"]}\n',
            r"s.jsonl, line 2: 2 hard negative\(s\), the file's first row has 1",
        ),
        ("e.jsonl", '{"sent0": "a", "sent1": "p", "hard_neg": []}\n', r"e.jsonl, line 1: column 'hard_neg' is an empty list"),
        ("t.jsonl", '{"sent0": "a", "sent1": "p", "hard_neg": ["x", 3]}\n', r"t.jsonl, line 1: column 'hard_neg_2' must be text"),
        ("m.jsonl", '{"sent0": "a", "sent1": "p"}\n', r"m.jsonl, line 1: missing value for column 'hard_neg'"),
        (
            "g.csv",
            "sent0,sent1,hard_neg_1,hard_neg_3\na,p,x,y\n",
            r"g.csv, line 1: .*without gaps, got \['hard_neg_1', 'hard_neg_3'\]",
        ),
        ("b.csv", "sent0,sent1,hard_neg,hard_neg_1\na,p,x,y\n", r"b.csv, line 1: both 'hard_neg' and hard_neg_1"),
        ("v.csv", "sent0,sent1,hard_neg_1,hard_neg_2\na,p,x,y\nb,q,x,\n", r"v.csv, line 3: empty value in column 'hard_neg_2'"),
        ("n.csv", "sent0,sent1\na,p\nb,q\n", r"n.csv, line 1: header .* lacks column\(s\) \['hard_neg \(or hard_neg_1"),
    ],
)
def test_bad_negatives_name_the_file_and_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_train_dataset(str(tmp_path / name), "hardneg")


def test_a_mix_file_needs_the_same_k(tmp_path: Path) -> None:
    three = [{"sent0": f"a{i}", "sent1": "p", "hard_neg": ["x", "y", "z"]} for i in range(4)]
    one = [{"sent0": f"b{i}", "sent1": "p", "hard_neg": "x"} for i in range(4)]
    domain = load_train_dataset(str(write_jsonl(tmp_path / "d.jsonl", three)), "hardneg")
    general = load_train_dataset(str(write_jsonl(tmp_path / "g.jsonl", one)), "hardneg")
    with pytest.raises(DataError, match="mix_file: 1 hard negative"):
        mix_datasets(domain, general, 0.5, seed=0)


def test_a_run_reads_k_from_its_data(tiny_run, tmp_path: Path) -> None:
    """A hardneg run on a k = 3 file: batches of 5 rows per example, the objective's k,
    and a finite loss from the run's own step."""
    from simcse_kit.training.wiring.run import build_run

    s = toy_sentences(5 * 16)
    rows = [{"sent0": s[5 * i], "sent1": s[5 * i + 1], "hard_neg": s[5 * i + 2 : 5 * i + 5]} for i in range(16)]
    cfg = tiny_run.config("k3", mode="hardneg", train_file=write_jsonl(tmp_path / "k3.jsonl", rows), grad_cache_chunk=10)
    run = build_run(cfg, evaluate=False)
    batch = next(iter(run.loader))
    assert run.objective.of(batch).negatives == 3 and run.objective.of(batch).views_per_example() == 5
    assert batch["input_ids"].shape[0] == 8 * 5
    assert torch.isfinite(run.step(run.model, batch, None))


def test_the_queue_stores_the_positives_of_k_negative_examples(tiny_model_dir: Path) -> None:
    """With k = 3 the momentum queue's keys are view 1 of each example (the positives, as
    with one negative), their text ids beside them; the next step's loss takes them as
    negatives of every anchor."""
    from simcse_kit.training.engine.steps import MomentumQueueStep
    from simcse_kit.training.objective.momentum_queue import MomentumQueue

    k = 3
    model = build_model(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    collate = ContrastiveCollator(tokenizer, "hardneg", 16, with_text_ids=True, negatives=k)
    obj = objective(k, 2.0, mask=True)
    queue = MomentumQueue(model, size=32, momentum=0.0, dim=model(**model_inputs(collate(k_examples(1, k)))).shape[1])
    step = MomentumQueueStep(obj, queue)
    first, second = k_examples(4, k), k_examples(4, k, offset=4)
    step(model, collate(first))
    keys, ids, _ = queue.negatives()
    positives = [ex["sent1"] for ex in first]
    assert torch.equal(ids, text_ids(positives))
    pair_batch = ContrastiveCollator(tokenizer, "sup", 16)([{"sent0": p, "sent1": p} for p in positives])
    with torch.no_grad():
        alone = model(**model_inputs(pair_batch))[0::2]
    torch.testing.assert_close(keys, alone, atol=1e-5, rtol=0)
    batch = collate(second)
    with torch.no_grad():
        want = obj.loss(obj.embed(model, batch), batch, queue=(keys.clone(), ids.clone()))
        without = obj.loss(obj.embed(model, batch), batch)
    got = step(model, batch)
    assert abs(float(got) - float(want)) < 1e-6 and abs(float(want) - float(without)) > 1e-4


def test_a_hub_dataset_with_a_list_column_reads_as_numbered_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    rows = {"sent0": ["a", "b"], "sent1": ["p", "q"], "hard_neg": [["x", "y"], ["z", "w"]], "extra": [1, 2]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: datasets.Dataset.from_dict(rows))
    ds = load_train_dataset("hub:org/triples", "hardneg")
    assert ds.column_names == ["sent0", "sent1", "hard_neg_1", "hard_neg_2"] and ds[1]["hard_neg_2"] == "w"
    rows["hard_neg"] = [["x", "y"], ["z"]]
    with pytest.raises(DataError, match="hub:org/triples: row 1: 1 hard negative"):
        load_train_dataset("hub:org/triples", "hardneg")
