"""Corpora of any size: memory and time to the first step against the corpus's length.

A deterministic synthetic corpus (``wiki1m_head.txt``'s lines re-combined in pairs and
numbered) of each ``--lines``; each run a fresh process, cold (empty cache) then warm:

- ``kit``: ``simcse-kit train unsup`` itself (the main job's model, 2 steps, a 100-pair dev
  split so the run ends soon): peak RSS (``wait4``), the seconds from the start of the process
  to its first log line, the data loaded, the training ready and the first optimiser step (its
  TensorBoard event), and the builds' rows per second (the text cache's sidecar, the token
  table's ``table.json``);
- ``st``: sentence-transformers' path: ``datasets.load_dataset("text")``, the ``(text, text)``
  pairs as two columns of it, ``SentenceTransformerTrainer`` with MNRL, 2 steps;
- ``lists`` (up to 1M lines): the old whole-file Python lists, load only.

With ``--checks`` on the largest corpus: a bad row (invalid UTF-8) on its last line but one
under ``data.bad_rows: error`` (into a new folder, then over a finished run with ``--overwrite``)
and ``skip``; and the warm run on 1 and on 2 processes (``torchrun``, 1 thread each), the
per-process peak RSS polled from ``/proc/<pid>/status`` (``VmHWM``).

    python -m benchmarks.corpus_scale --lines 100000 --lines 1000000 --lines 10000000 --checks --work /tmp/corpus

``--warm-only`` (same ``--work``) runs the warm runs again on the caches the last run left,
kept in ``results/corpus_scale_warm-<cpu class>.json``: memory and start-up re-measured without
rebuilding 10M lines.

``--shards N`` measures the cold start of a sharded corpus instead (kept in
``results/corpus_shards-<cpu class>.json``): the corpus of ``--lines`` as one file and as ``N``
text shards of consecutive lines, each trained cold (empty cache) on 1 process (2 threads) and
on 2 (``torchrun``, 1 thread each), ``--rounds`` times in alternating order; the seconds to the
first step and to the data, and the token tables' rows per CPU-second (their ``table.json``:
the build's own and its workers' CPU time) beside ``tokenizers``' ``encode_batch`` on the same
texts in one thread (the ceiling: the tokeniser alone)::

    python -m benchmarks.corpus_scale --shards 20 --lines 1000000 --rounds 3 --work /tmp/corpus

A corpus of another length is kept beside it (``results/corpus_shards-10M-<cpu class>.json``); ``--layouts``
runs some of the four (``file-1p,shards-1p,shards-2p``: the single file against the shards, ~15 min a run
at 10M lines on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    DATA,
    REPO,
    WIKI,
    CpuActivity,
    cpu_class,
    cpu_flags,
    emit,
    lines_label,
    module_command,
    setup_threads,
)
from benchmarks._harness import RESULTS, add_options, keep, start

VARIANTS = ("kit", "st", "lists")
LAYOUTS = ("file-1p", "file-2p", "shards-1p", "shards-2p")  # --shards: the corpus as one file or shards, 1 or 2 processes
LISTS_MAX = 1_000_000  # the old lists need ~2.5 GB a million lines
DEV_PAIRS = 100
# The kit's log lines that end each phase (simcse_kit.data.readers, simcse_kit.training.engine.loop).
PHASES = {"started_s": " INFO ", "data_s": "loaded ", "ready_s": "optimiser steps on"}


def write_corpus(lines: int, folder: Path, bad_line: int | None = None) -> Path:
    """``lines`` numbered lines, each two Wikipedia lines joined (a fixed pairing); line
    ``bad_line`` (1-based) gets a byte that is not UTF-8."""
    wiki = [s.strip() for s in WIKI.read_text(encoding="utf-8").split("\n") if s.strip()]
    path = folder / (f"corpus-{lines}.txt" if bad_line is None else f"corpus-{lines}-bad-{bad_line}.txt")
    if path.exists():
        return path
    with path.open("w", encoding="utf-8", errors="surrogateescape") as fh:
        for i in range(lines):
            bad = "\udcff" if i + 1 == bad_line else ""
            fh.write(f"{i}. {wiki[i % len(wiki)]}{bad} {wiki[(i * 7919 + 1) % len(wiki)]}\n")
    return path


def peak_mib(pid: int) -> float | None:
    """A live process's peak RSS so far (``VmHWM``), MiB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(found.group(1)) / 1024 if found else None


