"""``simcse-kit demo`` (the loss core off text: digits, the 2-D toy) and
``simcse-kit temperature`` (what tau does to the softmax and the gradient)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from simcse_kit.errors import ConfigError


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


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("demo", help="the loss core off text: 'digits' (SupCon on 8x8 images), 'toy' (2-D temperature toy)")
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

    p = add_parser("temperature", help="softmax, loss and per-negative gradient weight vs tau; hardness-awareness plot")
    p.add_argument("--similarities", type=float, nargs="+", default=[0.5, 0.25, -0.45, -0.1], help="cosines, positive first")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.5, 0.2, 0.1, 0.05])
    p.add_argument("--output-dir", type=Path, default=Path("runs/demos/temperature"), help="where hardness.png goes")
    p.set_defaults(func=cmd_temperature, extra_ok=False)
