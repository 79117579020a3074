"""Decoder-only backbones (Qwen3, Llama, Gemma3 text) and LoRA adapters, on tiny random
models built from configs: last-token vectors that do not depend on the padding side, an
EOS the tokenizer appends, every mode trained with and without LoRA through the run, a
resume that ends exactly as the uninterrupted run, reload, evaluation and export to
sentence-transformers with parity; gradient checkpointing with the same gradients."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import toy_sentences, write_tiny_senteval, write_train_data
from safetensors.torch import load_file
from tiny_encoders import DECODERS
from transformers import AutoConfig, AutoTokenizer

from simcse_kit.config.run import DataConfig, LossConfig, ModelConfig, RunConfig, TrainConfig
from simcse_kit.core.modes import TABLE as MODES
from simcse_kit.data.collate import ContrastiveCollator
from simcse_kit.data.readers import load_train_dataset
from simcse_kit.model.checks import load_checked_tokenizer
from simcse_kit.model.families import is_decoder, prepare_tokenizer
from simcse_kit.model.modeling import ADAPTER_CONFIG, SimCSEModel, base_encoder
from simcse_kit.training.objective.objectives import SimCSEObjective

TEXTS = ["the cat sat on the mat .", "a dog", "the bird sings a song today , and the cat sleeps"]


@pytest.fixture(scope="module")
def senteval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_senteval(tmp_path_factory.mktemp("senteval") / "senteval")


def test_decoders_are_told_from_encoders(decoder_dirs: dict[str, Path], tiny_model_dir: Path) -> None:
    assert all(is_decoder(AutoConfig.from_pretrained(path)) for path in decoder_dirs.values())
    assert not is_decoder(AutoConfig.from_pretrained(tiny_model_dir))  # BERT has a causal head too, and a masked one


def test_the_tokenizer_appends_eos_keeps_bos_and_pads(decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Known ids: Qwen3 (no BOS) gets ``the cat <|im_end|>``; Llama keeps ``<s>`` first and,
    having no pad token, pads with ``</s>``; the change is saved with the tokenizer."""
    expected = {
        "qwen3": ([10, 7, 2], "<|endoftext|>"),
        "llama": ([1, 10, 7, 2], "</s>"),
        "mistral": ([1, 10, 7, 2], "</s>"),
        "gemma3_text": ([2, 11, 8, 3], "<pad>"),
    }
    for arch, path in decoder_dirs.items():
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path), AutoConfig.from_pretrained(path))
        ids, pad = expected[arch]
        assert tokenizer("the cat")["input_ids"] == ids and tokenizer.pad_token == pad, arch
        assert tokenizer("the cat", truncation=True, max_length=2)["input_ids"][-1] == ids[-1]  # EOS survives truncation
        tokenizer.save_pretrained(tmp_path / arch)
        assert AutoTokenizer.from_pretrained(tmp_path / arch)("the cat")["input_ids"] == ids, arch
        assert prepare_tokenizer(tokenizer, AutoConfig.from_pretrained(path))("the cat")["input_ids"] == ids  # once only


def gpt2_with_a_bert_tokenizer(folder: Path, bert: Path) -> Path:
    """A tiny random GPT-2 body beside the tiny BERT's tokenizer, which has no EOS token."""
    from transformers import GPT2Config, GPT2Model

    folder.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (bert / name).is_file():
            shutil.copy(bert / name, folder / name)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(AutoTokenizer.from_pretrained(bert)), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    GPT2Model(config).save_pretrained(folder)
    return folder


