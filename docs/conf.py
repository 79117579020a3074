"""Sphinx configuration: the guide pages (Markdown, through myst-parser) and the API reference
generated from the docstrings (autodoc + napoleon for the Google style).

Build (what ``.ci/run`` runs; ``-n -W``: every cross-reference must resolve, warnings fail)::

    python -m sphinx -W --keep-going -n -b html docs /tmp/site
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

from docutils.nodes import Element
from pygments.lexers import JsonLexer, TextLexer
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.domains.python import PythonDomain
from sphinx.environment import BuildEnvironment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's simcse_kit, not an installed copy

import simcse_kit  # noqa: E402

project = "simcse-kit"
release = version = simcse_kit.__version__
copyright = "simcse-kit authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "accelerate", "figures/*.md"]
html_theme = "alabaster"
html_title = f"simcse-kit {release}"

# The pages link to each other's headings (`losses.md#a-teachers-scores-...`): GitHub's anchors.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# undoc-members: the docstrings refer to module constants (``:data:`FORMAT```) that carry no docstring.
# ignore-module-all: a module documents what it defines; a name it re-exports in __all__ is
# documented where it is defined (two entries for one object make every reference ambiguous).
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True, "ignore-module-all": True}
# A torch.nn.Module subclass's forward would otherwise show torch's docstring (and its references).
autodoc_inherit_docstrings = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# A class's "Attributes:" section as fields of the class: the dataclass fields are documented
# as members already (undoc-members), and two descriptions of one name are a warning.
napoleon_use_ivar = True

nitpicky = True
# No network at build time (CI reaches only package registries), so intersphinx has no
# inventories for the libraries below: references to their names cannot resolve. Ignored by
# the library's name only; every ``simcse_kit`` name must resolve.
OTHER_LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "sentence_transformers",
    "numpy",
    "np",
    "scipy",
    "sklearn",
    "pyarrow",
    "faiss",
    "onnx",
    "onnxruntime",
    "tokenizers",
    "peft",
    "matplotlib",
    "yaml",
    "tqdm",
    "safetensors",
    "huggingface_hub",
    "deepspeed",
    "filelock",
    "pytrec_eval",
    "fastembed",
    "argparse",
    "collections",
    "concurrent",
    "contextlib",
    "dataclasses",
    "enum",
    "io",
    "json",
    "logging",
    "multiprocessing",
    "os",
    "pathlib",
    "random",
    "re",
    "signal",
    "subprocess",
    "threading",
    "types",
    "typing",
    "typing_extensions",
    "abc",
    "functools",
    "itertools",
    "mmap",
    "queue",
    "tempfile",
    "shutil",
    "hashlib",
    "importlib",
    "warnings",
    "zipfile",
    "string",
)
# Annotations name these bare (imported only under TYPE_CHECKING, or by their short name).
OTHER_NAMES = (
    "Path",
    "Tensor",
    "nn.Module",
    "Accelerator",
    "DataLoader",
    "Dataset",
    "PreTrainedModel",
    "PreTrainedTokenizerBase",
    "LoraConfig",
    "SentenceTransformer",
    "Figure",
    "Axes",
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(map(re.escape, OTHER_LIBRARIES))})(\..*)?"),
    (r"py:.*", rf"({'|'.join(map(re.escape, OTHER_NAMES))})"),
]


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _lookup(module_name: str | None, target: str) -> object | None:
    """What ``target`` names, read as Python reads it in ``module_name``: a name that module
    imported (``masks.guided_mask``, ``load_encoder``) or a full dotted path."""
    first, *rest = target.split(".")
    module = _module(module_name) if module_name else None
    if module is not None and hasattr(module, first):
        obj: object = getattr(module, first)
    else:
        parts, obj = target.split("."), None
        for end in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            obj, rest = _module(".".join(parts[:end])), parts[end:]
            if obj is not None:
                break
        if obj is None:
            return None
    for name in rest:
        if not hasattr(obj, name):
            return None
        obj = getattr(obj, name)
    return obj


def _defined_name(obj: object, attr: str, domain: PythonDomain) -> str | None:
    """The documented name of ``obj`` where it is defined (not where it is re-exported)."""
    if inspect.ismodule(obj):
        return obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and f"{module}.{qualname}" in domain.objects:
        return f"{module}.{qualname}"
    # A constant carries no __module__: the documented module attribute of the same name that
    # is this object, if only one is (small ints and strings are shared objects: two modules'
    # FORMAT = 2 are one object, and the reference is then left for its author to qualify).
    found = [
        name
        for name in domain.objects
        if name.startswith("simcse_kit.")
        and name.rpartition(".")[2] == attr
        and getattr(sys.modules.get(name.rpartition(".")[0]), attr, None) is obj
    ]
    return found[0] if len(found) == 1 else None


def resolve_as_python_does(app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: Element) -> Element | None:
    """Resolve a ``simcse_kit`` reference the py domain missed because it names an object the
    way its module's code does: through a re-export (``simcse_kit.evaluation.DevEvaluator``)
    or a name the module imported (``losses.contrastive_loss`` in ``training/objective/objectives.py``).
    The object is imported and linked where it is defined; a name that does not exist still
    fails the build."""
    if node.get("refdomain") != "py":
        return None
    module_name, target = node.get("py:module"), node["reftarget"]
    if not (target.startswith("simcse_kit.") or (module_name or "").startswith("simcse_kit")):
        return None
    obj = _lookup(module_name, target)
    domain = env.domains["py"]
    assert isinstance(domain, PythonDomain)
    name = None if obj is None else _defined_name(obj, target.rpartition(".")[2], domain)
    if name is None or name == target:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name, node, contnode)


_PROSE: dict[str, list[str]] = {}


def keep_prose(app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    """Before napoleon (priority 400): keep a constant's or property's docstring as written."""
    if what in ("attribute", "data", "property"):
        _PROSE[name] = list(lines)


def restore_prose(app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    """After napoleon (priority 600): put it back. Napoleon reads the first line of such a
    docstring as ``type: description``, so ``"The hard-negative column: one text ..."`` became a
    type named "The hard-negative column"; here types are the annotations and these docstrings
    are sentences."""
    if name in _PROSE:
        lines[:] = _PROSE.pop(name)


def readable_defaults(
    app: Sphinx, what: str, name: str, obj: object, options: object, signature: str | None, return_annotation: str | None
) -> tuple[str | None, str | None] | None:
    """A dataclass field with ``default_factory`` shows its default as ``<factory>``, which is
    not Python: the signature then fails to parse and its commas split ``dict[str, float]``
    apart (a broken reference each). Shown as ``...``: a default built per instance."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


