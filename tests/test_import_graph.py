"""No import cycle among simcse_kit's modules (docs/architecture.md).

The layer table (tests/test_architecture.py) lets modules on one layer import each other,
so it cannot see a cycle inside a layer. This test builds the module-level import graph
with ``ast``, counting every import: at the top, inside functions and under
``if TYPE_CHECKING:`` (a type-only import is still a dependency a reader must follow,
and the cycle it hides comes back the day someone needs the name at run time).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "simcse_kit"


def module_name(path: Path, root: Path) -> str:
    """``simcse_kit.evaluation.sts`` for ``root/simcse_kit/evaluation/sts.py``; a package's
    ``__init__.py`` is the package itself."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``module -> modules of the same package it imports``, anywhere in its source.

    ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``;
    relative imports are resolved against the importing file's package. The parent
    packages Python imports on the way (``pkg/__init__.py`` for ``pkg.sub``) are not
    counted: a package importing its own submodules is no cycle.
    """
    root = package_dir.parent
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    names = {module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        own = module_name(path, root)
        package = own if path.name == "__init__.py" else own.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base)
        graph[own] = {t for t in targets if t in names and t != own}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # absent: not seen; 1: on the current path; 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_no_import_cycle_among_simcse_kit_modules() -> None:
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle (TYPE_CHECKING and function-level imports count): " + " -> ".join(cycle or [])


def write(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source, encoding="utf-8")
    return root / "pkg"


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Known answers: absolute, from-package, relative, function-level and TYPE_CHECKING
    imports are edges; a package's parent is not; names that are not modules point at
    their module."""
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",
            "pkg/a.py": "import pkg.b\nfrom pkg.sub import c\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import Thing\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from . import d\nfrom ..b import name\ndef f():\n    from pkg import e\n",
            "pkg/sub/d.py": "import torch\n",
            "pkg/e.py": "",
        },
    )
    assert import_graph(package) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.sub.d", "pkg.b", "pkg.e"},
        "pkg.sub.d": set(),
        "pkg.e": set(),
    }
    assert find_cycle(import_graph(package)) == ["pkg.b", "pkg.sub.c", "pkg.b"]  # b -> c (type only) -> b


def test_no_cycle_is_found_where_there_is_none(tmp_path: Path) -> None:
    package = write(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b, c\n", "pkg/b.py": "from pkg import c\n", "pkg/c.py": ""}
    )
    assert find_cycle(import_graph(package)) is None
