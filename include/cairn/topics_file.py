"""The topics file: `include/topics.yaml`, or a folder of topics files (`topics.d/*.yaml`, one
per team or topic), read entry by entry into `cairn.config.TopicConfig`.

A mistake is reported (file, line, entry, field, message) and stops only what it describes: a
bad entry is skipped, a file that is not YAML loses its own entries, and the other topics still
load, so one typo does not take every topic's DAG down. Pattern entries become concrete topics
only in `LoadResult.resolve`, against the topic names Kafka reports; a topic two patterns
match loads from neither.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml
from pydantic import ValidationError
from yaml.nodes import Node

from cairn import yaml_lines
from cairn.config import INCLUDE_DIR, TopicConfig
from cairn.errors import PermanentError
from cairn.formats import FORMATS
from cairn.formats.base import FieldError

TOPICS_FILE = Path(os.environ.get("CAIRN_TOPICS_FILE", INCLUDE_DIR / "topics.yaml"))
"""The topics file, or folder of topics files, that the DAGs and the Spark job read;
`CAIRN_TOPICS_FILE` overrides it (a file or a folder, whichever it names)."""


@dataclass(frozen=True)
class TopicConfigError:
    """One mistake in a topics file, located so it can be fixed there."""

    entry: str  # "topic 'x'", "pattern 'y'", "entry #3", "defaults" or "file"
    field: str  # dotted field path, "" when the entry as a whole is wrong
    message: str
    file: str = ""  # the topics file it is in
    line: int | None = None  # 1-based, in that file

    def __str__(self) -> str:
        place = self.file + (f", line {self.line}" if self.line else "")
        entry = "" if self.entry == "file" else self.entry
        return ": ".join(p for p in (place, entry, self.field, self.message) if p)


@dataclass
class LoadResult:
    topics: list[TopicConfig]
    errors: list[TopicConfigError]
    files: list[Path]
    """Every topics file read, broken ones included (a clean file reports zero errors)."""

    def resolve(self, kafka_topic_names: Iterable[str]) -> LoadResult:
        """The concrete topics, sorted by topic: each pattern entry replaced by the topics it
        matches among these names (never internal `__` topics).

        Exact entries always count (a topic may be configured before it exists) and win over
        patterns, as the more specific: one is the way to settle an overlap. A topic that two
        patterns match and no exact entry names loads from neither, as a topic written twice:
        which pattern comes first is an accident of file names, and letting it win would let a
        new pattern quietly change where and how an archived topic is written. Its error names
        both patterns; their other topics still load.
        """
        chosen = {e.topic: e for e in self.topics if e.topic is not None}
        patterns = [e for e in self.topics if e.pattern is not None]
        errors = list(self.errors)
        for name in sorted(set(kafka_topic_names) - chosen.keys()):
            matching = [p for p in patterns if p.matches(name)]
            if len(matching) == 1:
                chosen[name] = matching[0].model_copy(update={"topic": name, "pattern": None})
            elif matching:
                errors.append(_overlap(name, matching))
        errors.sort(key=lambda e: (e.file, e.line or 0))
        return LoadResult([chosen[name] for name in sorted(chosen)], errors, self.files)


def _overlap(topic: str, patterns: list[TopicConfig]) -> TopicConfigError:
    """The error of a topic that several patterns match, placed at the first of them."""
    which = " and ".join(f"{p.label} ({p.written_at or 'not from a file'})" for p in patterns)
    message = (
        f"matched by {which}; archived by neither until one pattern matches it: narrow the "
        "patterns, or add an exact entry for the topic (it wins over patterns)"
    )
    first = patterns[0]
    return TopicConfigError(f"topic {topic!r}", "pattern", message, first._file, first._line)


class _Entry(NamedTuple):
    """One `topics` entry as written: its label, where it is, and its config if it is valid."""

    label: str
    file: Path
    line: int | None
    cfg: TopicConfig | None


def topic_files(path: Path) -> list[Path]:
    """The files `path` names: itself, or a folder's `*.yaml`/`*.yml` files (not hidden, not in
    subfolders) in name order, the conf.d convention."""
    if path.is_dir():
        return sorted(
            p
            for p in path.iterdir()
            if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file()
        )
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return [path]


def load_topics(path: str | Path) -> LoadResult:
    """Load every valid entry of a topics file, or of every topics file in a folder; collect
    what is wrong with the others, each error with its file and line.

    A mistake stops only what it describes: a file that is not YAML loses its own entries, a
    bad entry only itself. A topic (or pattern) written twice, in one file or two, loads from
    neither place: file order is an accident, and letting one copy win would let a new file
    quietly change where and how an archived topic is written; stopped, it is reported and its
    archive waits untouched until one copy is removed.
    """
    files = topic_files(Path(path))
    entries: list[_Entry] = []
    errors: list[TopicConfigError] = []
    for file in files:
        found, wrong = _load_file(file)
        entries += found
        errors += wrong
    places: dict[str, list[_Entry]] = {}
    for entry in entries:
        if not entry.label.startswith("entry #"):
            places.setdefault(entry.label, []).append(entry)
    topics = []
    for entry in entries:
        others = [o for o in places.get(entry.label, []) if o is not entry]
        if others:
            where = "; ".join(f"{o.file}, line {o.line}" for o in others)
            message = f"also defined at {where}; neither is loaded until one is removed"
            errors.append(TopicConfigError(entry.label, "", message, str(entry.file), entry.line))
        elif entry.cfg is not None:
            topics.append(entry.cfg)
    errors.sort(key=lambda e: (e.file, e.line or 0))
    return LoadResult(topics, errors, files)


def _load_file(path: Path) -> tuple[list[_Entry], list[TopicConfigError]]:
    """One file's entries and errors. `defaults` are merged into each entry shallowly (an
    entry's `event_time` replaces the default's whole). Each entry's format then checks it
    (`cairn.formats`), reading its schemas now so a missing or clashing .avsc is an entry error
    here, not a failed run later."""

    def error(entry: str, field: str, message: str, line: int | None) -> TopicConfigError:
        return TopicConfigError(entry, field, message, str(path), line)

    try:
        text = path.read_text(encoding="utf-8")
        doc, root = yaml_lines.parse(text)
        doc = doc or {}
    except yaml.YAMLError as err:
        line, message = yaml_lines.error_line(err)
        return [], [error("file", "", f"{message}; fix the file there", line)]
    except (OSError, UnicodeDecodeError) as err:
        return [], [error("file", "", f"cannot be read: {err}", None)]
    if not isinstance(doc, dict):
        return [], [error("file", "", "expected a mapping of 'defaults' and 'topics'", 1)]
    unknown = "unknown top-level key; expected 'defaults' and 'topics'"
    errors = [
        error("file", str(key), unknown, yaml_lines.line(root, str(key)))
        for key in doc
        if key not in ("defaults", "topics")
    ]
    defaults, defaults_node = doc.get("defaults") or {}, yaml_lines.child(root, "defaults")
    if not isinstance(defaults, dict) or {"topic", "pattern"} & set(defaults):
        line = yaml_lines.line(root, "defaults")
        errors.append(error("defaults", "", "must be a mapping without topic/pattern", line))
        defaults = {}
    items = doc.get("topics") or []
    if not isinstance(items, list):
        line = yaml_lines.line(root, "topics")
        errors.append(error("file", "topics", "must be a list of entries", line))
        items = []

    entries = []
    nodes = yaml_lines.child(root, "topics")
    for index, item in enumerate(items):
        label, node = _label(item, index), yaml_lines.child(nodes, index)
        line = yaml_lines.line(node, "")
        cfg, wrong = _check_entry(item, defaults, path, line)
        errors += [
            error(label, field, message, _field_line(node, defaults_node, field))
            for field, message in wrong
        ]
        entries.append(_Entry(label, path, line, cfg))
    return entries, errors


def _field_line(entry: Node | None, defaults: Node | None, field: str) -> int | None:
    """The line of `field` in the entry, or in `defaults` when only they set it."""
    first = field.split(".")[0]
    from_defaults = yaml_lines.child(entry, first) is None and yaml_lines.child(defaults, first)
    return yaml_lines.line(defaults if from_defaults else entry, field)


def _check_entry(
    item: object, defaults: dict, path: Path, line: int | None
) -> tuple[TopicConfig | None, list[tuple[str, str]]]:
    """The entry's config, or the (field, message) pairs that are wrong with it."""
    if not isinstance(item, dict):
        return None, [("", "entry must be a mapping")]
    try:
        cfg = TopicConfig.model_validate({**defaults, **item})
    except ValidationError as err:
        return None, _errors(err)
    cfg._base_dir, cfg._file, cfg._line = path.resolve().parent, str(path), line
    try:
        FORMATS[cfg.format].check(cfg)
    except FieldError as err:
        return None, [(err.field, str(err))]
    return cfg, []


