"""The package's shape, checked against its imports (docs/architecture.md).

(a) Layers point down: a module imports only modules on its own layer or below, function-
level imports included. (b) Other libraries' internals stay at arm's length: outside
``simcse_kit/model/fastpath/`` no module touches a private name of torch, transformers or
accelerate (``fastpath/internals.py`` is the one marked module for those).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "simcse_kit"

# docs/architecture.md's floor table, by package: a folder covers every module in it.
LAYERS: dict[int, tuple[str, ...]] = {
    1: ("errors", "files", "core/"),
    2: ("config/",),
    3: ("model/",),
    4: ("data/",),
    5: ("evaluation/",),
    6: ("training/", "tools/", "export/"),
    7: ("demos/",),
    8: ("cli/",),
}
LAYER_OF = {name.rstrip("/"): layer for layer, names in LAYERS.items() for name in names}
PRIVATE_OK = ("model", "fastpath")  # the one subpackage allowed to touch other libraries' internals
GUARDED = ("torch", "transformers", "accelerate")
# The loss core is the method in torch alone: the image demo and readers of the method need nothing else.
CORE_MAY_IMPORT = {"torch", "__future__", "collections", "dataclasses", "hashlib", "math", "typing"}
MAX_TOP_LEVEL = 13


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def unit(path: Path) -> str:
    """The floor-table entry a file belongs to: its top-level package (``model`` for
    ``model/fastpath/bf16.py``) or module (``errors``); ``""`` for the package's own
    ``__init__.py``."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    return "" if rel.parts == ("__init__",) else rel.parts[0]


def is_private_ok(path: Path) -> bool:
    return path.relative_to(PACKAGE).parts[: len(PRIVATE_OK)] == PRIVATE_OK


