"""``simcse-kit recipes``: list the built-in recipes and suites, or print one
(:mod:`simcse_kit.config.recipes`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from simcse_kit.config.recipes import builtin_recipes, describe, find_recipe, recipe_folder
from simcse_kit.errors import ConfigError


def cmd_recipes(args: argparse.Namespace, extra: list[str]) -> int:
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


def register(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("recipes", help="list the built-in recipes, or print one: recipes show NAME > my.yaml")
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    p.add_argument("name", nargs="?", default=None, help="with show: a recipe or suite name, e.g. unsup")
    p.set_defaults(func=cmd_recipes, extra_ok=False)
