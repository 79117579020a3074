"""Distillation from a teacher (issue 29): the soft-target loss against naive loops, the
teacher term of every mode against a hand-built reference, GradCache, the vector cache,
and widths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import TinyRun, toy_sentences, write_vocab
from transformers import AutoTokenizer

from simcse_kit.config.run import LossConfig, ModelConfig
from simcse_kit.core import losses
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.errors import ConfigError
from simcse_kit.model.modeling import SimCSEModel
from simcse_kit.training.engine.steps import GradCacheStep
from simcse_kit.training.objective.objectives import SimCSEObjective, TeacherTargets
from simcse_kit.training.objective.teacher import aligned_projection, load_teacher_table, pca_projection, teacher_texts

# --------------------------------------------------------------------------- the loss core


def naive_soft(a: torch.Tensor, c: torch.Tensor, tau: float, q: list[list[float]], exclude: list[list[bool]]) -> float:
    """-sum_j q_ij log softmax_i(cos / tau)[j] over the kept candidates, mean over anchors."""

    def cos(x: torch.Tensor, y: torch.Tensor) -> float:
        return float(x @ y) / (float(x.norm()) * float(y.norm()))

    total = 0.0
    for i in range(len(a)):
        keep = [j for j in range(len(c)) if not exclude[i][j]]
        logit = {j: cos(a[i], c[j]) / tau for j in keep}
        log_den = math.log(sum(math.exp(v) for v in logit.values()))
        total += -sum(q[i][j] * (logit[j] - log_den) for j in keep)
    return total / len(a)


def naive_targets(a: torch.Tensor, c: torch.Tensor, tau: float, exclude: list[list[bool]]) -> list[list[float]]:
    out = []
    for i in range(len(a)):
        e = [0.0 if exclude[i][j] else math.exp(float(torch.cosine_similarity(a[i], c[j], dim=0)) / tau) for j in range(len(c))]
        out.append([v / sum(e) for v in e])
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_soft_target_loss_matches_naive_loop(dtype: torch.dtype) -> None:
    """Teacher of another width (5) than the student (6); exclusions in both; the loss's
    fp32 contract holds for half-precision inputs at fp32 tolerance."""
    g = torch.Generator().manual_seed(3)
    a, c = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(7, 6, generator=g, dtype=torch.float64)
    ta, tc = torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randn(7, 5, generator=g, dtype=torch.float64)
    exclude = torch.rand(4, 7, generator=g) < 0.3
    exclude[:, 0] = False  # every row keeps a candidate
    targets = losses.similarity_targets(ta, tc, temperature=0.1, exclude=exclude)
    want_q = naive_targets(ta, tc, 0.1, exclude.tolist())
    torch.testing.assert_close(targets, torch.tensor(want_q, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert bool((targets[exclude] == 0).all())
    ra, rc = a.to(dtype).double(), c.to(dtype).double()
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    for tau in (1.0, 0.05):
        got = losses.contrastive_loss(a.to(dtype), c.to(dtype), temperature=tau, target_probs=targets, exclude=exclude)
        assert got.item() == pytest.approx(naive_soft(ra, rc, tau, want_q, exclude.tolist()), rel=tol, abs=tol)


def test_one_hot_targets_are_todays_info_nce() -> None:
    g = torch.Generator().manual_seed(4)
    a, c = torch.randn(5, 8, generator=g, dtype=torch.float64), torch.randn(9, 8, generator=g, dtype=torch.float64)
    positive = torch.tensor([3, 0, 2, 8, 5])
    exclude = torch.rand(5, 9, generator=g) < 0.3
    exclude[torch.arange(5), positive] = False
    one_hot = torch.nn.functional.one_hot(positive, 9).double()
    soft = losses.contrastive_loss(a, c, temperature=0.05, target_probs=one_hot, exclude=exclude)
    hard = losses.contrastive_loss(a, c, temperature=0.05, positive_index=positive, exclude=exclude)
    assert soft.item() == pytest.approx(hard.item(), rel=1e-13)
    # The plain InfoNCE of the named form too (no exclusions).
    plain = losses.info_nce(a[:5], c[:5], temperature=0.05)
    eye = torch.eye(5, dtype=torch.float64)
    soft = losses.contrastive_loss(a[:5], c[:5], temperature=0.05, target_probs=eye)
    assert soft.item() == pytest.approx(plain.item(), rel=1e-13)


def test_soft_targets_refuse_mass_on_excluded_and_stay_finite_at_low_tau() -> None:
    a = torch.randn(3, 4, requires_grad=True)
    exclude = torch.eye(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="excluded"):
        losses.contrastive_loss(a, a, temperature=0.05, target_probs=torch.full((3, 3), 1 / 3), exclude=exclude)
    q = losses.similarity_targets(torch.randn(3, 7), torch.randn(3, 7), temperature=0.01, exclude=exclude)
    loss = losses.contrastive_loss(a.bfloat16(), a.bfloat16(), temperature=0.01, target_probs=q, exclude=exclude)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(a.grad).all()


# --------------------------------------------------------------------------- the objective


def teacher_batch(tokenizer: object, mode: str, n: int, duplicate: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    sents = toy_sentences(3 * n)
    examples = [{"sent0": sents[i], "sent1": sents[n + i], "hard_neg": sents[2 * n + i]} for i in range(n)]
    if duplicate:  # the same text twice in a batch: a false negative to mask
        examples[1] = dict(examples[0])
    texts = teacher_texts({k: [ex[k] for ex in examples] for k in ("sent0", "sent1", "hard_neg")}, mode)
    collator = ContrastiveCollator(tokenizer, mode, 16, with_text_ids=True, teacher_index={t: i for i, t in enumerate(texts)})
    return collator(examples), texts


def reference(
    mode: str,
    emb: torch.Tensor,
    teacher_rows: torch.Tensor,
    table: torch.Tensor,
    tau: float,
    tau_t: float,
    same_text: torch.Tensor | None,
) -> float:
    """The teacher term built by hand from the batch layout: which rows are anchors and
    candidates per mode, the self entry and (optionally) same-text candidates excluded."""
    rows = list(range(emb.shape[0]))
    v = {"unsup": 2, "sup": 2, "hardneg": 3}[mode]
    if mode == "unsup":
        anchors, cands = rows, rows
    else:
        anchors = rows[0::v]
        cands = [r for view in range(1, v) for r in rows[view::v]]
    positive = {a: (a ^ 1 if mode == "unsup" else a + 1) for a in anchors}
    exclude = []
    for a in anchors:
        row = []
        for c in cands:
            out = c == a
            if same_text is not None and c != positive[a]:
                out |= bool(same_text[a, c]) or bool(same_text[positive[a], c])
            row.append(out)
        exclude.append(row)
    ta, tc = table[teacher_rows[anchors]], table[teacher_rows[cands]]
    q = naive_targets(ta.double(), tc.double(), tau_t, exclude)
    return naive_soft(emb[anchors].double(), emb[cands].double(), tau, q, exclude)


@pytest.mark.parametrize("mode", ["unsup", "sup", "hardneg"])
@pytest.mark.parametrize("mask", [False, True])
def test_teacher_term_matches_hand_built_reference(tiny_model_dir: Path, mode: str, mask: bool) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch, texts = teacher_batch(tokenizer, mode, 6, duplicate=mask)
    g = torch.Generator().manual_seed(5)
    table = torch.randn(len(texts), 11, generator=g, dtype=torch.float64).float()  # another width than the student's 32
    emb = torch.randn(batch["input_ids"].shape[0], 32, generator=g)
    cfg = LossConfig(temperature=0.05, mask_false_negatives=mask, hard_negative_weight=2.0)
    taught = SimCSEObjective(mode, cfg, teacher=TeacherTargets(table, "similarity", temperature=0.1, weight=1.0))
    ids = batch["text_ids"]
    same_text = (ids.view(-1, 1) == ids.view(1, -1)) if mask else None
    want = reference(mode, emb, batch["teacher_rows"], table, 0.05, 0.1, same_text)
    assert taught.loss(emb, batch).item() == pytest.approx(want, rel=1e-5)
    if mask:
        assert taught.masked_negatives > 0
    # The weight mixes the two terms; 0 gives exactly the plain objective.
    plain = SimCSEObjective(mode, cfg).loss(emb, batch)
    mixed = SimCSEObjective(mode, cfg, teacher=TeacherTargets(table, "similarity", 0.1, weight=0.3)).loss(emb, batch)
    assert mixed.item() == pytest.approx(0.7 * plain.item() + 0.3 * want, rel=1e-5)
    none = SimCSEObjective(mode, cfg, teacher=TeacherTargets(table, "similarity", 0.1, weight=0.0)).loss(emb, batch)
    assert none.item() == plain.item()
    # The student's own tau in the teacher term; the SimCSE term keeps loss.temperature.
    flat = reference(mode, emb, batch["teacher_rows"], table, 0.5, 0.1, same_text)
    own = TeacherTargets(table, "similarity", 0.1, weight=0.3, student_temperature=0.5)
    assert abs(flat - want) > 0.1  # the two taus give different answers: the check below can fail
    assert SimCSEObjective(mode, cfg, teacher=own).loss(emb, batch).item() == pytest.approx(
        0.7 * plain.item() + 0.3 * flat, rel=1e-5
    )


def test_embedding_distillation_is_mse_of_normalised_vectors(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch, texts = teacher_batch(tokenizer, "sup", 4)
    g = torch.Generator().manual_seed(6)
    emb = torch.randn(8, 32, generator=g)
    same = torch.randn(len(texts), 32, generator=g)
    objective = SimCSEObjective("sup", LossConfig(), teacher=TeacherTargets(same, "embedding", weight=1.0))
    s = torch.nn.functional.normalize(emb, dim=-1)
    t = torch.nn.functional.normalize(same[batch["teacher_rows"]], dim=-1)
    assert objective.loss(emb, batch).item() == pytest.approx(((s - t) ** 2).mean().item(), rel=1e-6)
    wide = torch.randn(len(texts), 48, generator=g)
    with pytest.raises(ValueError, match="equal widths"):
        SimCSEObjective("sup", LossConfig(), teacher=TeacherTargets(wide, "embedding")).loss(emb, batch)
    # A PCA projection to the student's width: the same MSE against (x - mean) @ components.
    mean, comps = pca_projection(torch.randn(40, 48, generator=g), 32)
    projected = SimCSEObjective("sup", LossConfig(), teacher=TeacherTargets(wide, "embedding", projection=(mean, comps)))
    t = torch.nn.functional.normalize((wide[batch["teacher_rows"]] - mean) @ comps, dim=-1)
    assert projected.loss(emb, batch).item() == pytest.approx(((s - t) ** 2).mean().item(), rel=1e-5)
    # An aligned projection adds the student's mean after the map.
    offset = torch.randn(32, generator=g)
    aligned = SimCSEObjective("sup", LossConfig(), teacher=TeacherTargets(wide, "embedding", projection=(mean, comps, offset)))
    t = torch.nn.functional.normalize((wide[batch["teacher_rows"]] - mean) @ comps + offset, dim=-1)
    assert aligned.loss(emb, batch).item() == pytest.approx(((s - t) ** 2).mean().item(), rel=1e-5)


def test_aligned_projection_recovers_a_known_rotation_scale_and_offset() -> None:
    """A student whose vectors ARE the teacher's PCA coordinates rotated, scaled and shifted:
    the aligned projection maps the teacher exactly onto them, where a bare PCA is far off."""
    g = torch.Generator().manual_seed(9)
    teacher = torch.randn(300, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 10, generator=g, dtype=torch.float64)
    teacher = (teacher + 3.0).float()  # rank 6 of 10, off-centre
    mean, comps = pca_projection(teacher, 6)
    rotation = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0].float()
    student = ((teacher - mean) @ comps) @ rotation * 2.5 + torch.arange(6.0)
    got_mean, got_comps, got_offset = aligned_projection(teacher, student)
    mapped = (teacher - got_mean) @ got_comps + got_offset
    torch.testing.assert_close(mapped, student, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(got_offset, torch.arange(6.0), atol=1e-4, rtol=0)
    assert ((teacher - mean) @ comps - student).norm() > 10 * student.norm() / 100  # PCA alone: another frame
    # Deterministic: a resumed run projects exactly as the first.
    again = aligned_projection(teacher, student)
    assert all(torch.equal(a, b) for a, b in zip(again, (got_mean, got_comps, got_offset), strict=True))
    with pytest.raises(ValueError, match="different sentences"):
        aligned_projection(teacher, student[:-1])


def test_pca_projection_keeps_the_top_directions() -> None:
    g = torch.Generator().manual_seed(7)
    basis = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))[0]
    x = (torch.randn(200, 10, generator=g, dtype=torch.float64) * torch.tensor([9.0, 5, 3] + [0.01] * 7)) @ basis.T
    mean, comps = pca_projection(x.float(), 3)
    # The 3 components span the 3 high-variance directions: projecting onto them and back loses ~nothing.
    centred = x.float() - mean
    back = (centred @ comps) @ comps.T
    assert (back - centred).norm() / centred.norm() < 0.01
    with pytest.raises(ConfigError, match="at least 3 training sentences"):
        pca_projection(x.float()[:2], 3)
    with pytest.raises(ConfigError, match="PCA only narrows"):
        pca_projection(x.float(), 11)


@pytest.mark.parametrize("mode", ["unsup", "hardneg"])
def test_gradcache_with_teacher_equals_full_batch(tiny_model_dir: Path, mode: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch, texts = teacher_batch(tokenizer, mode, 8)
    table = torch.randn(len(texts), 11, generator=torch.Generator().manual_seed(8))
    objective = SimCSEObjective(mode, LossConfig(temperature=0.05), teacher=TeacherTargets(table, "similarity", 0.05, 0.5))

    def model() -> SimCSEModel:
        torch.manual_seed(0)
        return SimCSEModel.from_config(ModelConfig(name_or_path=str(tiny_model_dir), pooler="cls", mlp="train", dropout=0.0))

    full = model().train()
    want_loss = objective.step(full, batch)  # backward=None: loss.backward()
    cached = model().train()
    got_loss = GradCacheStep(objective, 5)(cached, batch)
    assert got_loss.item() == pytest.approx(want_loss.item(), abs=1e-5)
    for (name, p), q in zip(full.named_parameters(), cached.parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=0, msg=name)
    assert set(objective.metrics()) == {"simcse_loss", "teacher_loss"}


# --------------------------------------------------------------------------- the teacher's vectors


def save_teacher(folder: Path, hidden: int) -> Path:
    """A tiny simcse-kit model folder of width ``hidden`` (a teacher any loader opens)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab=str(write_vocab(folder)), do_lower_case=True)
    tokenizer.save_pretrained(folder / "hf")
    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder / "hf")
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(folder / "hf"), pooler="avg", mlp="none", max_seq_len=32))
    model.save(folder / "kit", tokenizer)
    return folder / "kit"


