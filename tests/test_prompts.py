"""Prompts (data.prompts) hop by hop — training batches, the saved model, evaluation, the
export — and Matryoshka truncation at evaluation and in the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TinyRun, save_tiny_bert, toy_sentences
from test_export import MAX_LEN, train_and_save
from transformers import AutoTokenizer

from simcse_kit.core.batch import view_prompts
from simcse_kit.errors import ConfigError
from simcse_kit.evaluation import evaluate_model, evaluate_retrieval, read_beir, write_beir
from simcse_kit.evaluation.retrieval import RetrievalEvaluator
from simcse_kit.export import export_model
from simcse_kit.model import inference
from simcse_kit.model.inference import Encoder, load_encoder
from simcse_kit.model.modeling import SIMCSE_CONFIG, SimCSEModel
from simcse_kit.training.wiring.inputs import load_training_sets
from simcse_kit.training.wiring.loaders import make_loader

PROMPTS = {"query": "query: ", "document": "passage: "}
# Words the tiny tokenizer knows ("query: " and "passage: " are both [UNK] [UNK] to it), so a
# swapped or dropped prompt changes the token ids.
WORD_PROMPTS = {"query": "red ", "document": "ball street "}


@pytest.fixture(scope="module")
def bert3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("bert3"), layers=3)


def test_view_prompts() -> None:
    assert view_prompts(None, "hardneg") == ()
    assert view_prompts(PROMPTS, "unsup") == ("query: ", "passage: ")
    assert view_prompts(PROMPTS, "hardneg") == ("query: ", "passage: ", "passage: ")
    assert view_prompts({"query": "q: "}, "sup") == ("q: ", "")


@pytest.mark.parametrize("mode", ["unsup", "hardneg"])
def test_prompts_reach_training_batches(tiny_run: TinyRun, mode: str) -> None:
    from conftest import write_train_data

    train_file = write_train_data(tiny_run.folder, mode)
    cfg = tiny_run.config(
        "p", mode=mode, train_file=train_file, prompts="{query: 'red ', document: 'ball street '}", mask_false_negatives=True
    )
    assert cfg.data.prompts == WORD_PROMPTS
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    dataset = load_training_sets(cfg)
    plain = make_loader(tiny_run.config("n", mode=mode, train_file=train_file, mask_false_negatives=True), dataset, tokenizer, 1)
    prompted = make_loader(cfg, dataset, tokenizer, 1)
    batch, reference = next(iter(prompted)), next(iter(plain))  # the same seeded order
    # The prompted rows are the plain rows' texts with each view's prompt before them.
    n_views = 3 if mode == "hardneg" else 2
    texts = tokenizer.batch_decode(reference["input_ids"], skip_special_tokens=True)
    want = [("red " if i % n_views == 0 else "ball street ") + t for i, t in enumerate(texts)]
    expected = tokenizer(want, padding=True, truncation=True, max_length=cfg.model.max_seq_len, return_tensors="pt")
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    # False negatives are judged on the content, not on the prompt.
    assert torch.equal(batch["text_ids"], reference["text_ids"])


def test_prompts_are_saved_and_a_model_without_them_is_unchanged(tiny_run: TinyRun) -> None:
    tiny_run.train("with", prompts="{query: 'query: ', document: 'passage: '}", num_epochs=1, final_eval=False)
    tiny_run.train("without", num_epochs=1, final_eval=False)
    meta = json.loads((tiny_run.folder / "with" / "best_model" / SIMCSE_CONFIG).read_text())
    assert meta["prompts"] == PROMPTS
    assert load_encoder(tiny_run.folder / "with").prompts == PROMPTS
    assert "prompts" not in json.loads((tiny_run.folder / "without" / "best_model" / SIMCSE_CONFIG).read_text())
    assert load_encoder(tiny_run.folder / "without").prompts == {}


def test_bad_prompts_config(tiny_run: TinyRun) -> None:
    with pytest.raises(ConfigError, match="data.prompts"):
        tiny_run.config("a", prompts="{question: 'q: '}")
    with pytest.raises(ConfigError, match="must be a mapping"):
        tiny_run.config("b", prompts="query")


def _with_prompts(model_dir: Path) -> Path:
    meta_path = model_dir / SIMCSE_CONFIG
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"prompts": WORD_PROMPTS}))
    return model_dir


def _task(folder: Path) -> Path:
    sents = toy_sentences(20)
    queries = {f"q{i}": " ".join(sents[i].split()[:3]) for i in range(5)}
    qrels = {"test": {f"q{i}": {f"d{i}": 1} for i in range(5)}}
    return write_beir(folder, {f"d{i}": s for i, s in enumerate(sents)}, queries, qrels)


def test_evaluation_uses_the_models_prompts(
    tmp_path: Path, bert3_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = _with_prompts(train_and_save(bert3_dir, "cls", "train", tmp_path / "model"))
    seen: list[str] = []
    original = inference.Encoder.encode

    def spy(self: Encoder, sentences: list[str], batch_size: int = 128) -> torch.Tensor:
        seen.extend(sentences)
        return original(self, sentences, batch_size)

    monkeypatch.setattr(inference.Encoder, "encode", spy)
    folder = _task(tmp_path / "toy")
    evaluate_retrieval(model_dir, [folder])
    queries, docs = read_beir(folder).queries.values(), read_beir(folder).corpus.values()
    assert sorted(seen) == sorted({*("red " + q for q in queries), *("ball street " + d for d in docs)})
    seen.clear()
    evaluate_model(model_dir, data_dir=data_dir / "senteval", tasks=["STSBenchmark"])
    assert seen and all(s.startswith("red ") for s in seen)  # STS: both sides as queries


@pytest.mark.parametrize("normalize", [True, False])
def test_export_writes_prompts_with_identical_vectors(tmp_path: Path, bert3_dir: Path, normalize: bool) -> None:
    from sentence_transformers import SentenceTransformer

    model_dir = _with_prompts(train_and_save(bert3_dir, "cls", "train", tmp_path / "model"))
    export_model(model_dir, tmp_path / "st", normalize=normalize)
    config = json.loads((tmp_path / "st" / "config_sentence_transformers.json").read_text())
    assert config["prompts"] == WORD_PROMPTS
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    ours = Encoder(SimCSEModel.load(model_dir), AutoTokenizer.from_pretrained(model_dir), MAX_LEN)
    sentences = toy_sentences(12)
    for name, prompt in WORD_PROMPTS.items():
        theirs = st.encode(sentences, prompt_name=name, convert_to_tensor=True)
        want = ours.encode([prompt + s for s in sentences])
        want = torch.nn.functional.normalize(want, dim=-1) if normalize else want
        torch.testing.assert_close(theirs, want, atol=1e-5, rtol=1e-4)
    # Not vacuous: each prompt changes the vectors, differently.
    query = st.encode(sentences, prompt_name="query", convert_to_tensor=True)
    assert (st.encode(sentences, convert_to_tensor=True) - theirs).abs().max() > 1e-3
    assert (query - theirs).abs().max() > 1e-3


def test_export_without_prompts_writes_none(tmp_path: Path, bert3_dir: Path) -> None:
    export_model(train_and_save(bert3_dir, "cls", "train", tmp_path / "model"), tmp_path / "st")
    config = json.loads((tmp_path / "st" / "config_sentence_transformers.json").read_text())
    assert config["prompts"] == {} and "truncate_dim" not in config


# --- Matryoshka truncation ---------------------------------------------------------------


def test_export_truncate_dim_loads_at_that_dimension(tmp_path: Path, bert3_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model_dir = train_and_save(bert3_dir, "cls", "train", tmp_path / "model")
    result = export_model(model_dir, tmp_path / "st", truncate_dim=8)
    config = json.loads((tmp_path / "st" / "config_sentence_transformers.json").read_text())
    assert config["truncate_dim"] == 8 and result.min_cosine > 0.9999
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    sentences = toy_sentences(12)
    theirs = st.encode(sentences, convert_to_tensor=True)
    assert theirs.shape == (12, 8)
    ours = Encoder(SimCSEModel.load(model_dir), AutoTokenizer.from_pretrained(model_dir), MAX_LEN).encode(sentences)
    # sentence-transformers normalises, then truncates.
    torch.testing.assert_close(theirs, torch.nn.functional.normalize(ours, dim=-1)[:, :8], atol=1e-5, rtol=1e-4)
    with pytest.raises(ConfigError, match="--truncate-dim 64: must lie in 1..32"):
        export_model(model_dir, tmp_path / "st2", truncate_dim=64)


def test_evaluate_truncate_dim(tmp_path: Path, bert3_dir: Path, data_dir: Path) -> None:
    model_dir = train_and_save(bert3_dir, "cls", "train", tmp_path / "model")
    folder = _task(tmp_path / "toy")
    encode = load_encoder(model_dir).encode
    got = evaluate_retrieval(model_dir, [folder], truncate_dim=4)
    assert got == pytest.approx(RetrievalEvaluator([folder])(lambda t: encode(t)[:, :4]))
    sts = evaluate_model(model_dir, data_dir=data_dir / "senteval", tasks=["STSBenchmark"], truncate_dim=4)
    full = evaluate_model(model_dir, data_dir=data_dir / "senteval", tasks=["STSBenchmark"])
    assert sts["STSBenchmark"] != pytest.approx(full["STSBenchmark"], abs=0.01)
    with pytest.raises(ConfigError, match="--truncate-dim 64: the model's embeddings have only 32"):
        evaluate_retrieval(model_dir, [folder], truncate_dim=64)