def test_a_decoder_without_eos_trains_under_avg_and_last_names_the_folder_and_key(
    tiny_model_dir: Path, senteval: Path, tmp_path: Path
) -> None:
    """Issue 48, a regression: a GPT-2 body with a BERT tokenizer (no EOS) under the default avg
    pooler trained, then was refused for a last-token vector it does not use. Now it trains,
    reloads and evaluates with its texts as they are; pooler last, or append_eos true, is refused
    naming the folder and model.append_eos."""
    from simcse_kit.errors import ConfigError
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.training.wiring.inputs import load_checked_tokenizer as run_tokenizer
    from simcse_kit.training.wiring.run import train

    path = gpt2_with_a_bert_tokenizer(tmp_path / "gpt2", tiny_model_dir)
    cfg = run_config(path, tmp_path / "run", senteval, "unsup", 0, num_epochs=1, eval_steps=0, save_steps=0)
    cfg = replace(cfg, model=replace(cfg.model, pooler="avg", dropout=None))
    plain = AutoTokenizer.from_pretrained(path)("the cat")["input_ids"]
    assert run_tokenizer(cfg)("the cat")["input_ids"] == plain
    metrics = train(cfg)
    assert metrics["steps"] == 4 and all(math.isfinite(v) for v in metrics["sts"].values())
    encoder = load_encoder(tmp_path / "run", device="cpu")
    assert encoder.tokenizer("the cat")["input_ids"] == plain
    with pytest.raises(ConfigError, match=rf"'model.append_eos' = null \(auto\): the decoder at {path} with pooler 'last'"):
        run_tokenizer(replace(cfg, model=replace(cfg.model, pooler="last")))
    with pytest.raises(ConfigError, match=rf"'model.append_eos' = True: the tokenizer at {path} has no EOS token"):
        run_tokenizer(replace(cfg, model=replace(cfg.model, append_eos=True)))
    last = replace(cfg.model, pooler="last", append_eos=False)  # the text's own last token: as asked
    assert run_tokenizer(replace(cfg, model=last))("the cat")["input_ids"] == plain


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("arch", DECODERS)
def test_last_token_vector_ignores_the_padding_side(arch: str, lora: int, decoder_dirs: dict[str, Path]) -> None:
    """Left-padded, right-padded, packed (from either) and unpadded (one sentence at a time)
    give one vector."""
    from simcse_kit.model.packing import pack

    cfg = ModelConfig(name_or_path=str(decoder_dirs[arch]), pooler="last", dropout=0.0, lora_r=lora)
    torch.manual_seed(0)  # the same adapter init in both models
    padded = SimCSEModel.from_config(replace(cfg, packing=False)).eval()
    torch.manual_seed(0)
    packing = SimCSEModel.from_config(replace(cfg, packing=True)).eval()
    assert padded.is_decoder and not padded.packing and packing.packing
    tokenizer = load_checked_tokenizer(decoder_dirs[arch])
    vectors = {}
    with torch.no_grad():
        for side in ("left", "right"):
            tokenizer.padding_side = side
            batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
            packed = pack(batch["input_ids"], batch["attention_mask"], left_padding=True)
            assert packed is not None and packed.rows == 2  # 3 sentences in 2 rows: it really packs
            vectors[side] = padded(**batch)
            vectors[f"packed from {side}"] = packing(**batch)
        alone = torch.cat([padded(**tokenizer([t], return_tensors="pt")) for t in TEXTS])
    for name, got in vectors.items():
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=0, msg=name)
    # The pooler reads the last real token, not the last column: a right-padded batch's last
    # column is a pad for the shorter sentences.
    assert not torch.allclose(
        alone[1],
        vectors["right"][1].new_zeros(())
        + padded.encoder(**tokenizer(TEXTS, padding=True, return_tensors="pt")).last_hidden_state[1, -1],
        atol=1e-3,
    )


def test_last_pooler_on_known_states() -> None:
    from simcse_kit.model.modeling import Pooler

    states = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert Pooler("last")(right, states).flatten().tolist() == [1.0, 7.0]
    assert Pooler("last")(left, states).flatten().tolist() == [3.0, 7.0]


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("arch", DECODERS)
def test_every_mode_trains_a_step(arch: str, lora: int, decoder_dirs: dict[str, Path], tmp_path: Path) -> None:
    """One optimiser step per mode: a finite loss, and the gradient reaches what trains —
    every weight, or with LoRA the adapter alone (the base stays frozen)."""
    tokenizer = load_checked_tokenizer(decoder_dirs[arch])
    for mode in MODES:
        dataset = load_train_dataset(str(write_train_data(tmp_path, mode)), mode)
        batch = ContrastiveCollator(tokenizer, mode, 16)([dataset[i] for i in range(6)])
        model = SimCSEModel.from_config(ModelConfig(name_or_path=str(decoder_dirs[arch]), pooler="last", lora_r=lora)).train()
        loss = SimCSEObjective(mode, LossConfig(temperature=0.05)).step(model, batch)
        assert math.isfinite(loss.item()) and loss.item() > 0
        with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        assert with_grad, mode
        if lora:
            assert all("lora_" in n for n in with_grad), sorted(with_grad)[:3]
            assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
        else:
            assert any("embed_tokens" in n for n in with_grad)