def test_teacher_vectors_are_cached_and_the_teacher_not_loaded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = save_teacher(tmp_path / "teacher", hidden=16)
    texts = toy_sentences(30)
    first = load_teacher_table(str(teacher), texts, cache_dir=tmp_path / "cache", show_progress=False)
    assert not first.cache_hit and first.vectors.shape == (30, 16)

    def no_teacher(*args: object, **kwargs: object) -> None:
        raise AssertionError("the teacher was loaded although its vectors are cached")

    monkeypatch.setattr("simcse_kit.training.objective.teacher.load_encoder", no_teacher)
    second = load_teacher_table(str(teacher), texts, cache_dir=tmp_path / "cache", show_progress=False)
    assert second.cache_hit and torch.equal(second.vectors, first.vectors) and second.key == first.key
    # Other sentences are another key: never a stale table.
    with pytest.raises(AssertionError, match="cached"):
        load_teacher_table(str(teacher), texts[:-1], cache_dir=tmp_path / "cache", show_progress=False)


def test_run_with_a_teacher_of_another_width(tiny_run: TinyRun, tmp_path: Path) -> None:
    """similarity distillation from a 16-wide teacher into the 32-wide student runs, and its
    second run reads the cache; embedding distillation is refused without a projection,
    with a clear message, before a run folder exists."""
    teacher = save_teacher(tmp_path / "teacher", hidden=16)
    keys = {
        "teacher": str(teacher),
        "teacher_cache_dir": str(tmp_path / "cache"),
        "max_steps": 2,
        "eval_steps": 0,
        "save_steps": 0,
        "final_eval": "false",
    }
    first = tiny_run.train("a", **keys)
    assert first["teacher"]["width"] == 16 and not first["teacher"]["cache_hit"]
    assert first["steps"] == 2 and all(math.isfinite(loss) for _, loss in first["losses"])
    assert tiny_run.train("b", **keys)["teacher"]["cache_hit"]
    with pytest.raises(ConfigError, match=r"16 wide and the student's 32.*teacher_projection"):
        tiny_run.train("c", **keys, teacher_loss="embedding", teacher_projection="none")
    assert not (tiny_run.folder / "c").exists()
    with pytest.raises(ConfigError, match="PCA only narrows"):
        tiny_run.train("d", **keys, teacher_loss="embedding")
    wide = save_teacher(tmp_path / "wide", hidden=48)  # PCA from 48 to the student's 32
    done = tiny_run.train("e", **(keys | {"teacher": str(wide)}), teacher_loss="embedding")
    assert done["teacher"]["loss"] == "embedding" and done["teacher"]["width"] == 48
    aligned = tiny_run.train("f", **(keys | {"teacher": str(wide)}), teacher_loss="embedding", teacher_projection="aligned")
    assert all(math.isfinite(loss) for _, loss in aligned["losses"])
    assert aligned["losses"] != done["losses"]  # another target: the projection was applied
    with pytest.raises(ConfigError, match="teacher_student_temperature"):
        tiny_run.train("g", **keys, teacher_student_temperature="0")
