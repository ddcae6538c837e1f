"""`status`, `files`, `find`, `cat` and `verify`: read-only looks at the archive.

The questions are answered in `cairn.views.finder`, `cairn.views.audit` and
`cairn.pipeline.run_record` (which the overview page also uses); these functions only print.
"""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from cairn.cli.common import (
    FOUND_PROBLEM,
    NONE,
    OK,
    USAGE,
    UsageError,
    day_arg,
    err,
    out,
    show_bytes,
    show_millis,
    show_offsets,
    show_size,
    show_time,
    storage_for,
    table_counter,
)
from cairn.cli.error_lines import explain
from cairn.config import TopicConfig
from cairn.datafiles.avro_file import millis
from cairn.formats import registries_from_env
from cairn.pipeline import completeness, run_record
from cairn.pipeline.run_record import RunRecord
from cairn.protocol.tokens import Token
from cairn.storage.layout import parse_data_key
from cairn.topics_file import load_topics
from cairn.views.audit import audit_date
from cairn.views.date_check import verify_date
from cairn.views.finder import (
    ArchiveIndex,
    FoundRecord,
    NotArchived,
    configured_topics,
    date_files,
    quarantine_records,
)

TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


def add_parsers(groups: argparse._SubParsersAction) -> None:
    groups.add_parser("status", help="every configured topic: position, lag, last run")
    files = groups.add_parser("files", help="a date's partitioned and quarantine files")
    files.add_argument("topic")
    files.add_argument("--date", type=day_arg, required=True, help="YYYY-MM-DD")
    find = groups.add_parser("find", help="a record's backup copy and where it was filed")
    find.add_argument("topic")
    find.add_argument("partition", type=int)
    find.add_argument("offset", type=int)
    find.add_argument("--width", type=int, default=400, help="characters of value to show")
    cat = groups.add_parser("cat", help="quarantined records with their reasons")
    cat.add_argument("topic")
    which = cat.add_mutually_exclusive_group(required=True)
    which.add_argument("--date", type=day_arg, help="the quarantine's processing date")
    which.add_argument(
        "--file",
        "--key",  # the first spelling, kept
        dest="file",
        metavar="KEY",
        help="one quarantine file, by its key under the archive root (as `files` lists it)",
    )
    cat.add_argument("--limit", type=int, default=50, help="records to show (0: all)")
    cat.add_argument("--width", type=int, default=80, help="characters of value to show")
    verify = groups.add_parser(
        "verify", help="check a date against the backup: every record once, its proof, its files"
    )
    verify.add_argument("topic")
    verify.add_argument("--date", type=day_arg, required=True, help="YYYY-MM-DD")


def status(topics_file: str, debug: bool = False) -> int:
    """Every topic's row; a mistake in the topics files (a broken entry, a file that is not
    YAML, a topic two patterns match) or a topic whose archive cannot be read is one line on
    stderr, the others are still shown, and the exit code is the worst problem's."""
    loaded = configured_topics(load_topics(topics_file), storage_for)
    worst = USAGE if loaded.errors else OK
    for problem in loaded.errors:
        err().print(f"[yellow]misconfigured:[/] {escape(str(problem))}", soft_wrap=True)
    table = Table(
        "topic",
        "position",
        "offset lag",
        "time lag",
        "last run",
        "quarantine ratio",
        "last complete",
        title="Cairn topics",
        title_justify="left",
    )
    for cfg in loaded.topics:
        try:
            table.add_row(*_status_row(cfg))
        except Exception as why:
            if debug:
                raise
            code, line = explain(why, cfg)
            err().print(f"topic {escape(cfg.topic or '')}: {escape(line)}", soft_wrap=True)
            worst = max(worst, code)
    out().print(table)
    return worst


def _status_row(cfg: TopicConfig) -> list[str]:
    storage = storage_for(cfg)
    index = ArchiveIndex(storage, cfg.topic_name)
    seen = run_record.topic_status(storage, cfg.topic_name)
    last, newest = seen.last, index.newest()
    complete = completeness.last_complete(storage, cfg.topic_name)
    return [
        cfg.topic or "",
        show_offsets(index.position()),
        _offset_lag(last),
        NONE if last is None or last.time_lag_seconds is None else _seconds(last.time_lag_seconds),
        _last_run(last, newest),
        NONE if seen.quarantine_ratio is None else f"{seen.quarantine_ratio:.2%}",
        NONE if complete is None else complete.isoformat(),
    ]


def files(cfg: TopicConfig, args: argparse.Namespace) -> int:
    storage = storage_for(cfg)
    index = ArchiveIndex(storage, cfg.topic_name)
    found = date_files(storage, cfg, args.date)
    if not found:
        out().print(f"topic {cfg.topic}: no partitioned or quarantine files for {args.date}")
        return FOUND_PROBLEM
    table = Table(
        "kind",
        "folder",
        "key",
        "records",
        "size",
        "committed by",
        title=f"{cfg.topic} {args.date}",
        title_justify="left",
    )
    records = size = 0
    for f in found:
        here = index.entry(f.key)
        n, b = (here.entry.records, here.entry.bytes) if here else (None, storage.size(f.key))
        records, size = records + (n or 0), size + b
        by = here.by if here else "[red]no manifest[/]"
        table.add_row(f.kind, f.folder, f.key, NONE if n is None else str(n), show_size(b), by)
    table.add_section()
    table.add_row("total", "", f"{len(found)} files", str(records), show_size(size), "")
    out().print(table)
    out().print("(backup files are laid out by partition, not date: `find` names a record's)")
    return OK


