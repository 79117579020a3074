"""Several nodes: ``torchrun --nnodes 2 --nproc-per-node 1`` twice on this host, as two
machines would run it (static rendezvous: ``--node-rank``, ``--master-addr``,
``--master-port``), each "node" with its own data cache folder (``--cache-dir``), the run
folder shared.

Two nodes of one process train exactly as one node of two processes (the same loss at
every step and the same final weights, fp32, 1e-6), each node builds its own cache, and
across the nodes every example is seen once an epoch. A node killed mid-run (its torchrun
agent and its worker, SIGKILL) ends the survivor within seconds with the kit's one line
naming the lost rank and node and the ``--resume`` command; that command on both nodes
finishes bit for bit as the uninterrupted run. ``accelerate launch --num_machines 2
--machine_rank 0|1`` trains as the torchrun launch does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TinyRun, write_train_data
from safetensors.torch import load_file

from simcse_kit.cli import resume_command
from simcse_kit.errors import PeerLost
from simcse_kit.training.engine.peers import Peer, Peers

ENV_EXTRA = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
TOL = 1e-6
EXAMPLES, BATCH, EPOCHS = 32, 8, 3  # 4 steps an epoch, 12 in all; a checkpoint every 2
STEPS = EXAMPLES // BATCH * EPOCHS
LAUNCH_TIMEOUT_S = 240  # a tiny run takes ~15 s alone; generous for a loaded 2-core machine
SURVIVOR_BOUND_S = 30  # gloo fails the survivor's next collective at once on the closed socket

# The torchrun worker in place of ``-m simcse_kit.cli``: the CLI itself, with the loader's
# collate wrapped to record (one JSON line a batch, per rank) the examples each rank gets,
# and, with KILL_NODE_AT_BATCH, the whole "node" SIGKILLed (its torchrun agent, then this
# worker) when this rank collates that batch: a node lost mid-run, at a known point.
WORKER = """
import json, os, signal, sys, time
from pathlib import Path
from simcse_kit.cli import main
from simcse_kit.training.wiring import run as run_module

rank = os.environ["RANK"]
record = Path(os.environ["RECORD_DIR"], f"rank{rank}.jsonl")
kill_at = int(os.environ.get(f"KILL_NODE_AT_BATCH_RANK{rank}", "0"))
build_run, batches = run_module.build_run, 0


def recorded(collate):
    def collate_and_record(features):
        global batches
        batches += 1
        if batches == kill_at:
            Path(os.environ["RECORD_DIR"], "killed_at").write_text(repr(time.time()))
            os.kill(os.getppid(), signal.SIGKILL)  # the node's torchrun agent
            os.kill(os.getpid(), signal.SIGKILL)
        with record.open("a") as fh:
            fh.write(json.dumps([f["sent0"] for f in features]) + "\\n")
        return collate(features)

    return collate_and_record


run_module.build_run = lambda cfg, **kwargs: build_run(cfg, **kwargs, wrap_collate=recorded)
raise SystemExit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def options(runs: TinyRun, name: str) -> dict[str, object]:
    """The run's config keys: unsup, dropout on (the ranks draw their own masks), fp32."""
    data = runs.folder / "data"
    data.mkdir(exist_ok=True)
    return {
        "train_file": write_train_data(data, "unsup", n=EXAMPLES),
        "output_dir": runs.folder / name,
        "pooler": "avg",
        "batch_size": BATCH,
        "learning_rate": 1e-3,
        "num_epochs": EPOCHS,
        "warmup_ratio": 0.1,
        "eval_steps": 0,  # only at the end: best_model holds the final weights
        "eval_at_start": "false",
        "save_steps": 2,
        "final_eval": "false",
        "log_steps": 1,
        "mixed_precision": "no",
        "progress_bar": "false",
    }