def _label(entry: object, index: int) -> str:
    if isinstance(entry, dict):
        for key in ("topic", "pattern"):
            if isinstance(entry.get(key), str):
                return f"{key} {entry[key]!r}"
    return f"entry #{index + 1}"


def _errors(err: ValidationError) -> list[tuple[str, str]]:
    found = []
    for detail in err.errors(include_url=False):
        cause = (detail.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            found.append((cause.field, str(cause)))
            continue
        field = ".".join(str(p) for p in detail["loc"])
        found.append((field, str(cause) if isinstance(cause, ValueError) else detail["msg"]))
    return found


class TopicNotConfigured(PermanentError, LookupError):
    """A topic has no valid entry (none, a broken one, or two patterns match it): nothing of it
    can run until the topics file is fixed, and retrying will not fix it."""


SETTLED_NS = 2_000_000_000
"""A file modified this shortly before a load began may have changed after it was read (a
file's modification time is as coarse as the kernel's clock tick): its load is not trusted."""
_LOADED: dict[str, tuple[int, LoadResult]] = {}
"""Per topics path, the last load of it in this process and when (ns) the load began."""
_FOUND: dict[tuple[str, str], tuple[int, tuple[Path, ...], TopicConfig]] = {}
"""`find_topic`'s answers: when the load they came from began, the files they depend on."""


def find_topic(topic: str, path: str | Path = TOPICS_FILE) -> TopicConfig:
    """The configuration of one concrete topic (exact or pattern entry); `TopicNotConfigured`,
    naming the entry's mistakes (file, line, field), if the topic is not configured or its
    entry is invalid.

    One load of the topics files serves every topic until a topics file, or a file the entry
    names (its schemas), changes: the triggerer asks for every step of every run, and reading
    1,000 entries takes half a second."""
    key = (str(path), topic)
    found = _FOUND.get(key)
    if found is not None:
        began, depends, cfg = found
        if _depends(path, cfg) == depends and _unchanged(depends, began):
            return cfg
    cached = _LOADED.get(str(path))
    reused = cached is not None and _current(path, *cached)
    began, loaded = cached if cached is not None and reused else _load(path)
    cfg = _find_topic(topic, path, loaded)
    depends = _depends(path, cfg)
    if reused and not _unchanged(depends, began):
        began, loaded = _load(path)  # its schemas changed since that load: read them again
        cfg = _find_topic(topic, path, loaded)
        depends = _depends(path, cfg)
    _FOUND[key] = (began, depends, cfg)
    return cfg


def _load(path: str | Path) -> tuple[int, LoadResult]:
    """A new load of `path`, which later lookups of any topic share, and when it began."""
    began = time.time_ns()
    _LOADED[str(path)] = loaded = (began, load_topics(path))
    return loaded


def _current(path: str | Path, began: int, loaded: LoadResult) -> bool:
    """Whether the topics files are those a load read, none modified since it began."""
    return topic_files(Path(path)) == loaded.files and _unchanged(loaded.files, began)


def _depends(path: str | Path, cfg: TopicConfig) -> tuple[Path, ...]:
    """The files `cfg` was read from: the topics files and the files the entry names."""
    named = [cfg.schema_file] if cfg.schema_file else []
    named += FORMATS[cfg.format].files(cfg)
    return (*topic_files(Path(path)), *(cfg.base_dir / name for name in named))


def _unchanged(files: Iterable[Path], began: int) -> bool:
    """Whether none of `files` was modified (or removed) since a load that began at `began`."""
    try:
        return all(file.stat().st_mtime_ns < began - SETTLED_NS for file in files)
    except OSError:
        return False


def _find_topic(topic: str, path: str | Path, written: LoadResult) -> TopicConfig:
    loaded = written.resolve([topic])
    for cfg in loaded.topics:
        if cfg.topic == topic:
            return cfg
    own = [e for e in loaded.errors if e.entry == f"topic {topic!r}"]
    if own:
        raise TopicNotConfigured(f"{'; '.join(map(str, own))}; fix the entry")
    problems = [str(e) for e in loaded.errors]
    detail = f"; the topics files have errors: {'; '.join(problems)}" if problems else ""
    raise TopicNotConfigured(f"topic {topic!r} is not configured in {path}{detail}")