def find(cfg: TopicConfig, args: argparse.Namespace) -> int:
    index = ArchiveIndex(storage_for(cfg), cfg.topic_name)
    try:
        found = index.find(args.partition, args.offset)
    except NotArchived as why:
        err().print(f"not found: {escape(str(why))}")
        return FOUND_PROBLEM
    out().print(_found_table(cfg, found, args.width))
    return OK


def cat(cfg: TopicConfig, args: argparse.Namespace) -> int:
    storage = storage_for(cfg)
    if args.file:
        named = parse_data_key(args.file)
        if named is None or named.kind != "quarantine" or named.topic != cfg.topic:
            raise UsageError(
                f"--file {args.file!r} is not the key of a quarantine file of topic "
                f"{cfg.topic!r}; `files {cfg.topic} --date D` lists them"
            )
        if not storage.exists(args.file):
            err().print(f"not found: {args.file}")
            return FOUND_PROBLEM
        keys = [args.file]
    else:
        keys = [f.key for f in date_files(storage, cfg, args.date) if f.kind == "quarantine"]
        if not keys:
            out().print(f"topic {cfg.topic}: nothing quarantined on {args.date}")
            return OK
    table = Table(
        "partition",
        "offset",
        "timestamp",
        "reason",
        "value",
        "file",
        title=f"quarantine of {cfg.topic}",
        title_justify="left",
    )
    shown = total = 0
    for key, row in quarantine_records(storage, keys):
        total += 1
        if args.limit and shown >= args.limit:
            continue
        shown += 1
        table.add_row(
            str(row["partition"]),
            str(row["offset"]),
            show_millis(row["timestamp"]),
            Text(row["reason"]),
            Text(show_bytes(row["value"], args.width)),
            key.rsplit("/", 1)[-1],
        )
    out().print(table)
    more = f" (showing {shown}; --limit 0 shows all)" if shown < total else ""
    out().print(f"{total} quarantined records in {len(keys)} files{more}")
    return OK


def verify(cfg: TopicConfig, args: argparse.Namespace) -> int:
    """The date against the backup (`cairn.views.date_check`): one line, then each file whose
    records, size or offsets differ from what committed it (`cairn.views.audit`)."""
    storage = storage_for(cfg)
    table = table_counter(cfg)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err(), transient=True) as progress:
        task = progress.add_task("reading", total=None)

        def reading(key: str) -> None:
            progress.update(task, description=f"reading {key.rsplit('/', 1)[-1]}")
            progress.advance(task)

        check = verify_date(storage, cfg, args.date, table, registries_from_env(), reading)
        audit = audit_date(storage, cfg, args.date, on_file=lambda f: reading(f.key))
    if not check.records and not check.missing:
        out().print(f"topic {cfg.topic}: no partitioned or quarantine files for {args.date}")
        return FOUND_PROBLEM
    damaged = [f for f in audit.files if f.problems]
    out().print(Text(check.line(), "green" if check.ok and not damaged else "bold red"))
    for f in damaged:
        out().print(Text(f"  {f.key}: {'; '.join(f.problems)}", "red"))
    for problem in audit.problems:
        out().print(Text(f"  {problem}", "red"))
    return OK if check.ok and not damaged and not audit.problems else FOUND_PROBLEM


def _found_table(cfg: TopicConfig, found: FoundRecord, width: int) -> Table:
    r = found.record
    table = Table(
        show_header=False,
        box=None,
        title=f"{cfg.topic} partition {r['partition']} offset {r['offset']}",
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "backup",
        f"{found.backup.key} ({found.backup.by}, {show_time(found.backup.committed_at)})",
    )
    kind = TIMESTAMP_TYPES.get(r["timestamp_type"], str(r["timestamp_type"]))
    table.add_row("timestamp", f"{show_millis(r['timestamp'])} ({kind}, {millis(r['timestamp'])})")
    table.add_row("key", Text(show_bytes(r["key"], width)))
    headers = ", ".join(f"{h['key']}={show_bytes(h['value'], 40)}" for h in r["headers"])
    table.add_row("headers", Text(headers or NONE))
    table.add_row("value", Text(show_bytes(r["value"], width)))
    if not cfg.parses:
        table.add_row("parsed", "raw topic: backup only")
    elif found.output is None:
        table.add_row("parsed", Text("MISSING: no partitioned or quarantine file holds it", "red"))
    else:
        table.add_row(found.output.kind, f"{found.output.key} ({found.output.by})")
        row = found.output_record or {}
        if found.output.kind == "quarantine":
            table.add_row("reason", Text(row.get("reason", "")))
        else:
            fields = {k: v for k, v in row.items() if not k.startswith("_kafka_")}
            table.add_row("record", Text(show_bytes(repr(fields).encode(), width)))
    return table


def _offset_lag(last: RunRecord | None) -> str:
    """Total offset lag when the last run committed, with the partitions still behind."""
    if last is None:
        return NONE
    if last.lag_error and not last.offset_lag:
        return "unknown"
    behind = {p: n for p, n in last.offset_lag.items() if n}
    return str(sum(behind.values())) + (f" ({show_offsets(behind)})" if behind else "")


def _seconds(seconds: float) -> str:
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m" if whole >= 3600 else f"{whole // 60}m"


def _last_run(last: RunRecord | None, newest: Token | None) -> str:
    """The last run's time and records, from its run record (else from its token)."""
    if last is not None:
        return (
            f"{show_time(last.committed_at)} token {last.seq}: {last.counts.read} read, "
            f"{last.counts.quarantined} quarantined"
        )
    if newest is not None:
        return f"{show_time(newest.created_at)} token {newest.seq}: {newest.counts.read} read"
    return "never"
