"""Files and the user's trust (issue 48): a real full disk, the trust switch of every
command that loads a model, ``--overwrite`` onto an export from before the file record,
and one writer for a run folder.

The full disk is a real one: a tmpfs of a few hundred KiB mounted for the test (as root,
which CI and the development machines run as), filled by the command itself, so the
errors are the ones the kernel, safetensors, torch and onnx really raise, not a mocked
message.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import TinyRun
from transformers import AutoTokenizer, BertModel

from simcse_kit.cli import main as cli_main
from simcse_kit.errors import StorageError
from simcse_kit.files import save_figure
from simcse_kit.model.modeling import SimCSEModel


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str, rc: int = 2) -> str:
    """Run the CLI in-process; it must exit ``rc`` with one error line holding ``needles``
    and no traceback."""
    code = cli_main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == rc, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def simcse_folder(folder: Path, tiny_model_dir: Path) -> Path:
    """A saved simcse-kit model (tiny BERT, cls pooler) with its tokenizer."""
    model = SimCSEModel(BertModel.from_pretrained(tiny_model_dir), "cls", "none", 32)
    model.save(folder, AutoTokenizer.from_pretrained(tiny_model_dir), {"step": 0, "stsb_dev": 0.0})
    return folder


# --------------------------------------------------------------------------- a real full disk


@contextlib.contextmanager
def small_disk(where: Path, kib: int) -> Iterator[Path]:
    """A tmpfs of ``kib`` KiB mounted at ``where`` for the block; skipped where mounting is
    not permitted (not root, or a container without CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kib}k", f"simcse-test-{uuid.uuid4().hex[:8]}", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free (tmpfs counts whole pages)."""
    # A failed export's reloaded sentence-transformers model is a reference cycle (its
    # model card points back at it) that maps the deleted temp model.safetensors until the
    # collector runs: collect first, or the space it frees later lets the next write fit.
    gc.collect()
    free = shutil.disk_usage(disk).free
    if free > leave:
        (disk / "filler").write_bytes(b"\0" * (free - leave))


def pages(path: Path) -> int:
    """The bytes a file takes on a tmpfs: whole 4 KiB pages."""
    return -(-path.stat().st_size // 4096) * 4096


def hidden_or_partial(folder: Path) -> list[str]:
    """Names under ``folder`` that a failed write leaves: hidden temp files and folders."""
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".") and p.name != ".lock")


