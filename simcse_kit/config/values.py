"""A config value checked against its field's type: YAML's own scalar rules, then the type.

A recipe's values arrive read by YAML; a command-line override arrives as text and is read
here by the same rules (``3`` an int, ``0.5`` a float, ``true`` a bool, ``[64, 32]`` a
list), so a value means the same in a recipe and on the command line. Then the value must
be of the field's type; only lossless conversions are made (:func:`check_type`). Also the
YAML loader of recipes, which refuses a key given twice.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from simcse_kit.config.sections import AUTO, DATASET_KEYS, DatasetSpec
from simcse_kit.errors import ConfigError

__all__ = ["DuplicateKeyError", "RecipeShapeError", "UniqueKeyLoader", "check_type", "parse_value", "yaml_scalar"]

NULL_WORDS = ("none", "null", "~")
"""An optional key's "no value" as text: YAML's null words, and ``none`` as the help says it."""
PATHS = (str, list[str])
"""The types of a key that takes a path or a list of paths (a dataset's file, or its shards)."""


class _Mismatch(ValueError):
    """A value that is not of its key's type (turned into a ConfigError naming the key).

    Attributes:
        expected: what the value must be (``must be true, false or auto``); None: just
            not of the type, which :func:`parse_value` says with the type as written.
    """

    def __init__(self, expected: str | None = None, entry: str | None = None) -> None:
        super().__init__(expected or "is not of its key's type")
        self.expected = expected
        self.entry = entry  # a list's or mapping's entry at fault: the message names it, not the whole value


def yaml_scalar(text: str) -> Any:
    """``text`` read by YAML's own rules (``3`` an int, ``0.5`` a float, ``true`` a bool,
    ``[1, 2]`` a list); text YAML cannot read stays as it is, for the type check to name."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def check_type(value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` (a field's type without ``None``); raises ``_Mismatch`` (a ``ValueError``) if it is not one.

    Only lossless conversions: a whole float is an int, an int a float, a number given
    where text is expected its text (a folder named ``2024``).
    """
    if kind == (bool, str):  # a switch: True, False or "auto"
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() == AUTO:
            return AUTO
        raise _Mismatch("must be true, false or auto")
    if typing.get_origin(kind) is dict:  # a YAML mapping, or one written inline on the command line
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise _Mismatch("must be a mapping of names to texts, e.g. {query: 'query: '}")
    if typing.get_origin(kind) is list and typing.get_args(kind) == (DatasetSpec,):
        return dataset_specs(value)
    if kind == PATHS:  # a dataset's file: a path, or a list of them (its shards)
        if not isinstance(value, list):
            return check_type(value, str)
        if not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise _Mismatch("must be a path or a non-empty list of paths")
        return list(value)
    if typing.get_origin(kind) is list:  # a YAML list, or "a,b" on the command line
        (item,) = typing.get_args(kind)
        what = "names" if item is str else f"{item.__name__}s"
        if isinstance(value, str) and value.strip().startswith("["):
            value = yaml_scalar(value)
        elif isinstance(value, str):
            pieces = [v.strip() for v in value.split(",") if v.strip()]
            value = pieces if item is str else [yaml_scalar(v) for v in pieces]
        if not isinstance(value, list):
            raise _Mismatch(f"must be a list of {what} (or a comma-separated string)")
        try:
            items = [check_type(v, item) for v in value]
        except _Mismatch:
            raise _Mismatch(f"must be a list of {what} (or a comma-separated string)") from None
        return [v.strip() for v in items if v.strip()] if item is str else items
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and is_number and float(value).is_integer():
        return int(value)
    if kind is float and is_number:
        return float(value)
    if kind is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as text
        try:
            return float(value)
        except ValueError:
            pass
    if kind is str and (isinstance(value, str) or is_number):
        return str(value)
    if kind is str and isinstance(value, bool):
        raise _Mismatch("is not a valid str (quote it: YAML reads yes/no/on/off as true/false)")
    raise _Mismatch()


def parse_value(value: Any, annotation: Any, declared: str, key: str, source: str) -> Any:
    """A key's value from a recipe (already read by YAML) or the command line (text, read
    here by YAML's scalar rules unless the key is text), checked against the key's type.

    Args:
        value: The value as given.
        annotation: The field's type (``int | None``, ``list[str]``, ``bool | str``).
        declared: The type as written, for the error message.
        key: The dotted key (``train.batch_size``), for the error message.
        source: Where the value came from (a recipe's path, ``command line``).

    Raises:
        ConfigError: naming the source, the key, the value and the type expected.
    """
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    kinds = tuple(a for a in args if a is not type(None))
    if type(None) in args and (value is None or (isinstance(value, str) and value.strip().lower() in NULL_WORDS)):
        return None
    kind = kinds[0] if len(kinds) == 1 else kinds
    # Text stays text for a text key (`--mixed-precision no` is "no", not YAML's false); a list
    # reads its own "a,b" form.
    text_key = kind is str or typing.get_origin(kind) is list
    # A path stays text, and a list of paths is written as one, "[a.txt, b.txt]".
    text_key |= kind == PATHS and not (isinstance(value, str) and value.strip().startswith("["))
    parsed = yaml_scalar(value) if isinstance(value, str) and not text_key else value
    try:
        return check_type(parsed, kind)
    except _Mismatch as exc:
        expected = f"is not a valid {declared}" if exc.expected is None else exc.expected
        if exc.entry is not None:
            raise ConfigError(f"{source}: config key {key!r} entry {exc.entry}: {expected}") from None
        raise ConfigError(f"{source}: config key {key!r} = {value!r} {expected}") from None


def dataset_specs(value: Any) -> list[DatasetSpec]:
    """``data.datasets`` as a recipe writes it, a list of mappings or a mapping of name ->
    mapping, as :class:`~simcse_kit.config.sections.DatasetSpec` s; a list entry without a
    ``name`` is named by its file's stem. Each value is checked against its field's type
    and the spec's rules (:meth:`~simcse_kit.config.sections.DatasetSpec.problems`).

    Raises:
        ValueError: ``_Mismatch``, naming the entry (its name, else its place in the list) and the problem.
    """
    if isinstance(value, str) and value.strip().startswith(("[", "{")):  # written inline on the command line
        value = yaml_scalar(value)
    entries: list[tuple[str, Any, str | None]]
    if isinstance(value, dict):
        entries = [(repr(str(name)), spec, str(name)) for name, spec in value.items()]
    elif isinstance(value, list):
        entries = [(f"{i + 1} of the list", spec, None) for i, spec in enumerate(value)]
    else:
        raise _Mismatch("must be a list of datasets or a mapping of name -> dataset (docs/data.md)")
    hints = typing.get_type_hints(DatasetSpec)
    specs: list[DatasetSpec] = []
    for label, spec, name in entries:
        if not isinstance(spec, dict):
            raise _Mismatch(f"must be a mapping with keys {list(DATASET_KEYS)}, got {spec!r}", label)
        unknown = sorted(str(k) for k in spec if k not in DATASET_KEYS)
        if unknown:
            raise _Mismatch(f"unknown key(s) {unknown}; a dataset has {list(DATASET_KEYS)}", label)
        if name is not None and spec.get("name", name) != name:
            raise _Mismatch(f"name {spec['name']!r} differs from its key; give the name once", label)
        first = spec.get("file", "")
        first = first[0] if isinstance(first, list) and first else first
        values: dict[str, Any] = {"name": name or Path(str(first)).stem} | {
            k: v for k, v in spec.items() if k != "name" or name is None
        }
        fields = {f.name: str(f.type) for f in dataclasses.fields(DatasetSpec)}
        for key, given in values.items():
            try:
                values[key] = parse_value(given, hints[key], fields[key], key, "")
            except ConfigError:
                raise _Mismatch(f"{key} = {given!r} is not a valid {fields[key]}", label) from None
        made = DatasetSpec(**values)
        if any(spec.name == made.name for spec in specs):
            raise _Mismatch("the name is given twice; each dataset needs its own name", repr(made.name))
        problems = made.problems()
        if problems:
            raise _Mismatch(problems[0], label if name is None else repr(made.name))
        specs.append(made)
    return specs


#: A recipe is a few dozen values; aliases expanding past this are nested aliases (a
#: "billion laughs": 9 levels of 9 aliases are 387 million values, which an error message
#: quoting the value, or any walk over it, would never finish).
MAX_EXPANDED_NODES = 10_000


class RecipeShapeError(yaml.YAMLError):
    """A recipe YAML can read but no recipe can be: a key given twice, a key that is not a
    name, aliases that expand too far (:class:`UniqueKeyLoader`)."""


class DuplicateKeyError(RecipeShapeError):
    """A mapping key given twice (:class:`UniqueKeyLoader`)."""


def expanded_size(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """How many values ``node`` stands for with every alias written out (shared nodes
    counted once per use, computed once each: linear in the document's size)."""
    sizes = {} if sizes is None else sizes
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a recursive alias (&a [*a]) counts once rather than forever
    if isinstance(node, yaml.MappingNode):
        size = 1 + sum(expanded_size(k, sizes) + expanded_size(v, sizes) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(expanded_size(item, sizes) for item in node.value)
    else:
        size = 1
    sizes[id(node)] = size
    return size


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error naming the key
    and both lines (PyYAML keeps the last silently: a recipe's earlier setting vanishes), a
    key must be a name (``? [a, b]`` is a list), and aliases may not expand past
    :data:`MAX_EXPANDED_NODES` values."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and (size := expanded_size(node)) > MAX_EXPANDED_NODES:
            raise RecipeShapeError(
                f"its aliases expand to {size:,} values (nested aliases); a recipe is at most "
                f"{MAX_EXPANDED_NODES:,}: write the values out"
            )
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):  # ? [a, b]: unhashable, and never a key name
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise RecipeShapeError(f"line {line}: a key is a {kind}; keys are names such as batch_size")
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKeyError(f"key {key!r} is given twice, on lines {seen[key]} and {line}; keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)