def node_commands(runs: TinyRun, name: str, nnodes: int, nproc: int, *extra: str, launcher: str = "torchrun") -> list[list[str]]:
    """Each node's command: ``torchrun`` with static rendezvous on a free local port (or
    ``accelerate launch``'s multi-machine options, which hand the same to torchrun), the
    node's own cache folder ``name-cache-N``."""
    worker = runs.folder / "worker.py"
    worker.write_text(WORKER)
    port = str(free_port())
    train = ["train", str(runs.recipe("recipe")), *[t for k, v in options(runs, name).items() for t in (f"--{k}", str(v))]]

    def launcher_of(node: int) -> list[str]:
        if launcher == "torchrun":
            args = f"torch.distributed.run --nnodes {nnodes} --nproc-per-node {nproc} --node-rank {node}"
            return [sys.executable, "-m", *args.split(), "--master-addr", "127.0.0.1", "--master-port", port]
        # --same_network: static rendezvous, so machine_rank N holds ranks N * nproc.. (as torchrun's --node-rank)
        args = f"accelerate.commands.launch --multi_gpu --num_machines {nnodes} --num_processes {nnodes * nproc}"
        args += f" --machine_rank {node} --main_process_ip 127.0.0.1 --main_process_port {port} --same_network"
        return [sys.executable, "-m", *args.split(), "--mixed_precision", "no", "--dynamo_backend", "no"]

    return [
        [*launcher_of(node), str(worker), *train, "--cache-dir", str(runs.folder / f"{name}-cache-{node}"), *extra]
        for node in range(nnodes)
    ]  # fmt: skip