def run_config(
    path: Path, out: Path, senteval: Path, mode: str, lora: int, data: Path | None = None, **train: object
) -> RunConfig:
    pooler = "last" if is_decoder(AutoConfig.from_pretrained(path)) else "avg"
    return RunConfig(
        model=ModelConfig(name_or_path=str(path), pooler=pooler, max_seq_len=16, eval_max_seq_len=32, dropout=0.1, lora_r=lora),
        data=DataConfig(mode=mode, train_file=str(write_train_data(data or out.parent, mode)), eval_data_dir=str(senteval)),
        loss=LossConfig(temperature=0.05),
        train=TrainConfig(
            **{
                "output_dir": str(out),
                "batch_size": 8,
                "learning_rate": 5e-3,
                "num_epochs": 2,
                "eval_steps": 4,
                "save_steps": 2,
                "mixed_precision": "no",  # the same numbers on every CPU
                "seed": 7,
                "progress_bar": False,
            }
            | train  # type: ignore[arg-type]
        ),
    ).validate()


# (backbone, mode, LoRA rank): each decoder and an encoder, every mode, LoRA on and off.
RUNS = [("qwen3", "unsup", 4), ("llama", "hardneg", 0), ("gemma3_text", "sup", 4), ("bert", "sup", 4), ("qwen3", "hardneg", 0)]


@pytest.mark.parametrize(("arch", "mode", "lora"), RUNS)
def test_train_reload_evaluate_export(
    arch: str, mode: str, lora: int, decoder_dirs: dict[str, Path], tiny_model_dir: Path, senteval: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from simcse_kit.export import export_model
    from simcse_kit.model.inference import load_encoder
    from simcse_kit.training.wiring.run import train

    path = tiny_model_dir if arch == "bert" else decoder_dirs[arch]
    metrics = train(run_config(path, tmp_path / "run", senteval, mode, lora))
    assert metrics["steps"] == 8 and all(math.isfinite(v) for v in metrics["sts"].values())
    best = tmp_path / "run" / "best_model"
    meta = json.loads((best / "simcse_config.json").read_text())
    assert meta["adapter"] is bool(lora) and meta["decoder"] is (arch != "bert")
    # A LoRA run's best model is the adapter alone (plus tokenizer and metadata), not a copy of the base.
    assert (best / ADAPTER_CONFIG).is_file() is bool(lora)
    assert (best / "model.safetensors").is_file() is not bool(lora)

    result = export_model(tmp_path / "run", tmp_path / "export")  # merged: a plain model anywhere
    assert result.min_cosine >= 0.9999
    assert not (tmp_path / "export" / ADAPTER_CONFIG).exists()
    sents = [*toy_sentences(10), "a " * 40]
    ours = load_encoder(tmp_path / "run").encode(sents)
    theirs = SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(sents, convert_to_tensor=True).float()
    cos = torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=-1)
    assert cos.min().item() >= 0.9999, cos
    if arch != "bert":
        modules = json.loads((tmp_path / "export" / "modules.json").read_text())
        pooling = next(m for m in modules if m["type"].endswith("Pooling"))
        assert json.loads((tmp_path / "export" / pooling["path"] / "config.json").read_text())["pooling_mode_lasttoken"]


def test_lora_trains_the_adapter_and_leaves_the_base(decoder_dirs: dict[str, Path], senteval: Path, tmp_path: Path) -> None:
    """After a LoRA run the base weights are untouched and the merged model differs from
    the base only through the adapter: merging by hand (W + B A * alpha / r) gives it."""
    from simcse_kit.training.wiring.run import train

    path = decoder_dirs["qwen3"]
    train(run_config(path, tmp_path / "run", senteval, "unsup", 4, eval_steps=0, eval_at_start=False))
    base = load_file(str(path / "model.safetensors"))
    adapter = load_file(str(tmp_path / "run" / "best_model" / "adapter_model.safetensors"))
    merged = base_encoder(SimCSEModel.load(tmp_path / "run" / "best_model").encoder).state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), sorted(changed)
    for key in changed:
        stem = key.removesuffix(".weight")
        a = next(v for k, v in adapter.items() if stem in k and "lora_A" in k)
        b = next(v for k, v in adapter.items() if stem in k and "lora_B" in k)
        assert torch.allclose(merged[key], base[key] + (b @ a) * (16 / 4), atol=1e-6), key


