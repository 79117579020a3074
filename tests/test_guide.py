"""A guide against false negatives (``loss.guide``, issue 37): parity with sentence-transformers'
``GISTEmbedLoss`` (values and gradients, fp64), the guide's mask against a naive loop with the
momentum queue, two processes and GradCache, the config's errors, a tiny run's metrics.json
and the same filter in ``simcse-kit mine``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import TinyRun, save_tiny_bert, toy_sentences
from transformers import AutoTokenizer

from simcse_kit.config.run import GUIDE_MARGIN_STRATEGIES, LossConfig, ModelConfig
from simcse_kit.core import masks
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.errors import ConfigError
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import GradCacheStep, MomentumQueueStep, Queue
from simcse_kit.training.objective.momentum_queue import MomentumQueue
from simcse_kit.training.objective.objectives import GuideFilter, SimCSEObjective
from simcse_kit.training.objective.teacher import teacher_texts

TAU = 0.05
# unsup's positive is the anchor's own text (guide score 1): only a wide margin masks anything there.
MARGIN = {"unsup": 0.6, "sup": 0.1, "hardneg": 0.1}


def cos(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x @ y) / (float(x.norm()) * float(y.norm()))


def threshold(positive: float, margin: float, strategy: str) -> float:
    return positive - margin if strategy == "absolute" else positive - abs(positive) * margin


# --------------------------------------------------------------------------- parity with GISTEmbedLoss


@pytest.fixture(scope="module")
def guide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny BERT (1 layer: other weights) with the student's vocabulary."""
    return save_tiny_bert(tmp_path_factory.mktemp("guide-bert"), layers=1)


def st_model(path: Path) -> torch.nn.Module:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    model = SentenceTransformer(modules=[Transformer(str(path), max_seq_length=16), Pooling(32, "mean")], device="cpu")
    return model.double().eval()  # eval: no dropout, so both losses see the same forward


def hand_count(guide_a: torch.Tensor, guide_c: torch.Tensor, margin: float, strategy: str) -> int:
    """Candidates (columns; anchor i's positive is column i) the guide rates above the positive."""
    total = 0
    for i in range(len(guide_a)):
        limit = threshold(cos(guide_a[i], guide_c[i]), margin, strategy)
        total += sum(cos(guide_a[i], guide_c[j]) > limit for j in range(len(guide_c)) if j != i)
    return total


@pytest.mark.parametrize("columns", [2, 3])
@pytest.mark.parametrize(("strategy", "margin"), [("absolute", 0.0), ("absolute", 0.02), ("relative", 0.03)])
def test_guide_loss_and_gradients_equal_gist(
    tiny_model_dir: Path, guide_dir: Path, columns: int, strategy: str, margin: float
) -> None:
    """The kit's sup (pairs) and hardneg (triplets) forms with a guide equal GISTEmbedLoss
    (no anchor-anchor or positive-positive terms: the kit's candidates are the positives and
    hard negatives) to 1e-10 in fp64, with some candidates masked, as many as a hand count."""
    from sentence_transformers.sentence_transformer.losses import GISTEmbedLoss

    n = 8
    sents = toy_sentences(3 * n)
    texts = [sents[:n], sents[n : 2 * n], sents[2 * n :]][:columns]
    student, guide = st_model(tiny_model_dir), st_model(guide_dir)
    gist = GISTEmbedLoss(student, guide, temperature=TAU, margin_strategy=strategy, margin=margin,
                         contrast_anchors=False, contrast_positives=False)  # fmt: skip
    features = [student.preprocess(column) for column in texts]
    want = gist([dict(f) for f in features], torch.empty(0))
    want.backward()
    want_grads = {k: p.grad.clone() for k, p in student.named_parameters() if p.grad is not None}
    student.zero_grad()

    # The kit: the same student's rows, example-major; the guide's vectors as a table of the distinct texts.
    embedded = [student(dict(f))["sentence_embedding"] for f in features]
    rows = torch.stack(embedded, dim=1).reshape(n * columns, -1)
    mode = "sup" if columns == 2 else "hardneg"
    names = ("sent0", "sent1", "hard_neg")[:columns]
    distinct = teacher_texts(dict(zip(names, texts, strict=True)), mode)
    with torch.no_grad():
        table = guide(guide.preprocess(distinct))["sentence_embedding"]
    index = {t: i for i, t in enumerate(distinct)}
    batch = {"guide_rows": torch.tensor([index[column[i]] for i in range(n) for column in texts])}
    objective = SimCSEObjective(mode, LossConfig(temperature=TAU), guide=GuideFilter(table, margin, strategy))
    got = objective.loss(rows, batch)
    got.backward()
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(want.item(), rel=1e-10, abs=1e-12)
    for key, g in want_grads.items():
        torch.testing.assert_close(student.get_parameter(key).grad, g, rtol=1e-10, atol=1e-12, msg=key)

    rows_of = batch["guide_rows"]
    guide_a, guide_c = table[rows_of[0::columns]], torch.cat([table[rows_of[v::columns]] for v in range(1, columns)])
    expected = hand_count(guide_a, guide_c, margin, strategy)
    assert 0 < objective.guided.total == objective.guided.last == expected < n * (guide_c.shape[0] - 1)
    assert objective.metrics()["guide_masked_total"] == expected
    # Without the guide the loss differs: the masking above changed the answer.
    assert abs(SimCSEObjective(mode, LossConfig(temperature=TAU)).loss(rows.detach(), batch).item() - got.item()) > 1e-6