def test_a_real_full_disk_is_one_line_naming_the_users_path(
    tmp_path: Path, tiny_run: TinyRun, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train saving its best model, export and export --onnx on a tmpfs they fill: exit 1
    (:class:`~simcse_kit.errors.StorageError`), one line naming the destination the user
    gave (not the hidden temp folder it was built in), nothing left there half-written.
    Before: train and export ended in safetensors' ``SafetensorError ... (os error 28)``
    traceback (the handler matched only ``Os { code: 28``)."""
    model = simcse_folder(tmp_path / "model", tiny_model_dir)
    with small_disk(tmp_path / "disk", 1024) as disk:
        # export: model.safetensors (~80 KiB) does not fit in what is left.
        fill(disk, 40 * 1024)
        out = disk / "st"
        fails(["export", str(model), str(out)], capsys, f"{out}: no space left on device", rc=1)
        assert not out.exists() and hidden_or_partial(disk) == []

        # export --onnx: the sentence-transformers folder fits, the ONNX graph does not.
        (disk / "filler").unlink()
        assert cli_main(["export", str(model), str(disk / "probe"), "--onnx"]) == 0
        files = [p for p in (disk / "probe").rglob("*") if p.is_file()]
        onnx_bytes = sum(pages(p) for p in files if "onnx" in p.parts)
        st_bytes = sum(pages(p) for p in files if "onnx" not in p.parts) + 64 * 1024  # and the writes' temp files
        assert onnx_bytes > 64 * 1024, onnx_bytes  # so the graph is what does not fit
        shutil.rmtree(disk / "probe")
        fill(disk, st_bytes)
        out = disk / "onnx"
        fails(["export", str(model), str(out), "--onnx"], capsys, f"{out}: no space left on device", rc=1)
        assert not out.exists() and hidden_or_partial(disk) == []
        (disk / "filler").unlink()

        # train: the run folder's records fit, the best model does not.
        recipe = tiny_run.recipe("run", output_dir=str(disk / "run"), save_steps=0, eval_steps=0, num_epochs=1)
        fill(disk, 40 * 1024)
        out = disk / "run" / "best_model"
        fails(["train", str(recipe)], capsys, f"{out}: no space left on device", rc=1)
        assert not out.exists() and hidden_or_partial(disk) == []
        (disk / "filler").unlink()

        # train: a checkpoint (model, optimizer, RNG states) that does not fit.
        recipe = tiny_run.recipe("ckpt", output_dir=str(disk / "ckpt"), save_steps=1, eval_steps=0, eval_at_start=False)
        fill(disk, 40 * 1024)
        fails(["train", str(recipe)], capsys, f"{disk / 'ckpt' / 'checkpoints' / 'step-1'}: no space left on device", rc=1)
        assert hidden_or_partial(disk) == [] and not list((disk / "ckpt" / "checkpoints").iterdir())


def test_a_figure_on_a_full_disk_is_one_line_naming_it(tmp_path: Path) -> None:
    """save_figure (the run folder's plots, the demos') on a full tmpfs: a one-line
    StorageError naming the figure, and no hidden temp file left. Before: Pillow's bare
    ``OSError: [Errno 28]`` from inside its PNG encoder ended a finished run in a traceback."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with small_disk(tmp_path / "disk", 256) as disk:
        fill(disk, 4096)
        fig, ax = plt.subplots(figsize=(7, 6))
        ax.imshow(torch.rand(200, 200).numpy())  # noise: a PNG far over one page
        path = disk / "run" / "training_curves.png"
        with pytest.raises(StorageError) as raised:
            save_figure(fig, path)
        assert str(raised.value) == f"{path}: no space left on device; nothing half-written was left there"
        assert not path.exists() and hidden_or_partial(disk) == []


def test_the_run_lock_on_a_full_disk_is_one_line_and_leaves_no_empty_lock(
    tmp_path: Path, tiny_run: TinyRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 0 bytes free the lock file can be created (an inode) but not written: exit 1,
    one line naming the run folder, and neither an empty ``.lock`` nor the folder left.
    Before: ``OSError [Errno 28]`` traceback from ``os.pwrite`` and an empty ``.lock``."""
    with small_disk(tmp_path / "disk", 256) as disk:
        recipe = tiny_run.recipe("run", output_dir=str(disk / "run"))
        fill(disk, 0)
        with contextlib.suppress(OSError):  # the last partial page
            (disk / "filler2").write_bytes(b"\0" * 4096)
        assert shutil.disk_usage(disk).free == 0
        fails(["train", str(recipe)], capsys, f"{disk / 'run'}: no space left on device", rc=1)
        assert not (disk / "run").exists()
        # A run folder that was there keeps everything but the lock it could not write.
        (disk / "run").mkdir()
        (disk / "run" / "notes.txt").touch()
        fails(["train", str(recipe)], capsys, f"{disk / 'run'}: no space left on device", rc=1)
        assert sorted(os.listdir(disk / "run")) == ["notes.txt"]


def test_the_disk_full_handler_reads_what_safetensors_writes(tmp_path: Path) -> None:
    """Known answer: safetensors 0.8's ``(os error 28)`` and older ``Os { code: 28`` both read
    as a full disk; another error number that is not the disk's stays None."""
    from safetensors import SafetensorError

    from simcse_kit.files import storage_error

    new = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    old = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })')
    for exc in (new, old):
        error = storage_error(exc, tmp_path / "out")
        assert error is not None and str(error).startswith(f"{tmp_path / 'out'}: no space left on device")
    assert storage_error(SafetensorError("I/O error: No such file or directory (os error 2)"), tmp_path) is None


# --------------------------------------------------------------------------- the trust switch

MYSTERY_CONFIG = """from transformers import BertConfig

open({ran!r}, "a").write("ran\\n")  # the folder's own code: the test sees whether it ran


class MysteryConfig(BertConfig):
    model_type = "mystery-bert"
"""
MYSTERY_MODEL = """from transformers import BertModel

from .configuration_mystery import MysteryConfig


class MysteryModel(BertModel):
    config_class = MysteryConfig
"""


def needs_its_code(folder: Path, ran: Path) -> Path:
    """Make ``folder``'s BERT a model_type transformers does not know, whose classes (the
    same BERT) are the folder's own Python files; they append to ``ran`` when run."""
    config = json.loads((folder / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_mystery.MysteryConfig", "AutoModel": "modeling_mystery.MysteryModel"}
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "mystery-bert", "auto_map": auto_map}))
    (folder / "configuration_mystery.py").write_text(MYSTERY_CONFIG.format(ran=str(ran)))
    (folder / "modeling_mystery.py").write_text(MYSTERY_MODEL)
    return folder