def start(commands: list[list[str]], record: Path, **env: str) -> list[subprocess.Popen[str]]:
    record.mkdir(parents=True, exist_ok=True)
    env_all = os.environ | ENV_EXTRA | {"RECORD_DIR": str(record)} | env
    return [subprocess.Popen(c, env=env_all, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]


def finish(procs: list[subprocess.Popen[str]], timeout: float = LAUNCH_TIMEOUT_S) -> list[str]:
    """Every launcher's output once all have ended; each that is still running after
    ``timeout`` is killed and the test fails."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def launch(commands: list[list[str]], record: Path) -> list[str]:
    procs = start(commands, record)
    outputs = finish(procs)
    assert all(p.returncode == 0 for p in procs), outputs[0][-4000:] + outputs[-1][-4000:]
    assert "optimiser steps on 2 process(es)" in "".join(outputs), outputs[0][-4000:]
    return outputs


def results(out: Path) -> tuple[list[tuple[int, float]], dict[str, torch.Tensor]]:
    """``(loss per step, final weights)`` of a finished run."""
    losses = [(int(s), float(v)) for s, v in json.loads((out / "metrics.json").read_text())["losses"]]
    weights = load_file(str(out / "best_model" / "model.safetensors"))
    head = out / "best_model" / "simcse_head.safetensors"
    if head.exists():
        weights |= {f"head.{k}": v for k, v in load_file(str(head)).items()}
    return losses, weights


def seen(record: Path, rank: int) -> list[list[str]]:
    return [json.loads(line) for line in (record / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> TinyRun:
    return TinyRun(tmp_path_factory.mktemp("nodes"), tiny_model_dir)


@pytest.fixture(scope="module")
def two_nodes(runs: TinyRun) -> Path:
    """The uninterrupted run on two nodes of one process each (trained once per module)."""
    outputs = launch(node_commands(runs, "nodes", 2, 1), runs.folder / "nodes-record")
    assert all("error" not in o.lower() for o in outputs), outputs[0][-4000:]
    return runs.folder / "nodes"


@pytest.mark.slow  # two torchrun launches of two processes each (~1 min on 2 busy cores)
def test_two_nodes_train_as_one_node_of_two_processes(runs: TinyRun, two_nodes: Path) -> None:
    launch(node_commands(runs, "one-node", 1, 2), runs.folder / "one-node-record")
    got_loss, got_w = results(two_nodes)
    want_loss, want_w = results(runs.folder / "one-node")
    assert [s for s, _ in got_loss] == [s for s, _ in want_loss] == list(range(1, STEPS + 1))
    for (step, loss), (_, ref) in zip(got_loss, want_loss, strict=True):
        assert abs(loss - ref) <= TOL * max(1.0, abs(ref)), f"loss at step {step}: {loss} != {ref}"
    assert got_w.keys() == want_w.keys()
    for key, ref in want_w.items():
        assert torch.allclose(got_w[key], ref, atol=TOL, rtol=0), (key, (got_w[key] - ref).abs().max())
    start_w = load_file(str(runs.model_dir / "model.safetensors"))
    assert start_w.keys() & got_w.keys() and any(not torch.equal(v, got_w[k]) for k, v in start_w.items() if k in got_w)

    # Each node built its own cache (nothing read through the other's folder).
    for node in (0, 1):
        assert list((runs.folder / f"nodes-cache-{node}").rglob("*.arrow")), f"node {node} built no cache"

    # Across the nodes, every example once an epoch; and the ranks got the same batches
    # as the two processes of one node did.
    sentences = write_train_data(runs.folder / "data", "unsup", n=EXAMPLES).read_text().splitlines()
    per_epoch = EXAMPLES // BATCH
    ranks = [seen(runs.folder / "nodes-record", r) for r in (0, 1)]
    assert all(len(r) == STEPS for r in ranks), [len(r) for r in ranks]
    for epoch in range(EPOCHS):
        batches = [b for r in ranks for b in r[epoch * per_epoch : (epoch + 1) * per_epoch]]
        assert all(len(b) == BATCH // 2 for b in batches)
        assert sorted(s for b in batches for s in b) == sorted(sentences), f"epoch {epoch}"
    assert ranks == [seen(runs.folder / "one-node-record", r) for r in (0, 1)]


@pytest.mark.slow  # one 2-node launch (~40 s)
def test_accelerate_launch_on_two_machines_trains_as_torchrun_does(runs: TinyRun, two_nodes: Path) -> None:
    """``accelerate launch --num_machines 2 --machine_rank 0|1``: the same losses, weights and batches."""
    launch(node_commands(runs, "accelerate-nodes", 2, 1, launcher="accelerate"), runs.folder / "accelerate-record")
    got_loss, got_w = results(runs.folder / "accelerate-nodes")
    want_loss, want_w = results(two_nodes)
    assert [s for s, _ in got_loss] == [s for s, _ in want_loss] == list(range(1, STEPS + 1))
    for (step, loss), (_, ref) in zip(got_loss, want_loss, strict=True):
        assert abs(loss - ref) <= TOL * max(1.0, abs(ref)), f"loss at step {step}: {loss} != {ref}"
    assert got_w.keys() == want_w.keys()
    assert all(torch.allclose(got_w[k], ref, atol=TOL, rtol=0) for k, ref in want_w.items())
    for node in (0, 1):
        assert list((runs.folder / f"accelerate-nodes-cache-{node}").rglob("*.arrow")), f"node {node} built no cache"
    for rank in (0, 1):
        assert seen(runs.folder / "accelerate-record", rank) == seen(runs.folder / "nodes-record", rank)


@pytest.mark.slow  # two 2-node launches: killed, resumed
def test_a_killed_node_ends_the_survivor_and_resume_finishes_as_uninterrupted(runs: TinyRun, two_nodes: Path) -> None:
    record = runs.folder / "killed-record"
    commands = node_commands(runs, "killed", 2, 1)
    # Rank 1's 7th batch is collated while step 6 runs (the loader fetches one ahead): the
    # checkpoint of step 4 is whole, step 6's may be half-written.
    procs = start(commands, record, KILL_NODE_AT_BATCH_RANK1="7")
    survivor, _ = finish(procs)
    ended = time.time()
    took = ended - float((record / "killed_at").read_text())
    assert procs[0].returncode != 0 and procs[1].returncode != 0
    assert took < SURVIVOR_BOUND_S, f"the survivor ended {took:.1f} s after node 1 was killed"
    print(f"node 0 ended {took:.1f} s after node 1 was killed")
    out = runs.folder / "killed"
    assert not (out / "metrics.json").exists()
    lines = [line for line in survivor.splitlines() if line.startswith("simcse-kit train: error:")]
    assert len(lines) == 1, survivor[-4000:]
    print(lines[0])
    assert re.search(r"lost rank 1 \(node 1\)", lines[0]), lines[0]
    resume = re.search(r"resume with: (.*)$", lines[0])
    assert resume, lines[0]
    argv = shlex.split(resume.group(1))
    assert argv[: len(commands[0])] == commands[0] and argv[len(commands[0]) :] == ["--resume"], argv

    # The same command with --resume on each node (node 1's own --node-rank), a new port.
    port = str(free_port())
    resumed = [[port if w == c[c.index("--master-port") + 1] else w for w in c] + ["--resume"] for c in commands]
    procs = start(resumed, runs.folder / "resumed-record")
    outputs = finish(procs)
    assert all(p.returncode == 0 for p in procs), outputs[0][-4000:]
    resumed_at = re.search(r"resumed from \S+step-(\d+)", outputs[0])
    assert resumed_at and 2 <= int(resumed_at.group(1)) < STEPS, outputs[0][-4000:]
    print(f"resumed from step {resumed_at.group(1)}")
    got_loss, got_w = results(out)
    want_loss, want_w = results(two_nodes)
    assert got_loss == want_loss
    assert got_w.keys() == want_w.keys() and all(torch.equal(got_w[k], want_w[k]) for k in want_w)


@pytest.mark.slow  # two 2-node launches (~1 min)
def test_a_resume_that_a_node_cannot_read_fails_on_every_node(runs: TinyRun, two_nodes: Path) -> None:
    """Node 1 with a run folder of its own (what a folder not on shared storage is): the
    run trains, but on ``--resume`` node 1's process does not see rank 0's checkpoint, and
    every process ends with the same one line (exit 2), instead of rank 0 resuming while
    rank 1 starts over (or resumes without its RNG file, which Accelerate only logs)."""
    commands = node_commands(runs, "unshared", 2, 1)
    elsewhere = str(runs.folder / "unshared-node1")
    at = commands[1].index("--output_dir") + 1
    commands[1][at] = elsewhere
    procs = start(commands, runs.folder / "unshared-record")
    outputs = finish(procs)
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]
    assert not list(Path(elsewhere, "checkpoints").glob("step-*"))  # only rank 0 keeps checkpoints
    (runs.folder / "unshared" / "metrics.json").unlink()  # as if killed after its last checkpoint
    port = str(free_port())
    resumed = [[port if w == c[c.index("--master-port") + 1] else w for w in c] + ["--resume"] for c in commands]
    procs = start(resumed, runs.folder / "unshared-resumed-record")
    outputs = finish(procs)
    assert [p.returncode for p in procs] != [0, 0]
    for output in outputs:
        lines = [line for line in output.splitlines() if line.startswith("simcse-kit train: error: --resume from")]
        # On one host node 1 sees rank 0's folder by its path, but not its own RNG file there
        # (on two machines: "rank 1 does not see it").
        assert len(lines) == 1 and "rank 1 sees no random_states_1.pkl in it" in lines[0], output[-3000:]
        assert "--output-dir must be the same folder on every node" in lines[0]


# --------------------------------------------------------------------------- the line, the timeout


def peers_of_four() -> Peers:
    """Rank 0 on node 0 (host a), ranks 1 and 2 on node 1 (host b), rank 3 on node 2 (host c)."""
    peers = Peers()
    peers.all = [
        Peer(0, 0, "a", ("10.0.0.1",)),
        Peer(1, 1, "b", ("10.0.0.2",)),
        Peer(2, 1, "b", ("10.0.0.2",)),
        Peer(3, 2, "c", ("10.0.0.3",)),
    ]
    peers.me = peers.all[0]
    return peers


def gloo(message: str) -> RuntimeError:
    return RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] {message}")


def test_the_lost_peer_is_named_as_far_as_the_error_tells() -> None:
    peers = peers_of_four()
    one = peers.lost(gloo("Connection closed by peer [10.0.0.3]:41893"))
    assert str(one) == "rank 0 (node 0) lost rank 3 (node 2, c) at 10.0.0.3: Connection closed by peer [10.0.0.3]:41893"
    # Two ranks behind one address: both named, not a guess.
    two = peers.lost(gloo("Connection reset by peer [10.0.0.2]:5000"))
    assert str(two).startswith("rank 0 (node 0) lost one of ranks 1, 2 (node 1) at 10.0.0.2: Connection reset by peer")
    # A timeout names no address: every other rank is a candidate, and the key to raise.
    late = peers.lost(gloo("Timed out waiting 300000ms for recv operation to complete"))
    assert str(late) == (
        "rank 0 (node 0) heard nothing from one of ranks 1, 2, 3 (nodes 1, 2): "
        "Timed out waiting 300000ms for recv operation to complete (train.collective_timeout_s)"
    )
    # On one host every process is 127.0.0.1: the peers on this host.
    peers.all = [Peer(0, 0, "a", ("10.0.0.1",)), Peer(1, 1, "a", ("10.0.0.1",)), Peer(2, 2, "b", ("10.0.0.2",))]
    local = peers.lost(gloo("Connection closed by peer [127.0.0.1]:41893"))
    assert str(local).startswith("rank 0 (node 0) lost rank 1 (node 1) at 127.0.0.1:")


def test_only_a_failed_collective_becomes_the_line() -> None:
    with pytest.raises(PeerLost, match="lost rank 3"), peers_of_four():
        raise gloo("Connection closed by peer [10.0.0.3]:41893")
    with pytest.raises(RuntimeError, match="CUDA out of memory") as caught, peers_of_four():
        raise RuntimeError("CUDA out of memory")
    assert not isinstance(caught.value, PeerLost)


def test_the_resume_command_is_the_launchers_own() -> None:
    launch = ["/usr/bin/python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "-m",
              "simcse_kit.cli", "train", "r.yaml", "--overwrite", "--output-dir", "runs/a b"]  # fmt: skip
    assert resume_command(["train", "r.yaml"], launch) == (
        "/usr/bin/python -m torch.distributed.run --nnodes 2 --node-rank 1 -m simcse_kit.cli train r.yaml "
        "--output-dir 'runs/a b' --resume"
    )
    assert resume_command(["train", "r.yaml", "--overwrite"]) == "simcse-kit train r.yaml --resume"


SILENT_PEER = """
import json, os, sys, time
import torch.distributed as dist
from simcse_kit.config.sections import LoopConfig
from simcse_kit.errors import PeerLost
from simcse_kit.training.engine.loop import start_processes
from simcse_kit.training.engine.peers import Peers

start_processes(LoopConfig(collective_timeout_s=float(sys.argv[1])), cpu=True)
with Peers() as peers:
    peers.meet()
if os.environ["RANK"] == "1":  # alive, connected, silent
    time.sleep(60)
    os._exit(0)
began = time.monotonic()
try:
    with peers:
        dist.barrier()
except PeerLost as exc:
    print(json.dumps({"seconds": time.monotonic() - began, "line": str(exc)}), flush=True)
os._exit(0)
"""


@pytest.mark.slow  # two fresh interpreters importing torch (~10 s)
def test_a_silent_peer_fails_the_collective_after_collective_timeout_s(tmp_path: Path) -> None:
    """Rank 1 alive but silent: rank 0's barrier fails after ``train.collective_timeout_s``
    (2 s here; torch's gloo default is 30 min), as the kit's line naming rank 1."""
    script = tmp_path / "silent.py"
    script.write_text(SILENT_PEER)
    port = str(free_port())
    env = os.environ | ENV_EXTRA | {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    procs = [
        subprocess.Popen([sys.executable, str(script), "2"], env=env | {"RANK": str(r), "LOCAL_RANK": "0", "GROUP_RANK": str(r)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]  # fmt: skip
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert out.strip(), err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert 1.5 < got["seconds"] < 30, got
    assert got["line"].startswith("rank 0 (node 0) heard nothing from rank 1 (node 1)"), got
    assert got["line"].endswith("(train.collective_timeout_s)"), got


# --------------------------------------------------------------------------- the teacher's cache per node

TEACHER_WORKER = """
import json, os, sys, time
from pathlib import Path
from types import SimpleNamespace
from simcse_kit.config.sections import LoopConfig
from simcse_kit.core.distributed import close_process_group
from simcse_kit.training.wiring.inputs import sentence_table
from simcse_kit.training.engine.loop import start_processes

teacher, cache, record = sys.argv[1], sys.argv[2].replace("NODE", os.environ["GROUP_RANK"]), Path(sys.argv[3])
start_processes(LoopConfig(), cpu=True)
cfg = SimpleNamespace(loss=SimpleNamespace(teacher_cache_dir=cache), train=SimpleNamespace(progress_bar=False))
table, _ = sentence_table(cfg, json.loads((record / "texts.json").read_text()), teacher, "loss.teacher")
(record / f"rank{os.environ['RANK']}.json").write_text(json.dumps([table.cache_hit, table.vectors.tolist()]))
# Leave only when every rank has its table: a rank that closes its connections while another
# is still finishing the last barrier fails that one ("Connection closed by peer").
deadline = time.monotonic() + 120
while len(list(record.glob("rank*.json"))) < 4 and time.monotonic() < deadline:
    time.sleep(0.1)
close_process_group()
"""


@pytest.mark.slow  # two launches of 2 nodes x 2 processes (~40 s)
@pytest.mark.parametrize("caches", ["node-local", "shared"])
def test_the_teachers_vectors_are_encoded_once_a_node_or_once(tmp_path: Path, caches: str) -> None:
    """2 nodes of 2 processes: with a teacher cache folder per node, rank 0 and node 1's
    local main process (rank 2) encode and ranks 1 and 3 read their node's cache; with one
    folder for all, rank 0 alone encodes. Every rank gets the same vectors."""
    from conftest import toy_sentences
    from test_teacher import save_teacher

    teacher = save_teacher(tmp_path / "teacher", hidden=16)
    record = tmp_path / "record"
    record.mkdir()
    (record / "texts.json").write_text(json.dumps(toy_sentences(20)))
    worker = tmp_path / "teacher_worker.py"
    worker.write_text(TEACHER_WORKER)
    cache = str(tmp_path / ("cache-NODE" if caches == "node-local" else "cache"))
    port = str(free_port())
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
         "--master-addr", "127.0.0.1", "--master-port", port, str(worker), str(teacher), cache, str(record)]
        for node in (0, 1)
    ]  # fmt: skip
    procs = start(commands, record)
    outputs = finish(procs)
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]
    got = [json.loads((record / f"rank{r}.json").read_text()) for r in range(4)]
    hits = [hit for hit, _ in got]
    assert hits == ([False, True, False, True] if caches == "node-local" else [False, True, True, True])
    want = torch.tensor(got[0][1])
    for rank, (_, vectors) in enumerate(got):
        assert torch.equal(torch.tensor(vectors), want), (rank, (torch.tensor(vectors) - want).abs().max())
