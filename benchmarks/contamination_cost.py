"""What the contamination guard's sentence keys add to a cold cache build.

The corpus is corpus_scale's (``wiki1m_head.txt``'s lines re-combined in pairs and numbered,
``--lines`` of them). Each round builds the Arrow text cache twice into fresh folders, in
alternating order: ``keys`` as shipped (each text normalised and hashed while the cache is
built, :mod:`simcse_kit.data.overlap`) and ``no-keys`` (the hashing replaced by nothing).
With ``--tokens``, the main job's token table is also built once on the ``keys`` cache: the
rest of the cache a cold run pays for.

    python -m benchmarks.contamination_cost --lines 1000000 --rounds 3 --tokens --allow-busy
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import add_allow_dirty, check_quiet, cpu_class, cpu_flags, machine, refuse_dirty, save_results
from benchmarks._harness import RESULTS
from benchmarks.corpus_scale import write_corpus
from simcse_kit.data import corpus as corpus_module
from simcse_kit.data.readers import read_train_file


class NumberedKeys:
    """``row_hashes`` without the hashing: the build still gets a key per row and text column (it counts repeated
    texts from them), here the row's number, counted on across batches so that no text repeats another."""

    def __init__(self) -> None:
        self.next_row = 0

    def __call__(self, columns: Iterable[Sequence[str]]) -> np.ndarray:
        lengths = [len(c) for c in columns]
        n = lengths[0] if lengths else 0
        rows = np.arange(self.next_row, self.next_row + n, dtype=np.uint64)
        self.next_row += n
        return np.repeat(rows[:, None], len(lengths), axis=1)


def build_seconds(path: Path, cache: Path, keys: bool) -> float:
    """Seconds to build ``path``'s text cache in the empty folder ``cache``."""
    original = corpus_module.row_hashes
    if not keys:
        corpus_module.row_hashes = NumberedKeys()
    try:
        start = time.perf_counter()
        read_train_file(path, "unsup", cache_dir=cache)
        return time.perf_counter() - start
    finally:
        corpus_module.row_hashes = original


def token_seconds(path: Path, cache: Path) -> float:
    """Seconds to build the main job's token table (all-MiniLM-L6-v2, 32 tokens) beside the cache."""
    from transformers import AutoTokenizer

    from simcse_kit.data.tokens import Tokenization, with_tokens
    from simcse_kit.model.modeling import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    corpus = read_train_file(path, "unsup", cache_dir=cache)
    start = time.perf_counter()
    with_tokens(corpus.dataset, Tokenization(tokenizer, 32), "unsup", corpus.cache_files[0])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", action="store_true", help="also time the token table once")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "contamination_cost")
    parser.add_argument("--allow-busy", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    add_allow_dirty(parser)
    args = parser.parse_args()
    check_quiet(args.allow_busy)
    refuse_dirty(args.allow_dirty)  # before the runs: save_results would refuse their record
    args.work.mkdir(parents=True, exist_ok=True)
    path = write_corpus(args.lines, args.work)
    times: dict[str, list[float]] = {"keys": [], "no-keys": []}
    for round_ in range(args.rounds):
        order = ["keys", "no-keys"] if round_ % 2 == 0 else ["no-keys", "keys"]
        for variant in order:
            cache = Path(tempfile.mkdtemp(dir=args.work))
            times[variant].append(build_seconds(path, cache, variant == "keys"))
            shutil.rmtree(cache)
        print(f"round {round_ + 1}: keys {times['keys'][-1]:.2f} s, no-keys {times['no-keys'][-1]:.2f} s", flush=True)
    keys, plain = statistics.median(times["keys"]), statistics.median(times["no-keys"])
    record: dict[str, Any] = {"lines": args.lines, "seconds": times, "median_keys_s": keys, "median_no_keys_s": plain}
    record["added_to_text_cache"] = keys / plain - 1
    if args.tokens:
        cache = Path(tempfile.mkdtemp(dir=args.work))
        record["token_table_s"] = token_seconds(path, cache)
        shutil.rmtree(cache)
        record["added_to_text_cache_and_token_table"] = (keys - plain) / (plain + record["token_table_s"])
    print({k: v for k, v in record.items() if k != "seconds"})
    _, flags = cpu_flags()
    out = args.json or RESULTS / f"contamination_cost-{cpu_class(flags)}.json"
    command = f"python -m benchmarks.contamination_cost --lines {args.lines} --rounds {args.rounds}" + " --tokens" * args.tokens
    save_results(out, {"machine": machine(), "command": command, **record}, allow_dirty=args.allow_dirty)


if __name__ == "__main__":
    main()