def test_every_command_that_loads_a_model_has_a_trust_switch_off_by_default(
    tmp_path: Path, tiny_run: TinyRun, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--trust-remote-code`` a folder that needs its own code is one line naming
    the switch, and its code never runs; with it, the model loads and gives the numbers the
    same BERT gives without custom code (known answer: the plain folder's STS table).
    Before: evaluate, transfer, align-uniform, mine, score and export had no switch."""
    ran = tmp_path / "RAN"
    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    custom = needs_its_code(shutil.copytree(tiny_model_dir, tmp_path / "custom"), ran)
    simcse = needs_its_code(simcse_folder(tmp_path / "simcse", tiny_model_dir), ran)
    senteval = tiny_run.folder / "senteval"
    tiny_run.recipe("run")  # writes the tiny SentEval
    (senteval / "MR").mkdir()
    for polarity, text in (("pos", "a fine film"), ("neg", "a dull film")):
        (senteval / "MR" / f"rt-polarity.{polarity}").write_text(f"{text}\n" * 10, encoding="latin-1")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("sent0,sent1\na man plays,a man plays guitar\na dog runs,the dog is running\nit rains,rain falls\n")
    scored = tmp_path / "hardneg.csv"
    scored.write_text("sent0,sent1,hard_neg\na man plays,a man plays guitar,it rains\na dog runs,the dog runs,a cat\n")
    commands = {
        "evaluate": ["evaluate", str(custom), "--data-dir", str(senteval), "--pooler", "cls", "--tasks", "STSBenchmark"],
        "transfer": ["transfer", str(custom), "--data-dir", str(senteval), "--pooler", "cls", "--tasks", "MR"],
        "align-uniform": ["align-uniform", str(custom), "--data-dir", str(senteval), "--pooler", "cls"],
        "mine": ["mine", str(pairs), str(tmp_path / "mined.csv"), "--model", str(custom), "--pooler", "cls"],
        "score": ["score", str(scored), str(tmp_path / "scored.csv"), "--model", str(custom), "--pooler", "cls"],
        "score --cross-encoder": ["score", str(scored), str(tmp_path / "scored.csv"), "--cross-encoder", str(custom)],
        "export": ["export", str(simcse), str(tmp_path / "st")],
    }
    for argv in commands.values():
        fails(argv, capsys, "config.json: model_type 'mystery-bert' is not a transformers model", "--trust-remote-code")
    assert not ran.exists()  # refused before any of the folder's code ran
    assert not (tmp_path / "st").exists()

    want = tmp_path / "want.json"
    assert cli_main([*commands["evaluate"][:1], str(plain), *commands["evaluate"][2:], "--json", str(want)]) == 0
    got = tmp_path / "got.json"
    assert cli_main([*commands["evaluate"], "--json", str(got), "--trust-remote-code"]) == 0
    assert ran.exists()  # trusted: the folder's classes built the model
    assert json.loads(got.read_text()) == pytest.approx(json.loads(want.read_text()), abs=1e-9)
    assert cli_main([*commands["mine"], "--trust-remote-code"]) == 0
    assert cli_main([*commands["export"], "--trust-remote-code"]) == 0  # its parity check passed
    exported = json.loads((tmp_path / "st" / "config.json").read_text())
    assert exported["model_type"] == "mystery-bert" and (tmp_path / "st" / "modeling_mystery.py").is_file()


# --------------------------------------------------------------------------- --overwrite onto an older export


def test_overwrite_onto_an_export_from_before_the_file_record_keeps_foreign_files(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export whose simcse_export.json has no ``files`` list (written before the record)
    is replaced only while it holds nothing but what exports write (an ONNX export's files,
    the modules.json folders); a file added there is named and kept. Before: such an export
    was replaced whole, the added files with it."""
    model = simcse_folder(tmp_path / "model", tiny_model_dir)
    out = tmp_path / "st"
    assert cli_main(["export", str(model), str(out), "--onnx"]) == 0

    def as_before_the_record() -> None:
        info = json.loads((out / "simcse_export.json").read_text())
        info.pop("files")
        (out / "simcse_export.json").write_text(json.dumps(info))

    as_before_the_record()
    assert cli_main(["export", str(model), str(out), "--overwrite"]) == 0  # nothing foreign, ONNX files included: replaced
    assert "files" in json.loads((out / "simcse_export.json").read_text()) and not (out / "onnx").exists()
    as_before_the_record()
    for foreign in ("notes.txt", "1_Pooling/extra.json", "onnx/model_O4.onnx", "2_Dense/config.json"):
        (out / foreign).parent.mkdir(exist_ok=True)
        (out / foreign).write_text("mine\n")
        fails(["export", str(model), str(out), "--overwrite"], capsys, f"{out}: --overwrite would delete {foreign}")
        assert (out / foreign).read_text() == "mine\n"
        (out / foreign).unlink()


# --------------------------------------------------------------------------- one writer for a run folder


class FakeAccelerator:
    """What :func:`prepare_run_dir_once` reads of an Accelerator: one rank of several."""

    def __init__(self, main: bool) -> None:
        self.num_processes, self.is_main_process = 2, main


def test_only_the_main_process_prepares_the_run_folder(
    tiny_run: TinyRun, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank that is not the main one touches nothing in the run folder (no lock, no
    config.yaml, no removal of the old checkpoints): it returns the folder the main process
    prepared, or raises the main process's error, received from it. The main process sends
    its outcome: None, or its one-line error. Before: every rank ran prepare_run_dir."""
    from contextlib import ExitStack

    from simcse_kit.errors import ConfigError
    from simcse_kit.training.wiring import folder

    sent: list[list[object]] = []

    def broadcast(objects: list[object]) -> list[object]:
        sent.append(list(objects))
        return objects

    monkeypatch.setattr(folder, "broadcast_object_list", broadcast)
    cfg = tiny_run.config("run")
    out = Path(cfg.train.output_dir)
    (out / "checkpoints" / "step-2").mkdir(parents=True)
    (out / "config.yaml").write_text("old: run\n")
    with ExitStack() as held:  # another rank, --overwrite: its main process clears the folder, not it
        assert folder.prepare_run_dir_once(FakeAccelerator(False), cfg, overwrite=True, held=held) == out  # type: ignore[arg-type]
    assert sorted(os.listdir(out)) == ["checkpoints", "config.yaml"] and (out / "config.yaml").read_text() == "old: run\n"
    assert sent == [[None]]

    def main_failed(objects: list[object]) -> list[object]:
        objects[0] = ConfigError(f"{out} holds an unfinished run")
        return objects

    monkeypatch.setattr(folder, "broadcast_object_list", main_failed)
    with pytest.raises(ConfigError, match="holds an unfinished run"), ExitStack() as held:
        folder.prepare_run_dir_once(FakeAccelerator(False), cfg, held=held)  # type: ignore[arg-type]

    monkeypatch.setattr(folder, "broadcast_object_list", broadcast)
    sent.clear()
    (out / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a finished run") as raised, ExitStack() as held:
        folder.prepare_run_dir_once(FakeAccelerator(True), cfg, held=held)  # type: ignore[arg-type]
    assert sent == [[raised.value]]  # the main process told the others before raising
    with ExitStack() as held:
        assert folder.prepare_run_dir_once(FakeAccelerator(True), cfg, overwrite=True, held=held) == out  # type: ignore[arg-type]
    assert not (out / "checkpoints").exists() and sent[-1] == [None]
