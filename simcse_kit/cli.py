"""The ``simcse-kit`` console script: one entry point, one subcommand per job.

Errors the user can fix (bad data, bad config, missing model) print one line and
exit with status 2; a full disk or a read-only place prints one line and exits 1; a run
stopped by SIGTERM, SIGUSR1 or Ctrl-C writes a checkpoint, prints the ``--resume``
command and exits 75 (:data:`simcse_kit.errors.STOPPED_STATUS`); a second Ctrl-C exits
130 at once. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from simcse_kit.errors import STOPPED_STATUS, ConfigError, DataError, Stopped, StorageError
from simcse_kit.recipes import find_recipe, senteval_dir

logger = logging.getLogger("simcse_kit")


def parse_overrides(tokens: Sequence[str]) -> dict[str, str]:
    """``['--seed', '3', '--model.pooler=cls']`` -> ``{'seed': '3', 'model.pooler': 'cls'}``."""
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}; options are --key value")
        key = tok[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            i += 1
            value = tokens[i]
        else:
            raise ConfigError(f"option --{key} needs a value")
        out[key] = value
        i += 1
    return out


def resume_command(argv: Sequence[str]) -> str:
    """The command line that continues a stopped run: the same arguments, ``--resume``
    in place of ``--overwrite`` (a stopped run must not be started over)."""
    words = [w for w in argv if w != "--overwrite"]
    if "--resume" not in words:
        words.append("--resume")
    return shlex.join(["simcse-kit", *words])


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config import load_config
    from simcse_kit.training import train

    cfg = load_config(find_recipe(args.config), parse_overrides(extra)).check_data()
    if args.seeds is not None:  # one run per seed in OUTPUT_DIR/seed-N, then mean ± std
        from simcse_kit.experiments import parse_seeds, run_seeds

        if args.resume:
            raise ConfigError("--seeds runs reuse finished seeds on their own; run the same command again instead of --resume")
        run_seeds(cfg, parse_seeds(args.seeds), overwrite=args.overwrite)
        return 0
    train(cfg, overwrite=args.overwrite, resume=args.resume)
    return 0


def cmd_sweep(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.config import load_config
    from simcse_kit.experiments import SWEEP_KEYS, parse_seeds, parse_values, run_sweep

    grid = {name: parse_values(name, getattr(args, name)) for name in SWEEP_KEYS if getattr(args, name) is not None}
    if not grid:
        raise ConfigError(
            "nothing to sweep: give --temperature, --dropout, --hard-negative-weight and/or --word-repetition (comma-separated)"
        )
    cfg = load_config(find_recipe(args.config), parse_overrides(extra)).check_data()
    run_sweep(cfg, grid, parse_seeds(args.seeds) if args.seeds else None, overwrite=args.overwrite)
    return 0


def cmd_transfer(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation import evaluate_transfer

    evaluate_transfer(
        tasks=args.tasks,
        kfold=args.kfold,
        max_train_samples=args.max_train_samples,
        mrpc_features=args.mrpc_features,
        **model_options(args),
    )
    return 0


def model_options(args: argparse.Namespace) -> dict[str, object]:
    """The options every evaluation command shares: which model, how to read it, where
    the data and the JSON go."""
    options: dict[str, object] = {
        "model": args.model,
        "pooler": args.pooler,
        "json_out": args.json,
        "batch_size": args.batch_size,
        "device": args.device,
    }
    if getattr(args, "source", "senteval") == "senteval":  # hub tasks read no SentEval folder
        options["data_dir"] = senteval_dir(args.data_dir, args.data_root)
    return options


def cmd_recipes(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.recipes import builtin_recipes, describe, recipe_folder

    if args.action == "show":
        if args.name is None:
            raise ConfigError("recipes show needs a NAME (simcse-kit recipes lists them)")
        kind = "evaluate" if args.name in builtin_recipes("evaluate") else "train"
        sys.stdout.write(find_recipe(args.name, kind).read_text(encoding="utf-8"))
        return 0
    for kind, title, use in (("train", "training recipes", "simcse-kit train NAME"), ("evaluate", "STS suites", "--suite NAME")):
        recipes = builtin_recipes(kind)
        print(f"{title} ({use}; in {recipe_folder(kind)}):")
        width = max(map(len, recipes), default=0)
        for name, path in recipes.items():
            print(f"  {name:<{width}}  {describe(path)}")
    print("'simcse-kit recipes show NAME > my.yaml' starts your own; in a recipe, {data_root} is the data root")
    print("(--data-root DIR or SIMCSE_KIT_DATA; default ../shared/data beside a source checkout)")
    return 0


def add_device_option(p: argparse.ArgumentParser) -> None:
    """``--device`` of every command that encodes (:mod:`simcse_kit.devices`)."""
    from simcse_kit.devices import AUTO_DEVICE, DEVICE_HELP

    p.add_argument("--device", default=AUTO_DEVICE, help=f"{DEVICE_HELP} (default: auto)")


def add_data_options(p: argparse.ArgumentParser, data_dir_help: str) -> None:
    """``--data-dir`` and ``--data-root`` of the evaluation commands."""
    p.add_argument("--data-dir", default=None, help=f"{data_dir_help} (default: DATA_ROOT/senteval)")
    p.add_argument(
        "--data-root",
        default=None,
        help="the data root (default: $SIMCSE_KIT_DATA, else ../shared/data beside a source checkout)",
    )


def cmd_evaluate(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation import DEFAULT_SUITE, evaluate_model, evaluate_retrieval, load_suite
    from simcse_kit.evaluation.hub import HUB_SUITE

    if args.retrieval:
        sts_only = [f"--{k.replace('_', '-')}" for k in ("suite", "tasks", "hub_root") if getattr(args, k) is not None]
        if sts_only or args.source != "senteval":
            raise ConfigError(f"--retrieval evaluates BEIR folders; {sts_only or ['--source']} only apply to the STS tasks")
        evaluate_retrieval(
            args.model,
            args.retrieval,
            pooler=args.pooler,
            split=args.retrieval_split,
            json_out=args.json,
            batch_size=args.batch_size,
            precision=args.precision,
            index=args.index,
            device=args.device,
            mteb_results=args.mteb_results,
            truncate_dim=args.truncate_dim,
        )
        return 0

    suite = None if args.suite is None else load_suite(find_recipe(args.suite, "evaluate"))
    known = suite or (HUB_SUITE if args.source == "hub" else DEFAULT_SUITE)
    unknown = [t for t in args.tasks or () if t not in known]
    if unknown:
        raise ConfigError(f"--tasks: unknown task(s) {unknown}; choose from {list(known)}")

    evaluate_model(
        tasks=args.tasks,
        suite=suite,
        precision=args.precision,
        source=args.source,
        hub_root=args.hub_root,
        mteb_results=args.mteb_results,
        truncate_dim=args.truncate_dim,
        **model_options(args),
    )
    return 0


def cmd_export(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.export import ExportError, export_model

    try:
        result = export_model(
            args.source,
            args.out_dir,
            overwrite=args.overwrite,
            normalize=False if args.no_normalize else None,
            onnx=args.onnx,
            quantize=args.quantize,
            push_to_hub=args.push_to_hub,
            device=args.device,
            **({"opset": args.opset} if args.opset is not None else {}),
            truncate_dim=args.truncate_dim,
            # STS data is read only for the int8 check: exporting needs no data root otherwise.
            **({"data_dir": senteval_dir(args.data_dir, args.data_root)} if args.quantize else {}),
        )
    except ExportError as exc:
        # Not a user error (exit 2) but a failed check: one line, no traceback, status 1.
        print(f"simcse-kit export: failed: {exc}", file=sys.stderr)
        return 1
    print(f"exported to {result.out_dir}: {result.modules}")
    print(f"normalize: {'on' if result.normalize else 'off'} ({result.normalize_reason})")
    for backend, par in result.parity.items():
        print(
            f"parity ({backend}): min cosine {par.min_cosine:.7f} over {result.n_probes} probe sentences, "
            f"{result.speed[backend]:.0f} sentences/s"
        )
    if result.sts:
        ref, q = result.sts["simcse-kit fp32"], result.sts["onnx-int8"]
        print(f"STS: int8 ONNX {q:.2f} vs simcse-kit fp32 {ref:.2f} ({q - ref:+.2f})")
    if args.push_to_hub:
        print(f"uploaded to the hub: {args.push_to_hub}")
    return 0


def cmd_demo(args: argparse.Namespace, extra: list[str]) -> int:
    if args.demo == "digits":
        from simcse_kit.demos import digits

        cfg = digits.DigitsConfig(epochs=args.epochs, temperature=args.temperature, seed=args.seed, tsne=not args.no_tsne)
        digits.run(cfg, args.output_dir or Path("runs/demos/digits"))
    else:
        from simcse_kit.demos import toy

        out = args.output_dir or Path("runs/demos/toy")
        toy.run(args.temperatures, steps=args.steps, seed=args.seed, similarity=args.similarity, output_dir=out)
    return 0


def cmd_temperature(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.demos import temperature

    if len(args.similarities) < 2 or any(not -1.0 <= s <= 1.0 for s in args.similarities):
        raise ConfigError("--similarities needs the positive's and at least one negative's cosine, each in [-1, 1]")
    if any(t <= 0 for t in args.temperatures):
        raise ConfigError("--temperatures must all be > 0")
    temperature.run(args.similarities, args.temperatures, args.output_dir)
    return 0


def cmd_align_uniform(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation import align_uniform_model

    align_uniform_model(split=args.split, threshold=args.threshold, **model_options(args))
    return 0


def cmd_mine(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.mining import mine_file

    mine_file(
        args.pairs,
        args.out,
        model=args.model,
        pooler=args.pooler,
        top_k=args.top_k,
        margin=args.margin,
        sampling_strategy=args.sampling_strategy,
        seed=args.seed,
        batch_size=args.batch_size,
        device=args.device,
    )
    return 0


def cmd_retrieval_tasks(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.evaluation.retrieval_tasks import RETRIEVAL_TASKS, build_retrieval_tasks
    from simcse_kit.recipes import data_root

    unknown = [t for t in args.tasks or () if t not in RETRIEVAL_TASKS]
    if unknown:
        raise ConfigError(f"--tasks: unknown task(s) {unknown}; choose from {list(RETRIEVAL_TASKS)}")
    root = data_root(args.data_root)
    if root is None:
        raise ConfigError("no data root: pass --data-root DIR or set SIMCSE_KIT_DATA")
    for name, folder in build_retrieval_tasks(args.out, root, args.tasks).items():
        print(f"{name}: {folder}  (simcse-kit evaluate MODEL --retrieval {folder})")
    return 0


def config_keys_help() -> str:
    """Every config key a recipe may set and ``--key value`` may override, with its type,
    default and meaning (from the field's comment in simcse_kit/config.py)."""
    from simcse_kit.config import key_help

    lines = ["config keys (override as --KEY VALUE or --SECTION.KEY VALUE; dashes or underscores):"]
    for dotted, kind, default, meaning in key_help():
        flag = dotted.split(".")[1].replace("_", "-")
        first_sentence = meaning.split(". ")[0].rstrip(".")
        lines.append(f"  --{flag:<22} {kind:<14} default {default!r:<12} {first_sentence}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simcse-kit", description="SimCSE sentence-embedding training and evaluation")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    # allow_abbrev=False: an override such as --seed 3 must never be read as --seeds.
    p = sub.add_parser(
        "train",
        help="train from a YAML recipe; any config key can be overridden as --key value",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=config_keys_help(),
    )
    p.add_argument("config", help="recipe YAML file, or a built-in recipe's name (simcse-kit recipes)")
    p.add_argument(
        "--overwrite", action="store_true", help="start over in --output-dir (a run folder, with config.yaml, or an empty one)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its newest checkpoint")
    p.add_argument("--seeds", default=None, help="e.g. 1,2,3: a run per seed in OUTPUT_DIR/seed-N; mean ± std in seeds.json")
    p.set_defaults(func=cmd_train, extra_ok=True)

    p = sub.add_parser(
        "sweep",
        help="one-axis sweeps of temperature / dropout / hard-negative weight; plot of STS-B dev against each",
        allow_abbrev=False,
    )
    p.add_argument("config", help="base recipe (file or built-in name); other keys may be overridden as --key value")
    p.add_argument("--temperature", default=None, help="comma-separated values, e.g. 0.01,0.05,0.1")
    p.add_argument("--dropout", default=None, help="comma-separated values, e.g. 0.05,0.1,0.2")
    p.add_argument("--hard-negative-weight", dest="hard_negative_weight", default=None, help="comma-separated (hardneg mode)")
    p.add_argument("--word-repetition", dest="word_repetition", default=None, help="comma-separated ESimCSE dup rates (unsup)")
    p.add_argument("--seeds", default=None, help="seeds per point (mean ± std error bars)")
    p.add_argument("--overwrite", action="store_true", help="retrain points already finished")
    p.set_defaults(func=cmd_sweep, extra_ok=True)

    p = sub.add_parser("transfer", help="SentEval transfer tasks (MR CR SUBJ MPQA SST2 TREC MRPC), logistic-regression probe")
    p.add_argument("model", help="anything 'simcse-kit evaluate' accepts")
    p.add_argument("--pooler", default=None, help="pooler for a plain HF model")
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of tasks (default: all 7)")
    p.add_argument("--kfold", type=int, default=10, help="folds for CV (SentEval: 10; 5 for a quick look)")
    p.add_argument("--max-train-samples", type=int, default=None, help="subsample each task's training data (quick runs)")
    p.add_argument("--mrpc-features", choices=("senteval", "full"), default="senteval", help="[|u-v|, u*v] or [u, v, |u-v|, u*v]")
    p.add_argument("--json", type=Path, default=None, help="write results here")
    p.add_argument("--batch-size", type=int, default=128)
    add_device_option(p)
    p.set_defaults(func=cmd_transfer, extra_ok=False)

    p = sub.add_parser("evaluate", help="STS12-16, STS-B, SICK-R Spearman x 100 (SimCSE protocol)")
    p.add_argument(
        "model", help="a simcse-kit run or model folder, a sentence-transformers folder, an HF folder, or 'all-MiniLM-L6-v2'"
    )
    p.add_argument("--pooler", default=None, help="pooler for a plain HF model (simcse-kit and ST folders record theirs)")
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument(
        "--suite", default=None, help="YAML task table, or a built-in suite's name (default: the paper's 7, = the suite sts)"
    )
    p.add_argument(
        "--source",
        choices=("senteval", "hub"),
        default="senteval",
        help="senteval = the tokenised files in --data-dir; hub = MTEB's copies of the 7 tasks through 'datasets' "
        "(untokenised text; needs internet or --hub-root)",
    )
    p.add_argument("--hub-root", type=Path, default=None, help="with --source hub: a local folder of <dataset id>/ copies")
    p.add_argument("--mteb-results", type=Path, default=None, help="also write one MTEB-format JSON per task here")
    p.add_argument("--tasks", nargs="+", default=None, help="subset of the suite's tasks (default: all)")
    p.add_argument(
        "--retrieval",
        action="append",
        type=Path,
        default=None,
        metavar="DIR",
        help="evaluate retrieval on this BEIR-format folder instead of STS (repeatable): nDCG@10, MRR@10, R@1/10/100, MAP@100",
    )
    p.add_argument("--retrieval-split", default="test", help="with --retrieval: the qrels split (qrels/SPLIT.tsv)")
    p.add_argument(
        "--truncate-dim", type=int, default=None, metavar="N", help="use the first N dimensions of each embedding (Matryoshka)"
    )
    p.add_argument(
        "--index", choices=("exact", "faiss"), default="exact", help="with --retrieval: exact chunked search, or a faiss index"
    )
    p.add_argument("--json", type=Path, default=None, help="write results here")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument(
        "--precision",
        choices=("no", "bf16", "fp16", "auto"),
        default="no",
        help="inference precision: no = fp32 (the default, so reported numbers do not depend on the CPU); "
        "auto = bf16 where this device computes it natively, else fp32",
    )
    add_device_option(p)
    p.set_defaults(func=cmd_evaluate, extra_ok=False)

    p = sub.add_parser("export", help="write a verified sentence-transformers folder (with model card) from a run or model")
    p.add_argument("source", help="a simcse-kit run folder or model folder")
    p.add_argument("out_dir", type=Path, help="the export folder (appears only complete and verified)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at OUT_DIR (any other folder is refused)")
    p.add_argument(
        "--no-normalize", action="store_true", help="no Normalize module (default: kept from the base / added for cosine)"
    )
    p.add_argument(
        "--onnx", action="store_true", help="also write onnx/model.onnx: encoder + pooling as one graph (needs simcse-kit[onnx])"
    )
    p.add_argument("--quantize", choices=("int8",), default=None, help="also write onnx/model_qint8.onnx (implies --onnx)")
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset (default 18)")
    p.add_argument("--truncate-dim", type=int, default=None, metavar="N", help="ST loads it with N dimensions (Matryoshka)")
    add_data_options(p, "STS data for the int8 check")
    p.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="upload the finished export to this hub repo")
    add_device_option(p)
    p.set_defaults(func=cmd_export, extra_ok=False)

    p = sub.add_parser("demo", help="the loss core off text: 'digits' (SupCon on 8x8 images), 'toy' (2-D temperature toy)")
    p.add_argument("demo", choices=("digits", "toy"))
    p.add_argument("--output-dir", type=Path, default=None, help="where figures go (default runs/demos/<demo>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30, help="digits: training epochs")
    p.add_argument("--temperature", type=float, default=0.1, help="digits: SupCon temperature")
    p.add_argument("--no-tsne", action="store_true", help="digits: skip the t-SNE figure")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.99, 0.5, 0.05, 0.01, 0.001], help="toy: one run per tau")
    p.add_argument("--steps", type=int, default=1000, help="toy: SGD steps per run")
    p.add_argument("--similarity", choices=("dot", "cosine"), default="dot", help="toy: similarity of tanh features")
    p.set_defaults(func=cmd_demo, extra_ok=False)

    p = sub.add_parser("temperature", help="softmax, loss and per-negative gradient weight vs tau; hardness-awareness plot")
    p.add_argument("--similarities", type=float, nargs="+", default=[0.5, 0.25, -0.45, -0.1], help="cosines, positive first")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.1, 0.05])
    p.add_argument("--output-dir", type=Path, default=Path("runs/demos/temperature"), help="where hardness.png goes")
    p.set_defaults(func=cmd_temperature, extra_ok=False)

    p = sub.add_parser("align-uniform", help="alignment (gold >= 4 pairs) and uniformity on STS-B (Wang & Isola 2020)")
    p.add_argument("model", help="anything 'simcse-kit evaluate' accepts")
    p.add_argument("--pooler", default=None, help="pooler for a plain HF model")
    add_data_options(p, "SentEval-layout data folder")
    p.add_argument("--split", choices=("dev", "test", "train"), default="dev", help="STS-B split")
    p.add_argument("--threshold", type=float, default=4.0, help="minimum gold score of a positive pair")
    p.add_argument("--json", type=Path, default=None, help="write results here")
    p.add_argument("--batch-size", type=int, default=128)
    add_device_option(p)
    p.set_defaults(func=cmd_align_uniform, extra_ok=False)

    p = sub.add_parser("mine", help="add a hard_neg column to sent0,sent1 pairs, mined with a model over the file's sentences")
    p.add_argument("pairs", type=Path, help="CSV or JSONL with sent0, sent1")
    p.add_argument("out", type=Path, help="CSV written with sent0, sent1, hard_neg")
    p.add_argument("--model", default=None, help="anything 'simcse-kit evaluate' accepts (default: the default model)")
    p.add_argument("--pooler", default=None, help="pooler for a plain HF model")
    p.add_argument("--top-k", type=int, default=10, help="candidates considered per anchor")
    p.add_argument("--margin", type=float, default=0.0, help="skip candidates with cos(a, c) > cos(a, pos) - margin")
    p.add_argument("--sampling-strategy", choices=("top", "random"), default="top", help="best candidate, or one of the top-k")
    p.add_argument("--seed", type=int, default=0, help="for --sampling-strategy random")
    p.add_argument("--batch-size", type=int, default=128)
    add_device_option(p)
    p.set_defaults(func=cmd_mine, extra_ok=False)

    p = sub.add_parser(
        "retrieval-tasks", help="write the retrieval tasks built from the shared data (MRPC, STS-B, SICK) as BEIR folders"
    )
    p.add_argument("out", type=Path, help="parent folder; each task goes to OUT/<task>/")
    p.add_argument("--tasks", nargs="+", default=None, help="mrpc-paraphrase stsb-similar sick-related (default: all)")
    p.add_argument("--data-root", type=Path, default=None, help="the shared data folder (default: as for evaluate)")
    p.set_defaults(func=cmd_retrieval_tasks, extra_ok=False)

    p = sub.add_parser("recipes", help="list the built-in recipes, or print one: recipes show NAME > my.yaml")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("name", nargs="?", default=None, help="with show: a recipe or suite name, e.g. unsup")
    p.set_defaults(func=cmd_recipes, extra_ok=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not args.extra_ok:  # only train/sweep take config overrides
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "filelock", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # transformers 5 lists every unsharded layer at WARNING on a plain single-device load.
    logging.getLogger("transformers.distributed.tensor_parallel").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return args.func(args, extra)
    except (ConfigError, DataError) as exc:
        print(f"simcse-kit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:  # a full disk or a read-only place: the environment, not a bug
        print(f"simcse-kit {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except Stopped as exc:  # SIGTERM / SIGUSR1 / Ctrl-C: a checkpoint is written
        print(f"simcse-kit {args.command}: {exc}", file=sys.stderr)
        if exc.checkpoint is not None:
            print(
                f"simcse-kit {args.command}: resume with: {resume_command(sys.argv[1:] if argv is None else argv)}",
                file=sys.stderr,
            )
        return STOPPED_STATUS
    except KeyboardInterrupt:  # a second Ctrl-C (or one outside training): no traceback, no checkpoint
        print(f"simcse-kit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