def test_guided_mask_by_hand() -> None:
    """3 anchors, 4 candidates, 2-D guide vectors at known angles; both strategies."""
    angle = lambda deg: [math.cos(math.radians(deg)), math.sin(math.radians(deg))]  # noqa: E731
    anchors = torch.tensor([angle(0), angle(90), angle(180)], dtype=torch.float64)
    candidates = torch.tensor([angle(30), angle(80), angle(10), angle(120)], dtype=torch.float64)
    positive = torch.tensor([0, 1, 3])
    # cos to the positive: 0.866, 0.985, 0.5. Anchor 0: 10 deg (0.985) > 0.866: masked.
    absolute = masks.guided_mask(anchors, candidates, positive)
    assert absolute.tolist() == [[False, False, True, False], [False, False, False, False], [False, False, False, False]]
    # margin 0.4: anchor 0 drops cos > 0.466 (10 deg); anchor 1 drops > 0.585 (120 deg: 0.866, not
    # 30 deg: 0.5); anchor 2 drops > 0.1 (none: every other candidate lies beyond 90 deg).
    wide = masks.guided_mask(anchors, candidates, positive, margin=0.4)
    assert wide.tolist() == [[False, False, True, False], [False, False, False, True], [False, False, False, False]]
    # relative 0.5: thresholds 0.433, 0.492, 0.25: anchor 1 drops 30 deg (0.5) and 120 deg (0.866).
    relative = masks.guided_mask(anchors, candidates, positive, margin=0.5, strategy="relative")
    assert relative.tolist() == [[False, False, True, False], [True, False, False, True], [False, False, False, False]]
    itself = masks.guided_mask(anchors, candidates, positive, margin=2.0, self_index=torch.tensor([2, 0, 1]))
    assert itself[:, [2, 0, 1]].diagonal().tolist() == [False] * 3  # a row's own column is never the guide's to mark
    with pytest.raises(ValueError, match="margin strategy"):
        masks.guided_mask(anchors, candidates, positive, strategy="percent")
    assert GUIDE_MARGIN_STRATEGIES == masks.MARGIN_STRATEGIES  # config's names are the core's


# --------------------------------------------------------------------------- the naive loop: queue, GradCache, processes