def imported_units(path: Path, package: tuple[str, ...] | None = None) -> set[tuple[str, int]]:
    """``(unit, line)`` of every ``simcse_kit`` module that ``path`` imports, anywhere in it
    (function bodies included). ``package``: the file's package, for relative imports
    (default: from its place under the repo)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if package is None:
        package = path.relative_to(REPO).with_suffix("").parts[:-1]
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            # "from simcse_kit import losses" names a module; "from simcse_kit.x import y", x.
            names = [f"{base}.{alias.name}" for alias in node.names] if base == "simcse_kit" else [base]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "simcse_kit" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def test_the_table_is_the_documents_table() -> None:
    """The table above is docs/architecture.md's, so the two cannot drift apart."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d) \| ([^|]+) \|", doc, flags=re.MULTILINE)
    assert {int(layer): tuple(re.findall(r"`([^`]+)`", names)) for layer, names in rows} == LAYERS


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md is checked against the packages: each module is named there (in
    backticks, alone or in a path), so a new module cannot go unmentioned."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = {word for quoted in re.findall(r"`([^`]+)`", doc) for word in re.split(r"[\s/.,:()]+", quoted)}
    unnamed = [str(p.relative_to(PACKAGE)) for p in modules() if p.stem != "__init__" and p.stem not in named]
    assert not unnamed, f"docs/architecture.md never names {unnamed}"


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, its docstring left out."""
    first = node.body[0]
    docstring = first.end_lineno - first.lineno + 1 if ast.get_docstring(node) is not None and first.end_lineno else 0
    return (node.end_lineno or node.lineno) - node.lineno + 1 - docstring


def test_training_functions_are_short() -> None:
    """Wiring a run is a short sequence of named steps (build_run, finish), and nothing in
    training/ is a wall of code (issue 47: build_run was 163 lines, finish 95)."""
    lengths = {}
    for path in modules():
        if path.relative_to(PACKAGE).parts[0] != "training":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths[f"{path.relative_to(PACKAGE)}:{node.name}"] = code_lines(node)
    assert lengths["training/wiring/run.py:build_run"] <= 60
    assert lengths["training/wiring/run.py:finish"] <= 60
    assert not {k: n for k, n in lengths.items() if n > 80}


def test_the_top_level_is_small() -> None:
    """The folder tree is the architecture: a handful of role packages, not a flat list."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py"))
    assert len(entries) <= MAX_TOP_LEVEL, entries
    assert {e.removesuffix(".py") for e in entries} - {"__init__"} == set(LAYER_OF)


def test_the_core_imports_torch_alone() -> None:
    outside = []
    for path in (PACKAGE / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            outside += [
                f"{path.name}:{node.lineno}: {n}"
                for n in names
                if n.split(".")[0] not in CORE_MAY_IMPORT and not n.startswith("simcse_kit.core")
            ]
    assert not outside, outside


def test_every_module_has_a_layer() -> None:
    missing = sorted({unit(p) for p in modules()} - set(LAYER_OF) - {""})
    assert not missing, f"modules missing from the layer table in docs/architecture.md: {missing}"


def unnamed_modules(doc: str, files: list[Path]) -> list[str]:
    """The module files (under ``simcse_kit/``, ``__init__.py`` aside: the floor table names the
    packages) that ``doc`` does not name. A module is named by its path in backticks
    (`` `data/corpus.py` ``) or, in its package's row of the floor table, by its name
    (`` `corpus` `` in the ``data/`` row; `` `fastpath/bf16.py` `` in the ``model/`` row; a
    top-level module, `` `errors` ``, in its own)."""
    rows: dict[str, str] = {}
    for line in doc.splitlines():
        match = re.match(r"^\| \d \| ([^|]+) \|", line)
        for unit_name in re.findall(r"`([a-z_]+)/?`", match.group(1)) if match else ():
            rows[unit_name] = line
    unnamed = []
    for path in files:
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" or f"`{rel.as_posix()}`" in doc:
            continue
        row = rows.get(rel.parts[0] if len(rel.parts) > 1 else rel.stem, "")
        if f"`{rel.stem}`" in row or f"`{rel.relative_to(rel.parts[0]).as_posix()}`" in row:
            continue
        unnamed.append(rel.as_posix())
    return unnamed


def test_every_module_is_named_in_the_document() -> None:
    """docs/architecture.md names every module, so a newcomer's map has no blank patches."""
    unnamed = unnamed_modules((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"), modules())
    assert not unnamed, f"modules docs/architecture.md does not name (a line each there): {unnamed}"


def test_the_naming_rule_itself(tmp_path: Path) -> None:
    names = ("files.py", "data/corpus.py", "data/mixture.py", "model/fastpath/bf16.py")
    files = [tmp_path / "simcse_kit" / name for name in names]
    doc = (
        "| 4 | `data/` | `corpus` (the cache) |\n| 3 | `model/` | `fastpath/bf16.py` |\n"
        "see `data/mixture.py`; `mixture` elsewhere\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "simcse_kit")
        assert unnamed_modules(doc, files) == ["files.py"]
        assert unnamed_modules(doc.replace("`corpus`", "corpus"), files) == ["files.py", "data/corpus.py"]
        assert unnamed_modules("| 1 | `files` | the line reader |\n" + doc, files) == []
        # A module's name in another package's row does not count.
        assert unnamed_modules("| 3 | `model/` | `corpus` |\n`files.py`", files[:2]) == ["data/corpus.py"]


def test_every_module_has_an_api_page() -> None:
    """docs/api/ documents every module (``automodule``), so its docstrings are built and checked."""
    pages = "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs" / "api").glob("*.rst"))
    documented = set(re.findall(r"^\.\. automodule:: (\S+)$", pages, flags=re.MULTILINE))
    dotted = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in modules()}
    missing = sorted(dotted - documented - {"simcse_kit.cli.__main__"})  # __main__ runs the command on import
    assert not missing, f"modules without an automodule in docs/api/*.rst: {missing}"


def test_imports_point_down() -> None:
    upward = []
    for path in modules():
        own = unit(path)
        if own not in LAYER_OF:
            continue  # reported by test_every_module_has_a_layer
        for target, line in imported_units(path):
            if target in LAYER_OF and LAYER_OF[target] > LAYER_OF[own]:
                upward.append(
                    f"{path.relative_to(REPO)}:{line}: {own} (layer {LAYER_OF[own]}) imports {target} (layer {LAYER_OF[target]})"
                )
    assert not upward, "imports that point up the layer table:\n" + "\n".join(sorted(upward))


def test_the_import_scan_itself(tmp_path: Path) -> None:
    """Known answers: absolute, from-package, relative and function-level imports."""
    path = tmp_path / "probe.py"
    path.write_text(
        "import simcse_kit.core.losses\n"
        "from simcse_kit import files, config as cfg\n"
        "from simcse_kit.model.fastpath.bf16 import bf16_training\n"
        "from . import packing\n"
        "from ..cli import main\n"
        "import torch\n"
        "def f():\n"
        "    from simcse_kit.training.wiring.run import train\n",
        encoding="utf-8",
    )
    got = imported_units(path, package=("simcse_kit", "model"))
    assert got == {
        ("core", 1), ("files", 2), ("config", 2), ("model", 3), ("model", 4), ("cli", 5), ("training", 8),
    }  # fmt: skip


# --------------------------------------------------------------------------- private API


def own_private_names() -> set[str]:
    """``_names`` that simcse_kit defines itself (``self._x = ...``, ``def _f``, ``class _C``,
    ``_X = ...``): using those is not touching another library's internals."""
    names: set[str] = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if is_private(n)}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# Public by convention despite the underscore (namedtuple's API).
CONVENTIONAL = {"_asdict", "_replace", "_fields", "_make"}


def private_uses(path: Path, own: set[str]) -> list[str]:
    """Every private name of torch/transformers/accelerate that ``path`` touches.

    Imports: ``import torch._x``, ``from torch._x import y``, ``from transformers import _y``.
    Attributes: any ``_x`` on a name bound to one of those libraries or to something imported
    from them (``torch._foreach_copy_``, ``AcceleratorState._reset_state``); and any ``_x``
    that simcse_kit does not define itself, on anything but ``self``/``cls`` (``config.
    _attn_implementation`` on a transformers object), also as ``getattr(obj, "_x")``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded: set[str] = set()  # local names bound to the guarded libraries (or their contents)
    other: set[str] = set()  # local names bound to any other import (os, numpy, ...)
    hits: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                if alias.name.split(".")[0] in GUARDED:
                    guarded.add(local)
                    if any(is_private(part) for part in alias.name.split(".")):
                        hits.append(f"{node.lineno}: import {alias.name}")
                else:
                    other.add(local)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            root = node.module.split(".")[0]
            for alias in node.names:
                (guarded if root in GUARDED else other).add(alias.asname or alias.name)
                if root in GUARDED and any(is_private(p) for p in [*node.module.split("."), alias.name]):
                    hits.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in CONVENTIONAL:
            root = node.value
            while isinstance(root, ast.Attribute | ast.Call | ast.Subscript):
                root = root.func if isinstance(root, ast.Call) else root.value
            name = root.id if isinstance(root, ast.Name) else ""
            if name in guarded or (name not in ("self", "cls") and name not in other and node.attr not in own):
                hits.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
            and node.args[1].value not in own
        ):
            hits.append(f"{node.lineno}: {ast.unparse(node)}")
    return hits


def test_private_api_only_in_fastpath() -> None:
    own = own_private_names()
    offenders = [
        f"{path.relative_to(REPO)}:{hit}" for path in modules() if not is_private_ok(path) for hit in private_uses(path, own)
    ]
    assert not offenders, "private API of torch/transformers/accelerate outside simcse_kit/model/fastpath/:\n" + "\n".join(
        offenders
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\ntorch._foreach_copy_(a, b)", 1),
        ("from accelerate import state as s\ns.AcceleratorState._reset_state(reset_partial_state=False)", 1),
        ("from accelerate.state import AcceleratorState\nAcceleratorState._reset_state()", 1),
        ("x = model.config._attn_implementation", 1),
        ('x = getattr(getattr(m, "config", None), "_attn_implementation", "sdpa")', 1),
        ("from transformers.modeling_utils import _init_weights", 1),
        ("import torch._dynamo", 1),
        ("from torch.utils._pytree import tree_map", 1),
        ("self._cache = 1\nx = self._cache\ny = other._cache", 0),  # simcse_kit's own names
        ("import os\nos._exit(0)", 0),  # not a guarded library
        ("import torch\nx = torch.nn.functional.softmax\ny = p.__class__", 0),
    ],
)
def test_the_private_scan_itself(tmp_path: Path, source: str, expected: int) -> None:
    """The scan finds what it must (known answers), and nothing in public code."""
    path = tmp_path / "probe.py"
    path.write_text(source + "\n", encoding="utf-8")
    assert len(private_uses(path, own={"_cache"})) == expected, private_uses(path, own={"_cache"})


# --------------------------------------------------------------------------- README layout


def layout_block() -> str:
    """The README's layout block, built from each entry's own docstring (its first
    paragraph), so the two cannot drift apart. ``python tests/test_architecture.py`` writes it."""
    lines = []
    for layer in sorted(LAYERS):
        for name in LAYERS[layer]:
            path = PACKAGE / name.rstrip("/") / "__init__.py" if name.endswith("/") else PACKAGE / f"{name}.py"
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            summary = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
            lines.append(f"- `simcse_kit/{name}` (floor {layer}): {summary}")
    return "\n".join(lines)


LAYOUT_BEGIN, LAYOUT_END = "<!-- layout: generated by tests/test_architecture.py -->\n", "\n<!-- layout end -->"


def test_the_readme_layout_is_generated() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start, end = readme.index(LAYOUT_BEGIN) + len(LAYOUT_BEGIN), readme.index(LAYOUT_END)
    assert readme[start:end] == layout_block(), "README's layout block is stale: run `python tests/test_architecture.py`"


if __name__ == "__main__":
    text = (REPO / "README.md").read_text(encoding="utf-8")
    head, rest = text.split(LAYOUT_BEGIN)
    _, tail = rest.split(LAYOUT_END)
    (REPO / "README.md").write_text(head + LAYOUT_BEGIN + layout_block() + LAYOUT_END + tail, encoding="utf-8")