@pytest.mark.parametrize(("lora", "bf16"), [(0, False), (4, False), (4, True)])
def test_resume_mid_run_ends_as_the_uninterrupted_run(
    lora: int, bf16: bool, decoder_dirs: dict[str, Path], senteval: Path, tmp_path: Path
) -> None:
    """Cut a finished run back to its step-4 checkpoint and resume: the last checkpoint's
    weights and the metrics equal the uninterrupted run's, bit for bit (packed, the CPU's
    default; also LoRA with bf16 weights, whose saved adapter is the fp32 masters')."""
    from simcse_kit.training.wiring.run import train

    precision = {"mixed_precision": "bf16", "bf16_weights": True, "fast_dropout": False} if bf16 else {}
    cfg = run_config(decoder_dirs["qwen3"], tmp_path / "full" / "run", senteval, "unsup", lora, data=tmp_path, **precision)
    full = train(cfg)
    cut = tmp_path / "cut" / "run"
    shutil.copytree(tmp_path / "full" / "run", cut)
    for later in (cut / "checkpoints").glob("step-*"):
        if int(later.name.split("-")[1]) > 4:
            shutil.rmtree(later)
    (cut / "metrics.json").unlink()
    cfg_cut = run_config(decoder_dirs["qwen3"], cut, senteval, "unsup", lora, data=tmp_path, **precision)
    resumed = train(cfg_cut, resume=True)
    timing = ("train_seconds", "examples_per_second", "sentences_per_second")
    assert {k: v for k, v in resumed.items() if k not in timing} == {k: v for k, v in full.items() if k not in timing}
    last = sorted((tmp_path / "full" / "run" / "checkpoints").glob("step-*"))[-1].name
    a = load_file(str(tmp_path / "full" / "run" / "checkpoints" / last / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / last / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if bf16:  # the model ran in bf16; the adapter saved for use is fp32
        assert {v.dtype for k, v in a.items() if "lora_" in k} == {torch.bfloat16}
        saved = load_file(str(cut / "best_model" / "adapter_model.safetensors"))
        assert saved and {v.dtype for v in saved.values()} == {torch.float32}


def saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The unsup loss of ``batch`` and the bytes autograd keeps for the backward pass (a tensor
    saved inside a checkpointed block is not kept: the checkpoint's own hooks take it)."""
    kept = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.untyped_storage().nbytes())
        return t

    objective = SimCSEObjective("unsup", LossConfig(temperature=0.05))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = objective.loss(objective.embed(model, batch), batch)
    return loss, sum(kept)


@pytest.mark.parametrize(
    ("arch", "packing", "fast_dropout"),
    [("bert", False, False), ("bert", True, False), ("mpnet", False, False), ("mpnet", True, True)],
)
def test_gradient_checkpointing_gives_the_same_gradients(
    arch: str, packing: bool, fast_dropout: bool, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Dropout on (the unsup views), checkpointing on or off: the same loss and gradients, bit
    for bit (the recomputation replays dropout's random draws, fast dropout's too), with less
    kept for the backward pass. BERT: transformers' own checkpointing; MPNet has none in
    transformers 5, so the kit checkpoints each of its blocks (encoder.layer)."""
    from tiny_encoders import build_tiny

    from simcse_kit.model.checkpointing import is_checkpointed, transformer_blocks
    from simcse_kit.training.wiring.run import build_model

    folder = tiny_model_dir if arch == "bert" else build_tiny(arch, tmp_path / arch)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dataset = load_train_dataset(str(write_train_data(tmp_path, "unsup")), "unsup")
    batch = ContrastiveCollator(tokenizer, "unsup", 16)([dataset[i] for i in range(8)])
    runs = []
    for checkpointing in (False, True):
        cfg = RunConfig(
            model=ModelConfig(name_or_path=str(folder), pooler="cls", dropout=0.1, packing=packing),
            data=DataConfig(train_file=str(tmp_path / "train.txt")),
            train=TrainConfig(gradient_checkpointing=checkpointing, fast_dropout=fast_dropout, seed=3),
        )
        model = build_model(cfg).train()
        encoder = base_encoder(model.encoder)
        assert is_checkpointed(encoder) is checkpointing
        assert transformer_blocks(encoder) is encoder.encoder.layer
        torch.manual_seed(11)
        loss, kept = saved_bytes(model, batch)
        loss.backward()
        runs.append((loss, kept, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, kept_a, a), (loss_b, kept_b, b) = runs
    assert torch.equal(loss_a, loss_b)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert kept_b < 0.6 * kept_a, (kept_a, kept_b)


def test_block_checkpointing_survives_a_copy_and_stays_out_of_evaluation(tmp_path: Path) -> None:
    """A deep copy of a block-checkpointed MPNet (the fp32 copy a bf16 run saves from) runs its own
    weights; a block's hooks run again for the recompute (FSDP unshards in a pre-forward hook); in
    eval mode or under no_grad nothing is checkpointed; the saved weights' names are the model's
    own; a model with no stack of blocks is refused."""
    import copy

    from tiny_encoders import build_tiny
    from transformers import AutoModel

    from simcse_kit.model.checkpointing import enable_gradient_checkpointing

    encoder = AutoModel.from_pretrained(build_tiny("mpnet", tmp_path / "mpnet"))
    names = list(encoder.state_dict())
    assert enable_gradient_checkpointing(encoder) == "blocks"
    twin = copy.deepcopy(encoder)
    with torch.no_grad():
        twin.encoder.layer[0].output.dense.weight.mul_(2.0)
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    ours, theirs = (m.eval()(input_ids=ids).last_hidden_state for m in (encoder, twin))
    assert not torch.allclose(ours, theirs)  # the copy's blocks run the copy's weights
    assert list(encoder.state_dict()) == names
    hooked = []
    encoder.encoder.layer[1].register_forward_pre_hook(lambda *_: hooked.append(1))
    encoder.train()(input_ids=ids).last_hidden_state.sum().backward()
    assert len(hooked) == 2  # the forward, then the recompute in the backward pass
    calls = []
    hook = torch.utils.checkpoint.checkpoint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("simcse_kit.model.checkpointing.checkpoint", lambda *a, **k: calls.append(1) or hook(*a, **k))
        encoder.eval()(input_ids=ids)
        with torch.no_grad():
            encoder.train()(input_ids=ids)
        assert calls == []
        encoder.train()(input_ids=ids)
        assert len(calls) == len(encoder.encoder.layer)
    with pytest.raises(ValueError, match="no gradient checkpointing and no stack of blocks"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_funnel_checkpoints_every_layer_call_and_blocks_never_called_are_refused() -> None:
    """Issue 48: Funnel keeps its layers in a list of lists; the outer list was taken for the
    blocks, its lists are never called, and the log said "(blocks)" with 0 checkpointed calls
    per forward. Now each of its 1 + 2 encoder layers and 1 decoder layer runs checkpointed, with
    the plain model's gradients; a model whose only stack the forward never calls is refused."""
    from transformers import FunnelConfig, FunnelModel

    from simcse_kit.model.checkpointing import enable_gradient_checkpointing

    torch.manual_seed(0)
    config = FunnelConfig(vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=37, block_sizes=[1, 2], num_decoder_layers=1)
    plain = FunnelModel(config)
    checkpointed = FunnelModel(config)
    checkpointed.load_state_dict(plain.state_dict())
    assert enable_gradient_checkpointing(checkpointed) == "blocks"
    ids = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 3]])
    calls = []
    hook = torch.utils.checkpoint.checkpoint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("simcse_kit.model.checkpointing.checkpoint", lambda *a, **k: calls.append(1) or hook(*a, **k))
        grads = []
        for model in (plain, checkpointed):
            torch.manual_seed(5)  # the same dropout draws: the recompute replays them
            model.train()(input_ids=ids).last_hidden_state.square().sum().backward()
            grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert len(calls) == 4  # 1 + 2 encoder layers and 1 decoder layer, each call checkpointed
    assert grads[0].keys() == grads[1].keys() and all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])

    class Idle(torch.nn.Module):
        """A stack iterated by nobody: the forward uses another layer."""

        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
            self.embed = torch.nn.Embedding(10, 4)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.embed(input_ids)

    with pytest.raises(ValueError, match=r"Idle's 3 Linear blocks are not called in its forward"):
        enable_gradient_checkpointing(Idle())