def anon_mib(pid: int) -> float:
    """A live process's private (anonymous) resident memory now, ``RssAnon``, MiB (0: gone).
    RSS also counts the pages of the memory-mapped cache a process has touched: page cache,
    clean, shared with the other processes and given back under memory pressure."""
    try:
        found = re.search(r"RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return 0.0
    return int(found.group(1)) / 1024 if found else 0.0


def tracked(command: list[str], threads: int, env: dict[str, str]) -> dict[str, Any]:
    """Run ``command`` from the repo; its status, output, peak RSS (``wait4``: the largest of
    its process tree), each descendant's polled peak, the largest private memory of any of them
    (polled ``RssAnon``), and when each line came (from the spawn)."""
    import psutil  # type: ignore[import-untyped]

    env = os.environ | {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | env
    spawn = time.time()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: dict[int, float] = {}
    anon = [0.0]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.1):
            try:
                pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
            except psutil.Error:
                return
            for pid in pids:
                children[pid] = max(children.get(pid, 0.0), peak_mib(pid) or 0.0)
            anon[0] = max(anon[0], *(anon_mib(pid) for pid in [proc.pid, *pids]))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    assert proc.stdout is not None
    lines = [(time.time() - spawn, line.rstrip()) for line in proc.stdout]  # \r too: each bar update is a line
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    poller.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "lines": lines, "peak_rss_mib": usage.ru_maxrss / 1024, "spawn": spawn,
            "children_peak_mib": sorted(children.values()), "peak_anon_mib": anon[0]}  # fmt: skip


def kit_command(corpus: Path, cache: Path, out: Path, work: Path, processes: int = 1, **options: str) -> list[str]:
    """``simcse-kit train unsup`` on ``corpus``, 2 steps (under ``torchrun`` for several processes)."""
    dev = work / "sts-dev-head.csv"
    if not dev.exists():
        head = (DATA / "stsbenchmark" / "sts-dev.csv").read_text(encoding="utf-8").splitlines()[:DEV_PAIRS]
        dev.write_text("\n".join(head) + "\n", encoding="utf-8")
    keys = {"train_file": corpus, "cache_dir": cache, "output_dir": out, "dev_file": dev, "max_steps": 2, "eval_steps": 0}
    keys |= {"eval_at_start": "false", "final_eval": "false", "log_steps": 1, "report_to": "tensorboard"} | options
    cli = ["-m", "simcse_kit.cli", "train", "unsup", "--overwrite", *(x for k, v in keys.items() for x in (f"--{k}", str(v)))]
    if processes == 1:
        return [sys.executable, *cli]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *cli]


def trained(train_file: Path, cache: Path, work: Path, threads: int, env: dict[str, str], processes: int) -> dict[str, Any]:
    """Run ``kit_command`` to its end: :func:`tracked`'s result, each phase's seconds (:data:`PHASES`) and the
    seconds from the spawn to the end of the first optimiser step (its TensorBoard event)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)
    res = tracked(kit_command(train_file, cache, out, work, processes), threads, env)
    if res["rc"] != 0:
        raise RuntimeError("\n".join(line for _, line in res["lines"][-30:]))
    events = EventAccumulator(str(out / "logs" / "simcse-kit"))
    events.Reload()
    phases = {name: next(t for t, line in res["lines"] if marker in line) for name, marker in PHASES.items()}
    return res | phases | {"first_step_s": events.Scalars("train/loss")[0].wall_time - res["spawn"]}


def kit_run(corpus: Path, cache: Path, work: Path, threads: int, env: dict[str, str], processes: int = 1) -> dict[str, Any]:
    """One ``kit`` run: the phases' seconds, peak RSS, the cache's build rate.

    A corpus over 128 MiB is cached in parts (byte ranges, :mod:`simcse_kit.data.corpus`), each with its sidecar
    and token table: the rates are all parts' rows over their summed seconds (one process builds them in turn)."""
    res = trained(corpus, cache, work, threads, env, processes)
    result = {name: res[name] for name in (*PHASES, "first_step_s")}
    folder = cache / "simcse_kit_train"
    parts = [json.loads(p.read_text()) for p in folder.glob(f"{corpus.stem}-*.json")]
    rows = sum(p["rows"] for p in parts)
    result |= {"rows": rows, "parts": len(parts), "cache_build_rows_per_s": rows / sum(p["seconds"] for p in parts)}
    tables = [json.loads(p.read_text()) for p in folder.glob(f"{corpus.stem}-*.tokens-*/table.json")]
    if tables:  # the token tables (simcse_kit.data.tokens): built by the cold run
        table_rows = sum(t["rows"] for t in tables)
        result |= {
            "token_table_rows_per_s": table_rows / sum(t["seconds"] for t in tables),
            "token_table_processes": max(t["processes"] for t in tables),
        }
    return result | {k: res[k] for k in ("peak_rss_mib", "children_peak_mib", "peak_anon_mib")}


