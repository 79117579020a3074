"""Faults: broken model folders, two writers, divergence, clobbering, settings that would do
nothing, full or read-only disks, corrupt checkpoints, empty mining output, preemption and
misleading messages. Each numbered fault of issue 25 has its test here; the table of what
the user sees is the "Faults" section of docs/bad_inputs.md.

Full and read-only disks are simulated by patching the writer to raise the OSError the
kernel would (the tests run as root, which chmod does not stop).
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from conftest import TinyRun, write_tiny_senteval
from transformers import AutoTokenizer, BertModel

from simcse_kit.cli import main as cli_main
from simcse_kit.errors import ConfigError
from simcse_kit.model.modeling import SimCSEModel

# --------------------------------------------------------------------------- helpers


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str, rc: int = 2) -> str:
    """Run the CLI in-process; it must exit ``rc`` with one error line holding ``needles``
    and no traceback."""
    code = cli_main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == rc, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def simcse_folder(folder: Path, tiny_model_dir: Path) -> Path:
    """A saved simcse-kit model (tiny BERT, cls pooler) with its tokenizer."""
    model = SimCSEModel(BertModel.from_pretrained(tiny_model_dir), "cls", "none", 32)
    model.save(folder, AutoTokenizer.from_pretrained(tiny_model_dir), {"step": 0, "stsb_dev": 0.0})
    return folder


def truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:-keep])


# --------------------------------------------------------------------------- 1. model folders


def test_model_folder_without_tokenizer_or_with_truncated_weights_is_one_clear_error(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    broken = simcse_folder(tmp_path / "no-tokenizer", tiny_model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (broken / name).unlink(missing_ok=True)
    # transformers would build a 5-token vocabulary here and every word would be [UNK].
    fails(["evaluate", str(broken), "--data-dir", str(senteval)], capsys, str(broken), "no tokenizer files")
    fails(["export", str(broken), str(tmp_path / "exported")], capsys, "no tokenizer files")
    assert not (tmp_path / "exported").exists()

    # A truncated model.safetensors: the file is named, in evaluate and export alike.
    cut = simcse_folder(tmp_path / "truncated", tiny_model_dir)
    truncate(cut / "model.safetensors")
    fails(["evaluate", str(cut), "--data-dir", str(senteval)], capsys, str(cut / "model.safetensors"), "truncated")
    fails(["export", str(cut), str(tmp_path / "exported")], capsys, str(cut / "model.safetensors"))

    # A tokenizer of another model: more ids than the embedding table has rows.
    small = simcse_folder(tmp_path / "small-table", tiny_model_dir)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps(config | {"vocab_size": 20}))
    with pytest.raises(ConfigError, match="tokenizer has 53 tokens but the model's embedding table only 20"):
        from simcse_kit.model.checks import load_checked_tokenizer

        load_checked_tokenizer(small)


def test_export_checks_token_ids_against_an_independent_tokenizer_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    from simcse_kit.model.checks import tokenization_problem

    good = AutoTokenizer.from_pretrained(tiny_model_dir)
    probes = ["a man plays the guitar .", "two dogs run in the park"]
    assert tokenization_problem(good, AutoTokenizer.from_pretrained(tiny_model_dir), probes, 32) is None
    # The placeholder transformers builds without tokenizer files: 5 tokens, all words [UNK].
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (bare / name).unlink(missing_ok=True)
    placeholder = AutoTokenizer.from_pretrained(bare)
    assert len(placeholder) == 5
    assert "other ids" in tokenization_problem(good, placeholder, probes, 32)
    assert "lost its vocabulary" in tokenization_problem(placeholder, placeholder, probes, 32)


# --------------------------------------------------------------------------- 2. one writer per run folder


def test_a_second_run_into_a_locked_run_folder_fails_at_once_naming_the_holder(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import time

    from test_resume import ENV, train_cmd

    recipe = tiny_run.recipe("run", save_steps=100)
    out = tiny_run.folder / "run"
    log_path = tiny_run.folder / "a.log"
    with log_path.open("w") as log:  # run A, in its own process
        proc = subprocess.Popen(train_cmd(recipe), env=ENV, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 120
        while not (out / "config.yaml").exists():  # A holds the folder from before it writes anything
            assert proc.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # Run B, a second later, with another seed: it must fail at once and change nothing.
        line = fails(["train", str(recipe), "--seed", "8"], capsys, str(out), "another run is writing")
        assert proc.poll() is None, "run A ended before run B was refused: the test proved nothing"
        assert f"pid {proc.pid} on " in line and "started" in line
        assert proc.wait(timeout=300) == 0, log_path.read_text()[-2000:]
    # Everything in the folder is run A's; the lock went with it.
    assert "seed: 7" in (out / "config.yaml").read_text()
    assert cli_main(["train", str(recipe), "--overwrite", "--max-steps", "1", "--final-eval", "false"]) == 0


# --------------------------------------------------------------------------- 3. divergence and collapse


def test_divergence_stops_at_the_step_keeping_checkpoint_and_best_model(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    from simcse_kit.training.engine.checkpoints import latest_checkpoint

    recipe = tiny_run.recipe("run", save_steps=1, eval_steps=1)
    out = tiny_run.folder / "run"
    line = fails(["train", str(recipe), "--learning-rate", "1e30"], capsys, "training diverged at step", "learning rate")
    step = int(line.split("diverged at step ")[1].split(":")[0])
    assert step >= 2 and "train.learning_rate = 1e+30" in line
    assert not (out / "metrics.json").exists()
    # The steps before the bad one are kept: their checkpoint and the best model (a finite dev score).
    assert latest_checkpoint(out / "checkpoints").name == f"step-{step - 1}"
    SimCSEModel.load(out / "best_model")


def test_metrics_json_is_always_valid_json(tmp_path: Path) -> None:
    from simcse_kit.files import write_json_atomic

    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"best_stsb_dev": float("-inf"), "evals": [{"step": 1.0, "stsb_dev": float("nan")}], "ok": 1.5})

    def no_constants(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    data = json.loads(path.read_text(), parse_constant=no_constants)
    assert data["best_stsb_dev"] is None and data["evals"][0]["stsb_dev"] is None and data["ok"] == 1.5
    assert data["non_finite"]["written_as_null"] == ["best_stsb_dev = -inf", "evals[0].stsb_dev = nan"]


def test_a_collapsed_model_is_warned_about_and_never_selected(caplog: pytest.LogCaptureFixture) -> None:
    import torch
    from torch import nn

    from simcse_kit.config.run import LoopConfig
    from simcse_kit.training.engine.loop import fit, prepare

    class Evaluator:
        primary_metric = "dev"

        def __init__(self) -> None:
            # step 0: a healthy model; steps 1, 2: collapsed (uniformity 0, then a NaN score)
            self.results = iter([(50.0, -2.5), (90.0, -1e-8), (float("nan"), -3.0)])

        def __call__(self, model: nn.Module) -> dict[str, float]:
            dev, uniformity = next(self.results)
            return {"dev": dev, "alignment": 0.0, "uniformity": uniformity}

    def step(model: nn.Module, batch: torch.Tensor, backward: object) -> torch.Tensor:
        loss = model(batch).pow(2).mean()
        backward(loss)
        return loss.detach()

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.randn(4, 3), batch_size=2)
    cfg = LoopConfig(learning_rate=1e-3, eval_steps=1, progress_bar=False)
    with caplog.at_level("WARNING"):
        state = fit(prepare(nn.Linear(3, 2), loader, cfg), step, cfg, evaluator=Evaluator())
    assert (state.best_step, state.best_score) == (0, 50.0)  # not step 1's 90 from a collapsed space
    collapsed = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    assert len(collapsed) == 2 and "uniformity" in collapsed[0] and "nan" in collapsed[1]


# --------------------------------------------------------------------------- 9. preemption and Ctrl-C


@pytest.mark.slow  # four training subprocesses: the reference, SIGTERMed, SIGINTed, the resume to the end
def test_sigterm_and_ctrl_c_checkpoint_and_resume_equals_an_uninterrupted_run(tmp_path: Path, tiny_run: TinyRun) -> None:
    import signal
    import subprocess
    import time

    from test_resume import ENV, run_metrics, train_cmd

    from simcse_kit.training.engine.checkpoints import latest_checkpoint

    STOPPED_STATUS = 75  # the documented status of a run stopped with a checkpoint (docs/bad_inputs.md)
    # --save-steps larger than the run (24 steps): only the stop writes a checkpoint.
    ref_recipe, cut_recipe = tiny_run.recipe("ref", save_steps=100), tiny_run.recipe("cut", save_steps=100)
    ref = subprocess.run(train_cmd(ref_recipe), env=ENV, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]

    def stop_at(argv: list[str], sig: signal.Signals, evaluated_step: int, name: str) -> str:
        """Run ``argv``, send ``sig`` once step ``evaluated_step``'s evaluation is logged."""
        log_path = tmp_path / f"{name}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 240
            while f"step {evaluated_step}: stsb_dev" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()[-2000:]
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(sig)
            assert proc.wait(timeout=120) == STOPPED_STATUS, log_path.read_text()[-2000:]
        return log_path.read_text()

    cut = tiny_run.folder / "cut"
    err = stop_at(train_cmd(cut_recipe), signal.SIGTERM, 3, "term")
    assert "Traceback" not in err and "stopped by SIGTERM after step" in err
    assert f"resume with: simcse-kit train {cut_recipe} --resume" in err
    first = latest_checkpoint(cut / "checkpoints")
    assert first is not None and int(first.name.split("-")[1]) >= 3
    assert not (cut / "metrics.json").exists()

    # Ctrl-C on the resumed run: the same, without a traceback.
    err = stop_at(train_cmd(cut_recipe, "--resume"), signal.SIGINT, 9, "int")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "stopped by SIGINT" in err
    assert int(latest_checkpoint(cut / "checkpoints").name.split("-")[1]) >= 9

    done = subprocess.run(train_cmd(cut_recipe, "--resume"), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run_metrics(cut) == run_metrics(tiny_run.folder / "ref")


def test_a_second_ctrl_c_stops_at_once() -> None:
    import os
    import signal
    import time

    from simcse_kit.training.engine.guards import StopSignals

    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # Python runs the handler between bytecodes
        assert signals.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before


# --------------------------------------------------------------------------- 4. overwrite only what we wrote


def test_overwrite_replaces_only_an_earlier_export_or_run(
    tmp_path: Path, tiny_model_dir: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    source = simcse_folder(tmp_path / "model", tiny_model_dir)
    target = tmp_path / "project"
    (target / "data").mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    (target / "data" / "important.csv").write_text("a,b")
    fails(["export", str(source), str(target), "--overwrite"], capsys, str(target), "notes.txt", "data/", "earlier export")
    assert (target / "notes.txt").read_text() == "mine" and (target / "data" / "important.csv").is_file()
    # An earlier export is replaced.
    assert cli_main(["export", str(source), str(tmp_path / "st")]) == 0
    assert cli_main(["export", str(source), str(tmp_path / "st"), "--overwrite"]) == 0

    # train --overwrite: the same rule for a run folder.
    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=0)
    out = tiny_run.folder / "run"
    out.mkdir()
    (out / "main.py").write_text("print('mine')")
    fails(["train", str(recipe), "--overwrite"], capsys, str(out), "main.py", "run folder")
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == ["main.py"]


def test_overwrite_into_a_new_folder_on_a_process_that_holds_no_lock(tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun's other ranks take no run lock (the main one does, making the folder): one that gets
    # here first finds no folder yet, and --overwrite must not list one (it raised FileNotFoundError).
    from contextlib import ExitStack

    from simcse_kit.training.wiring.folder import prepare_run_dir

    monkeypatch.setenv("RANK", "1")
    cfg = tiny_run.config("fresh")
    out = Path(cfg.train.output_dir)
    assert not out.exists()
    with ExitStack() as held:
        assert prepare_run_dir(cfg, overwrite=True, held=held) == out
    assert (out / "config.yaml").is_file()


# --------------------------------------------------------------------------- 5. every setting does what it says or is refused


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["--max-seq-len", "1"], ["model.max_seq_len", "at least 3", "would not truncate"]),
        (["--eval-max-seq-len", "2"], ["model.eval_max_seq_len", "at least 3"]),
        (["--max-grad-norm", "0"], ["train.max_grad_norm", "> 0, or null"]),
        (["--temperature", "1e-6"], ["loss.temperature", "in [0.001, 10]", "underflows"]),
        (["--temperature", "1e-45"], ["loss.temperature"]),
        (["--eval-steps", "-1"], ["train.eval_steps", ">= 0 (0: evaluate only at the end)"]),
        (["--save-steps", "-3"], ["train.save_steps", ">= 0"]),
        (["--max-steps", "-1"], ["train.max_steps", ">= 0 or null"]),
        (["--output-dir", ""], ["train.output_dir", "current one"]),
        (["--learning-rate", "inf"], ["train.learning_rate", "finite"]),
    ],
)
def test_settings_that_would_do_nothing_are_refused(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], overrides: list[str], needles: list[str]
) -> None:
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), *overrides], capsys, *needles)
    assert not (tiny_run.folder / "run").exists()