def test_cli_trains_a_packed_decoder_and_resumes(decoder_dirs: dict[str, Path], senteval: Path, tmp_path: Path) -> None:
    """``simcse-kit train`` with ``model.packing: true`` on Qwen3 (left-padding tokenizer):
    the collator plans packed rows and the model packs them; without dropout the run ends with
    the padded run's weights and dev scores, and a resume from step 4 ends bit-identical to the uninterrupted run."""
    import yaml

    from simcse_kit.cli import main
    from simcse_kit.training.wiring.inputs import load_training_sets
    from simcse_kit.training.wiring.loaders import make_loader
    from simcse_kit.training.wiring.run import build_model

    cfg = run_config(decoder_dirs["qwen3"], tmp_path / "packed", senteval, "unsup", 0, packing_data := tmp_path)
    recipe = {
        # No dropout: its random draws depend on the batch's shape, packed or padded.
        "model": {k: getattr(cfg.model, k) for k in ("name_or_path", "pooler", "max_seq_len", "eval_max_seq_len")}
        | {"dropout": 0.0},
        "data": {"mode": "unsup", "train_file": cfg.data.train_file, "eval_data_dir": str(senteval)},
        "loss": {"temperature": 0.05},
        "train": {k: getattr(cfg.train, k) for k in ("batch_size", "learning_rate", "eval_steps", "save_steps", "seed")}
        | {"max_steps": 8, "progress_bar": False, "mixed_precision": "no"},
    }
    path = packing_data / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    packed_cfg = replace(cfg, model=replace(cfg.model, packing=True))
    assert build_model(packed_cfg).packing
    tokenizer = load_checked_tokenizer(decoder_dirs["qwen3"])
    batch = next(iter(make_loader(packed_cfg, load_training_sets(packed_cfg), tokenizer, 1, decoder=True)))
    assert tokenizer.padding_side == "left" and 0 < batch["pack_position_ids"].shape[0] < batch["input_ids"].shape[0]

    for name, packing in (("packed", "true"), ("padded", "false")):
        assert main(["train", str(path), "--output-dir", str(tmp_path / name), "--model.packing", packing]) == 0
    evals = [json.loads((tmp_path / name / "metrics.json").read_text())["evals"] for name in ("packed", "padded")]
    assert [e["step"] for e in evals[0]] == [e["step"] for e in evals[1]] and len(evals[0]) >= 2
    for packed_eval, padded_eval in zip(*evals, strict=True):
        assert packed_eval["stsb_dev"] == pytest.approx(padded_eval["stsb_dev"], abs=1e-4)
    last = sorted((tmp_path / "packed" / "checkpoints").glob("step-*"))[-1].name
    weights = [load_file(str(tmp_path / name / "checkpoints" / last / "model.safetensors")) for name in ("packed", "padded")]
    for key, value in weights[0].items():
        torch.testing.assert_close(value, weights[1][key], atol=1e-4, rtol=1e-3, msg=key)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "packed", cut)
    for later in (cut / "checkpoints").glob("step-*"):
        if int(later.name.split("-")[1]) > 4:
            shutil.rmtree(later)
    (cut / "metrics.json").unlink()
    assert main(["train", str(path), "--output-dir", str(cut), "--model.packing", "true", "--resume"]) == 0
    a = load_file(str(tmp_path / "packed" / "checkpoints" / last / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / last / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_with_bf16_weights_trains_fp32_masters(decoder_dirs: dict[str, Path]) -> None:
    """LoRA with bf16 weights: the whole frozen base (its embedding table too) is stored in
    bf16, half its fp32 bytes; the adapter's step is fp32 AdamW's on fp32 masters, computed
    here by hand from the bf16 model's gradient, and the bf16 adapter the forward reads is
    the masters rounded. The step (lr 1e-5) is below bf16's resolution for most weights: a
    bf16 adapter updated in place would have kept them."""
    from simcse_kit.model.fastpath.bf16 import bf16_training
    from simcse_kit.training.engine.loop import param_groups

    path = decoder_dirs["qwen3"]
    tokenizer = load_checked_tokenizer(path)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    model = SimCSEModel.from_config(ModelConfig(name_or_path=str(path), pooler="last", dropout=0.0, lora_r=4)).train()
    adapter = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    with torch.no_grad():  # peft starts B at zero (no gradient for A): a random B exercises both
        for name, p in adapter.items():
            if "lora_B" in name:
                p.normal_(std=0.05)
    start = {n: p.detach().clone() for n, p in adapter.items()}
    frozen_fp32_bytes = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    lr, wd, (beta1, beta2), eps = 1e-5, 0.01, (0.9, 0.999), 1e-8
    opt = bf16_training(model, param_groups(model, wd), lr=lr)

    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in frozen) and sum(p.numel() * 2 for p in frozen) * 2 == frozen_fp32_bytes
    assert all(p.dtype == torch.bfloat16 for p in adapter.values())
    masters = dict(zip(adapter, opt.masters, strict=True))  # param_groups keeps the model's order within a group
    assert all(torch.equal(masters[n], start[n]) and masters[n].dtype == torch.float32 for n in adapter)

    out = model(**batch)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = {n: p.grad.float() for n, p in adapter.items()}
    assert all(g.abs().sum() > 0 for g in grads.values())
    opt.step()
    decays = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, g in grads.items():
        # AdamW's first step, by hand: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected.
        decay = wd if id(masters[name]) in decays else 0.0
        m_hat = (1 - beta1) * g / (1 - beta1)
        v_hat = (1 - beta2) * g * g / (1 - beta2)
        want = start[name] * (1 - lr * decay) - lr * m_hat / (v_hat.sqrt() + eps)
        torch.testing.assert_close(masters[name], want, atol=1e-9, rtol=1e-6, msg=name)
        assert torch.equal(adapter[name].detach(), masters[name].to(torch.bfloat16)), name
    moved = torch.cat([(masters[n] != start[n]).flatten() for n in adapter]).float().mean()
    rounded_moved = torch.cat([(adapter[n].detach() != start[n].to(torch.bfloat16)).flatten() for n in adapter])
    assert moved > 0.99 and rounded_moved.float().mean() < 0.5  # the masters hold what bf16 loses


@pytest.mark.parametrize("arch", ["bert", "mpnet"])  # mpnet: targets from the kit's table (peft has none of its own)
def test_the_sentence_transformers_peer_trains_the_same_adapter(arch: str, tmp_path: Path) -> None:
    """benchmarks/st_peers.py's ``add_adapter`` gets the kit's own ``LoraConfig``: the same modules train,
    as many parameters: query and value of 2 layers, each r x 32 + 32 x r = 256 at r 4, 1,024 in all."""
    from sentence_transformers import SentenceTransformer
    from tiny_encoders import build_tiny

    from benchmarks.st_peers import add_lora

    path = build_tiny(arch, tmp_path / arch)
    cfg = ModelConfig(name_or_path=str(path), pooler="avg", lora_r=4, lora_alpha=8, lora_dropout=0.2)
    kit = SimCSEModel.from_config(cfg)
    peer = SentenceTransformer(str(path), device="cpu")
    add_lora(peer, cfg)

    def trainable(model: torch.nn.Module) -> dict[str, int]:  # from "layer.<i>." on: the prefixes differ
        return {n[n.index("layer.") :]: p.numel() for n, p in model.named_parameters() if p.requires_grad}

    assert trainable(kit) == trainable(peer)
    assert sum(trainable(peer).values()) == 1024 and len(trainable(peer)) == 8
    # dropout and alpha / r reach the peer's adapter too
    adapted = [m for m in peer.modules() if hasattr(m, "lora_A")]
    assert {(m.lora_dropout["default"].p, m.scaling["default"]) for m in adapted} == {(0.2, 2.0)} and len(adapted) == 4
    # st_peers keeps the best dev checkpoint as a state dict and scores it on a fresh model given the
    # same adapter: it loads strictly and encodes as the trained one (not as the base)
    with torch.no_grad():
        for m in adapted:
            m.lora_B["default"].weight.normal_()
    best = SentenceTransformer(str(path), device="cpu")
    add_lora(best, cfg)
    best.load_state_dict(peer.state_dict())
    trained, restored = (model.encode(TEXTS, convert_to_tensor=True) for model in (peer, best))
    base = SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert torch.equal(trained, restored) and not torch.allclose(trained, base, atol=1e-3)