def write_shards(corpus: Path, shards: int) -> Path:
    """``corpus``'s lines in ``shards`` files of consecutive lines (``part-00000-of-000NN.txt``)."""
    folder = corpus.with_name(f"{corpus.stem}-{shards}-shards")
    if folder.is_dir():
        return folder
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for i in range(shards):
        part = lines[len(lines) * i // shards : len(lines) * (i + 1) // shards]
        (tmp / f"part-{i:05d}-of-{shards:05d}.txt").write_text("".join(part), encoding="utf-8")
    tmp.rename(folder)
    return folder


def cold_start(train_file: Path, cache: Path, work: Path, processes: int, env: dict[str, str]) -> dict[str, Any]:
    """One cold ``kit`` run (the cache emptied first) on ``processes`` processes sharing the 2 threads."""
    shutil.rmtree(cache, ignore_errors=True)
    with CpuActivity() as activity:
        res = trained(train_file, cache, work, 2 // processes, env, processes)
    tables = [json.loads(p.read_text()) for p in (cache / "simcse_kit_train").glob("*.tokens-*/table.json")]
    return {
        "data_s": res["data_s"],
        "first_step_s": res["first_step_s"],
        "tables": len(tables),
        "table_rows": sum(t["rows"] for t in tables),
        "table_rows_per_cpu_s": sum(t["rows"] for t in tables) / sum(t["cpu_seconds"] for t in tables),
        "activity": activity.record,
    }


def encode_batch_rate(corpus: Path, rows: int = 200_000, max_seq_len: int = 32) -> float:
    """``tokenizers``' ``encode_batch`` rows per CPU-second on ``corpus``'s first ``rows`` lines, in
    batches of the token table's size, truncated as the unsup recipe truncates, in one thread."""
    from transformers import AutoTokenizer

    from simcse_kit.data.tokens import TOKENIZER_BATCH
    from simcse_kit.model.modeling import resolve_model_path

    texts = corpus.read_text(encoding="utf-8").splitlines()[:rows]
    backend = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2")).backend_tokenizer
    backend.enable_truncation(max_seq_len)
    start = time.process_time()
    for i in range(0, len(texts), TOKENIZER_BATCH):
        backend.encode_batch(texts[i : i + TOKENIZER_BATCH])
    return len(texts) / (time.process_time() - start)


def shard_runs(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The ``--shards`` record: each round, the file and the shards on 1 and 2 processes, cold."""
    lines = max(args.lines or [1_000_000])
    corpus = write_corpus(lines, args.work)
    folder = write_shards(corpus, args.shards)
    variants = [(name, path, n) for name, path in (("file", corpus), ("shards", folder)) for n in (1, 2)
                if f"{name}-{n}p" in args.layouts.split(",")]  # fmt: skip
    runs = []
    for round_ in range(args.rounds):
        for name, path, n in variants if round_ % 2 == 0 else variants[::-1]:
            result = cold_start(path, args.work / "cache-cold", args.work, n, env)
            runs.append({"round": round_, "variant": f"{name}-{n}p", "lines": lines, "shards": args.shards} | result)
            print(json.dumps(runs[-1]), flush=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    encode = [encode_batch_rate(corpus) for _ in range(args.rounds)]
    return {"runs": runs, "encode_batch_rows_per_cpu_s": encode}


def worker(args: argparse.Namespace) -> None:
    """``st`` (load and train 2 steps) or ``lists`` (load) in this fresh process; absolute stamps."""
    setup_threads(args.threads)
    import datasets

    if args.worker == "lists":
        stamps = {"started": time.time()}
        text = Path(args.file).read_text(encoding="utf-8")
        dataset = datasets.Dataset.from_dict({"sent0": [s.strip() for s in text.split("\n") if s.strip()]})
        return emit(stamps | {"data": time.time(), "rows": len(dataset)})
    from sentence_transformers import SentenceTransformer, losses
    from transformers import TrainerCallback

    from benchmarks._common import st_pair_trainer
    from simcse_kit.model.modeling import resolve_model_path

    stamps = {"started": time.time()}
    text = datasets.load_dataset("text", data_files=args.file, cache_dir=args.cache_dir, split="train")
    # Its documented unsupervised SimCSE: each sentence is its own positive, as a second column
    # of the same memory-mapped table (no copy).
    pairs = datasets.concatenate_datasets([text, text.rename_column("text", "positive")], axis=1)
    stamps["data"] = time.time()

    class FirstStep(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            stamps.setdefault("first_step", time.time())

    model = SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu")
    model.max_seq_length = 32  # the unsup recipe's
    loss = losses.MultipleNegativesRankingLoss(model)
    trainer = st_pair_trainer(model, pairs, 64, 2, loss, bf16=False, cpu=True, callbacks=[FirstStep()])
    stamps["ready"] = time.time()
    trainer.train()
    emit(stamps | {"rows": len(pairs), "memory_mapped": bool(pairs.cache_files)})


def st_run(variant: str, corpus: Path, cache: Path, threads: int, env: dict[str, str]) -> dict[str, Any]:
    command = [*module_command(__file__), f"--worker={variant}", f"--file={corpus}", f"--cache-dir={cache}"]
    res = tracked([*command, f"--threads={threads}"], threads, env)
    if res["rc"] != 0:
        raise RuntimeError("\n".join(line for _, line in res["lines"][-30:]))
    stamps = json.loads([line for _, line in res["lines"] if line.startswith("RESULT ")][-1][len("RESULT ") :])
    names = {"started": "started_s", "data": "data_s", "ready": "ready_s", "first_step": "first_step_s"}
    result = {names[k]: v - res["spawn"] for k, v in stamps.items() if k in names}
    return result | {"rows": stamps["rows"], "peak_rss_mib": res["peak_rss_mib"], "peak_anon_mib": res["peak_anon_mib"]}


def best_model_digest(out: Path) -> str | None:
    """A hash of every file of ``out/best_model`` and of ``out/metrics.json`` (None: no best model)."""
    best = out / "best_model"
    if not best.is_dir():
        return None
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted([*best.rglob("*"), out / "metrics.json"]):
        if path.is_file():
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def bad_row_checks(lines: int, work: Path, threads: int, env: dict[str, str]) -> dict[str, Any]:
    """A bad row on line ``lines - 1``: ``error`` into a new folder, ``skip``, then ``error`` over the finished run."""
    bad_line = lines - 1
    corpus = write_corpus(lines, work, bad_line=bad_line)
    cache, out = work / "cache-bad", work / "bad-run"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    checks: dict[str, Any] = {"lines": lines, "bad_line": bad_line}

    def run(policy: str) -> dict[str, Any]:
        t = time.perf_counter()
        res = tracked(kit_command(corpus, cache, out, work, bad_rows=policy), threads, env)
        said = [line for _, line in res["lines"] if "error:" in line or "skipped" in line]
        return {"rc": res["rc"], "said": said[-3:], "seconds": time.perf_counter() - t, "peak_rss_mib": res["peak_rss_mib"]}

    checks["error_new_folder"] = run("error") | {"folder_written": out.exists()}
    checks["error_new_folder"]["names_file_and_line"] = any(
        f"{corpus}, line {bad_line}:" in line for line in checks["error_new_folder"]["said"]
    )
    checks["skip"] = run("skip")
    metrics = json.loads((out / "metrics.json").read_text())
    checks["skip"] |= {"skipped_rows": metrics["skipped_rows"], "steps": metrics["steps"]}
    before = best_model_digest(out)
    checks["error_over_run"] = run("error")
    checks["error_over_run"]["best_model_and_metrics_untouched"] = before is not None and best_model_digest(out) == before
    shutil.rmtree(cache, ignore_errors=True)
    corpus.unlink()
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, action="append", help="corpus length(s) (default 100000)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--checks", action="store_true", help="bad rows and two processes on the largest corpus")
    parser.add_argument("--checks-only", action="store_true", help="--checks alone, added to the kept record's runs")
    parser.add_argument(
        "--warm-only", action="store_true", help="warm runs on the caches an earlier run built (kit, st), kept apart"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/simcse-kit-corpus"), help="corpora and caches (GBs)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shards", type=int, default=0, help="the cold start of the corpus in this many shards (docstring)")
    parser.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help="with --shards: which of the layouts run, a comma list (a 10M corpus takes ~15 min a run on 2 cores)",
    )
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    add_options(parser, "corpus_scale", rounds=1)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.warm_only and args.json is None:  # beside the full record, not over it
        args.json = RESULTS / f"corpus_scale_warm-{cpu_class(cpu_flags()[1])}.json"
    if unknown := set(args.layouts.split(",")) - set(LAYOUTS):  # before start() refuses a busy machine or dirty tree
        parser.error(f"--layouts: unknown {sorted(unknown)}; choose from {', '.join(LAYOUTS)}")
    env = start(args)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.shards:
        lines = max(args.lines or [1_000_000])
        if args.json is None and lines != 1_000_000:  # beside the 1M record, not over it
            args.json = RESULTS / f"corpus_shards-{lines_label(lines)}-{cpu_class(cpu_flags()[1])}.json"
        keep("corpus_scale", args, shard_runs(args, env), stem="corpus_shards")
        return
    runs: list[dict[str, Any]] = []
    sizes = sorted(args.lines or [100_000])
    if args.checks_only:  # the size runs of the kept record (its machine and command kept beside them)
        kept = json.loads((args.json or RESULTS / f"corpus_scale-{cpu_class(cpu_flags()[1])}.json").read_text())
        runs, args.checks, sizes = kept["runs"], True, []
        earlier = {"runs_machine": kept["machine"], "runs_command": kept["command"]}
    for lines in sizes:
        corpus = write_corpus(lines, args.work)
        for variant in args.variants.split(","):
            if variant == "lists" and lines > LISTS_MAX:
                continue
            cache = args.work / f"cache-{variant}-{lines}"
            if args.warm_only and (variant == "lists" or not cache.is_dir()):
                continue  # nothing warm to run
            if not args.warm_only:
                shutil.rmtree(cache, ignore_errors=True)
            for state in ("warm",) if args.warm_only else ("cold",) if variant == "lists" else ("cold", "warm"):
                with CpuActivity() as activity:
                    if variant == "kit":
                        result = kit_run(corpus, cache, args.work, args.threads, env)
                        if result["rows"] != lines:  # a sidecar the glob missed (how one part once stood for 17)
                            raise RuntimeError(f"{cache}: its parts' sidecars count {result['rows']} rows of {lines}")
                    else:
                        result = st_run(variant, corpus, cache, args.threads, env)
                runs.append({"lines": lines, "variant": variant, "cache": state} | result | {"activity": activity.record})
                print(json.dumps(runs[-1]), flush=True)
    record: dict[str, Any] = {"runs": runs} | (earlier if args.checks_only else {})
    if args.checks:
        lines = max(r["lines"] for r in runs)
        corpus, cache = write_corpus(lines, args.work), args.work / f"cache-kit-{lines}"  # warm from the runs above
        processes = []
        for n in (1, 2):
            with CpuActivity() as activity:
                result = kit_run(corpus, cache, args.work, 1, env, processes=n)
            processes.append({"processes": n, "threads_each": 1} | result | {"activity": activity.record})
            print(json.dumps(processes[-1]), flush=True)
        record["processes"] = processes
        if not args.warm_only:  # a bad row is found by a cold read
            record["bad_rows"] = bad_row_checks(lines, args.work, args.threads, env)
            print(json.dumps(record["bad_rows"]), flush=True)
    keep("corpus_scale", args, record)


if __name__ == "__main__":
    main()