# The pages link to BENCHMARKS.md where GitHub shows it, at the repo's root (``../BENCHMARKS.md``
# from docs/, ``BENCHMARKS.md`` from README.md); in the site it is the page benchmarks.md,
# which includes it. Outside the source folder, the link would name no page.
BENCHMARKS_LINK = re.compile(r"\]\((?:\.\./)?BENCHMARKS\.md")


def link_benchmarks_page(app: Sphinx, docname: str, source: list[str]) -> None:
    source[0] = BENCHMARKS_LINK.sub("](benchmarks.md", source[0])


def link_benchmarks_page_included(app: Sphinx, path: Path, docname: str, content: list[str]) -> None:
    content[0] = BENCHMARKS_LINK.sub("](benchmarks.md", content[0])


def setup(app: Sphinx) -> None:
    # docs/data.md's examples of the training files: JSON Lines (one JSON value a line) and CSV.
    app.add_lexer("jsonl", JsonLexer)
    app.add_lexer("csv", TextLexer)
    app.connect("source-read", link_benchmarks_page)
    app.connect("include-read", link_benchmarks_page_included)
    app.connect("missing-reference", resolve_as_python_does)
    app.connect("autodoc-process-docstring", keep_prose, priority=400)
    app.connect("autodoc-process-docstring", restore_prose, priority=600)
    app.connect("autodoc-process-signature", readable_defaults)
