"""Where a key sits in a YAML document, so a config error can name its line, not just its field.

PyYAML's `safe_load` drops positions; its node tree (`yaml.compose`) keeps them. `line` walks
that tree along a field path (`event_time.encoding`) and returns the 1-based line of the
deepest key it reaches.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML was built with it: ~10× the pure-Python one, which took a second
to read a topics file of 1,000 entries twice, and the triggerer reads it for every step it runs."""


def parse(text: str) -> tuple[Any, Node | None]:
    """The document's data (as `yaml.safe_load` gives it) and its node tree (None for an empty
    document); raises yaml.YAMLError, with the pure-Python parser's message, which says what it
    expected where libyaml's often does not."""
    try:
        return _load(text)
    except yaml.YAMLError as fast:
        try:
            yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as err:
            raise err from None
        raise fast from None


def _load(text: str) -> tuple[Any, Node | None]:
    """One pass of the parser for both: the data is constructed from the node tree, as
    `yaml.load` does after composing it (parsing twice was a third of a 1,000-topic file's read)."""
    loader = FAST(text)
    try:
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    finally:
        loader.dispose()


def child(node: Node | None, key: str | int) -> Node | None:
    """The value node under `key` of a mapping, or item `key` of a sequence (None if absent)."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if k.value == key:
                return v
    if isinstance(node, SequenceNode) and isinstance(key, int) and key < len(node.value):
        return node.value[key]
    return None


def line(node: Node | None, field: str) -> int | None:
    """The line of the deepest key of dotted `field` found under `node` (the node's own line if
    none is found; None without a node)."""
    if node is None:
        return None
    found = node.start_mark.line + 1
    for part in field.split(".") if field else []:
        if not isinstance(node, MappingNode):
            break
        pair = next(((k, v) for k, v in node.value if k.value == part), None)
        if pair is None:
            break
        found, node = pair[0].start_mark.line + 1, pair[1]
    return found


def error_line(err: yaml.YAMLError) -> tuple[int | None, str]:
    """A parse error's 1-based line, and its message with the column."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is None:
        return None, f"not valid YAML: {problem}"
    return mark.line + 1, f"not valid YAML at column {mark.column + 1}: {problem}"
