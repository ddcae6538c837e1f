"""Cairn's metric samples in Prometheus' text exposition format (version 0.0.4).

The metric names live in `cairn.views.metrics` (dotted, as StatsD takes them); Prometheus allows
only `[a-zA-Z_:][a-zA-Z0-9_:]*`, so dots become underscores and counters gain `_total`. A family's
`# HELP` and `# TYPE` lines come once, before all of its samples, as the format requires; help
text escapes `\\` and newlines, label values also `"`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from cairn.views.metrics import Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(sample: Sample) -> str:
    """`cairn.records_archived` (a counter) → `cairn_records_archived_total`."""
    name = _INVALID_NAME.sub("_", sample.name)
    if name[:1].isdigit():
        name = "_" + name
    if sample.kind == "counter" and not name.endswith("_total"):
        name += "_total"
    return name


def exposition(samples: Iterable[Sample]) -> str:
    """The samples as one scrape's body, families in first-seen order."""
    families: dict[str, list[Sample]] = {}
    for sample in samples:
        families.setdefault(metric_name(sample), []).append(sample)
    lines = []
    for name, members in families.items():
        first = members[0]
        lines.append(f"# HELP {name} {_escape_help(first.help)}")
        lines.append(f"# TYPE {name} {first.kind}")
        lines += [f"{name}{_labels(s.labels)} {_value(s.value)}" for s in members]
    return "\n".join(lines) + "\n" if lines else ""


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    pairs = (f'{_label_name(k)}="{_escape_label(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + ",".join(pairs) + "}"


def _label_name(name: str) -> str:
    clean = _INVALID_LABEL.sub("_", name)
    return "_" + clean if clean[:1].isdigit() else clean


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