def test_duplicate_yaml_keys_name_the_key_and_both_lines(tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tiny_run.recipe("run")
    text = recipe.read_text().replace("train:\n", "train:\n  seed: 1\n", 1)
    recipe.write_text(text)
    lines = text.splitlines()
    first = lines.index("  seed: 1") + 1
    second = next(i for i, ln in enumerate(lines, 1) if ln.strip() == "seed: 7")
    fails(["train", str(recipe)], capsys, str(recipe), "'seed' is given twice", f"lines {first} and {second}")


def test_max_steps_zero_means_no_limit(tiny_run: TinyRun) -> None:
    from simcse_kit.training.engine.loop import total_steps

    cfg = tiny_run.config("run")
    assert total_steps(cfg.train.__class__(max_steps=0), 10) == total_steps(cfg.train.__class__(max_steps=None), 10) == 10
    assert total_steps(cfg.train.__class__(max_steps=3), 10) == 3


# --------------------------------------------------------------------------- 6. full disk and read-only places


def fill_disk_during_save(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """``accelerator.save_state`` writes part of a checkpoint, then the disk is full."""
    from accelerate import Accelerator

    def save_state(self: Accelerator, output_dir: str) -> None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"\0" * 4096)  # the part that fit
        raise error

    monkeypatch.setattr(Accelerator, "save_state", save_state)


@pytest.mark.parametrize("how", ["ENOSPC", "torch zip writer"])
def test_a_full_disk_is_one_line_and_leaves_no_partial_checkpoint(
    tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    import shutil as shutil_module

    if how == "ENOSPC":
        fill_disk_during_save(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    else:  # what torch.save says when the disk fills mid-write
        torch_says = "[enforce fail at inline_container.cc:672] . unexpected pos 23744 vs 23636"
        fill_disk_during_save(monkeypatch, RuntimeError(torch_says))
        usage = shutil_module.disk_usage(tiny_run.folder)
        monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage._replace(free=1024))
    recipe = tiny_run.recipe("run", eval_steps=0)
    checkpoints = tiny_run.folder / "run" / "checkpoints"
    # The checkpoint the user would find, not the hidden temp folder it was built in.
    fails(["train", str(recipe)], capsys, f"{checkpoints / 'step-2'}: no space left on device", rc=1)
    assert sorted(p.name for p in checkpoints.iterdir()) == []  # no partial .step-2.tmp keeps the disk full


def test_read_only_outputs_fail_before_the_long_work(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from simcse_kit.evaluation import api

    read_only = tmp_path / "read-only"
    read_only.mkdir()
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args: object, dir: str | Path | None = None, **kwargs: object) -> tuple[int, str]:  # noqa: A002
        if dir is not None and Path(dir) == read_only:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)

    def no_evaluation(*args: object, **kwargs: object) -> None:
        raise AssertionError("the evaluation ran before the output path was checked")

    monkeypatch.setattr(api, "load_encoder", no_evaluation)
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    model = simcse_folder(tmp_path / "model", tiny_model_dir)
    out = read_only / "results.json"
    fails(["evaluate", str(model), "--data-dir", str(senteval), "--json", str(out)], capsys, f"--json {out}", "read-only", rc=1)
    fails(
        ["evaluate", str(model), "--data-dir", str(senteval), "--mteb-results", str(read_only / "mteb")],
        capsys,
        "--mteb-results",
        "read-only",
        rc=1,
    )
    fails(["export", str(model), str(read_only / "st")], capsys, f"export folder {read_only / 'st'}", "read-only", rc=1)


# --------------------------------------------------------------------------- 8. mine


def test_mine_refuses_a_nan_margin_and_an_empty_output(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\n" + "a man plays,a man plays\n" * 6)
    out = tmp_path / "mined.csv"
    base = ["mine", str(pairs), str(out), "--model", str(tiny_model_dir), "--pooler", "cls"]
    fails([*base, "--margin", "nan"], capsys, "--margin nan", "finite")
    # Identical rows: every candidate is the row's own sentence, so no row gets a negative.
    fails(base, capsys, str(pairs), "no row got a hard negative", "6 row(s), 1 distinct", "nothing written")
    assert not out.exists()


# --------------------------------------------------------------------------- 7. corrupt checkpoints and base models


def test_resume_skips_a_truncated_newest_checkpoint_and_a_corrupt_base_fails_first(
    tmp_path: Path, tiny_model_dir: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=4, save_steps=2)  # 8 steps; checkpoints 4 and 6 kept
    out = tiny_run.folder / "run"
    assert cli_main(["train", str(recipe), "--final-eval", "false"]) == 0
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-4", "step-6"]
    (out / "metrics.json").unlink()  # as if killed after step 6
    truncate(checkpoints / "step-6" / "model.safetensors")
    (checkpoints / ".step-8.tmp").mkdir()  # a failed save's leftover
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli_main(["train", str(recipe), "--final-eval", "false", "--resume"]) == 0
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert f"resuming from {checkpoints / 'step-4'}, the newest intact checkpoint, instead: step-6 is damaged" in logs
    assert str(checkpoints / "step-6" / "model.safetensors") in logs
    assert f"resumed from {checkpoints / 'step-4'} (step 4" in logs
    assert json.loads((out / "metrics.json").read_text())["steps"] == 8
    assert not (checkpoints / ".step-8.tmp").exists()

    # A corrupt base model: one line naming the file, before the run folder exists.
    base = tmp_path / "corrupt-base"
    shutil.copytree(tiny_model_dir, base)
    truncate(base / "model.safetensors")
    recipe = tiny_run.recipe("fresh")
    fails(["train", str(recipe), "--name-or-path", str(base)], capsys, str(base / "model.safetensors"), "truncated")
    assert not (tiny_run.folder / "fresh").exists()


# --------------------------------------------------------------------------- 10. misleading messages


def test_a_pipe_as_training_file_and_an_offline_hub_id_say_so(
    tmp_path: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    fifo = tmp_path / "stream"
    os.mkfifo(fifo)  # as <(zcat corpus.gz) would be: it exists, it is no regular file
    recipe = tiny_run.recipe("run")
    fails(["train", str(recipe), "--train-file", str(fifo)], capsys, str(fifo), "not a regular file")
    assert not (tiny_run.folder / "run").exists()

    # A hub id while offline: that it cannot be looked up, not "pass --pooler".
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    senteval = write_tiny_senteval(tmp_path / "senteval", pairs=4)
    line = fails(["evaluate", "nobody/no-such-model", "--data-dir", str(senteval)], capsys, "nobody/no-such-model", "offline")
    assert "--pooler" not in line


def test_a_run_without_a_usable_evaluation_names_no_missing_folder(
    tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import simcse_kit.training.engine.selection

    # Every evaluation collapsed: no best model is ever saved.
    monkeypatch.setattr(simcse_kit.training.engine.selection, "collapse_reason", lambda metrics, primary: "uniformity 0")
    recipe = tiny_run.recipe("run", num_epochs=1, eval_steps=4, save_steps=0)
    out = tiny_run.folder / "run"
    with caplog.at_level("INFO"):
        assert cli_main(["train", str(recipe)]) == 0  # final_eval on: skipped, not a crash at the end
    assert not (out / "best_model").exists()
    last = [r.getMessage() for r in caplog.records if r.name == "simcse_kit.training.wiring.run"][-1]
    assert "best_model" not in last and "without a best model" in last
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_dev_score"] is None and "best_dev_score = -inf" in metrics["non_finite"]["written_as_null"]
    assert "sts" not in metrics
