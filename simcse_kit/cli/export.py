"""``simcse-kit export``: a verified sentence-transformers folder (optionally ONNX, int8,
uploaded to the hub) from a run or model folder."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from simcse_kit.cli.options import add_data_options, add_device, add_trust
from simcse_kit.config.recipes import senteval_dir
from simcse_kit.errors import ConfigError


def check_export_options(args: argparse.Namespace) -> None:
    """Options that would fail (or be silently replaced) only after the export's work:
    an ONNX opset the exporter does not write, an upload with the hub offline."""
    if args.opset is not None:
        import onnx  # the [onnx] extra; --opset means an ONNX export

        from simcse_kit.export.onnx import MIN_OPSET

        highest = onnx.defs.onnx_opset_version()
        if not MIN_OPSET <= args.opset <= highest:
            # Asked for less, the dynamo exporter wrote opset 18 and recorded 18: not the graph asked for.
            raise ConfigError(
                f"--opset {args.opset}: must be in [{MIN_OPSET}, {highest}] (LayerNormalization needs opset 17; "
                "the exporter writes no lower)"
            )
    if args.push_to_hub is not None:
        from huggingface_hub import constants
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        if constants.HF_HUB_OFFLINE:
            raise ConfigError(
                f"--push-to-hub {args.push_to_hub}: the hub is offline (HF_HUB_OFFLINE=1); export without it and upload later"
            )
        try:
            validate_repo_id(args.push_to_hub)
        except HFValidationError as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--push-to-hub {args.push_to_hub}: not a hub repo id ({reason})") from None


def cmd_export(args: argparse.Namespace, extra: list[str]) -> int:
    from simcse_kit.export import ExportError, export_model

    check_export_options(args)  # before the model is loaded and the export built
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
            calibration=args.calibration,
            trust_remote_code=args.trust_remote_code,
            # STS data is read only for the int8 check: exporting needs no data root otherwise.
            data_dir=senteval_dir(args.data_dir, args.data_root) if args.quantize else None,
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


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("export", help="write a verified sentence-transformers folder (with model card) from a run or model")
    p.add_argument("source", help="a simcse-kit run folder or model folder")
    p.add_argument("out_dir", type=Path, help="the export folder (appears only complete and verified)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at OUT_DIR (any other folder is refused)")
    p.add_argument(
        "--no-normalize", action="store_true", help="no Normalize module (default: kept from the base / added for cosine)"
    )
    p.add_argument(
        "--onnx", action="store_true", help="also write onnx/model.onnx: encoder + pooling as one graph (needs simcse-kit[onnx])"
    )
    p.add_argument("--quantize", choices=("int8",), default=None, help="also write onnx/model_quantized.onnx (implies --onnx)")
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset (default 18)")
    p.add_argument("--truncate-dim", type=int, default=None, metavar="N", help="ST loads it with N dimensions (Matryoshka)")
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="sentences (one a line, or CSV/JSONL sent0) whose per-dimension ranges ship as quantization.json for int8 "
        "vectors (default: the run's training file, first 10,000 distinct sentences)",
    )
    add_data_options(p, "STS data for the int8 check")
    p.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="upload the finished export to this hub repo")
    add_device(p)
    add_trust(p)
    p.set_defaults(func=cmd_export, extra_ok=False)