def naive_guided(
    emb: torch.Tensor,
    rows: torch.Tensor,
    table: torch.Tensor,
    mode: str,
    margin: float,
    strategy: str,
    queue: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[float, int]:
    """The guided InfoNCE built by hand: anchors, candidates (every other view's rows, block
    after block, then the queue's), each kept candidate's exp in the denominator."""
    v = {"unsup": 2, "sup": 2, "hardneg": 3}[mode]
    idx = list(range(emb.shape[0]))
    if mode == "unsup":  # 2N-view: every row an anchor, against every row but itself
        anchors, cands = idx, idx
        positive = {a: a ^ 1 for a in anchors}
    else:
        anchors = idx[0::v]
        cands = [r for view in range(1, v) for r in idx[view::v]]
        positive = {a: a + 1 for a in anchors}
    c_emb = [emb[c] for c in cands] + ([] if queue is None else list(queue[0]))
    c_guide = [table[rows[c]] for c in cands] + ([] if queue is None else [table[r] for r in queue[1]])
    c_row = cands + [None] * (0 if queue is None else len(queue[0]))
    total, masked = 0.0, 0
    for a in anchors:
        limit = threshold(cos(table[rows[a]], table[rows[positive[a]]]), margin, strategy)
        terms, pos = [], None
        for j, (e, g, r) in enumerate(zip(c_emb, c_guide, c_row, strict=True)):
            if r == a:
                continue
            if r == positive[a]:
                pos = j
            elif cos(table[rows[a]], g) > limit:
                masked += 1
                continue
            terms.append((j, cos(emb[a].double(), e.double()) / TAU))
        logits = dict(terms)
        total += -(logits[pos] - math.log(sum(math.exp(x) for x in logits.values())))
    return total / len(anchors), masked


def guided_batch(tokenizer: object, mode: str, n: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    sents = toy_sentences(3 * n + 12)
    examples = [{"sent0": sents[i], "sent1": sents[n + i], "hard_neg": sents[2 * n + i]} for i in range(n)]
    texts = teacher_texts({k: [ex[k] for ex in examples] for k in ("sent0", "sent1", "hard_neg")}, mode) + sents[3 * n :]
    collator = ContrastiveCollator(tokenizer, mode, 16, guide_index={t: i for i, t in enumerate(texts)})
    table = torch.randn(len(texts), 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return collator(examples), table


@pytest.mark.parametrize("mode", ["unsup", "sup", "hardneg"])
@pytest.mark.parametrize(("strategy", "margin"), [("absolute", 0.1), ("relative", 0.2)])
def test_guide_with_queue_matches_naive_loop(tiny_model_dir: Path, mode: str, strategy: str, margin: float) -> None:
    """The queue's entries are vetted by their guide rows like the batch's: the loss and the
    count equal the naive loop's, and some queue entries are masked."""
    margin += MARGIN[mode] - MARGIN["sup"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch, table = guided_batch(tokenizer, mode, 6)
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(batch["input_ids"].shape[0], 8, generator=g, dtype=torch.float64)
    queue_rows = torch.randn(7, 8, generator=g, dtype=torch.float64)
    queue_guide = torch.randint(0, table.shape[0], (7,), generator=g)
    objective = SimCSEObjective(mode, LossConfig(temperature=TAU), guide=GuideFilter(table, margin, strategy))
    got = objective.loss(emb, batch, queue=Queue(queue_rows, None, queue_guide))
    want, masked = naive_guided(emb, batch["guide_rows"], table, mode, margin, strategy, (queue_rows, queue_guide))
    assert got.item() == pytest.approx(want, rel=1e-10)
    _, in_batch = naive_guided(emb, batch["guide_rows"], table, mode, margin, strategy)
    assert objective.guided.total == masked > in_batch > 0  # the queue's entries were vetted too
    with pytest.raises(ValueError, match="queue's guide rows"):
        objective.loss(emb, batch, queue=Queue(queue_rows, None, None))


@pytest.mark.parametrize("mode", ["unsup", "hardneg"])
def test_gradcache_with_guide_equals_full_batch_and_naive_loop(tiny_model_dir: Path, mode: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch, table = guided_batch(tokenizer, mode, 8)

    def model() -> SimCSEModel:
        torch.manual_seed(0)
        return SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train", dropout=0.0))

    def objective() -> SimCSEObjective:
        return SimCSEObjective(mode, LossConfig(temperature=TAU), guide=GuideFilter(table, MARGIN[mode], "absolute"))

    full, plain = model().train(), objective()
    want_loss = plain.step(full, batch)
    cached, chunked = model().train(), objective()
    got_loss = GradCacheStep(chunked, 5)(cached, batch)
    with torch.no_grad():
        emb = full(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
    naive, masked = naive_guided(emb, batch["guide_rows"], table, mode, MARGIN[mode], "absolute")
    assert got_loss.item() == pytest.approx(want_loss.item(), abs=1e-5) and want_loss.item() == pytest.approx(naive, rel=1e-5)
    assert chunked.guided.total == plain.guided.total == masked > 0
    for (name, p), q in zip(full.named_parameters(), cached.parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)


def test_momentum_queue_keeps_the_keys_guide_rows(tiny_model_dir: Path) -> None:
    """The queue stores each key's guide row beside it; the next step's loss vets them: its
    count is the naive loop's over the batch plus the queue."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    first, table = guided_batch(tokenizer, "sup", 4)
    second, _ = guided_batch(tokenizer, "sup", 4)
    second = dict(second) | {"guide_rows": first["guide_rows"].roll(1)}  # other rows: other guide vectors
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="none", dropout=0.0))
    queue = MomentumQueue(model, size=6, momentum=0.0, dim=32, guide=True)
    objective = SimCSEObjective("sup", LossConfig(temperature=TAU), guide=GuideFilter(table, 0.3, "absolute"))
    step = MomentumQueueStep(objective, queue)
    step(model, first)
    rows, _, guide_rows = (t.clone() for t in queue.negatives())  # the buffers: the next enqueue writes over them
    assert guide_rows.tolist() == first["guide_rows"][1::2].tolist()
    model.zero_grad()
    step(model, second)
    with torch.no_grad():
        emb = model(**{k: v for k, v in second.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
    _, masked = naive_guided(emb, second["guide_rows"], table, "sup", 0.3, "absolute", (rows, guide_rows))
    assert objective.guided.last == masked
    assert "queue_guide_rows" not in MomentumQueue(model, 6, 0.0, 32).state_dict()  # no guide: the state as before
    assert "queue_guide_rows" in queue.state_dict()


WORLD, PER_RANK = 2, 4


def _two_process_case(model_dir: str, mode: str, batch: dict[str, torch.Tensor], table: torch.Tensor) -> tuple[float, int, dict]:
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=model_dir, pooler="avg", mlp="none", dropout=0.0))
    guide = GuideFilter(table, MARGIN[mode], "absolute")
    objective = SimCSEObjective(mode, LossConfig(temperature=TAU, gather=True), guide=guide)
    loss = objective.step(model, batch)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), objective.guided.total, grads


def _rows(batch: dict[str, torch.Tensor], first: int, count: int, views: int) -> dict[str, torch.Tensor]:
    return {k: v[first * views : (first + count) * views] for k, v in batch.items() if not k.startswith("pack_")}


def _guided_worker(rank: int, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        results = {}
        for mode, views in (("unsup", 2), ("hardneg", 3)):
            batch, table = guided_batch(tokenizer, mode, WORLD * PER_RANK)
            loss, masked, grads = _two_process_case(model_dir, mode, _rows(batch, rank * PER_RANK, PER_RANK, views), table)
            totals = torch.tensor([loss, float(masked)], dtype=torch.float64)
            dist.all_reduce(totals)
            for g in grads.values():  # what DDP does: the mean over processes
                dist.all_reduce(g)
                g /= WORLD
            results[mode] = (totals[0].item() / WORLD, int(totals[1].item()), grads)
        if rank == 0:
            torch.save(results, Path(out_dir) / "guided.pt")
    finally:
        dist.destroy_process_group()


def test_guide_across_two_processes_equals_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each process's anchors are vetted against both processes' candidates (the guide rows
    gathered with the rows): the summed counts, mean loss and gradients equal one process on
    the whole batch, and the count equals the naive loop's."""
    mp.spawn(_guided_worker, args=(str(tiny_model_dir), str(tmp_path)), nprocs=WORLD, join=True)
    got = torch.load(tmp_path / "guided.pt")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for mode, views in (("unsup", 2), ("hardneg", 3)):
        batch, table = guided_batch(tokenizer, mode, WORLD * PER_RANK)
        whole = _rows(batch, 0, WORLD * PER_RANK, views)
        want_loss, want_masked, want_grads = _two_process_case(str(tiny_model_dir), mode, whole, table)
        torch.manual_seed(0)
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="avg", mlp="none", dropout=0.0))
        with torch.no_grad():
            emb = model(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
        _, naive_masked = naive_guided(emb, batch["guide_rows"], table, mode, MARGIN[mode], "absolute")
        assert got[mode][1] == want_masked == naive_masked > 0, mode
        # A process alone would vet only its own half: fewer entries.
        alone = sum(_two_process_case(str(tiny_model_dir), mode, _rows(batch, r * PER_RANK, PER_RANK, views), table)[1]
                    for r in range(WORLD))  # fmt: skip
        assert alone < want_masked
        assert abs(got[mode][0] - want_loss) < 1e-5
        for key, g in got[mode][2].items():
            assert torch.allclose(g, want_grads[key], atol=1e-5, rtol=0), (mode, key)


# --------------------------------------------------------------------------- config, a run, mining


def test_guide_config_errors_name_the_key(tiny_run: TinyRun, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'loss.guide_margin_strategy' = 'percent': must be 'absolute' or 'relative'"):
        tiny_run.config("a", guide=str(tmp_path), guide_margin_strategy="percent")
    with pytest.raises(ConfigError, match=r"'loss.guide' = 'teacher': must be .*with a loss.teacher"):
        tiny_run.config("b", guide="teacher")
    with pytest.raises(ConfigError, match=r"'loss.guide_margin' = nan"):
        tiny_run.config("c", guide=str(tmp_path), guide_margin="nan")
    with pytest.raises(ConfigError, match=r"'loss.guide' = .*: must be null with loss.score_weight 1"):
        tiny_run.config("s", mode="scored", guide=str(tmp_path))  # no InfoNCE term: no negatives to vet
    missing = tmp_path / "no-such-guide"
    with pytest.raises(ConfigError, match=rf"config key 'loss.guide' = '{missing}'.*no such model folder"):
        tiny_run.train("d", guide=str(missing), teacher_cache_dir=str(tmp_path / "cache"))
    assert not (tiny_run.folder / "d").exists()  # refused before the run folder exists
    # A relative guide path in a recipe is read from the recipe's folder, as loss.teacher.
    recipe = tiny_run.recipe("e")
    text = recipe.read_text(encoding="utf-8").replace("loss:\n", "loss:\n  guide: ./my-guide\n")
    recipe.write_text(text if "loss:\n" in text else text + "loss:\n  guide: ./my-guide\n", encoding="utf-8")
    from simcse_kit.config.run import load_config

    assert load_config(recipe).loss.guide == str(recipe.parent / "my-guide")


@pytest.mark.slow
def test_simcse_kit_train_with_a_guide_writes_the_masked_count(tiny_run: TinyRun, tmp_path: Path) -> None:
    """``simcse-kit train --guide M`` writes the guide's block, with the (anchor, candidate)
    entries it masked, in metrics.json; ``--guide teacher`` reuses the teacher's table."""
    from test_teacher import save_teacher

    from simcse_kit.cli import main

    guide = save_teacher(tmp_path / "guide", hidden=16)  # a simcse-kit folder: it records its pooler
    recipe = tiny_run.recipe("a", max_steps=3, eval_steps=0, save_steps=0, final_eval=False)
    options = ["--guide-margin", "0.05", "--teacher-cache-dir", str(tmp_path / "cache")]
    assert main(["train", str(recipe), "--guide", str(guide), *options]) == 0
    metrics = json.loads((tiny_run.folder / "a" / "metrics.json").read_text(encoding="utf-8"))
    block = metrics["guide"]
    assert block["model"] == str(guide) and block["margin"] == 0.05 and block["margin_strategy"] == "absolute"
    assert block["width"] == 16 and not block["cache_hit"] and block["masked"] > 0 and metrics["steps"] == 3
    recipe = tiny_run.recipe("b", max_steps=3, eval_steps=0, save_steps=0, final_eval=False)
    assert main(["train", str(recipe), "--guide", "teacher", "--teacher", str(guide), *options]) == 0
    shared = json.loads((tiny_run.folder / "b" / "metrics.json").read_text(encoding="utf-8"))
    assert shared["guide"]["cache_key"] == shared["teacher"]["cache_key"] == block["cache_key"]
    assert shared["guide"]["cache_hit"] and shared["guide"]["masked"] > 0


def test_the_gist_peer_takes_the_recipes_guide_and_margin(tiny_model_dir: Path, guide_dir: Path) -> None:
    """benchmarks' sentence-transformers peer of the guide rows: GISTEmbedLoss with the recipe's
    guide, margin, strategy and temperature; a recipe without a guide is refused."""
    from sentence_transformers import SentenceTransformer

    from benchmarks.st_peers import peer_loss, run_settings
    from simcse_kit.config.run import RunConfig

    student = SentenceTransformer(str(tiny_model_dir), device="cpu")
    cfg = RunConfig()
    cfg.loss.guide, cfg.loss.guide_margin, cfg.loss.guide_margin_strategy = str(guide_dir), 0.1, "relative"
    loss = peer_loss("gist", student, cfg.loss)
    assert type(loss).__name__ == "GISTEmbedLoss"
    assert (loss.margin, loss.margin_strategy, loss.temperature) == (0.1, "relative", cfg.loss.temperature)
    assert run_settings(cfg, "gist", "fp32")["guide"] == str(guide_dir)  # another guide: another run
    with pytest.raises(ValueError, match="needs a recipe with loss.guide"):
        peer_loss("gist", student, LossConfig())
