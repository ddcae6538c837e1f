"""Every key of a topics file, generated from the configuration model so the docs cannot drift.

`python -m cairn config-reference` prints it; the header of include/topics.yaml and
docs/configuration.md hold the same text, and a unit test keeps them equal. Each key shows its
type, its default and its field's description (the docstring under the field in
`cairn.config.TopicConfig`).
"""

from __future__ import annotations

import textwrap
import types
from datetime import timedelta
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from cairn.config import REPO, TopicConfig
from cairn.formats import FORMATS

WIDTH = 96
_NAME = 28  # the column descriptions start at

INTRO = """\
A topic entry holds these keys; `defaults` holds any of them but topic and pattern, and is
merged into every entry (an entry's own keys win). Unknown keys are errors. Durations are
seconds or e.g. 30m, 2h, 1d."""


def reference() -> str:
    """The reference as plain text, lines of at most `WIDTH` characters."""
    lines = _wrap(INTRO.replace("\n", " "), WIDTH)
    lines.append("")
    for name, info in _keys(TopicConfig):
        if name == "format_settings":
            for fmt in sorted(FORMATS):
                settings = FORMATS[fmt].Settings
                if settings is not None:
                    lines += _key(fmt, f"mapping ({fmt} topics)", "", info.description or "")
                    lines += [line for sub in _keys(settings) for line in _field(sub, fmt)]
            continue
        lines += _field((name, info))
        if name == "event_time":
            event_time = get_args(info.annotation)[0]
            lines += [line for sub in _keys(event_time) for line in _field(sub, name)]
    return "\n".join(lines) + "\n"


def _keys(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    return [(info.alias or name, info) for name, info in model.model_fields.items()]


def _field(item: tuple[str, FieldInfo], parent: str = "") -> list[str]:
    name, info = item
    dotted = f"{parent}.{name}" if parent else name
    default = "required" if info.is_required() else f"[{_value(info.default)}]"
    return _key(dotted, _type(info.annotation), default, info.description or "")


def _key(name: str, kind: str, default: str, description: str) -> list[str]:
    head = f"{name:<{_NAME - 1}} {kind} {default}".rstrip()
    body = _wrap(description, WIDTH - _NAME)
    return [head, *(" " * _NAME + line for line in body)]


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(_value(a) for a in args)
    if origin in (Union, types.UnionType):
        shown = [_type(a) for a in args if a is not type(None)]
        return " | ".join(shown) + (" | null" if type(None) in args else "")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if annotation is timedelta:
        return "duration"
    return {str: "text", int: "integer", float: "number", bool: "true | false"}.get(
        annotation, "any"
    )


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"{seconds // size}{unit}"
        return f"{seconds}s"
    return str(value).replace(str(REPO), "<repo>")
